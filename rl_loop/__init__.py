"""GRPO math RL whose rollouts use lossless speculative decoding; ``rl_loop.sim`` projects it to scale."""
