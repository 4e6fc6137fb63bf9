// CUDA building blocks shared by the chain and tree kernels: (value, index) argmax with ties to the
// lowest index, block reductions, 16-byte vectorised row loads, truncated logits and their order-key
// statistics (top-k / top-p thresholds, and the sampling mask's threshold of a row), and the launch macro.
// Framework-free (no torch headers), so CI compiles it with nvcc alone.
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"

// Launches are written SPECDEC_LAUNCH(kernel, grid, block, smem, stream)(args...) rather than
// kernel<<<grid, block, smem, stream>>>(args...), so that the CUDA host emulation (csrc/cuda_emulation, tests
// only) builds these very launchers with a host compiler.
#if defined(SPECDEC_CUDA_EMULATION)
#define SPECDEC_LAUNCH(kernel, grid, block, smem, stream) \
  ::specdec_emu::launch(#kernel, kernel, grid, block, smem, stream)
#else
#define SPECDEC_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#endif

SPECDEC_NS_BEGIN
namespace dev {

// The block's dynamic shared memory (the launch's smem bytes), 16-byte aligned.
template <class T>
__device__ __forceinline__ T* dynamic_shared() {
#if defined(SPECDEC_CUDA_EMULATION)
  return static_cast<T*>(::specdec_emu::dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char specdec_dynamic_smem[];
  return reinterpret_cast<T*>(specdec_dynamic_smem);
#endif
}

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

// Scaled, sanitised logit z = x / temperature, or -inf when top-k / top-p drop it (order key below lo_key).
__device__ __forceinline__ float truncated(float x, float temperature, uint32_t lo_key) {
  const float z = sanitize(x / temperature);
  return order_key(z) >= lo_key ? z : -kInf;
}

// Number of z with order key >= t, and the mass of z with key > t (exp(z - zmax)), over one row.
template <DType D>
__device__ void key_stats(const void* row, int64_t V, float temperature, uint32_t lo_key, uint32_t t, float zmax,
                          bool want_mass, int64_t& count, double& mass, double* smem) {
  double c = 0.0, m = 0.0;
  for_each_elem<D>(row, 0, V, [&](int64_t, float x) {
    const float z = truncated(x, temperature, lo_key);
    const uint32_t key = order_key(z);
    c += key >= t ? 1.0 : 0.0;
    if (want_mass && key > t) m += static_cast<double>(exp_f32(z - zmax));
  });
  count = static_cast<int64_t>(block_sum(c, smem));
  mass = want_mass ? block_sum(m, smem) : 0.0;
}

// Truncation threshold of one row for top-k / top-p (temperature > 0): the order key t such that
// truncated(x, temp, t) keeps exactly the tokens reference/sampling.py keeps (0 keeps everything). Exact
// bisections over the 32-bit keys, one pass over the row per step, every thread of the block taking part.
template <DType D>
__device__ uint32_t row_lo_key(const void* row, int64_t V, float temp, int32_t k, float top_p, double* smem,
                               DevArgMax* amax) {
  uint32_t lo_key = 0;
  int64_t count;
  double mass;
  if (k > 0 && k < V) {
    // Largest t with count(key >= t) >= k: the key of the k-th largest value. Upper midpoint without
    // overflow (lo + (hi - lo + 1) / 2 wraps to lo at the first step and never ends).
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
      const uint32_t mid = hi - (hi - lo) / 2;
      key_stats<D>(row, V, temp, 0, mid, 0.0f, false, count, mass, smem);
      if (count >= k) lo = mid; else hi = mid - 1;
    }
    lo_key = lo;
  }
  if (top_p < 1.0f) {
    DevArgMax best{-kInf, 0x7fffffff};
    for_each_elem<D>(row, 0, V, [&](int64_t v, float x) {
      best = better(best, DevArgMax{truncated(x, temp, lo_key), static_cast<int32_t>(v)});
    });
    const float zmax = block_argmax(best, amax).value;
    if (zmax != -kInf) {
      key_stats<D>(row, V, temp, lo_key, 0, zmax, true, count, mass, smem);
      const float limit = top_p * static_cast<float>(mass);  // mass of key > 0: the whole row
      // Smallest t with mass(key > t) < limit: keep iff key >= t.
      uint32_t lo = lo_key, hi = 0xffffffffu;
      while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        key_stats<D>(row, V, temp, lo_key, mid, zmax, true, count, mass, smem);
        if (static_cast<float>(mass) < limit) hi = mid; else lo = mid + 1;
      }
      lo_key = lo;
    }
  }
  return lo_key;
}

// The sampling mask's threshold of a row truncated at key `lo_key` (row_lo_key's; 0 keeps everything: -inf):
// the row keeps its finite values at or above it (reference.sampling.kept_threshold; a greedy row's is its max).
__device__ __forceinline__ float key_threshold(uint32_t lo_key) { return lo_key == 0 ? -kInf : key_value(lo_key); }

// Stores `value` at row_threshold[row] when the mask is asked for (a null row_threshold: nothing). One thread
// of a block-per-request kernel calls it.
__device__ __forceinline__ void store_threshold(float* row_threshold, int64_t row, float value) {
  if (row_threshold != nullptr) row_threshold[row] = value;
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

