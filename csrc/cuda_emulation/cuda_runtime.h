// Host stand-in for <cuda_runtime.h> (test-only): lets the host compiler build the project's CUDA sources
// unchanged (csrc/include/specdec/cuda/*.cuh and the launchers in csrc/cuda/) on top of the fiber emulation
// in emu.h. The emulation build puts this directory first on the include path and defines
// SPECDEC_CUDA_EMULATION (launch syntax, see SPECDEC_LAUNCH in cuda_common.cuh) and __CUDA_ARCH__ (device
// code paths).
//
// What it provides: the qualifiers, threadIdx / blockIdx / blockDim / gridDim / warpSize, per-block
// __shared__ storage (static thread_local, poisoned at every block start by emu.cpp), __syncthreads
// and its reductions, warp shuffles / votes / reductions / __syncwarp, atomics (a fiber is never
// interrupted between synchronisation points, so read-modify-write is atomic), bit casts and integer
// intrinsics, vector types, and the runtime calls the launchers make. Anything missing is a compile
// error of the emulation build, never a silent fallback.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "emu.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
// No __noinline__: libstdc++ spells __attribute__((__noinline__)) (GCC 13: from <string>), which such a
// macro breaks; no kernel uses it.
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
// Static per-block storage: every fiber of the running block shares it; emu.cpp poisons it before each
// block so that reads before writes are caught.
#define __shared__ static thread_local
#define __constant__ static

#define threadIdx (static_cast<const uint3&>(::specdec_emu::g_thread->thread_idx))
#define blockIdx (static_cast<const uint3&>(::specdec_emu::g_block_idx))
#define blockDim (static_cast<const dim3&>(::specdec_emu::g_block_dim))
#define gridDim (static_cast<const dim3&>(::specdec_emu::g_grid_dim))
#define warpSize 32

#if defined(__FILE_NAME__)
#define SPECDEC_EMU_FILE __FILE_NAME__
#else
#define SPECDEC_EMU_FILE __FILE__
#endif

#define __syncthreads() ::specdec_emu::syncthreads(SPECDEC_EMU_FILE, __LINE__)
#define __syncthreads_count(p) \
  ::specdec_emu::syncthreads(SPECDEC_EMU_FILE, __LINE__, ::specdec_emu::BarrierReduce::kCount, (p) ? 1 : 0)
#define __syncthreads_and(p) \
  ::specdec_emu::syncthreads(SPECDEC_EMU_FILE, __LINE__, ::specdec_emu::BarrierReduce::kAnd, (p) ? 1 : 0)
#define __syncthreads_or(p) \
  ::specdec_emu::syncthreads(SPECDEC_EMU_FILE, __LINE__, ::specdec_emu::BarrierReduce::kOr, (p) ? 1 : 0)
// Memory fences order nothing here: the emulation is sequentially consistent (see README).
#define __threadfence() ((void)0)
#define __threadfence_block() ((void)0)
#define __threadfence_system() ((void)0)

// ---------------------------------------------------------------------------------------------------
// Warp intrinsics. Each is one synchronisation point of the lanes named in mask.
// ---------------------------------------------------------------------------------------------------
namespace specdec_emu {

inline unsigned segment_base(unsigned lane, int width) { return lane & ~static_cast<unsigned>(width - 1); }

inline void check_width(int width, const char* file, int line) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    fail("warp shuffle at %s:%d: width %d is not a power of two in [1, 32]", file, line, width);
  }
}

template <class T>
T shfl(unsigned mask, T var, int src, const char* file, int line) {
  return from_bits<T>(warp_op(WarpOp::kShfl, mask, to_bits(var), src, file, line));
}

template <class T>
T shfl_idx(unsigned mask, T var, int src_lane, int width, const char* file, int line) {
  check_width(width, file, line);
  const unsigned lane = lane_id();
  const int src = static_cast<int>(segment_base(lane, width)) + (src_lane & (width - 1));
  return shfl(mask, var, src, file, line);
}

template <class T>
T shfl_xor(unsigned mask, T var, int lane_mask, int width, const char* file, int line) {
  check_width(width, file, line);
  const unsigned lane = lane_id();
  int src = static_cast<int>(lane ^ static_cast<unsigned>(lane_mask));
  // A lane of a later segment (or past the warp) is out of reach: the caller keeps its own value.
  if (src > 31 || static_cast<unsigned>(src) >= segment_base(lane, width) + static_cast<unsigned>(width)) {
    src = static_cast<int>(lane);
  }
  return shfl(mask, var, src, file, line);
}

