"""Rollout engines other than rl_loop's own: vLLM with the specdec_kernels plugin, and its serving check."""
