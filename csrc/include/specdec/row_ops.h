// Vocabulary-range operations on one row: the hot loops of every host kernel. Compiled once per
// instruction set (csrc/cpu/row_ops.cpp) and reached through the RowKernels table (types.h), so that
// the walks in chain.h / tree.h stay generic. W-lane SIMD from simd.h; exact same arithmetic as the
// scalar functions of math.h / philox.h, so results do not depend on the instruction set.
#pragma once

#include <cstdint>

#include "common.h"
#include "math.h"
#include "philox.h"
#include "simd.h"
#include "types.h"

SPECDEC_NS_BEGIN

inline constexpr int kChunk = 64;  // elements per pruning / argmax chunk (a multiple of simd::W)
static_assert(kChunk % simd::W == 0, "chunk must hold whole SIMD vectors");

inline float chunk_max(const float* z, int n) {
  float m = -kInf;
  int i = 0;
  if (n == kChunk) {
    simd::f32v lane = simd::load(z);
    for (i = simd::W; i < kChunk; i += simd::W) {
      const simd::f32v x = simd::load(z + i);
      lane = x > lane ? x : lane;
    }
    for (int l = 0; l < simd::W; ++l) m = lane[l] > m ? lane[l] : m;
    return m;
  }
  for (; i < n; ++i) m = z[i] > m ? z[i] : m;
  return m;
}

// Chunk max and the first index reaching it.
inline ArgMax chunk_argmax(const float* s, int n, int64_t base) {
  const float m = chunk_max(s, n);
  int first = 0;
  while (first < n && !(s[first] == m)) ++first;
  if (first == n) first = 0;
  return {m, base + first};
}

inline ArgMax better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

template <DType D>
inline void load_chunk(const void* row, int64_t base, int n, float* out) {
  const auto* p = static_cast<const typename Elem<D>::type*>(row) + base;
  for (int i = 0; i < n; ++i) out[i] = Elem<D>::load(p, i);
}

// Lane-wise running argmax: lane l holds the best (value, first index) among the elements it saw.
// Indices increase with every update, so strict > keeps the first index of each lane's maximum.
struct LaneArgMax {
  simd::f32v value;
  simd::i32v index;

  LaneArgMax() {
    value = simd::f32v{} - kInf;
    index = simd::i32v{};
  }
  void update(simd::f32v x, int32_t base) {
    const simd::i32v take = x > value;
    value = take ? x : value;
    index = take ? simd::iota_i32() + base : index;
  }
  // Arbitrary indices (compacted candidates): ties go to the lower index whatever the order.
  void update(simd::f32v x, simd::i32v idx) {
    const simd::i32v take = (x > value) | ((x == value) & (idx < index));
    value = take ? x : value;
    index = take ? idx : index;
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

inline simd::f32v sanitize_v(simd::f32v z) {
  z = z != z ? -kInf : z;
  return (z > kFloat32Max ? kFloat32Max : z) + 0.0f;
}

// Greedy: argmax of the sanitized logits over [v0, v1).
template <DType D>
ArgMax greedy_argmax_t(const void* row, int64_t v0, int64_t v1) {
  LaneArgMax acc;
  alignas(64) float s[simd::W];
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    load_chunk<D>(row, v, simd::W, s);
    acc.update(sanitize_v(simd::load(s)), static_cast<int32_t>(v));
  }
  ArgMax best = acc.result();
  for (; v < v1; ++v) {
    const float x = sanitize(Elem<D>::load(static_cast<const typename Elem<D>::type*>(row), v));
    if (x > best.value) best = {x, v};
  }
  return best;
}

// z = sanitize(logit / temperature) into z[v0, v1); returns the max (first index).
template <DType D>
ArgMax scale_row_t(const void* row, float temperature, float* z, int64_t v0, int64_t v1) {
  LaneArgMax acc;
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    load_chunk<D>(row, v, simd::W, z + v);
    const simd::f32v x = sanitize_v(simd::load(z + v) / temperature);
    simd::store(z + v, x);
    acc.update(x, static_cast<int32_t>(v));
  }
  ArgMax best = acc.result();
  for (; v < v1; ++v) {
    z[v] = sanitize(Elem<D>::load(static_cast<const typename Elem<D>::type*>(row), v) / temperature);
    if (z[v] > best.value) best = {z[v], v};
  }
  return best;
}

// log(-log u_v) for v in [base, base + kChunk) on one (seed, position, stream); lanes past the
// vocabulary are computed and ignored by the callers.
inline void gumbel_terms(const PhiloxKey& key, uint32_t hi, int stream, int64_t base, float* out) {
  const uint32_t lo = philox_offset_lo(stream, static_cast<uint32_t>(base));
  for (int i = 0; i < kChunk; i += simd::W) {
    const simd::u32v w = simd::philox_word(key, simd::iota() + (lo + static_cast<uint32_t>(i)), hi);
    simd::store(out + i, simd::log_f32(-simd::log_f32(simd::philox_uniform(w))));
  }
}

