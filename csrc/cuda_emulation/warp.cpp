// Warp intrinsics of the CUDA host emulation: lane groups that meet at one shuffle / vote / reduction /
// __syncwarp, exchange their values, and report divergence, missing or exited lanes (see emu.h).
#include <cstring>

#include "emu_state.h"

namespace specdec_emu {

using namespace detail;

namespace detail {

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kShfl: return "__shfl*_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kAll: return "__all_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kSyncWarp: return "__syncwarp";
    case WarpOp::kMatchAny: return "__match_any_sync";
    default: return "__reduce*_sync";
  }
}

}  // namespace detail

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int src_lane, const char* file, int line) {
  Emulator& e = emu();
  Fiber& f = *e.cur;
  Warp& w = e.warps[f.warp];
  const unsigned lane = f.lane, bit = 1u << lane;
  if (!(mask & bit)) fail("calls %s (%s:%d) with mask 0x%08x, which excludes its lane %u", op_name(op), file, line, mask, lane);
  if (mask & ~w.present) {
    fail("calls %s (%s:%d) with mask 0x%08x naming lanes 0x%08x that do not exist in a block of %d threads",
         op_name(op), file, line, mask, mask & ~w.present, e.nthreads);
  }
  if (mask & w.exited) {
    fail("calls %s (%s:%d) with mask 0x%08x naming lanes 0x%08x that have exited", op_name(op), file, line, mask,
         mask & w.exited);
  }
  int gi = -1;
  for (int i = 0; i < kWarpGroups; ++i) {
    WarpGroup& g = w.groups[i];
    if (!g.used || g.complete || !(g.mask & mask)) continue;
    if (g.mask != mask || g.op != op || !same_site(g.file, g.line, file, line)) {
      fail("reaches %s (%s:%d, mask 0x%08x) while lanes 0x%08x of its warp wait at %s (%s:%d, mask 0x%08x): lanes "
           "of a warp diverge between warp intrinsics", op_name(op), file, line, mask, g.arrived, op_name(g.op),
           g.file, g.line, g.mask);
    }
    gi = i;
    break;
  }
  if (gi < 0) {
    for (int i = 0; i < kWarpGroups && gi < 0; ++i) gi = w.groups[i].used ? -1 : i;
    if (gi < 0) fail("more than %d concurrent warp groups in one warp at %s:%d", kWarpGroups, file, line);
    WarpGroup& g = w.groups[gi];
    g.used = true;
    g.complete = false;
    g.op = op;
    g.mask = mask;
    g.arrived = 0;
    g.file = file;
    g.line = line;
  }
  WarpGroup& g = w.groups[gi];
  g.value[lane] = value;
  g.src[lane] = src_lane;
  g.arrived |= bit;
  f.state = State::kWaiting;
  f.wait_file = file;
  f.wait_line = line;
  if (g.arrived == mask) {
    g.complete = true;
    g.unread = popcount(mask);
    release(static_cast<int>(f.warp), mask);
  }
  yield_to_scheduler();
  uint64_t r = 0;
  unsigned ballot = 0;
  if (op == WarpOp::kBallot || op == WarpOp::kAll || op == WarpOp::kAny) {
    for (unsigned m = mask; m; m &= m - 1) {
      const int l = __builtin_ctz(m);
      ballot |= g.value[l] != 0 ? 1u << l : 0u;
    }
  }
  switch (op) {
    case WarpOp::kShfl: {
      const int s = g.src[lane];
      if (s < 0 || s > 31 || !((mask >> s) & 1u)) {
        fail("reads lane %d with a shuffle (%s:%d), which is not in mask 0x%08x", s, file, line, mask);
      }
      r = g.value[s];
      break;
    }
    case WarpOp::kBallot: r = ballot; break;
    case WarpOp::kAll: r = ballot == mask ? 1 : 0; break;
    case WarpOp::kAny: r = ballot != 0 ? 1 : 0; break;
    case WarpOp::kSyncWarp: r = 0; break;
    case WarpOp::kMatchAny:
      for (unsigned m = mask; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        r |= g.value[l] == g.value[lane] ? uint64_t{1} << l : 0;
      }
      break;
    default: {
      uint32_t acc = op == WarpOp::kReduceAnd ? 0xffffffffu : 0u;
      bool first = true;
      for (unsigned m = mask; m; m &= m - 1) {
        const auto v = static_cast<uint32_t>(g.value[__builtin_ctz(m)]);
        const auto sv = static_cast<int32_t>(v), sacc = static_cast<int32_t>(acc);
        switch (op) {
          case WarpOp::kReduceAddU: acc += v; break;
          case WarpOp::kReduceMinU: acc = first || v < acc ? v : acc; break;
          case WarpOp::kReduceMaxU: acc = first || v > acc ? v : acc; break;
          case WarpOp::kReduceMinI: acc = first || sv < sacc ? v : acc; break;
          case WarpOp::kReduceMaxI: acc = first || sv > sacc ? v : acc; break;
          case WarpOp::kReduceAnd: acc &= v; break;
          case WarpOp::kReduceOr: acc |= v; break;
          default: acc ^= v; break;
        }
        first = false;
      }
      r = acc;
    }
  }
  if (--g.unread == 0) g.used = false;
  return r;
}

unsigned lane_id() { return emu().cur->lane; }

unsigned active_mask() {
  Emulator& e = emu();
  const Warp& w = e.warps[e.cur->warp];
  return w.present & ~w.exited;
}

}  // namespace specdec_emu
