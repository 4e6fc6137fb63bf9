// Torch binding of the CPU kernels: shape/dtype checks (the Python API validated values already),
// output allocation, launch. Registered as the CPU implementation of the specdec:: ops.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu_kernels.h"
#include "ops.h"

namespace specdec {

DType to_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    default: TORCH_CHECK_TYPE(false, name, " must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

void check_cpu(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must be ", dim, "-D");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_per_request(const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& position,
                       int64_t num_reqs) {
  check_cpu(temperature, "temperature", at::kFloat, 1);
  check_cpu(seed, "seed", at::kLong, 1);
  check_cpu(position, "position", at::kLong, 1);
  TORCH_CHECK(temperature.numel() == num_reqs && seed.numel() == num_reqs && position.numel() == num_reqs,
              "temperature, seed and position must have B entries");
}

// The sampling fields ChainArgs and TreeArgs share: draft probs ([probs_rows, V] or none), temperature,
// optional top-k / top-p, seeds and positions.
template <class Args>
void set_sampling_args(Args& a, const std::optional<at::Tensor>& draft_probs, int64_t probs_rows,
                       const char* probs_shape, int64_t vocab, int64_t num_reqs, const at::Tensor& temperature,
                       const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
                       const at::Tensor& seed, const at::Tensor& position) {
  a.draft_probs = nullptr;
  a.probs_dtype = DType::kFloat32;
  if (draft_probs.has_value()) {
    const at::Tensor& q = *draft_probs;
    TORCH_CHECK(q.device().is_cpu() && q.dim() == 2 && q.is_contiguous(), "draft_probs must be a contiguous 2-D CPU tensor");
    TORCH_CHECK(q.size(0) == probs_rows && q.size(1) == vocab, "draft_probs must have shape ", probs_shape);
    a.draft_probs = q.data_ptr();
    a.probs_dtype = to_dtype(q, "draft_probs");
  }
  a.temperature = temperature.data_ptr<float>();
  if (top_k.has_value()) {
    check_cpu(*top_k, "top_k", at::kInt, 1);
    TORCH_CHECK(top_k->numel() == num_reqs, "top_k must have B entries");
    a.top_k = top_k->data_ptr<int32_t>();
  }
  if (top_p.has_value()) {
    check_cpu(*top_p, "top_p", at::kFloat, 1);
    TORCH_CHECK(top_p->numel() == num_reqs, "top_p must have B entries");
    a.top_p = top_p->data_ptr<float>();
  }
  a.seed = seed.data_ptr<int64_t>();
  a.position = position.data_ptr<int64_t>();
}

// The chain binding of one kernel: verify_chain (token level) or verify_chain_block.
template <void (*Kernel)(const ChainArgs&)>
std::tuple<at::Tensor, at::Tensor> chain_op_cpu(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                                                const at::Tensor& cu_num_draft_tokens,
                                                const std::optional<at::Tensor>& draft_probs,
                                                const at::Tensor& temperature, const std::optional<at::Tensor>& top_k,
                                                const std::optional<at::Tensor>& top_p, const at::Tensor& seed,
                                                const at::Tensor& position, int64_t max_draft_len) {
  TORCH_CHECK(target_logits.device().is_cpu() && target_logits.dim() == 2 && target_logits.is_contiguous(),
              "target_logits must be a contiguous 2-D CPU tensor");
  const int64_t num_rows = target_logits.size(0), vocab = target_logits.size(1);
  check_cpu(draft_token_ids, "draft_token_ids", at::kLong, 1);
  check_cpu(cu_num_draft_tokens, "cu_num_draft_tokens", at::kLong, 1);
  const int64_t num_reqs = cu_num_draft_tokens.numel() - 1;
  TORCH_CHECK(num_reqs >= 0, "cu_num_draft_tokens must have B + 1 entries");
  TORCH_CHECK(num_rows == draft_token_ids.numel() + num_reqs, "target_logits must have T + B rows");
  check_per_request(temperature, seed, position, num_reqs);
  TORCH_CHECK(max_draft_len >= 0, "max_draft_len must be >= 0");
  const auto* cu = cu_num_draft_tokens.data_ptr<int64_t>();
  // Memory safety does not depend on validation: every chain must fit the output and the rows.
  TORCH_CHECK(num_reqs == 0 || cu[0] == 0, "cu_num_draft_tokens must start at 0");
  for (int64_t b = 0; b < num_reqs; ++b) {
    TORCH_CHECK(cu[b + 1] >= cu[b], "cu_num_draft_tokens must be non-decreasing");
    TORCH_CHECK(cu[b + 1] - cu[b] <= max_draft_len, "max_draft_len is smaller than the longest chain");
  }
  TORCH_CHECK(cu[num_reqs] == draft_token_ids.numel(), "cu_num_draft_tokens[-1] must equal len(draft_token_ids)");

  ChainArgs a{};
  a.logits = target_logits.data_ptr();
  a.logits_dtype = to_dtype(target_logits, "target_logits");
  a.vocab = vocab;
  a.draft_ids = draft_token_ids.data_ptr<int64_t>();
  a.cu = cu;
  a.num_reqs = num_reqs;
  set_sampling_args(a, draft_probs, draft_token_ids.numel(), "[T, V]", vocab, num_reqs, temperature, top_k, top_p,
                    seed, position);
  at::Tensor out = at::full({num_reqs, max_draft_len + 1}, -1, target_logits.options().dtype(at::kInt));
  at::Tensor accepted = at::zeros({num_reqs}, target_logits.options().dtype(at::kInt));
  a.out_width = max_draft_len + 1;
  a.out_tokens = out.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  if (num_reqs > 0) Kernel(a);
  return {out, accepted};
}

// The tree binding of one kernel: verify_tree (token level) or verify_tree_traversal.
template <void (*Kernel)(const TreeArgs&)>
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_op_cpu(
    const at::Tensor& target_logits, const at::Tensor& node_token_ids, const at::Tensor& parent,
    const at::Tensor& cu_num_nodes, const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p, const at::Tensor& seed,
    const at::Tensor& position, c10::string_view sibling_sampling, int64_t max_depth) {
  TORCH_CHECK(target_logits.device().is_cpu() && target_logits.dim() == 2 && target_logits.is_contiguous(),
              "target_logits must be a contiguous 2-D CPU tensor");
  const int64_t num_nodes = target_logits.size(0), vocab = target_logits.size(1);
  check_cpu(node_token_ids, "node_token_ids", at::kLong, 1);
  check_cpu(parent, "parent", at::kLong, 1);
  check_cpu(cu_num_nodes, "cu_num_nodes", at::kLong, 1);
  TORCH_CHECK(node_token_ids.numel() == num_nodes && parent.numel() == num_nodes,
              "node_token_ids and parent must have one entry per row of target_logits");
  const int64_t num_reqs = cu_num_nodes.numel() - 1;
  TORCH_CHECK(num_reqs >= 0, "cu_num_nodes must have B + 1 entries");
  check_per_request(temperature, seed, position, num_reqs);
  TORCH_CHECK(max_depth >= 0, "max_depth must be >= 0");
  TORCH_CHECK(sibling_sampling == "iid" || sibling_sampling == "without_replacement",
              "sibling_sampling must be 'iid' or 'without_replacement'");
  const auto* cu = cu_num_nodes.data_ptr<int64_t>();
  TORCH_CHECK(num_reqs == 0 || cu[0] == 0, "cu_num_nodes must start at 0");
  for (int64_t b = 0; b < num_reqs; ++b) TORCH_CHECK(cu[b + 1] >= cu[b], "cu_num_nodes must be non-decreasing");
  TORCH_CHECK(cu[num_reqs] == num_nodes, "cu_num_nodes[-1] must equal the number of nodes");

  TreeArgs a{};
  a.logits = target_logits.data_ptr();
  a.logits_dtype = to_dtype(target_logits, "target_logits");
  a.vocab = vocab;
  a.node_token_ids = node_token_ids.data_ptr<int64_t>();
  a.parent = parent.data_ptr<int64_t>();
  a.cu = cu;
  a.num_reqs = num_reqs;
  set_sampling_args(a, draft_probs, num_nodes, "[N, V]", vocab, num_reqs, temperature, top_k, top_p, seed,
                    position);
  a.without_replacement = sibling_sampling == "without_replacement";
  a.max_depth = max_depth;
  const auto opts = target_logits.options().dtype(at::kInt);
  at::Tensor out = at::full({num_reqs, max_depth + 1}, -1, opts);
  at::Tensor nodes = at::full({num_reqs, max_depth + 1}, -1, opts);
  at::Tensor accepted = at::zeros({num_reqs}, opts);
  a.out_tokens = out.data_ptr<int32_t>();
  a.accepted_nodes = nodes.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  if (num_reqs > 0) Kernel(a);
  return {out, nodes, accepted};
}

}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("verify_chain", &specdec::chain_op_cpu<specdec::cpu::verify_chain>);
  m.impl("verify_tree", &specdec::tree_op_cpu<specdec::cpu::verify_tree>);
  m.impl("verify_chain_block", &specdec::chain_op_cpu<specdec::cpu::verify_chain_block>);
  m.impl("verify_tree_traversal", &specdec::tree_op_cpu<specdec::cpu::verify_tree_traversal>);
}
