// Chain verification on the host (docs/design.md §2-§4): the per-request walk, exactly the rules of
// specdec_kernels/reference/chain.py. Framework-free: raw pointers in, tokens out.
//
// Rows without top-k / top-p are sampled straight from the logits (one pass for deterministic drafts and
// bonus rows, two-level Gumbel-max; one normalizer pass, plus a residual pass at the first rejection, for
// stochastic drafts); truncated rows are first read into a float32 scratch row (scaled, sanitized,
// truncated). Rows after a request's first rejection are never read. The walk is generic over an
// executor that runs each vocabulary reduction serially or split across threads (csrc/cpu/chain_cpu.cpp),
// and over a RowKernels table (the instruction-set build of row_ops.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "specdec/core/common.h"
#include "specdec/core/gumbel.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/sampling.h"
#include "specdec/core/types.h"

namespace specdec {

struct ChainArgs {
  const void* logits;            // [T + B, V] logits_dtype
  DType logits_dtype;
  int64_t vocab;
  const int64_t* draft_ids;      // [T]
  const int64_t* cu;             // [B + 1]
  int64_t num_reqs;
  const void* draft_probs;       // [T, V] probs_dtype, or nullptr (deterministic drafts)
  DType probs_dtype;
  const float* temperature;      // [B], 0 = greedy
  const int32_t* top_k;          // [B] or nullptr
  const float* top_p;            // [B] or nullptr
  const int64_t* seed;           // [B]
  const int64_t* position;       // [B]
  int64_t out_width;             // K_max + 1
  int32_t* out_tokens;           // [B, out_width], pre-filled with -1 by the caller
  int32_t* num_accepted;         // [B]
  float* row_threshold;          // [T + B] or nullptr: each decided row's kept-set threshold (the sampling mask)
};

}  // namespace specdec

SPECDEC_NS_BEGIN

// Per-thread scratch of the walks.
struct RowScratch {
  std::vector<float> z;       // the current row's scaled, truncated logits
  std::vector<float> select;  // top-k selection
  TopPScratch top_p;
  std::vector<float> units;   // a rejected stochastic row's unit maxima (certain_recovery)
};

// Scale one row into scratch.z and apply top-k / top-p; returns the row max (kept by both). With `threshold`
// (the sampling mask asked for), stores there the threshold the row was truncated with: the row keeps exactly
// its finite z >= *threshold (-inf: not truncated).
// Reference: z = sanitize(logits / T); top-k then top-p (reference/sampling.py, truncate_with_threshold).
template <class Exec>
ArgMax prepare_row(const RowKernels& K, Exec& exec, const void* row, DType dtype, float temperature,
                   const int32_t* top_k, const float* top_p, int64_t req, int64_t V, RowScratch& s,
                   float* threshold = nullptr) {
  if (static_cast<int64_t>(s.z.size()) < V) s.z.resize(V);  // greedy-only batches never allocate it
  float* z = s.z.data();
  const ArgMax mx = exec.argmax([&](int64_t v0, int64_t v1) { return K.scale_row(row, dtype, temperature, z, v0, v1); });
  float kept = -kInf;
  if (top_k != nullptr) {
    const int32_t k = top_k[req];
    if (k > 0 && k < V) {
      const float kth = kth_largest(z, V, k, s.select);
      for (int64_t v = 0; v < V; ++v) z[v] = z[v] >= kth ? z[v] : -kInf;
      kept = kth;
    }
  }
  if (top_p != nullptr && top_p[req] < 1.0f && mx.value != -kInf) {
    const float thr = top_p_threshold(z, V, mx.value, top_p[req], s.top_p);
    for (int64_t v = 0; v < V; ++v) z[v] = z[v] >= thr ? z[v] : -kInf;
    kept = thr > kept ? thr : kept;  // a value the top-k-masked row keeps: never below top-k's
  }
  if (threshold != nullptr) *threshold = kept;
  return mx;
}