// Copies z[base, base + n) into a full chunk padded with -inf.
inline const float* padded_chunk(const float* z, int64_t base, int n, float* buf) {
  if (n == kChunk) return z + base;
  for (int i = 0; i < n; ++i) buf[i] = z[base + i];
  for (int i = n; i < kChunk; ++i) buf[i] = -kInf;
  return buf;
}

// argmax_v z_v - log(-log u_v) over [v0, v1), starting from `start` (a real candidate anywhere in the
// row, or the initial value). Elements with z + kGumbelBound below the running best cannot win and get
// no Philox draw: whole chunks are skipped, and sparse survivors of a chunk are compacted into full
// SIMD vectors, so peaked rows cost little more than one read.
struct GumbelSearch {
  const PhiloxKey& key;
  uint32_t hi;
  uint32_t lo;  // stream bits of the counter
  LaneArgMax acc;
  float bound;
  alignas(64) float cand_z[kChunk];
  alignas(64) int32_t cand_i[kChunk];
  int num_cand = 0;

  void flush() {
    for (int g = 0; g < num_cand; g += simd::W) {
      simd::f32v zv;
      simd::i32v iv;
      for (int l = 0; l < simd::W; ++l) {
        const bool live = g + l < num_cand;
        zv[l] = live ? cand_z[g + l] : -kInf;
        iv[l] = live ? cand_i[g + l] : 0;
      }
      const simd::u32v w = simd::philox_word(key, reinterpret_cast<const simd::u32v&>(iv) + lo, hi);
      acc.update(zv - simd::log_f32(-simd::log_f32(simd::philox_uniform(w))), iv);
    }
    num_cand = 0;
    const float m = acc.max();
    bound = m > bound ? m : bound;
  }
};

inline ArgMax gumbel_argmax_impl(const float* z, const PhiloxKey& key, int64_t position, int stream, int64_t v0,
                                 int64_t v1, ArgMax start) {
  GumbelSearch s{key, philox_offset_hi(position), philox_offset_lo(stream, 0), LaneArgMax(), start.value};
  alignas(64) float g[kChunk];
  alignas(64) float pad[kChunk];
  for (int64_t base = v0; base < v1; base += kChunk) {
    const int n = static_cast<int>(v1 - base < kChunk ? v1 - base : kChunk);
    const float* zc = padded_chunk(z, base, n, pad);
    const float cm = chunk_max(zc, kChunk);
    if (cm == -kInf || cm + kGumbelBound < s.bound) continue;
    const float floor = s.bound - kGumbelBound;  // z below this cannot reach the bound
    simd::i32v live_v = {};
    for (int i = 0; i < kChunk; i += simd::W) {
      const simd::f32v x = simd::load(zc + i);
      live_v -= (x >= floor) & (x != -kInf);  // true lanes are -1
    }
    int live = 0;
    for (int l = 0; l < simd::W; ++l) live += live_v[l];
    if (live > kChunk / 4) {
      s.flush();  // keep lane indices increasing for the dense update
      gumbel_terms(key, s.hi, stream, base, g);
      for (int i = 0; i < kChunk; i += simd::W) {
        s.acc.update(simd::load(zc + i) - simd::load(g + i), static_cast<int32_t>(base + i));
      }
      const float m = s.acc.max();
      s.bound = m > s.bound ? m : s.bound;
      continue;
    }
    if (s.num_cand + live > kChunk) s.flush();
    for (int i = 0; i < kChunk; ++i) {
      if (zc[i] >= floor && zc[i] != -kInf) {
        s.cand_z[s.num_cand] = zc[i];
        s.cand_i[s.num_cand] = static_cast<int32_t>(base + i);
        ++s.num_cand;
      }
    }
  }
  s.flush();
  return better(start, s.acc.result());
}

// Sum of exp(z - m) over [v0, v1), accumulated in double.
inline double sum_exp_impl(const float* z, float m, int64_t v0, int64_t v1) {
  simd::f64v acc = {};
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    acc += __builtin_convertvector(simd::exp_f32(simd::load(z + v) - m), simd::f64v);
  }
  double tail = 0.0;
  for (; v < v1; ++v) tail += static_cast<double>(exp_f32(z[v] - m));
  double total = 0.0;
  for (int l = 0; l < simd::W; ++l) total += acc[l];
  return total + tail;
}

