// Level 1 of two-level Gumbel-max (gumbel.h) over a range of vocabulary blocks, at memory speed: one
// instruction-set build per host (csrc/cpu/row_ops.cpp).
//
// The search walks groups of kGroupBlocks = 32 blocks (512 entries, one 8-counter Philox batch). For each
// group a source's bounds() gives an upper bound ub_b >= L_b of every block's log-mass (logits: the block
// maximum + log 16 + slack, which needs no exp; weights: the exact log of the block sum). A block can beat
// the best score so far only if ub_b - log(1 - u_b) + slack reaches it (-log(-log u) <= -log(1 - u)), so
// the exact score L_b - log(-log u_b) (16 exps for logits) is computed only for those few candidates,
// found with one integer compare of each block's Philox word against a per-group threshold; a group
// whose largest bound plus the largest possible noise stays below the best score draws no Philox words. Every bound is computed with the rounding of the exact score it bounds, so a
// dropped block's exact score is provably below a real candidate's: the result is the exact argmax.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.h"
#include "gumbel.h"
#include "math.h"
#include "philox.h"
#include "simd.h"
#include "types.h"

SPECDEC_NS_BEGIN

inline constexpr int kGroupBlocks = 32;
inline constexpr int kGroup = kGroupBlocks * kBlock;
static_assert(kGroupBlocks % simd::W == 0, "groups hold whole SIMD vectors of blocks");

// W consecutive elements of a row from index v, as float32.
template <DType D>
SPECDEC_SIMD_INLINE simd::f32v load_v(const void* row, int64_t v) {
  simd::f32v out;
#if defined(__AVX512F__)
  if constexpr (D == DType::kFloat32) {
    out = simd::load(static_cast<const float*>(row) + v);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + v));
    __m512 f;
    if constexpr (D == DType::kBFloat16) {
      f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      f = _mm512_cvtph_ps(h);
    }
    __builtin_memcpy(&out, &f, sizeof(out));
  }
#elif defined(__AVX2__)
  if constexpr (D == DType::kFloat32) {
    out = simd::load(static_cast<const float*>(row) + v);
  } else if constexpr (D == DType::kBFloat16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + v));
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    __builtin_memcpy(&out, &f, sizeof(out));
  } else {
    const auto* p = static_cast<const uint16_t*>(row) + v;
    for (int l = 0; l < simd::W; ++l) out[l] = fp16_to_float(p[l]);
  }
#else
  const auto* p = static_cast<const typename Elem<D>::type*>(row) + v;
  for (int l = 0; l < simd::W; ++l) out[l] = Elem<D>::load(p, l);
#endif
  return out;
}

// Streaming passes over a row prefetch the bytes kPrefetchAhead beyond where they read: the hardware
// prefetchers alone left a quarter to a third of the read bandwidth unused (2-thread VMs, 64 requests x 4
// rows of 151936 entries, benchmarks/bench_native_cpu.py), with this distance the passes read at the rate
// of torch.sum or above.
inline constexpr int64_t kPrefetchAhead = 8192;

template <DType D>
inline constexpr int64_t kElemBytes = sizeof(typename Elem<D>::type);

// Prefetch of bytes [offset + kPrefetchAhead, + bytes) of a row of `row_bytes` bytes (none past its end).
SPECDEC_SIMD_INLINE void prefetch_ahead(const void* row, int64_t offset, int64_t bytes, int64_t row_bytes) {
  const int64_t end = std::min(offset + kPrefetchAhead + bytes, row_bytes);
  for (int64_t i = offset + kPrefetchAhead; i < end; i += 64) __builtin_prefetch(static_cast<const char*>(row) + i);
}

