// Tokens and row sums of the framework-free host kernels on fixed, seeded inputs, one result per line, sums as
// their exact bits (hex): the chain walk (chain.h) and block verification (block.h), the tree walk (tree.h) and
// traversal verification (traversal.h), driven as csrc/cpu/*_cpu.cpp drive them (make_row_kernels, the
// executors of csrc/cpu/parallel.h, serial and with each row split across two threads), greedy and random
// requests, deterministic and stochastic drafts, without and with top-k / top-p, fp32 and bf16 logits,
// V = 151936 and 4099. The row sums: softmax_stats (the same for every SIMD width), block log-masses and
// tree.h row_sum (scalar), a hash of the bits of every entry of the scaled row, its softmax numerators and a
// residual row (lane-wise twins of scalar code), and the double sums of the last two, whose order follows
// the SIMD width W (lines "by_lanes W=..."). tests/native/test_aarch64.py builds this for every x86-64 instruction
// set the CPU has and for aarch64 (run under qemu) and requires identical output where the kernels promise
// it (simd.h): every line on every build, the by_lanes lines between builds of one width.
//
// Inputs come from integer hashing and exact float operations only (no <random> distributions, no libm), so
// they are the same bits on every build.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel.h"
#include "specdec/cpu/row_ops.h"
#include "specdec/host/block.h"
#include "specdec/host/traversal.h"

using namespace specdec;

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform float in [0, 1) from 24 bits of mix(key, i): exact.
float uniform(uint64_t key, uint64_t i) { return static_cast<float>(mix(key * 0x100000001b3ull + i) >> 40) * 0x1p-24f; }

