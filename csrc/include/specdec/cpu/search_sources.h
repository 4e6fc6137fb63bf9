// The sources of search_blocks (gumbel_search.h): the bounds, candidate preparation and exact scores of
// logits rows (ZBounds), residual rows (exact, lazy and with the normalizer known within an interval) and
// weight rows. One instruction-set build per host (csrc/cpu/row_ops.cpp).
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/gumbel.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/types.h"
#include "specdec/cpu/gumbel_search.h"
#include "specdec/cpu/row_load.h"
#include "specdec/cpu/simd.h"

SPECDEC_NS_BEGIN

// --- Sources ---------------------------------------------------------------------------------------------
// bounds(b0, nb, ub, part): an upper bound of every block bound of blocks b0 .. b0 + nb - 1, the largest of
// them (exact sources also write ub[j] for j < nb, -inf beyond; kPartThresholds sources one of the blocks
// of each part q in part[q]); prepare(c, mx): the candidates' own bounds c.ub (exact sources: their ub,
// kept when they joined); score(c, mx, mask, g, best): best after the candidates in mask with Gumbel
// terms g.

template <DType D>
struct ZBounds {
  static constexpr bool kExact = false;
  static constexpr bool kPartThresholds = false;
  ZSource src;

  // The group's bound only, max_j ub_j = z_group_max + kLogBlockBound; candidates get their own from
  // their largest z.
  float bounds(int64_t b0, int nb, float*, float*) const { return z_group_max<D>(src, b0, nb) + kLogBlockBound; }
  void prepare(Candidates& c, float* mx) const {
    load_candidates<D>(src, c);
    candidate_maxima(c, mx);
    for (int j = 0; j < kBatch; j += simd::W) simd::store(c.ub + j, simd::load(mx + j) + kLogBlockBound);
  }
  void score(const Candidates& c, const float* mx, uint32_t mask, const float* g, ArgMax& best) const {
    alignas(64) float mass[kBatch];
    candidate_z_masses(c, mx, mask, mass);
    for (; mask != 0; mask &= mask - 1) {
      const int j = __builtin_ctz(mask);
      best = better(best, ArgMax{mass[j] - g[j], c.block[j]});
    }
  }
  void prefetch(int64_t b) const {  // the group of block b's bytes, kPrefetchAhead ahead
    constexpr int64_t e = kElemBytes<D>;
    prefetch_ahead(src.row, b * kBlock * e, kGroup * e, src.vocab * e);
  }
};

