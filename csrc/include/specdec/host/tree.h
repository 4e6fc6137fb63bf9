// Tree verification on the host: the per-request walk, exactly the rules of
// specdec_kernels/reference/tree.py (and the tree RNG spec): greedy and deterministic trees descend
// into the child whose token the target samples; stochastic trees run recursive rejection over the
// ordered siblings (SpecInfer multi-step for i.i.d. siblings, RRS without replacement). Only the rows
// on the accepted path are read. Framework-free; generic over the executor like chain.h.
#pragma once

#include <cstdint>
#include <vector>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/types.h"
#include "specdec/host/chain.h"

namespace specdec {

struct TreeArgs {
  const void* logits;            // [N, V] logits_dtype
  DType logits_dtype;
  int64_t vocab;
  const int64_t* node_token_ids; // [N]
  const int64_t* parent;         // [N] local parent index, -1 at the root
  const int64_t* cu;             // [B + 1]
  int64_t num_reqs;
  const void* draft_probs;       // [N, V] probs_dtype, or nullptr (deterministic tree)
  DType probs_dtype;
  const float* temperature;      // [B]
  const int32_t* top_k;          // [B] or nullptr
  const float* top_p;            // [B] or nullptr
  const int64_t* seed;           // [B]
  const int64_t* position;       // [B]
  bool without_replacement;      // sibling_sampling == "without_replacement" (RRS)
  int64_t max_depth;             // D: outputs have D + 1 columns; nodes deeper are ignored
  int32_t* out_tokens;           // [B, D + 1], pre-filled with -1
  int32_t* accepted_nodes;       // [B, D + 1], pre-filled with -1
  int32_t* num_accepted;         // [B]
  float* row_threshold;          // [N] or nullptr: each decided row's kept-set threshold (the sampling mask)
};

}  // namespace specdec

SPECDEC_NS_BEGIN

struct TreeScratch {
  RowScratch row;
  std::vector<float> p, q;                  // stochastic trees: current target and draft distributions
  std::vector<int64_t> child_start, children;  // children of each local node, in sibling order
};

