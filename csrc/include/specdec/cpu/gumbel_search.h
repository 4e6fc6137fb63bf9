// Level 1 of two-level Gumbel-max (gumbel.h) over a range of vocabulary blocks, at memory speed: one
// instruction-set build per host (csrc/cpu/row_ops.cpp).
//
// The search walks groups of kGroupBlocks = 32 blocks (512 entries, one 8-counter Philox batch). For each
// group a source's bounds() gives an upper bound ub_b >= L_b of every block's log-mass (logits: the block
// maximum + log 16 + slack, which needs no exp; weights: the exact log of the block sum). A block can beat
// the best score so far only if ub_b - log(1 - u_b) + slack reaches it (-log(-log u) <= -log(1 - u)), so
// the exact score L_b - log(-log u_b) (16 exps for logits) is computed only for those few candidates,
// found with one integer compare of each block's Philox word against a per-group threshold (for residual
// sources, one per part of the group: kPartBlocks) and scored 16 at a time (Candidates); a group whose
// largest bound plus the largest possible noise stays below the best score draws no Philox words. Every
// bound is computed with the rounding of the exact score it bounds, so a dropped block's exact score is
// provably below a real candidate's: the result is the exact argmax. The sources (logits, residuals,
// weights) are in search_sources.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/gumbel.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/types.h"
#include "specdec/cpu/row_load.h"
#include "specdec/cpu/simd.h"

SPECDEC_NS_BEGIN

inline constexpr int kGroupBlocks = 32;
inline constexpr int kGroup = kGroupBlocks * kBlock;
// A group's blocks share a Philox batch. In the residual searches of rejected rows (kPartThresholds) its
// parts of kPartBlocks blocks each get their own word threshold from their own bound, as words passing a
// whole group's threshold mostly fail their block's exact test when the group's bound comes from one high
// block (Zipf-like rows: four parts pass 2.7x fewer words). The other searches keep one threshold per
// group: on rows with few candidates the parts' maxima cost more than they save (10-20 % on bf16 rows).
inline constexpr int kPartBlocks = 8;
inline constexpr int kParts = kGroupBlocks / kPartBlocks;
static_assert(kPartBlocks % simd::W == 0 || simd::W % kPartBlocks == 0, "SIMD vectors align with parts");
static_assert(kGroupBlocks % simd::W == 0, "groups hold whole SIMD vectors of blocks");

#if defined(__AVX512F__)
// r[j] holds block j's 16 entries; returns op over each block's entries, the 16 results in block order, by
// the pairwise tree of math.h's block_sum16 (c_i = w_i op w_{i+8}, d_i = c_i op c_{i+4}, (d_0 op d_2) op
// (d_1 op d_3)), with 46 shuffles and ops for all 16 blocks.
template <class Op>
SPECDEC_SIMD_INLINE __m512 tree16(const __m512* r, Op op) {
  __m512 t[8], u[4], v[2];
  for (int k = 0; k < 8; ++k) {  // lanes 0-7: c of block 2k, 8-15: c of block 2k + 1
    t[k] = op(_mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], 0x44), _mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], 0xEE));
  }
  for (int m = 0; m < 4; ++m) {  // quarter q: d_0..3 of block 4m + q
    u[m] = op(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0x88), _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0xDD));
  }
  for (int n = 0; n < 2; ++n) {  // quarter q: e_0, e_1 of blocks 8n + q, 8n + 4 + q
    v[n] = op(_mm512_shuffle_ps(u[2 * n], u[2 * n + 1], 0x44), _mm512_shuffle_ps(u[2 * n], u[2 * n + 1], 0xEE));
  }
  // lane 4q + j: block q + 4j
  const __m512 f = op(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, f);
}