template <class T>
T shfl_up(unsigned mask, T var, unsigned delta, int width, const char* file, int line) {
  check_width(width, file, line);
  const unsigned lane = lane_id();
  const int src = static_cast<int>(lane) - static_cast<int>(delta);
  const bool inside = src >= static_cast<int>(segment_base(lane, width));
  return shfl(mask, var, inside ? src : static_cast<int>(lane), file, line);
}

template <class T>
T shfl_down(unsigned mask, T var, unsigned delta, int width, const char* file, int line) {
  check_width(width, file, line);
  const unsigned lane = lane_id();
  const unsigned src = lane + delta;
  const bool inside = src < segment_base(lane, width) + static_cast<unsigned>(width);
  return shfl(mask, var, inside ? static_cast<int>(src) : static_cast<int>(lane), file, line);
}

inline unsigned vote(WarpOp op, unsigned mask, int pred, const char* file, int line) {
  return static_cast<unsigned>(warp_op(op, mask, pred ? 1u : 0u, -1, file, line));
}

template <class T>
T reduce(WarpOp op, unsigned mask, T value, const char* file, int line) {
  return static_cast<T>(warp_op(op, mask, static_cast<uint64_t>(static_cast<uint32_t>(value)), -1, file, line));
}

}  // namespace specdec_emu

#define __shfl_sync(mask, var, ...) ::specdec_emu::shfl_idx_call(SPECDEC_EMU_FILE, __LINE__, mask, var, __VA_ARGS__)
#define __shfl_xor_sync(mask, var, ...) ::specdec_emu::shfl_xor_call(SPECDEC_EMU_FILE, __LINE__, mask, var, __VA_ARGS__)
#define __shfl_up_sync(mask, var, ...) ::specdec_emu::shfl_up_call(SPECDEC_EMU_FILE, __LINE__, mask, var, __VA_ARGS__)
#define __shfl_down_sync(mask, var, ...) ::specdec_emu::shfl_down_call(SPECDEC_EMU_FILE, __LINE__, mask, var, __VA_ARGS__)
#define __ballot_sync(mask, pred) ::specdec_emu::vote(::specdec_emu::WarpOp::kBallot, mask, pred, SPECDEC_EMU_FILE, __LINE__)
#define __all_sync(mask, pred) \
  static_cast<int>(::specdec_emu::vote(::specdec_emu::WarpOp::kAll, mask, pred, SPECDEC_EMU_FILE, __LINE__))
#define __any_sync(mask, pred) \
  static_cast<int>(::specdec_emu::vote(::specdec_emu::WarpOp::kAny, mask, pred, SPECDEC_EMU_FILE, __LINE__))
#define __syncwarp(...) ::specdec_emu::syncwarp_call(SPECDEC_EMU_FILE, __LINE__, ##__VA_ARGS__)
#define __activemask() ::specdec_emu::active_mask()
#define __match_any_sync(mask, value) \
  static_cast<unsigned>(::specdec_emu::warp_op(::specdec_emu::WarpOp::kMatchAny, mask, \
                                               ::specdec_emu::to_bits(value), -1, SPECDEC_EMU_FILE, __LINE__))
#define __reduce_add_sync(mask, v) ::specdec_emu::reduce(::specdec_emu::WarpOp::kReduceAddU, mask, v, SPECDEC_EMU_FILE, __LINE__)
#define __reduce_and_sync(mask, v) ::specdec_emu::reduce(::specdec_emu::WarpOp::kReduceAnd, mask, v, SPECDEC_EMU_FILE, __LINE__)
#define __reduce_or_sync(mask, v) ::specdec_emu::reduce(::specdec_emu::WarpOp::kReduceOr, mask, v, SPECDEC_EMU_FILE, __LINE__)
#define __reduce_xor_sync(mask, v) ::specdec_emu::reduce(::specdec_emu::WarpOp::kReduceXor, mask, v, SPECDEC_EMU_FILE, __LINE__)
#define __reduce_min_sync(mask, v) ::specdec_emu::reduce_minmax(false, mask, v, SPECDEC_EMU_FILE, __LINE__)
#define __reduce_max_sync(mask, v) ::specdec_emu::reduce_minmax(true, mask, v, SPECDEC_EMU_FILE, __LINE__)