// y ~ softmax(z) of a row by two-level Gumbel-max on one stream, level 1 seeded with the score of block
// seed_block (>= 0: the block of the draft or of the row max, often the winner, so that the search skips
// most of the row; -1: none).
template <class Exec>
int64_t sample_z(const RowKernels& K, Exec& exec, const ZSource& src, int64_t seed_block, int64_t seed,
                 int64_t position, int stream) {
  const PhiloxKey key = philox_key(seed);
  const uint32_t hi = philox_offset_hi(position);
  ArgMax start = kArgMaxInit;
  if (seed_block >= 0) {
    const ArgMax s = block_score(src, key, hi, stream, seed_block);
    if (s.value != -kInf) start = s;
  }
  const ArgMax pick = exec.argmax([&](int64_t v0, int64_t v1) {
    return K.gumbel_blocks(src.row, src.dtype, src.temperature, src.vocab, key, hi, stream, v0, v1, start);
  });
  return sample_in_block(src, key, hi, stream, pick.index);
}

// y ~ softmax(z) of a prepared float32 row z[0, V) (prepare_row, row max mx), seeded with the block of the
// row max.
template <class Exec>
int64_t sample_prepared(const RowKernels& K, Exec& exec, const float* z, ArgMax mx, int64_t V, int64_t seed,
                        int64_t position, int stream) {
  const ZSource src{z, DType::kFloat32, 1.0f, V};
  return sample_z(K, exec, src, mx.value != -kInf ? mx.index / kBlock : -1, seed, position, stream);
}

// y ~ norm(w) of nonnegative weights w[0, V) (not all 0) by two-level Gumbel-max on one stream.
template <class Exec>
int64_t sample_weights(const RowKernels& K, Exec& exec, const float* w, int64_t V, int64_t seed, int64_t position,
                       int stream) {
  const PhiloxKey key = philox_key(seed);
  const uint32_t hi = philox_offset_hi(position);
  const ArgMax pick = exec.argmax([&](int64_t v0, int64_t v1) { return K.weight_blocks(w, V, key, hi, stream, v0, v1); });
  return sample_in_block(WeightSource{w, V}, key, hi, stream, pick.index);
}

// True when top-k and top-p leave request req's row untouched.
inline bool untruncated(const int32_t* top_k, const float* top_p, int64_t req, int64_t V) {
  const bool k_off = top_k == nullptr || top_k[req] <= 0 || top_k[req] >= V;
  return k_off && (top_p == nullptr || !(top_p[req] < 1.0f));
}

// Stochastic-draft decision on a row of scaled logits: accept x iff coin * q(x) < p(x); otherwise the
// recovery token from norm(max(0, p - q)) (p itself when that residual is empty).
struct StochasticDecision {
  bool accept;
  int64_t token;  // valid when !accept
};

// An acceptance the cheap normalizer bracket makes certain: coin * q(x) < p(x) for every normalizer in the
// bracket, widened by the exact pass's own rounding, so the exact pass (softmax_stats, below) would accept
// too. The bracket of the true sum of exp(z - shift) over the V entries:
// - each term within E = kExp2RoughErr + 2^-23 (300 + 3 |shift|): the polynomial, and the rounding of
//   the exponent fma(row, log2 e / T, -shift log2 e) (its two constants, the fma, and z's own rounding
//   in the exact pass) for the terms that count (|exponent| <= 128); normalizer.h's chunk_sum_ranged
//   (bf16 without AVX-512) rounds less: its shift is K ln 2 to half an ulp, K an exact integer;
// - the float sums within 2^-15 (at most 256 terms per lane, normalizer.h); terms below 2^-126, NaN
//   included, off by at most 2^-125 each (V 2^-124 in all; the sum itself is at least ~1, the term of the
//   shift).
// The exact pass's p(x) lies within d = 2^-15 + (V / 256 + 16) 2^-22 of the true one (the exponent's
// rounding at |z - max| <= 104, ~2 ulp per exp, at most one rescale of a lane per chunk), or within 2^-140
// absolutely (bracket_error). False when the bracket is too wide or the coin falls inside it (about 0.4 %
// of coins for drafts close to the target): the exact pass decides.
struct BracketError {
  double e;      // relative error of each term
  double slack;  // absolute error of the tiny terms, all together
  double d;      // relative error of the exact pass's p(x)
  bool ok;       // a bracket to decide on (finite shift, e < 1/4, sum above slack)
};