// The 16 block sums, each bit for bit block_sum16.
SPECDEC_SIMD_INLINE __m512 tree16_sum(const __m512* r) {
  return tree16(r, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}

#endif

// --- Group maxima and block log-masses of logits rows ----------------------------------------------------

// Lane-wise max and min of the n (a multiple of 4 W) 16-bit entries from p, read as int16.
SPECDEC_SIMD_INLINE void minmax_i16(const uint16_t* p, int64_t n, simd::i16v& hi, simd::i16v& lo) {
  simd::i16v h[2], l[2];  // two independent chains each
  for (int k = 0; k < 2; ++k) h[k] = l[k] = simd::load_i16(p + 2 * k * simd::W);
  for (int64_t i = 4 * simd::W; i < n; i += 4 * simd::W) {
    for (int k = 0; k < 2; ++k) {
      const simd::i16v x = simd::load_i16(p + i + 2 * k * simd::W);
      h[k] = simd::max_i16(h[k], x);
      l[k] = simd::min_i16(l[k], x);
    }
  }
  hi = simd::max_i16(h[0], h[1]);
  lo = simd::min_i16(l[0], l[1]);
}

// Lane-wise max of the n (a multiple of 4 W) 16-bit entries from p, read as int16.
SPECDEC_SIMD_INLINE simd::i16v max_i16_lanes(const uint16_t* p, int64_t n) {
  simd::i16v h[2];  // two independent chains
  for (int k = 0; k < 2; ++k) h[k] = simd::load_i16(p + 2 * k * simd::W);
  for (int64_t i = 4 * simd::W; i < n; i += 4 * simd::W) {
    for (int k = 0; k < 2; ++k) h[k] = simd::max_i16(h[k], simd::load_i16(p + i + 2 * k * simd::W));
  }
  return simd::max_i16(h[0], h[1]);
}

// The largest of n (a multiple of 4 W) 16-bit float entries from p, NaN skipped; NaN when the integer
// shortcut cannot tell (a NaN among the non-negative entries, or every entry a negative NaN). Read as int16
// the bits order like the floats within each sign (row_ops.h greedy_filtered_16bit): the largest float is
// the largest integer when one is >= 0, else the smallest. One integer max per 2 W entries, where widening
// to float32 costs a shuffle and a shift per W; the minima are taken, from L1, only when no entry is >= 0
// (a deterministic bf16 row takes ~6 % less time from L3, 2-5 % from memory, than with both in one pass).
template <DType D>
SPECDEC_SIMD_INLINE float max_16bit(const uint16_t* p, int64_t n) {
  int16_t top = simd::extreme_lane_i16<true>(max_i16_lanes(p, n));
  if (top < 0) {  // no entry >= +0: the largest float is the smallest integer
    simd::i16v hi, lo;
    minmax_i16(p, n, hi, lo);
    top = simd::extreme_lane_i16<false>(lo);
  }
  const auto bits = static_cast<uint16_t>(top);
  return D == DType::kBFloat16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

// The largest of the n entries from v as floats, NaN skipped (-inf if none): one max per loaded vector, four
// independent chains.
template <DType D>
SPECDEC_SIMD_INLINE float raw_max(const void* row, int64_t v, int64_t n) {
  const simd::f32v neg_inf = simd::f32v{} - kInf;
  simd::f32v acc[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
  int64_t i = 0;
  for (; i + 4 * simd::W <= n; i += 4 * simd::W) {
    for (int k = 0; k < 4; ++k) acc[k] = simd::max_v(load_v<D>(row, v + i + k * simd::W), acc[k]);  // NaN -> -inf
  }
  for (; i + simd::W <= n; i += simd::W) acc[0] = simd::max_v(load_v<D>(row, v + i), acc[0]);
  float m = lane_max(simd::max_v(simd::max_v(acc[0], acc[1]), simd::max_v(acc[2], acc[3])));
  for (; i < n; ++i) {
    const float x = load_elem(row, D, v + i);
    m = x > m ? x : m;
  }
  return m;
}

// sanitize(max entry / T) over the blocks b0 .. b0 + nb - 1 of a row of logits (sanitize and the division
// are monotone, so this is the largest z there exactly): one max per loaded vector (16-bit logits: the
// integer max_16bit on whole parts of groups), at memory speed.
template <DType D>
SPECDEC_SIMD_INLINE float z_group_max(const ZSource& src, int64_t b0, int nb) {
  const int64_t first = b0 * kBlock;
  const int64_t last = std::min<int64_t>(first + static_cast<int64_t>(nb) * kBlock, src.vocab);
  if constexpr (D != DType::kFloat32) {
    if (last - first == static_cast<int64_t>(nb) * kBlock && (last - first) % (4 * simd::W) == 0) {
      const float m = max_16bit<D>(static_cast<const uint16_t*>(src.row) + first, last - first);
      if (m == m) return sanitize(m / src.temperature);
    }
  }
  const float m = raw_max<D>(src.row, first, last - first);
  return sanitize(m / src.temperature);
}

// z_part_maxima_16bit's last step: max_16bit's rule on each part's integer extremes (top[stride q], the max,
// and bottom[stride q], the min: the max when it is >= 0, else the min), a part whose extreme is a NaN taking
// z_group_max itself; returns the largest part maximum.
template <DType D>
SPECDEC_SIMD_INLINE float parts_from_extremes(const ZSource& src, int64_t b0, const int16_t* top, const int16_t* bottom,
                                              int stride, float* part) {
  float best = -kInf;
  for (int q = 0; q < kParts; ++q) {
    const int16_t t = top[stride * q] >= 0 ? top[stride * q] : bottom[stride * q];
    const auto bits = static_cast<uint16_t>(t);
    const float m = D == DType::kBFloat16 ? bf16_to_float(bits) : fp16_to_float(bits);
    part[q] = m == m ? sanitize(m / src.temperature) : z_group_max<D>(src, b0 + q * kPartBlocks, kPartBlocks);
    best = part[q] > best ? part[q] : best;
  }
  return best;
}

#if defined(__AVX512BW__)
// Each 128-bit quarter of the result holds, in its first 16-bit lane, op over the 32 int16 lanes of r[q] (q
// the quarter): the four reductions as one transposed tree, 15 shuffles and ops where four separate ones
// (extreme_lane_i16) take ~48.
template <class Op>
SPECDEC_SIMD_INLINE __m512i reduce4_i16(const __m512i* r, Op op) {
  const __m512i a = op(_mm512_shuffle_i32x4(r[0], r[1], 0x44), _mm512_shuffle_i32x4(r[0], r[1], 0xEE));
  const __m512i b = op(_mm512_shuffle_i32x4(r[2], r[3], 0x44), _mm512_shuffle_i32x4(r[2], r[3], 0xEE));
  // quarter q: r[q] reduced to 8 lanes
  __m512i c = op(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD));
  c = op(c, _mm512_shuffle_epi32(c, _MM_PERM_BADC));
  c = op(c, _mm512_shuffle_epi32(c, _MM_PERM_CDAB));
  return op(c, _mm512_srli_epi32(c, 16));
}

// z_part_maxima of a whole group of 16-bit logits (kParts parts of kPartBlocks full blocks): each part's
// integer max and min in one pass, the four parts' reductions together (reduce4_i16), then max_16bit's rule
// per part (the max when it is >= 0, else the min). Bit for bit z_group_max of each part: a part whose
// integer extreme is a NaN takes z_group_max itself.
template <DType D>
SPECDEC_SIMD_INLINE float z_part_maxima_16bit(const ZSource& src, int64_t b0, float* part) {
  static_assert(kParts == 4 && kPartBlocks * kBlock == 4 * 32, "four parts of four 32-lane int16 vectors");
  const auto* p = static_cast<const uint16_t*>(src.row) + b0 * kBlock;
  __m512i hi[kParts], lo[kParts];
  for (int q = 0; q < kParts; ++q) {
    const auto* pq = p + q * kPartBlocks * kBlock;
    const __m512i x0 = _mm512_loadu_si512(pq), x1 = _mm512_loadu_si512(pq + 32);
    const __m512i x2 = _mm512_loadu_si512(pq + 64), x3 = _mm512_loadu_si512(pq + 96);
    hi[q] = _mm512_max_epi16(_mm512_max_epi16(x0, x1), _mm512_max_epi16(x2, x3));
    lo[q] = _mm512_min_epi16(_mm512_min_epi16(x0, x1), _mm512_min_epi16(x2, x3));
  }
  alignas(64) int16_t top[32], bottom[32];
  _mm512_store_si512(top, reduce4_i16(hi, [](__m512i a, __m512i b) { return _mm512_max_epi16(a, b); }));
  _mm512_store_si512(bottom, reduce4_i16(lo, [](__m512i a, __m512i b) { return _mm512_min_epi16(a, b); }));
  return parts_from_extremes<D>(src, b0, top, bottom, 8, part);
}
#elif defined(__AVX2__)
// z_part_maxima_16bit with AVX2: a part is eight 16-lane int16 vectors; lane q's low half of the result is
// op over r[q]'s 16 lanes, the four reductions as one transposed tree (11 shuffles and ops where four
// extreme_lane_i16 take 20).
template <class Op>
SPECDEC_SIMD_INLINE __m256i reduce4_i16(const __m256i* r, Op op) {
  const __m256i a = op(_mm256_unpacklo_epi32(r[0], r[1]), _mm256_unpackhi_epi32(r[0], r[1]));
  const __m256i b = op(_mm256_unpacklo_epi32(r[2], r[3]), _mm256_unpackhi_epi32(r[2], r[3]));
  const __m256i c = op(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));  // lane q of each half: r[q]'s
  const __m256i d = op(c, _mm256_permute2x128_si256(c, c, 0x01));
  return op(d, _mm256_srli_epi32(d, 16));
}

template <DType D>
SPECDEC_SIMD_INLINE float z_part_maxima_16bit(const ZSource& src, int64_t b0, float* part) {
  static_assert(kParts == 4 && kPartBlocks * kBlock == 8 * 16, "four parts of eight 16-lane int16 vectors");
  const auto* p = reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(src.row) + b0 * kBlock);
  __m256i hi[kParts], lo[kParts];
  for (int q = 0; q < kParts; ++q) {
    __m256i x[8];
    for (int i = 0; i < 8; ++i) x[i] = _mm256_loadu_si256(p + 8 * q + i);
    __m256i h[4], l[4];
    for (int i = 0; i < 4; ++i) {
      h[i] = _mm256_max_epi16(x[2 * i], x[2 * i + 1]);
      l[i] = _mm256_min_epi16(x[2 * i], x[2 * i + 1]);
    }
    hi[q] = _mm256_max_epi16(_mm256_max_epi16(h[0], h[1]), _mm256_max_epi16(h[2], h[3]));
    lo[q] = _mm256_min_epi16(_mm256_min_epi16(l[0], l[1]), _mm256_min_epi16(l[2], l[3]));
  }
  alignas(32) int16_t top[16], bottom[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(top),
                     reduce4_i16(hi, [](__m256i a, __m256i b) { return _mm256_max_epi16(a, b); }));
  _mm256_store_si256(reinterpret_cast<__m256i*>(bottom),
                     reduce4_i16(lo, [](__m256i a, __m256i b) { return _mm256_min_epi16(a, b); }));
  return parts_from_extremes<D>(src, b0, top, bottom, 2, part);
}
#endif