// The 4 W entries from index v as four float32 vectors in an order of their own, for sums that do not
// depend on it (normalizer_bound_t): bf16 is read as 2 W 32-bit words twice, each giving its low halves
// and its high halves (a shift and a mask, no widening shuffle); other dtypes as load_v in order.
template <DType D>
SPECDEC_SIMD_INLINE void load4_any_order(const void* row, int64_t v, simd::f32v x[4]) {
  if constexpr (D == DType::kBFloat16) {
    for (int h = 0; h < 2; ++h) {
      simd::u32v w;
      __builtin_memcpy(&w, static_cast<const uint16_t*>(row) + v + 2 * h * simd::W, sizeof(w));
      x[2 * h] = simd::bits_as<simd::f32v>(w << 16);
      x[2 * h + 1] = simd::bits_as<simd::f32v>(w & 0xFFFF0000u);
    }
  } else {
    for (int k = 0; k < 4; ++k) x[k] = load_v<D>(row, v + k * simd::W);
  }
}

SPECDEC_SIMD_INLINE simd::f32v sanitize_v(simd::f32v z) {
  z = z != z ? -kInf : z;
  return (z > kFloat32Max ? kFloat32Max : z) + 0.0f;
}

#if defined(__AVX512F__)
// r[j] holds block j's 16 entries; returns the 16 block sums in block order, by the pairwise tree of
// math.h's block_sum16 (c_i = w_i + w_{i+8}, d_i = c_i + c_{i+4}, (d_0 + d_2) + (d_1 + d_3)), with 46
// shuffles and adds for all 16 blocks.
SPECDEC_SIMD_INLINE __m512 tree16_sum(const __m512* r) {
  const auto op = [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); };
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

#endif

// The largest lane of a running max that skipped NaN (max_v keeps its second operand): none in x.
SPECDEC_SIMD_INLINE float lane_max(simd::f32v x) { return simd::max_lane(x); }

// --- Sources' bounds over one group ------------------------------------------------------------------
// bounds(b0, nb, ub): returns an upper bound of every block bound of blocks b0 .. b0 + nb - 1, the largest
// of them (exact sources also write ub[j] for j < nb, -inf beyond); block_bound(b, ub, j): block b = b0 + j's
// own bound ub_j >= L_b.

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