uint64_t fnv(uint64_t h, uint32_t x) {
  for (int k = 0; k < 4; ++k) h = (h ^ ((x >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
  return h;
}

uint64_t hash_floats(const float* x, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < n; ++i) h = fnv(h, float_bits(x[i]));
  return h;
}

// Logits of row r: a bell of width ~1.5 (three uniforms), two spikes (+12 at hot(r, 0), +11 at hot(r, 1)) that
// make drafts worth accepting, and on every third row a few -inf entries and one NaN.
int64_t hot(uint64_t r, int which, int64_t V) { return static_cast<int64_t>(mix(r * 31 + which) % V); }

// Rows are built once (cases share them); the cache is keyed by (r, V).
const std::vector<float>& logits_row(uint64_t r, int64_t V) {
  static std::map<std::pair<uint64_t, int64_t>, std::vector<float>> cache;
  std::vector<float>& x = cache[{r, V}];
  if (!x.empty()) return x;
  x.resize(V);
  for (int64_t v = 0; v < V; ++v) {
    x[v] = (uniform(r, 3 * v) + uniform(r, 3 * v + 1) + uniform(r, 3 * v + 2) - 1.5f) * 3.0f;
  }
  x[hot(r, 0, V)] += 12.0f;
  x[hot(r, 1, V)] += 11.0f;
  if (r % 3 == 2) {
    for (int i = 0; i < 8; ++i) x[mix(r + 1000 * i) % V] = -kInf;
    x[mix(r + 77777) % V] = bits_float(0x7fc00000u);
  }
  return x;
}

// Rows [n, V] of logits (or draft probabilities) in dtype d, bf16 by truncating the float's bits.
struct Rows {
  DType dtype;
  int64_t vocab;
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  void append(const std::vector<float>& x) {
    if (dtype == DType::kFloat32) {
      f32.insert(f32.end(), x.begin(), x.end());
    } else {
      for (float v : x) b16.push_back(static_cast<uint16_t>(float_bits(v) >> 16));
    }
  }
  const void* data() const {
    return dtype == DType::kFloat32 ? static_cast<const void*>(f32.data()) : static_cast<const void*>(b16.data());
  }
};

// A draft law close to softmax of logits_row(r, V): q proportional to exp(x + noise), exp_f32 and a double sum in
// order.
const std::vector<float>& draft_law(uint64_t r, int64_t V) {
  static std::map<std::pair<uint64_t, int64_t>, std::vector<float>> cache;
  std::vector<float>& q = cache[{r, V}];
  if (!q.empty()) return q;
  const std::vector<float>& x = logits_row(r, V);
  q.resize(V);
  double total = 0.0;
  for (size_t v = 0; v < x.size(); ++v) {
    const float z = x[v] == x[v] ? x[v] : -kInf;
    q[v] = exp_f32(z + (uniform(r + 555, v) - 0.5f) * 1.5f - 9.0f);
    total += static_cast<double>(q[v]);
  }
  for (float& v : q) v = static_cast<float>(static_cast<double>(v) / total);
  return q;
}

int64_t argmax(const std::vector<float>& x) {
  int64_t best = 0;
  for (size_t v = 1; v < x.size(); ++v) best = x[v] > x[best] ? static_cast<int64_t>(v) : best;
  return best;
}

struct Sampling {
  const char* name;
  bool truncate;
};
constexpr Sampling kSamplings[] = {{"plain", false}, {"top_k_top_p", true}};
const int32_t kTopK[] = {0, 40, 0, 2000};
const float kTopP[] = {1.0f, 0.9f, 0.8f, 1.0f};

void print_ints(const char* label, const int32_t* x, int64_t n) {
  std::printf(" %s", label);
  for (int64_t i = 0; i < n; ++i) std::printf("%s%d", i == 0 ? "=" : ",", x[i]);
}

// Four requests (drafts 3, 2, 0, 4; the first greedy, temperatures 0.7, 1, 1.6) through the chain walk and
// block verification, serially and split.
void chain_cases(const RowKernels& K, int64_t V, DType dtype, bool probs, DType probs_dtype) {
  const int64_t k[] = {3, 2, 0, 4};
  const float temperature[] = {0.0f, 0.7f, 1.0f, 1.6f};
  const int64_t seed[] = {11, 12, 13, 14}, position[] = {100, 7, 0, 31};
  const int64_t B = 4, width = 5;
  std::vector<int64_t> cu{0}, draft_ids;
  Rows logits{dtype, V, {}, {}}, q{probs_dtype, V, {}, {}};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j <= k[b]; ++j) {
      const uint64_t r = static_cast<uint64_t>(100 * b + j + V);
      const std::vector<float>& x = logits_row(r, V);
      logits.append(x);
      if (j == k[b]) break;
      const std::vector<float>& law = draft_law(r, V);
      if (probs) q.append(law);
      // The drafter's choice: mostly the target's favourite, the last draft of request 3 its runner-up.
      draft_ids.push_back(b == 3 && j == 3 ? hot(r, 1, V) : probs ? argmax(law) : argmax(x));
    }
    cu.push_back(static_cast<int64_t>(draft_ids.size()));
  }
  for (const Sampling& sm : kSamplings) {
    ChainArgs a{};
    a.logits = logits.data();
    a.logits_dtype = dtype;
    a.vocab = V;
    a.draft_ids = draft_ids.data();
    a.cu = cu.data();
    a.num_reqs = B;
    a.draft_probs = probs ? q.data() : nullptr;
    a.probs_dtype = probs_dtype;
    a.temperature = temperature;
    a.top_k = sm.truncate ? kTopK : nullptr;
    a.top_p = sm.truncate ? kTopP : nullptr;
    a.seed = seed;
    a.position = position;
    a.out_width = width;
    auto run = [&](const char* kernel, const char* exec_name, auto walk) {
      std::vector<int32_t> out(B * width, -1), accepted(B, 0);
      a.out_tokens = out.data();
      a.num_accepted = accepted.data();
      for (int64_t b = 0; b < B; ++b) walk(b);
      std::printf("%s V=%" PRId64 " logits=%s probs=%s %s %s", kernel, V, dtype == DType::kFloat32 ? "fp32" : "bf16",
                  !probs ? "none" : probs_dtype == DType::kFloat32 ? "fp32" : "bf16", sm.name, exec_name);
      print_ints("tokens", out.data(), B * width);
      print_ints("accepted", accepted.data(), B);
      std::printf("\n");
    };
    auto both_execs = [&](const char* kernel, auto request) {
      run(kernel, "serial", [&](int64_t b) {
        cpu::SerialExec exec{V};
        request(b, exec);
      });
      run(kernel, "split2", [&](int64_t b) {
        cpu::SplitExec exec{V, 2};
        request(b, exec);
      });
    };
    RowScratch s;
    BlockScratch bs;
    both_execs("chain", [&](int64_t b, auto& exec) { verify_chain_request(K, a, b, exec, s); });
    both_execs("chain_block", [&](int64_t b, auto& exec) { verify_chain_block_request(K, a, b, exec, s, bs); });
  }
}