// z_group_max of each part of the blocks b0 .. b0 + nb - 1 into part (-inf for a part past them); returns
// the largest.
template <DType D>
SPECDEC_SIMD_INLINE float z_part_maxima(const ZSource& src, int64_t b0, int nb, float* part) {
#if defined(__AVX512BW__) || defined(__AVX2__)
  if constexpr (D != DType::kFloat32) {
    if (nb == kGroupBlocks && (b0 + nb) * kBlock <= src.vocab) return z_part_maxima_16bit<D>(src, b0, part);
  }
#endif
  float best = -kInf;
  for (int q = 0; q < kParts; ++q) {
    const int n = nb - q * kPartBlocks < kPartBlocks ? nb - q * kPartBlocks : kPartBlocks;
    part[q] = n > 0 ? z_group_max<D>(src, b0 + q * kPartBlocks, n) : -kInf;
    best = part[q] > best ? part[q] : best;
  }
  return best;
}

// --- Unit maxima: a row's max and the largest z of every 64 entries, in one pass -------------------------
// A rejected stochastic row needs its max (chain.h certain_recovery, one pass over the row) before its
// residual search, whose bounds take a second pass for the maxima of its parts. unit_maxima makes one pass
// of both: greedy_argmax's {max, first index} of the row, and the largest z = sanitize(x / T) of every unit
// of kUnit entries written to units[v / kUnit] (absolute: slices of a split pass start on units). A part is
// two units, and the max of their maxima is the part's (sanitize and the division are monotone), so
// unit_part_maxima gives z_part_maxima's values bit for bit without reading the row.
inline constexpr int64_t kUnit = kUnitEntries;
inline constexpr int kUnitBlocks = static_cast<int>(kUnit / kBlock);
static_assert(kPartBlocks % kUnitBlocks == 0 && kGroupBlocks % kUnitBlocks == 0, "parts are whole units");

