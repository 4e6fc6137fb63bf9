"""The hot operations of a drafter head, as readable torch (the spec) with Triton dispatch.

- :func:`fuse_features`: per-chunk RMSNorm of the captured target features, then ``fc`` (EAGLE-3).
- :func:`head_topk`: ``lm_head`` over the draft vocabulary, top-k (k = 1: argmax) and the log-softmax of
  the chosen entries, ids mapped to target ids through ``d2t``.
- :func:`head_sample`: ``lm_head``, temperature, softmax over the draft vocabulary, the q row scattered
  to the target vocabulary, and Gumbel-top-k draws on Philox stream 3 (philox.STREAM_DRAFT).

:func:`logits_topk` and :func:`logits_sample` are the same selections from draft logits already computed
(a native head step returns logits); ``head_topk`` / ``head_sample`` are ``lm_head`` followed by them.

``backend="triton"`` runs the fused kernels of ``specdec_kernels/triton/drafter.py`` (GPU, or
``TRITON_INTERPRET=1`` on CPU); ``"torch"`` their spec, ``specdec_kernels/reference/drafter.py``.
"""

from __future__ import annotations

import torch

from ..reference import drafter as ref
from ..reference.drafter import Sample, TopK, logits_topk, rms_norm
from .base import draft_uniforms

__all__ = ["BACKENDS", "Sample", "TopK", "fuse_features", "head_sample", "head_topk", "logits_sample",
           "logits_topk", "rms_norm"]

BACKENDS = ("torch", "triton")


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
    return ref.fuse_features(features, norm_weights, fc_weight, eps)


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
    all its positions' noise in one call), else drawn here (natively on CPU when the extension is built)."""
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, draft_vocab_size={logits.shape[-1]}], got {k}")
    if uniforms is None:
        uniforms = draft_uniforms(seed, position, vocab_size)
    return ref.logits_sample(logits, d2t, vocab_size, temperature, seed, position, k, uniforms)
