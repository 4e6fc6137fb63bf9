// Sparse Gumbel-max search: argmax_v Z_v - log(-log u_v) over a vocabulary range, where Z_v is a
// logit (SparseGumbel<false>) or the log of a nonnegative weight w_v (SparseGumbel<true>), and u_v is
// the Philox uniform of index v on one (seed, position, stream). The result is the exact argmax (ties
// to the lowest index) of the scores that row_ops.h's dense loops would compute, because an entry is
// dropped only when its score is provably below a real candidate's score:
//
// 1. Z_v + kGumbelBound < bound: no noise can lift it (no Philox draw at all).
// 2. Otherwise the Philox word is drawn but the two logs are skipped unless u_v is close enough to 1:
//    -log u >= 1 - u gives Z - log(-log u) <= Z - log(1 - u) < bound whenever 1 - u > exp(Zmax - bound).
//    The test is one integer compare of the folded Philox word against a threshold per block.
//
// The caller stages values block by block (at most kGumbelBlock entries, in L1) and offers each block's
// largest entry first, so that the bound is high before the block's other entries are tested.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"
#include "math.h"
#include "philox.h"
#include "simd.h"
#include "types.h"

SPECDEC_NS_BEGIN

inline constexpr int kGumbelBlock = 2048;  // entries staged per block (8 KiB of float32)
static_assert(kGumbelBlock % simd::W == 0, "blocks hold whole SIMD vectors");

// Margin (in score units) of the u test, far above the float32 rounding of the scores (~1e-5).
inline constexpr double kGumbelSlack = 0.01;

// Lane-wise running argmax: lane l holds the best (value, index) among the elements it saw; ties go to
// the lower index whatever the order of the updates.
struct LaneArgMax {
  simd::f32v value;
  simd::i32v index;

  LaneArgMax() {
    value = simd::f32v{} - kInf;
    index = simd::i32v{} + INT32_MAX;
  }
  void update(simd::f32v x, simd::i32v idx) {
    const simd::i32v take = (x > value) | ((x == value) & (idx < index));
    value = take ? x : value;
    index = take ? idx : index;
  }
  // Consecutive indices base + lane, increasing from call to call: strict > keeps the first maximum.
  void update(simd::f32v x, int32_t base) {
    const simd::i32v take = x > value;
    value = take ? x : value;
    index = take ? simd::iota_i32() + base : index;
  }
  float max() const {
    float m = -kInf;
    for (int l = 0; l < simd::W; ++l) m = value[l] > m ? value[l] : m;
    return m;
  }
  ArgMax result() const {
    const float m = max();
    int64_t idx = INT64_MAX;
    for (int l = 0; l < simd::W; ++l) {
      if (value[l] == m && index[l] < idx) idx = index[l];
    }
    if (m == -kInf) idx = 0;  // nothing beat -inf: the reference's argmax of an all -inf row is 0
    return {m, idx};
  }
};

inline ArgMax better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// First index in v[0, n) holding m (n if none).
inline int find_first(const float* v, int n, float m) {
  int i = 0;
  for (; i + simd::W <= n; i += simd::W) {
    const uint32_t eq = simd::eq_mask(simd::load(v + i), m);
    if (eq != 0) return i + __builtin_ctz(eq);
  }
  for (; i < n; ++i) {
    if (v[i] == m) return i;
  }
  return n;
}

