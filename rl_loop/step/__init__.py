"""One GRPO step's parts: the rollout engine and its round strategies (autoregressive, chain, tree), decode
paths and CUDA graphs, drafters and warm starts, the step's requests and batch, GRPO and its log-probs,
learning and the weight sync with its fingerprint check."""
