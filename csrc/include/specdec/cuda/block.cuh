// CUDA block verification of chains, exactly the rules of reference/block.py (whose docstring derives
// them): one block per request walks its block's rows in order; each step reduces over the row with the
// whole block (16-byte loads). Per row: the truncation threshold (as tree.cuh), p = softmax(z) into a
// per-request workspace row, the residual mass sum max(0, w p - q) (double) for the stop probability, and
// the next weight. The token after the accepted prefix takes one more pass over row tau. Greedy requests
// follow the argmax as token level does; the binding runs the token-level pipeline for deterministic
// drafts. Every thread carries the same scalar state (reductions return to all threads).
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/cuda/cuda_api.h"
#include "specdec/cuda/cuda_common.cuh"
#include "specdec/cuda/gumbel.cuh"
#include "specdec/cuda/prologue.cuh"
#include "specdec/cuda/tree.cuh"

SPECDEC_NS_BEGIN
namespace dev {

__device__ __forceinline__ float ratio_weight(float num, float q_x) {
  return num >= q_x ? (num > 0.0f ? 1.0f : 0.0f) : num / q_x;
}

__device__ __forceinline__ double stop_probability(double mass, double weight) {
  const double denom = mass + (1.0 - weight);
  return denom > 0.0 ? mass / denom : 0.0;
}

// p = softmax(truncated z) of one row into p[0, V) (one-hot on 0 for an all -inf row), as tree.cuh.
template <DType D>
__device__ void row_probs(const void* row, int64_t V, float temp, uint32_t lo_key, float* p, double* smem,
                          DevArgMax* amax) {
  DevArgMax mx{-kInf, 0x7fffffff};
  for_each_elem<D>(row, 0, V, [&](int64_t v, float x) {
    const float z = truncated(x, temp, lo_key);
    p[v] = z;
    mx = better(mx, DevArgMax{z, static_cast<int32_t>(v)});
  });
  const float m = block_argmax(mx, amax).value;
  double part = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float e = m == -kInf ? (v == 0 ? 1.0f : 0.0f) : exp_f32(p[v] - m);
    p[v] = e;
    part += static_cast<double>(e);
  }
  const float total = static_cast<float>(block_sum(part, smem));
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] = p[v] / total;
  __syncthreads();
}

// Two-level Gumbel-max sample (gumbel.cuh) of the truncated target of a row on one stream at `position`.
template <DType D>
__device__ int64_t row_gumbel_sample(const void* row, int64_t V, float temp, uint32_t lo_key, const PhiloxKey& key,
                                     int64_t position, int stream, DevArgMax* amax) {
  const uint32_t hi = philox_offset_hi(position);
  const TruncatedZ<D> src{row, temp, lo_key, V};
  const DevArgMax best = block_argmax(block_pick(src, key, hi, stream, 0, V), amax);
  return sample_in_block(src, key, hi, stream, best.value == -kInf ? 0 : best.index);
}

// Two-level Gumbel-max sample of norm(w) for nonnegative weights w[0, V) written by the whole block
// (recovery stream); -1 if w is all 0.
__device__ __forceinline__ int64_t weights_gumbel_sample(const float* w, int64_t V, const PhiloxKey& key,
                                                        int64_t position, DevArgMax* amax) {
  const uint32_t hi = philox_offset_hi(position);
  const WeightSource src{w, V};
  const DevArgMax best = block_argmax(block_pick(src, key, hi, kStreamRecovery, 0, V), amax);
  return best.value == -kInf ? -1 : sample_in_block(src, key, hi, kStreamRecovery, best.index);
}

