// The softmax normalizer of a logits row on the host: exactly (softmax_stats_t) and as a cheap bracket
// (normalizer_bound_t), one instruction-set build per host (csrc/cpu/row_ops.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/gumbel.h"
#include "specdec/core/math.h"
#include "specdec/core/types.h"
#include "specdec/cpu/row_load.h"
#include "specdec/cpu/simd.h"

SPECDEC_NS_BEGIN

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

// The shift of normalizer_bound_t's sum for a chunk max m: m itself, or for bf16 rows without AVX-512
// (chunk_sum_ranged) K ln 2 rounded to the nearest float, K the largest integer with that float <= m
// (chain.h's total_bracket needs shift <= the row max): within ln 2 of m, within half an ulp of K ln 2 (the
// exponent's rounding that chain.h's bracket_error allows for, as for the constant shift log2 e of the
// other terms), and K = shift log2 e rounded to the nearest integer (|K| <= 2^20).
template <DType D>
inline float bound_shift(float m) {
  if constexpr (D == DType::kBFloat16 && !simd::kExp2FastUnclamped) {
    double k = std::floor(static_cast<double>(m) * 1.4426950408889634);
    if (!(std::fabs(k) <= 0x1p20)) return m;
    float s = static_cast<float>(k * 0.6931471805599453);
    if (s > m) s = static_cast<float>(--k * 0.6931471805599453);
    return s;
  }
  return m;
}

// The sum over the entries [v, v + n) of a bf16 row of v1 entries (n a multiple of 4 W) of p(f) 2^n, where
// n is the nearest integer to the exponent y = x scale - K, f = y - n lies in [-1/2, 1/2] and p is math.h's
// kExp2HalfC* fit (within kExp2RoughErr of 2^f): t = fma(x, scale, C) with C = 1.5 2^23 + 127 - K holds
// n + 127 in its low bits (C + y lies in [2^23, 2^24), whose floats are the integers: the fma rounds the
// exact y to n), 2^n is those bits shifted into the exponent field, and f = fma(x, scale, C - t) (C - t
// exact; f within 2^-26). Seven vector operations per 8 entries where chunk_sum takes ten (no clamps, no
// separate rounding: 15 % fewer cycles per entry on Zen 2), plus the unpacking and, for the range, one
// integer max per 8 entries: the chunk's largest entry (signed 16-bit max: non-negative floats order as
// their bits) and its most negative one (unsigned max: negative floats' bits order by magnitude) must put
// every exponent in [-125, 126], so that n is in [-126, 127] and 2^n a normal float; false otherwise (a NaN
// or infinite entry included), and the caller sums the chunk with exp2_rough. The float sum: four
// accumulators of W lanes, at most 256 terms a lane (kSumChunk), as chunk_sum. The exponent's own error is
// smaller than chunk_sum's (no rounded constant shift log2 e, no rounding of y), so chain.h's bracket
// holds as it is (tests/cpp/exp2_half_check.cpp, tests/cpp/bracket_check.cpp).
SPECDEC_SIMD_INLINE bool chunk_sum_ranged(const void* row, int64_t v, int64_t n, int64_t v1, float scale, float shift,
                                          float& sum) {
  typedef uint16_t u16v __attribute__((vector_size(4 * simd::W)));
  const double k = std::nearbyint(static_cast<double>(shift) * 1.4426950408889634);
  if (!(std::fabs(k) <= 0x1p20) || n % (4 * simd::W) != 0) return false;
  const uint16_t* x16 = static_cast<const uint16_t*>(row) + v;
  const float c = static_cast<float>(12583039.0 - k);  // 1.5 2^23 + 127 - K, an integer below 2^24: exact
  const simd::f32v sc = simd::f32v{} + scale, cv = simd::f32v{} + c;
  const simd::f32v c0 = simd::f32v{} + kExp2HalfC0, c1 = simd::f32v{} + kExp2HalfC1, c2 = simd::f32v{} + kExp2HalfC2;
  simd::f32v acc[4] = {};
  simd::i16v hi_signed = simd::i16v{} + static_cast<int16_t>(INT16_MIN);
  u16v hi_unsigned = {};
  for (int64_t i = 0; i < n; i += 4 * simd::W) {
    if (i % 256 == 0) prefetch_ahead_far(row, (v + i) * 2, 512, v1 * 2);
    for (int h = 0; h < 2; ++h) {
      simd::u32v w;
      __builtin_memcpy(&w, x16 + i + 2 * h * simd::W, sizeof(w));
      const simd::i16v ws = simd::bits_as<simd::i16v>(w);
      const u16v wu = simd::bits_as<u16v>(w);
      hi_signed = ws > hi_signed ? ws : hi_signed;
      hi_unsigned = wu > hi_unsigned ? wu : hi_unsigned;
      const simd::f32v xs[2] = {simd::bits_as<simd::f32v>(w << 16), simd::bits_as<simd::f32v>(w & 0xFFFF0000u)};
      for (int j = 0; j < 2; ++j) {
        const simd::f32v t = simd::fma_v(xs[j], sc, cv);
        const simd::f32v f = simd::fma_v(xs[j], sc, cv - t);
        const simd::f32v e = simd::bits_as<simd::f32v>(simd::bits_as<simd::u32v>(t) << 23);
        const simd::f32v p = simd::fma_v(simd::fma_v(c2, f, c1), f, c0);
        acc[2 * h + j] = simd::fma_v(p, e, acc[2 * h + j]);
      }
    }
  }
  // The largest lanes (the unsigned one through the signed reduction, its sign bit flipped: the same order).
  const int16_t top = simd::extreme_lane_i16<true>(hi_signed);
  const auto bottom = static_cast<uint16_t>(
      simd::extreme_lane_i16<true>(simd::bits_as<simd::i16v>(hi_unsigned ^ static_cast<uint16_t>(0x8000u))) ^
      INT16_MIN);
  // The largest entry (at most +0 when every entry is negative), the smallest (at least +0 when none is).
  const float x_max = top >= 0 ? bits_float(static_cast<uint32_t>(static_cast<uint16_t>(top)) << 16) : 0.0f;
  const float x_min = bottom >= 0x8000u ? bits_float(static_cast<uint32_t>(bottom) << 16) : 0.0f;
  const double y_max = static_cast<double>(x_max) * scale - k, y_min = static_cast<double>(x_min) * scale - k;
  if (!(y_max <= 126.0 && y_min >= -125.0)) return false;  // NaN and infinite entries fail it too
  sum = simd::sum_lanes((acc[0] + acc[1]) + (acc[2] + acc[3]));
  return true;
}

