// CUDA building blocks shared by the chain and tree kernels: (value, index) argmax with ties to the
// lowest index, block reductions, 16-byte vectorised row loads, and the launch-config table.
// Framework-free (no torch headers), so CI compiles it with nvcc alone.
#pragma once

#include <cstdint>

#include "common.h"
#include "math.h"
#include "philox.h"

SPECDEC_NS_BEGIN
namespace dev {

struct DevArgMax {
  float value;
  int32_t index;
};

__device__ __forceinline__ DevArgMax better(DevArgMax a, DevArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ __forceinline__ DevArgMax warp_argmax(DevArgMax x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    DevArgMax o;
    o.value = __shfl_xor_sync(0xffffffffu, x.value, off);
    o.index = __shfl_xor_sync(0xffffffffu, x.index, off);
    x = better(x, o);
  }
  return x;
}

// Block-wide argmax; every thread gets the result. `smem` holds 32 entries.
__device__ __forceinline__ DevArgMax block_argmax(DevArgMax x, DevArgMax* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = warp_argmax(x);
  __syncthreads();
  if (lane == 0) smem[warp] = x;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  DevArgMax y = lane < warps ? smem[lane] : DevArgMax{-kInf, 0x7fffffff};
  y = warp_argmax(y);
  return y;
}

__device__ __forceinline__ double block_sum(double x, double* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  __syncthreads();
  if (lane == 0) smem[warp] = x;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  double y = lane < warps ? smem[lane] : 0.0;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) y += __shfl_xor_sync(0xffffffffu, y, off);
  return y;
}

// Calls f(v, x) for every element of row[v0, v1) as float, with 16-byte loads where aligned.
template <DType D, class F>
__device__ __forceinline__ void for_each_elem(const void* row, int64_t v0, int64_t v1, F f) {
  using T = typename Elem<D>::type;
  constexpr int kPerVec = 16 / sizeof(T);
  const T* p = static_cast<const T*>(row);
  const bool aligned = ((reinterpret_cast<uintptr_t>(p + v0)) & 15u) == 0;
  int64_t v = v0;
  if (aligned) {
    const int64_t nvec = (v1 - v0) / kPerVec;
    const uint4* vp = reinterpret_cast<const uint4*>(p + v0);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const uint4 raw = __ldg(vp + i);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kPerVec; ++j) f(v0 + i * kPerVec + j, Elem<D>::load(e, j));
    }
    v = v0 + nvec * kPerVec;
  }
  for (int64_t i = v + threadIdx.x; i < v1; i += blockDim.x) f(i, Elem<D>::load(p, i));
}

__device__ __forceinline__ float load_prob(const void* q, DType d, int64_t v) {
  switch (d) {
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(q)[v]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(q)[v]);
    default: return static_cast<const float*>(q)[v];
  }
}

}  // namespace dev
SPECDEC_NS_END

