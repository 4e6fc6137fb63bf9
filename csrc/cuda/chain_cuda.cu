// Launchers of the CUDA chain kernels (framework-free: CI compiles this file with nvcc alone).
#include <cuda_runtime.h>

#include "specdec/cuda/chain.cuh"

namespace specdec::cuda {

int64_t chain_slices(int arch, int64_t vocab, DType dtype) {
  const LaunchConfig cfg = pick_config(arch, vocab, dtype);
  return (vocab + cfg.slice - 1) / cfg.slice;
}

template <DType D>
static void launch_typed(const CudaChainArgs& a, int arch, void* workspace, cudaStream_t stream) {
  const LaunchConfig cfg = pick_config(arch, a.vocab, a.logits_dtype);
  const int64_t slices = (a.vocab + cfg.slice - 1) / cfg.slice;
  auto* partial = static_cast<ChainRowPartial*>(workspace);
  auto* state = reinterpret_cast<ChainRowState*>(partial + a.num_rows * slices);
  cudaMemsetAsync(state, 0, static_cast<size_t>(a.num_rows) * sizeof(ChainRowState), stream);
  const int64_t grid_rows = a.num_rows < kMaxGridY ? a.num_rows : kMaxGridY;
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(grid_rows));
  if (a.top_k != nullptr || a.top_p != nullptr) {
    SPECDEC_LAUNCH(dev::threshold_kernel<D>, static_cast<unsigned>(a.num_rows), kThresholdThreads, 0, stream)(a, state);
  }
  SPECDEC_LAUNCH(dev::row_pass_kernel<D>, grid, cfg.threads, 0, stream)(a, cfg.slice, state, partial);
  const int per = kRowThreads;
  const unsigned row_blocks = static_cast<unsigned>((a.num_rows + per - 1) / per);
  SPECDEC_LAUNCH(dev::decide_kernel<D>, row_blocks, per, 0, stream)(a, slices, partial, state);
  if (a.draft_probs != nullptr) {
    SPECDEC_LAUNCH(dev::residual_kernel<D>, grid, cfg.threads, 0, stream)(a, cfg.slice, state, partial);
    SPECDEC_LAUNCH(dev::residual_combine_kernel<D>, row_blocks, per, 0, stream)(a, slices, partial, state);
  }
  const unsigned req_blocks = static_cast<unsigned>((a.num_reqs + per - 1) / per);
  SPECDEC_LAUNCH(dev::assemble_kernel, req_blocks, per, 0, stream)(a, state);
}

void launch_verify_chain(const CudaChainArgs& a, int arch, void* workspace, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.num_reqs == 0) return;
  switch (a.logits_dtype) {
    case DType::kBFloat16: return launch_typed<DType::kBFloat16>(a, arch, workspace, stream);
    case DType::kFloat16: return launch_typed<DType::kFloat16>(a, arch, workspace, stream);
    default: return launch_typed<DType::kFloat32>(a, arch, workspace, stream);
  }
}

}  // namespace specdec::cuda
