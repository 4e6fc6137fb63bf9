// Host emulation of the CUDA execution model (test-only; see cuda_runtime.h beside this file).
//
// One emulated block at a time runs as blockDim cooperative fibers on the calling OS thread. A fiber
// runs uninterrupted until it reaches a synchronisation point (__syncthreads, a warp shuffle / vote /
// __syncwarp) or exits; the scheduler then runs the next ready fiber in the order the schedule chooses
// (Schedule below), so code that reads shared data without the barrier that orders it sees different
// values under different schedules. Blocks run one after another, in grid order or a random order.
//
// Errors a GPU would hide or hang on are reported with the source line: a launch outside the device
// limits, __syncthreads reached by only part of the block, a barrier after some threads exited, lanes
// of a warp meeting at different warp intrinsics, masks naming lanes that do not exist or have exited,
// shuffles reading lanes outside the mask, deadlocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

typedef struct CUstream_st* cudaStream_t;

namespace specdec_emu {

// Per-thread state the kernel code reads (threadIdx); the rest lives in emu.cpp.
struct ThreadState {
  uint3 thread_idx;
};

// The fiber now running (its threadIdx), and the running block's blockIdx / blockDim / gridDim.
extern ThreadState* g_thread;
extern uint3 g_block_idx;
extern dim3 g_block_dim;
extern dim3 g_grid_dim;

// kForward / kReverse: rounds — every ready thread runs once to its next synchronisation point, in
// ascending / descending order, before any runs again. kEager: the threads a synchronisation releases
// run first (a warp runs ahead through its shuffles up to the next block barrier while the other warps
// wait). kRandom: each step runs a random ready thread (seeded), blocks in a random order.
enum class Schedule : int { kForward = 0, kReverse = 1, kEager = 2, kRandom = 3 };

struct Options {
  Schedule schedule = Schedule::kForward;
  uint64_t seed = 0;              // random schedules
  const char* drop_file = nullptr;  // planted bug: the __syncthreads at drop_file:drop_line is skipped
  int drop_line = 0;
  int device_arch = 90;            // limits applied at launch (90 = H200, 100 = B200)
  bool dry_run = false;             // check and record launches, run nothing (no memory is touched)
  uint64_t max_rounds = uint64_t{1} << 22;  // per block: more means a loop around barriers that never ends
};

// Options for the launches that follow (not thread-safe: the C API serialises callers).
void set_options(const Options& options);
// Forget the launch log, the barrier sites seen and the first error.
void reset();
bool dry_run();
// First error since reset(), or nullptr.
const char* error();

struct LaunchRecord {
  char name[96];
  dim3 grid, block;
  size_t dynamic_smem;
};
size_t launch_count();
const LaunchRecord* launch_record(size_t i);
// "file:line\n" for every __syncthreads site reached since reset().
const char* barrier_sites();

// Runs body(ctx) once per emulated thread of every block of the grid (a no-op after an earlier error).
using Body = void (*)(void* ctx);
void run_grid(const char* name, dim3 grid, dim3 block, size_t dynamic_smem, Body body, void* ctx);

// Synchronisation points (called through the macros / intrinsics of cuda_runtime.h).
enum class BarrierReduce : int { kNone, kCount, kAnd, kOr };
int syncthreads(const char* file, int line, BarrierReduce reduce = BarrierReduce::kNone, int predicate = 0);

enum class WarpOp : int {
  kShfl, kBallot, kAll, kAny, kSyncWarp, kMatchAny,
  kReduceAddU, kReduceMinU, kReduceMaxU, kReduceMinI, kReduceMaxI, kReduceAnd, kReduceOr, kReduceXor,
};
// Every lane of `mask` deposits `value` (and, for kShfl, the lane it reads); returns, for kShfl the
// value of that lane (which must be in `mask`), for votes / reductions / match the combined result.
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int src_lane, const char* file, int line);
unsigned lane_id();
unsigned active_mask();

// Dynamic shared memory of the running block (extern __shared__ through specdec::dev::dynamic_shared).
void* dynamic_shared();

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

template <class... P>
struct Launch {
  const char* name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;

  template <class... A>
  void operator()(A&&... args) const {
    using Params = std::tuple<std::decay_t<P>...>;
    struct Ctx {
      void (*kernel)(P...);
      const Params* params;
    };
    const Params params(std::forward<A>(args)...);
    const Ctx ctx{kernel, &params};
    // Every thread gets its own copy of the parameters, as from the kernel's parameter space.
    run_grid(name, grid, block, smem, [](void* c) {
      const Ctx* x = static_cast<const Ctx*>(c);
      Params copy = *x->params;
      std::apply(x->kernel, copy);
    }, const_cast<Ctx*>(&ctx));
  }
};

template <class... P>
Launch<P...> launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t) {
  return Launch<P...>{name, kernel, grid, block, smem};
}

template <class T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp intrinsics move 4- or 8-byte values");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}

template <class T>
T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

}  // namespace specdec_emu
