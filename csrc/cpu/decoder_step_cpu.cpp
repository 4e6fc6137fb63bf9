// Torch binding of the fused decoder-layer step (csrc/include/specdec/host/decoder_step.h): checks shapes,
// runs the projections as BLAS matrix products and the row-wise pieces in OpenMP loops.
//
// One call = one Qwen3 decoder layer over n new tokens per request against the request's KV cache,
// then the final RMSNorm and LM head: what a one-layer drafter head (EAGLE-3, MTP) runs per draft step.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "checks.h"
#include "specdec/host/decoder_step.h"

namespace specdec {
namespace {

#if defined(SPECDEC_HAVE_X86_ISAS) && defined(__GNUC__) && !defined(__clang__)
#define SPECDEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SPECDEC_CLONES
#endif

void check(const at::Tensor& t, const char* name, at::ScalarType dtype, std::vector<int64_t> shape) {
  checks::on_device(t, name, at::Device(at::kCPU));
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(shape), name, " must have shape ", at::IntArrayRef(shape), ", got ",
                    t.sizes());
}

// The loops below are compiled once per instruction set (target_clones) and run over a range of rows
// handed out by at::parallel_for (a lambda would be compiled for the baseline only).
SPECDEC_CLONES
void norm_range(const float* x, const float* w, float* y, int64_t dim, float eps, int64_t b, int64_t e) {
  for (int64_t m = b; m < e; ++m) step::rms_norm(x + m * dim, w, y + m * dim, dim, eps);
}

void norm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) { norm_range(x, w, y, dim, eps, b, e); });
}

struct Shapes {
  int64_t reqs, n, heads, kv_heads, head_dim;
};

// q/k per-head RMSNorm + rotary embedding in place in qkv [M, (heads + 2 kv_heads) D]; new keys and
// values written to the cache at slot start + i of their request's cache row.
struct StepPtrs {
  float* qkv;
  const float* q_norm;
  const float* k_norm;
  const float* rope;  // [P, D / 2, 2]
  const int64_t* rows;
  const int64_t* start;
  const int64_t* depth;
  float* k_cache;  // [B, kv_heads, S, D]
  float* v_cache;
  int64_t cache_len;
  float eps;
};

SPECDEC_CLONES
void rope_and_store_range(const Shapes& s, const StepPtrs& p, int64_t b, int64_t e) {
  const int64_t d = s.head_dim, width = (s.heads + 2 * s.kv_heads) * d;
  for (int64_t m = b; m < e; ++m) {
    const int64_t r = m / s.n, i = m % s.n;
    const float* cs = p.rope + (p.start[r] + p.depth[m]) * d;  // this token's position
    float* row = p.qkv + m * width;
    for (int64_t h = 0; h < s.heads; ++h) {
      step::rms_norm(row + h * d, p.q_norm, row + h * d, d, p.eps);
      step::rotate_pairs(row + h * d, cs, d);
    }
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      float* k = row + (s.heads + h) * d;
      step::rms_norm(k, p.k_norm, k, d, p.eps);
      step::rotate_pairs(k, cs, d);
      const int64_t at = ((p.rows[r] * s.kv_heads + h) * p.cache_len + p.start[r] + i) * d;
      std::memcpy(p.k_cache + at, k, d * sizeof(float));
      std::memcpy(p.v_cache + at, row + (s.heads + s.kv_heads + h) * d, d * sizeof(float));
    }
  }
}

// o [M, heads D]: new token i of request r attends to its cache slots [0, start + i] (causal by slot).
// Work items t = (request, query head); scores: scratch of cache_len floats.
SPECDEC_CLONES
void attend_range(const Shapes& s, const StepPtrs& p, float* o, float* scores, int64_t b, int64_t e) {
  const int64_t d = s.head_dim, width = (s.heads + 2 * s.kv_heads) * d, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t t = b; t < e; ++t) {
    const int64_t r = t / s.heads, h = t % s.heads;
    const int64_t base = (p.rows[r] * s.kv_heads + h / group) * p.cache_len * d;
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t m = r * s.n + i;
      step::attend(p.qkv + m * width + h * d, p.k_cache + base, p.v_cache + base, p.start[r] + i + 1, d, scale,
                   scores, o + (m * s.heads + h) * d);
    }
  }
}

