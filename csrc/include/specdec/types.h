// Plain data shared by the host kernels (no functions: these types are identical in every
// instruction-set build, see common.h).
#pragma once

#include <cstdint>

#include "common.h"
#include "philox.h"

namespace specdec {

// (value, index) with ties to the lowest index.
struct ArgMax {
  float value;
  int64_t index;
};
inline constexpr ArgMax kArgMaxInit{-__builtin_huge_valf(), 0};

// Largest possible -log(-log u) for u <= 0.99999994 (the largest Philox uniform) is 16.64; the margin
// keeps the chunk-skipping bound safe against last-ulp effects.
inline constexpr float kGumbelBound = 16.75f;

struct ResidualResult {
  ArgMax best;
  bool any_positive;  // some p_v - q_v > 0 (otherwise the reference samples from p itself)
};

// Hot vocabulary-range loops of one instruction-set build (csrc/include/specdec/row_ops.h).
struct RowKernels {
  ArgMax (*greedy_argmax)(const void* row, DType dtype, int64_t v0, int64_t v1);
  ArgMax (*scale_row)(const void* row, DType dtype, float temperature, float* z, int64_t v0, int64_t v1);
  ArgMax (*gumbel_argmax)(const float* z, const PhiloxKey& key, int64_t position, int stream, int64_t v0,
                          int64_t v1, ArgMax init);
  // gumbel_argmax of z = sanitize(logit / temperature), computed on the fly from the row.
  ArgMax (*gumbel_argmax_logits)(const void* row, DType dtype, float temperature, const PhiloxKey& key,
                                 int64_t position, int stream, int64_t v0, int64_t v1, ArgMax init);
  // Overwrites z with exp(z - m) and returns the sum (double).
  double (*softmax_weights)(float* z, float m, int64_t v0, int64_t v1);
  // w = softmax_weights' output (nullptr: the all -inf row, p one-hot at 0).
  ResidualResult (*residual_argmax)(const float* w, float total, const void* q, DType q_dtype, const PhiloxKey& key,
                                    int64_t position, int64_t v0, int64_t v1);
  ArgMax (*log_gumbel_argmax)(const float* w, const PhiloxKey& key, int64_t position, int stream, int64_t v0,
                              int64_t v1);
  // out = max(0, w * (e / total) - q) (q = nullptr: 0) and its sum (double): the residual rows of block
  // and traversal verification (block.h, traversal.h).
  double (*weighted_residual)(const float* e, float total, float w, const void* q, DType q_dtype, float* out,
                              int64_t v0, int64_t v1);
};

}  // namespace specdec
