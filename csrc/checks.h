// Argument checks shared by the CPU and CUDA bindings of the specdec:: ops and by the decoder step
// (STYLE.md "One check, two bindings"). Shape, device and range errors raise ValueError, dtype errors
// TypeError (TORCH_CHECK_VALUE / TORCH_CHECK_TYPE), and every message names the argument.
//
// The bindings check shapes, dtypes and devices; the Python API (specdec_kernels/api.py) checks values.
// The one value check a binding makes is the one memory safety needs and the host can make for free:
// `cu_values` on a host-resident cu (CPU tensors); device kernels clamp instead.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "specdec/core/common.h"

namespace specdec::checks {

inline constexpr int64_t kMaxVocab = int64_t{1} << 30;         // reference/philox.py MAX_VOCAB
inline constexpr int64_t kMaxPosition = (int64_t{1} << 31) - 1;  // reference/philox.py MAX_POSITION

// The DType of a float tensor (logits, draft probabilities).
inline DType float_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    default: TORCH_CHECK_TYPE(false, name, " must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

// t lives on `device` (ValueError).
inline void on_device(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK_VALUE(t.device() == device, name, " must be on ", device, ", got ", t.device());
}

// A contiguous `dim`-D tensor of `dtype` on `device`.
inline void tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim, const at::Device& device) {
  on_device(t, name, device);
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must be ", dim, "-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

// target_logits: a contiguous 2-D float tensor with a vocabulary in [1, kMaxVocab]; returns V.
inline int64_t logits(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() == 2, "target_logits must be 2-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), "target_logits must be contiguous");
  float_dtype(t, "target_logits");
  const int64_t vocab = t.size(1);
  TORCH_CHECK_VALUE(vocab >= 1 && vocab <= kMaxVocab, "target_logits must have a vocabulary size in [1, ",
                    kMaxVocab, "], got ", vocab);
  return vocab;
}

// A per-request 1-D tensor with num_reqs entries.
inline void per_request(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t num_reqs,
                        const at::Device& device) {
  tensor(t, name, dtype, 1, device);
  TORCH_CHECK_VALUE(t.numel() == num_reqs, name, " must have one entry per request (B = ", num_reqs, "), got ",
                    t.numel());
}

// An output width argument (max_draft_len, max_depth): 0 <= value <= kMaxPosition.
inline void width(int64_t value, const char* name) {
  TORCH_CHECK_VALUE(value >= 0 && value <= kMaxPosition, name, " must be in [0, ", kMaxPosition, "], got ", value);
}

// Host-resident cumulative counts cu [B + 1] of `what` (T draft tokens or N nodes): cu[0] = 0,
// non-decreasing, cu[B] = total. Compares entries (no differences, so no int64 overflow).
inline void cu_values(const int64_t* cu, int64_t num_reqs, int64_t total, const char* name, const char* what) {
  TORCH_CHECK_VALUE(cu[0] == 0, name, " must start at 0, got ", cu[0]);
  for (int64_t b = 0; b < num_reqs; ++b) {
    TORCH_CHECK_VALUE(cu[b + 1] >= cu[b], name, " must be non-decreasing, got ", cu[b], " then ", cu[b + 1],
                      " at entry ", b + 1);
  }
  TORCH_CHECK_VALUE(cu[num_reqs] == total, name, "[-1] must equal ", what, " = ", total, ", got ", cu[num_reqs]);
}

// The optional row_threshold output (ops.h): a contiguous float32 [num_rows] tensor on `device`; its data,
// or nullptr when absent.
inline float* row_threshold(const std::optional<at::Tensor>& t, int64_t num_rows, const at::Device& device) {
  if (!t.has_value()) return nullptr;
  tensor(*t, "row_threshold", at::kFloat, 1, device);
  TORCH_CHECK_VALUE(t->numel() == num_rows, "row_threshold must have one entry per row of target_logits (",
                    num_rows, "), got ", t->numel());
  return t->data_ptr<float>();
}

// The sampling fields that every args struct (ChainArgs, TreeArgs, CudaChainArgs, CudaTreeArgs) shares:
// draft probs ([probs_rows, V] or none), temperature, optional top-k / top-p, seeds and positions.
template <class Args>
void sampling_args(Args& a, const std::optional<at::Tensor>& draft_probs, int64_t probs_rows, const char* probs_shape,
                   int64_t vocab, int64_t num_reqs, const at::Tensor& temperature,
                   const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
                   const at::Tensor& seed, const at::Tensor& position, const at::Device& device) {
  per_request(temperature, "temperature", at::kFloat, num_reqs, device);
  per_request(seed, "seed", at::kLong, num_reqs, device);
  per_request(position, "position", at::kLong, num_reqs, device);
  a.draft_probs = nullptr;
  a.probs_dtype = DType::kFloat32;
  if (draft_probs.has_value()) {
    const at::Tensor& q = *draft_probs;
    on_device(q, "draft_probs", device);
    a.probs_dtype = float_dtype(q, "draft_probs");
    TORCH_CHECK_VALUE(q.dim() == 2 && q.size(0) == probs_rows && q.size(1) == vocab, "draft_probs must have shape ",
                      probs_shape, " = [", probs_rows, ", ", vocab, "], got ", q.sizes());
    TORCH_CHECK_VALUE(q.is_contiguous(), "draft_probs must be contiguous");
    a.draft_probs = q.data_ptr();
  }
  a.temperature = temperature.data_ptr<float>();
  a.top_k = nullptr;
  if (top_k.has_value()) {
    per_request(*top_k, "top_k", at::kInt, num_reqs, device);
    a.top_k = top_k->data_ptr<int32_t>();
  }
  a.top_p = nullptr;
  if (top_p.has_value()) {
    per_request(*top_p, "top_p", at::kFloat, num_reqs, device);
    a.top_p = top_p->data_ptr<float>();
  }
  a.seed = seed.data_ptr<int64_t>();
  a.position = position.data_ptr<int64_t>();
}

}  // namespace specdec::checks
