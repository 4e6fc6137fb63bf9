// Vocabulary-range operations on one row: the hot loops of every host kernel. Compiled once per
// instruction set (csrc/cpu/row_ops.cpp) and reached through the RowKernels table (types.h), so that
// the walks in chain.h / tree.h stay generic. W-lane SIMD from simd.h; exact same arithmetic as the
// scalar functions of math.h / philox.h / gumbel.h, so results do not depend on the instruction set.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/gumbel.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/types.h"
#include "specdec/cpu/gumbel_search.h"
#include "specdec/cpu/normalizer.h"
#include "specdec/cpu/search_sources.h"
#include "specdec/cpu/simd.h"

SPECDEC_NS_BEGIN

// Lane-wise running argmax over consecutive indices: strict > keeps the first maximum of each lane.
struct LaneArgMax {
  simd::f32v value;
  simd::i32v index;

  LaneArgMax() {
    value = simd::f32v{} - kInf;
    index = simd::i32v{} + INT32_MAX;
  }
  void update(simd::f32v x, int32_t base) {
    const simd::i32v take = x > value;
    value = take ? x : value;
    index = take ? simd::iota_i32() + base : index;
  }
  ArgMax result() const {
    const float m = lane_max(value);
    int64_t idx = INT64_MAX;
    for (int l = 0; l < simd::W; ++l) {
      if (value[l] == m && index[l] < idx) idx = index[l];
    }
    if (m == -kInf) idx = 0;  // nothing beat -inf: the reference's argmax of an all -inf row is 0
    return {m, idx};
  }
};

// Greedy: argmax of the sanitized logits over [v0, v1) (first maximum). Chunks of 256 entries are reduced
// with plain maxes on four independent registers (NaN is skipped, as sanitize makes it -inf); only a chunk
// whose sanitized max beats the best so far is scanned again, from L1, for the first index of its max:
// the same argmax as a lane-wise running argmax, without its compare-and-blend chain on every vector.
inline constexpr int64_t kGreedyChunk = 256;

