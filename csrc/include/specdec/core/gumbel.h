// Two-level Gumbel-max (specdec_kernels/reference/gumbel.py), the scalar pieces every host kernel shares:
// a sample of norm(exp(z)) over a row of log-weights z picks a vocabulary block b (16 entries) by
// argmax_b L_b - log(-log u_b), L_b = logsumexp of the block, u_b the uniform of draw index
// kBlockDraws + b; then the entry v of that block by argmax z_v - log(-log u_v). Ties go to the lowest
// index at both levels.
//
// The log-weights come from a *source* (one struct per kind of row, framework-free and ISA-independent;
// host and device code, so the CUDA kernels use the same level-2 and block-score functions):
//   ZSource         z_v = sanitize(row[v] / temperature) of a logits row (a prepared float32 row of scaled,
//                   truncated logits passes temperature 1, which leaves it unchanged);
//   ResidualSource  log max(0, p_v - q_v), p = exp(z - max) / total the target of a ZSource, q a draft row;
//   WeightSource    log w_v of nonnegative weights in a float32 array.
// Each has block(b, out): the block's 16 log-weights (-inf past the vocabulary), and log_mass(b): L_b
// (logsumexp for logits, the log of the block_sum16 of the weights for weights). The SIMD searches over
// many blocks (gumbel_search.h) compute the same values lane-wise, and the walks (chain.h, tree.h) use
// these scalar versions for the one winning block, so the tokens do not depend on the instruction set.
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/types.h"

SPECDEC_NS_BEGIN

SPECDEC_HD ArgMax better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

SPECDEC_HD float load_elem(const void* row, DType dtype, int64_t v) {
  switch (dtype) {
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(row)[v]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(row)[v]);
    default: return static_cast<const float*>(row)[v];
  }
}

struct ZSource {
  const void* row;
  DType dtype;
  float temperature;
  int64_t vocab;

  SPECDEC_HD float z(int64_t v) const { return sanitize(load_elem(row, dtype, v) / temperature); }
  SPECDEC_HD void block(int64_t b, float* out) const {
    for (int i = 0; i < kBlock; ++i) {
      const int64_t v = b * kBlock + i;
      out[i] = v < vocab ? z(v) : -kInf;
    }
  }
  SPECDEC_HD float log_mass(int64_t b) const {
    float z[kBlock];
    block(b, z);
    return block_log_mass(z);
  }
};

// p = exp(z - max) / total, or one-hot at 0 when the row is all -inf (max = -inf).
struct ResidualSource {
  ZSource target;
  float max;
  float total;
  const void* q;
  DType q_dtype;

  SPECDEC_HD float p(int64_t v) const {
    if (max == -kInf) return v == 0 ? 1.0f : 0.0f;
    return exp_fma_f32(target.z(v) - max) / total;
  }
  SPECDEC_HD float residual(int64_t v) const {
    const float d = p(v) - load_elem(q, q_dtype, v);
    return d > 0.0f ? d : 0.0f;
  }
  SPECDEC_HD void block(int64_t b, float* out) const {
    for (int i = 0; i < kBlock; ++i) {
      const int64_t v = b * kBlock + i;
      out[i] = v < target.vocab ? log_f32(residual(v)) : -kInf;
    }
  }
  SPECDEC_HD float log_mass(int64_t b) const {  // log of the block_sum16 of the residual
    float w[kBlock];
    for (int i = 0; i < kBlock; ++i) w[i] = b * kBlock + i < target.vocab ? residual(b * kBlock + i) : 0.0f;
    return log_f32(block_sum16(w));
  }
};

struct WeightSource {
  const float* w;
  int64_t vocab;

  SPECDEC_HD void block(int64_t b, float* out) const {
    for (int i = 0; i < kBlock; ++i) {
      const int64_t v = b * kBlock + i;
      out[i] = v < vocab ? log_f32(w[v]) : -kInf;
    }
  }
  SPECDEC_HD float log_mass(int64_t b) const {  // log of the block_sum16 of the weights
    float x[kBlock];
    for (int i = 0; i < kBlock; ++i) x[i] = b * kBlock + i < vocab ? w[b * kBlock + i] : 0.0f;
    return log_f32(block_sum16(x));
  }
};

// Score L_b - log(-log u_b) of block b (a real candidate: the walks seed the searches with it).
template <class Source>
SPECDEC_HD ArgMax block_score(const Source& src, const PhiloxKey& key, uint32_t hi, int stream, int64_t b) {
  const float u = philox_draw(key, hi, stream, kBlockDraws + static_cast<uint32_t>(b));
  return {src.log_mass(b) - gumbel_log_term(u), b};
}