// Two requests of 8 nodes (root; children 1, 2, 3; 4, 5 under 1; 6 under 2; 7 under 4), the first random
// (T = 0.9), the second greedy; sibling tokens the parent row's favourite, its runner-up and a random one.
void tree_cases(const RowKernels& K, int64_t V, DType dtype, bool probs, bool without_replacement) {
  const int64_t local_parent[] = {-1, 0, 0, 0, 1, 1, 2, 4};
  const int64_t n = 8, B = 2, depth = 3, width = depth + 1;
  const float temperature[] = {0.9f, 0.0f};
  const int64_t seed[] = {21, 22}, position[] = {5, 900};
  std::vector<int64_t> cu{0}, tokens, parent;
  Rows logits{dtype, V, {}, {}}, q{DType::kFloat32, V, {}, {}};
  for (int64_t b = 0; b < B; ++b) {
    int slot[n] = {};
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t r = static_cast<uint64_t>(1000 + 10 * b + i + V);
      logits.append(logits_row(r, V));
      if (probs) q.append(draft_law(r, V));
      parent.push_back(local_parent[i]);
      if (i == 0) {
        tokens.push_back(0);
        continue;
      }
      const uint64_t pr = static_cast<uint64_t>(1000 + 10 * b + local_parent[i] + V);
      const int s = slot[local_parent[i]]++;
      tokens.push_back(s < 2 ? hot(pr, s, V) : static_cast<int64_t>(mix(pr + 9) % V));
    }
    cu.push_back(cu.back() + n);
  }
  for (const Sampling& sm : kSamplings) {
    TreeArgs a{};
    a.logits = logits.data();
    a.logits_dtype = dtype;
    a.vocab = V;
    a.node_token_ids = tokens.data();
    a.parent = parent.data();
    a.cu = cu.data();
    a.num_reqs = B;
    a.draft_probs = probs ? q.data() : nullptr;
    a.probs_dtype = DType::kFloat32;
    a.temperature = temperature;
    a.top_k = sm.truncate ? kTopK : nullptr;
    a.top_p = sm.truncate ? kTopP : nullptr;
    a.seed = seed;
    a.position = position;
    a.without_replacement = without_replacement;
    a.max_depth = depth;
    auto run = [&](const char* kernel, const char* exec_name, auto walk) {
      std::vector<int32_t> out(B * width, -1), nodes(B * width, -1), accepted(B, 0);
      a.out_tokens = out.data();
      a.accepted_nodes = nodes.data();
      a.num_accepted = accepted.data();
      for (int64_t b = 0; b < B; ++b) walk(b);
      std::printf("%s V=%" PRId64 " logits=%s probs=%s siblings=%s %s %s", kernel, V,
                  dtype == DType::kFloat32 ? "fp32" : "bf16", probs ? "fp32" : "none",
                  without_replacement ? "without_replacement" : "iid", sm.name, exec_name);
      print_ints("tokens", out.data(), B * width);
      print_ints("nodes", nodes.data(), B * width);
      print_ints("accepted", accepted.data(), B);
      std::printf("\n");
    };
    TreeScratch ts;
    TraversalScratch tr;
    run("tree", "serial", [&](int64_t b) {
      cpu::SerialExec exec{V};
      verify_tree_request(K, a, b, exec, ts);
    });
    run("tree", "split2", [&](int64_t b) {
      cpu::SplitExec exec{V, 2};
      verify_tree_request(K, a, b, exec, ts);
    });
    run("traversal", "serial", [&](int64_t b) {
      cpu::SerialExec exec{V};
      verify_tree_traversal_request(K, a, b, exec, tr);
    });
    run("traversal", "split2", [&](int64_t b) {
      cpu::SplitExec exec{V, 2};
      verify_tree_traversal_request(K, a, b, exec, tr);
    });
  }
}

