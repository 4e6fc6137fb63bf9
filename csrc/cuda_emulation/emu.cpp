// Scheduler of the CUDA host emulation (see emu.h): fibers, block barriers, warp groups, launch limits,
// shared-memory poisoning, schedules, diagnostics.
#include "emu.h"

#include <link.h>
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emu_state.h"
#include "fiber.h"

namespace specdec_emu {

ThreadState* g_thread = nullptr;
uint3 g_block_idx{0, 0, 0};
dim3 g_block_dim;
dim3 g_grid_dim;

namespace detail {

Emulator g_emu;

}  // namespace detail

using namespace detail;

namespace {

// Device limits (CUDA programming guide, compute capabilities 9.0 and 10.0 alike).
constexpr unsigned kMaxBlockThreads = 1024;
constexpr unsigned kMaxBlockX = 1024, kMaxBlockY = 1024, kMaxBlockZ = 64;
constexpr uint64_t kMaxGridX = 2147483647u;
constexpr unsigned kMaxGridYZ = 65535;
constexpr size_t kMaxDynamicSmem = 48 * 1024;  // without cudaFuncAttributeMaxDynamicSharedMemorySize

// Per-block storage poisoned at every block start: every `__shared__` variable is a static thread_local
// of this library, so this thread's TLS block of the library is exactly that storage (plus this anchor).
thread_local unsigned char g_tls_anchor;

uint64_t next_random(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string vformat(const char* fmt, va_list ap) {
  char buf[1024];
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  return buf;
}

}  // namespace

namespace detail {

void set_error(const std::string& message) {
  Emulator& e = emu();
  if (e.error.empty()) e.error = message;
}

std::string where() {
  Emulator& e = emu();
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s block (%u, %u, %u)", e.kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z);
  std::string s = buf;
  if (e.cur != nullptr) {
    const uint3& t = e.cur->ts.thread_idx;
    std::snprintf(buf, sizeof(buf), " thread (%u, %u, %u)", t.x, t.y, t.z);
    s += buf;
  }
  return s;
}

void yield_to_scheduler() {
  Emulator& e = emu();
  switch_context(e.cur->ctx, e.sched);
}

bool round_schedule() {
  const Schedule s = emu().opts.schedule;
  return s == Schedule::kForward || s == Schedule::kReverse;
}

void make_ready(Fiber& f) {
  Emulator& e = emu();
  f.state = State::kReady;
  if (round_schedule()) {
    e.ready[f.tid >> 6] |= uint64_t{1} << (f.tid & 63);
  } else {
    e.stack.push_back(f.tid);
  }
}

// Pushed in descending order so that the eager schedule resumes them in ascending order.
void release(int warp, unsigned mask) {
  Emulator& e = emu();
  if (warp < 0) {
    for (int t = e.nthreads - 1; t >= 0; --t) make_ready(e.fibers[t]);
    return;
  }
  for (int lane = 31; lane >= 0; --lane) {
    if ((mask >> lane) & 1u) make_ready(e.fibers[warp * 32 + lane]);
  }
}

}  // namespace detail

namespace {

void thread_exit() {
  Emulator& e = emu();
  Fiber& f = *e.cur;
  f.state = State::kDone;
  ++e.exited;
  Warp& w = e.warps[f.warp];
  const unsigned bit = 1u << f.lane;
  w.exited |= bit;
  if (e.bar.arrived > 0) {
    fail("exits while %d thread(s) wait at __syncthreads (%s:%d): every thread of a block must reach each barrier",
         e.bar.arrived, e.bar.file, e.bar.line);
  }
  for (const WarpGroup& g : w.groups) {
    if (g.used && !g.complete && (g.mask & bit)) {
      fail("exits while lanes 0x%08x of its warp wait for it at %s (%s:%d, mask 0x%08x)", g.arrived, op_name(g.op),
           g.file, g.line, g.mask);
    }
  }
}

void fiber_entry() {
  Emulator& e = emu();
  e.body(e.ctx);
  thread_exit();
  switch_context(e.cur->ctx, e.sched);  // never resumed
  __builtin_unreachable();
}

int find_tls(struct dl_phdr_info* info, size_t, void* data) {
  Emulator& e = *static_cast<Emulator*>(data);
  const auto self = reinterpret_cast<uintptr_t>(&g_tls_anchor);
  if (info->dlpi_tls_data == nullptr) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_TLS) continue;
    const auto start = reinterpret_cast<uintptr_t>(info->dlpi_tls_data);
    if (self >= start && self < start + ph.p_memsz) {
      e.tls_block = static_cast<unsigned char*>(info->dlpi_tls_data);
      e.tls_bytes = ph.p_memsz;
      return 1;
    }
  }
  return 0;
}

// Fills this library's TLS block of the calling OS thread (all __shared__ storage) and the dynamic
// shared memory with the block's poison bytes.
void poison_shared(uint8_t pattern, bool random) {
  Emulator& e = emu();
  if (e.tls_block == nullptr || !pthread_equal(e.tls_thread, pthread_self())) {
    volatile unsigned char* touch = &g_tls_anchor;  // allocates this thread's block
    *touch = 0;
    e.tls_block = nullptr;
    dl_iterate_phdr(find_tls, &e);
    e.tls_thread = pthread_self();
    if (e.tls_block == nullptr) {
      set_error("cuda_emulation: cannot locate the emulation library's thread-local block (__shared__ storage)");
      return;
    }
  }
  auto fill = [&](unsigned char* p, size_t n) {
    if (!random) {
      std::memset(p, pattern, n);
      return;
    }
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(next_random(e.rng));
  };
  fill(e.tls_block, e.tls_bytes);
  if (!e.dyn_smem.empty()) fill(e.dyn_smem.data(), e.dyn_smem.size());
}

void ensure_stacks(int n) {
  Emulator& e = emu();
  for (int i = 0; i < n; ++i) {
    Fiber& f = e.fibers[i];
    if (f.mapping != nullptr) continue;
    void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
      set_error("cuda_emulation: cannot map fiber stacks");
      return;
    }
    mprotect(m, kGuardBytes, PROT_NONE);  // overflow faults instead of corrupting the next stack
    f.mapping = m;
  }
}

