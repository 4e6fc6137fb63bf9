// Two-level Gumbel-max on CUDA (reference/gumbel.py): the device sources of a truncated row and of a
// residual, and level 1 over a range of blocks. Shared by chain.cuh and tree.cuh; level 2 is gumbel.h's
// sample_in_block.
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/gumbel.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/cuda/cuda_common.cuh"

SPECDEC_NS_BEGIN
namespace dev {

// Two-level Gumbel-max sources (gumbel.h) of a row truncated by order key: the scaled, truncated logits,
// and the residual max(0, p - q) of their softmax p.
template <DType D>
struct TruncatedZ {
  const void* row;
  float temperature;
  uint32_t lo_key;
  int64_t vocab;

  __device__ float z(int64_t v) const {
    return truncated(Elem<D>::load(static_cast<const typename Elem<D>::type*>(row), v), temperature, lo_key);
  }
  __device__ void block(int64_t b, float* out) const {
    for (int i = 0; i < kBlock; ++i) out[i] = b * kBlock + i < vocab ? z(b * kBlock + i) : -kInf;
  }
  __device__ float log_mass(int64_t b) const {
    float zb[kBlock];
    block(b, zb);
    return block_log_mass(zb);
  }
};

template <DType D>
struct TruncatedResidual {
  TruncatedZ<D> target;
  float max, total;
  const void* q;
  DType q_dtype;

  __device__ float residual(int64_t v) const {
    const float p = max == -kInf ? (v == 0 ? 1.0f : 0.0f) : exp_fma_f32(target.z(v) - max) / total;
    const float d = p - load_prob(q, q_dtype, v);
    return d > 0.0f ? d : 0.0f;
  }
  __device__ void block(int64_t b, float* out) const {
    for (int i = 0; i < kBlock; ++i) out[i] = b * kBlock + i < target.vocab ? log_f32(residual(b * kBlock + i)) : -kInf;
  }
  __device__ float log_mass(int64_t b) const {
    float w[kBlock];
    for (int i = 0; i < kBlock; ++i) w[i] = b * kBlock + i < target.vocab ? residual(b * kBlock + i) : 0.0f;
    return log_f32(block_sum16(w));
  }
};

// Level 1 over the blocks of [v0, v1) (v0 a multiple of 16), one thread per block: this thread's best
// {score, block}; the caller reduces over the thread block.
template <class Source>
__device__ __forceinline__ DevArgMax block_pick(const Source& src, const PhiloxKey& key, uint32_t hi, int stream,
                                                int64_t v0, int64_t v1) {
  DevArgMax pick{-kInf, 0x7fffffff};
  for (int64_t b = v0 / kBlock + threadIdx.x; b < (v1 + kBlock - 1) / kBlock; b += blockDim.x) {
    const float u = philox_draw(key, hi, stream, kBlockDraws + static_cast<uint32_t>(b));
    pick = better(pick, DevArgMax{src.log_mass(b) - gumbel_log_term(u), static_cast<int32_t>(b)});
  }
  return pick;
}

}  // namespace dev
SPECDEC_NS_END