template <DType D>
SPECDEC_SIMD_INLINE void greedy_chunk(const void* row, int64_t v, ArgMax& best) {
  static_assert(kGreedyChunk % (4 * simd::W) == 0, "chunks hold whole groups of four vectors");
  const simd::f32v neg_inf = simd::f32v{} - kInf;
  simd::f32v acc[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
  for (int64_t i = 0; i < kGreedyChunk; i += 4 * simd::W) {
    for (int k = 0; k < 4; ++k) acc[k] = simd::max_v(load_v<D>(row, v + i + k * simd::W), acc[k]);
  }
  const float m = sanitize(lane_max(simd::max_v(simd::max_v(acc[0], acc[1]), simd::max_v(acc[2], acc[3]))));
  if (!(m > best.value)) return;
  for (int64_t i = 0;; i += simd::W) {
    const uint32_t hit = simd::eq_mask(sanitize_v(load_v<D>(row, v + i)), m);
    if (hit != 0) {
      best = {m, v + i + __builtin_ctz(hit)};
      return;
    }
  }
}

// 16-bit logits (bf16, fp16) are sign-magnitude: read as int16, entries >= +0 order like their floats and
// entries <= -0 in reverse. So a chunk can hold an entry above the best so far b only if its largest
// integer exceeds t, the bits of b's entry (b >= +0), or, for b < 0, if it holds a non-negative integer or
// one below t (fewer magnitude bits). Two integer max / min per 2 W entries, no widening, decide that;
// only chunks that pass (the first few of a row, ones holding NaN or +inf, whose integers are the largest)
// take greedy_chunk, from L1. An over-approximation of "beats b", never an under-: the argmax is unchanged.
// Returns where the whole chunks end (the caller finishes the row).
template <DType D>
SPECDEC_SIMD_INLINE int64_t greedy_filtered_16bit(const void* row, int64_t v0, int64_t v1, ArgMax& best) {
  const auto* p = static_cast<const uint16_t*>(row);
  // -0 as t (b = +0) needs no care: only entries above +0 beat it, and the test for b < 0 admits all of those.
  const auto bits_of = [&](int64_t i) { return static_cast<int16_t>(p[i]); };
  int16_t t = static_cast<int16_t>(D == DType::kBFloat16 ? 0xFF80 : 0xFC00);  // -inf
  if (best.value != -kInf) t = bits_of(best.index);
  int64_t v = v0;
  for (; v + 2 * kGreedyChunk <= v1; v += 2 * kGreedyChunk) {
    prefetch_ahead(row, v * kElemBytes<D>, 2 * kGreedyChunk * kElemBytes<D>, v1 * kElemBytes<D>);
    simd::i16v hi, lo;
    minmax_i16(p + v, 2 * kGreedyChunk, hi, lo);
    const bool may_beat = t >= 0 ? simd::any_gt(hi, t) : simd::any_gt(hi, -1) || simd::any_lt(lo, t);
    if (!may_beat) continue;
    const float before = best.value;
    greedy_chunk<D>(row, v, best);
    greedy_chunk<D>(row, v + kGreedyChunk, best);
    if (best.value != before) t = bits_of(best.index);
  }
  return v;
}

// The per-chunk path over [v0, v1) from best: the 16-bit filter (16-bit logits), then greedy_chunk, then
// entry by entry.
template <DType D>
SPECDEC_SIMD_INLINE ArgMax greedy_per_chunk(const void* row, int64_t v0, int64_t v1, ArgMax best) {
  int64_t v = v0;
  if constexpr (D != DType::kFloat32) v = greedy_filtered_16bit<D>(row, v0, v1, best);
  for (; v + kGreedyChunk <= v1; v += kGreedyChunk) {
    prefetch_ahead(row, v * kElemBytes<D>, kGreedyChunk * kElemBytes<D>, v1 * kElemBytes<D>);
    greedy_chunk<D>(row, v, best);
  }
  for (; v < v1; ++v) {
    const float x = sanitize(load_elem(row, D, v));
    if (x > best.value) best = {x, v};
  }
  return best;
}

// h, l: the lane-wise integer max and min of h, l and the 16-bit words x[0, n) (n a multiple of 2 W), read in
// 1 KB chunks with the row passes' prefetch, none at or past x + limit_bytes; a last part chunk, within 1 KB
// of that limit, takes no prefetch of its own. The stream of greedy_grouped_16bit and of the integer read
// probe (stream_minmax16_impl).
SPECDEC_SIMD_INLINE void minmax16_stream(const uint16_t* x, int64_t n, int64_t limit_bytes, simd::i16v& h,
                                         simd::i16v& l) {
  constexpr int64_t kLanes = 2 * simd::W, kChunk = 2 * kGreedyChunk;
  const auto take = [&](int64_t i) {
    const simd::i16v y = simd::load_i16(x + i);
    h = simd::max_i16(h, y);
    l = simd::min_i16(l, y);
  };
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    prefetch_ahead(x, i * 2, kChunk * 2, limit_bytes);
    for (int64_t j = i; j < i + kChunk; j += kLanes) take(j);
  }
  for (; i < n; i += kLanes) take(i);
}

// 16-bit greedy in two phases, over the whole vectors of [v0, v1) in groups of up to kGreedyGroup entries
// (4 KB). The stream keeps only each group's lane-wise integer max and min, in an L1 array of kGreedySegment
// groups: no test and no branch per chunk (greedy_filtered_16bit's per-chunk test and rescans cost 5-10 % of a
// one-row-per-request bf16 step read from memory). Then, from that array: the segment's largest float m (the
// largest integer when one is >= 0, else the smallest), the first group whose max (min) lane holds m's bits,
// and in it, from cache, the first entry with those bits. Equal bits are equal floats and the converse holds
// but for NaN and +0 = -0: a segment whose m is NaN or +-0 is decided by the per-chunk path
// (greedy_per_chunk) instead, from cache. An m of -inf beats no best (strict >), so an all -inf row keeps
// the reference's index 0; +inf is sanitized like every other path's. Returns where the whole vectors end;
// best is updated.
inline constexpr int64_t kGreedyGroup = 2048;
inline constexpr int64_t kGreedySegment = 64;