#if defined(__AVX512BW__)
// raw_max of each of the 16 units from v (whole units inside the row) in lanes 0-15: each unit's 16-bit
// integer extremes (max_16bit's rule: the max when it is >= 0, else the min) by one transposed reduction of
// the 16 units (tree16 on the int16 pairs of 32-bit lanes, then the pair), NaN lanes redone by raw_max;
// float32 units by max_v and tree16.
template <DType D>
SPECDEC_SIMD_INLINE __m512 raw_max16(const void* row, int64_t v) {
  const auto max_i16 = [](__m512 a, __m512 b) {
    return _mm512_castsi512_ps(_mm512_max_epi16(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  };
  if constexpr (D == DType::kFloat32) {
    const float* p = static_cast<const float*>(row) + v;
    __m512 r[16];
    for (int k = 0; k < 16; ++k) {
      simd::f32v acc = simd::f32v{} - kInf;
      for (int i = 0; i < kUnit; i += simd::W) acc = simd::max_v(simd::load(p + k * kUnit + i), acc);  // NaN -> -inf
      r[k] = simd::bits_as<__m512>(acc);
    }
    return tree16(r, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });  // no NaN left
  } else {
    static_assert(kUnit == 64, "a 16-bit unit is two registers");
    const auto* p = static_cast<const uint16_t*>(row) + v;
    __m512 hi[16], lo[16];
    for (int k = 0; k < 16; ++k) {
      const __m512i x0 = _mm512_loadu_si512(p + k * kUnit), x1 = _mm512_loadu_si512(p + k * kUnit + 32);
      hi[k] = _mm512_castsi512_ps(_mm512_max_epi16(x0, x1));
      lo[k] = _mm512_castsi512_ps(_mm512_min_epi16(x0, x1));
    }
    __m512i top = _mm512_castps_si512(tree16(hi, max_i16));
    __m512i bottom = _mm512_castps_si512(tree16(lo, [](__m512 a, __m512 b) {
      return _mm512_castsi512_ps(_mm512_min_epi16(_mm512_castps_si512(a), _mm512_castps_si512(b)));
    }));
    top = _mm512_max_epi16(top, _mm512_srli_epi32(top, 16));  // unit j's extremes in lane j's low half
    bottom = _mm512_min_epi16(bottom, _mm512_srli_epi32(bottom, 16));
    const __m512i t = _mm512_mask_blend_epi16(_mm512_cmplt_epi16_mask(top, _mm512_setzero_si512()), top, bottom);
    __m512 m;
    if constexpr (D == DType::kBFloat16) {
      m = _mm512_castsi512_ps(_mm512_slli_epi32(t, 16));
    } else {
      m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(t));
    }
    const __mmask16 nan = _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q);
    if (nan != 0) {  // a NaN among a unit's non-negative entries, or only negative NaN: its float max
      alignas(64) float out[16];
      _mm512_store_ps(out, m);
      for (uint32_t b = nan; b != 0; b &= b - 1) {
        const int j = __builtin_ctz(b);
        out[j] = raw_max<D>(row, v + j * kUnit, kUnit);
      }
      m = _mm512_load_ps(out);
    }
    return m;
  }
}
#endif

#if defined(__AVX2__) && !defined(__AVX512BW__)
// Lane j: op over the eight 32-bit lanes of r[j] (two int16 halves each, kept apart), by one transposed tree
// of 7 ops and 14 shuffles for the 8 registers.
template <class Op>
SPECDEC_SIMD_INLINE __m256i tree8_i32(const __m256i* r, Op op) {
  __m256i t[4], u[2];
  for (int k = 0; k < 4; ++k) {  // 128-bit half h: r[2k] and r[2k + 1] lanes {0, 2} and {1, 3} of that half
    t[k] = op(_mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]), _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]));
  }
  for (int m = 0; m < 2; ++m) {  // half h: the four lanes of r[4m .. 4m + 3] within that half
    u[m] = op(_mm256_unpacklo_epi64(t[2 * m], t[2 * m + 1]), _mm256_unpackhi_epi64(t[2 * m], t[2 * m + 1]));
  }
  return op(_mm256_permute2x128_si256(u[0], u[1], 0x20), _mm256_permute2x128_si256(u[0], u[1], 0x31));
}

// raw_max of each of the 8 bf16 units from v (whole units inside the row) in lanes 0-7, as raw_max16 with
// AVX-512: each unit's 16-bit integer extremes (the max when it is >= 0, else the min) by one transposed
// reduction of the 8 units, NaN lanes redone by raw_max. Half the per-unit float path's operations: no
// widening, no horizontal max per unit.
SPECDEC_SIMD_INLINE __m256 raw_max8_bf16(const void* row, int64_t v) {
  static_assert(kUnit == 64, "a 16-bit unit is four registers");
  const auto* p = static_cast<const uint16_t*>(row) + v;
  __m256i hi[8], lo[8];
  for (int k = 0; k < 8; ++k) {
    const auto* q = reinterpret_cast<const __m256i*>(p + k * kUnit);
    const __m256i x0 = _mm256_loadu_si256(q), x1 = _mm256_loadu_si256(q + 1);
    const __m256i x2 = _mm256_loadu_si256(q + 2), x3 = _mm256_loadu_si256(q + 3);
    hi[k] = _mm256_max_epi16(_mm256_max_epi16(x0, x1), _mm256_max_epi16(x2, x3));
    lo[k] = _mm256_min_epi16(_mm256_min_epi16(x0, x1), _mm256_min_epi16(x2, x3));
  }
  __m256i top = tree8_i32(hi, [](__m256i a, __m256i b) { return _mm256_max_epi16(a, b); });
  __m256i bottom = tree8_i32(lo, [](__m256i a, __m256i b) { return _mm256_min_epi16(a, b); });
  top = _mm256_max_epi16(top, _mm256_srli_epi32(top, 16));  // unit j's extremes in lane j's low half
  bottom = _mm256_min_epi16(bottom, _mm256_srli_epi32(bottom, 16));
  const __m256i t = _mm256_blendv_epi8(top, bottom, _mm256_cmpgt_epi16(_mm256_setzero_si256(), top));
  __m256 m = _mm256_castsi256_ps(_mm256_slli_epi32(t, 16));
  const int nan = _mm256_movemask_ps(_mm256_cmp_ps(m, m, _CMP_UNORD_Q));
  if (nan != 0) {  // a NaN among a unit's non-negative entries, or only negative NaN: its float max
    alignas(32) float out[8];
    _mm256_store_ps(out, m);
    for (uint32_t b = static_cast<uint32_t>(nan); b != 0; b &= b - 1) {
      const int j = __builtin_ctz(b);
      out[j] = raw_max<DType::kBFloat16>(row, v + j * kUnit, kUnit);
    }
    m = _mm256_load_ps(out);
  }
  return m;
}
#endif

