// Portable SIMD for the host kernels: GCC/Clang vector extensions of W lanes (W = 16 with AVX-512,
// 8 with AVX2, 4 otherwise), plus intrinsics for Philox's 32x32->64-bit multiplies and for masks where
// the instruction set has them. Every function computes exactly what its scalar twin in philox.h /
// math.h computes (same operations, same order), so tokens do not depend on the instruction set.
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"

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

// The bits of `from` as a To of the same size: between the vector-extension types and the intrinsics' types.
template <class To, class From>
SPECDEC_SIMD_INLINE To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bits_as: the types differ in size");
  To to;
  __builtin_memcpy(&to, &from, sizeof(to));
  return to;
}

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
// Philox on 64-bit lanes, one counter per lane: one vpmuludq yields a whole 64-bit product, so a round
// costs two multiplies, two half swaps and two three-way XORs per register and yields all four words. The
// high halves of the state lanes carry garbage that only ever reaches high halves again (multiplies read
// the low 32 bits; XOR is lane-local); the words are the low halves. q_hi brings a product's high half
// down by swapping the halves (a shuffle) rather than shifting: the multiplies and shifts both need the
// one vector port that AVX-512 multiplies run on, the shuffle goes to another.
#if defined(__AVX512F__)
typedef __m512i q64v;
SPECDEC_SIMD_INLINE q64v q_set1(uint32_t x) { return _mm512_set1_epi64(static_cast<long long>(x)); }
SPECDEC_SIMD_INLINE q64v q_mul(q64v a, q64v b) { return _mm512_mul_epu32(a, b); }
SPECDEC_SIMD_INLINE q64v q_hi(q64v a) { return _mm512_shuffle_epi32(a, _MM_PERM_CDAB); }
SPECDEC_SIMD_INLINE q64v q_xor3(q64v a, q64v b, q64v c) { return _mm512_ternarylogic_epi64(a, b, c, 0x96); }
SPECDEC_SIMD_INLINE q64v q_xor(q64v a, q64v b) { return _mm512_xor_si512(a, b); }
#else
typedef __m256i q64v;
SPECDEC_SIMD_INLINE q64v q_set1(uint32_t x) { return _mm256_set1_epi64x(static_cast<long long>(x)); }
SPECDEC_SIMD_INLINE q64v q_mul(q64v a, q64v b) { return _mm256_mul_epu32(a, b); }
SPECDEC_SIMD_INLINE q64v q_hi(q64v a) { return _mm256_shuffle_epi32(a, 0xB1); }
SPECDEC_SIMD_INLINE q64v q_xor3(q64v a, q64v b, q64v c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
SPECDEC_SIMD_INLINE q64v q_xor(q64v a, q64v b) { return _mm256_xor_si256(a, b); }
#endif

// The four words of the counters (x, c1, 0, 0), x in the low halves of the lanes; out[w] holds word w.
// Rounds 0 and 1 are folded: round 0 multiplies only x (c2 = c3 = 0), round 1 multiplies a constant c0.
SPECDEC_SIMD_INLINE void philox_words_q(const PhiloxKey& key, q64v x, uint32_t c1, q64v out[4]) {
  const q64v ka = q_set1(kPhiloxRoundA), kb = q_set1(kPhiloxRoundB);
  const uint32_t s0 = c1 ^ key.k0[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxRoundA) * s0;
  q64v pa = q_mul(x, ka);
  q64v c2 = q_xor(q_hi(pa), q_set1(key.k1[0]));
  q64v c3 = pa;
  q64v pb = q_mul(c2, kb);
  q64v c0 = q_xor(q_hi(pb), q_set1(key.k0[1]));
  q64v c1v = pb;
  c2 = q_xor(c3, q_set1(static_cast<uint32_t>(p1 >> 32) ^ key.k1[1]));
  c3 = q_set1(static_cast<uint32_t>(p1));
#pragma GCC unroll 8
  for (int r = 2; r < kPhiloxRounds; ++r) {
    pb = q_mul(c2, kb);
    pa = q_mul(c0, ka);
    c0 = q_xor3(q_hi(pb), c1v, q_set1(key.k0[r]));
    c2 = q_xor3(q_hi(pa), c3, q_set1(key.k1[r]));
    c1v = pb;
    c3 = pa;
  }
  out[0] = c0;
  out[1] = c1v;
  out[2] = c2;
  out[3] = c3;
}

// The 32 words of counters counter0 ... counter0 + 7 (same key and c1), in order: out[4 i + w] is word w
// of counter counter0 + i. The lanes hold the counters in the order that makes the final unpack a
// plain low/high split.
SPECDEC_SIMD_INLINE void philox_words32(const PhiloxKey& key, uint32_t counter0, uint32_t c1, uint32_t* out) {
#if defined(__AVX512F__)
  const q64v x = _mm512_add_epi64(_mm512_set1_epi64(counter0), _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7));
  q64v w[4];
  philox_words_q(key, x, c1, w);
  const q64v a = _mm512_mask_blend_epi32(0xAAAA, w[0], _mm512_slli_epi64(w[1], 32));
  const q64v b = _mm512_mask_blend_epi32(0xAAAA, w[2], _mm512_slli_epi64(w[3], 32));
  _mm512_storeu_si512(out, _mm512_unpacklo_epi64(a, b));
  _mm512_storeu_si512(out + 16, _mm512_unpackhi_epi64(a, b));
#else
  for (int half = 0; half < 2; ++half) {
    const q64v x = _mm256_add_epi64(_mm256_set1_epi64x(counter0 + 4 * half), _mm256_setr_epi64x(0, 2, 1, 3));
    q64v w[4];
    philox_words_q(key, x, c1, w);
    const q64v a = _mm256_blend_epi32(w[0], _mm256_slli_epi64(w[1], 32), 0xAA);
    const q64v b = _mm256_blend_epi32(w[2], _mm256_slli_epi64(w[3], 32), 0xAA);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * half), _mm256_unpacklo_epi64(a, b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * half + 8), _mm256_unpackhi_epi64(a, b));
  }
