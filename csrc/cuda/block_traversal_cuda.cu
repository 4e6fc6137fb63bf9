// Launchers of the CUDA block and traversal kernels (framework-free: CI compiles this file with nvcc alone).
#include <cuda_runtime.h>

#include "specdec/cuda/block.cuh"
#include "specdec/cuda/traversal.cuh"

namespace specdec::cuda {

void launch_verify_chain_block(const CudaChainArgs& a, int arch, void* workspace, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.num_reqs == 0) return;
  const int threads = pick_config(arch, a.vocab, a.logits_dtype).threads;
  const unsigned blocks = static_cast<unsigned>(a.num_reqs);
  auto* ws = static_cast<float*>(workspace);
  switch (a.logits_dtype) {
    case DType::kBFloat16: SPECDEC_LAUNCH(dev::chain_block_kernel<DType::kBFloat16>, blocks, threads, 0, stream)(a, ws); break;
    case DType::kFloat16: SPECDEC_LAUNCH(dev::chain_block_kernel<DType::kFloat16>, blocks, threads, 0, stream)(a, ws); break;
    default: SPECDEC_LAUNCH(dev::chain_block_kernel<DType::kFloat32>, blocks, threads, 0, stream)(a, ws); break;
  }
}

void launch_verify_tree_traversal(const CudaTreeArgs& a, int arch, void* workspace, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.num_reqs == 0) return;
  const int threads = pick_config(arch, a.vocab, a.logits_dtype).threads;
  const unsigned blocks = static_cast<unsigned>(a.num_reqs);
  const int64_t width = a.max_depth + 1;
  auto* rows = static_cast<float*>(workspace);
  auto* states = reinterpret_cast<TraversalDepth*>(
      static_cast<char*>(workspace) + tree_traversal_rows_bytes(a.num_reqs, width, a.vocab, a.without_replacement));
  switch (a.logits_dtype) {
    case DType::kBFloat16:
      SPECDEC_LAUNCH(dev::tree_traversal_kernel<DType::kBFloat16>, blocks, threads, 0, stream)(a, rows, states);
      break;
    case DType::kFloat16:
      SPECDEC_LAUNCH(dev::tree_traversal_kernel<DType::kFloat16>, blocks, threads, 0, stream)(a, rows, states);
      break;
    default: SPECDEC_LAUNCH(dev::tree_traversal_kernel<DType::kFloat32>, blocks, threads, 0, stream)(a, rows, states); break;
  }
}

}  // namespace specdec::cuda
