// specdec_kernels._C: registers the specdec:: torch.library ops (CPU kernels always; CUDA kernels
// when built with them) and exposes Python entry points with the reference backends' signatures.
#include <pybind11/pybind11.h>
#include <torch/extension.h>
#include <torch/library.h>

#include "cpu/cpu_kernels.h"
#include "ops.h"

namespace py = pybind11;

namespace specdec {
// csrc/cpu/decoder_step_cpu.cpp
std::tuple<at::Tensor, at::Tensor> decoder_step_cpu(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                                     at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& rows,
                                                     const at::Tensor& start, const at::Tensor& depth,
                                                     const at::Tensor& rope, int64_t num_heads, double eps,
                                                     const std::optional<at::Tensor>& qkv_add);
// csrc/cpu/philox_rows_cpu.cpp
at::Tensor philox_uniform_rows_cpu(const at::Tensor& seed, const at::Tensor& position, int64_t stream,
                                   int64_t vocab);
// csrc/cpu/stream_read_cpu.cpp
double stream_sum_cpu(const at::Tensor& x);
double stream_work_cpu(const at::Tensor& x, int64_t rounds);
std::tuple<int64_t, int64_t> stream_minmax16_cpu(const at::Tensor& x);
}  // namespace specdec

TORCH_LIBRARY(specdec, m) {
  m.def(specdec::kVerifyChainSchema);
  m.def(specdec::kVerifyTreeSchema);
  m.def(specdec::kVerifyChainBlockSchema);
  m.def(specdec::kVerifyTreeTraversalSchema);
}