std::string deadlock_report() {
  Emulator& e = emu();
  char buf[256];
  std::string s = "deadlock: no thread can make progress;";
  if (e.bar.arrived > 0) {
    std::snprintf(buf, sizeof(buf), " %d of %d threads wait at __syncthreads (%s:%d);", e.bar.arrived, e.nthreads,
                  e.bar.file, e.bar.line);
    s += buf;
  }
  for (int w = 0; w < (e.nthreads + 31) / 32; ++w) {
    for (const WarpGroup& g : e.warps[w].groups) {
      if (!g.used || g.complete) continue;
      std::snprintf(buf, sizeof(buf), " warp %d: lanes 0x%08x wait at %s (%s:%d) for lanes 0x%08x;", w, g.arrived,
                    op_name(g.op), g.file, g.line, g.mask & ~g.arrived);
      s += buf;
    }
  }
  return s;
}

void build_order() {
  Emulator& e = emu();
  e.order.clear();
  const int words = (e.nthreads + 63) / 64;
  for (int w = 0; w < words; ++w) {
    uint64_t bits = e.ready[w];
    e.ready[w] = 0;
    while (bits) {
      e.order.push_back(w * 64 + __builtin_ctzll(bits));
      bits &= bits - 1;
    }
  }
  if (e.opts.schedule == Schedule::kReverse) std::reverse(e.order.begin(), e.order.end());
}

// Runs thread t to its next synchronisation point; false when the block must be abandoned (an error).
bool step(int t) {
  Emulator& e = emu();
  Fiber& f = e.fibers[t];
  e.cur = &f;
  g_thread = &f.ts;
  switch_context(e.sched, f.ctx);
  e.cur = nullptr;
  return e.error.empty();
}

void stuck(uint64_t rounds) {
  set_error(where() + ": still running after " + std::to_string(rounds) +
            " rounds of synchronisation (a loop around barriers that never ends?)");
}

