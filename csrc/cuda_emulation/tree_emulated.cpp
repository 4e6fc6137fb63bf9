// The tree launcher and kernel of csrc/cuda/, compiled for the host emulation.
#include "../cuda/tree_cuda.cu"