inline BracketError bracket_error(const NormalizerBound& nb, int64_t V) {
  const double e = kExp2RoughErr + 0x1p-15 + 0x1p-23 * (300.0 + 3.0 * static_cast<double>(nb.max_abs_shift));
  const double slack = static_cast<double>(V) * 0x1p-124;
  const double d = 0x1p-15 + (static_cast<double>(V) / 256.0 + 16.0) * 0x1p-22;
  return {e, slack, d, nb.ok && nb.shift != -kInf && e < 0.25 && nb.sum > slack};
}

inline bool certain_accept(const NormalizerBound& nb, int64_t V, float z_x, float coin_q) {
  const BracketError be = bracket_error(nb, V);
  if (!be.ok) return false;
  const double sum_hi = (nb.sum + be.slack) / (1.0 - be.e);
  const double num = std::exp(static_cast<double>(z_x) - static_cast<double>(nb.shift));
  const double p_lo = num / sum_hi * (1.0 - be.d) - 0x1p-140;
  return static_cast<double>(coin_q) < p_lo;
}

// The exact pass's float normalizer (softmax_stats relative to the row max m, then rounded to float) lies
// in [lo, hi]: the bracket's sum relative to its shift s <= m within certain_accept's e and slack, brought
// to m in double (exp(s - m) <= 1, within 2^-40), widened by 2 d + 2^-20 for the exact pass's own rounding
// (d as in certain_accept, which bounds the exact p(x), numerator and normalizer together, within d), and
// rounded outwards to float (the cast of the exact sum is monotone). ok = false: no usable bracket.
struct TotalBracket {
  float lo, hi;
  bool ok;
};

inline TotalBracket total_bracket(const NormalizerBound& nb, int64_t V, float m) {
  const TotalBracket none{0.0f, 0.0f, false};
  const BracketError be = bracket_error(nb, V);
  if (!be.ok || m == -kInf || !(nb.shift <= m)) return none;
  const double widen = 2.0 * be.d + 0x1p-20;
  const double to_m = std::exp(static_cast<double>(nb.shift) - static_cast<double>(m));
  const double lo = (nb.sum - be.slack) / (1.0 + be.e) * to_m * (1.0 - 0x1p-40) * (1.0 - widen);
  const double hi = (nb.sum + be.slack) / (1.0 - be.e) * to_m * (1.0 + 0x1p-40) * (1.0 + widen);
  float lo_f = static_cast<float>(lo), hi_f = static_cast<float>(hi);
  if (static_cast<double>(lo_f) > lo) lo_f = std::nextafter(lo_f, 0.0f);
  if (static_cast<double>(hi_f) < hi) hi_f = std::nextafter(hi_f, kInf);
  if (!(lo_f > 0.0f) || !(hi_f <= kFloat32Max)) return none;
  return {lo_f, hi_f, true};
}

// The interval search's seed: block b's residual scores at the bracket's two ends (interval_scores, as
// IntervalResidualBounds::score computes a candidate's). certain_recovery seeds with the block of the row's
// max, whose p is the row's largest: on peaked rows its score prunes 3x more of the blocks ahead of it than
// the first blocks' do (from ~470 candidates per row to ~150).
inline IntervalScore interval_seed(const ResidualSource& upper, const ResidualSource& lower, const PhiloxKey& key,
                                   uint32_t hi, int64_t b) {
  const float g = gumbel_log_term(philox_draw(key, hi, kStreamRecovery, kBlockDraws + static_cast<uint32_t>(b)));
  return interval_scores(lower.log_mass(b), upper.log_mass(b), g, b);
}