void run_block() {
  Emulator& e = emu();
  const unsigned bx = g_block_dim.x, by = g_block_dim.y;
  const Schedule s = e.opts.schedule;
  poison_shared(s == Schedule::kForward ? 0xff : 0x7f, s == Schedule::kRandom);
  e.bar = Barrier{};
  e.exited = 0;
  for (int w = 0; w < (e.nthreads + 31) / 32; ++w) {
    Warp& warp = e.warps[w];
    const int lanes = e.nthreads - w * 32 < 32 ? e.nthreads - w * 32 : 32;
    warp.present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    warp.exited = 0;
    for (WarpGroup& g : warp.groups) g.used = false;
  }
  std::memset(e.ready, 0, sizeof(e.ready));
  e.stack.clear();
  for (int t = 0; t < e.nthreads; ++t) {
    Fiber& f = e.fibers[t];
    f.tid = t;
    f.lane = static_cast<unsigned>(t) & 31u;
    f.warp = static_cast<unsigned>(t) >> 5;
    f.ts.thread_idx = uint3{t % bx, (t / bx) % by, t / (bx * by)};
    make_context(f.ctx, static_cast<char*>(f.mapping) + kGuardBytes, kStackBytes, fiber_entry);
  }
  release(-1, 0);
  if (round_schedule()) {
    for (uint64_t round = 0;; ++round) {
      if (round == e.opts.max_rounds) return stuck(round);
      build_order();
      if (e.order.empty()) break;
      for (int t : e.order) {
        if (!step(t)) return;
      }
    }
  } else {
    const uint64_t max_steps = e.opts.max_rounds * static_cast<uint64_t>(e.nthreads);
    for (uint64_t steps = 0; !e.stack.empty(); ++steps) {
      if (steps == max_steps) return stuck(e.opts.max_rounds);
      const size_t i = s == Schedule::kEager ? e.stack.size() - 1 : next_random(e.rng) % e.stack.size();
      const int t = e.stack[i];
      e.stack[i] = e.stack.back();
      e.stack.pop_back();
      if (!step(t)) return;
    }
  }
  if (e.exited < e.nthreads) set_error(where() + ": " + deadlock_report());
}

bool check_launch(const char* name, dim3 grid, dim3 block, size_t smem) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  char buf[512];
  const char* device = emu().opts.device_arch >= 100 ? "B200 (sm_100)" : "H200 (sm_90)";
  if (block.x == 0 || block.y == 0 || block.z == 0 || threads > kMaxBlockThreads || block.x > kMaxBlockX ||
      block.y > kMaxBlockY || block.z > kMaxBlockZ) {
    std::snprintf(buf, sizeof(buf),
                  "invalid launch of %s: block (%u, %u, %u) exceeds the %s limits (at most %u threads, "
                  "%u x %u x %u)", name, block.x, block.y, block.z, device, kMaxBlockThreads, kMaxBlockX, kMaxBlockY,
                  kMaxBlockZ);
    set_error(buf);
    return false;
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > kMaxGridX || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ) {
    std::snprintf(buf, sizeof(buf),
                  "invalid launch of %s: grid (%u, %u, %u) exceeds the %s limits (x in [1, 2^31 - 1], y and z in "
                  "[1, 65535])", name, grid.x, grid.y, grid.z, device);
    set_error(buf);
    return false;
  }
  if (smem > kMaxDynamicSmem) {
    std::snprintf(buf, sizeof(buf), "invalid launch of %s: %zu bytes of dynamic shared memory exceed %zu", name, smem,
                  kMaxDynamicSmem);
    set_error(buf);
    return false;
  }
  return true;
}

}  // namespace

void set_options(const Options& options) {
  Emulator& e = emu();
  e.opts = options;
  e.rng = options.seed * 0x2545F4914F6CDD1Dull + 1;
}

void reset() {
  Emulator& e = emu();
  e.error.clear();
  e.launches.clear();
  e.sites.clear();
  e.sites_text.clear();
}

bool dry_run() { return emu().opts.dry_run; }

const char* error() {
  Emulator& e = emu();
  return e.error.empty() ? nullptr : e.error.c_str();
}

size_t launch_count() { return emu().launches.size(); }

const LaunchRecord* launch_record(size_t i) {
  Emulator& e = emu();
  return i < e.launches.size() ? &e.launches[i] : nullptr;
}

