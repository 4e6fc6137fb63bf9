// The kernel-calling half of our FlashInfer extension (the torch binding is flashinfer_chain.cpp), for the
// benchmark (benchmarks/gpu/flashinfer_ext.py builds it on the device against the headers that
// `python -m benchmarks.gpu.prepare` put into .cache/peers/flashinfer/include).
//
// The two launches are the ones FlashInfer's own binding makes (csrc/sampling.cu `softmax` and
// `chain_speculative_sampling`, called from flashinfer/sampling.py): OnlineSoftmax<float> over float32
// logits with a per-row temperature array and a 1 MiB workspace, then ChainSpeculativeSampling<float, int>
// over float32 draft / target probabilities and int32 draft ids. Our binding only checks shapes and
// launches on the current stream (FlashInfer's layering: kernels in sampling.cuh, a thin binding, Python on
// top); the random stream is FlashInfer's Philox keyed by (seed, offset), given per request as int64 tensors
// so the call holds no host sync (FlashInfer's seed_arr / offset_arr path).
#include <flashinfer/sampling.cuh>

#include "flashinfer_chain.h"

namespace specdec_bench {

cudaError_t flashinfer_softmax(float* logits, float* probs, uint32_t rows, uint32_t vocab, float* temperature,
                               void* workspace, size_t workspace_bytes, bool enable_pdl, cudaStream_t stream) {
  return flashinfer::sampling::OnlineSoftmax<float>(logits, probs, rows, vocab, temperature, 1.0f, workspace,
                                                    workspace_bytes, enable_pdl, stream);
}

cudaError_t flashinfer_chain(float* draft_probs, int* draft_token_ids, float* target_probs, int* output_token_ids,
                             int* accepted, int* emitted, uint32_t batch, uint32_t num_drafts, uint32_t vocab,
                             bool deterministic, uint64_t* seed, uint64_t* offset, uint32_t key_stride,
                             cudaStream_t stream) {
  return flashinfer::sampling::ChainSpeculativeSampling<float, int>(
      draft_probs, draft_token_ids, target_probs, output_token_ids, accepted, emitted, batch, num_drafts, vocab,
      deterministic, seed, 0, offset, 0, stream, key_stride, key_stride);
}

}  // namespace specdec_bench
