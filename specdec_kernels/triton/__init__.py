"""specdec_kernels.triton."""