namespace specdec_emu {

template <class T>
T shfl_idx_call(const char* f, int l, unsigned mask, T var, int src, int width = 32) {
  return shfl_idx(mask, var, src, width, f, l);
}
template <class T>
T shfl_xor_call(const char* f, int l, unsigned mask, T var, int lane_mask, int width = 32) {
  return shfl_xor(mask, var, lane_mask, width, f, l);
}
template <class T>
T shfl_up_call(const char* f, int l, unsigned mask, T var, unsigned delta, int width = 32) {
  return shfl_up(mask, var, delta, width, f, l);
}
template <class T>
T shfl_down_call(const char* f, int l, unsigned mask, T var, unsigned delta, int width = 32) {
  return shfl_down(mask, var, delta, width, f, l);
}
inline void syncwarp_call(const char* f, int l, unsigned mask = 0xffffffffu) {
  warp_op(WarpOp::kSyncWarp, mask, 0, -1, f, l);
}
inline int reduce_minmax(bool is_max, unsigned mask, int v, const char* f, int l) {
  return static_cast<int>(static_cast<uint32_t>(
      warp_op(is_max ? WarpOp::kReduceMaxI : WarpOp::kReduceMinI, mask, static_cast<uint32_t>(v), -1, f, l)));
}
inline unsigned reduce_minmax(bool is_max, unsigned mask, unsigned v, const char* f, int l) {
  return static_cast<unsigned>(warp_op(is_max ? WarpOp::kReduceMaxU : WarpOp::kReduceMinU, mask, v, -1, f, l));
}

}  // namespace specdec_emu

// ---------------------------------------------------------------------------------------------------
// Vector types, loads, bit casts, integer intrinsics.
// ---------------------------------------------------------------------------------------------------
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }

template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline T __ldlu(const T* p) { return *p; }
template <class T>
inline void __stcg(T* p, T v) { *p = v; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }

inline unsigned __float_as_uint(float x) { return specdec_emu::from_bits<unsigned>(specdec_emu::to_bits(x)); }
inline float __uint_as_float(unsigned u) { return specdec_emu::from_bits<float>(u); }
inline int __float_as_int(float x) { return static_cast<int>(__float_as_uint(x)); }
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned>(i)); }
inline long long __double_as_longlong(double x) { return static_cast<long long>(specdec_emu::to_bits(x)); }
inline double __longlong_as_double(long long u) { return specdec_emu::from_bits<double>(static_cast<uint64_t>(u)); }

inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<int64_t>(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) {
  return static_cast<long long>((static_cast<__int128>(a) * b) >> 64);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>((v << (shift & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>(v >> (shift & 31));
}

// ---------------------------------------------------------------------------------------------------
// Atomics: between synchronisation points a fiber is never interrupted, so plain read-modify-write is
// atomic with respect to every other emulated thread. They return the old value, as on the GPU.
// ---------------------------------------------------------------------------------------------------
template <class T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
inline T atomicSub(T* p, T v) {
  const T old = *p;
  *p = old - v;
  return old;
}
template <class T>
inline T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <class T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <class T>
inline T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
template <class T>
inline T atomicAnd(T* p, T v) {
  const T old = *p;
  *p = old & v;
  return old;
}
template <class T>
inline T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <class T>
inline T atomicXor(T* p, T v) {
  const T old = *p;
  *p = old ^ v;
  return old;
}
inline unsigned atomicInc(unsigned* p, unsigned limit) {
  const unsigned old = *p;
  *p = old >= limit ? 0u : old + 1u;
  return old;
}
inline unsigned atomicDec(unsigned* p, unsigned limit) {
  const unsigned old = *p;
  *p = (old == 0u || old > limit) ? limit : old - 1u;
  return old;
}

// ---------------------------------------------------------------------------------------------------
// Runtime API used by the launchers (device memory is host memory; streams are ignored: launches run
// to completion in issue order).
// ---------------------------------------------------------------------------------------------------
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorLaunchFailure = 719 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t = nullptr) {
  if (!specdec_emu::dry_run()) std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int = 0, cudaStream_t = nullptr) {
  if (!specdec_emu::dry_run()) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return specdec_emu::error() ? cudaErrorLaunchFailure : cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaGetLastError(); }
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated launch failed"; }
template <class F>
inline cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
