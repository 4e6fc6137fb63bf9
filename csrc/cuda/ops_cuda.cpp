// Torch binding of the CUDA kernels: shape/dtype checks, output and workspace allocation (caching
// allocator, so the ops are CUDA-graph safe: no host syncs, no host-side RNG state), launch on the
// current stream. Registered as the CUDA implementation of the specdec:: ops.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops.h"
#include "specdec/cuda_api.h"

namespace specdec {

DType to_dtype(const at::Tensor& t, const char* name);  // ops_cpu.cpp

namespace {

void check_cuda(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Device& device) {
  TORCH_CHECK(t.device() == device, name, " must be on ", device);
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.is_contiguous(), name, " must be a contiguous 1-D tensor");
}

void check_per_request(const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& position,
                       int64_t num_reqs, const at::Device& device) {
  check_cuda(temperature, "temperature", at::kFloat, device);
  check_cuda(seed, "seed", at::kLong, device);
  check_cuda(position, "position", at::kLong, device);
  TORCH_CHECK(temperature.numel() == num_reqs && seed.numel() == num_reqs && position.numel() == num_reqs,
              "temperature, seed and position must have B entries");
}

// The sampling fields CudaChainArgs and CudaTreeArgs share: draft probs ([probs_rows, V] or none),
// temperature, optional top-k / top-p, seeds and positions.
template <class Args>
void set_sampling_args(Args& a, const std::optional<at::Tensor>& draft_probs, int64_t probs_rows,
                       const char* probs_shape, int64_t num_reqs, const at::Device& device,
                       const at::Tensor& temperature, const std::optional<at::Tensor>& top_k,
                       const std::optional<at::Tensor>& top_p, const at::Tensor& seed, const at::Tensor& position) {
  a.draft_probs = nullptr;
  a.probs_dtype = DType::kFloat32;
  if (draft_probs.has_value()) {
    const at::Tensor& q = *draft_probs;
    TORCH_CHECK(q.device() == device && q.dim() == 2 && q.is_contiguous() && q.size(0) == probs_rows &&
                    q.size(1) == a.vocab,
                "draft_probs must be a contiguous ", probs_shape, " tensor on ", device);
    a.draft_probs = q.data_ptr();
    a.probs_dtype = to_dtype(q, "draft_probs");
  }
  a.temperature = temperature.data_ptr<float>();
  if (top_k.has_value()) {
    check_cuda(*top_k, "top_k", at::kInt, device);
    TORCH_CHECK(top_k->numel() == num_reqs, "top_k must have B entries");
    a.top_k = top_k->data_ptr<int32_t>();
  }
  if (top_p.has_value()) {
    check_cuda(*top_p, "top_p", at::kFloat, device);
    TORCH_CHECK(top_p->numel() == num_reqs, "top_p must have B entries");
    a.top_p = top_p->data_ptr<float>();
  }
  a.seed = seed.data_ptr<int64_t>();
  a.position = position.data_ptr<int64_t>();
}

int device_arch(const at::Device& device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
  return prop->major * 10 + prop->minor;
}

}  // namespace

