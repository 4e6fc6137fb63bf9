// log and exp for float32 inputs, within about 1 ulp of the exact value like the reference's torch.log /
// torch.exp (so tokens can differ from the reference only at floating-point near-ties). log is pure
// float32 (it runs twice per vocabulary entry in Gumbel-max); exp is evaluated in double and rounded once.
// Straight-line code with selects instead of branches: loops over these vectorise with -O3, and the
// results are identical on every ISA and on the GPU (no contraction: build with -ffp-contract=off).
#pragma once

#include <cmath>

#include "specdec/core/common.h"

SPECDEC_NS_BEGIN

constexpr float kInf = __builtin_huge_valf();

// Round to the nearest integer, ties to even (|x| < 2^22): two float32 additions, the same on every ISA
// (no fast-math, so the compiler keeps both roundings).
SPECDEC_HD float rint_f32(float x) {
  const float shift = 12582912.0f;  // 1.5 * 2^23
  return (x + shift) - shift;
}

// Natural log of x >= 0 in float32 arithmetic (Cephes' logf polynomial, within ~1 ulp like torch's
// log): log(0) = -inf, log(inf) = inf; subnormals handled. The SIMD twin in simd.h performs the same
// operations in the same order, so every host build and the GPU round identically.
SPECDEC_HD float log_f32(float x) {
  const bool sub = x < 1.17549435e-38f;
  const float xs = sub ? x * 8388608.0f : x;  // 2^23, exact
  const uint32_t bits = float_bits(xs);
  int32_t e = static_cast<int32_t>(bits >> 23) - 127 - (sub ? 23 : 0);
  float m = bits_float((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  const bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e += big ? 1 : 0;
  const float f = m - 1.0f;  // exact (Sterbenz)
  const float z = f * f;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  const float ef = static_cast<float>(e);
  y = y + -2.12194440e-4f * ef;
  y = y + -0.5f * z;
  float out = f + y;
  out = out + 0.693359375f * ef;
  out = x == 0.0f ? -kInf : out;
  out = x == kInf ? kInf : out;
  return out;
}

// exp(x) for float32 x (any value; NaN not expected): exp(-inf) = 0, overflow -> inf.
SPECDEC_HD float exp_f32(float x) {
  const float xc = x < -110.0f ? -110.0f : (x > 90.0f ? 90.0f : x);
  const double xd = static_cast<double>(xc);
  const double t = xd * 1.4426950408889634074;
  // Round to nearest integer (|t| < 2^51), branch-free.
  const double n = (t + 6755399441055744.0) - 6755399441055744.0;
  const double r = xd - n * 0.69314718055994530942;  // |r| <= 0.35; error of ln2 * n << float ulp
  double p = 1.0 / 479001600.0;                      // 1/12!
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int64_t ni = static_cast<int64_t>(n);
  const double scale = bits_double(static_cast<uint64_t>(ni + 1023) << 52);
  float out = static_cast<float>(p * scale);
  out = x < -110.0f ? 0.0f : out;
  out = x > 90.0f ? kInf : out;
  return out;
}

// One rounding (fma.rn.f32 on CUDA, the C library's fmaf on the host and in the CUDA host emulation).
SPECDEC_HD float fma_f32(float a, float b, float c) { return fmaf(a, b, c); }

// exp(x) in float32 arithmetic with fused multiply-adds (within ~2 ulp): the softmax normalizer and the
// block log-masses of two-level Gumbel-max, where it runs once per vocabulary entry. exp(-inf) = 0,
// overflow -> inf. The SIMD twin (simd::exp_fma) performs the same operations in the same order.
SPECDEC_HD float exp_fma_f32(float x) {
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float n = rint_f32(xc * 1.44269504089f);
  float r = fma_f32(-n, 0.693359375f, xc);
  r = fma_f32(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma_f32(p, r, 1.3981999507e-3f);
  p = fma_f32(p, r, 8.3334519073e-3f);
  p = fma_f32(p, r, 4.1665795894e-2f);
  p = fma_f32(p, r, 1.6666665459e-1f);
  p = fma_f32(p, r, 5.0000001201e-1f);
  p = fma_f32(p, r * r, r + 1.0f);
  // p * 2^n; below 2^-125 in two exact-or-rounded-once steps (subnormal results).
  const int32_t ni = static_cast<int32_t>(n);
  const bool tiny = ni < -125;
  const float scale = bits_float(static_cast<uint32_t>((tiny ? ni + 64 : ni) + 127) << 23);
  float out = p * scale;
  out = tiny ? out * 5.42101086e-20f : out;  // 2^-64, exact
  out = x < -104.0f ? 0.0f : out;
  out = x > 89.0f ? kInf : out;
  return out;
}

// simd::exp2_rough: p(f) = c0 + f (c1 + f c2) ~ 2^f on [0, 1], relative minimax fit. kExp2RoughErr bounds
// |p(f) / 2^f - 1| over every float32 f in [0, 1] with p evaluated by two float32 fmas (checked
// exhaustively: 1.72625e-3, plus 2 ulp; the endpoint f = 1 is the largest).
inline constexpr float kExp2RoughC0 = 1.0017261505126953f;
inline constexpr float kExp2RoughC1 = 0.6576341986656189f;
inline constexpr float kExp2RoughC2 = 0.33718717098236084f;
inline constexpr double kExp2RoughErr = 1.7264e-3;

// The same fit on [-1/2, 1/2] (f = y - nearest(y)), for normalizer.h's bf16 terms on builds without
// AVX-512: |p(f) / 2^f - 1| over every float32 f in [-1/2, 1/2], p by two float32 fmas, is at most
// 1.72490e-3 (checked exhaustively by tests/cpp/exp2_half_check.cpp), within kExp2RoughErr with room for
// f's own rounding (2^-26 at most, ~1e-8 relative on 2^f): chain.h's bracket holds for these terms as is.
inline constexpr float kExp2HalfC0 = 1.0004431009292603f;
inline constexpr float kExp2HalfC1 = 0.7034479975700378f;
inline constexpr float kExp2HalfC2 = 0.2384289652109146f;

// NaN -> -inf (never sampled), +inf -> float32 max, as reference/sampling.py's sanitize. The + 0.0f
// turns -0 into +0 (equal values), so that order keys of equal values are equal too.
SPECDEC_HD float sanitize(float z) {
  z = z != z ? -kInf : z;
  return (z > kFloat32Max ? kFloat32Max : z) + 0.0f;
}

// Order-preserving map float -> uint32 (for finite values and +-inf; -0 and +0 map apart but compare
// equal as floats, which is all the thresholds use).
SPECDEC_HD uint32_t order_key(float x) {
  const uint32_t b = float_bits(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

SPECDEC_HD float key_value(uint32_t k) { return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// Gumbel noise term of gumbel_argmax: log(-log(u)), rounded step by step exactly like the reference
// (float32 log, negate, float32 log). The score is then logit - gumbel_log_term(u).
SPECDEC_HD float gumbel_log_term(float u) { return log_f32(-log_f32(u)); }

// --- Two-level Gumbel-max blocks (specdec_kernels/reference/gumbel.py) ----------------------------------

constexpr int kBlock = 16;  // vocabulary entries per block

// Sum of a block's 16 values in the fixed pairwise order that every backend's reduction follows:
// c_i = w_i + w_{i+8}, d_i = c_i + c_{i+4}, then (d_0 + d_2) + (d_1 + d_3).
SPECDEC_HD float block_sum16(const float* w) {
  float c[8], d[4];
  for (int i = 0; i < 8; ++i) c[i] = w[i] + w[i + 8];
  for (int i = 0; i < 4; ++i) d[i] = c[i] + c[i + 4];
  return (d[0] + d[2]) + (d[1] + d[3]);
}

SPECDEC_HD float block_max(const float* z) {
  float m = -kInf;
  for (int i = 0; i < kBlock; ++i) m = z[i] > m ? z[i] : m;
  return m;
}

// Log-mass L = m + log(sum exp(z - m)) of a block of 16 log-weights (-inf padded); -inf if all are -inf.
SPECDEC_HD float block_log_mass(const float* z) {
  const float m = block_max(z);
  if (m == -kInf) return -kInf;
  float e[kBlock];
  for (int i = 0; i < kBlock; ++i) e[i] = exp_fma_f32(z[i] - m);
  return m + log_f32(block_sum16(e));
}

// Upper-bound margins of a block's score L - gumbel_log_term(u), which the searches use to rule blocks
// out: L <= max + kLogBlockBound (each exp(z - max) <= 1, and log 16 = 2.7726) and
// -gumbel_log_term(u) <= -log(1 - u) + kGumbelSlack (-log u >= 1 - u), both far above float32 rounding.
constexpr float kGumbelSlack = 0.01f;
constexpr float kLogBlockBound = 2.7725887f + kGumbelSlack;

SPECDEC_NS_END
