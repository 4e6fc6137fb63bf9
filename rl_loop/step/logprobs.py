"""Log-probabilities of sequences under a policy (the trainer's side of GRPO)."""

from __future__ import annotations

import torch

from specdec_kernels.models import Qwen3

from . import grpo
from .rollouts import RolloutMask


def policy_log_probs(policy: Qwen3, ids: torch.Tensor, temperature: float = 1.0,
                     kept: torch.Tensor | None = None) -> torch.Tensor:
    """[N, T - 1] log-probability of each next token under the policy at ``temperature`` (> 0).

    The trainer scores rollouts under the same tempered distribution they were sampled from, so the
    GRPO ratio is on-policy for the rollout temperature. ``kept`` [N, T - 1, V] bool (:func:`kept_batch`):
    restrict each row's log-softmax to the ids the sampler kept there (``--mask-logprobs``). On the policy's
    device (``ids`` moved there).
    """
    ids = ids.to(next(policy.parameters()).device)
    logits, _ = policy(ids)
    return grpo.token_log_probs(logits[:, :-1] / temperature, ids[:, 1:], kept)


def kept_batch(prompts: list[list[int]], masks: list[RolloutMask], width: int, vocab_size: int) -> torch.Tensor:
    """[N, width, V] bool kept sets laid out as ``batch.build_batch``'s mask [N, width]: row ``len(prompt) - 1 + t``
    (whose logits predict response token t, then the EOS) keeps ``masks[i]``'s token t; every other row keeps
    the whole vocabulary (the loss mask drops those rows)."""
    kept = torch.ones(len(prompts), width, vocab_size, dtype=torch.bool)
    for i, (prompt, mask) in enumerate(zip(prompts, masks, strict=True)):
        n = mask.indptr.numel() - 1
        rows = torch.repeat_interleave(torch.arange(n) + len(prompt) - 1, mask.indptr.diff())
        kept[i, len(prompt) - 1:len(prompt) - 1 + n] = False
        kept[i, rows, mask.indices.long()] = True
    return kept
