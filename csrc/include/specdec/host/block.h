// Block verification of draft chains on the host (Sun et al., ICLR 2025): exactly the rules of
// specdec_kernels/reference/block.py, whose docstring derives them. Framework-free; generic over the
// executor like chain.h.
//
// One forward pass over the block's rows j = 0 .. K keeps the weight w_j, tests every prefix j >= 1 with
// its sequence-level coin against h_j, and keeps the residual row of the latest successful test (tau),
// so the emitted token needs no second pass over the logits: per row, the scaled row, its softmax
// numerators and the residual max(0, w p - q) with its mass (the one pass token level does not need).
// Rows after the weight reaches 0 are never read (no later test can succeed).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "specdec/core/common.h"
#include "specdec/core/gumbel.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/types.h"
#include "specdec/host/chain.h"
#include "specdec/host/tree.h"

SPECDEC_NS_BEGIN

// float32 min(1, num / q_x): 1 when num >= q_x and num > 0, 0 when num = 0 (reference ratio_weight).
inline float ratio_weight(float num, float q_x) {
  return num >= q_x ? (num > 0.0f ? 1.0f : 0.0f) : num / q_x;
}

// Z / (Z + 1 - w) in double, 0 where the denominator is 0 (reference stop_probability).
inline double stop_probability(double mass, double weight) {
  const double denom = mass + (1.0 - weight);
  return denom > 0.0 ? mass / denom : 0.0;
}

// Overwrites the prepared row z (row max mx) with its softmax numerators and returns their total, so
// that p_v = z[v] / total; the all -inf row becomes the one-hot on token 0 (total 1), as the reference.
template <class Exec>
float softmax_in_place(const RowKernels& K, Exec& exec, float* z, ArgMax mx, int64_t V) {
  if (mx.value == -kInf) {
    for (int64_t v = 0; v < V; ++v) z[v] = v == 0 ? 1.0f : 0.0f;
    return 1.0f;
  }
  const float m = mx.value;
  return static_cast<float>(exec.sum([&](int64_t v0, int64_t v1) { return K.softmax_weights(z, m, v0, v1); }));
}

struct BlockScratch {
  std::vector<float> r, r_tau;  // residual of the current row, and of the row of the latest stop
};

template <class Exec>
void verify_chain_block_request(const RowKernels& K, const ChainArgs& a, int64_t b, Exec& exec, RowScratch& s,
                                BlockScratch& bs) {
  const float temp = a.temperature[b];
  if (temp == 0.0f || a.draft_probs == nullptr) {  // greedy / deterministic drafts: token level
    verify_chain_request(K, a, b, exec, s);
    return;
  }
  const int64_t V = a.vocab;
  const int64_t first_draft = a.cu[b];
  const int64_t k = a.cu[b + 1] - first_draft;
  const int64_t row0 = first_draft + b;
  const int64_t seed = a.seed[b];
  const int64_t position = a.position[b];
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  auto row_ptr = [&](int64_t j) {
    return static_cast<const void*>(static_cast<const char*>(a.logits) + static_cast<size_t>(row0 + j) * V * elem);
  };
  auto q_ptr = [&](int64_t j) {
    return static_cast<const void*>(static_cast<const char*>(a.draft_probs) +
                                    static_cast<size_t>(first_draft + j) * V * q_elem);
  };
  int64_t block_len = k;  // the block ends at its first placeholder
  for (int64_t j = 0; j < k; ++j) {
    const int64_t x = a.draft_ids[first_draft + j];
    if (!(x >= 0 && x < V)) {
      block_len = j;
      break;
    }
  }
  if (static_cast<int64_t>(bs.r.size()) < V) bs.r.resize(V);
  if (static_cast<int64_t>(bs.r_tau.size()) < V) bs.r_tau.resize(V);
  int32_t* out = a.out_tokens + b * a.out_width;
  auto finish = [&](int64_t tau, int64_t token) {
    for (int64_t i = 0; i < tau; ++i) out[i] = static_cast<int32_t>(a.draft_ids[first_draft + i]);
    out[tau] = static_cast<int32_t>(token);
    a.num_accepted[b] = static_cast<int32_t>(tau);
  };

  float w = 1.0f;
  int64_t tau = 0;
  double mass_tau = 0.0;
  for (int64_t j = 0; j <= block_len; ++j) {
    float* threshold = a.row_threshold != nullptr ? a.row_threshold + row0 + j : nullptr;  // the sampling mask's
    const ArgMax mx = prepare_row(K, exec, row_ptr(j), a.logits_dtype, temp, a.top_k, a.top_p, b, V, s, threshold);
    float* z = s.z.data();
    if (j == block_len) {  // the last row: h = w; a stop here is the largest, emit from p itself
      if (j == 0 || static_cast<double>(sequence_coin(seed, position, static_cast<uint32_t>(j))) < w) {
        const int stream = block_len == k ? kStreamBonus : kStreamRecovery;
        finish(j, sample_prepared(K, exec, z, mx, V, seed, position + j, stream));
        return;
      }
      break;
    }
    const float total = softmax_in_place(K, exec, z, mx, V);
    const void* q = q_ptr(j);
    float* r = bs.r.data();
    const double mass =
        exec.sum([&](int64_t v0, int64_t v1) { return K.weighted_residual(z, total, w, q, a.probs_dtype, r, v0, v1); });
    const bool stop =
        j == 0 || static_cast<double>(sequence_coin(seed, position, static_cast<uint32_t>(j))) <
                      stop_probability(mass, static_cast<double>(w));
    if (stop) {  // row j is the latest stop so far: keep its residual for the emission
      tau = j;
      mass_tau = mass;
      std::swap(bs.r, bs.r_tau);
    }
    const int64_t x = a.draft_ids[first_draft + j];
    w = ratio_weight(w * (z[x] / total), load_elem(q, a.probs_dtype, x));
    if (w == 0.0f) break;  // every later h is 0: no later stop
  }
  // tau < K: y ~ norm(max(0, w_tau p_tau - q_tau)) (p_tau itself if that residual is empty).
  const int64_t pos = position + tau;
  int64_t token;
  if (mass_tau > 0.0) {
    token = sample_weights(K, exec, bs.r_tau.data(), V, seed, pos, kStreamRecovery);
  } else {
    const ArgMax mx = prepare_row(K, exec, row_ptr(tau), a.logits_dtype, temp, a.top_k, a.top_p, b, V, s);
    token = sample_prepared(K, exec, s.z.data(), mx, V, seed, pos, kStreamRecovery);
  }
  finish(tau, token);
}

SPECDEC_NS_END
