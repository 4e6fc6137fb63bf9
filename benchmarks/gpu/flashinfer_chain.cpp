// The torch binding of our FlashInfer benchmark extension: checks shapes and dtypes, launches on the
// current stream (the launches themselves are in flashinfer_chain.cu, compiled by nvcc; this file by the
// host compiler, so the two build in parallel). Built by benchmarks/gpu/flashinfer_ext.py.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "flashinfer_chain.h"

namespace {

void check_f32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.is_contiguous(), name, " must be a contiguous CUDA tensor");
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must have ", dim, " dimensions, got ", t.dim());
}

void check(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t numel) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.is_contiguous(), name, " must be a contiguous CUDA tensor");
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == numel, name, " must have ", numel, " elements, got ", t.numel());
}

// probs [N, V] = softmax(logits [N, V] / temperature [N]); workspace: CUDA uint8 (FlashInfer uses 1 MiB).
void softmax(const at::Tensor& logits, const at::Tensor& temperature, at::Tensor& probs, at::Tensor& workspace,
             bool enable_pdl) {
  check_f32(logits, "logits", 2);
  check_f32(probs, "probs", 2);
  TORCH_CHECK_VALUE(probs.sizes() == logits.sizes(), "probs must have the shape of logits");
  check(temperature, "temperature", at::kFloat, logits.size(0));
  check(workspace, "workspace", at::kByte, workspace.numel());
  const c10::cuda::CUDAGuard guard(logits.device());
  const cudaError_t status = specdec_bench::flashinfer_softmax(
      logits.data_ptr<float>(), probs.data_ptr<float>(), logits.size(0), logits.size(1),
      temperature.data_ptr<float>(), workspace.data_ptr(), workspace.numel(), enable_pdl,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess, "OnlineSoftmax failed: ", cudaGetErrorString(status));
}

// draft_probs [B, n, V], draft_token_ids [B, n] int32, target_probs [B, n + 1, V] -> output_token_ids
// [B, n + 1] int32 (-1 after the emitted tokens), accepted / emitted [B] int32 (zeroed here: the kernel adds
// to them); seed / offset [B] int64, one Philox key per request.
void chain_speculative_sampling(const at::Tensor& draft_probs, const at::Tensor& draft_token_ids,
                                const at::Tensor& target_probs, at::Tensor& output_token_ids, at::Tensor& accepted,
                                at::Tensor& emitted, const at::Tensor& seed, const at::Tensor& offset,
                                bool deterministic) {
  check_f32(draft_probs, "draft_probs", 3);
  check_f32(target_probs, "target_probs", 3);
  const int64_t b = draft_probs.size(0), n = draft_probs.size(1), v = draft_probs.size(2);
  TORCH_CHECK_VALUE(target_probs.size(0) == b && target_probs.size(1) == n + 1 && target_probs.size(2) == v,
                    "target_probs must be [", b, ", ", n + 1, ", ", v, "], got ", target_probs.sizes());
  check(draft_token_ids, "draft_token_ids", at::kInt, b * n);
  check(output_token_ids, "output_token_ids", at::kInt, b * (n + 1));
  check(accepted, "accepted", at::kInt, b);
  check(emitted, "emitted", at::kInt, b);
  check(seed, "seed", at::kLong, b);
  check(offset, "offset", at::kLong, b);
  const c10::cuda::CUDAGuard guard(draft_probs.device());
  accepted.zero_();
  emitted.zero_();
  const cudaError_t status = specdec_bench::flashinfer_chain(
      draft_probs.data_ptr<float>(), draft_token_ids.data_ptr<int>(), target_probs.data_ptr<float>(),
      output_token_ids.data_ptr<int>(), accepted.data_ptr<int>(), emitted.data_ptr<int>(), b, n, v, deterministic,
      reinterpret_cast<uint64_t*>(seed.data_ptr<int64_t>()), reinterpret_cast<uint64_t*>(offset.data_ptr<int64_t>()),
      b > 1 ? 1 : 0, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess, "ChainSpeculativeSampling failed: ", cudaGetErrorString(status));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("softmax", &softmax, "FlashInfer OnlineSoftmax<float> with a per-row temperature");
  m.def("chain_speculative_sampling", &chain_speculative_sampling, "FlashInfer ChainSpeculativeSampling<float, int>");
}
