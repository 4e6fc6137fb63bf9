// Chain verification on the host (DESIGN.md §2-§4): the per-request walk, exactly the rules of
// specdec_kernels/reference/chain.py. Framework-free: raw pointers in, tokens out.
//
// Each row is read once into a float32 scratch row (scaled, sanitized, truncated); sampling then runs
// over that cached row. Rows after a request's first rejection are never read. The walk is generic
// over an executor that runs each vocabulary reduction serially or split across threads
// (csrc/cpu/chain_cpu.cpp), and over a RowKernels table (the instruction-set build of row_ops.h).
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"
#include "math.h"
#include "philox.h"
#include "sampling.h"
#include "types.h"

namespace specdec {

struct ChainArgs {
  const void* logits;            // [T + B, V] logits_dtype
  DType logits_dtype;
  int64_t vocab;
  const int64_t* draft_ids;      // [T]
  const int64_t* cu;             // [B + 1]
  int64_t num_reqs;
  const void* draft_probs;       // [T, V] probs_dtype, or nullptr (deterministic drafts)
  DType probs_dtype;
  const float* temperature;      // [B], 0 = greedy
  const int32_t* top_k;          // [B] or nullptr
  const float* top_p;            // [B] or nullptr
  const int64_t* seed;           // [B]
  const int64_t* position;       // [B]
  int64_t out_width;             // K_max + 1
  int32_t* out_tokens;           // [B, out_width], pre-filled with -1 by the caller
  int32_t* num_accepted;         // [B]
};

}  // namespace specdec

SPECDEC_NS_BEGIN

inline ArgMax better_of(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// Per-thread scratch of the walks.
struct RowScratch {
  std::vector<float> z;       // the current row's scaled, truncated logits
  std::vector<float> select;  // top-k selection
  TopPScratch top_p;
};

// Scale one row into scratch.z and apply top-k / top-p; returns the row max (kept by both).
// Reference: z = sanitize(logits / T); top-k then top-p (reference/sampling.py).
template <class Exec>
ArgMax prepare_row(const RowKernels& K, Exec& exec, const void* row, DType dtype, float temperature,
                   const int32_t* top_k, const float* top_p, int64_t req, int64_t V, RowScratch& s) {
  if (static_cast<int64_t>(s.z.size()) < V) s.z.resize(V);  // greedy-only batches never allocate it
  float* z = s.z.data();
  const ArgMax mx = exec.argmax([&](int64_t v0, int64_t v1) { return K.scale_row(row, dtype, temperature, z, v0, v1); });
  if (top_k != nullptr) {
    const int32_t k = top_k[req];
    if (k > 0 && k < V) {
      const float kth = kth_largest(z, V, k, s.select);
      for (int64_t v = 0; v < V; ++v) z[v] = z[v] >= kth ? z[v] : -kInf;
    }
  }
  if (top_p != nullptr && top_p[req] < 1.0f && mx.value != -kInf) {
    const float thr = top_p_threshold(z, V, mx.value, top_p[req], s.top_p);
    for (int64_t v = 0; v < V; ++v) z[v] = z[v] >= thr ? z[v] : -kInf;
  }
  return mx;
}

// y ~ softmax(z) by Gumbel-max on one stream, seeded with the max-logit token so that chunks of
// low logits are skipped.
template <class Exec>
int64_t gumbel_sample(const RowKernels& K, Exec& exec, const float* z, ArgMax mx, int64_t seed, int64_t position,
                      int stream) {
  const PhiloxKey key = philox_key(seed);
  ArgMax start = kArgMaxInit;
  if (mx.value != -kInf) {
    const float u = philox_rand(seed, position, stream, static_cast<uint32_t>(mx.index));
    start = {z[mx.index] - gumbel_log_term(u), mx.index};
  }
  // `start` is a real candidate, so it is a valid starting point for every slice.
  return exec.argmax([&](int64_t v0, int64_t v1) { return K.gumbel_argmax(z, key, position, stream, v0, v1, start); })
      .index;
}

// True when top-k and top-p leave request req's row untouched.
inline bool untruncated(const int32_t* top_k, const float* top_p, int64_t req, int64_t V) {
  const bool k_off = top_k == nullptr || top_k[req] <= 0 || top_k[req] >= V;
  return k_off && (top_p == nullptr || !(top_p[req] < 1.0f));
}

inline float load_logit(const void* row, DType dtype, int64_t v) {
  switch (dtype) {
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(row)[v]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(row)[v]);
    default: return static_cast<const float*>(row)[v];
  }
}

// gumbel_sample of an untruncated row straight from its logits (one pass, no scratch row), seeded with
// the draft token `hint` (>= 0; often the winner) so that most entries get no Philox draw.
template <class Exec>
int64_t gumbel_sample_logits(const RowKernels& K, Exec& exec, const void* row, DType dtype, float temperature,
                             int64_t hint, int64_t seed, int64_t position, int stream) {
  const PhiloxKey key = philox_key(seed);
  ArgMax start = kArgMaxInit;
  if (hint >= 0) {
    const float zh = sanitize(load_logit(row, dtype, hint) / temperature);
    if (zh != -kInf) {
      const float u = philox_rand(seed, position, stream, static_cast<uint32_t>(hint));
      start = {zh - gumbel_log_term(u), hint};
    }
  }
  return exec
      .argmax([&](int64_t v0, int64_t v1) {
        return K.gumbel_argmax_logits(row, dtype, temperature, key, position, stream, v0, v1, start);
      })
      .index;
}