// The units' maxima of [v0, v1) (v0 a multiple of kUnit) into units, and the row slice's greedy argmax:
// {sanitize(largest entry), its first index} (index 0 when every entry is -inf or NaN).
template <DType D>
ArgMax unit_maxima_t(const void* row, float temperature, int64_t v0, int64_t v1, float* units) {
  float best = -kInf;
  int64_t best_unit = -1;
  int64_t v = v0;
#if defined(__AVX512BW__) || defined(__AVX2__)
  // W units a step: every 16-bit type with AVX-512, bf16 with AVX2 (fp16 would need F16C to widen)
  constexpr bool kUnitsAtOnce = simd::W == 16 || D == DType::kBFloat16;
  for (; kUnitsAtOnce && v + simd::W * kUnit <= v1; v += simd::W * kUnit) {
    prefetch_ahead(row, v * kElemBytes<D>, simd::W * kUnit * kElemBytes<D>, v1 * kElemBytes<D>);
#if defined(__AVX512BW__)
    const simd::f32v m = simd::bits_as<simd::f32v>(raw_max16<D>(row, v));
#else
    const simd::f32v m = simd::bits_as<simd::f32v>(raw_max8_bf16(row, v));
#endif
    const simd::f32v z = sanitize_v(temperature == 1.0f ? m : m / temperature);  // x / 1 = x
    simd::store(units + v / kUnit, z);
    const simd::f32v s = sanitize_v(m);
    const float top = lane_max(s);
    if (top > best) {
      best = top;
      best_unit = v / kUnit + __builtin_ctz(simd::eq_mask(s, top));
    }
  }
#endif
  for (; v < v1; v += kUnit) {
    const float m = raw_max<D>(row, v, v1 - v < kUnit ? v1 - v : kUnit);
    units[v / kUnit] = sanitize(m / temperature);
    const float s = sanitize(m);
    if (s > best) {
      best = s;
      best_unit = v / kUnit;
    }
  }
  if (best_unit < 0) return {-kInf, 0};  // nothing beat -inf: the reference's argmax of an all -inf row is 0
  for (int64_t i = best_unit * kUnit;; ++i) {
    if (sanitize(load_elem(row, D, i)) == best) return {best, i};
  }
}

// z_part_maxima of blocks b0 .. b0 + nb - 1 (b0 a multiple of kUnitBlocks) from the units' maxima of a row
// of num_units units.
SPECDEC_SIMD_INLINE float unit_part_maxima(const float* units, int64_t num_units, int64_t b0, int nb, float* part) {
  const int64_t u0 = b0 / kUnitBlocks;
  constexpr int kPer = kPartBlocks / kUnitBlocks;
  float best = -kInf;
  for (int q = 0; q < kParts; ++q) {
    float m = -kInf;
    const int n = nb - q * kPartBlocks;  // blocks of part q (at most kPartBlocks count)
    for (int k = 0; k < kPer && k * kUnitBlocks < n && u0 + q * kPer + k < num_units; ++k) {
      const float x = units[u0 + q * kPer + k];
      m = x > m ? x : m;
    }
    part[q] = m;
    best = m > best ? m : best;
  }
  return best;
}

// Log-masses of candidate blocks with the terms computed W lanes at a time: the same sanitized z, max,
// exp_fma terms and block_sum16 pairwise sum as the scalar ZSource::log_mass (block_log_mass) and
// ResidualSource::log_mass, so the same value bit for bit, for 16 / W vector exps instead of 16 scalar
// ones (every block a Philox word makes a candidate of the searches). A partial last block goes scalar.
template <DType D>
SPECDEC_SIMD_INLINE float z_log_mass(const ZSource& src, int64_t b) {
  constexpr int kVecs = kBlock / simd::W;
  const int64_t first = b * kBlock;
  if (first + kBlock > src.vocab) return src.log_mass(b);
  simd::f32v z[kVecs];
  simd::f32v m = simd::f32v{} - kInf;
  for (int i = 0; i < kVecs; ++i) {
    z[i] = sanitize_v(load_v<D>(src.row, first + i * simd::W) / src.temperature);
    m = simd::max_v(z[i], m);
  }
  const float mx = lane_max(m);  // block_max: the z are sanitized, no NaN and no -0
  if (mx == -kInf) return -kInf;
  alignas(64) float e[kBlock];
  for (int i = 0; i < kVecs; ++i) simd::store(e + i * simd::W, simd::exp_fma(z[i] - mx));
  return mx + log_f32(block_sum16(e));
}

// ResidualSource::residual of the W entries from v, lane-wise (a finite row max: src.max != -inf).
template <DType D, DType Q>
SPECDEC_SIMD_INLINE simd::f32v residual_v(const ResidualSource& src, int64_t v) {
  const simd::f32v z = sanitize_v(load_v<D>(src.target.row, v) / src.target.temperature);
  const simd::f32v d = simd::exp_fma(z - src.max) / src.total - load_v<Q>(src.q, v);
  return d > 0.0f ? d : 0.0f;
}

template <DType D, DType Q>
SPECDEC_SIMD_INLINE float residual_log_mass(const ResidualSource& src, int64_t b) {
  const int64_t first = b * kBlock;
  if (first + kBlock > src.target.vocab || src.max == -kInf) return src.log_mass(b);
  alignas(64) float w[kBlock];
  for (int i = 0; i < kBlock; i += simd::W) simd::store(w + i, residual_v<D, Q>(src, first + i));
  return log_f32(block_sum16(w));
}