template <DType D>
SPECDEC_SIMD_INLINE int64_t greedy_grouped_16bit(const void* row, int64_t v0, int64_t v1, ArgMax& best) {
  static_assert(kGreedyGroup % (2 * kGreedyChunk) == 0, "groups hold whole filter chunks");
  constexpr int64_t kLanes = 2 * simd::W;  // 16-bit entries per vector
  constexpr int16_t kInfBits = D == DType::kBFloat16 ? 0x7F80 : 0x7C00;
  const auto* p = static_cast<const uint16_t*>(row);
  const int64_t stop = v0 + (v1 - v0) / kLanes * kLanes;
  simd::i16v hi[kGreedySegment], lo[kGreedySegment];
  int64_t v = v0;
  while (v < stop) {
    int64_t groups = 0;
    for (; groups < kGreedySegment && v + groups * kGreedyGroup < stop; ++groups) {
      const int64_t base = v + groups * kGreedyGroup;
      const int64_t len = std::min(kGreedyGroup, stop - base);
      simd::i16v h = simd::load_i16(p + base), l = h;
      minmax16_stream(p + base, len, (v1 - base) * 2, h, l);
      hi[groups] = h;
      lo[groups] = l;
    }
    const int64_t end = std::min(v + groups * kGreedyGroup, stop);
    simd::i16v H = hi[0], L = lo[0];
    for (int64_t g = 1; g < groups; ++g) {
      H = simd::max_i16(H, hi[g]);
      L = simd::min_i16(L, lo[g]);
    }
    const int16_t top = simd::extreme_lane_i16<true>(H);
    const bool non_negative = top >= 0;
    const int16_t m = non_negative ? top : simd::extreme_lane_i16<false>(L);
    const int magnitude = m & 0x7FFF;
    if (magnitude == 0 || magnitude > kInfBits) {  // +-0 or NaN
      best = greedy_per_chunk<D>(row, v, end, best);
    } else {
      int64_t g = 0;
      while (simd::first_eq_i16(non_negative ? hi[g] : lo[g], m) < 0) ++g;
      int64_t i = v + g * kGreedyGroup;
      int lane;
      while ((lane = simd::first_eq_i16(simd::load_i16(p + i), m)) < 0) i += kLanes;
      const auto bits = static_cast<uint16_t>(m);
      const float value = sanitize(D == DType::kBFloat16 ? bf16_to_float(bits) : fp16_to_float(bits));
      if (value > best.value) best = {value, i + lane};
    }
    v = end;
  }
  return v;
}

template <DType D>
ArgMax greedy_argmax_t(const void* row, int64_t v0, int64_t v1) {
  ArgMax best = kArgMaxInit;
  int64_t v = v0;
  if constexpr (D != DType::kFloat32) v = greedy_grouped_16bit<D>(row, v, v1, best);
  best = greedy_per_chunk<D>(row, v, v1, best);
  if (best.value == -kInf) best.index = 0;  // nothing beat -inf: the reference's argmax of an all -inf row is 0
  return best;
}

// z = sanitize(logit / temperature) into z[v0, v1); returns the max (first index).
template <DType D>
ArgMax scale_row_t(const void* row, float temperature, float* z, int64_t v0, int64_t v1) {
  LaneArgMax acc;
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    const simd::f32v x = sanitize_v(load_v<D>(row, v) / temperature);
    simd::store(z + v, x);
    acc.update(x, static_cast<int32_t>(v));
  }
  ArgMax best = acc.result();
  for (; v < v1; ++v) {
    z[v] = sanitize(load_elem(row, D, v) / temperature);
    if (z[v] > best.value) best = {z[v], v};
  }
  return best;
}

template <DType D>
ArgMax gumbel_blocks_t(const void* row, float temperature, int64_t vocab, const PhiloxKey& key, uint32_t hi,
                       int stream, int64_t v0, int64_t v1, ArgMax start) {
  const ZBounds<D> src{ZSource{row, D, temperature, vocab}};
  return search_blocks(src, key, hi, stream, v0, v1, start);
}

template <DType D, DType Q>
ResidualResult residual_blocks_t(const ResidualArgs& r, const PhiloxKey& key, uint32_t hi, int64_t v0, int64_t v1) {
  const ResidualSource residual{ZSource{r.row, D, r.temperature, r.vocab}, r.max, r.total, r.q, Q};
  if (r.max != -kInf && r.total > 0.0f) {  // bounds from the logits alone; some mass is positive iff a block wins
    const ArgMax best = search_blocks(LazyResidualBounds<D, Q>(residual), key, hi, kStreamRecovery, v0, v1, kArgMaxInit);
    return {best, best.value != -kInf};
  }
  const ResidualBounds<D, Q> src{residual};
  const ArgMax best = search_blocks(src, key, hi, kStreamRecovery, v0, v1, kArgMaxInit);
  return {best, src.any_positive};
}

