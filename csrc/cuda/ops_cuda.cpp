// Torch binding of the CUDA kernels: shape/dtype checks, output and workspace allocation (caching
// allocator, so the ops are CUDA-graph safe: no host syncs, no host-side RNG state), launch on the
// current stream. Registered as the CUDA implementation of the specdec:: ops.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include "checks.h"
#include "ops.h"
#include "specdec/cuda/cuda_api.h"

namespace specdec {

namespace {

// Compute capability x 10 (device attributes, not ATen/cuda/CUDAContext.h: that header needs the cuBLAS /
// cuSPARSE headers, which a plain CUDA toolkit does not ship).
int device_arch(const at::Device& device) {
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index()));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index()));
  return major * 10 + minor;
}

}  // namespace

// The chain binding: token level (kBlock = false) or block verification, which runs the token-level
// pipeline for deterministic drafts (no valid verifier beats it there).
template <bool kBlock>
std::tuple<at::Tensor, at::Tensor> chain_op_cuda(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const at::Tensor& cu_num_draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const at::Tensor& seed, const at::Tensor& position, int64_t max_draft_len,
    const std::optional<at::Tensor>& row_threshold) {
  const at::Device device = target_logits.device();
  TORCH_CHECK_VALUE(device.is_cuda(), "target_logits must be a CUDA tensor, got ", device);
  const int64_t vocab = checks::logits(target_logits);
  const c10::cuda::CUDAGuard guard(device);
  checks::tensor(draft_token_ids, "draft_token_ids", at::kLong, 1, device);
  checks::tensor(cu_num_draft_tokens, "cu_num_draft_tokens", at::kLong, 1, device);
  const int64_t num_reqs = cu_num_draft_tokens.numel() - 1;
  TORCH_CHECK_VALUE(num_reqs >= 0, "cu_num_draft_tokens must have B + 1 >= 1 entries");
  TORCH_CHECK_VALUE(target_logits.size(0) == draft_token_ids.numel() + num_reqs, "target_logits must have T + B = ",
                    draft_token_ids.numel(), " + ", num_reqs, " rows, got ", target_logits.size(0));
  checks::width(max_draft_len, "max_draft_len");
  CudaChainArgs a{};
  a.logits = target_logits.data_ptr();
  a.logits_dtype = checks::float_dtype(target_logits, "target_logits");
  a.vocab = vocab;
  a.num_rows = target_logits.size(0);
  a.draft_ids = draft_token_ids.data_ptr<int64_t>();
  a.cu = cu_num_draft_tokens.data_ptr<int64_t>();  // values unchecked (no host sync): the kernels clamp
  a.num_reqs = num_reqs;
  checks::sampling_args(a, draft_probs, draft_token_ids.numel(), "[T, V]", vocab, num_reqs, temperature, top_k, top_p,
                       seed, position, device);
  const auto opts = target_logits.options().dtype(at::kInt);
  at::Tensor out = at::full({num_reqs, max_draft_len + 1}, -1, opts);
  at::Tensor accepted = at::zeros({num_reqs}, opts);
  a.out_width = max_draft_len + 1;
  a.out_tokens = out.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  a.row_threshold = checks::row_threshold(row_threshold, a.num_rows, device);
  if (num_reqs == 0) return {out, accepted};
  const int arch = device_arch(device);
  if (kBlock && a.draft_probs != nullptr) {
    at::Tensor workspace = at::empty({static_cast<int64_t>(cuda::chain_block_workspace_bytes(num_reqs, a.vocab))},
                                     target_logits.options().dtype(at::kByte));
    cuda::launch_verify_chain_block(a, arch, workspace.data_ptr(),
                                    static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {out, accepted};
  }
  const int64_t slices = cuda::chain_slices(arch, a.vocab, a.logits_dtype);
  at::Tensor workspace = at::empty({static_cast<int64_t>(cuda::chain_workspace_bytes(a.num_rows, slices))},
                                   target_logits.options().dtype(at::kByte));
  cuda::launch_verify_chain(a, arch, workspace.data_ptr(), static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, accepted};
}

// The tree binding: token level (kTraversal = false) or traversal verification, which runs the token-level
// walk for deterministic trees.
template <bool kTraversal>
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_op_cuda(
    const at::Tensor& target_logits, const at::Tensor& node_token_ids, const at::Tensor& parent,
    const at::Tensor& cu_num_nodes, const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p, const at::Tensor& seed,
    const at::Tensor& position, c10::string_view sibling_sampling, int64_t max_depth,
    const std::optional<at::Tensor>& row_threshold) {
  const at::Device device = target_logits.device();
  TORCH_CHECK_VALUE(device.is_cuda(), "target_logits must be a CUDA tensor, got ", device);
  const int64_t vocab = checks::logits(target_logits);
  const c10::cuda::CUDAGuard guard(device);
  checks::tensor(node_token_ids, "node_token_ids", at::kLong, 1, device);
  checks::tensor(parent, "parent", at::kLong, 1, device);
  checks::tensor(cu_num_nodes, "cu_num_nodes", at::kLong, 1, device);
  const int64_t num_nodes = target_logits.size(0);
  TORCH_CHECK_VALUE(node_token_ids.numel() == num_nodes && parent.numel() == num_nodes,
                    "node_token_ids and parent must have one entry per row of target_logits (N = ", num_nodes,
                    "), got ", node_token_ids.numel(), " and ", parent.numel());
  TORCH_CHECK_VALUE(sibling_sampling == "iid" || sibling_sampling == "without_replacement",
                    "sibling_sampling must be 'iid' or 'without_replacement', got '", sibling_sampling, "'");
  checks::width(max_depth, "max_depth");
  const int64_t num_reqs = cu_num_nodes.numel() - 1;
  TORCH_CHECK_VALUE(num_reqs >= 0, "cu_num_nodes must have B + 1 >= 1 entries");
  CudaTreeArgs a{};
  a.logits = target_logits.data_ptr();
  a.logits_dtype = checks::float_dtype(target_logits, "target_logits");
  a.vocab = vocab;
  a.num_nodes = num_nodes;
  a.node_token_ids = node_token_ids.data_ptr<int64_t>();
  a.parent = parent.data_ptr<int64_t>();
  a.cu = cu_num_nodes.data_ptr<int64_t>();  // values unchecked (no host sync): the kernel clamps
  a.num_reqs = num_reqs;
  checks::sampling_args(a, draft_probs, num_nodes, "[N, V]", vocab, num_reqs, temperature, top_k, top_p, seed,
                       position, device);
  a.without_replacement = sibling_sampling == "without_replacement";
  a.max_depth = max_depth;
  const auto opts = target_logits.options().dtype(at::kInt);
  at::Tensor out = at::full({num_reqs, max_depth + 1}, -1, opts);
  at::Tensor nodes = at::full({num_reqs, max_depth + 1}, -1, opts);
  at::Tensor accepted = at::zeros({num_reqs}, opts);
  a.out_tokens = out.data_ptr<int32_t>();
  a.accepted_nodes = nodes.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  a.row_threshold = checks::row_threshold(row_threshold, num_nodes, device);
  if (num_reqs == 0) return {out, nodes, accepted};
  if (kTraversal && a.draft_probs != nullptr) {
    const size_t bytes = cuda::tree_traversal_workspace_bytes(num_reqs, max_depth + 1, a.vocab, a.without_replacement);
    at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, target_logits.options().dtype(at::kByte));
    cuda::launch_verify_tree_traversal(a, device_arch(device), workspace.data_ptr(),
                                       static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {out, nodes, accepted};
  }
  const size_t ws_bytes = cuda::tree_workspace_bytes(num_reqs, a.vocab, a.draft_probs != nullptr);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes > 0 ? ws_bytes : 4)},
                                   target_logits.options().dtype(at::kByte));
  cuda::launch_verify_tree(a, device_arch(device), workspace.data_ptr(), static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, nodes, accepted};
}

}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("verify_chain", &specdec::chain_op_cuda<false>);
  m.impl("verify_tree", &specdec::tree_op_cuda<false>);
  m.impl("verify_chain_block", &specdec::chain_op_cuda<true>);
  m.impl("verify_tree_traversal", &specdec::tree_op_cuda<true>);
}