// --- Candidates, scored a batch at a time -------------------------------------------------------------
// A search's candidates (the blocks whose Philox word passes their group's test: from a hundred on flat
// rows to over a thousand on Zipf-like rows, of a row's ~9500 blocks) each need their own bound and the
// exact test's log, and the survivors a log-mass and a Gumbel term (three more logs). One at a time, these
// scalar logs and 16-entry reductions cost more than the group passes themselves. So candidates wait in a
// batch of kBatch and are scored together: each block's largest z (16 blocks by one transposed reduction
// with AVX-512), the exact test and the Gumbel terms lane-wise, the survivors' block sums by one more
// transposed reduction. Scoring a candidate later than its word test only keeps the search's bound lower
// meanwhile, which admits more candidates, never fewer: the argmax is the same.
inline constexpr int kBatch = 16;
static_assert(kBatch % simd::W == 0, "a batch holds whole SIMD vectors of candidates");

// A batch fills W slots at a time (append_hits), so it may hold up to kBatch + W - 1 candidates before
// its first kBatch are scored; the rest stay, in order, for the next batch.
struct Candidates {
  static constexpr int kSlots = kBatch + simd::W;
  alignas(64) float z[kBatch][kBlock];  // each block's z (sources on logits; -inf past the vocabulary)
  alignas(64) float ub[kSlots];         // each block's bound (-inf for the unused slots)
  alignas(64) uint32_t word[kSlots];    // its Philox word
  alignas(64) int64_t block[kSlots];
  int n = 0;
};

// Appends the blocks b + l for the lanes l set in hit (below W), in order, with their words (and bounds,
// when ub is given): n grows by the number of lanes set. With AVX-512 without a branch per candidate (a
// search meets about one per group, at unpredictable lanes): the lanes are compressed and W slots stored.
SPECDEC_SIMD_INLINE void append_hits(Candidates& c, uint32_t hit, int64_t b, const uint32_t* words, const float* ub) {
#if defined(__AVX512F__)
  static_assert(simd::W == 16, "one mask bit per 32-bit lane");
  const __mmask16 k = static_cast<__mmask16>(hit);
  _mm512_storeu_si512(c.word + c.n, _mm512_maskz_compress_epi32(k, _mm512_loadu_si512(words)));
  if (ub != nullptr) _mm512_storeu_ps(c.ub + c.n, _mm512_maskz_compress_ps(k, _mm512_loadu_ps(ub)));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i lanes = _mm512_maskz_compress_epi32(k, iota);
  const __m512i base = _mm512_set1_epi64(b);
  _mm512_storeu_si512(c.block + c.n, _mm512_add_epi64(base, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(lanes))));
  const __m512i upper = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(lanes, 1));
  _mm512_storeu_si512(c.block + c.n + 8, _mm512_add_epi64(base, upper));
  c.n += __builtin_popcount(hit);
#else
  for (; hit != 0; hit &= hit - 1) {
    const int l = __builtin_ctz(hit);
    c.block[c.n] = b + l;
    c.word[c.n] = words[l];
    if (ub != nullptr) c.ub[c.n] = ub[l];
    ++c.n;
  }
#endif
}

// c.z of the candidates (sanitize(row / temperature), ZSource::block), -inf in the unused slots.
template <DType D>
SPECDEC_SIMD_INLINE void load_candidates(const ZSource& src, Candidates& c) {
  for (int i = 0; i < kBatch; ++i) {
    if (i >= c.n) {
      for (int k = 0; k < kBlock; ++k) c.z[i][k] = -kInf;
    } else if ((c.block[i] + 1) * kBlock <= src.vocab) {
      if (src.temperature == 1.0f) {  // x / 1 = x: the same z without 16 / W divisions (RL rollouts run at T = 1)
        for (int k = 0; k < kBlock; k += simd::W) {
          simd::store(c.z[i] + k, sanitize_v(load_v<D>(src.row, c.block[i] * kBlock + k)));
        }
      } else {
        for (int k = 0; k < kBlock; k += simd::W) {
          simd::store(c.z[i] + k, sanitize_v(load_v<D>(src.row, c.block[i] * kBlock + k) / src.temperature));
        }
      }
    } else {
      src.block(c.block[i], c.z[i]);
    }
  }
}

// block_max of every slot's c.z into mx.
SPECDEC_SIMD_INLINE void candidate_maxima(const Candidates& c, float* mx) {
#if defined(__AVX512F__)
  __m512 r[kBatch];
  for (int j = 0; j < kBatch; ++j) r[j] = _mm512_load_ps(c.z[j]);
  _mm512_store_ps(mx, tree16(r, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); }));  // no NaN in z
#else
  for (int j = 0; j < kBatch; ++j) mx[j] = block_max(c.z[j]);
#endif
}

// out[j] = log_f32(block_sum16(terms of slot j)) for the slots in mask (-inf elsewhere): terms(j, k) gives
// entries k .. k + W - 1 of slot j. Bit for bit the scalar block sums (tree16_sum).
template <class Terms>
SPECDEC_SIMD_INLINE void candidate_log_sums(uint32_t mask, Terms terms, float* out) {
#if defined(__AVX512F__)
  __m512 r[kBatch];
  for (int j = 0; j < kBatch; ++j) r[j] = (mask >> j) & 1u ? simd::bits_as<__m512>(terms(j, 0)) : _mm512_setzero_ps();
  simd::store(out, simd::log_f32(simd::bits_as<simd::f32v>(tree16_sum(r))));
#else
  for (int j = 0; j < kBatch; ++j) {
    alignas(64) float w[kBlock];
    for (int k = 0; k < kBlock; k += simd::W) simd::store(w + k, terms(j, k));
    out[j] = (mask >> j) & 1u ? log_f32(block_sum16(w)) : -kInf;
  }
#endif
}

