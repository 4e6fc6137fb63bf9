// The block and traversal launchers and kernels of csrc/cuda/, compiled for the host emulation.
#include "../cuda/block_traversal_cuda.cu"
