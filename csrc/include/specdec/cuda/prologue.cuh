// The prologue every per-request CUDA kernel shares (chain, block, tree, traversal): the request's span of
// drafts or nodes, and its sampling parameters.
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/philox.h"
#include "specdec/cuda/cuda_api.h"
#include "specdec/cuda/cuda_common.cuh"

SPECDEC_NS_BEGIN
namespace dev {

__device__ __forceinline__ int64_t clamp_index(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Request b's entries [first, first + n) of an array of `total` (drafts or tree nodes), its cu entries
// clamped into the array, since cu is unchecked under validate=False (reference.chain.chain_spans,
// reference.tree.tree_spans): the identity on a valid cu.
struct Span {
  int64_t first, n;
};

__device__ __forceinline__ Span request_span(const int64_t* cu, int64_t b, int64_t total) {
  const int64_t first = clamp_index(cu[b], 0, total);
  return {first, clamp_index(cu[b + 1], first, total) - first};
}

// Request b's chain: drafts start ... start + k - 1 (k also capped by the output row), target rows start +
// b ... start + b + k.
struct ChainSpan {
  int64_t start, k;
};

__device__ __forceinline__ ChainSpan chain_span(const CudaChainArgs& a, int64_t b) {
  const Span s = request_span(a.cu, b, a.num_rows - a.num_reqs);
  return {s.first, s.n < a.out_width - 1 ? s.n : a.out_width - 1};
}

// Request b's sampling parameters, as every kernel reads them (no top-k: 0; no top-p: 1).
struct RequestSampling {
  float temperature;
  int64_t seed, position;
  PhiloxKey key;
  int32_t top_k;
  float top_p;
};

template <class Args>
__device__ __forceinline__ RequestSampling request_sampling(const Args& a, int64_t b) {
  return {a.temperature[b], a.seed[b], a.position[b], philox_key(a.seed[b]),
          a.top_k != nullptr ? a.top_k[b] : 0, a.top_p != nullptr ? a.top_p[b] : 1.0f};
}

}  // namespace dev
SPECDEC_NS_END