template <DType D, DType Q>
IntervalPick residual_interval_t(const ResidualArgs& r, float total_hi, const IntervalScore& seed, const PhiloxKey& key,
                                 uint32_t hi, int64_t v0, int64_t v1) {
  const ResidualSource at_lo{ZSource{r.row, D, r.temperature, r.vocab}, r.max, r.total, r.q, Q};
  ResidualSource at_hi = at_lo;
  at_hi.total = total_hi;
  const IntervalResidualBounds<D, Q> src{LazyResidualBounds<D, Q>(at_lo, r.units), at_hi, seed.lo.index, seed.lo.value};
  const int64_t first = seed.lo.index * kBlock;
  if (seed.lo.index >= 0 && first >= v0 && first < v1) offer(src.pick, seed.lo, seed.hi);
  search_blocks(src, key, hi, kStreamRecovery, v0, v1, seed.lo.index >= 0 ? seed.lo : kArgMaxInit);
  return src.pick;
}

inline ArgMax weight_blocks_impl(const float* w, int64_t vocab, const PhiloxKey& key, uint32_t hi, int stream,
                                 int64_t v0, int64_t v1) {
  const WeightBounds src{WeightSource{w, vocab}};
  return search_blocks(src, key, hi, stream, v0, v1, kArgMaxInit);
}

// w_v = exp(z_v - m) written over z[v0, v1) (the softmax numerators of a prepared row); returns their sum
// in double.
inline double softmax_weights_impl(float* z, float m, int64_t v0, int64_t v1) {
  simd::f64v acc = {};
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    const simd::f32v w = simd::exp_f32(simd::load(z + v) - m);
    simd::store(z + v, w);
    acc += __builtin_convertvector(w, simd::f64v);
  }
  double tail = 0.0;
  for (; v < v1; ++v) {
    z[v] = exp_f32(z[v] - m);
    tail += static_cast<double>(z[v]);
  }
  double total = 0.0;
  for (int l = 0; l < simd::W; ++l) total += acc[l];
  return total + tail;
}

// out_v = max(0, w * (e_v / total) - q_v) over [v0, v1) (q = nullptr: q_v = 0), with the reference's
// float32 operations in its order (reference/block.py residual_row, reference/traversal.py); returns the
// sum of out in double.
template <DType Q>
double weighted_residual_t(const float* e, float total, float w, const void* q, float* out, int64_t v0, int64_t v1) {
  simd::f64v acc = {};
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    const simd::f32v qv = q != nullptr ? load_v<Q>(q, v) : simd::f32v{};
    const simd::f32v d = w * (simd::load(e + v) / total) - qv;
    const simd::f32v x = d > 0.0f ? d : 0.0f;
    simd::store(out + v, x);
    acc += __builtin_convertvector(x, simd::f64v);
  }
  double tail = 0.0;
  for (; v < v1; ++v) {
    const float qv = q != nullptr ? load_elem(q, Q, v) : 0.0f;
    const float d = w * (e[v] / total) - qv;
    out[v] = d > 0.0f ? d : 0.0f;
    tail += static_cast<double>(out[v]);
  }
  double sum = 0.0;
  for (int l = 0; l < simd::W; ++l) sum += acc[l];
  return sum + tail;
}

// Sum of x[0, n), read with the row passes' own prefetch (prefetch_ahead) into eight float accumulators (with
// four, the chains of 4-cycle adds held a 39 MB read back by 1-7 % on a 2-core Xeon VM, slower than the
// integer greedy pass): a read-bandwidth probe of benchmarks/bench_native_cpu.py (torch.sum, without
// prefetch, reads slower on some machines). With kWork, every loaded vector first takes `rounds` dependent
// multiply-adds (per round, one per 64-byte line with AVX-512): the same stream carrying a known amount of
// work, for benchmarks/stream_compute_probe.py. The value is returned only so that the reads (and the work)
// happen.
template <bool kWork>
SPECDEC_SIMD_INLINE double stream_pass(const float* x, int64_t n, int rounds) {
  constexpr int64_t kChunk = 256;
  constexpr int kAcc = 8;
  static_assert(kChunk % (kAcc * simd::W) == 0, "chunks hold whole groups of accumulated vectors");
  const simd::f32v scale = simd::f32v{} + 0.999f, bias = simd::f32v{} + 0.001f;
  simd::f32v acc[kAcc] = {};
  int64_t v = 0;
  for (; v + kChunk <= n; v += kChunk) {
    prefetch_ahead(x, v * 4, kChunk * 4, n * 4);
    for (int64_t i = 0; i < kChunk; i += kAcc * simd::W) {
      if constexpr (kWork) {
        simd::f32v y[kAcc];
        for (int k = 0; k < kAcc; ++k) y[k] = simd::load(x + v + i + k * simd::W);
        for (int r = 0; r < rounds; ++r) {
          for (int k = 0; k < kAcc; ++k) y[k] = simd::fma_v(y[k], scale, bias);
        }
        for (int k = 0; k < kAcc; ++k) acc[k] += y[k];
      } else {
        for (int k = 0; k < kAcc; ++k) acc[k] += simd::load(x + v + i + k * simd::W);
      }
    }
  }
  double total = 0.0;
  for (int k = 0; k < kAcc; ++k) {
    for (int l = 0; l < simd::W; ++l) total += acc[k][l];
  }
  for (; v < n; ++v) {
    float y = x[v];
    if constexpr (kWork) {
      for (int r = 0; r < rounds; ++r) y = fma_f32(y, 0.999f, 0.001f);
    }
    total += y;
  }
  return total;
}

