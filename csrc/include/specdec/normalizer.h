// The softmax normalizer of a logits row on the host: exactly (softmax_stats_t) and as a cheap bracket
// (normalizer_bound_t), one instruction-set build per host (csrc/cpu/row_ops.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common.h"
#include "math.h"
#include "row_load.h"
#include "simd.h"
#include "types.h"

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
// chunk's float sum stays within 2^-15 (chain.h certain_accept).
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