// Stochastic-draft decision on a prepared row (z, row max mx): accept x iff coin * q(x) < p(x);
// otherwise the recovery token from norm(max(0, p - q)) (p itself when that residual is empty).
// Overwrites z with the softmax numerators; `reprepare()` restores it for the rare empty residual.
struct StochasticDecision {
  bool accept;
  int64_t token;  // valid when !accept
};

template <class Exec, class Reprepare>
StochasticDecision stochastic_decide(const RowKernels& K, Exec& exec, float* z, ArgMax mx, const void* q,
                                     DType q_dtype, int64_t draft, bool valid, int64_t seed, int64_t position,
                                     Reprepare reprepare) {
  const float m = mx.value;
  const bool finite = m != -kInf;
  const float total =
      finite ? static_cast<float>(exec.sum([&](int64_t v0, int64_t v1) { return K.softmax_weights(z, m, v0, v1); }))
             : 1.0f;
  const int64_t x = valid ? draft : 0;
  const float p_x = finite ? z[x] / total : (x == 0 ? 1.0f : 0.0f);  // z[x] = exp(z_x - m) now
  float q_x = 0.0f;
  switch (q_dtype) {
    case DType::kFloat32: q_x = static_cast<const float*>(q)[x]; break;
    case DType::kBFloat16: q_x = bf16_to_float(static_cast<const uint16_t*>(q)[x]); break;
    case DType::kFloat16: q_x = fp16_to_float(static_cast<const uint16_t*>(q)[x]); break;
  }
  const float coin = philox_rand(seed, position, kStreamCoin, 0);
  if (valid && coin * q_x < p_x) return {true, draft};
  const PhiloxKey key = philox_key(seed);
  const float* w = finite ? z : nullptr;
  const ResidualResult rr = exec.residual(
      [&](int64_t v0, int64_t v1) { return K.residual_argmax(w, total, q, q_dtype, key, position, v0, v1); });
  if (rr.any_positive) return {false, rr.best.index};
  const ArgMax mx2 = reprepare();
  return {false, gumbel_sample(K, exec, z, mx2, seed, position, kStreamRecovery)};
}

template <class Exec>
void verify_chain_request(const RowKernels& K, const ChainArgs& a, int64_t b, Exec& exec, RowScratch& s) {
  const int64_t V = a.vocab;
  const int64_t first_draft = a.cu[b];
  const int64_t k = a.cu[b + 1] - first_draft;
  const int64_t row0 = first_draft + b;
  const float temp = a.temperature[b];
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  int32_t* out = a.out_tokens + b * a.out_width;

  int64_t j = 0;
  for (;; ++j) {
    const bool bonus = j == k;
    const void* row = static_cast<const char*>(a.logits) + static_cast<size_t>(row0 + j) * V * elem;
    const int64_t draft = bonus ? -1 : a.draft_ids[first_draft + j];
    const bool valid = draft >= 0 && draft < V;
    const int64_t pos = a.position[b] + j;
    int64_t token;
    bool accept;
    if (temp == 0.0f) {  // greedy: argmax of the sanitized logits, no truncation
      token = exec.argmax([&](int64_t v0, int64_t v1) { return K.greedy_argmax(row, a.logits_dtype, v0, v1); }).index;
      accept = valid && token == draft;
    } else if (a.draft_probs == nullptr || bonus) {
      const int stream = bonus ? kStreamBonus : kStreamRecovery;
      if (untruncated(a.top_k, a.top_p, b, V)) {
        token = gumbel_sample_logits(K, exec, row, a.logits_dtype, temp, valid ? draft : -1, a.seed[b], pos, stream);
      } else {
        const ArgMax mx = prepare_row(K, exec, row, a.logits_dtype, temp, a.top_k, a.top_p, b, V, s);
        token = gumbel_sample(K, exec, s.z.data(), mx, a.seed[b], pos, stream);
      }
      accept = valid && token == draft;
    } else {
      auto prepare = [&] { return prepare_row(K, exec, row, a.logits_dtype, temp, a.top_k, a.top_p, b, V, s); };
      const ArgMax mx = prepare();
      const void* q = static_cast<const char*>(a.draft_probs) + static_cast<size_t>(first_draft + j) * V * q_elem;
      const StochasticDecision d =
          stochastic_decide(K, exec, s.z.data(), mx, q, a.probs_dtype, draft, valid, a.seed[b], pos, prepare);
      accept = d.accept;
      token = d.token;
    }
    if (!bonus && accept) {
      out[j] = static_cast<int32_t>(draft);
      continue;
    }
    out[j] = static_cast<int32_t>(token);
    break;
  }
  a.num_accepted[b] = static_cast<int32_t>(j);
}

SPECDEC_NS_END