// The largest and smallest of x[0, n) read as int16: the integer read probe of bench_native_cpu, the stream
// of the 16-bit greedy pass (minmax16_stream: one integer max and min per vector, the same prefetch) with
// nothing else, so that the greedy pass cannot read faster than its reference by reading differently.
inline Int16Range stream_minmax16_impl(const uint16_t* x, int64_t n) {
  constexpr int64_t kLanes = 2 * simd::W;
  Int16Range r{INT16_MIN, INT16_MAX};
  int64_t v = 0;
  if (n >= kLanes) {
    simd::i16v h = simd::load_i16(x), l = h;
    v = n / kLanes * kLanes;
    minmax16_stream(x, v, n * 2, h, l);
    r = {simd::extreme_lane_i16<true>(h), simd::extreme_lane_i16<false>(l)};
  }
  for (; v < n; ++v) {
    const auto y = static_cast<int16_t>(x[v]);
    r = {std::max(r.max, y), std::min(r.min, y)};
  }
  return r;
}

inline double stream_sum_impl(const float* x, int64_t n) { return stream_pass<false>(x, n, 0); }
inline double stream_work_impl(const float* x, int64_t n, int rounds) { return stream_pass<true>(x, n, rounds); }

// The table entries (dtype switches outside the loops).
inline ArgMax greedy_argmax_any(const void* row, DType d, int64_t v0, int64_t v1) {
  switch (d) {
    case DType::kBFloat16: return greedy_argmax_t<DType::kBFloat16>(row, v0, v1);
    case DType::kFloat16: return greedy_argmax_t<DType::kFloat16>(row, v0, v1);
    default: return greedy_argmax_t<DType::kFloat32>(row, v0, v1);
  }
}

inline ArgMax unit_maxima_any(const void* row, DType d, float temperature, int64_t v0, int64_t v1, float* units) {
  switch (d) {
    case DType::kBFloat16: return unit_maxima_t<DType::kBFloat16>(row, temperature, v0, v1, units);
    case DType::kFloat16: return unit_maxima_t<DType::kFloat16>(row, temperature, v0, v1, units);
    default: return unit_maxima_t<DType::kFloat32>(row, temperature, v0, v1, units);
  }
}

inline ArgMax scale_row_any(const void* row, DType d, float temperature, float* z, int64_t v0, int64_t v1) {
  switch (d) {
    case DType::kBFloat16: return scale_row_t<DType::kBFloat16>(row, temperature, z, v0, v1);
    case DType::kFloat16: return scale_row_t<DType::kFloat16>(row, temperature, z, v0, v1);
    default: return scale_row_t<DType::kFloat32>(row, temperature, z, v0, v1);
  }
}

inline ArgMax gumbel_blocks_any(const void* row, DType d, float temperature, int64_t vocab, const PhiloxKey& key,
                                uint32_t hi, int stream, int64_t v0, int64_t v1, ArgMax start) {
  switch (d) {
    case DType::kBFloat16:
      return gumbel_blocks_t<DType::kBFloat16>(row, temperature, vocab, key, hi, stream, v0, v1, start);
    case DType::kFloat16:
      return gumbel_blocks_t<DType::kFloat16>(row, temperature, vocab, key, hi, stream, v0, v1, start);
    default: return gumbel_blocks_t<DType::kFloat32>(row, temperature, vocab, key, hi, stream, v0, v1, start);
  }
}

