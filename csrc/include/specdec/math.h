// log and exp for float32 inputs, evaluated in double and rounded once, so that results are the
// correctly rounded float32 value except in rare halfway cases (the reference's torch.log / torch.exp
// are within 1 ulp of it, so tokens can differ only at floating-point near-ties).
// Straight-line code with selects instead of branches: loops over these vectorise with -O3, and the
// results are identical on every ISA and on the GPU (no contraction: build with -ffp-contract=off).
#pragma once

#include "common.h"

SPECDEC_NS_BEGIN

constexpr float kInf = __builtin_huge_valf();

// Natural log of x >= 0: log(0) = -inf, log(inf) = inf; subnormals handled.
SPECDEC_HD float log_f32(float x) {
  const bool sub = x < 1.17549435e-38f;
  const float xs = sub ? x * 8388608.0f : x;  // 2^23, exact
  const uint32_t bits = float_bits(xs);
  int32_t e = static_cast<int32_t>(bits >> 23) - 127 - (sub ? 23 : 0);
  float m = bits_float((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  const bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e += big ? 1 : 0;
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716: series to s^15 gives ~1e-13 relative.
  const double md = static_cast<double>(m);
  const double s = (md - 1.0) / (md + 1.0);
  const double s2 = s * s;
  double poly = 1.0 / 15.0;
  poly = poly * s2 + 1.0 / 13.0;
  poly = poly * s2 + 1.0 / 11.0;
  poly = poly * s2 + 1.0 / 9.0;
  poly = poly * s2 + 1.0 / 7.0;
  poly = poly * s2 + 1.0 / 5.0;
  poly = poly * s2 + 1.0 / 3.0;
  const double r = static_cast<double>(e) * 0.69314718055994530942 + 2.0 * s + 2.0 * s * s2 * poly;
  float out = static_cast<float>(r);
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

SPECDEC_NS_END