// Sum of w[0, V) in double, rounded to float32 (the reference sums float32 rows).
inline float row_sum(const float* w, int64_t V) {
  double acc[4] = {0, 0, 0, 0};
  int64_t v = 0;
  for (; v + 4 <= V; v += 4) {
    for (int i = 0; i < 4; ++i) acc[i] += static_cast<double>(w[v + i]);
  }
  for (; v < V; ++v) acc[0] += static_cast<double>(w[v]);
  return static_cast<float>((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

// One stochastic step at a node with children (tokens x_s, validity): returns the accepted sibling slot
// or -1 with the emitted token. p = softmax(z), q = the node's draft row.
template <class Exec>
int64_t stochastic_tree_step(const RowKernels& K, Exec& exec, const float* z, ArgMax mx, const void* q_row,
                             DType q_dtype, const int64_t* kids, int64_t num_kids, const int64_t* tokens,
                             int64_t V, int64_t seed, int64_t position, bool without_replacement,
                             TreeScratch& s, int64_t& emitted) {
  s.p.resize(V);
  s.q.resize(V);
  float* p = s.p.data();
  float* q = s.q.data();
  const float m = mx.value;
  if (m == -kInf) {
    for (int64_t v = 0; v < V; ++v) p[v] = v == 0 ? 1.0f : 0.0f;
  } else {
    for (int64_t v = 0; v < V; ++v) p[v] = exp_f32(z[v] - m);
    const float total = row_sum(p, V);
    for (int64_t v = 0; v < V; ++v) p[v] = p[v] / total;
  }
  for (int64_t v = 0; v < V; ++v) q[v] = load_elem(q_row, q_dtype, v);
  for (int64_t slot = 0; slot < num_kids; ++slot) {
    const int64_t x = tokens[kids[slot]];
    if (!(x >= 0 && x < V)) continue;  // placeholders keep their slot but never update p or q
    const float coin = philox_rand(seed, position, kStreamCoin, static_cast<uint32_t>(slot));
    if (coin * q[x] < p[x]) return slot;
    // p <- norm(max(0, p - q)) (unchanged if empty), computed with the q of this step.
    // The residual is built in place in s.row.select (scratch) to keep p for the empty case.
    std::vector<float>& r = s.row.select;
    r.resize(V);
    for (int64_t v = 0; v < V; ++v) {
      const float d = p[v] - q[v];
      r[v] = d > 0.0f ? d : 0.0f;
    }
    const float rtotal = row_sum(r.data(), V);
    if (without_replacement) {
      q[x] = 0.0f;
      const float qtotal = row_sum(q, V);
      for (int64_t v = 0; v < V; ++v) q[v] = qtotal > 0.0f ? q[v] / qtotal : 0.0f;
    }
    if (rtotal > 0.0f) {
      for (int64_t v = 0; v < V; ++v) p[v] = r[v] / rtotal;
    }
  }
  emitted = sample_weights(K, exec, p, V, seed, position, kStreamRecovery);
  return -1;
}

template <class Exec>
void verify_tree_request(const RowKernels& K, const TreeArgs& a, int64_t b, Exec& exec, TreeScratch& s) {
  const int64_t V = a.vocab;
  const int64_t first = a.cu[b];
  const int64_t n = a.cu[b + 1] - first;
  const int64_t width = a.max_depth + 1;
  int32_t* out = a.out_tokens + b * width;
  int32_t* path = a.accepted_nodes + b * width;
  if (n <= 0) {  // only reachable without validation: nothing to verify
    a.num_accepted[b] = 0;
    return;
  }
  // Children lists in sibling (local index) order; nodes whose parent does not point backwards are
  // detached (unreachable), as in the reference.
  s.child_start.assign(n + 1, 0);
  for (int64_t i = 1; i < n; ++i) {
    const int64_t par = a.parent[first + i];
    if (par >= 0 && par < i) ++s.child_start[par + 1];
  }
  for (int64_t i = 0; i < n; ++i) s.child_start[i + 1] += s.child_start[i];
  s.children.assign(s.child_start[n], 0);
  {
    std::vector<int64_t> fill(s.child_start.begin(), s.child_start.end() - 1);
    for (int64_t i = 1; i < n; ++i) {
      const int64_t par = a.parent[first + i];
      if (par >= 0 && par < i) s.children[fill[par]++] = first + i;  // global index
    }
  }
  const float temp = a.temperature[b];
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  const int64_t* tokens = a.node_token_ids;

  path[0] = 0;
  int64_t cur = 0;  // local index of the current node
  for (int64_t d = 0; d < width; ++d) {
    const int64_t g = first + cur;
    const void* row = static_cast<const char*>(a.logits) + static_cast<size_t>(g) * V * elem;
    const int64_t* kids = s.children.data() + s.child_start[cur];
    const int64_t num_kids = d < a.max_depth ? s.child_start[cur + 1] - s.child_start[cur] : 0;
    const bool leaf = num_kids == 0;
    const int64_t pos = a.position[b] + d;
    int64_t y;
    int64_t slot = -1;
    bool decided = false;
    float* threshold = a.row_threshold != nullptr ? a.row_threshold + g : nullptr;  // chain.h's
    if (temp == 0.0f) {
      const ArgMax top =
          exec.argmax([&](int64_t v0, int64_t v1) { return K.greedy_argmax(row, a.logits_dtype, v0, v1); });
      y = top.index;
      if (threshold != nullptr) *threshold = top.value;
    } else {
      const ArgMax mx = prepare_row(K, exec, row, a.logits_dtype, temp, a.top_k, a.top_p, b, V, s.row, threshold);
      if (a.draft_probs == nullptr || leaf) {
        y = sample_prepared(K, exec, s.row.z.data(), mx, V, a.seed[b], pos, leaf ? kStreamBonus : kStreamRecovery);
      } else {
        const void* q_row = static_cast<const char*>(a.draft_probs) + static_cast<size_t>(g) * V * q_elem;
        y = 0;
        slot = stochastic_tree_step(K, exec, s.row.z.data(), mx, q_row, a.probs_dtype, kids, num_kids, tokens, V,
                                    a.seed[b], pos, a.without_replacement, s, y);
        decided = true;
      }
    }
    if (!decided) {  // descend into the first valid child whose token is y
      for (int64_t c = 0; c < num_kids; ++c) {
        const int64_t t = tokens[kids[c]];
        if (t >= 0 && t < V && t == y) {
          slot = c;
          break;
        }
      }
    }
    if (slot >= 0) {
      const int64_t child = kids[slot];
      out[d] = static_cast<int32_t>(tokens[child]);
      if (d + 1 < width) path[d + 1] = static_cast<int32_t>(child - first);
      cur = child - first;
      continue;
    }
    out[d] = static_cast<int32_t>(y);
    a.num_accepted[b] = static_cast<int32_t>(d);
    return;
  }
  a.num_accepted[b] = static_cast<int32_t>(a.max_depth);  // unreachable: depth max_depth is a leaf
}

SPECDEC_NS_END