// A rejection of draft x and its recovery token that the bracket makes certain, without the exact
// normalizer pass (~2x the bracket's work per entry): the row max m (one cheap pass, as greedy reads), the
// normalizer's bracket [lo, hi] (total_bracket), then p(x) <= e_x / lo <= coin * q(x) rejects for every
// normalizer in it, and the residual's level 1 (K.residual_interval) and level 2 (certain_in_block) pick
// the same block and entry for every normalizer in it (residual entries are monotone in the normalizer).
// Returns -1 when any of these is not certain (then the exact pass decides): the token otherwise, which is
// the exact path's.
template <class Exec>
int64_t certain_recovery(const RowKernels& K, Exec& exec, const ZSource& src, const void* q, DType q_dtype, int64_t x,
                         const NormalizerBound& nb, float coin_q, const PhiloxKey& key, uint32_t hi, RowScratch& s) {
  if (!bracket_error(nb, src.vocab).ok) return -1;
  const int64_t num_units = (src.vocab + kUnitEntries - 1) / kUnitEntries;
  if (static_cast<int64_t>(s.units.size()) < num_units) s.units.resize(num_units);
  float* units = s.units.data();
  const ArgMax top = exec.argmax(
      [&](int64_t v0, int64_t v1) { return K.unit_maxima(src.row, src.dtype, src.temperature, v0, v1, units); });
  const float m = sanitize(top.value * (1.0f / src.temperature));  // softmax_stats' max: its z are row * (1 / T)
  const TotalBracket tb = total_bracket(nb, src.vocab, m);
  if (!tb.ok) return -1;
  if (!(coin_q >= exp_fma_f32(src.z(x) - m) / tb.lo)) return -1;
  const ResidualSource upper{src, m, tb.lo, q, q_dtype};
  const ResidualSource lower{src, m, tb.hi, q, q_dtype};
  const IntervalScore seed = interval_seed(upper, lower, key, hi, top.index / kBlock);
  const ResidualArgs args{src.row, src.dtype, src.temperature, m, tb.lo, q, q_dtype, src.vocab, units};
  const IntervalPick pick =
      exec.interval([&](int64_t v0, int64_t v1) { return K.residual_interval(args, tb.hi, seed, key, hi, v0, v1); });
  if (!pick_is_certain(pick)) return -1;
  return certain_in_block(upper, lower, key, hi, kStreamRecovery, pick.best.index);
}

template <class Exec>
StochasticDecision stochastic_decide(const RowKernels& K, Exec& exec, const ZSource& src, const void* q,
                                     DType q_dtype, int64_t draft, bool valid, int64_t seed, int64_t position,
                                     RowScratch& s) {
  const int64_t x = valid ? draft : 0;
  const float q_x = load_elem(q, q_dtype, x);
  const float coin = philox_rand(seed, position, kStreamCoin, 0);
  if (valid) {
    const NormalizerBound nb = exec.normalizer(
        [&](int64_t v0, int64_t v1) { return K.normalizer_bound(src.row, src.dtype, src.temperature, v0, v1); });
    if (certain_accept(nb, src.vocab, src.z(x), coin * q_x)) return {true, draft};
    const int64_t token =
        certain_recovery(K, exec, src, q, q_dtype, x, nb, coin * q_x, philox_key(seed), philox_offset_hi(position), s);
    if (token >= 0) return {false, token};
  }
  const SoftmaxStats st =
      exec.stats([&](int64_t v0, int64_t v1) { return K.softmax_stats(src.row, src.dtype, src.temperature, v0, v1); });
  const float m = st.max;
  const bool finite = m != -kInf;
  const float total = finite ? static_cast<float>(st.sum) : 1.0f;
  const float p_x = finite ? exp_fma_f32(src.z(x) - m) / total : (x == 0 ? 1.0f : 0.0f);
  if (valid && coin * q_x < p_x) return {true, draft};
  const PhiloxKey key = philox_key(seed);
  const uint32_t hi = philox_offset_hi(position);
  const ResidualArgs args{src.row, src.dtype, src.temperature, m, total, q, q_dtype, src.vocab};
  const ResidualResult rr =
      exec.residual([&](int64_t v0, int64_t v1) { return K.residual_blocks(args, key, hi, v0, v1); });
  if (rr.any_positive) {
    const ResidualSource residual{src, m, total, q, q_dtype};
    return {false, sample_in_block(residual, key, hi, kStreamRecovery, rr.best.index)};
  }
  return {false, sample_z(K, exec, src, -1, seed, position, kStreamRecovery)};
}

