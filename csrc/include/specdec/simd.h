// Portable SIMD for the host kernels: GCC/Clang vector extensions of W lanes (W = 16 with AVX-512,
// 8 with AVX2, 4 otherwise), plus intrinsics for Philox's 32x32->64-bit multiplies and for masks where
// the instruction set has them. Every function computes exactly what its scalar twin in philox.h /
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

#if defined(__AVX512F__) || defined(__AVX2__)
// Philox on 64-bit lanes (the even or the odd 32-bit lanes of a vector): one vpmuludq yields a whole
// 64-bit product, so a round costs two multiplies, two shifts and two three-way XORs per register, with
// no blends. The high halves of the state lanes carry garbage that only ever reaches high halves again
// (multiplies read the low 32 bits; XOR is lane-local); the word is the low half of the result.
#if defined(__AVX512F__)
typedef __m512i q64v;
SPECDEC_SIMD_INLINE q64v q_set1(uint32_t x) { return _mm512_set1_epi64(static_cast<long long>(x)); }
SPECDEC_SIMD_INLINE q64v q_mul(q64v a, q64v b) { return _mm512_mul_epu32(a, b); }
SPECDEC_SIMD_INLINE q64v q_hi(q64v a) { return _mm512_srli_epi64(a, 32); }
SPECDEC_SIMD_INLINE q64v q_xor3(q64v a, q64v b, q64v c) { return _mm512_ternarylogic_epi64(a, b, c, 0x96); }
SPECDEC_SIMD_INLINE q64v q_xor(q64v a, q64v b) { return _mm512_xor_si512(a, b); }
// Low halves of even's lanes into the even 32-bit lanes, of odd's into the odd ones.
SPECDEC_SIMD_INLINE q64v q_pack(q64v even, q64v odd) {
  return _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}
#else
typedef __m256i q64v;
SPECDEC_SIMD_INLINE q64v q_set1(uint32_t x) { return _mm256_set1_epi64x(static_cast<long long>(x)); }
SPECDEC_SIMD_INLINE q64v q_mul(q64v a, q64v b) { return _mm256_mul_epu32(a, b); }
SPECDEC_SIMD_INLINE q64v q_hi(q64v a) { return _mm256_srli_epi64(a, 32); }
SPECDEC_SIMD_INLINE q64v q_xor3(q64v a, q64v b, q64v c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
SPECDEC_SIMD_INLINE q64v q_xor(q64v a, q64v b) { return _mm256_xor_si256(a, b); }
SPECDEC_SIMD_INLINE q64v q_pack(q64v even, q64v odd) {
  return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}
#endif
SPECDEC_SIMD_INLINE u32v q_interleave(q64v even, q64v odd) {
  const q64v w = q_pack(even, odd);
  u32v out;
  __builtin_memcpy(&out, &w, sizeof(out));
  return out;
}
// The 32-bit lanes of v as 64-bit lanes (no data movement).
SPECDEC_SIMD_INLINE q64v q_load(const u32v& v) {
  q64v q;
  __builtin_memcpy(&q, &v, sizeof(q));
  return q;
}

// The ten rounds for counters (x, c1, 0, 0), x in the low halves of the lanes. Rounds 0 and 1 are
// folded: round 0 multiplies only x (c2 = c3 = 0), round 1 multiplies a constant c0; the last round
// needs only the product that feeds word 0.
SPECDEC_SIMD_INLINE q64v philox_word_q(const PhiloxKey& key, q64v x, uint32_t c1) {
  const q64v ka = q_set1(kPhiloxRoundA), kb = q_set1(kPhiloxRoundB);
  const uint32_t s0 = c1 ^ key.k0[0];  // word 0 after round 0
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxRoundA) * s0;  // round 1's c0 product (all lanes)
  q64v pa = q_mul(x, ka);
  q64v c2 = q_xor(q_hi(pa), q_set1(key.k1[0]));
  q64v c3 = pa;
  q64v pb = q_mul(c2, kb);
  q64v c0 = q_xor(q_hi(pb), q_set1(key.k0[1]));
  q64v c1v = pb;
  c2 = q_xor(c3, q_set1(static_cast<uint32_t>(p1 >> 32) ^ key.k1[1]));
  c3 = q_set1(static_cast<uint32_t>(p1));
#pragma GCC unroll 8
  for (int r = 2; r < kPhiloxRounds - 1; ++r) {
    pb = q_mul(c2, kb);
    pa = q_mul(c0, ka);
    c0 = q_xor3(q_hi(pb), c1v, q_set1(key.k0[r]));
    c2 = q_xor3(q_hi(pa), c3, q_set1(key.k1[r]));
    c1v = pb;
    c3 = pa;
  }
  pb = q_mul(c2, kb);
  return q_xor3(q_hi(pb), c1v, q_set1(key.k0[kPhiloxRounds - 1]));
}

// philox_word for W counters c0 (same key and c1): even and odd lanes as two 64-bit-lane chains.
SPECDEC_SIMD_INLINE u32v philox_word(const PhiloxKey& key, u32v c0, uint32_t c1_scalar) {
  const q64v x = q_load(c0);
  const q64v even = philox_word_q(key, x, c1_scalar);
  const q64v odd = philox_word_q(key, q_hi(x), c1_scalar);
  return q_interleave(even, odd);
}
#else
// (hi, lo) words of a * c for every lane.
SPECDEC_SIMD_INLINE void mulhilo(uint32_t a, u32v c, u32v& hi, u32v& lo) {
  const u64v p = __builtin_convertvector(c, u64v) * static_cast<uint64_t>(a);
  hi = __builtin_convertvector(p >> 32, u32v);
  lo = __builtin_convertvector(p, u32v);
}

// philox_word for W counters c0 (same key and c1).
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
#endif

// Folded 31-bit Philox word (philox_uniform's integer before the float conversion).
SPECDEC_SIMD_INLINE u32v fold(u32v w) { return w >= 0x80000000u ? ~w : w; }

// Bit l set iff a[l] >= t (a, t < 2^31).
SPECDEC_SIMD_INLINE uint32_t ge_mask(u32v a, uint32_t t) {
#if defined(__AVX512F__)
  __m512i x;
  __builtin_memcpy(&x, &a, sizeof(x));
  return _mm512_cmpge_epu32_mask(x, _mm512_set1_epi32(static_cast<int>(t)));
#elif defined(__AVX2__)
  __m256i x;
  __builtin_memcpy(&x, &a, sizeof(x));
  const __m256i gt = _mm256_cmpgt_epi32(x, _mm256_set1_epi32(static_cast<int>(t) - 1));
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(gt)));
#else
  uint32_t m = 0;
  for (int l = 0; l < W; ++l) m |= (a[l] >= t ? 1u : 0u) << l;
  return m;
#endif
}

// Bit l set iff a[l] == m.
SPECDEC_SIMD_INLINE uint32_t eq_mask(f32v a, float m) {
#if defined(__AVX512F__)
  __m512 x;
  __builtin_memcpy(&x, &a, sizeof(x));
  return _mm512_cmp_ps_mask(x, _mm512_set1_ps(m), _CMP_EQ_OQ);
#elif defined(__AVX2__)
  __m256 x;
  __builtin_memcpy(&x, &a, sizeof(x));
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(m), _CMP_EQ_OQ)));
#else
  uint32_t mask = 0;
  for (int l = 0; l < W; ++l) mask |= (a[l] == m ? 1u : 0u) << l;
  return mask;
#endif
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