SPECDEC_CLONES
void silu_mul_range(const float* gate_up, float* out, int64_t inter, int64_t b, int64_t e) {
  for (int64_t m = b; m < e; ++m) step::silu_mul(gate_up + m * 2 * inter, out + m * inter, inter);
}

}  // namespace

// Weights, in order: input_layernorm [H], qkv [(heads + 2 kv_heads) D, H] (q/k rows interleaved for
// rotate_pairs), q_norm [D], k_norm [D], o_proj [H, heads D], post_attention_layernorm [H],
// gate_up [2 I, H] (gate rows first), down [H, I], final norm [H], lm_head [V, H]. qkv_add (optional)
// [R, n, (heads + 2 kv_heads) D] is added to the q/k/v projection (an EAGLE-3 layer's token half).
std::tuple<at::Tensor, at::Tensor> decoder_step_cpu(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                                     at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& rows,
                                                     const at::Tensor& start, const at::Tensor& depth,
                                                     const at::Tensor& rope, int64_t num_heads, double eps,
                                                     const std::optional<at::Tensor>& qkv_add) {
  // Sizes come from real tensors (their products cannot overflow); num_heads and the index tensors'
  // values are the caller's, so every bound below is checked without computing a sum that could.
  TORCH_CHECK_VALUE(x.dim() == 3, "x must be [R, n, H], got ", x.sizes());
  TORCH_CHECK_VALUE(weights.size() == 10, "weights must hold 10 tensors, got ", weights.size());
  TORCH_CHECK_VALUE(k_cache.dim() == 4, "k_cache must be [B, kv_heads, S, D], got ", k_cache.sizes());
  const int64_t reqs = x.size(0), n = x.size(1), hidden = x.size(2);
  const int64_t batch = k_cache.size(0), kv_heads = k_cache.size(1), cache_len = k_cache.size(2);
  const int64_t d = k_cache.size(3);
  TORCH_CHECK_VALUE(d > 0 && d % 2 == 0, "head_dim (k_cache.size(3)) must be positive and even, got ", d);
  const at::Tensor& w_qkv = weights[1];
  const at::Tensor& w_gu = weights[6];
  const at::Tensor& lm_head = weights[9];
  TORCH_CHECK_VALUE(w_qkv.dim() == 2, "qkv weight must be [(heads + 2 kv_heads) D, H], got ", w_qkv.sizes());
  TORCH_CHECK_VALUE(num_heads > 0 && kv_heads > 0 && num_heads % kv_heads == 0,
                    "num_heads must be a positive multiple of the cache's kv_heads (", kv_heads, "), got ", num_heads);
  TORCH_CHECK_VALUE(num_heads <= w_qkv.size(0) / d, "num_heads = ", num_heads, " does not fit the qkv weight ",
                    w_qkv.sizes(), " (head_dim ", d, ")");
  TORCH_CHECK_VALUE(w_gu.dim() == 2 && w_gu.size(0) % 2 == 0, "gate_up weight must be [2 I, H], got ", w_gu.sizes());
  TORCH_CHECK_VALUE(lm_head.dim() == 2, "lm_head weight must be [V, H], got ", lm_head.sizes());
  const int64_t inter = w_gu.size(0) / 2, vocab = lm_head.size(0);
  check(x, "x", at::kFloat, {reqs, n, hidden});
  check(weights[0], "input_layernorm weight", at::kFloat, {hidden});
  check(w_qkv, "qkv weight", at::kFloat, {(num_heads + 2 * kv_heads) * d, hidden});
  check(weights[2], "q_norm weight", at::kFloat, {d});
  check(weights[3], "k_norm weight", at::kFloat, {d});
  check(weights[4], "o_proj weight", at::kFloat, {hidden, num_heads * d});
  check(weights[5], "post_attention_layernorm weight", at::kFloat, {hidden});
  check(w_gu, "gate_up weight", at::kFloat, {2 * inter, hidden});
  check(weights[7], "down weight", at::kFloat, {hidden, inter});
  check(weights[8], "final norm weight", at::kFloat, {hidden});
  check(lm_head, "lm_head weight", at::kFloat, {vocab, hidden});
  check(k_cache, "k_cache", at::kFloat, {batch, kv_heads, cache_len, d});
  check(v_cache, "v_cache", at::kFloat, {batch, kv_heads, cache_len, d});
  check(rows, "rows", at::kLong, {reqs});
  check(start, "start", at::kLong, {reqs});
  check(depth, "depth", at::kLong, {reqs, n});
  TORCH_CHECK_VALUE(rope.dim() == 3 && rope.size(1) == d / 2 && rope.size(2) == 2,
                    "rope must be [P, head_dim / 2, 2], got ", rope.sizes());
  check(rope, "rope", at::kFloat, {rope.size(0), d / 2, 2});
  if (qkv_add.has_value()) check(*qkv_add, "qkv_add", at::kFloat, {reqs, n, (num_heads + 2 * kv_heads) * d});
  const int64_t num_positions = rope.size(0);
  const int64_t* rw = rows.data_ptr<int64_t>();
  const int64_t* st = start.data_ptr<int64_t>();
  const int64_t* dp = depth.data_ptr<int64_t>();
  for (int64_t r = 0; r < reqs; ++r) {
    TORCH_CHECK_VALUE(rw[r] >= 0 && rw[r] < batch, "rows[", r, "] = ", rw[r], " is outside the cache batch ", batch);
    TORCH_CHECK_VALUE(st[r] >= 0, "start[", r, "] = ", st[r], " must be >= 0");
    if (st[r] > cache_len - n) {
      const bool fits = st[r] <= std::numeric_limits<int64_t>::max() - n;
      TORCH_CHECK_VALUE(false, "start[", r, "] + n = ",
                        fits ? std::to_string(st[r] + n) : std::to_string(st[r]) + " + " + std::to_string(n),
                        " exceeds the cache length ", cache_len);
    }
    for (int64_t i = 0; i < n; ++i) {
      // 0 <= start <= S here, so neither bound below overflows.
      const int64_t dep = dp[r * n + i];
      TORCH_CHECK_VALUE(dep >= -st[r] && dep < num_positions - st[r], "start[", r, "] + depth[", r, ", ", i,
                        "] = ", st[r], " + ", dep, " is outside the rope table (", num_positions, " positions)");
    }
  }
  const Shapes s{reqs, n, num_heads, kv_heads, d};
  const int64_t rows_m = reqs * n;
  const float e = static_cast<float>(eps);

  at::Tensor res = x.reshape({rows_m, hidden}).clone();  // the residual stream
  at::Tensor h = at::empty_like(res);
  norm_rows(res.data_ptr<float>(), weights[0].data_ptr<float>(), h.data_ptr<float>(), rows_m, hidden, e);
  at::Tensor qkv = qkv_add.has_value() ? at::addmm(qkv_add->reshape({rows_m, w_qkv.size(0)}), h, w_qkv.t())
                                        : at::mm(h, w_qkv.t());
  const StepPtrs p{qkv.data_ptr<float>(), weights[2].data_ptr<float>(), weights[3].data_ptr<float>(),
                   rope.data_ptr<float>(), rw, st, dp, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                   cache_len, e};
  at::parallel_for(0, rows_m, 16, [&](int64_t b, int64_t f) { rope_and_store_range(s, p, b, f); });
  at::Tensor o = at::empty({rows_m, num_heads * d}, x.options());
  float* out = o.data_ptr<float>();
  at::parallel_for(0, reqs * num_heads, 8, [&](int64_t b, int64_t f) {
    std::vector<float> scores(cache_len);
    attend_range(s, p, out, scores.data(), b, f);
  });
  res.addmm_(o, weights[4].t());
  norm_rows(res.data_ptr<float>(), weights[5].data_ptr<float>(), h.data_ptr<float>(), rows_m, hidden, e);
  at::Tensor gate_up = at::mm(h, w_gu.t());
  at::Tensor act = at::empty({rows_m, inter}, x.options());
  const float* gu = gate_up.data_ptr<float>();
  float* a = act.data_ptr<float>();
  at::parallel_for(0, rows_m, 16, [&](int64_t b, int64_t f) { silu_mul_range(gu, a, inter, b, f); });
  res.addmm_(act, weights[7].t());
  norm_rows(res.data_ptr<float>(), weights[8].data_ptr<float>(), h.data_ptr<float>(), rows_m, hidden, e);
  at::Tensor logits = at::mm(h, lm_head.t());
  return {logits.view({reqs, n, vocab}), res.view({reqs, n, hidden})};
}

}  // namespace specdec
