// Launcher of the CUDA tree walk (framework-free: CI compiles this file with nvcc alone).
#include <cuda_runtime.h>

#include "specdec/cuda/tree.cuh"

namespace specdec::cuda {

void launch_verify_tree(const CudaTreeArgs& a, int arch, void* workspace, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.num_reqs == 0) return;
  const int threads = pick_config(arch, a.vocab, a.logits_dtype).threads;
  const unsigned blocks = static_cast<unsigned>(a.num_reqs);
  auto* ws = static_cast<float*>(workspace);
  switch (a.logits_dtype) {
    case DType::kBFloat16: SPECDEC_LAUNCH(dev::tree_walk_kernel<DType::kBFloat16>, blocks, threads, 0, stream)(a, ws); break;
    case DType::kFloat16: SPECDEC_LAUNCH(dev::tree_walk_kernel<DType::kFloat16>, blocks, threads, 0, stream)(a, ws); break;
    default: SPECDEC_LAUNCH(dev::tree_walk_kernel<DType::kFloat32>, blocks, threads, 0, stream)(a, ws); break;
  }
}

}  // namespace specdec::cuda
