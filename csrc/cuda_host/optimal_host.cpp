// The block and traversal launchers and kernels of csrc/cuda/, compiled for the host emulation.
#include "../cuda/optimal_cuda.cu"