const char* barrier_sites() {
  Emulator& e = emu();
  e.sites_text.clear();
  for (const Site& s : e.sites) e.sites_text += s.file + ":" + std::to_string(s.line) + "\n";
  return e.sites_text.c_str();
}

void run_grid(const char* name, dim3 grid, dim3 block, size_t dynamic_smem, Body body, void* ctx) {
  Emulator& e = emu();
  if (!e.error.empty()) return;
  LaunchRecord rec{};
  std::snprintf(rec.name, sizeof(rec.name), "%s", name);
  rec.grid = grid;
  rec.block = block;
  rec.dynamic_smem = dynamic_smem;
  e.launches.push_back(rec);
  if (!check_launch(name, grid, block, dynamic_smem) || e.opts.dry_run) return;
  e.nthreads = static_cast<int>(block.x * block.y * block.z);
  ensure_stacks(e.nthreads);
  if (!e.error.empty()) return;
  e.body = body;
  e.ctx = ctx;
  e.kernel = name;
  e.dyn_smem.assign(dynamic_smem, 0);
  g_block_dim = block;
  g_grid_dim = grid;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  std::vector<uint32_t> perm;
  if (e.opts.schedule == Schedule::kRandom) {
    perm.resize(blocks);
    for (uint64_t i = 0; i < blocks; ++i) perm[i] = static_cast<uint32_t>(i);
    for (uint64_t i = blocks; i > 1; --i) std::swap(perm[i - 1], perm[next_random(e.rng) % i]);
  }
  for (uint64_t i = 0; i < blocks && e.error.empty(); ++i) {
    uint64_t b = i;
    if (e.opts.schedule == Schedule::kReverse) b = blocks - 1 - i;
    if (e.opts.schedule == Schedule::kRandom) b = perm[i];
    g_block_idx = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                        static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
    run_block();
  }
  g_thread = nullptr;
}

int syncthreads(const char* file, int line, BarrierReduce reduce, int predicate) {
  Emulator& e = emu();
  if (e.opts.drop_file != nullptr && same_site(file, line, e.opts.drop_file, e.opts.drop_line)) {
    return predicate;  // the planted bug: this barrier is missing
  }
  Fiber& f = *e.cur;
  Barrier& b = e.bar;
  if (e.exited > 0) {
    fail("reaches __syncthreads (%s:%d) after %d thread(s) of its block exited (an early return before a block "
         "barrier)", file, line, e.exited);
  }
  if (b.arrived == 0) {
    b.file = file;
    b.line = line;
    b.count = 0;
    b.all = 1;
    b.any = 0;
    bool seen = false;
    for (const Site& s : e.sites) seen = seen || (s.line == line && s.file == file);
    if (!seen) e.sites.push_back(Site{file, line});
  } else if (!same_site(b.file, b.line, file, line)) {
    fail("waits at __syncthreads (%s:%d) while %d thread(s) of its block wait at %s:%d (divergent barrier)", file,
         line, b.arrived, b.file, b.line);
  }
  b.count += predicate ? 1 : 0;
  b.all &= predicate ? 1 : 0;
  b.any |= predicate ? 1 : 0;
  const unsigned gen = b.gen;
  f.state = State::kWaiting;
  f.wait_file = file;
  f.wait_line = line;
  if (++b.arrived == e.nthreads) {
    b.result[gen & 1] = reduce == BarrierReduce::kCount ? b.count : reduce == BarrierReduce::kAnd ? b.all : b.any;
    b.arrived = 0;
    ++b.gen;
    release(-1, 0);
  }
  yield_to_scheduler();
  return b.result[gen & 1];
}

void* dynamic_shared() {
  Emulator& e = emu();
  return e.dyn_smem.empty() ? nullptr : e.dyn_smem.data();
}

void fail(const char* fmt, ...) {
  Emulator& e = emu();
  va_list ap;
  va_start(ap, fmt);
  const std::string what = vformat(fmt, ap);
  va_end(ap);
  set_error(where() + " " + what);
  if (e.cur == nullptr) std::abort();  // only fibers report through fail()
  e.cur->state = State::kDone;
  switch_context(e.cur->ctx, e.sched);  // the scheduler abandons the block; never resumed
  __builtin_unreachable();
}

}  // namespace specdec_emu
