// Internal state of the CUDA host emulation, shared by emu.cpp (scheduler, block barriers, launches) and
// warp.cpp (warp intrinsics). Not part of the interface (emu.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "emu.h"
#include "fiber.h"

namespace specdec_emu {
namespace detail {

constexpr int kMaxThreads = 1024;
constexpr int kWarpGroups = 4;       // concurrent warp operations of disjoint lane groups per warp
constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kGuardBytes = 4096;

enum class State { kReady, kWaiting, kDone };

struct Fiber {
  ThreadState ts;
  Context ctx;
  void* mapping = nullptr;
  unsigned lane = 0, warp = 0;
  int tid = 0;
  State state = State::kReady;
  const char* wait_file = nullptr;
  int wait_line = 0;
};

struct WarpGroup {
  bool used = false, complete = false;
  WarpOp op = WarpOp::kSyncWarp;
  unsigned mask = 0, arrived = 0;
  int unread = 0;
  const char* file = nullptr;
  int line = 0;
  uint64_t value[32];
  int src[32];
};

struct Warp {
  unsigned present = 0, exited = 0;
  WarpGroup groups[kWarpGroups];
};

struct Barrier {
  int arrived = 0;
  const char* file = nullptr;
  int line = 0;
  int count = 0, all = 1, any = 0;
  int result[2] = {0, 0};
  unsigned gen = 0;
};

struct Site {
  std::string file;
  int line;
};

struct Emulator {
  Options opts;
  std::string error;
  std::vector<LaunchRecord> launches;
  std::vector<Site> sites;
  std::string sites_text;
  Context sched;
  std::unique_ptr<Fiber[]> fibers{new Fiber[kMaxThreads]};
  Fiber* cur = nullptr;
  int nthreads = 0, exited = 0;
  Barrier bar;
  Warp warps[kMaxThreads / 32];
  uint64_t ready[kMaxThreads / 64];
  std::vector<int> order;
  std::vector<int> stack;  // ready threads of the eager / random schedules
  Body body = nullptr;
  void* ctx = nullptr;
  const char* kernel = "";
  std::vector<unsigned char> dyn_smem;
  uint64_t rng = 0;
  pthread_t tls_thread{};
  unsigned char* tls_block = nullptr;
  size_t tls_bytes = 0;
};

extern Emulator g_emu;

inline Emulator& emu() { return g_emu; }

// Sites are string literals: the same pointer almost always; the text when a file's literal is duplicated.
inline bool same_site(const char* f1, int l1, const char* f2, int l2) {
  return l1 == l2 && (f1 == f2 || std::strcmp(f1, f2) == 0);
}

inline int popcount(unsigned m) {
  int n = 0;
  for (; m; m &= m - 1) ++n;
  return n;
}

void set_error(const std::string& message);
// "kernel block (x, y, z) thread (x, y, z)" of the running fiber, for messages.
std::string where();
const char* op_name(WarpOp op);
// Switches from the running fiber back to the scheduler; returns when the scheduler resumes it.
void yield_to_scheduler();
// Makes the threads of `mask` in warp `warp` (or, for warp < 0, the whole block) ready to run.
void release(int warp, unsigned mask);

}  // namespace detail
}  // namespace specdec_emu