inline SoftmaxStats softmax_stats_any(const void* row, DType d, float temperature, int64_t v0, int64_t v1) {
  switch (d) {
    case DType::kBFloat16: return softmax_stats_t<DType::kBFloat16>(row, temperature, v0, v1);
    case DType::kFloat16: return softmax_stats_t<DType::kFloat16>(row, temperature, v0, v1);
    default: return softmax_stats_t<DType::kFloat32>(row, temperature, v0, v1);
  }
}

inline NormalizerBound normalizer_bound_any(const void* row, DType d, float temperature, int64_t v0, int64_t v1) {
  switch (d) {
    case DType::kBFloat16: return normalizer_bound_t<DType::kBFloat16>(row, temperature, v0, v1);
    case DType::kFloat16: return normalizer_bound_t<DType::kFloat16>(row, temperature, v0, v1);
    default: return normalizer_bound_t<DType::kFloat32>(row, temperature, v0, v1);
  }
}

template <DType D>
ResidualResult residual_blocks_q(const ResidualArgs& r, const PhiloxKey& key, uint32_t hi, int64_t v0, int64_t v1) {
  switch (r.q_dtype) {
    case DType::kBFloat16: return residual_blocks_t<D, DType::kBFloat16>(r, key, hi, v0, v1);
    case DType::kFloat16: return residual_blocks_t<D, DType::kFloat16>(r, key, hi, v0, v1);
    default: return residual_blocks_t<D, DType::kFloat32>(r, key, hi, v0, v1);
  }
}

inline ResidualResult residual_blocks_any(const ResidualArgs& r, const PhiloxKey& key, uint32_t hi, int64_t v0,
                                          int64_t v1) {
  switch (r.dtype) {
    case DType::kBFloat16: return residual_blocks_q<DType::kBFloat16>(r, key, hi, v0, v1);
    case DType::kFloat16: return residual_blocks_q<DType::kFloat16>(r, key, hi, v0, v1);
    default: return residual_blocks_q<DType::kFloat32>(r, key, hi, v0, v1);
  }
}

template <DType D>
IntervalPick residual_interval_q(const ResidualArgs& r, float total_hi, const IntervalScore& seed, const PhiloxKey& key,
                                 uint32_t hi, int64_t v0, int64_t v1) {
  switch (r.q_dtype) {
    case DType::kBFloat16: return residual_interval_t<D, DType::kBFloat16>(r, total_hi, seed, key, hi, v0, v1);
    case DType::kFloat16: return residual_interval_t<D, DType::kFloat16>(r, total_hi, seed, key, hi, v0, v1);
    default: return residual_interval_t<D, DType::kFloat32>(r, total_hi, seed, key, hi, v0, v1);
  }
}

inline IntervalPick residual_interval_any(const ResidualArgs& r, float total_hi, const IntervalScore& seed,
                                          const PhiloxKey& key, uint32_t hi, int64_t v0, int64_t v1) {
  switch (r.dtype) {
    case DType::kBFloat16: return residual_interval_q<DType::kBFloat16>(r, total_hi, seed, key, hi, v0, v1);
    case DType::kFloat16: return residual_interval_q<DType::kFloat16>(r, total_hi, seed, key, hi, v0, v1);
    default: return residual_interval_q<DType::kFloat32>(r, total_hi, seed, key, hi, v0, v1);
  }
}

inline double weighted_residual_any(const float* e, float total, float w, const void* q, DType qd, float* out,
                                    int64_t v0, int64_t v1) {
  switch (qd) {
    case DType::kBFloat16: return weighted_residual_t<DType::kBFloat16>(e, total, w, q, out, v0, v1);
    case DType::kFloat16: return weighted_residual_t<DType::kFloat16>(e, total, w, q, out, v0, v1);
    default: return weighted_residual_t<DType::kFloat32>(e, total, w, q, out, v0, v1);
  }
}

inline RowKernels make_row_kernels() {
  RowKernels k;
  k.greedy_argmax = greedy_argmax_any;
  k.unit_maxima = unit_maxima_any;
  k.scale_row = scale_row_any;
  k.gumbel_blocks = gumbel_blocks_any;
  k.softmax_stats = softmax_stats_any;
  k.normalizer_bound = normalizer_bound_any;
  k.residual_blocks = residual_blocks_any;
  k.residual_interval = residual_interval_any;
  k.weight_blocks = weight_blocks_impl;
  k.softmax_weights = softmax_weights_impl;
  k.weighted_residual = weighted_residual_any;
  k.stream_sum = stream_sum_impl;
  k.stream_work = stream_work_impl;
  k.stream_minmax16 = stream_minmax16_impl;
  return k;
}

SPECDEC_NS_END
