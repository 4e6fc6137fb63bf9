"""specdec_kernels.drafters."""