// Log-masses mx + log(sum exp(z - mx)) of the slots in mask (mx: candidate_maxima; -inf for mx = -inf),
// bit for bit z_log_mass of their blocks. With AVX-512 a block is one register: only the slots in mask (a
// few of the 16 on most batches) take their exps and their block_sum16, in its pairing (float addition
// commutes, so the pairs' operand order does not matter), and one lane-wise log serves them all.
SPECDEC_SIMD_INLINE void candidate_z_masses(const Candidates& c, const float* mx, uint32_t mask, float* mass) {
#if defined(__AVX512F__)
  static_assert(kBlock == simd::W, "a block fills one AVX-512 register");
  alignas(64) float sums[kBatch];
  for (int j = 0; j < kBatch; ++j) sums[j] = 1.0f;
  for (uint32_t m = mask; m != 0; m &= m - 1) {
    const int j = __builtin_ctz(m);
    const __m512 e = simd::bits_as<__m512>(simd::exp_fma(simd::load(c.z[j]) - mx[j]));
    const __m512 cs = _mm512_add_ps(e, _mm512_shuffle_f32x4(e, e, 0xEE));    // c_i = e_i + e_{i+8}
    const __m512 d = _mm512_add_ps(cs, _mm512_shuffle_f32x4(cs, cs, 0x01));  // d_i = c_i + c_{i+4}
    const __m128 d4 = _mm512_castps512_ps128(d);
    const __m128 t = _mm_add_ps(d4, _mm_movehl_ps(d4, d4));                   // d_0 + d_2, d_1 + d_3
    sums[j] = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
  simd::store(mass, simd::log_f32(simd::load(sums)));
#else
  candidate_log_sums(mask, [&](int j, int k) { return simd::exp_fma(simd::load(c.z[j] + k) - mx[j]); }, mass);
#endif
  for (int j = 0; j < kBatch; ++j) mass[j] = mx[j] == -kInf ? -kInf : mx[j] + mass[j];
}

// --- The search ----------------------------------------------------------------------------------------

// Folded Philox words below this threshold cannot lift a block whose bound is at most max_bound (its
// group's or part's) to `bound`: a block needs -log(1 - u) >= e = bound - max_bound - slack, i.e.
// u >= 1 - exp(-e). The test is made looser by 0.01 in e (far above float32 rounding of the scores) and by
// 1024 words (float(word) rounds by at most 64 and kUniformScale is 2^-31 to 1e-7), so every block that
// passes the exact per-block test (score_candidates) passes this one. The threshold is read from a table at
// e rounded down to a multiple of 1/64 (looser still: at most 1.6 % more candidates), where an exp per
// group cost ~7 ns of a ~50 ns group.
//
// The table is a constant expression, evaluated by the compiler: this header is compiled once per
// instruction set (csrc/cpu/row_ops.cpp), and a table built by a constructor at load time would run that
// instruction set's code before the dispatcher chose it (an AVX-512 conversion faulted on AVX2 CPUs).
// std::exp is not constexpr in C++17, hence exp_neg_const; its few-ulp error moves a threshold by under
// 1e-4 words, far inside the 1024-word margin (tests/cpp/word_thresholds_check.cpp holds it to one word of
// the table computed with std::exp).
struct WordThresholds {
  static constexpr int kSteps = 64;             // table entries per nat of e
  static constexpr int kLast = 24 * kSteps;     // e >= 24: 1 - exp(-e) rounds to 1 in the words' 31 bits
  uint32_t at[kLast + 1];
};

// exp(-x) for 0 <= x <= kLast / kSteps in a constant expression: exp(-1)^n (n = floor(x), at most 24
// products of the correctly rounded exp(-1)) times the Taylor series of exp(-f), f in [0, 1), to 24 terms
// (the remainder is below 1 / 25! < 1e-25).
constexpr double exp_neg_const(double x) {
  int n = static_cast<int>(x);
  const double f = x - n;
  double whole = 1.0;
  for (; n > 0; --n) whole *= 0.36787944117144233;
  double term = 1.0, sum = 1.0;
  for (int i = 1; i <= 24; ++i) {
    term *= -f / i;
    sum += term;
  }
  return whole * sum;
}

constexpr uint32_t word_threshold_at(int k) {
  const double e = static_cast<double>(k) / WordThresholds::kSteps;
  const double t = (1.0 - exp_neg_const(e)) * 2147483648.0 - 1024.0;
  return t > 0.0 ? static_cast<uint32_t>(t) : 0u;
}

constexpr WordThresholds make_word_thresholds() {
  WordThresholds w{};
  for (int k = 0; k <= WordThresholds::kLast; ++k) w.at[k] = word_threshold_at(k);
  return w;
}
inline constexpr WordThresholds kWordThresholds = make_word_thresholds();

inline uint32_t word_threshold(float bound, float max_bound) {
  const float e = bound - max_bound - kGumbelSlack - 0.01f;
  if (!(e > 0.0f)) return 0;
  const float k = e * WordThresholds::kSteps;  // exact (a power of two); truncation rounds it down
  return kWordThresholds.at[k < WordThresholds::kLast ? static_cast<int>(k) : WordThresholds::kLast];
}

// The word thresholds of a group's blocks from their parts' bounds (kPartThresholds sources), W blocks per
// vector, built in registers: the parts' four values stored and read back as vectors would stall store
// forwarding on every group.
SPECDEC_SIMD_INLINE void part_word_thresholds(float bound, const float* part, simd::u32v* out) {
  uint32_t t[kParts];
  for (int q = 0; q < kParts; ++q) t[q] = word_threshold(bound, part[q]);
#if defined(__AVX512F__)
  static_assert(kParts == 4 && kPartBlocks == 8 && simd::W == 16, "two parts per vector of blocks");
  const __m512i t4 = _mm512_castsi128_si512(_mm_setr_epi32(static_cast<int>(t[0]), static_cast<int>(t[1]),
                                                           static_cast<int>(t[2]), static_cast<int>(t[3])));
  const __m512i lo = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), t4);
  const __m512i hi = _mm512_permutexvar_epi32(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), t4);
  __builtin_memcpy(&out[0], &lo, sizeof(lo));
  __builtin_memcpy(&out[1], &hi, sizeof(hi));