// A cheap bracket of the same normalizer (types.h NormalizerBound): the sum over [v0, v1) of
// exp2_rough(fma(row, log2 e / temperature, -shift log2 e)) ~ exp(z - shift), z = sanitize(row * (1 /
// temperature)) as softmax_stats_t computes it (the error of folding the scale into one fma is in the
// bound, chain.h certain_accept), shift = the max of the first chunk holding a finite z. A chunk whose
// sum overflows (or exceeds 2^100) is redone after raising the shift to its max; a +inf z or a shift
// beyond 2^100 leaves no bound (NaN entries add at most 2^-125 each, exp2_rough's floor). Terms in any
// order (load4_any_order): about a third of softmax_stats_t's operations per entry, no running max, a
// two-fma exp. The terms come from exp2_fast (no clamp: seven vector operations per 16 entries with
// AVX-512 where exp2_rough takes eight, the loop being bound by their count), under flush-to-zero, so a term
// below 2^-126 is within 2^-125 as exp2_rough's floor is; a chunk whose fast sum is NaN (a NaN or infinite
// entry) is summed again with exp2_rough. The shift comes from a chunk of kShiftChunk entries; after it the
// chunks are kSumChunk entries long, so that their horizontal sum, double accumulation and overflow test
// (a dependency chain of ~10 operations) come once per 4096 entries rather than per 256: 15 % less time per
// row from L2. Each of the 4 W float lanes sums at most kSumChunk / (4 W) <= 256 terms (W >= 4), so a
// chunk's float sum stays within 2^-15 (chain.h certain_accept). bf16 rows without AVX-512 take
// chunk_sum_ranged, and the shift of bound_shift (within ln 2 below the chunk max).
template <DType D>
NormalizerBound normalizer_bound_t(const void* row, float temperature, int64_t v0, int64_t v1) {
  constexpr int64_t kShiftChunk = 256;  // also the prefetch step
  constexpr int64_t kSumChunk = 4096;
  static_assert(kShiftChunk % (4 * simd::W) == 0, "chunks hold whole groups of four vectors");
  static_assert(kSumChunk % kShiftChunk == 0 && kSumChunk / (4 * simd::W) <= 256, "a lane sums <= 256 terms");
  constexpr float kLog2e = 1.44269504089f;
  const float inv_t = 1.0f / temperature;
  const float scale = inv_t * kLog2e;
  const NormalizerBound none{-kInf, 0.0, 0.0f, false};
  // The chunk's sum of terms relative to shift (float, four accumulators of 4 W entries per step).
  auto chunk_sum_with = [&](int64_t v, int64_t n, float shift, auto exp2) {
    const simd::f32v neg_shift = simd::f32v{} - shift * kLog2e;
    const simd::f32v sc = simd::f32v{} + scale;
    simd::f32v acc[4] = {};
    auto add4 = [&](int64_t at) {
      simd::f32v x[4];
      load4_any_order<D>(row, at, x);
      for (int k = 0; k < 4; ++k) acc[k] += exp2(simd::fma_v(x[k], sc, neg_shift));
    };
    int64_t i = 0;
    for (; i + kShiftChunk <= n; i += kShiftChunk) {
      prefetch_ahead_far(row, (v + i) * kElemBytes<D>, kShiftChunk * kElemBytes<D>, v1 * kElemBytes<D>);
      for (int64_t j = 0; j < kShiftChunk; j += 4 * simd::W) add4(v + i + j);
    }
    for (; i + 4 * simd::W <= n; i += 4 * simd::W) add4(v + i);
    float total = simd::sum_lanes((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; i < n; ++i) {
      const float y = fma_f32(load_elem(row, D, v + i), scale, -(shift * kLog2e));
      total += static_cast<float>(std::exp2(static_cast<double>(y > -126.0f ? y : -126.0f)));  // as exp2_rough
    }
    return total;
  };
  // exp2_fast, or exp2_rough where the chunk holds a NaN or an infinite exponent (exp2_fast's NaN).
  auto chunk_sum = [&](int64_t v, int64_t n, float shift) {
    const float s = chunk_sum_with(v, n, shift, [](simd::f32v y) { return simd::exp2_fast(y); });
    if (!simd::kExp2FastUnclamped || s == s) return s;
    return chunk_sum_with(v, n, shift, [](simd::f32v y) { return simd::exp2_rough(y); });
  };
  // bf16 rows where exp2_fast keeps exp2_rough's clamps (no AVX-512): chunk_sum_ranged, or chunk_sum where
  // it declines (a chunk with an exponent out of its range, a NaN or an infinite entry).
  auto chunk_sum_bf16 = [&](int64_t v, int64_t n, float shift) {
    if constexpr (D == DType::kBFloat16 && !simd::kExp2FastUnclamped) {
      const int64_t body = n - n % (4 * simd::W);
      float s;
      if (body > 0 && chunk_sum_ranged(row, v, body, v1, scale, shift, s)) {
        return body == n ? s : s + chunk_sum(v + body, n - body, shift);
      }
    }
    return chunk_sum(v, n, shift);
  };
  auto chunk_max = [&](int64_t v, int64_t n) {
    float m = -kInf;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, sanitize(load_elem(row, D, v + i) * inv_t));
    return m;
  };
  NormalizerBound out{-kInf, 0.0, 0.0f, true};
  [[maybe_unused]] const simd::FlushToZero ftz;
  for (int64_t v = v0, n = 0; v < v1; v += n) {
    n = std::min(out.shift == -kInf ? kShiftChunk : kSumChunk, v1 - v);
    if (out.shift == -kInf) {  // no finite z yet: this chunk sets the shift, or holds none either
      const float m = chunk_max(v, n);
      if (m == -kInf) continue;  // -inf and NaN entries only: nothing to add
      if (!(std::fabs(m) <= 0x1p100f)) return none;
      out.shift = bound_shift<D>(m);
      out.max_abs_shift = std::fabs(out.shift);
    }
    float s = chunk_sum_bf16(v, n, out.shift);
    if (!(s <= 0x1p100f)) {
      const float m = chunk_max(v, n);
      if (!(m <= 0x1p100f) || !(m > out.shift)) return none;  // +inf or a huge z
      const float raised = bound_shift<D>(m);
      out.sum *= std::exp(static_cast<double>(out.shift) - static_cast<double>(raised));
      out.shift = raised;
      out.max_abs_shift = std::max(out.max_abs_shift, std::fabs(raised));
      s = chunk_sum_bf16(v, n, out.shift);
      if (!(s <= 0x1p100f)) return none;
    }
    out.sum += static_cast<double>(s);
  }
  return out;
}

SPECDEC_NS_END
