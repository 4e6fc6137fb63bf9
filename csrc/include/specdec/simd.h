// Portable SIMD for the host kernels: GCC/Clang vector extensions of W lanes (W = 16 with AVX-512,
// 8 with AVX2, 4 otherwise), plus intrinsics for the 32x32->64-bit multiplies of Philox where the
// instruction set has them. Every function computes exactly what its scalar twin in philox.h /
// math.h computes (same operations, same order), so tokens do not depend on the instruction set.
#pragma once

#include <cstdint>

#include "common.h"
#include "math.h"
#include "philox.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define SPECDEC_SIMD_INLINE inline __attribute__((always_inline))

SPECDEC_NS_BEGIN
namespace simd {

#if defined(__AVX512F__)
constexpr int W = 16;
#elif defined(__AVX2__)
constexpr int W = 8;
#else
constexpr int W = 4;
#endif

typedef uint32_t u32v __attribute__((vector_size(4 * W)));
typedef int32_t i32v __attribute__((vector_size(4 * W)));
typedef float f32v __attribute__((vector_size(4 * W)));
typedef double f64v __attribute__((vector_size(8 * W)));
typedef int64_t i64v __attribute__((vector_size(8 * W)));
typedef uint64_t u64v __attribute__((vector_size(8 * W)));

SPECDEC_SIMD_INLINE f32v load(const float* p) {
  f32v v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
SPECDEC_SIMD_INLINE void store(float* p, f32v v) { __builtin_memcpy(p, &v, sizeof(v)); }

SPECDEC_SIMD_INLINE u32v iota() {
  u32v v;
  for (int l = 0; l < W; ++l) v[l] = static_cast<uint32_t>(l);
  return v;
}

SPECDEC_SIMD_INLINE i32v iota_i32() {
  i32v v;
  for (int l = 0; l < W; ++l) v[l] = l;
  return v;
}

// (hi, lo) words of a * c for every lane.
SPECDEC_SIMD_INLINE void mulhilo(uint32_t a, u32v c, u32v& hi, u32v& lo) {
#if defined(__AVX512F__)
  __m512i x;
  __builtin_memcpy(&x, &c, sizeof(x));
  const __m512i av = _mm512_set1_epi64(a);
  const __m512i even = _mm512_mul_epu32(x, av);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), av);
  const __m512i h = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  const __m512i l = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  __builtin_memcpy(&hi, &h, sizeof(hi));
  __builtin_memcpy(&lo, &l, sizeof(lo));
#elif defined(__AVX2__)
  __m256i x;
  __builtin_memcpy(&x, &c, sizeof(x));
  const __m256i av = _mm256_set1_epi64x(a);
  const __m256i even = _mm256_mul_epu32(x, av);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), av);
  const __m256i h = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  const __m256i l = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  __builtin_memcpy(&hi, &h, sizeof(hi));
  __builtin_memcpy(&lo, &l, sizeof(lo));
#else
  const u64v p = __builtin_convertvector(c, u64v) * static_cast<uint64_t>(a);
  hi = __builtin_convertvector(p >> 32, u32v);
  lo = __builtin_convertvector(p, u32v);
#endif
}

// philox_word for W consecutive counters c0 (same key and c1).
SPECDEC_SIMD_INLINE u32v philox_word(const PhiloxKey& key, u32v c0, uint32_t c1_scalar) {
  // Round 0 has c2 = c3 = 0, so its first product is zero.
  u32v ha, la;
  mulhilo(kPhiloxRoundA, c0, ha, la);
  u32v c1 = c0 * 0u;  // lo(B * 0)
  u32v c2 = ha ^ key.k1[0];
  u32v c3 = la;
  c0 = c1 + (c1_scalar ^ key.k0[0]);
#pragma GCC unroll 9
  for (int r = 1; r < kPhiloxRounds; ++r) {
    u32v hb, lb;
    mulhilo(kPhiloxRoundB, c2, hb, lb);
    mulhilo(kPhiloxRoundA, c0, ha, la);
    const u32v n0 = hb ^ c1 ^ key.k0[r];
    const u32v n2 = ha ^ c3 ^ key.k1[r];
    c0 = n0;
    c1 = lb;
    c2 = n2;
    c3 = la;
  }
  return c0;
}

SPECDEC_SIMD_INLINE f32v philox_uniform(u32v w) {
  const u32v folded = w >= 0x80000000u ? ~w : w;
  return __builtin_convertvector(reinterpret_cast<const i32v&>(folded), f32v) * kUniformScale;
}

// log_f32 of math.h, lane-wise (same operations, same order).
SPECDEC_SIMD_INLINE f32v log_f32(f32v x) {
  const i32v sub = x < 1.17549435e-38f;
  const f32v xs = sub ? x * 8388608.0f : x;
  u32v bits;
  __builtin_memcpy(&bits, &xs, sizeof(bits));
  i32v e;
  __builtin_memcpy(&e, &bits, sizeof(e));
  e = ((e >> 23) & 0xff) - 127 - (sub & 23);
  u32v mb = (bits & 0x007fffffu) | 0x3f800000u;
  f32v m;
  __builtin_memcpy(&m, &mb, sizeof(m));
  const i32v big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = e - big;  // big is -1 where true
  const f32v f = m - 1.0f;
  const f32v z = f * f;
  f32v y = f * 7.0376836292e-2f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  const f32v ef = __builtin_convertvector(e, f32v);
  y = y + -2.12194440e-4f * ef;
  y = y + -0.5f * z;
  f32v out = f + y;
  out = out + 0.693359375f * ef;
  out = x == 0.0f ? -kInf : out;
  out = x == kInf ? kInf : out;
  return out;
}

// exp_f32 of math.h, lane-wise.
SPECDEC_SIMD_INLINE f32v exp_f32(f32v x) {
  f32v xc = x < -110.0f ? -110.0f : x;
  xc = xc > 90.0f ? 90.0f : xc;
  const f64v xd = __builtin_convertvector(xc, f64v);
  const f64v t = xd * 1.4426950408889634074;
  const f64v n = (t + 6755399441055744.0) - 6755399441055744.0;
  const f64v r = xd - n * 0.69314718055994530942;
  f64v p = r * (1.0 / 479001600.0) + 1.0 / 39916800.0;
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
  const i64v ni = __builtin_convertvector(n, i64v);
  const u64v sb = reinterpret_cast<const u64v&>(ni) + 1023u;
  const u64v sbits = sb << 52;
  f64v scale;
  __builtin_memcpy(&scale, &sbits, sizeof(scale));
  f32v out = __builtin_convertvector(p * scale, f32v);
  out = x < -110.0f ? 0.0f : out;
  out = x > 90.0f ? kInf : out;
  return out;
}

}  // namespace simd
SPECDEC_NS_END
