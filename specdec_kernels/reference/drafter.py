"""The drafter head's hot operations as readable torch: the spec of the fused kernels of ``triton/drafter.py``.

- :func:`fuse_features`: per-chunk RMSNorm of the captured target features, then ``fc`` (EAGLE-3).
- :func:`logits_topk`: top-k (k = 1: argmax) of draft logits and the log-softmax of the chosen entries,
  ids mapped to target ids through ``d2t``.
- :func:`logits_sample`: temperature, softmax over the draft vocabulary, the q row scattered to the target
  vocabulary, and Gumbel-top-k draws on Philox stream :data:`philox.STREAM_DRAFT`.

``drafters/head_ops.py`` dispatches between these and the Triton kernels; ``head_topk`` / ``head_sample``
there are ``lm_head`` followed by :func:`logits_topk` / :func:`logits_sample`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import philox


class TopK(NamedTuple):
    target_ids: torch.Tensor  # [R, k] int64, by decreasing score (ties: lowest draft id first)
    log_probs: torch.Tensor  # [R, k] float32 log-softmax at temperature 1 over the draft vocabulary


class Sample(NamedTuple):
    target_ids: torch.Tensor  # [R, k] int64 draws without replacement, in draw order
    log_probs: torch.Tensor  # [R, k] float32 log q of the drawn ids
    q: torch.Tensor  # [R, V] float32 draft distribution over the target vocabulary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, returned in ``x``'s dtype (Llama/Qwen3 convention)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf).to(x.dtype)


def fuse_features(features: torch.Tensor, norm_weights: torch.Tensor | None, fc_weight: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """[R, C*Ht] captured features -> [R, H]: RMSNorm each of the C chunks (if ``norm_weights`` [C, Ht]
    is given), concatenate, multiply by ``fc_weight`` [H, C*Ht]. Output in ``fc_weight``'s dtype."""
    x = features.to(fc_weight.dtype)
    if norm_weights is not None:
        chunks = x.chunk(norm_weights.shape[0], dim=-1)
        x = torch.cat([rms_norm(c, w, eps) for c, w in zip(chunks, norm_weights, strict=True)], dim=-1)
    return x @ fc_weight.t()


def logits_topk(logits: torch.Tensor, d2t: torch.Tensor, k: int) -> TopK:
    """Top-``k`` of draft ``logits`` [R, Vd] (as ``drafters.head_ops.head_topk``, from logits already
    computed)."""
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, draft_vocab_size={logits.shape[-1]}], got {k}")
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    vals, idx = _stable_topk(logits, k)
    return TopK(idx + d2t[idx], vals - lse)


def _stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by value, ties broken towards the lowest index (torch.topk leaves ties unspecified)."""
    order = torch.sort(x, dim=-1, descending=True, stable=True)
    return order.values[:, :k], order.indices[:, :k]


def logits_sample(logits: torch.Tensor, d2t: torch.Tensor, vocab_size: int, temperature: torch.Tensor,
                  seed: torch.Tensor, position: torch.Tensor, k: int, uniforms: torch.Tensor | None = None
                  ) -> Sample:
    """Draw ``k`` tokens without replacement from q = softmax(logits / temperature) per row of draft
    ``logits`` [R, Vd] (``drafters.head_ops.head_sample`` documents the arguments). ``uniforms`` [R, V]: the
    rows' stream-3 Philox uniforms when drawn ahead (``drafters.base.draft_uniforms(seed, position, V)``; a
    chain drafts all its positions' noise in one call), else drawn here."""
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, draft_vocab_size={logits.shape[-1]}], got {k}")
    t = temperature.float()
    greedy = t <= 0
    z = logits.float() / torch.where(greedy, torch.ones_like(t), t)[:, None]
    logq = torch.log_softmax(z, dim=-1)
    full = logits.shape[-1] == vocab_size  # the draft vocabulary is the target's: d2t = 0
    u = philox.uniform_rows(seed, position, philox.STREAM_DRAFT, vocab_size) if uniforms is None else uniforms
    if not full:
        u = u[:, torch.arange(logits.shape[-1], device=d2t.device) + d2t]
    noise = -torch.log(-torch.log(u))
    scores = torch.where(greedy[:, None], logq, logq + noise)
    if k == 1:
        idx = scores.argmax(-1, keepdim=True)  # first maximum: ties to the lowest draft id, as the sort
    else:
        _, idx = _stable_topk(scores, k)
    q = torch.exp(logq) if full else scatter_to_target(torch.exp(logq), d2t, vocab_size, 0.0)
    return Sample(idx + d2t[idx], logq.gather(1, idx), q)


def scatter_to_target(draft_values: torch.Tensor, d2t: torch.Tensor, vocab_size: int, fill: float) -> torch.Tensor:
    """[R, Vd] values over the draft vocabulary -> [R, V] over the target vocabulary (``fill`` elsewhere)."""
    out = draft_values.new_full((draft_values.shape[0], vocab_size), fill)
    target_ids = torch.arange(d2t.numel(), device=d2t.device) + d2t
    out[:, target_ids] = draft_values
    return out
