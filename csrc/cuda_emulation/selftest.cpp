// Small kernels that exercise each primitive of the CUDA host emulation on its own (tests/native/test_cuda_emulated_kernels.py
// compares their outputs with CUDA's documented semantics and checks the errors the emulation reports).
// They test the emulation, not the project's kernels.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "emu.h"
#include "specdec/cuda/cuda_common.cuh"

#define SPECDEC_EMU_API extern "C" __attribute__((visibility("default")))

namespace {

// out[4 t + i]: __shfl_sync (lane + 3), __shfl_xor_sync (5), __shfl_up_sync (2), __shfl_down_sync (2) of
// the value 10 t, at the given width.
__global__ void shuffles(int32_t* out, int width) {
  const int t = static_cast<int>(threadIdx.x), lane = t & 31;
  const int v = 10 * t;
  out[4 * t + 0] = __shfl_sync(0xffffffffu, v, lane + 3, width);
  out[4 * t + 1] = __shfl_xor_sync(0xffffffffu, v, 5, width);
  out[4 * t + 2] = __shfl_up_sync(0xffffffffu, v, 2, width);
  out[4 * t + 3] = __shfl_down_sync(0xffffffffu, v, 2, width);
}

// out[8 t + i]: ballot(lane % 3 == 0), all(lane < 40), any(lane == 5), match_any(lane % 4),
// reduce_add(lane), reduce_max(lane - 16) (signed), __syncthreads_count(t % 5 == 0), __syncthreads_or(t == 7).
__global__ void votes(int32_t* out, int) {
  const int t = static_cast<int>(threadIdx.x), lane = t & 31;
  out[8 * t + 0] = static_cast<int32_t>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  out[8 * t + 1] = __all_sync(0xffffffffu, lane < 40);
  out[8 * t + 2] = __any_sync(0xffffffffu, lane == 5);
  out[8 * t + 3] = static_cast<int32_t>(__match_any_sync(0xffffffffu, lane % 4));
  out[8 * t + 4] = static_cast<int32_t>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(lane)));
  out[8 * t + 5] = __reduce_max_sync(0xffffffffu, lane - 16);
  out[8 * t + 6] = __syncthreads_count(t % 5 == 0);
  out[8 * t + 7] = __syncthreads_or(t == 7);
}

// Two half-warps shuffle within their own masks at the same time: out[t] = value of lane (t ^ 1).
__global__ void half_warps(int32_t* out, int) {
  const int t = static_cast<int>(threadIdx.x);
  const unsigned mask = (t & 31) < 16 ? 0x0000ffffu : 0xffff0000u;
  out[t] = __shfl_xor_sync(mask, t, 1);
}

// out[0] = number of threads (atomicAdd), out[1] = max thread index (atomicMax), out[2] = number of
// successful compare-and-swap claims of one slot (exactly 1), out[3 + t] = order of arrival of thread t.
__global__ void atomics(int32_t* out, int) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int32_t ticket = atomicAdd(&out[0], 1);
  atomicMax(&out[1], t);
  if (atomicCAS(&out[3 + static_cast<int>(gridDim.x * blockDim.x)], 0, t + 1) == 0) atomicAdd(&out[2], 1);
  out[3 + t] = ticket;
}

// Dynamic shared memory: out[t] = the value thread (t + 1) % n stored, after a barrier.
__global__ void dynamic_smem(int32_t* out, int) {
  int32_t* buf = specdec::dev::dynamic_shared<int32_t>();
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  buf[t] = 100 + t;
  __syncthreads();
  out[t] = buf[(t + 1) % n];
}

// Shared memory read before any write: out[t] = the poison the block started with (the write that never
// happens keeps the compiler from folding the read of a never-written variable to zero).
__global__ void uninitialised_shared(int32_t* out, int arg) {
  __shared__ int32_t cell[1];
  if (arg == 12345) cell[0] = arg;
  out[threadIdx.x] = cell[0];
}

// Thread 0 publishes a value through shared memory; with `barrier` == 0 the barrier is missing (a race:
// the readers see the value or the poison depending on the schedule).
__global__ void publish(int32_t* out, int barrier) {
  __shared__ int32_t cell[1];
  if (threadIdx.x == 0) cell[0] = 42;
  if (barrier) __syncthreads();
  out[threadIdx.x] = cell[0];
}

// Errors the emulation must report.
__global__ void divergent_barrier(int32_t*, int) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

__global__ void exit_before_barrier(int32_t*, int) {
  if (threadIdx.x == 3) return;
  __syncthreads();
}

__global__ void shuffle_with_exited_lane(int32_t* out, int) {
  if (threadIdx.x == 0) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void full_mask_in_partial_warp(int32_t* out, int) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void endless_barriers(int32_t*, int) {
  for (;;) __syncthreads();
}

struct Kernel {
  const char* name;
  void (*fn)(int32_t*, int);
};

constexpr Kernel kKernels[] = {
    {"shuffles", shuffles},
    {"votes", votes},
    {"half_warps", half_warps},
    {"atomics", atomics},
    {"dynamic_smem", dynamic_smem},
    {"uninitialised_shared", uninitialised_shared},
    {"publish", publish},
    {"divergent_barrier", divergent_barrier},
    {"exit_before_barrier", exit_before_barrier},
    {"shuffle_with_exited_lane", shuffle_with_exited_lane},
    {"full_mask_in_partial_warp", full_mask_in_partial_warp},
    {"endless_barriers", endless_barriers},
};

}  // namespace

// Runs self-test kernel `name` with grid (gx, gy), `block` threads and `smem` dynamic bytes on out;
// returns 0, 1 on an emulation error (specdec_emu_error), 2 for an unknown name.
SPECDEC_EMU_API int specdec_emu_selftest(const char* name, uint32_t gx, uint32_t gy, uint32_t block, uint64_t smem,
                                         int32_t arg, int32_t* out) {
  for (const Kernel& k : kKernels) {
    if (std::strcmp(k.name, name) != 0) continue;
    specdec_emu::launch(k.name, k.fn, dim3(gx, gy), block, smem, nullptr)(out, arg);
    return specdec_emu::error() == nullptr ? 0 : 1;
  }
  return 2;
}
