// The row-wise pieces of one Qwen3 decoder-layer step against a per-request KV cache, framework-free:
// RMSNorm, per-head RMSNorm + rotary embedding, cached causal attention, SwiGLU. The projections are
// matrix products the binding hands to the BLAS (csrc/cpu/decoder_step_cpu.cpp).
//
// Sized for drafter heads: tens of requests x a few new tokens x head_dim 64..128, where one fused call
// replaces ~40 framework ops whose dispatch costs more than their arithmetic. Float32 throughout.
// Dot products keep 16 independent partial sums, so they vectorise without reassociation flags; the
// binding's loops are compiled once per instruction set and inline these.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace specdec::step {

inline constexpr int kLanes = 16;

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[d] = x[d] / sqrt(mean(x^2) + eps) * w[d]; y may alias x.
inline void rms_norm(const float* x, const float* w, float* y, int64_t dim, float eps) {
  const float inv = 1.0f / std::sqrt(dot(x, x, dim) / static_cast<float>(dim) + eps);
  for (int64_t d = 0; d < dim; ++d) y[d] = x[d] * inv * w[d];
}

// Rotary embedding in the interleaved layout: dims (2j, 2j + 1) rotate by angle j; cos_sin is
// [dim / 2, 2] (cos, sin) for this token's position.
inline void rotate_pairs(float* x, const float* cos_sin, int64_t dim) {
  for (int64_t j = 0; j < dim / 2; ++j) {
    const float c = cos_sin[2 * j], s = cos_sin[2 * j + 1];
    const float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = a * c - b * s;
    x[2 * j + 1] = a * s + b * c;
  }
}

// o[D] = softmax(q . K[0..len) * scale) @ V[0..len); keys/values rows are D floats apart.
// scores: scratch of at least len floats.
inline void attend(const float* q, const float* keys, const float* values, int64_t len, int64_t dim, float scale,
                   float* scores, float* o) {
  float m = -INFINITY;
  for (int64_t t = 0; t < len; ++t) {
    scores[t] = dot(q, keys + t * dim, dim) * scale;
    m = scores[t] > m ? scores[t] : m;
  }
  float total = 0.0f;
  for (int64_t t = 0; t < len; ++t) {
    scores[t] = std::exp(scores[t] - m);
    total += scores[t];
  }
  for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
  for (int64_t t = 0; t < len; ++t) {
    const float p = scores[t] / total;
    const float* v = values + t * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] += p * v[d];
  }
}

// out[i] = silu(gate_up[i]) * gate_up[inter + i] for one row of [2 * inter] (gate first, then up).
inline void silu_mul(const float* gate_up, float* out, int64_t inter) {
  for (int64_t i = 0; i < inter; ++i) {
    const float g = gate_up[i];
    out[i] = g / (1.0f + std::exp(-g)) * gate_up[inter + i];
  }
}

}  // namespace specdec::step