inline float block_max(const float* v, int n) {
  simd::f32v lane = simd::f32v{} - kInf;
  int i = 0;
  for (; i + simd::W <= n; i += simd::W) {
    const simd::f32v x = simd::load(v + i);
    lane = x > lane ? x : lane;
  }
  float m = -kInf;
  for (int l = 0; l < simd::W; ++l) m = lane[l] > m ? lane[l] : m;
  for (; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

template <bool kLogWeights>
struct SparseGumbel {
  const PhiloxKey& key;
  uint32_t hi;  // position word of the counter
  uint32_t lo;  // stream bits of the counter
  ArgMax best;  // best of the offered entries and the start
  LaneArgMax acc;
  float bound;  // score of the best candidate so far
  int num = 0;
  alignas(64) float cand_v[kGumbelBlock + simd::W];
  alignas(64) int32_t cand_i[kGumbelBlock + simd::W];

  SparseGumbel(const PhiloxKey& k, int64_t position, int stream, ArgMax start)
      : key(k), hi(philox_offset_hi(position)), lo(philox_offset_lo(stream, 0)), best(start), bound(start.value) {}

  static float z_of(float v) { return kLogWeights ? log_f32(v) : v; }

  // The exact score of entry idx with value v, made a candidate (raises the bound).
  void offer(int64_t idx, float v) {
    const uint32_t w = philox_word(key, lo + static_cast<uint32_t>(idx), hi);
    const float s = z_of(v) - gumbel_log_term(philox_uniform(w));
    best = better(best, {s, idx});
    bound = s > bound ? s : bound;
  }

  // Entries with values below this floor cannot reach the bound (rule 1).
  float live_floor() const {
    if (!kLogWeights) return bound - kGumbelBound;
    if (bound == -kInf) return 0.0f;
    const double f = std::exp(static_cast<double>(bound) - static_cast<double>(kGumbelBound)) * (1.0 - 1e-3);
    return static_cast<float>(f);
  }

  // Folded Philox words below this threshold cannot lift an entry of value <= vmax to the bound (rule 2).
  uint32_t word_threshold(float vmax) const {
    const double zmax = kLogWeights ? std::log(static_cast<double>(vmax)) : static_cast<double>(vmax);
    const double e = std::exp(zmax - static_cast<double>(bound) + kGumbelSlack);
    if (!(e < 1.0)) return 0;
    // float(word) rounds by at most 64 and kUniformScale is 2^-31 to 1e-7: 1024 words of margin.
    const double t = (1.0 - e) * 2147483648.0 - 1024.0;
    return t > 0.0 ? static_cast<uint32_t>(t) : 0u;
  }

  // Tests the entries v[0, n) of indices base + i (block maximum vmax, already offered).
  void stage(const float* v, int64_t base, int n, float vmax) {
    const float floor = live_floor();
    if (!live_block(vmax, floor)) return;
    int i = 0;
    for (; i + simd::W <= n; i += simd::W) push(simd::load(v + i), static_cast<int32_t>(base + i), floor);
    for (; i < n; ++i) push_one(v[i], static_cast<int32_t>(base + i), floor);
    flush(word_threshold(vmax));
  }

  bool live_block(float vmax, float floor) const {
    return kLogWeights ? vmax > 0.0f && vmax >= floor : vmax != -kInf && vmax >= floor;
  }

  // Appends the live lanes of x (indices base + lane) to the candidates.
  void push(simd::f32v x, int32_t base, float floor) {
#if defined(__AVX512F__)
    __m512 xv;
    __builtin_memcpy(&xv, &x, sizeof(xv));
    const __mmask16 live = _mm512_cmp_ps_mask(xv, _mm512_set1_ps(floor), _CMP_GE_OQ) &
                           _mm512_cmp_ps_mask(xv, _mm512_set1_ps(kLogWeights ? 0.0f : -kInf), _CMP_NEQ_OQ);
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base),
                                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    _mm512_storeu_ps(cand_v + num, _mm512_maskz_compress_ps(live, xv));
    _mm512_storeu_si512(cand_i + num, _mm512_maskz_compress_epi32(live, idx));
    num += __builtin_popcount(live);
#else
    for (int l = 0; l < simd::W; ++l) push_one(x[l], base + l, floor);
#endif
  }

  void push_one(float x, int32_t idx, float floor) {
    cand_v[num] = x;
    cand_i[num] = idx;
    num += x >= floor && x != (kLogWeights ? 0.0f : -kInf) ? 1 : 0;
  }

  // Philox words of the candidates; exact scores for the groups with a word at or above the threshold.
  void flush(uint32_t threshold) {
    for (int l = 0; l < simd::W; ++l) cand_i[num + l] = 0;  // defined lanes past the last group
    for (int g = 0; g < num; g += simd::W) {
      simd::i32v iv;
      __builtin_memcpy(&iv, cand_i + g, sizeof(iv));
      simd::u32v c;
      __builtin_memcpy(&c, &iv, sizeof(c));
      const simd::u32v w = simd::philox_word(key, c + lo, hi);
      uint32_t hit = simd::ge_mask(simd::fold(w), threshold);
      if (num - g < simd::W) hit &= (1u << (num - g)) - 1u;
      if (hit != 0) exact(g, w, iv);
    }
    num = 0;
  }

  void exact(int g, simd::u32v w, simd::i32v iv) {
    simd::f32v z = simd::load(cand_v + g);
    if (kLogWeights) z = simd::log_f32(z);
    simd::f32v s = z - simd::log_f32(-simd::log_f32(simd::philox_uniform(w)));
    for (int l = num - g; l < simd::W; ++l) {
      s[l] = -kInf;  // lanes past the candidates
      iv[l] = INT32_MAX;
    }
    acc.update(s, iv);
    const float m = acc.max();
    bound = m > bound ? m : bound;
  }

  ArgMax result() const { return better(best, acc.result()); }
};

SPECDEC_NS_END
