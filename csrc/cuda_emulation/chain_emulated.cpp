// The chain launchers and kernels of csrc/cuda/, compiled for the host emulation.
#include "../cuda/chain_cuda.cu"