// Sums of one row (temperature T) as the walks compute them.
void row_sums(const RowKernels& K, int64_t V, DType dtype, float T, uint64_t r) {
  Rows row{dtype, V, {}, {}};
  row.append(logits_row(r, V));
  const std::vector<float>& q = draft_law(r, V);
  const std::string name = "V=" + std::to_string(V) + (dtype == DType::kFloat32 ? " fp32" : " bf16") +
                           " T=" + std::to_string(T) + " row=" + std::to_string(r);
  const SoftmaxStats st = K.softmax_stats(row.data(), dtype, T, 0, V);
  cpu::SplitExec split{V, 2};
  const SoftmaxStats sp =
      split.stats([&](int64_t v0, int64_t v1) { return K.softmax_stats(row.data(), dtype, T, v0, v1); });
  std::printf("softmax_stats %s max=%08x sum=%016" PRIx64 " split2 max=%08x sum=%016" PRIx64 "\n", name.c_str(),
              float_bits(st.max), double_bits(st.sum), float_bits(sp.max), double_bits(sp.sum));
  const ZSource src{row.data(), dtype, T, V};
  const int64_t blocks = (V + kBlock - 1) / kBlock;
  std::printf("log_mass %s", name.c_str());
  for (int64_t b : {int64_t{0}, hot(r, 0, V) / kBlock, blocks / 2, blocks - 1}) {
    std::printf(" %" PRId64 ":%08x", b, float_bits(src.log_mass(b)));
  }
  std::printf("\n");
  std::vector<float> z(V), out(V);
  const ArgMax mx = K.scale_row(row.data(), dtype, T, z.data(), 0, V);
  std::printf("scaled %s max=%08x@%" PRId64 " hash=%016" PRIx64 "\n", name.c_str(), float_bits(mx.value), mx.index,
              hash_floats(z.data(), V));
  const double weights = K.softmax_weights(z.data(), mx.value, 0, V);
  const float total = row_sum(z.data(), V);
  const double residual = K.weighted_residual(z.data(), total, 0.75f, q.data(), DType::kFloat32, out.data(), 0, V);
  std::printf("softmax_weights %s hash=%016" PRIx64 " row_sum=%08x\n", name.c_str(), hash_floats(z.data(), V),
              float_bits(total));
  std::printf("weighted_residual %s hash=%016" PRIx64 " row_sum=%08x\n", name.c_str(), hash_floats(out.data(), V),
              float_bits(row_sum(out.data(), V)));
  std::printf("by_lanes W=%d %s softmax_weights=%016" PRIx64 " weighted_residual=%016" PRIx64 "\n", simd::W,
              name.c_str(), double_bits(weights), double_bits(residual));
}

}  // namespace

int main() {
  const RowKernels K = make_row_kernels();
  for (int64_t V : {int64_t{151936}, int64_t{4099}}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      chain_cases(K, V, dtype, false, DType::kFloat32);
      chain_cases(K, V, dtype, true, DType::kFloat32);
      tree_cases(K, V, dtype, false, false);
      tree_cases(K, V, dtype, true, false);
      tree_cases(K, V, dtype, true, true);
      for (float T : {1.0f, 0.7f}) {
        for (uint64_t r : {1, 2}) row_sums(K, V, dtype, T, r);
      }
    }
  }
  chain_cases(K, 151936, DType::kBFloat16, true, DType::kBFloat16);
  return 0;
}