#endif
}
#else
SPECDEC_SIMD_INLINE void philox_words32(const PhiloxKey& key, uint32_t counter0, uint32_t c1, uint32_t* out) {
  for (int i = 0; i < 8; ++i) philox_words(key, counter0 + i, c1, out + 4 * i);
}
#endif

// Folded 31-bit Philox word (philox_uniform's integer before the float conversion).
SPECDEC_SIMD_INLINE u32v fold(u32v w) { return w >= 0x80000000u ? ~w : w; }

// Bit l set iff a[l] >= t[l] (a, t < 2^31).
SPECDEC_SIMD_INLINE uint32_t ge_mask(u32v a, u32v t) {
#if defined(__AVX512F__)
  __m512i x, y;
  __builtin_memcpy(&x, &a, sizeof(x));
  __builtin_memcpy(&y, &t, sizeof(y));
  return _mm512_cmpge_epu32_mask(x, y);
#elif defined(__AVX2__)
  __m256i x, y;
  __builtin_memcpy(&x, &a, sizeof(x));
  __builtin_memcpy(&y, &t, sizeof(y));
  const __m256i gt = _mm256_cmpgt_epi32(x, _mm256_sub_epi32(y, _mm256_set1_epi32(1)));
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(gt)));
#else
  uint32_t m = 0;
  for (int l = 0; l < W; ++l) m |= (a[l] >= t[l] ? 1u : 0u) << l;
  return m;
#endif
}

// 16-bit floats' bits as signed integers, 2 W lanes: among entries of one sign, the order of the
// integers is the order of the floats (ascending for the non-negative, descending for the negative).
typedef int16_t i16v __attribute__((vector_size(4 * W)));