// The largest of n (a multiple of 4 W) 16-bit float entries from p, NaN skipped; NaN when the integer
// shortcut cannot tell (a NaN among the non-negative entries, or every entry a negative NaN). Read as int16
// the bits order like the floats within each sign (row_ops.h greedy_filtered_16bit): the largest float is
// the largest integer when one is >= 0, else the smallest. Two integer max / min per 2 W entries, where
// widening to float32 costs a shuffle and a shift per W.
template <DType D>
SPECDEC_SIMD_INLINE float max_16bit(const uint16_t* p, int64_t n) {
  simd::i16v hi, lo;
  minmax_i16(p, n, hi, lo);
  const int16_t h = simd::extreme_lane_i16<true>(hi);
  const auto bits = static_cast<uint16_t>(h >= 0 ? h : simd::extreme_lane_i16<false>(lo));
  return D == DType::kBFloat16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

// sanitize(max entry / T) over the blocks b0 .. b0 + nb - 1 of a row of logits (sanitize and the division
// are monotone, so this is the largest z there exactly): one max per loaded vector (16-bit logits: the
// integer max_16bit on whole groups), at memory speed.
template <DType D>
SPECDEC_SIMD_INLINE float z_group_max(const ZSource& src, int64_t b0, int nb) {
  const int64_t first = b0 * kBlock;
  const int64_t last = std::min<int64_t>(first + static_cast<int64_t>(nb) * kBlock, src.vocab);
  if constexpr (D != DType::kFloat32) {
    if (last - first == kGroup) {
      const float m = max_16bit<D>(static_cast<const uint16_t*>(src.row) + first, kGroup);
      if (m == m) return sanitize(m / src.temperature);
    }
  }
  const simd::f32v neg_inf = simd::f32v{} - kInf;
  simd::f32v acc[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
  int64_t v = first;
  for (; v + 4 * simd::W <= last; v += 4 * simd::W) {
    for (int k = 0; k < 4; ++k) acc[k] = simd::max_v(load_v<D>(src.row, v + k * simd::W), acc[k]);  // NaN -> -inf
  }
  for (; v + simd::W <= last; v += simd::W) acc[0] = simd::max_v(load_v<D>(src.row, v), acc[0]);
  float m = lane_max(simd::max_v(simd::max_v(acc[0], acc[1]), simd::max_v(acc[2], acc[3])));
  for (; v < last; ++v) {
    const float x = load_elem(src.row, D, v);
    m = x > m ? x : m;
  }
  return sanitize(m / src.temperature);
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

template <DType D>
struct ZBounds {
  static constexpr bool kExact = false;
  ZSource src;

  // The group's bound only, max_j ub_j = z_group_max + kLogBlockBound; the few blocks that a Philox word
  // makes candidates get their own bound from block_bound.
  float bounds(int64_t b0, int nb, float*) const { return z_group_max<D>(src, b0, nb) + kLogBlockBound; }
  float block_bound(int64_t b, const float*, int) const { return z_group_max<D>(src, b, 1) + kLogBlockBound; }
  float log_mass(int64_t b) const { return z_log_mass<D>(src, b); }
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

template <DType D, DType Q>
struct ResidualBounds {
  static constexpr bool kExact = true;
  ResidualSource src;
  mutable bool any_positive = false;

  float bounds(int64_t b0, int nb, float* ub) const {
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
  float block_bound(int64_t, const float* ub, int j) const { return ub[j]; }
  float log_mass(int64_t b) const { return src.log_mass(b); }
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
// the bound: validation rejects it, and with validation off it is garbage in (testing/fuzz.py).
template <DType D, DType Q>
struct LazyResidualBounds {
  static constexpr bool kExact = false;
  ResidualSource src;
  float log_shift;  // kLogBlockBound - log(total)

  LazyResidualBounds(const ResidualSource& s) : src(s), log_shift(kLogBlockBound - log_f32(s.total)) {}
  float bound_of(float z_max) const { return z_max == -kInf ? -kInf : (z_max - src.max) + log_shift; }
  float bounds(int64_t b0, int nb, float*) const { return bound_of(z_group_max<D>(src.target, b0, nb)); }
  float block_bound(int64_t b, const float*, int) const { return bound_of(z_group_max<D>(src.target, b, 1)); }
  float log_mass(int64_t b) const { return residual_log_mass<D, Q>(src, b); }
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
  LazyResidualBounds<D, Q> upper;
  ResidualSource lower;
  mutable IntervalPick pick = kIntervalPickInit;  // pick.best is search_blocks' best

  float bounds(int64_t b0, int nb, float* ub) const { return upper.bounds(b0, nb, ub); }
  float block_bound(int64_t b, const float* ub, int j) const { return upper.block_bound(b, ub, j); }
  void prefetch(int64_t b) const { upper.prefetch(b); }
  // The best after scoring block b with uniform u (search_blocks' candidates; its best is pick.best).
  ArgMax consider(ArgMax, int64_t b, float u) const {
    const float g = gumbel_log_term(u);
    const float l = residual_log_mass<D, Q>(lower, b), h = residual_log_mass<D, Q>(upper.src, b);
    const float s_lo = l == -kInf ? -kInf : (l - kIntervalSlack) - g;
    const float s_hi = h == -kInf ? -kInf : (h + kIntervalSlack) - g;
    offer(pick, {s_lo, b}, s_hi);
    return pick.best;
  }
};

template <class Bounds, class = void>
struct HasConsider : std::false_type {};
template <class Bounds>
struct HasConsider<Bounds, std::void_t<decltype(&Bounds::consider)>> : std::true_type {};

struct WeightBounds {
  static constexpr bool kExact = true;
  WeightSource src;

  float bounds(int64_t b0, int nb, float* ub) const {
    return weight_group_bounds(b0, nb, src.vocab, ub, [this](int64_t first, int n, float* w) {
      for (int i = 0; i < n; ++i) w[i] = src.w[first + i];
    });
  }
  float block_bound(int64_t, const float* ub, int j) const { return ub[j]; }
  float log_mass(int64_t b) const { return src.log_mass(b); }
  void prefetch(int64_t) const {}
};

// --- The search ----------------------------------------------------------------------------------------

// Folded Philox words below this threshold cannot lift a block whose bound is at most group_max to
// `bound`: a block needs -log(1 - u) >= e = bound - group_max - slack, i.e. u >= 1 - exp(-e). The test is
// made looser by 0.01 in e (far above float32 rounding of the scores) and by 1024 words (float(word)
// rounds by at most 64 and kUniformScale is 2^-31 to 1e-7), so every block that passes the exact per-block
// test below passes this one. The threshold is read from a table at e rounded down to a multiple of
// 1/64 (looser still: at most 1.6 % more candidates), where an exp per group cost ~7 ns of a ~50 ns group.
struct WordThresholds {
  static constexpr int kSteps = 64;             // table entries per nat of e
  static constexpr int kLast = 24 * kSteps;     // e >= 24: 1 - exp(-e) rounds to 1 in the words' 31 bits
  uint32_t at[kLast + 1];
  WordThresholds() {
    for (int k = 0; k <= kLast; ++k) {
      const double t = (1.0 - std::exp(-static_cast<double>(k) / kSteps)) * 2147483648.0 - 1024.0;
      at[k] = t > 0.0 ? static_cast<uint32_t>(t) : 0u;
    }
  }
};
inline const WordThresholds kWordThresholds;

inline uint32_t word_threshold(float bound, float group_max) {
  const float e = bound - group_max - kGumbelSlack - 0.01f;
  if (!(e > 0.0f)) return 0;
  const float k = e * WordThresholds::kSteps;  // exact (a power of two); truncation rounds it down
  return kWordThresholds.at[k < WordThresholds::kLast ? static_cast<int>(k) : WordThresholds::kLast];
}

// argmax_b L_b - log(-log u_b) over the blocks of entries [v0, v1) (v0 a multiple of 4 blocks), starting
// from `start` (a real candidate anywhere in the row, or kArgMaxInit). Returns {score, block}.
template <class Bounds>
ArgMax search_blocks(const Bounds& src, const PhiloxKey& key, uint32_t hi, int stream, int64_t v0, int64_t v1,
                     ArgMax start) {
  ArgMax best = start;
  float bound = start.value;
  alignas(64) float ub[kGroupBlocks];
  alignas(64) uint32_t words[kGroupBlocks];
  const int64_t b_end = (v1 + kBlock - 1) / kBlock;
  for (int64_t b0 = v0 / kBlock; b0 < b_end; b0 += kGroupBlocks) {
    src.prefetch(b0);
    const int nb = static_cast<int>(b_end - b0 < kGroupBlocks ? b_end - b0 : kGroupBlocks);
    const float group_max = src.bounds(b0, nb, ub);
    if (group_max == -kInf || group_max + kGumbelBound < bound) continue;  // nothing here can reach the bound
    simd::philox_words32(key, philox_offset_lo(stream, kBlockDraws + static_cast<uint32_t>(b0)), hi, words);
    const uint32_t threshold = word_threshold(bound, group_max);
    for (int j0 = 0; j0 < nb; j0 += simd::W) {
      simd::u32v w;
      __builtin_memcpy(&w, words + j0, sizeof(w));
      uint32_t hit = simd::ge_mask(simd::fold(w), threshold);
      if (nb - j0 < simd::W) hit &= (1u << (nb - j0)) - 1u;
      while (hit != 0) {
        const int j = j0 + __builtin_ctz(hit);
        hit &= hit - 1;
        const int64_t b = b0 + j;
        const float ub_j = src.block_bound(b, ub, j);
        // The group's word test again with the block's own bound (looser than the exact test, as above, and
        // a table read where the exact test takes a log): most candidates stop here.
        if (ub_j == -kInf || fold_word(words[j]) < word_threshold(bound, ub_j)) continue;
        // The exact test: the block's bound plus -log(1 - u) + slack reaches the best score so far.
        const float u = philox_uniform(words[j]);
        if (ub_j + (kGumbelSlack - log_f32(1.0f - u)) < bound) continue;
        if constexpr (HasConsider<Bounds>::value) {
          best = src.consider(best, b, u);
        } else {
          const float mass = Bounds::kExact ? ub_j : src.log_mass(b);
          best = better(best, ArgMax{mass - gumbel_log_term(u), b});
        }
        bound = best.value > bound ? best.value : bound;
      }
    }
  }
  return best;
}

// Softmax statistics (max, sum exp(z - max)) of z = sanitize(row / temperature) over [v0, v1), online over
// chunks of 256 entries seen as 16 lanes x 16 steps (lane l sums entries 16 i + l in order; float within a
// chunk, double across chunks), so that the sum is the same for every SIMD width. The terms use
// row * (1 / temperature): the normalizer is a sum, so that rounding moves it by ~1e-7 relative, like
// any summation order (the reference's own sum included).
template <DType D>
SoftmaxStats softmax_stats_t(const void* row, float temperature, int64_t v0, int64_t v1) {
  constexpr int kSub = 16 / simd::W;  // registers per 16-lane step
  const float inv_t = 1.0f / temperature;
  const simd::f32v neg_inf = simd::f32v{} - kInf;
  const simd::f32v big = simd::f32v{} + kFloat32Max;
  simd::f32v lane_m[kSub];
  simd::f64v lane_s[kSub];  // each lane's sum, relative to its lane_m
  for (int k = 0; k < kSub; ++k) {
    lane_m[k] = neg_inf;
    lane_s[k] = simd::f64v{};
  }
  int64_t v = v0;
  for (; v + 256 <= v1; v += 256) {
    prefetch_ahead(row, v * kElemBytes<D>, 256 * kElemBytes<D>, v1 * kElemBytes<D>);
    simd::f32v z[16][kSub];
    simd::f32v mc[kSub];
    for (int k = 0; k < kSub; ++k) mc[k] = neg_inf;
    for (int i = 0; i < 16; ++i) {
      for (int k = 0; k < kSub; ++k) {
        // NaN -> -inf, +inf -> float32 max (max_v / min_v return their second operand on NaN)
        const simd::f32v x = simd::max_v(load_v<D>(row, v + 16 * i + k * simd::W) * inv_t, neg_inf);
        z[i][k] = simd::min_v(x, big);
        mc[k] = simd::max_v(z[i][k], mc[k]);
      }
    }
    for (int k = 0; k < kSub; ++k) {
      const simd::f32v shift = mc[k] == -kInf ? 0.0f : mc[k];
      simd::f32v sum = {};
      for (int i = 0; i < 16; ++i) sum += simd::exp_nonpositive(z[i][k] - shift);
      const simd::f32v m_new = simd::max_v(mc[k], lane_m[k]);
      const simd::f32v shift_new = m_new == -kInf ? 0.0f : m_new;
      const simd::f32v old_scale = lane_m[k] == -kInf ? 0.0f : simd::exp_nonpositive(lane_m[k] - shift_new);
      const simd::f32v chunk_scale = mc[k] == -kInf ? 0.0f : simd::exp_nonpositive(mc[k] - shift_new);
      lane_s[k] = lane_s[k] * __builtin_convertvector(old_scale, simd::f64v) +
                  __builtin_convertvector(sum * chunk_scale, simd::f64v);
      lane_m[k] = m_new;
    }
  }
  // The 16 lanes in order, then the tail (scalar online softmax in double).
  float m = -kInf;
  for (int k = 0; k < kSub; ++k) m = simd::lane_max_of(lane_m[k], m);
  double total = 0.0;
  for (int k = 0; k < kSub; ++k) {
    for (int l = 0; l < simd::W; ++l) {
      if (lane_m[k][l] != -kInf) total += lane_s[k][l] * static_cast<double>(exp_fma_f32(lane_m[k][l] - m));
    }
  }
  for (; v < v1; ++v) {
    const float z = sanitize(load_elem(row, D, v) * inv_t);
    if (z == -kInf) continue;
    if (z > m) {
      total = (m == -kInf ? 0.0 : total * static_cast<double>(exp_fma_f32(m - z))) + 1.0;
      m = z;
    } else {
      total += static_cast<double>(exp_fma_f32(z - m));
    }
  }
  return {m, total};
}

// A cheap bracket of the same normalizer (types.h NormalizerBound): the sum over [v0, v1) of
// exp2_rough(fma(row, log2 e / temperature, -shift log2 e)) ~ exp(z - shift), z = sanitize(row * (1 /
// temperature)) as softmax_stats_t computes it (the error of folding the scale into one fma is in the
// bound, chain.h certain_accept), shift = the max of the first chunk holding a finite z. A chunk whose
// sum overflows (or exceeds 2^100) is redone after raising the shift to its max; a +inf z or a shift
// beyond 2^100 leaves no bound (NaN entries add at most 2^-125 each, exp2_rough's floor). Terms in any
// order (load4_any_order): about a third of softmax_stats_t's operations per entry, no running max, a
// two-fma exp.
template <DType D>
NormalizerBound normalizer_bound_t(const void* row, float temperature, int64_t v0, int64_t v1) {
  constexpr int64_t kChunk = 256;
  static_assert(kChunk % (4 * simd::W) == 0, "chunks hold whole groups of four vectors");
  constexpr float kLog2e = 1.44269504089f;
  const float inv_t = 1.0f / temperature;
  const float scale = inv_t * kLog2e;
  const NormalizerBound none{-kInf, 0.0, 0.0f, false};
  // The chunk's sum of terms relative to shift (float, four accumulators of 4 W entries per step).
  auto chunk_sum = [&](int64_t v, int64_t n, float shift) {
    const simd::f32v neg_shift = simd::f32v{} - shift * kLog2e;
    const simd::f32v sc = simd::f32v{} + scale;
    simd::f32v acc[4] = {};
    int64_t i = 0;
    for (; i + 4 * simd::W <= n; i += 4 * simd::W) {
      simd::f32v x[4];
      load4_any_order<D>(row, v + i, x);
      for (int k = 0; k < 4; ++k) acc[k] += simd::exp2_rough(simd::fma_v(x[k], sc, neg_shift));
    }
    float total = simd::sum_lanes((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; i < n; ++i) {
      const float y = fma_f32(load_elem(row, D, v + i), scale, -(shift * kLog2e));
      total += static_cast<float>(std::exp2(static_cast<double>(y > -126.0f ? y : -126.0f)));  // as exp2_rough
    }
    return total;
  };
  auto chunk_max = [&](int64_t v, int64_t n) {
    float m = -kInf;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, sanitize(load_elem(row, D, v + i) * inv_t));
    return m;
  };
  NormalizerBound out{-kInf, 0.0, 0.0f, true};
  for (int64_t v = v0; v < v1; v += kChunk) {
    const int64_t n = std::min(kChunk, v1 - v);
    prefetch_ahead(row, v * kElemBytes<D>, n * kElemBytes<D>, v1 * kElemBytes<D>);
    if (out.shift == -kInf) {  // no finite z yet: this chunk sets the shift, or holds none either
      const float m = chunk_max(v, n);
      if (m == -kInf) continue;  // -inf and NaN entries only: nothing to add
      if (!(std::fabs(m) <= 0x1p100f)) return none;
      out.shift = m;
      out.max_abs_shift = std::fabs(m);
    }
    float s = chunk_sum(v, n, out.shift);
    if (!(s <= 0x1p100f)) {
      const float m = chunk_max(v, n);
      if (!(m <= 0x1p100f) || !(m > out.shift)) return none;  // +inf or a huge z
      out.sum *= std::exp(static_cast<double>(out.shift) - static_cast<double>(m));
      out.shift = m;
      out.max_abs_shift = std::max(out.max_abs_shift, std::fabs(m));
      s = chunk_sum(v, n, out.shift);
      if (!(s <= 0x1p100f)) return none;
    }
    out.sum += static_cast<double>(s);
  }
  return out;
}

SPECDEC_NS_END