#else
  static_assert(kPartBlocks % simd::W == 0, "one part per vector of blocks or more");
  for (int v = 0; v < kGroupBlocks / simd::W; ++v) out[v] = simd::u32v{} + t[v * simd::W / kPartBlocks];
#endif
}

// Scores the first kBatch candidates of c (all of them when fewer) against best and removes them: the
// exact test (a candidate's bound plus -log(1 - u) + slack reaches the best score so far) lane-wise, then
// the source's scores of the survivors with their Gumbel terms gumbel_log_term(u), lane-wise too.
template <class Bounds>
SPECDEC_SIMD_INLINE void score_candidates(const Bounds& src, Candidates& c, ArgMax& best, float& bound) {
  if (c.n == 0) return;
  for (int i = c.n; i < kBatch; ++i) {
    c.word[i] = 0;
    c.ub[i] = -kInf;
  }
  alignas(64) float mx[kBatch];
  src.prepare(c, mx);
  uint32_t keep = 0;
  for (int i = 0; i < kBatch; i += simd::W) {
    simd::u32v w;
    __builtin_memcpy(&w, c.word + i, sizeof(w));
    const simd::f32v ub = simd::load(c.ub + i);
    const simd::f32v reach = ub + (kGumbelSlack - simd::log_f32(1.0f - simd::philox_uniform(w)));
    keep |= simd::lane_bits((ub != -kInf) & (reach >= bound)) << i;
  }
  if (keep != 0) {
    alignas(64) float g[kBatch];
    for (int i = 0; i < kBatch; i += simd::W) {
      simd::u32v w;
      __builtin_memcpy(&w, c.word + i, sizeof(w));
      simd::store(g + i, simd::log_f32(-simd::log_f32(simd::philox_uniform(w))));
    }
    src.score(c, mx, keep, g, best);
    bound = best.value > bound ? best.value : bound;
  }
  const int rest = c.n - kBatch;
  for (int i = 0; i < rest; ++i) {
    c.word[i] = c.word[kBatch + i];
    c.block[i] = c.block[kBatch + i];
    c.ub[i] = c.ub[kBatch + i];
  }
  c.n = rest > 0 ? rest : 0;
}

// argmax_b L_b - log(-log u_b) over the blocks of entries [v0, v1) (v0 a multiple of 4 blocks), starting
// from `start` (a real candidate anywhere in the row, or kArgMaxInit). Returns {score, block}.
template <class Bounds>
ArgMax search_blocks(const Bounds& src, const PhiloxKey& key, uint32_t hi, int stream, int64_t v0, int64_t v1,
                     ArgMax start) {
  ArgMax best = start;
  float bound = start.value;
  Candidates cand;
  alignas(64) float ub[kGroupBlocks];
  alignas(64) uint32_t words[kGroupBlocks];
  float part[kParts];
  const int64_t b_end = (v1 + kBlock - 1) / kBlock;
  for (int64_t b0 = v0 / kBlock; b0 < b_end; b0 += kGroupBlocks) {
    src.prefetch(b0);
    const int nb = static_cast<int>(b_end - b0 < kGroupBlocks ? b_end - b0 : kGroupBlocks);
    const float group_max = src.bounds(b0, nb, ub, part);
    if (group_max == -kInf || group_max + kGumbelBound < bound) continue;  // nothing here can reach the bound
    simd::philox_words32(key, philox_offset_lo(stream, kBlockDraws + static_cast<uint32_t>(b0)), hi, words);
    simd::u32v thresholds[kGroupBlocks / simd::W];  // of blocks j0 .. j0 + W - 1 in thresholds[j0 / W]
    if constexpr (Bounds::kPartThresholds) {
      part_word_thresholds(bound, part, thresholds);
    } else {
      const uint32_t t = word_threshold(bound, group_max);
      for (simd::u32v& v : thresholds) v = simd::u32v{} + t;
    }
    for (int j0 = 0; j0 < nb; j0 += simd::W) {
      simd::u32v w;
      __builtin_memcpy(&w, words + j0, sizeof(w));
      uint32_t hit = simd::ge_mask(simd::fold(w), thresholds[j0 / simd::W]);
      if (nb - j0 < simd::W) hit &= (1u << (nb - j0)) - 1u;
      if constexpr (Bounds::kPartThresholds) {
        // Residual searches meet candidates in most groups, at unpredictable lanes: hits appended without a
        // branch per candidate (a rejected bf16 Zipf row's interval search, one thread, cold draft
        // probabilities: ~28.5 -> ~26 us).
        append_hits(cand, hit, b0 + j0, words + j0, Bounds::kExact ? ub + j0 : nullptr);
        if (cand.n >= kBatch) score_candidates(src, cand, best, bound);
      } else {
        // The other searches meet few candidates (rows sampled from their logits start from the block of
        // the draft or of the row max): a branch that is rarely taken costs less than appending every
        // vector (with append_hits here too, deterministic-draft cases ran up to 1.37x slower:
        // benchmarks/results/ab_cpu_854ef69_vs_bb29e2c.csv).
        for (; hit != 0; hit &= hit - 1) {
          const int j = j0 + __builtin_ctz(hit);
          cand.block[cand.n] = b0 + j;
          cand.word[cand.n] = words[j];
          if constexpr (Bounds::kExact) cand.ub[cand.n] = ub[j];
          if (++cand.n == kBatch) score_candidates(src, cand, best, bound);
        }
      }
    }
  }
  score_candidates(src, cand, best, bound);
  return best;
}

SPECDEC_NS_END
