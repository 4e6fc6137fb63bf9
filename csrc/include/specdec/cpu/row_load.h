// Loads of a row's entries for the host row passes (gumbel_search.h, normalizer.h): W entries as float32 from
// any logits dtype, the streaming passes' software prefetch, sanitize lane-wise. One instruction-set build
// per host (csrc/cpu/row_ops.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/types.h"
#include "specdec/cpu/simd.h"

SPECDEC_NS_BEGIN

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

// Prefetch of bytes [offset + kAhead, + bytes) of a row of `row_bytes` bytes (none past its end), with
// __builtin_prefetch's locality kLocality (3: prefetcht0, into L1; 1: prefetcht2, into L2).
template <int64_t kAhead, int kLocality>
SPECDEC_SIMD_INLINE void prefetch_at(const void* row, int64_t offset, int64_t bytes, int64_t row_bytes) {
  const int64_t end = std::min(offset + kAhead + bytes, row_bytes);
  for (int64_t i = offset + kAhead; i < end; i += 64) {
    __builtin_prefetch(static_cast<const char*>(row) + i, 0, kLocality);
  }
}

// Prefetch of bytes [offset + kPrefetchAhead, + bytes) of a row into L1 (none past its end).
SPECDEC_SIMD_INLINE void prefetch_ahead(const void* row, int64_t offset, int64_t bytes, int64_t row_bytes) {
  prefetch_at<kPrefetchAhead, 3>(row, offset, bytes, row_bytes);
}

// A pass bound by its own arithmetic (normalizer_bound_t: ~7 vector operations per 16 entries) took, with
// prefetch_ahead alone, about the read's time plus its compute's, as if none of it overlapped, whatever that
// prefetch's distance (4 to 128 KB) or hint. A second prefetch kPrefetchFar ahead into L2 (prefetcht2)
// keeps misses in flight while it computes: 1-23 % less time on the random-sampling cases with stochastic
// drafts, within +-5 % on those with deterministic drafts (benchmarks/results/ab_cpu_5dbfdbd_vs_c6522bc.csv).
// The passes that do little per entry (the greedy pass, the Gumbel-max searches, the read probes) do not
// take it: with it in every pass (and the L1 prefetch at 4 KB), the cases with deterministic drafts ran up
// to 19 % slower (ab_cpu_5dbfdbd_vs_76d768f.csv).
inline constexpr int64_t kPrefetchFar = 32768;

// prefetch_ahead, and the bytes [offset + kPrefetchFar, + bytes) into L2, none past the row's end.
SPECDEC_SIMD_INLINE void prefetch_ahead_far(const void* row, int64_t offset, int64_t bytes, int64_t row_bytes) {
  prefetch_ahead(row, offset, bytes, row_bytes);
  prefetch_at<kPrefetchFar, 1>(row, offset, bytes, row_bytes);
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

// The largest lane of a running max that skipped NaN (max_v keeps its second operand): none in x.
SPECDEC_SIMD_INLINE float lane_max(simd::f32v x) { return simd::max_lane(x); }

SPECDEC_NS_END
