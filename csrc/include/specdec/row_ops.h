// Vocabulary-range operations on one row: the hot loops of every host kernel. Compiled once per
// instruction set (csrc/cpu/row_ops.cpp) and reached through the RowKernels table (types.h), so that
// the walks in chain.h / tree.h stay generic. W-lane SIMD from simd.h; exact same arithmetic as the
// scalar functions of math.h / philox.h, so results do not depend on the instruction set.
#pragma once

#include <cstdint>

#include "common.h"
#include "gumbel.h"
#include "math.h"
#include "philox.h"
#include "simd.h"
#include "types.h"

SPECDEC_NS_BEGIN

template <DType D>
inline void load_chunk(const void* row, int64_t base, int n, float* out) {
  const auto* p = static_cast<const typename Elem<D>::type*>(row) + base;
  for (int i = 0; i < n; ++i) out[i] = Elem<D>::load(p, i);
}

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

// argmax_v z_v - log(-log u_v) over [v0, v1) of a scaled row z, starting from `start` (a real
// candidate anywhere in the row, or the initial value). Sparse: see gumbel.h.
inline ArgMax gumbel_argmax_impl(const float* z, const PhiloxKey& key, int64_t position, int stream, int64_t v0,
                                 int64_t v1, ArgMax start) {
  SparseGumbel<false> s(key, position, stream, start);
  for (int64_t base = v0; base < v1; base += kGumbelBlock) {
    const int n = static_cast<int>(v1 - base < kGumbelBlock ? v1 - base : kGumbelBlock);
    const float m = block_max(z + base, n);
    if (m != -kInf) s.offer(base + find_first(z + base, n, m), m);
    s.stage(z + base, base, n, m);
  }
  return s.result();
}

// The same sample straight from the logits, z = sanitize(logit / temperature) computed block by block
// into L1 (rows without top-k / top-p): one pass over the row.
template <DType D>
ArgMax gumbel_argmax_logits_t(const void* row, float temperature, const PhiloxKey& key, int64_t position,
                              int stream, int64_t v0, int64_t v1, ArgMax start) {
  SparseGumbel<false> s(key, position, stream, start);
  alignas(64) float z[simd::W];
  const auto* p = static_cast<const typename Elem<D>::type*>(row);
  for (int64_t base = v0; base < v1; base += kGumbelBlock) {
    const int n = static_cast<int>(v1 - base < kGumbelBlock ? v1 - base : kGumbelBlock);
    const float floor = s.live_floor();
    // One pass: scale, block maximum, and the live entries straight into the candidates.
    simd::f32v lane = simd::f32v{} - kInf;
    int i = 0;
    for (; i + simd::W <= n; i += simd::W) {
      load_chunk<D>(row, base + i, simd::W, z);
      const simd::f32v x = sanitize_v(simd::load(z) / temperature);
      lane = x > lane ? x : lane;
      s.push(x, static_cast<int32_t>(base + i), floor);
    }
    float m = -kInf;
    for (int l = 0; l < simd::W; ++l) m = lane[l] > m ? lane[l] : m;
    for (; i < n; ++i) {
      const float x = sanitize(Elem<D>::load(p, base + i) / temperature);
      m = x > m ? x : m;
      s.push_one(x, static_cast<int32_t>(base + i), floor);
    }
    if (!s.live_block(m, floor)) {
      s.num = 0;
      continue;
    }
    // The block maximum is a candidate (m >= floor); the first one in index order seeds the bound.
    const int at = find_first(s.cand_v, s.num, m);
    s.offer(s.cand_i[at], m);
    s.flush(s.word_threshold(m));
  }
  return s.result();
}

// w_v = exp(z_v - m) written over z[v0, v1) (the softmax numerators); returns their sum in double.
inline double softmax_weights_impl(float* z, float m, int64_t v0, int64_t v1) {
  simd::f64v acc = {};
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    const simd::f32v w = simd::exp_f32(simd::load(z + v) - m);
    simd::store(z + v, w);
    acc += __builtin_convertvector(w, simd::f64v);
  }
  double tail = 0.0;
  for (; v < v1; ++v) {
    z[v] = exp_f32(z[v] - m);
    tail += static_cast<double>(z[v]);
  }
  double total = 0.0;
  for (int l = 0; l < simd::W; ++l) total += acc[l];
  return total + tail;
}

// Recovery sample from norm(max(0, p - q)) with p = w / total (w from softmax_weights; w = nullptr:
// p one-hot at 0, the all -inf row): argmax_v log(max(0, p_v - q_v)) - log(-log u_v) on the recovery
// stream, sparse (gumbel.h).
template <DType Q>
ResidualResult residual_argmax_t(const float* w, float total, const void* q, const PhiloxKey& key,
                                 int64_t position, int64_t v0, int64_t v1) {
  SparseGumbel<true> s(key, position, kStreamRecovery, kArgMaxInit);
  alignas(64) float r[kGumbelBlock];
  bool any_positive = false;
  for (int64_t base = v0; base < v1; base += kGumbelBlock) {
    const int n = static_cast<int>(v1 - base < kGumbelBlock ? v1 - base : kGumbelBlock);
    load_chunk<Q>(q, base, n, r);
    int i = 0;
    simd::f32v lane = {};
    if (w != nullptr) {
      for (; i + simd::W <= n; i += simd::W) {
        const simd::f32v d = simd::load(w + base + i) / total - simd::load(r + i);
        const simd::f32v x = d > 0.0f ? d : 0.0f;
        simd::store(r + i, x);
        lane = x > lane ? x : lane;
      }
    }
    float m = 0.0f;
    for (int l = 0; l < simd::W; ++l) m = lane[l] > m ? lane[l] : m;
    for (; i < n; ++i) {
      const int64_t v = base + i;
      const float p = w != nullptr ? w[v] / total : (v == 0 ? 1.0f : 0.0f);
      const float d = p - r[i];
      r[i] = d > 0.0f ? d : 0.0f;
      m = r[i] > m ? r[i] : m;
    }
    if (!(m > 0.0f)) continue;
    any_positive = true;
    s.offer(base + find_first(r, n, m), m);
    s.stage(r, base, n, m);
  }
  return {s.result(), any_positive};
}

