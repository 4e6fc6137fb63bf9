"""GRPO as pure functions: group-normalised advantages, dynamic sampling, clipped token-level loss, k3 KL.

Shapes: ``N`` responses in groups of ``G`` consecutive rows (the G samples of one prompt); token tensors are
``[N, T]`` over response positions with a bool ``mask`` marking real (non-padding) tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """[N] advantages ``(r - mean_group) / (std_group + eps)`` (``scale=False``: mean-centred only).

    ``std`` is the population standard deviation of the group; a group whose rewards are all equal gets
    zero advantages (and is dropped by :func:`dynamic_sampling_mask`).
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)
    centred = r - r.mean(1, keepdim=True)
    if scale:
        centred = centred / (r.std(1, unbiased=False, keepdim=True) + eps)
    return centred.view(-1)


def dynamic_sampling_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] bool: True for responses whose group has at least two distinct rewards (DAPO dynamic sampling)."""
    r = rewards.view(-1, group_size)
    keep = (r != r[:, :1]).any(1)
    return keep.repeat_interleave(group_size)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, kept: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] log-probability of ``targets`` [B, T] under ``logits`` [B, T, V] (float32).

    ``kept`` [B, T, V] bool: the log-softmax is restricted to it (logits outside set to -inf), i.e. the
    log-probability under the truncated distribution the token was sampled from (top-k / top-p); it equals the
    full one minus the log of the kept mass, and is the full one where everything is kept.
    """
    z = logits.float()
    if kept is not None:
        z = z.masked_fill(~kept, float("-inf"))
    return torch.log_softmax(z, -1).gather(-1, targets[..., None]).squeeze(-1)


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): ``exp(ref - lp) - (ref - lp) - 1`` (>= 0, unbiased)."""
    d = ref_log_probs - log_probs
    return torch.exp(d) - d - 1


class LossOutput(NamedTuple):
    loss: torch.Tensor  # scalar
    clip_fraction: torch.Tensor  # fraction of tokens whose ratio was clipped
    mean_ratio: torch.Tensor
    kl: torch.Tensor  # mean k3 KL (0 without a reference)


def grpo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossOutput:
    """Clipped-ratio policy loss averaged over every real token of the batch (token-level, DAPO style).

    ``ratio = exp(lp - old_lp)`` is clipped to ``[1 - clip_low, 1 + clip_high]`` (clip-higher: a wider
    upper range keeps exploration alive); per token ``-min(ratio * A, clip(ratio) * A)``, plus
    ``kl_coef * k3`` when ``ref_log_probs`` is given. Inputs: ``log_probs``, ``old_log_probs``,
    ``ref_log_probs``, ``mask`` [N, T]; ``advantages`` [N] (broadcast over tokens).
    """
    if log_probs.shape != old_log_probs.shape or log_probs.shape != mask.shape:
        raise ValueError("log_probs, old_log_probs and mask must have the same shape")
    if clip_low < 0 or clip_high < 0:
        raise ValueError("clip_low and clip_high must be >= 0")
    m = mask.float()
    denom = m.sum().clamp(min=1.0)
    ratio = torch.exp(log_probs - old_log_probs)
    adv = advantages[:, None].float()
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    kl = torch.zeros((), dtype=log_probs.dtype)
    if ref_log_probs is not None:
        kl_tok = k3_kl(log_probs, ref_log_probs)
        kl = (kl_tok * m).sum() / denom
        per_token = per_token + kl_coef * kl_tok
    loss = (per_token * m).sum() / denom
    with torch.no_grad():
        was_clipped = ((ratio * adv) > (clipped * adv)).float()
        clip_fraction = (was_clipped * m).sum() / denom
        mean_ratio = (ratio * m).sum() / denom
    return LossOutput(loss, clip_fraction, mean_ratio, kl.detach())