// Weight bounds: the exact log block sums of weights computed lane-wise into a staging group.
template <class Fill>
inline float weight_group_bounds(int64_t b0, int nb, int64_t vocab, float* ub, Fill fill) {
  alignas(64) float w[kGroup];
  const int64_t first = b0 * kBlock;
  const int n = static_cast<int>(vocab - first < kGroup ? vocab - first : kGroup);
  fill(first, n, w);  // w[0, n) = weights; the caller pads nothing
  for (int i = n; i < kGroup; ++i) w[i] = 0.0f;
#if defined(__AVX512F__)
  __m512 best = _mm512_set1_ps(-kInf);
  for (int half = 0; half < 2; ++half) {
    __m512 r[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(w + (16 * half + j) * kBlock);
    const simd::f32v s = simd::bits_as<simd::f32v>(tree16_sum(r));
    const __m512 l = simd::bits_as<__m512>(simd::log_f32(s));
    _mm512_storeu_ps(ub + 16 * half, l);
    best = _mm512_max_ps(l, best);
  }
  for (int j = nb; j < kGroupBlocks; ++j) ub[j] = -kInf;
  return _mm512_reduce_max_ps(best);
#else
  float best = -kInf;
  for (int j = 0; j < kGroupBlocks; ++j) {
    ub[j] = j < nb ? log_f32(block_sum16(w + j * kBlock)) : -kInf;
    best = ub[j] > best ? ub[j] : best;
  }
  return best;
#endif
}

// Scores of exact sources' candidates: their bound is their log-mass.
SPECDEC_SIMD_INLINE void exact_score(const Candidates& c, uint32_t mask, const float* g, ArgMax& best) {
  for (; mask != 0; mask &= mask - 1) {
    const int j = __builtin_ctz(mask);
    best = better(best, ArgMax{c.ub[j] - g[j], c.block[j]});
  }
}

template <DType D, DType Q>
struct ResidualBounds {
  static constexpr bool kExact = true;
  static constexpr bool kPartThresholds = false;
  ResidualSource src;
  mutable bool any_positive = false;

  float bounds(int64_t b0, int nb, float* ub, float*) const {
    const float best = weight_group_bounds(b0, nb, src.target.vocab, ub, [this](int64_t first, int n, float* w) {
      int i = 0;
      if (src.max != -kInf) {
        for (; i + simd::W <= n; i += simd::W) simd::store(w + i, residual_v<D, Q>(src, first + i));
      }
      for (; i < n; ++i) w[i] = src.residual(first + i);
    });
    any_positive = any_positive || best != -kInf;
    return best;
  }
  void prepare(Candidates&, float*) const {}
  void score(const Candidates& c, const float*, uint32_t mask, const float* g, ArgMax& best) const {
    exact_score(c, mask, g, best);
  }
  void prefetch(int64_t b) const {
    constexpr int64_t e = kElemBytes<D>, eq = kElemBytes<Q>;
    prefetch_ahead(src.target.row, b * kBlock * e, kGroup * e, src.target.vocab * e);
    prefetch_ahead(src.q, b * kBlock * eq, kGroup * eq, src.target.vocab * eq);
  }
};

// Residual bounds without an exp per entry (valid draft probabilities, q >= 0 or NaN, and a finite row
// max M): every residual entry max(0, p_v - q_v) <= p_v = exp(z_v - M) / total, so a block's log residual
// mass is at most d + log 16 - log(total) + slack with d = z_max - M, its largest z's computed difference
// (the same rounding as its exact term, and z_v <= z_max rounds to z_v - M <= d). Groups cost one max per
// loaded vector of logits; q and the exact masses are read only for candidate blocks. A negative q breaks
// the bound: validation rejects it, and with validation off it is garbage in (tests/harness/fuzz.py).
template <DType D, DType Q>
struct LazyResidualBounds {
  static constexpr bool kExact = false;
  static constexpr bool kPartThresholds = true;
  ResidualSource src;
  float log_shift;  // kLogBlockBound - log(total)
  const float* units = nullptr;  // the row's unit maxima (unit_maxima_t), or nullptr: the parts' from the row

  LazyResidualBounds(const ResidualSource& s, const float* u = nullptr)
      : src(s), log_shift(kLogBlockBound - log_f32(s.total)), units(u) {}
  float bound_of(float z_max) const { return z_max == -kInf ? -kInf : (z_max - src.max) + log_shift; }
  float bounds(int64_t b0, int nb, float*, float* part) const {
    const float z = units != nullptr ? unit_part_maxima(units, (src.target.vocab + kUnit - 1) / kUnit, b0, nb, part)
                                     : z_part_maxima<D>(src.target, b0, nb, part);
    const float m = bound_of(z);
    for (int q = 0; q < kParts; ++q) part[q] = bound_of(part[q]);
    return m;
  }
  void prepare(Candidates& c, float* mx) const {
    load_candidates<D>(src.target, c);
    candidate_maxima(c, mx);
    for (int j = 0; j < kBatch; ++j) c.ub[j] = bound_of(mx[j]);
  }
  void score(const Candidates& c, const float*, uint32_t mask, const float* g, ArgMax& best) const {
    for (; mask != 0; mask &= mask - 1) {
      const int j = __builtin_ctz(mask);
      best = better(best, ArgMax{residual_log_mass<D, Q>(src, c.block[j]) - g[j], c.block[j]});
    }
  }
  void prefetch(int64_t b) const {  // the logits only: q is read on candidate blocks
    constexpr int64_t e = kElemBytes<D>;
    prefetch_ahead(src.target.row, b * kBlock * e, kGroup * e, src.target.vocab * e);
  }
};

// Residual blocks with the normalizer known only within [total_lo, total_hi] (chain.h certain_recovery):
// the exact residual entries, block sums and their roundings are monotone in the normalizer, so the
// sources at total_lo (`upper.src`) and total_hi (`lower`) bound the exact block log-masses, up to
// kIntervalSlack for log_f32. Pruning uses upper's bounds, valid for every normalizer >= total_lo, against
// the best lower score; every block scored besides the best leaves its upper score in runner_hi (offer), so
// a pruned or scored block other than the best cannot reach the best's exact score when
// pick_is_certain(pick).
template <DType D, DType Q>
struct IntervalResidualBounds {
  static constexpr bool kExact = false;
  static constexpr bool kPartThresholds = true;
  LazyResidualBounds<D, Q> upper;
  ResidualSource lower;
  int64_t seed_block;  // scored before the search (IntervalScore, -1: none): never a candidate here
  float seed_lo;       // its lower score, which a block's upper score must reach (-inf: none)
  mutable IntervalPick pick = kIntervalPickInit;  // pick.best is search_blocks' best

  float bounds(int64_t b0, int nb, float* ub, float* part) const { return upper.bounds(b0, nb, ub, part); }
  void prepare(Candidates& c, float* mx) const { upper.prepare(c, mx); }
  void prefetch(int64_t) const {}  // the row is hot: the bracket and the max pass have just read it
  // Offers each candidate in mask to pick (best = pick.best). A block's target mass at total_lo, the log of
  // the block sum of p_v = exp(z_v - max) / total_lo, is at least its residual mass there (each residual
  // entry is a rounded p_v - q_v <= p_v for q_v >= 0 or NaN, and the block sum is monotone in its terms; one
  // more kIntervalSlack for the two log_f32 errors). A block whose upper score from it stays below the best
  // lower score (or the seed's: a real candidate of another slice if not this one's) can neither be the best
  // nor count against it: it is dropped, as is the seed block itself, before its draft probabilities
  // are read (most candidates are; the read is a cache miss per block, the row's q being cold, so the
  // survivors' reads are all issued first).
  void score(const Candidates& c, const float*, uint32_t mask, const float* g, ArgMax& best) const {
    const ResidualSource& at_lo = upper.src;
    alignas(64) float target[kBatch];
    candidate_log_sums(
        mask, [&](int j, int k) { return simd::exp_fma(simd::load(c.z[j] + k) - at_lo.max) / at_lo.total; }, target);
    const auto dropped = [&](int j) {
      const float floor = pick.best.value > seed_lo ? pick.best.value : seed_lo;
      return c.block[j] == seed_block || (target[j] + 2.0f * kIntervalSlack) - g[j] < floor;
    };
    uint32_t keep = 0;
    for (uint32_t m = mask; m != 0; m &= m - 1) keep |= dropped(__builtin_ctz(m)) ? 0u : 1u << __builtin_ctz(m);
    constexpr int64_t eq = kElemBytes<Q>;
    for (uint32_t m = keep; m != 0; m &= m - 1) {
      const char* q = static_cast<const char*>(at_lo.q) + c.block[__builtin_ctz(m)] * kBlock * eq;
      __builtin_prefetch(q);
      __builtin_prefetch(q + kBlock * eq - 1);
    }
    for (; keep != 0; keep &= keep - 1) {
      const int j = __builtin_ctz(keep);
      if (dropped(j)) continue;  // the best may have risen meanwhile
      const int64_t b = c.block[j];
      const float l = residual_log_mass<D, Q>(lower, b), h = residual_log_mass<D, Q>(at_lo, b);
      const IntervalScore s = interval_scores(l, h, g[j], b);
      offer(pick, s.lo, s.hi);
    }
    best = pick.best;
  }
};

struct WeightBounds {
  static constexpr bool kExact = true;
  static constexpr bool kPartThresholds = false;
  WeightSource src;

  float bounds(int64_t b0, int nb, float* ub, float*) const {
    return weight_group_bounds(b0, nb, src.vocab, ub, [this](int64_t first, int n, float* w) {
      for (int i = 0; i < n; ++i) w[i] = src.w[first + i];
    });
  }
  void prepare(Candidates&, float*) const {}
  void score(const Candidates& c, const float*, uint32_t mask, const float* g, ArgMax& best) const {
    exact_score(c, mask, g, best);
  }
  void prefetch(int64_t) const {}
};

SPECDEC_NS_END