// Level 2: the entry of block b (argmax z_v - log(-log u_v), ties to the lowest index).
template <class Source>
SPECDEC_HD int64_t sample_in_block(const Source& src, const PhiloxKey& key, uint32_t hi, int stream, int64_t b) {
  float z[kBlock];
  src.block(b, z);
  uint32_t w[kBlock];
  const uint32_t first = static_cast<uint32_t>(b * kBlock);
  for (int i = 0; i < kBlock; i += 4) philox_words(key, philox_offset_lo(stream, first + i), hi, w + i);
  ArgMax best{-kInf, b * kBlock};
  for (int i = 0; i < kBlock; ++i) {
    const float s = z[i] - gumbel_log_term(philox_uniform(w[i]));
    if (s > best.value) best = {s, b * kBlock + i};
  }
  return best.index;
}

// Margin of a log_f32 whose argument is known only within [lo, hi]: log_f32 is within ~1 ulp of log, so
// log_f32(x) >= log_f32(lo) - kIntervalSlack / 2 for x >= lo (and the mirror for hi) wherever |log| < 128,
// i.e. every log of a residual mass or entry (ulp <= 2^-16 there).
constexpr float kIntervalSlack = 0x1p-12f;

// The scores of block b whose residual log-mass is at least l and at most h (log_f32 values at the
// normalizer's two ends), with Gumbel term g: each widened by kIntervalSlack, -inf where the mass is 0.
SPECDEC_HD IntervalScore interval_scores(float l, float h, float g, int64_t b) {
  return {{l == -kInf ? -kInf : (l - kIntervalSlack) - g, b}, h == -kInf ? -kInf : (h + kIntervalSlack) - g};
}

// Offers a candidate {lower bound of its score, index} with its upper bound to an interval pick: the better
// lower bound (ties to the lower index, as better) becomes the best; every other upper bound joins
// runner_hi. A candidate whose lower bound is -inf only joins runner_hi.
SPECDEC_HD void offer(IntervalPick& p, ArgMax lo, float hi) {
  const bool wins =
      lo.value != -kInf && (lo.value > p.best.value || (lo.value == p.best.value && lo.index < p.best.index));
  const float loser_hi = wins ? p.best_hi : hi;
  p.runner_hi = loser_hi > p.runner_hi ? loser_hi : p.runner_hi;
  if (wins) {
    p.best = lo;
    p.best_hi = hi;
  }
}

// The exact argmax is p.best: its lower bound beats every other candidate's upper bound.
SPECDEC_HD bool pick_is_certain(const IntervalPick& p) {
  return p.best.value != -kInf && p.best.value > p.runner_hi;
}

inline constexpr IntervalPick kIntervalPickInit{kArgMaxInit, -kInf, -kInf};

// Level 2 of the residual (sample_in_block of a ResidualSource) when its normalizer is known only within
// [upper.total, lower.total]: every residual entry is monotone in the normalizer (a rounded division, a
// rounded difference and a max), so `lower` and `upper` bound the exact one's entries. Returns the entry
// the exact level 2 picks when its lower score beats every other entry's upper score, else -1.
SPECDEC_HD int64_t certain_in_block(const ResidualSource& upper, const ResidualSource& lower, const PhiloxKey& key,
                                    uint32_t hi, int stream, int64_t b) {
  uint32_t w[kBlock];
  const uint32_t first = static_cast<uint32_t>(b * kBlock);
  for (int i = 0; i < kBlock; i += 4) philox_words(key, philox_offset_lo(stream, first + i), hi, w + i);
  IntervalPick pick = kIntervalPickInit;
  for (int i = 0; i < kBlock; ++i) {
    const int64_t v = b * kBlock + i;
    if (v >= upper.target.vocab) break;  // -inf in the exact block: never picked over a positive entry
    const float g = gumbel_log_term(philox_uniform(w[i]));
    const float r_lo = lower.residual(v), r_hi = upper.residual(v);
    const float s_lo = r_lo > 0.0f ? (log_f32(r_lo) - kIntervalSlack) - g : -kInf;
    const float s_hi = r_hi > 0.0f ? (log_f32(r_hi) + kIntervalSlack) - g : -kInf;
    offer(pick, {s_lo, v}, s_hi);
  }
  return pick_is_certain(pick) ? pick.best.index : -1;
}

SPECDEC_NS_END
