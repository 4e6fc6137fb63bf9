"""specdec_kernels.integrations."""
