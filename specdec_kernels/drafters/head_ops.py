"""The hot operations of a drafter head, as readable torch (the spec) with Triton dispatch.

- :func:`fuse_features`: per-chunk RMSNorm of the captured target features, then ``fc`` (EAGLE-3).
- :func:`head_topk`: ``lm_head`` over the draft vocabulary, top-k (k = 1: argmax) and the log-softmax of
  the chosen entries, ids mapped to target ids through ``d2t``.
- :func:`head_sample`: ``lm_head``, temperature, softmax over the draft vocabulary, the q row scattered
  to the target vocabulary, and Gumbel-top-k draws on Philox stream 3 (base.STREAM_DRAFT).

:func:`logits_topk` and :func:`logits_sample` are the same selections from draft logits already computed
(a native head step returns logits); ``head_topk`` / ``head_sample`` are ``lm_head`` followed by them.

``backend="triton"`` runs the fused kernels of ``specdec_kernels/triton/drafter.py`` (GPU, or
``TRITON_INTERPRET=1`` on CPU); ``"torch"`` the eager code below.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .base import draft_uniforms, scatter_to_target

BACKENDS = ("torch", "triton")


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


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def fuse_features(features: torch.Tensor, norm_weights: torch.Tensor | None, fc_weight: torch.Tensor,
                  eps: float, backend: str = "torch") -> torch.Tensor:
    """[R, C*Ht] captured features -> [R, H]: RMSNorm each of the C chunks (if ``norm_weights`` [C, Ht]
    is given), concatenate, multiply by ``fc_weight`` [H, C*Ht]. Output in ``fc_weight``'s dtype."""
    _check_backend(backend)
    if backend == "triton":
        from ..triton.drafter import fused_norm_fc

        return fused_norm_fc(features, norm_weights, fc_weight, eps)
    x = features.to(fc_weight.dtype)
    if norm_weights is not None:
        chunks = x.chunk(norm_weights.shape[0], dim=-1)
        x = torch.cat([rms_norm(c, w, eps) for c, w in zip(chunks, norm_weights, strict=True)], dim=-1)
    return x @ fc_weight.t()


def head_topk(hidden: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor, k: int,
              backend: str = "torch") -> TopK:
    """Top-``k`` draft tokens of ``hidden`` [R, H] (final-normed) under ``lm_head`` [Vd, H].

    Returns target ids ``draft_id + d2t[draft_id]`` and their log-probabilities (float32 softmax over the
    draft vocabulary). The Triton path never materialises the [R, Vd] logits.
    """
    _check_backend(backend)
    if not 1 <= k <= lm_head.shape[0]:
        raise ValueError(f"k must be in [1, draft_vocab_size={lm_head.shape[0]}], got {k}")
    if backend == "triton":
        from ..triton.drafter import lm_head_topk

        ids, logp = lm_head_topk(hidden, lm_head, d2t, k)
        return TopK(ids, logp)
    return logits_topk((hidden @ lm_head.t()).float(), d2t, k)


def logits_topk(logits: torch.Tensor, d2t: torch.Tensor, k: int) -> TopK:
    """Top-``k`` of draft ``logits`` [R, Vd] (as :func:`head_topk`, from logits already computed)."""
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


def head_sample(hidden: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor, vocab_size: int,
                temperature: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, k: int,
                backend: str = "torch") -> Sample:
    """Draw ``k`` tokens without replacement from q = softmax(logits / temperature) per row.

    ``hidden`` [R, H], ``temperature`` [R] float32 (0 = greedy row: q at temperature 1, no noise, the
    top-k), ``seed`` [R] int64, ``position`` [R] int64 absolute position the draws decide. Gumbel noise
    for target id v is ``-log(-log(philox.uniform(seed, position, 3, v)))``; the draws are the
    top-k of ``log q + noise`` (ties to the lowest draft id). Returns target ids, log q of them, and q
    over the target vocabulary [R, V] (zero outside the draft vocabulary).
    """
    _check_backend(backend)
    if not 1 <= k <= lm_head.shape[0]:
        raise ValueError(f"k must be in [1, draft_vocab_size={lm_head.shape[0]}], got {k}")
    if backend == "triton":
        from ..triton.drafter import lm_head_sample

        ids, logq, q = lm_head_sample(hidden, lm_head, d2t, vocab_size, temperature, seed, position, k)
        return Sample(ids, logq, q)
    return logits_sample((hidden @ lm_head.t()).float(), d2t, vocab_size, temperature, seed, position, k)


def logits_sample(logits: torch.Tensor, d2t: torch.Tensor, vocab_size: int, temperature: torch.Tensor,
                  seed: torch.Tensor, position: torch.Tensor, k: int, uniforms: torch.Tensor | None = None
                  ) -> Sample:
    """:func:`head_sample` from draft ``logits`` [R, Vd] already computed. ``uniforms`` [R, V]: the rows'
    stream-3 Philox uniforms when drawn ahead (``base.draft_uniforms(seed, position, V)``; a chain drafts
    all its positions' noise in one call), else drawn here."""
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, draft_vocab_size={logits.shape[-1]}], got {k}")
    t = temperature.float()
    greedy = t <= 0
    z = logits.float() / torch.where(greedy, torch.ones_like(t), t)[:, None]
    logq = torch.log_softmax(z, dim=-1)
    full = logits.shape[-1] == vocab_size  # the draft vocabulary is the target's: d2t = 0
    u = draft_uniforms(seed, position, vocab_size) if uniforms is None else uniforms
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