// The verifiers' outputs are integer tensors, which carry no gradient: autograd passes the ops straight to
// their device kernels. Without this, every call ran torch's autograd fallback for ops that register no
// autograd kernel (it scans the inputs for requires_grad around a redispatch): ~10 us of a call from cold
// caches.
TORCH_LIBRARY_IMPL(specdec, Autograd, m) {
  for (const char* op : {"verify_chain", "verify_tree", "verify_chain_block", "verify_tree_traversal"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}

namespace {

constexpr char kChainOp[] = "specdec::verify_chain";
constexpr char kChainBlockOp[] = "specdec::verify_chain_block";
constexpr char kTreeOp[] = "specdec::verify_tree";
constexpr char kTreeTraversalOp[] = "specdec::verify_tree_traversal";

// An instance of the NamedTuple class `type` holding `items`, made as its own _make does (tuple.__new__):
// calling the class runs its Python-level __new__, ~9 us of a call from cold caches.
py::object named_tuple(const py::handle& type, const py::tuple& items) {
  const py::tuple args = py::make_tuple(items);
  PyObject* made = PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(type.ptr()), args.ptr(), nullptr);
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(made);
}

// Calls the op through the dispatcher (so every registered device works) and wraps the outputs in the
// reference's result NamedTuple.
template <const char* kOp>
py::object verify_chain(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                        const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& draft_probs,
                        const at::Tensor& temperature, const std::optional<at::Tensor>& top_k,
                        const std::optional<at::Tensor>& top_p, const at::Tensor& seed, const at::Tensor& position,
                        int64_t max_draft_len, const std::optional<at::Tensor>& row_threshold) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(kOp, "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                           const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           const at::Tensor&, const at::Tensor&, int64_t, const std::optional<at::Tensor>&)>();
  std::tuple<at::Tensor, at::Tensor> res;
  {
    py::gil_scoped_release release;
    res = op.call(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p, seed,
                  position, max_draft_len, row_threshold);
  }
  // Looked up once (a module import and an attribute per call cost ~10 us when the caches are cold); the
  // reference is kept for the life of the process.
  static const py::handle result_type =
      py::object(py::module_::import("specdec_kernels.reference.chain").attr("ChainResult")).release();
  return named_tuple(result_type, py::make_tuple(std::get<0>(res), std::get<1>(res)));
}

template <const char* kOp>
py::object verify_tree(const at::Tensor& target_logits, const at::Tensor& node_token_ids, const at::Tensor& parent,
                       const at::Tensor& cu_num_nodes, const std::optional<at::Tensor>& draft_probs,
                       const at::Tensor& temperature, const std::optional<at::Tensor>& top_k,
                       const std::optional<at::Tensor>& top_p, const at::Tensor& seed, const at::Tensor& position,
                       const std::string& sibling_sampling, int64_t max_depth,
                       const std::optional<at::Tensor>& row_threshold) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(kOp, "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, const at::Tensor&, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, c10::string_view,
                           int64_t, const std::optional<at::Tensor>&)>();
  std::tuple<at::Tensor, at::Tensor, at::Tensor> res;
  {
    py::gil_scoped_release release;
    res = op.call(target_logits, node_token_ids, parent, cu_num_nodes, draft_probs, temperature, top_k, top_p, seed,
                  position, sibling_sampling, max_depth, row_threshold);
  }
  static const py::handle result_type =
      py::object(py::module_::import("specdec_kernels.reference.tree").attr("TreeResult")).release();
  return named_tuple(result_type, py::make_tuple(std::get<0>(res), std::get<1>(res), std::get<2>(res)));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "specdec-kernels native kernels (torch.ops.specdec.*)";
#if defined(SPECDEC_WITH_CUDA)
  m.attr("DEVICES") = py::make_tuple("cpu", "cuda");
#else
  m.attr("DEVICES") = py::make_tuple("cpu");
#endif
  m.attr("CPU_ISA") = specdec::cpu::isa_name();
  m.attr("CPU_ISA_MESSAGE") = specdec::cpu::isa_message();
  const char* doc =
      "Chain verification on validated, normalised inputs (see specdec_kernels.verify_chain); same "
      "signature and result as specdec_kernels.reference.chain.verify_chain.";
  const char* tree_doc =
      "Tree verification on validated, normalised inputs (see specdec_kernels.verify_tree); same "
      "signature and result as specdec_kernels.reference.tree.verify_tree.";
  m.def("verify_tree_cpu", &verify_tree<kTreeOp>, tree_doc, py::arg("target_logits_"), py::arg("node_token_ids"),
        py::arg("parent"), py::arg("cu_num_nodes"), py::arg("draft_probs"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("position"), py::arg("sibling_sampling"),
        py::arg("max_depth"), py::arg("row_threshold") = py::none());
  m.def("verify_chain_cpu", &verify_chain<kChainOp>, doc, py::arg("target_logits_"), py::arg("draft_token_ids"),
        py::arg("cu_num_draft_tokens"), py::arg("draft_probs"), py::arg("temperature"), py::arg("top_k"),
        py::arg("top_p"), py::arg("seed"), py::arg("position"), py::arg("max_draft_len"), py::arg("row_threshold") = py::none());
  const char* block_doc =
      "Block verification of chains on validated, normalised inputs (see specdec_kernels.verify_chain, "
      "method='block'); same signature and result as specdec_kernels.reference.block.verify_chain_block.";
  const char* traversal_doc =
      "Traversal verification of trees on validated, normalised inputs (see specdec_kernels.verify_tree, "
      "method='traversal'); same signature and result as "
      "specdec_kernels.reference.traversal.verify_tree_traversal.";
  m.def("verify_chain_block_cpu", &verify_chain<kChainBlockOp>, block_doc, py::arg("target_logits_"),
        py::arg("draft_token_ids"), py::arg("cu_num_draft_tokens"), py::arg("draft_probs"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("position"), py::arg("max_draft_len"), py::arg("row_threshold") = py::none());
  m.def("verify_tree_traversal_cpu", &verify_tree<kTreeTraversalOp>, traversal_doc, py::arg("target_logits_"),
        py::arg("node_token_ids"), py::arg("parent"), py::arg("cu_num_nodes"), py::arg("draft_probs"),
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("position"),
        py::arg("sibling_sampling"), py::arg("max_depth"), py::arg("row_threshold") = py::none());
  m.def(
      "decoder_step_cpu",
      [](const at::Tensor& x, const std::vector<at::Tensor>& weights, at::Tensor k_cache, at::Tensor v_cache,
         const at::Tensor& rows, const at::Tensor& start, const at::Tensor& depth, const at::Tensor& rope,
         int64_t num_heads, double eps, const std::optional<at::Tensor>& qkv_add) {
        py::gil_scoped_release release;
        return specdec::decoder_step_cpu(x, weights, k_cache, v_cache, rows, start, depth, rope, num_heads, eps,
                                         qkv_add);
      },
      "One Qwen3 decoder layer + final norm + LM head over x [R, n, H] against a KV cache (see "
      "specdec_kernels.native.decoder_step); returns (logits [R, n, V], hidden [R, n, H]).",
      py::arg("x"), py::arg("weights"), py::arg("k_cache"), py::arg("v_cache"), py::arg("rows"), py::arg("start"),
      py::arg("depth"), py::arg("rope"), py::arg("num_heads"), py::arg("eps"), py::arg("qkv_add") = py::none());
  m.def(
      "philox_uniform_rows_cpu",
      [](const at::Tensor& seed, const at::Tensor& position, int64_t stream, int64_t vocab) {
        py::gil_scoped_release release;
        return specdec::philox_uniform_rows_cpu(seed, position, stream, vocab);
      },
      "Philox uniforms [R, V] of rows (seed [R], position [R]) on one stream (see "
      "specdec_kernels.reference.philox.uniform_rows).",
      py::arg("seed"), py::arg("position"), py::arg("stream"), py::arg("vocab"));
  m.def(
      "stream_sum_cpu",
      [](const at::Tensor& x) {
        py::gil_scoped_release release;
        return specdec::stream_sum_cpu(x);
      },
      "The sum of a contiguous float32 CPU tensor, read as the verification passes read (see "
      "specdec_kernels.native.stream_sum): the read-bandwidth probe of the CPU benchmarks.",
      py::arg("x"));
  m.def(
      "stream_work_cpu",
      [](const at::Tensor& x, int64_t rounds) {
        py::gil_scoped_release release;
        return specdec::stream_work_cpu(x, rounds);
      },
      "stream_sum_cpu with `rounds` dependent multiply-adds on every loaded vector (see "
      "specdec_kernels.native.stream_work): the stream-compute probe of the CPU benchmarks.",
      py::arg("x"), py::arg("rounds"));
  m.def(
      "stream_minmax16_cpu",
      [](const at::Tensor& x) {
        py::gil_scoped_release release;
        return specdec::stream_minmax16_cpu(x);
      },
      "The largest and smallest 16-bit integer of a contiguous CPU tensor's bytes, read by the 16-bit greedy "
      "pass's loop (see specdec_kernels.native.stream_minmax16): the integer read probe of the CPU benchmarks.",
      py::arg("x"));
#if defined(SPECDEC_WITH_CUDA)
  m.def("verify_chain_cuda", &verify_chain<kChainOp>, doc, py::arg("target_logits_"), py::arg("draft_token_ids"),
        py::arg("cu_num_draft_tokens"), py::arg("draft_probs"), py::arg("temperature"), py::arg("top_k"),
        py::arg("top_p"), py::arg("seed"), py::arg("position"), py::arg("max_draft_len"), py::arg("row_threshold") = py::none());
  m.def("verify_tree_cuda", &verify_tree<kTreeOp>, tree_doc, py::arg("target_logits_"), py::arg("node_token_ids"),
        py::arg("parent"), py::arg("cu_num_nodes"), py::arg("draft_probs"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("position"), py::arg("sibling_sampling"),
        py::arg("max_depth"), py::arg("row_threshold") = py::none());
  m.def("verify_chain_block_cuda", &verify_chain<kChainBlockOp>, block_doc, py::arg("target_logits_"),
        py::arg("draft_token_ids"), py::arg("cu_num_draft_tokens"), py::arg("draft_probs"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("position"), py::arg("max_draft_len"), py::arg("row_threshold") = py::none());
  m.def("verify_tree_traversal_cuda", &verify_tree<kTreeTraversalOp>, traversal_doc, py::arg("target_logits_"),
        py::arg("node_token_ids"), py::arg("parent"), py::arg("cu_num_nodes"), py::arg("draft_probs"),
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("position"),
        py::arg("sibling_sampling"), py::arg("max_depth"), py::arg("row_threshold") = py::none());
#endif
}