SPECDEC_SIMD_INLINE i16v load_i16(const uint16_t* p) {
  i16v v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
SPECDEC_SIMD_INLINE i16v max_i16(i16v a, i16v b) { return a > b ? a : b; }
SPECDEC_SIMD_INLINE i16v min_i16(i16v a, i16v b) { return a < b ? a : b; }

// The largest (kMax) or the smallest lane of a.
template <bool kMax>
SPECDEC_SIMD_INLINE int16_t extreme_lane_i16(i16v a) {
#if defined(__AVX512BW__)
  const __m512i x = bits_as<__m512i>(a);  // as 32-bit lanes: both halves sign-extended, then one reduction
  const __m512i lo = _mm512_srai_epi32(_mm512_slli_epi32(x, 16), 16), hi = _mm512_srai_epi32(x, 16);
  return static_cast<int16_t>(kMax ? _mm512_reduce_max_epi32(_mm512_max_epi32(lo, hi))
                                   : _mm512_reduce_min_epi32(_mm512_min_epi32(lo, hi)));
#elif defined(__AVX2__)
  const auto op = [](__m128i x, __m128i y) { return kMax ? _mm_max_epi16(x, y) : _mm_min_epi16(x, y); };
  const __m256i x = bits_as<__m256i>(a);  // the halves, then a tree within 128 bits: 4 ops, not 15 compares
  __m128i r = op(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  r = op(r, _mm_shuffle_epi32(r, 0x4E));
  r = op(r, _mm_shuffle_epi32(r, 0xB1));
  r = op(r, _mm_srli_epi32(r, 16));
  return static_cast<int16_t>(_mm_cvtsi128_si32(r));
#else
  int16_t m = a[0];
  for (int l = 1; l < 2 * W; ++l) m = (kMax ? a[l] > m : a[l] < m) ? a[l] : m;
  return m;
#endif
}

// Whether some lane of a is greater than the same lane of b; any_gt / any_lt against one value t.
SPECDEC_SIMD_INLINE bool any_greater(i16v a, i16v b) {
#if defined(__AVX512BW__)
  return _mm512_cmpgt_epi16_mask(bits_as<__m512i>(a), bits_as<__m512i>(b)) != 0;
#elif defined(__AVX2__)
  return _mm256_movemask_epi8(_mm256_cmpgt_epi16(bits_as<__m256i>(a), bits_as<__m256i>(b))) != 0;
#else
  bool any = false;
  for (int l = 0; l < 2 * W; ++l) any |= a[l] > b[l];
  return any;
#endif
}

// The first lane of a equal to t, or -1.
SPECDEC_SIMD_INLINE int first_eq_i16(i16v a, int16_t t) {
#if defined(__AVX512BW__)
  const uint32_t m = _mm512_cmpeq_epi16_mask(bits_as<__m512i>(a), _mm512_set1_epi16(t));
  return m != 0 ? __builtin_ctz(m) : -1;
#elif defined(__AVX2__)
  const uint32_t m = static_cast<uint32_t>(
      _mm256_movemask_epi8(_mm256_cmpeq_epi16(bits_as<__m256i>(a), _mm256_set1_epi16(t))));
  return m != 0 ? static_cast<int>(__builtin_ctz(m) / 2) : -1;  // two mask bits per 16-bit lane
#else
  for (int l = 0; l < 2 * W; ++l) {
    if (a[l] == t) return l;
  }
  return -1;
#endif
}

SPECDEC_SIMD_INLINE bool any_gt(i16v a, int16_t t) { return any_greater(a, i16v{} + t); }
SPECDEC_SIMD_INLINE bool any_lt(i16v a, int16_t t) { return any_greater(i16v{} + t, a); }

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

// Bit l set iff lane l of the comparison result m is true (all ones).
SPECDEC_SIMD_INLINE uint32_t lane_bits(i32v m) {
#if defined(__AVX512F__)
  return _mm512_cmpneq_epi32_mask(bits_as<__m512i>(m), _mm512_setzero_si512());
#elif defined(__AVX2__)
  return static_cast<uint32_t>(_mm256_movemask_ps(bits_as<__m256>(m)));
#else
  uint32_t mask = 0;
  for (int l = 0; l < W; ++l) mask |= (m[l] != 0 ? 1u : 0u) << l;
  return mask;
#endif
}

SPECDEC_SIMD_INLINE f32v philox_uniform(u32v w) {
  const u32v folded = fold(w);
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

SPECDEC_SIMD_INLINE f32v fma_v(f32v a, f32v b, f32v c) {
#if defined(__AVX512F__)
  return bits_as<f32v>(_mm512_fmadd_ps(bits_as<__m512>(a), bits_as<__m512>(b), bits_as<__m512>(c)));
#elif defined(__AVX2__)
  return bits_as<f32v>(_mm256_fmadd_ps(bits_as<__m256>(a), bits_as<__m256>(b), bits_as<__m256>(c)));
#else
  f32v r;
  for (int l = 0; l < W; ++l) r[l] = fma_f32(a[l], b[l], c[l]);
  return r;
#endif
}

SPECDEC_SIMD_INLINE f32v max_v(f32v a, f32v b) {  // a > b ? a : b (b if either is NaN)
#if defined(__AVX512F__)
  return bits_as<f32v>(_mm512_max_ps(bits_as<__m512>(a), bits_as<__m512>(b)));
#elif defined(__AVX2__)
  return bits_as<f32v>(_mm256_max_ps(bits_as<__m256>(a), bits_as<__m256>(b)));
#else
  f32v r;
  for (int l = 0; l < W; ++l) r[l] = a[l] > b[l] ? a[l] : b[l];
  return r;
#endif
}

SPECDEC_SIMD_INLINE f32v min_v(f32v a, f32v b) {  // a < b ? a : b (b if either is NaN)
#if defined(__AVX512F__)
  return bits_as<f32v>(_mm512_min_ps(bits_as<__m512>(a), bits_as<__m512>(b)));
#elif defined(__AVX2__)
  return bits_as<f32v>(_mm256_min_ps(bits_as<__m256>(a), bits_as<__m256>(b)));
#else
  f32v r;
  for (int l = 0; l < W; ++l) r[l] = a[l] < b[l] ? a[l] : b[l];
  return r;
#endif
}

SPECDEC_SIMD_INLINE float lane_max_of(f32v x, float m) {
  for (int l = 0; l < W; ++l) m = x[l] > m ? x[l] : m;
  return m;
}

// The largest lane (kMax) or the sum of the lanes of x by a tree: log2 W dependent steps, where a loop over
// the lanes is a chain of W.
template <bool kMax>
SPECDEC_SIMD_INLINE float tree_lanes(f32v x) {
#if defined(__AVX512F__)
  if constexpr (kMax) {
    return _mm512_reduce_max_ps(bits_as<__m512>(x));
  } else {
    return _mm512_reduce_add_ps(bits_as<__m512>(x));
  }
#elif defined(__AVX2__)
  const auto op = [](__m128 a, __m128 b) {
    if constexpr (kMax) {
      return _mm_max_ps(a, b);
    } else {
      return _mm_add_ps(a, b);
    }
  };
  const __m256 v = bits_as<__m256>(x);
  __m128 m = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = op(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(op(m, _mm_shuffle_ps(m, m, 1)));
#else
  float t[W];
  store(t, x);
  for (int n = W / 2; n > 0; n /= 2) {
    for (int l = 0; l < n; ++l) t[l] = kMax ? (t[l + n] > t[l] ? t[l + n] : t[l]) : t[l] + t[l + n];
  }
  return t[0];
#endif
}

// The largest lane of x, which must hold no NaN; +0 and -0 may come out either way, which compares and
// sanitize do not tell apart.
SPECDEC_SIMD_INLINE float max_lane(f32v x) { return tree_lanes<true>(x); }

// The sum of x's lanes, for sums whose bound allows any order (normalizer_bound_t's chunk sums).
SPECDEC_SIMD_INLINE float sum_lanes(f32v x) { return tree_lanes<false>(x); }

// Integer-valued floats, exactly, for |x| < 2^22: one instruction with AVX2 and AVX-512, a conversion and a
// compare (floor) or the magic-number sum (nearest, ties to even) in the baseline build.
SPECDEC_SIMD_INLINE f32v floor_v(f32v x) {
#if defined(__AVX512F__)
  return bits_as<f32v>(_mm512_roundscale_ps(bits_as<__m512>(x), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
#elif defined(__AVX2__)
  return bits_as<f32v>(_mm256_round_ps(bits_as<__m256>(x), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
#else
  const f32v t = __builtin_convertvector(__builtin_convertvector(x, i32v), f32v);  // toward 0
  return t > x ? t - 1.0f : t;
#endif
}
SPECDEC_SIMD_INLINE f32v round_nearest_v(f32v x) {
#if defined(__AVX512F__)
  return bits_as<f32v>(_mm512_roundscale_ps(bits_as<__m512>(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__AVX2__)
  return bits_as<f32v>(_mm256_round_ps(bits_as<__m256>(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  return (x + 12582912.0f) - 12582912.0f;
#endif
}

// 2^n for integer-valued n in [-126, 128] (2^128: +inf), exactly: with AVX2 the bits of the float
// n + 2^23 + 127, whose low bits are n + 127, shifted into the exponent field (an add and a shift, one
// operation fewer than converting n to integers, as the baseline build does).
SPECDEC_SIMD_INLINE f32v pow2_int(f32v n) {
#if defined(__AVX2__)
  return bits_as<f32v>(bits_as<u32v>(n + 8388735.0f) << 23);  // 8388735 = 2^23 + 127
#else
  return bits_as<f32v>((__builtin_convertvector(n, i32v) + 127) << 23);
#endif
}

// exp(x) for x <= 0 (or -inf), the normalizer's terms: no overflow, and results below exp(-87) (which
// cannot move a sum that holds exp(0) = 1) are those of exp(-87). Fewer operations than exp_fma; the
// same on every ISA (tests/cpp/exp2_rough_check.cpp).
SPECDEC_SIMD_INLINE f32v exp_nonpositive(f32v x) {
  const f32v zero = {};
  const f32v xc = max_v(x, zero - 87.0f);
  const f32v n = round_nearest_v(xc * 1.44269504089f);
  f32v r = fma_v(n, zero - 0.693359375f, xc);
  r = fma_v(n, zero + 2.12194440e-4f, r);
  f32v p = fma_v(zero + 1.9875691500e-4f, r, zero + 1.3981999507e-3f);
  p = fma_v(p, r, zero + 8.3334519073e-3f);
  p = fma_v(p, r, zero + 4.1665795894e-2f);
  p = fma_v(p, r, zero + 1.6666665459e-1f);
  p = fma_v(p, r, zero + 5.0000001201e-1f);
  p = fma_v(p, r * r, r + 1.0f);
#if defined(__AVX512F__)
  return bits_as<f32v>(_mm512_scalef_ps(bits_as<__m512>(p), bits_as<__m512>(n)));  // the same bits as p * 2^n
#else
  return p * pow2_int(n);
#endif
}

// 2^y within relative kExp2RoughErr (math.h) for finite y in [-126, 128), 2^-126 within it for y < -126 or
// NaN (absolute error at most 2^-125, never subnormal), +inf for y >= 128: a degree-2 polynomial on the
// fraction y - floor(y), for bounds that need not be exact (the normalizer bracket of normalizer.h).
// Unlike the functions above, its bits differ across instruction sets; only the bound holds. (The AVX2 and
// baseline builds compute the same values: tests/cpp/exp2_rough_check.cpp.)
SPECDEC_SIMD_INLINE f32v exp2_rough(f32v y) {
  const f32v zero = {};
  const f32v yc = max_v(y, zero - 126.0f);  // NaN -> -126
#if defined(__AVX512F__)
  // y - floor(y) exactly, in [0, 1] (1 when y is a tiny negative: p(1) is within the bound too), and
  // p * 2^floor(y): vreduceps (round down) and vscalefps.
  const f32v f = bits_as<f32v>(_mm512_reduce_ps(bits_as<__m512>(yc), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  const f32v p = fma_v(fma_v(zero + kExp2RoughC2, f, zero + kExp2RoughC1), f, zero + kExp2RoughC0);
  return bits_as<f32v>(_mm512_scalef_ps(bits_as<__m512>(p), bits_as<__m512>(yc)));
#else
  const f32v yb = min_v(yc, zero + 128.0f);
  const f32v n = floor_v(yb);
  const f32v f = yb - n;
  const f32v p = fma_v(fma_v(zero + kExp2RoughC2, f, zero + kExp2RoughC1), f, zero + kExp2RoughC0);
  return p * pow2_int(n);  // 2^128: +inf
#endif
}

// True where exp2_fast runs without exp2_rough's clamp (AVX-512: vreduceps / vscalefps take any y).
inline constexpr bool kExp2FastUnclamped =
#if defined(__AVX512F__)
    true;
#else
    false;
#endif

// exp2_rough without its clamp where kExp2FastUnclamped (one operation fewer per vector in a loop bound by
// vector operations): 2^y within kExp2RoughErr for finite y in [-126, 128), +inf for y >= 128, below
// 2^-125 for y < -126 (a subnormal, or 0 under flush-to-zero: FlushToZero), NaN for a NaN or infinite y
// (the caller redoes such a sum with exp2_rough). Elsewhere exp2_rough itself.
SPECDEC_SIMD_INLINE f32v exp2_fast(f32v y) {
#if defined(__AVX512F__)
  const f32v zero = {};
  const f32v f = bits_as<f32v>(_mm512_reduce_ps(bits_as<__m512>(y), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  const f32v p = fma_v(fma_v(zero + kExp2RoughC2, f, zero + kExp2RoughC1), f, zero + kExp2RoughC0);
  return bits_as<f32v>(_mm512_scalef_ps(bits_as<__m512>(p), bits_as<__m512>(y)));
#else
  return exp2_rough(y);
#endif
}

// Flush-to-zero for the scope of the object (the caller's MXCSR restored after) where exp2_fast is
// unclamped: its subnormal results become 0 rather than taking microcode assists on some cores.
class FlushToZero {
 public:
#if defined(__AVX512F__)
  FlushToZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8000u); }
  ~FlushToZero() { _mm_setcsr(saved_); }
 private:
  unsigned saved_;
#endif
};

// exp_fma_f32 of math.h, lane-wise (same operations, same order).
SPECDEC_SIMD_INLINE f32v exp_fma(f32v x) {
  f32v xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  const f32v n = (xc * 1.44269504089f + 12582912.0f) - 12582912.0f;
  const f32v zero = {};
  f32v r = fma_v(zero - n, zero + 0.693359375f, xc);
  r = fma_v(zero - n, zero - 2.12194440e-4f, r);
  f32v p = fma_v(zero + 1.9875691500e-4f, r, zero + 1.3981999507e-3f);
  p = fma_v(p, r, zero + 8.3334519073e-3f);
  p = fma_v(p, r, zero + 4.1665795894e-2f);
  p = fma_v(p, r, zero + 1.6666665459e-1f);
  p = fma_v(p, r, zero + 5.0000001201e-1f);
  p = fma_v(p, r * r, r + 1.0f);
  const i32v ni = __builtin_convertvector(n, i32v);
  const i32v tiny = ni < -125;
  const i32v e = ((tiny ? ni + 64 : ni) + 127) << 23;
  f32v scale;
  __builtin_memcpy(&scale, &e, sizeof(scale));
  f32v out = p * scale;
  out = tiny ? out * 5.42101086e-20f : out;
  out = x < -104.0f ? 0.0f : out;
  out = x > 89.0f ? kInf : out;
  return out;
}

}  // namespace simd
SPECDEC_NS_END
