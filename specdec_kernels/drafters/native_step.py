"""A drafter head's cached causal step as one ``specdec_kernels.native.decoder_step`` call (CPU).

A step of a one-layer head is ~40 small torch ops whose dispatch costs several times their arithmetic at
tens of rows; the fused CPU kernel runs the same math (``reference/decoder_step.py``) in one call. Each
head packs its own weights (``Eagle3Head.native_step``, ``MtpHead.native_step``,
``DraftModelHead.native_step``) and says how a row's (token, hidden) pair becomes the kernel's input ``x``
and optional ``qkv_add``. Snapshots the weights: rebuild after every weight change (drafters rebuild on
``reset`` / ``prefill``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models.qwen3 import KVCache

TOKEN_TABLE_LIMIT = 1 << 24  # entries of a per-token input table; larger vocabularies compute rows per call


def native_step_available() -> bool:
    """True when the compiled extension provides the fused CPU decoder step."""
    from .. import native

    return native.has_op("decoder_step", "cpu")


class NativeHeadStep:
    """``(token_ids [R, n], hidden_in [R, n, H] | None) -> (logits [R, n, Vd], hidden out [R, n, H])`` for
    rows written at slots ``start + i`` of cache rows ``rows`` (causal by slot, positions ``start + depth``).

    ``inputs(token_ids, hidden_in) -> (x [R, n, H], qkv_add [R, n, W] | None)`` maps a row to the kernel's
    inputs (the head's own input fusion).
    """

    def __init__(self, weights: list[torch.Tensor], rope: torch.Tensor, num_heads: int, eps: float,
                 inputs: Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor | None]]
                 ) -> None:
        from .. import native

        self.weights, self.rope, self.num_heads, self.eps, self.inputs = weights, rope, num_heads, eps, inputs
        self.op = native.op("decoder_step", "cpu")  # resolved once, not per draft step

    def __call__(self, token_ids: torch.Tensor, hidden_in: torch.Tensor | None, cache: KVCache, rows: torch.Tensor,
                 start: torch.Tensor, depth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, qkv_add = self.inputs(token_ids, hidden_in)
        return self.op(x.contiguous(), self.weights, cache.k[0], cache.v[0], rows, start.contiguous(),
                       depth.contiguous(), self.rope, self.num_heads, self.eps,
                       None if qkv_add is None else qkv_add.contiguous())