// argmax_v log(w_v) - log(-log u_v) for nonnegative weights w (log 0 = -inf): Gumbel-max sampling
// from norm(w), with the float32 log of the reference. Sparse (gumbel.h).
inline ArgMax log_gumbel_argmax_impl(const float* w, const PhiloxKey& key, int64_t position, int stream, int64_t v0,
                                     int64_t v1) {
  SparseGumbel<true> s(key, position, stream, kArgMaxInit);
  for (int64_t base = v0; base < v1; base += kGumbelBlock) {
    const int n = static_cast<int>(v1 - base < kGumbelBlock ? v1 - base : kGumbelBlock);
    const float m = block_max(w + base, n);
    if (!(m > 0.0f)) continue;
    s.offer(base + find_first(w + base, n, m), m);
    s.stage(w + base, base, n, m);
  }
  return s.result();
}

// out_v = max(0, w * (e_v / total) - q_v) over [v0, v1) (q = nullptr: q_v = 0), with the reference's
// float32 operations in its order (reference/block.py residual_row, reference/traversal.py); returns the
// sum of out in double.
template <DType Q>
double weighted_residual_t(const float* e, float total, float w, const void* q, float* out, int64_t v0, int64_t v1) {
  simd::f64v acc = {};
  alignas(64) float qs[simd::W];
  int64_t v = v0;
  for (; v + simd::W <= v1; v += simd::W) {
    simd::f32v qv = {};
    if (q != nullptr) {
      load_chunk<Q>(q, v, simd::W, qs);
      qv = simd::load(qs);
    }
    const simd::f32v d = w * (simd::load(e + v) / total) - qv;
    const simd::f32v x = d > 0.0f ? d : 0.0f;
    simd::store(out + v, x);
    acc += __builtin_convertvector(x, simd::f64v);
  }
  double tail = 0.0;
  for (; v < v1; ++v) {
    const float qv = q != nullptr ? Elem<Q>::load(static_cast<const typename Elem<Q>::type*>(q), v) : 0.0f;
    const float d = w * (e[v] / total) - qv;
    out[v] = d > 0.0f ? d : 0.0f;
    tail += static_cast<double>(out[v]);
  }
  double sum = 0.0;
  for (int l = 0; l < simd::W; ++l) sum += acc[l];
  return sum + tail;
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

inline ArgMax gumbel_argmax_logits_any(const void* row, DType d, float temperature, const PhiloxKey& key,
                                       int64_t position, int stream, int64_t v0, int64_t v1, ArgMax start) {
  switch (d) {
    case DType::kBFloat16:
      return gumbel_argmax_logits_t<DType::kBFloat16>(row, temperature, key, position, stream, v0, v1, start);
    case DType::kFloat16:
      return gumbel_argmax_logits_t<DType::kFloat16>(row, temperature, key, position, stream, v0, v1, start);
    default: return gumbel_argmax_logits_t<DType::kFloat32>(row, temperature, key, position, stream, v0, v1, start);
  }
}

inline ResidualResult residual_argmax_any(const float* w, float total, const void* q, DType qd, const PhiloxKey& key,
                                          int64_t position, int64_t v0, int64_t v1) {
  switch (qd) {
    case DType::kBFloat16: return residual_argmax_t<DType::kBFloat16>(w, total, q, key, position, v0, v1);
    case DType::kFloat16: return residual_argmax_t<DType::kFloat16>(w, total, q, key, position, v0, v1);
    default: return residual_argmax_t<DType::kFloat32>(w, total, q, key, position, v0, v1);
  }
}

inline double weighted_residual_any(const float* e, float total, float w, const void* q, DType qd, float* out,
                                    int64_t v0, int64_t v1) {
  switch (qd) {
    case DType::kBFloat16: return weighted_residual_t<DType::kBFloat16>(e, total, w, q, out, v0, v1);
    case DType::kFloat16: return weighted_residual_t<DType::kFloat16>(e, total, w, q, out, v0, v1);
    default: return weighted_residual_t<DType::kFloat32>(e, total, w, q, out, v0, v1);
  }
}

inline RowKernels make_row_kernels() {
  RowKernels k;
  k.greedy_argmax = greedy_argmax_any;
  k.scale_row = scale_row_any;
  k.gumbel_argmax = gumbel_argmax_impl;
  k.gumbel_argmax_logits = gumbel_argmax_logits_any;
  k.softmax_weights = softmax_weights_impl;
  k.residual_argmax = residual_argmax_any;
  k.log_gumbel_argmax = log_gumbel_argmax_impl;
  k.weighted_residual = weighted_residual_any;
  return k;
}

SPECDEC_NS_END