// Recovery sample from norm(max(0, p - q)) with p = softmax(z) (one-hot 0 when m = -inf):
// argmax_v log(max(0, p_v - q_v)) - log(-log u_v) on the recovery stream.
template <DType Q>
ResidualResult residual_argmax_t(const float* z, float m, float total, const void* q, const PhiloxKey& key,
                                 int64_t position, int64_t v0, int64_t v1) {
  const uint32_t hi = philox_offset_hi(position);
  ResidualResult res{kArgMaxInit, false};
  LaneArgMax acc;
  alignas(64) float r[kChunk];
  alignas(64) float g[kChunk];
  const bool finite = m != -kInf;
  for (int64_t base = v0; base < v1; base += kChunk) {
    const int n = static_cast<int>(v1 - base < kChunk ? v1 - base : kChunk);
    load_chunk<Q>(q, base, n, g);
    if (finite && n == kChunk) {
      for (int i = 0; i < kChunk; i += simd::W) {
        const simd::f32v p = simd::exp_f32(simd::load(z + base + i) - m) / total;
        const simd::f32v d = p - simd::load(g + i);
        simd::store(r + i, d > 0.0f ? d : 0.0f);
      }
    } else {
      for (int i = 0; i < n; ++i) {
        const int64_t v = base + i;
        const float p = finite ? exp_f32(z[v] - m) / total : (v == 0 ? 1.0f : 0.0f);
        const float d = p - g[i];
        r[i] = d > 0.0f ? d : 0.0f;
      }
    }
    if (!(chunk_max(r, n) > 0.0f)) continue;
    res.any_positive = true;
    for (int i = n; i < kChunk; ++i) r[i] = 0.0f;
    gumbel_terms(key, hi, kStreamRecovery, base, g);
    for (int i = 0; i < kChunk; i += simd::W) {
      acc.update(simd::log_f32(simd::load(r + i)) - simd::load(g + i), static_cast<int32_t>(base + i));
    }
  }
  res.best = acc.result();
  return res;
}

// argmax_v log(w_v) - log(-log u_v) for nonnegative weights w (log 0 = -inf): Gumbel-max sampling
// from norm(w), with the float32 log of the reference.
inline ArgMax log_gumbel_argmax_impl(const float* w, const PhiloxKey& key, int64_t position, int stream, int64_t v0,
                                     int64_t v1) {
  const uint32_t hi = philox_offset_hi(position);
  alignas(64) float g[kChunk];
  alignas(64) float r[kChunk];
  LaneArgMax acc;
  for (int64_t base = v0; base < v1; base += kChunk) {
    const int n = static_cast<int>(v1 - base < kChunk ? v1 - base : kChunk);
    for (int i = 0; i < n; ++i) r[i] = w[base + i];
    for (int i = n; i < kChunk; ++i) r[i] = 0.0f;
    if (!(chunk_max(r, kChunk) > 0.0f)) continue;
    gumbel_terms(key, hi, stream, base, g);
    for (int i = 0; i < kChunk; i += simd::W) {
      acc.update(simd::log_f32(simd::load(r + i)) - simd::load(g + i), static_cast<int32_t>(base + i));
    }
  }
  return acc.result();
}

// The table entries (dtype switches outside the loops).
inline ArgMax greedy_argmax_any(const void* row, DType d, int64_t v0, int64_t v1) {
  switch (d) {
    case DType::kBFloat16: return greedy_argmax_t<DType::kBFloat16>(row, v0, v1);
    case DType::kFloat16: return greedy_argmax_t<DType::kFloat16>(row, v0, v1);
    default: return greedy_argmax_t<DType::kFloat32>(row, v0, v1);
  }
}

inline ArgMax scale_row_any(const void* row, DType d, float temperature, float* z, int64_t v0, int64_t v1) {
  switch (d) {
    case DType::kBFloat16: return scale_row_t<DType::kBFloat16>(row, temperature, z, v0, v1);
    case DType::kFloat16: return scale_row_t<DType::kFloat16>(row, temperature, z, v0, v1);
    default: return scale_row_t<DType::kFloat32>(row, temperature, z, v0, v1);
  }
}

inline ResidualResult residual_argmax_any(const float* z, float m, float total, const void* q, DType qd,
                                          const PhiloxKey& key, int64_t position, int64_t v0, int64_t v1) {
  switch (qd) {
    case DType::kBFloat16: return residual_argmax_t<DType::kBFloat16>(z, m, total, q, key, position, v0, v1);
    case DType::kFloat16: return residual_argmax_t<DType::kFloat16>(z, m, total, q, key, position, v0, v1);
    default: return residual_argmax_t<DType::kFloat32>(z, m, total, q, key, position, v0, v1);
  }
}

inline RowKernels make_row_kernels() {
  RowKernels k;
  k.greedy_argmax = greedy_argmax_any;
  k.scale_row = scale_row_any;
  k.gumbel_argmax = gumbel_argmax_impl;
  k.sum_exp = sum_exp_impl;
  k.residual_argmax = residual_argmax_any;
  k.log_gumbel_argmax = log_gumbel_argmax_impl;
  return k;
}

SPECDEC_NS_END
