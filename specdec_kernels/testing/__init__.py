"""specdec_kernels.testing."""
