// Plain data shared by the host kernels (no functions: these types are identical in every
// instruction-set build, see common.h).
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/philox.h"

namespace specdec {

// (value, index) with ties to the lowest index.
struct ArgMax {
  float value;
  int64_t index;
};
inline constexpr ArgMax kArgMaxInit{-__builtin_huge_valf(), 0};

// Largest possible -log(-log u) for u <= 0.99999994 (the largest Philox uniform) is 16.64; the margin
// keeps the group-skipping bound safe against last-ulp effects (it also bounds -log(1 - u) + slack).
inline constexpr float kGumbelBound = 16.75f;

// Entries per unit of RowKernels::unit_maxima (the slices of split passes start on units).
inline constexpr int64_t kUnitEntries = 64;

struct ResidualResult {
  ArgMax best;        // {score, block} of the residual's level-1 search
  bool any_positive;  // some p_v - q_v > 0 (otherwise the reference samples from p itself)
};

// Row max and sum exp(z - max) of a scaled row (the softmax normalizer).
struct SoftmaxStats {
  float max;
  double sum;
};

// A bracket of the same normalizer from a cheaper pass (row_ops.h normalizer_bound): sum ~ sum
// exp(z - shift) over the slice, each term within a known relative error (chain.h normalizer_bracket).
// shift = -inf: no finite z (sum 0); ok = false: no bound (a +inf or overflowing z).
struct NormalizerBound {
  float shift;
  double sum;
  float max_abs_shift;  // the largest |shift| used (the terms' rounding grows with it)
  bool ok;
};

// A stochastic row's residual max(0, p - q), p = exp(z - max) / total with z = sanitize(row / temperature)
// (max = -inf: p one-hot at 0).
struct ResidualArgs {
  const void* row;
  DType dtype;
  float temperature;
  float max;
  float total;
  const void* q;
  DType q_dtype;
  int64_t vocab;
  const float* units = nullptr;  // the row's unit maxima (RowKernels::unit_maxima), or nullptr: none
};

// The residual's level-1 search when its normalizer is known only within a bracket (chain.h
// certain_recovery): the block with the best lower bound of its score, that bound's upper twin, and the
// largest upper bound of every other block's score (gumbel.h offer / pick_is_certain).
struct IntervalPick {
  ArgMax best;      // {lower bound of the score, block}
  float best_hi;    // upper bound of best's score
  float runner_hi;  // the largest upper bound of any other block's score
};

// A block's scores when its residual mass is known only within an interval: {lower score, block} and its
// upper score (gumbel.h interval_scores, offer). As an interval search's seed, scored before the search:
// its lower score prunes from the start, the slice holding the block offers it to its pick, and no slice
// scores it again. block = -1: none.
struct IntervalScore {
  ArgMax lo;
  float hi;
};

// The largest and smallest of some 16-bit integers.
struct Int16Range {
  int16_t max;
  int16_t min;
};

// Hot vocabulary-range loops of one instruction-set build (csrc/include/specdec/cpu/row_ops.h). The
// Gumbel-max searches are level 1 of two-level Gumbel-max (gumbel.h): {score, block} over the blocks of
// [v0, v1) (v0 a multiple of 64), from `start`.
struct RowKernels {
  ArgMax (*greedy_argmax)(const void* row, DType dtype, int64_t v0, int64_t v1);
  // greedy_argmax, and the largest z = sanitize(row / temperature) of every unit of [v0, v1) into
  // units[v / kUnitEntries] (the residual_interval bounds of a rejected row without a second pass over it).
  ArgMax (*unit_maxima)(const void* row, DType dtype, float temperature, int64_t v0, int64_t v1, float* units);
  ArgMax (*scale_row)(const void* row, DType dtype, float temperature, float* z, int64_t v0, int64_t v1);
  // Blocks of z = sanitize(row / temperature) (a prepared float32 row: kFloat32 and temperature 1).
  ArgMax (*gumbel_blocks)(const void* row, DType dtype, float temperature, int64_t vocab, const PhiloxKey& key,
                          uint32_t hi, int stream, int64_t v0, int64_t v1, ArgMax start);
  SoftmaxStats (*softmax_stats)(const void* row, DType dtype, float temperature, int64_t v0, int64_t v1);
  // The bracket of softmax_stats' normalizer (accept decisions of stochastic drafts that are certain
  // without the exact sum).
  NormalizerBound (*normalizer_bound)(const void* row, DType dtype, float temperature, int64_t v0, int64_t v1);
  // Blocks of the residual (recovery stream).
  ResidualResult (*residual_blocks)(const ResidualArgs& r, const PhiloxKey& key, uint32_t hi, int64_t v0,
                                    int64_t v1);
  // Blocks of the residual with its normalizer in [r.total, total_hi] (a finite r.max, r.total > 0), seeded.
  IntervalPick (*residual_interval)(const ResidualArgs& r, float total_hi, const IntervalScore& seed,
                                    const PhiloxKey& key, uint32_t hi, int64_t v0, int64_t v1);
  // Blocks of nonnegative weights w.
  ArgMax (*weight_blocks)(const float* w, int64_t vocab, const PhiloxKey& key, uint32_t hi, int stream, int64_t v0,
                          int64_t v1);
  // Overwrites a prepared row z with exp(z - m) and returns the sum (double): the softmax numerators of
  // block and traversal verification (block.h, traversal.h).
  double (*softmax_weights)(float* z, float m, int64_t v0, int64_t v1);
  // out = max(0, w * (e / total) - q) (q = nullptr: 0) and its sum (double): the residual rows of block
  // and traversal verification.
  double (*weighted_residual)(const float* e, float total, float w, const void* q, DType q_dtype, float* out,
                              int64_t v0, int64_t v1);
  // The sum of x[0, n) (float32), read as the row passes read: the read-bandwidth probe.
  double (*stream_sum)(const float* x, int64_t n);
  // The same read with `rounds` dependent multiply-adds on every loaded vector (the stream-compute probe).
  double (*stream_work)(const float* x, int64_t n, int rounds);
  // The largest and smallest of x[0, n) read as int16, by the 16-bit greedy pass's loop: the integer read
  // probe.
  Int16Range (*stream_minmax16)(const uint16_t* x, int64_t n);
};

}  // namespace specdec
