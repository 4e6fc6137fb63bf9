"""Log-probabilities of sequences under a policy (the trainer's side of GRPO)."""

from __future__ import annotations

import torch

from specdec_kernels.models import Qwen3

from . import grpo


def policy_log_probs(policy: Qwen3, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[N, T - 1] log-probability of each next token under the policy at ``temperature`` (> 0).

    The trainer scores rollouts under the same tempered distribution they were sampled from, so the
    GRPO ratio is on-policy for the rollout temperature. On the policy's device (``ids`` moved there).
    """
    ids = ids.to(next(policy.parameters()).device)
    logits, _ = policy(ids)
    return grpo.token_log_probs(logits[:, :-1] / temperature, ids[:, 1:])
