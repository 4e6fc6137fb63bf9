// Host-side interface of the CUDA kernels: argument structs, workspace sizes, the launch-config
// table and the launchers. Plain C++ (no CUDA or torch headers), so both the nvcc-compiled kernels and
// the torch binding (csrc/cuda/ops_cuda.cpp, host compiler) include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "specdec/core/common.h"

namespace specdec {

struct CudaChainArgs {
  const void* logits;
  DType logits_dtype;
  int64_t vocab;
  int64_t num_rows;             // T + B
  const int64_t* draft_ids;     // [T]
  const int64_t* cu;            // [B + 1]
  int64_t num_reqs;
  const void* draft_probs;      // [T, V] or nullptr
  DType probs_dtype;
  const float* temperature;     // [B]
  const int32_t* top_k;         // [B] or nullptr
  const float* top_p;           // [B] or nullptr
  const int64_t* seed;          // [B]
  const int64_t* position;      // [B]
  int64_t out_width;
  int32_t* out_tokens;          // [B, out_width], pre-filled with -1
  int32_t* num_accepted;        // [B]
  float* row_threshold;         // [T + B] or nullptr: each row's kept-set threshold (the sampling mask)
};

// Workspace (device memory, sized by chain_workspace_bytes): per (row, slice) partials and per-row state.
struct ChainRowPartial {
  float pick_value;
  int32_t pick_index;
  float max;
  double sum;  // sum of exp(z - max) over the slice
};

struct ChainRowState {
  uint32_t lo_key;     // keep z iff order_key(z) >= lo_key (0 keeps everything)
  int32_t token;       // greedy argmax / Gumbel-max sample of this row
  int32_t accept;      // stochastic rows: 1 if the coin accepted the draft
  float max, total;    // stochastic rows: softmax statistics of z
  int32_t recovered;   // stochastic rows that rejected: residual sample, or -1 if the residual is empty
};

}  // namespace specdec

namespace specdec {

struct CudaTreeArgs {
  const void* logits;
  DType logits_dtype;
  int64_t vocab;
  int64_t num_nodes;               // N
  const int64_t* node_token_ids;  // [N]
  const int64_t* parent;          // [N]
  const int64_t* cu;              // [B + 1]
  int64_t num_reqs;
  const void* draft_probs;        // [N, V] or nullptr
  DType probs_dtype;
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const int64_t* seed;
  const int64_t* position;
  bool without_replacement;
  int64_t max_depth;
  int32_t* out_tokens;            // [B, D + 1], pre-filled with -1
  int32_t* accepted_nodes;        // [B, D + 1], pre-filled with -1
  int32_t* num_accepted;          // [B]
  float* row_threshold;           // [N] or nullptr: each decided node's kept-set threshold (the sampling mask)
};

}  // namespace specdec

namespace specdec::cuda {

// Launch configuration of the vocabulary-split kernels, from a small typed table keyed by
// (architecture, vocabulary size, logits dtype): threads per block and the vocabulary slice per block.
struct LaunchConfig {
  int threads;
  int64_t slice;  // elements per block (a multiple of 8 so that slices stay 16-byte aligned)
};

struct ConfigEntry {
  int min_arch;        // compute capability * 10 (90 = Hopper, 100 = Blackwell)
  int64_t min_vocab;
  int elem_bytes;      // 4 = fp32, 2 = bf16/fp16
  LaunchConfig config;
};

// Larger slices for wider rows amortise the per-block reduction; 2-byte rows get twice the elements
// for the same bytes per block. First matching entry wins (entries ordered most specific first).
inline constexpr ConfigEntry kConfigTable[] = {
    {100, 65536, 2, {512, 16384}}, {100, 65536, 4, {512, 8192}},
    {90, 65536, 2, {512, 16384}},  {90, 65536, 4, {512, 8192}},
    {0, 8192, 2, {256, 8192}},     {0, 8192, 4, {256, 4096}},
    {0, 0, 2, {128, 2048}},        {0, 0, 4, {128, 2048}},
};

// Fixed launch shapes beside the table: threads of the per-row threshold search (threshold_kernel) and
// of the one-thread-per-row / per-request kernels (decide, residual_combine, assemble), and the grid's
// y limit (rows beyond it loop inside row_pass_kernel / residual_kernel).
inline constexpr int kThresholdThreads = 256;
inline constexpr int kRowThreads = 128;
inline constexpr int64_t kMaxGridY = 65535;

inline LaunchConfig pick_config(int arch, int64_t vocab, DType dtype) {
  const int bytes = dtype == DType::kFloat32 ? 4 : 2;
  for (const ConfigEntry& e : kConfigTable) {
    if (arch >= e.min_arch && vocab >= e.min_vocab && bytes == e.elem_bytes) return e.config;
  }
  return {128, 2048};
}

}  // namespace specdec::cuda

