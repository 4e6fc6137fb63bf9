// The two FlashInfer launches our benchmark extension makes, framework-free (flashinfer_chain.cu defines
// them over FlashInfer's sampling.cuh; flashinfer_chain.cpp binds them to torch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace specdec_bench {

// probs [rows, vocab] = softmax(logits [rows, vocab] / temperature [rows]): OnlineSoftmax<float>.
cudaError_t flashinfer_softmax(float* logits, float* probs, uint32_t rows, uint32_t vocab, float* temperature,
                               void* workspace, size_t workspace_bytes, bool enable_pdl, cudaStream_t stream);

// ChainSpeculativeSampling<float, int>; seed / offset: one Philox key per request (key_stride 1) or one
// for all (key_stride 0).
cudaError_t flashinfer_chain(float* draft_probs, int* draft_token_ids, float* target_probs, int* output_token_ids,
                             int* accepted, int* emitted, uint32_t batch, uint32_t num_drafts, uint32_t vocab,
                             bool deterministic, uint64_t* seed, uint64_t* offset, uint32_t key_stride,
                             cudaStream_t stream);

}  // namespace specdec_bench
