// Torch binding of the CPU kernels: argument checks (csrc/checks.h; the Python API validated values
// already), output allocation, launch. Registered as the CPU implementation of the specdec:: ops.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <torch/library.h>

#include <algorithm>

#include "checks.h"
#include "cpu_kernels.h"
#include "ops.h"

namespace specdec {
namespace {

// A new int32 CPU tensor of `sizes` holding `value`: allocated by at::detail::empty_cpu (no trip through the
// dispatcher, as at::empty takes) and filled by a plain loop (at::full / at::zeros go through
// TensorIterator). A verification step finds all that code cold (the step before it streamed the logits, or
// the benchmarks evict the caches): at::full cost ~40 us more per call than at::empty, and at::empty ~9 us
// more for the two outputs than this (2-core VMs).
at::Tensor filled(at::IntArrayRef sizes, int32_t value) {
  at::Tensor t = at::detail::empty_cpu(sizes, at::kInt);
  std::fill_n(t.data_ptr<int32_t>(), t.numel(), value);
  return t;
}

}  // namespace

// The chain binding of one kernel: verify_chain (token level) or verify_chain_block.
template <void (*Kernel)(const ChainArgs&)>
std::tuple<at::Tensor, at::Tensor> chain_op_cpu(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                                                const at::Tensor& cu_num_draft_tokens,
                                                const std::optional<at::Tensor>& draft_probs,
                                                const at::Tensor& temperature, const std::optional<at::Tensor>& top_k,
                                                const std::optional<at::Tensor>& top_p, const at::Tensor& seed,
                                                const at::Tensor& position, int64_t max_draft_len,
                                                const std::optional<at::Tensor>& row_threshold) {
  const at::Device cpu(at::kCPU);
  checks::on_device(target_logits, "target_logits", cpu);
  const int64_t vocab = checks::logits(target_logits);
  const int64_t num_rows = target_logits.size(0);
  checks::tensor(draft_token_ids, "draft_token_ids", at::kLong, 1, cpu);
  checks::tensor(cu_num_draft_tokens, "cu_num_draft_tokens", at::kLong, 1, cpu);
  const int64_t num_reqs = cu_num_draft_tokens.numel() - 1;
  const int64_t num_drafts = draft_token_ids.numel();
  TORCH_CHECK_VALUE(num_reqs >= 0, "cu_num_draft_tokens must have B + 1 >= 1 entries");
  TORCH_CHECK_VALUE(num_rows == num_drafts + num_reqs, "target_logits must have T + B = ", num_drafts, " + ",
                    num_reqs, " rows, got ", num_rows);
  checks::width(max_draft_len, "max_draft_len");
  ChainArgs a{};
  checks::sampling_args(a, draft_probs, num_drafts, "[T, V]", vocab, num_reqs, temperature, top_k, top_p, seed,
                       position, cpu);
  // Memory safety does not depend on validation, and on the host the cu check is free: every chain
  // must lie inside draft_token_ids and fit the output.
  const auto* cu = cu_num_draft_tokens.data_ptr<int64_t>();
  checks::cu_values(cu, num_reqs, num_drafts, "cu_num_draft_tokens", "len(draft_token_ids)");
  for (int64_t b = 0; b < num_reqs; ++b) {
    TORCH_CHECK_VALUE(cu[b + 1] - cu[b] <= max_draft_len, "max_draft_len = ", max_draft_len,
                      " is smaller than the chain of request ", b, " (", cu[b + 1] - cu[b], " draft tokens)");
  }

  a.logits = target_logits.data_ptr();
  a.logits_dtype = checks::float_dtype(target_logits, "target_logits");
  a.vocab = vocab;
  a.draft_ids = draft_token_ids.data_ptr<int64_t>();
  a.cu = cu;
  a.num_reqs = num_reqs;
  at::Tensor out = filled({num_reqs, max_draft_len + 1}, -1);
  at::Tensor accepted = filled({num_reqs}, 0);
  a.out_width = max_draft_len + 1;
  a.out_tokens = out.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  a.row_threshold = checks::row_threshold(row_threshold, num_rows, cpu);
  if (num_reqs > 0) Kernel(a);
  return {out, accepted};
}

// The tree binding of one kernel: verify_tree (token level) or verify_tree_traversal.
template <void (*Kernel)(const TreeArgs&)>
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_op_cpu(
    const at::Tensor& target_logits, const at::Tensor& node_token_ids, const at::Tensor& parent,
    const at::Tensor& cu_num_nodes, const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p, const at::Tensor& seed,
    const at::Tensor& position, c10::string_view sibling_sampling, int64_t max_depth,
    const std::optional<at::Tensor>& row_threshold) {
  const at::Device cpu(at::kCPU);
  checks::on_device(target_logits, "target_logits", cpu);
  const int64_t vocab = checks::logits(target_logits);
  const int64_t num_nodes = target_logits.size(0);
  checks::tensor(node_token_ids, "node_token_ids", at::kLong, 1, cpu);
  checks::tensor(parent, "parent", at::kLong, 1, cpu);
  checks::tensor(cu_num_nodes, "cu_num_nodes", at::kLong, 1, cpu);
  TORCH_CHECK_VALUE(node_token_ids.numel() == num_nodes && parent.numel() == num_nodes,
                    "node_token_ids and parent must have one entry per row of target_logits (N = ", num_nodes,
                    "), got ", node_token_ids.numel(), " and ", parent.numel());
  const int64_t num_reqs = cu_num_nodes.numel() - 1;
  TORCH_CHECK_VALUE(num_reqs >= 0, "cu_num_nodes must have B + 1 >= 1 entries");
  checks::width(max_depth, "max_depth");
  TORCH_CHECK_VALUE(sibling_sampling == "iid" || sibling_sampling == "without_replacement",
                    "sibling_sampling must be 'iid' or 'without_replacement', got '", sibling_sampling, "'");
  TreeArgs a{};
  checks::sampling_args(a, draft_probs, num_nodes, "[N, V]", vocab, num_reqs, temperature, top_k, top_p, seed,
                       position, cpu);
  const auto* cu = cu_num_nodes.data_ptr<int64_t>();
  checks::cu_values(cu, num_reqs, num_nodes, "cu_num_nodes", "the number of nodes N");

  a.logits = target_logits.data_ptr();
  a.logits_dtype = checks::float_dtype(target_logits, "target_logits");
  a.vocab = vocab;
  a.node_token_ids = node_token_ids.data_ptr<int64_t>();
  a.parent = parent.data_ptr<int64_t>();
  a.cu = cu;
  a.num_reqs = num_reqs;
  a.without_replacement = sibling_sampling == "without_replacement";
  a.max_depth = max_depth;
  at::Tensor out = filled({num_reqs, max_depth + 1}, -1);
  at::Tensor nodes = filled({num_reqs, max_depth + 1}, -1);
  at::Tensor accepted = filled({num_reqs}, 0);
  a.out_tokens = out.data_ptr<int32_t>();
  a.accepted_nodes = nodes.data_ptr<int32_t>();
  a.num_accepted = accepted.data_ptr<int32_t>();
  a.row_threshold = checks::row_threshold(row_threshold, num_nodes, cpu);
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
