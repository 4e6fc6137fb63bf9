"""specdec_kernels.integrations.vllm."""