// The chain binding: token level (kBlock = false) or block verification, which runs the token-level
// pipeline for deterministic drafts (no valid verifier beats it there).
template <bool kBlock>
std::tuple<at::Tensor, at::Tensor> chain_op_cuda(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const at::Tensor& cu_num_draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const at::Tensor& seed, const at::Tensor& position, int64_t max_draft_len) {
  const at::Device device = target_logits.device();
  TORCH_CHECK(device.is_cuda() && target_logits.dim() == 2 && target_logits.is_contiguous(),
              "target_logits must be a contiguous 2-D CUDA tensor");
  const c10::cuda::CUDAGuard guard(device);
  check_cuda(draft_token_ids, "draft_token_ids", at::kLong, device);
  check_cuda(cu_num_draft_tokens, "cu_num_draft_tokens", at::kLong, device);
  const int64_t num_reqs = cu_num_draft_tokens.numel() - 1;
  TORCH_CHECK(num_reqs >= 0, "cu_num_draft_tokens must have B + 1 entries");
  check_per_request(temperature, seed, position, num_reqs, device);
  TORCH_CHECK(target_logits.size(0) == draft_token_ids.numel() + num_reqs, "target_logits must have T + B rows");
  TORCH_CHECK(max_draft_len >= 0, "max_draft_len must be >= 0");
  CudaChainArgs a{};
  a.logits = target_logits.data_ptr();
  a.logits_dtype = to_dtype(target_logits, "target_logits");
  a.vocab = target_logits.size(1);
  a.num_rows = target_logits.size(0);
  a.draft_ids = draft_token_ids.data_ptr<int64_t>();
  a.cu = cu_num_draft_tokens.data_ptr<int64_t>();
  a.num_reqs = num_reqs;
  set_sampling_args(a, draft_probs, draft_token_ids.numel(), "[T, V]", num_reqs, device, temperature, top_k, top_p,
                    seed, position);
  const auto opts = target_logits.options().dtype(at::kInt);
  at::Tensor out = at::full({num_reqs, max_draft_len + 1}, -1, opts);
  at::Tensor accepted = at::zeros({num_reqs}, opts);
  a.out_width = max_draft_len + 1;
  a.out_tokens = out.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  if (num_reqs == 0) return {out, accepted};
  const int arch = device_arch(device);
  if (kBlock && a.draft_probs != nullptr) {
    at::Tensor workspace = at::empty({static_cast<int64_t>(cuda::chain_block_workspace_bytes(num_reqs, a.vocab))},
                                     target_logits.options().dtype(at::kByte));
    cuda::launch_verify_chain_block(a, arch, workspace.data_ptr(),
                                    static_cast<void*>(at::cuda::getCurrentCUDAStream().stream()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {out, accepted};
  }
  const int64_t slices = cuda::chain_slices(arch, a.vocab, a.logits_dtype);
  at::Tensor workspace = at::empty({static_cast<int64_t>(cuda::chain_workspace_bytes(a.num_rows, slices))},
                                   target_logits.options().dtype(at::kByte));
  cuda::launch_verify_chain(a, arch, workspace.data_ptr(), static_cast<void*>(at::cuda::getCurrentCUDAStream().stream()));
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
    const at::Tensor& position, c10::string_view sibling_sampling, int64_t max_depth) {
  const at::Device device = target_logits.device();
  TORCH_CHECK(device.is_cuda() && target_logits.dim() == 2 && target_logits.is_contiguous(),
              "target_logits must be a contiguous 2-D CUDA tensor");
  const c10::cuda::CUDAGuard guard(device);
  check_cuda(node_token_ids, "node_token_ids", at::kLong, device);
  check_cuda(parent, "parent", at::kLong, device);
  check_cuda(cu_num_nodes, "cu_num_nodes", at::kLong, device);
  TORCH_CHECK(sibling_sampling == "iid" || sibling_sampling == "without_replacement",
              "sibling_sampling must be 'iid' or 'without_replacement'");
  TORCH_CHECK(max_depth >= 0, "max_depth must be >= 0");
  const int64_t num_reqs = cu_num_nodes.numel() - 1;
  TORCH_CHECK(num_reqs >= 0, "cu_num_nodes must have B + 1 entries");
  check_per_request(temperature, seed, position, num_reqs, device);
  CudaTreeArgs a{};
  a.logits = target_logits.data_ptr();
  a.logits_dtype = to_dtype(target_logits, "target_logits");
  a.vocab = target_logits.size(1);
  a.node_token_ids = node_token_ids.data_ptr<int64_t>();
  a.parent = parent.data_ptr<int64_t>();
  a.cu = cu_num_nodes.data_ptr<int64_t>();
  a.num_reqs = num_reqs;
  set_sampling_args(a, draft_probs, target_logits.size(0), "[N, V]", num_reqs, device, temperature, top_k, top_p,
                    seed, position);
  a.without_replacement = sibling_sampling == "without_replacement";
  a.max_depth = max_depth;
  const auto opts = target_logits.options().dtype(at::kInt);
  at::Tensor out = at::full({num_reqs, max_depth + 1}, -1, opts);
  at::Tensor nodes = at::full({num_reqs, max_depth + 1}, -1, opts);
  at::Tensor accepted = at::zeros({num_reqs}, opts);
  a.out_tokens = out.data_ptr<int32_t>();
  a.accepted_nodes = nodes.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  if (num_reqs == 0) return {out, nodes, accepted};
  if (kTraversal && a.draft_probs != nullptr) {
    const size_t bytes = cuda::tree_traversal_workspace_bytes(num_reqs, max_depth + 1, a.vocab, a.without_replacement);
    at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, target_logits.options().dtype(at::kByte));
    cuda::launch_verify_tree_traversal(a, device_arch(device), workspace.data_ptr(),
                                       static_cast<void*>(at::cuda::getCurrentCUDAStream().stream()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {out, nodes, accepted};
  }
  const size_t ws_bytes = cuda::tree_workspace_bytes(num_reqs, a.vocab, a.draft_probs != nullptr);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes > 0 ? ws_bytes : 4)},
                                   target_logits.options().dtype(at::kByte));
  cuda::launch_verify_tree(a, device_arch(device), workspace.data_ptr(), static_cast<void*>(at::cuda::getCurrentCUDAStream().stream()));
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