namespace specdec::cuda {

// Bytes of device workspace verify_chain_cuda needs (partials of every (row, slice) + row states).
inline size_t chain_workspace_bytes(int64_t num_rows, int64_t slices) {
  return static_cast<size_t>(num_rows) * (static_cast<size_t>(slices) * sizeof(ChainRowPartial) + sizeof(ChainRowState));
}

// Launches the whole pipeline on `stream`; `workspace` holds chain_workspace_bytes(...) bytes.
void launch_verify_chain(const CudaChainArgs& a, int arch, void* workspace, void* stream);
int64_t chain_slices(int arch, int64_t vocab, DType dtype);

}  // namespace specdec::cuda

namespace specdec {

// Per-depth state of the traversal walk (traversal.cuh), one per (request, depth) in the workspace.
struct TraversalDepth {
  int64_t path;    // local node on the current path at this depth
  int64_t cursor;  // local index from which its next child is searched
  double mass;     // M: probability of accepting this node's path when tested
  double last;     // mass of the residual row after the latest deleted child
  float divisor;   // the node's mass row is r / divisor
  int32_t flags;   // kTraversalAlive | kTraversalDeleted
};
inline constexpr int32_t kTraversalAlive = 1;
inline constexpr int32_t kTraversalDeleted = 2;

}  // namespace specdec

namespace specdec::cuda {

inline size_t tree_workspace_bytes(int64_t num_reqs, int64_t vocab, bool stochastic) {
  return stochastic ? static_cast<size_t>(num_reqs) * 2 * static_cast<size_t>(vocab) * sizeof(float) : 0;
}

void launch_verify_tree(const CudaTreeArgs& a, int arch, void* workspace, void* stream);

}  // namespace specdec::cuda

namespace specdec::cuda {

// Block verification (block.cuh): one p row per request.
inline size_t chain_block_workspace_bytes(int64_t num_reqs, int64_t vocab) {
  return static_cast<size_t>(num_reqs) * static_cast<size_t>(vocab) * sizeof(float);
}
void launch_verify_chain_block(const CudaChainArgs& a, int arch, void* workspace, void* stream);

// Traversal verification (traversal.cuh): per request the mass rows of the path ([D + 1, V] floats), the
// running draft laws without replacement (another [D + 1, V]), then the per-depth states.
inline size_t tree_traversal_rows_bytes(int64_t num_reqs, int64_t width, int64_t vocab, bool without_replacement) {
  const size_t bytes = static_cast<size_t>(num_reqs) * (without_replacement ? 2 : 1) * static_cast<size_t>(width) *
                       static_cast<size_t>(vocab) * sizeof(float);
  return (bytes + 15) / 16 * 16;
}
inline size_t tree_traversal_workspace_bytes(int64_t num_reqs, int64_t width, int64_t vocab, bool without_replacement) {
  return tree_traversal_rows_bytes(num_reqs, width, vocab, without_replacement) +
         static_cast<size_t>(num_reqs) * static_cast<size_t>(width) * sizeof(TraversalDepth);
}
void launch_verify_tree_traversal(const CudaTreeArgs& a, int arch, void* workspace, void* stream);

}  // namespace specdec::cuda