template <DType D>
__global__ void chain_block_kernel(CudaChainArgs a, float* workspace) {
  __shared__ DevArgMax amax[32];
  __shared__ double smem[32];
  const int64_t b = blockIdx.x;
  const int64_t V = a.vocab;
  const ChainSpan span = chain_span(a, b);
  const int64_t first_draft = span.start, k = span.k;
  const int64_t row0 = first_draft + b;
  const RequestSampling rs = request_sampling(a, b);
  const float temp = rs.temperature;
  const int64_t seed = rs.seed;
  const int64_t position = rs.position;
  const PhiloxKey key = rs.key;
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  const int32_t top_k = rs.top_k;
  const float top_p = rs.top_p;
  int32_t* out = a.out_tokens + b * a.out_width;
  float* p = workspace + b * V;
  auto row_ptr = [&](int64_t j) { return static_cast<const void*>(static_cast<const char*>(a.logits) + (row0 + j) * V * elem); };
  auto q_ptr = [&](int64_t j) {
    return static_cast<const void*>(static_cast<const char*>(a.draft_probs) + (first_draft + j) * V * q_elem);
  };

  int64_t tau = 0;
  int64_t token = -1;
  if (temp == 0.0f) {  // greedy: the longest prefix of drafts matching the argmax, then the argmax
    for (;; ++tau) {
      DevArgMax best{-kInf, 0x7fffffff};
      for_each_elem<D>(row_ptr(tau), 0, V, [&](int64_t v, float x) {
        best = better(best, DevArgMax{sanitize(x), static_cast<int32_t>(v)});
      });
      best = block_argmax(best, amax);
      const int64_t y = best.value == -kInf ? 0 : best.index;
      if (threadIdx.x == 0) store_threshold(a.row_threshold, row0 + tau, best.value);
      if (tau < k && a.draft_ids[first_draft + tau] == y) continue;
      token = y;
      break;
    }
  } else {
    int64_t block_len = k;  // the block ends at its first placeholder
    for (int64_t j = 0; j < k; ++j) {
      const int64_t x = a.draft_ids[first_draft + j];
      if (!(x >= 0 && x < V)) {
        block_len = j;
        break;
      }
    }
    float w = 1.0f, w_tau = 1.0f;
    for (int64_t j = 0; j <= block_len; ++j) {
      const uint32_t lo_key = row_lo_key<D>(row_ptr(j), V, temp, top_k, top_p, smem, amax);
      if (threadIdx.x == 0) store_threshold(a.row_threshold, row0 + j, key_threshold(lo_key));
      if (j == block_len) {  // h = w: a stop here is the largest; emit from p itself
        if (j == 0 || static_cast<double>(sequence_coin(seed, position, static_cast<uint32_t>(j))) <
                          static_cast<double>(w)) {
          tau = j;
          token = row_gumbel_sample<D>(row_ptr(j), V, temp, lo_key, key, position + j,
                                       block_len == k ? kStreamBonus : kStreamRecovery, amax);
        }
        break;
      }
      row_probs<D>(row_ptr(j), V, temp, lo_key, p, smem, amax);
      const void* q = q_ptr(j);
      if (j > 0) {
        double part = 0.0;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
          const float r = w * p[v] - load_prob(q, a.probs_dtype, v);
          part += static_cast<double>(r > 0.0f ? r : 0.0f);
        }
        const double mass = block_sum(part, smem);
        if (static_cast<double>(sequence_coin(seed, position, static_cast<uint32_t>(j))) <
            stop_probability(mass, static_cast<double>(w))) {
          tau = j;
          w_tau = w;
        }
      }
      const int64_t x = a.draft_ids[first_draft + j];
      w = ratio_weight(w * p[x], load_prob(q, a.probs_dtype, x));
      __syncthreads();  // p is rewritten by the next row
      if (w == 0.0f) break;  // every later h is 0: no later stop
    }
    if (token < 0) {  // y ~ norm(max(0, w_tau p_tau - q_tau)) from row tau < block_len
      const uint32_t lo_key = row_lo_key<D>(row_ptr(tau), V, temp, top_k, top_p, smem, amax);
      row_probs<D>(row_ptr(tau), V, temp, lo_key, p, smem, amax);
      const void* q = q_ptr(tau);
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float r = w_tau * p[v] - load_prob(q, a.probs_dtype, v);
        p[v] = r > 0.0f ? r : 0.0f;
      }
      __syncthreads();
      token = weights_gumbel_sample(p, V, key, position + tau, amax);
      if (token < 0) {
        token = row_gumbel_sample<D>(row_ptr(tau), V, temp, lo_key, key, position + tau, kStreamRecovery, amax);
      }
    }
  }
  if (threadIdx.x == 0) {
    for (int64_t i = 0; i < tau; ++i) out[i] = static_cast<int32_t>(a.draft_ids[first_draft + i]);
    out[tau] = static_cast<int32_t>(token);
    a.num_accepted[b] = static_cast<int32_t>(tau);
  }
}

}  // namespace dev
SPECDEC_NS_END