template <class Exec>
void verify_chain_request(const RowKernels& K, const ChainArgs& a, int64_t b, Exec& exec, RowScratch& s) {
  const int64_t V = a.vocab;
  const int64_t first_draft = a.cu[b];
  const int64_t k = a.cu[b + 1] - first_draft;
  const int64_t row0 = first_draft + b;
  const float temp = a.temperature[b];
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  int32_t* out = a.out_tokens + b * a.out_width;

  int64_t j = 0;
  for (;; ++j) {
    const bool bonus = j == k;
    const void* row = static_cast<const char*>(a.logits) + static_cast<size_t>(row0 + j) * V * elem;
    const int64_t draft = bonus ? -1 : a.draft_ids[first_draft + j];
    const bool valid = draft >= 0 && draft < V;
    const int64_t pos = a.position[b] + j;
    int64_t token;
    bool accept;
    // The sampling mask's threshold of this row, when asked for (prepare_row's, the greedy max, or -inf).
    float* threshold = a.row_threshold != nullptr ? a.row_threshold + row0 + j : nullptr;
    if (temp == 0.0f) {  // greedy: argmax of the sanitized logits, no truncation
      const ArgMax g = exec.argmax([&](int64_t v0, int64_t v1) { return K.greedy_argmax(row, a.logits_dtype, v0, v1); });
      token = g.index;
      accept = valid && token == draft;
      if (threshold != nullptr) *threshold = g.value;
    } else {
      // The row's log-weights: straight from the logits, or from the scratch row when truncated.
      ZSource src{row, a.logits_dtype, temp, V};
      int64_t seed_block = valid ? draft / kBlock : -1;
      if (untruncated(a.top_k, a.top_p, b, V)) {
        if (threshold != nullptr) *threshold = -kInf;
      } else {
        const ArgMax mx = prepare_row(K, exec, row, a.logits_dtype, temp, a.top_k, a.top_p, b, V, s, threshold);
        src = ZSource{s.z.data(), DType::kFloat32, 1.0f, V};
        seed_block = mx.value != -kInf ? mx.index / kBlock : -1;
      }
      if (a.draft_probs == nullptr || bonus) {
        token = sample_z(K, exec, src, seed_block, a.seed[b], pos, bonus ? kStreamBonus : kStreamRecovery);
        accept = valid && token == draft;
      } else {
        const void* q = static_cast<const char*>(a.draft_probs) + static_cast<size_t>(first_draft + j) * V * q_elem;
        const StochasticDecision d =
            stochastic_decide(K, exec, src, q, a.probs_dtype, draft, valid, a.seed[b], pos, s);
        accept = d.accept;
        token = d.token;
      }
    }
    if (!bonus && accept) {
      out[j] = static_cast<int32_t>(draft);
      continue;
    }
    out[j] = static_cast<int32_t>(token);
    break;
  }
  a.num_accepted[b] = static_cast<int32_t>(j);
}

SPECDEC_NS_END
