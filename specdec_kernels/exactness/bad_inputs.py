"""The bad-input table: malformed ``verify_chain`` calls that must raise a clear error naming the argument,
and valid-but-hostile inputs (NaN / inf logits) that must still emit tokens in [0, V).

One table serves the test suite (``tests/kernels/test_chain_properties.py``) and the audit tool
(:mod:`specdec_kernels.audit`), so a row added here is checked in both. Each row starts from
:func:`valid_call` (3 requests, 2 drafts each, V = 6, stochastic drafts, top-k and top-p set) and edits one
argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["BadInput", "BAD_ARGUMENTS", "HOSTILE_VALUES", "valid_call"]

VOCAB = 6


def valid_call(device: torch.device | str = "cpu") -> dict:
    """Keyword arguments of one valid ``verify_chain`` call (fixed seed, so every row replays)."""
    g = torch.Generator().manual_seed(17)
    b, k, v = 3, 2, VOCAB
    kwargs = dict(
        target_logits=torch.randn(b * (k + 1), v, generator=g),
        draft_token_ids=torch.randint(0, v, (b * k,), generator=g),
        cu_num_draft_tokens=torch.arange(b + 1) * k,
        draft_probs=torch.softmax(torch.randn(b * k, v, generator=g), -1),
        temperature=torch.ones(b), top_k=torch.full((b,), 3, dtype=torch.int32), top_p=torch.full((b,), 0.9),
        seed=torch.arange(b), position=torch.zeros(b, dtype=torch.int64),
    )
    return {name: x.to(device) for name, x in kwargs.items()}


class BadInput(NamedTuple):
    """One row: the argument it breaks, what is wrong, the edit applied to :func:`valid_call`'s kwargs, and
    its kind: "value" rows keep every dtype and shape and change values only (an adapter that passes those
    values on unchanged can put them to a peer's verifier), "structure" rows change a type, dtype or shape."""

    argument: str
    what: str
    mutate: Callable[[dict], None]
    kind: str = "structure"


def _set(name, value):
    return lambda kw: kw.__setitem__(name, value)


def _edit(name, fn):
    return lambda kw: kw.__setitem__(name, fn(kw[name]))


BAD_ARGUMENTS: tuple[BadInput, ...] = (
    BadInput("target_logits", "1-D instead of [T + B, V]", _edit("target_logits", lambda x: x[0])),
    BadInput("target_logits", "float64", _edit("target_logits", lambda x: x.double())),
    BadInput("target_logits", "one row short", _edit("target_logits", lambda x: x[:-1])),
    BadInput("target_logits", "a list, not a tensor", _set("target_logits", [[0.0]])),
    BadInput("draft_token_ids", "float ids", _edit("draft_token_ids", lambda x: x.float())),
    BadInput("draft_token_ids", "ids >= V", _edit("draft_token_ids", lambda x: x + VOCAB), "value"),
    BadInput("draft_token_ids", "ids < -1", _edit("draft_token_ids", lambda x: x - 10), "value"),
    BadInput("cu_num_draft_tokens", "decreasing", _edit("cu_num_draft_tokens", lambda x: x.flip(0)), "value"),
    BadInput("cu_num_draft_tokens", "does not start at 0", _edit("cu_num_draft_tokens", lambda x: x + 1), "value"),
    BadInput("cu_num_draft_tokens", "float", _edit("cu_num_draft_tokens", lambda x: x.float())),
    BadInput("cu_num_draft_tokens", "not monotone", _edit("cu_num_draft_tokens", lambda x: torch.tensor([0, 3, 2, 6])), "value"),
    BadInput("draft_probs", "one vocabulary entry short", _edit("draft_probs", lambda x: x[:, :-1])),
    BadInput("draft_probs", "int64", _edit("draft_probs", lambda x: x.long())),
    BadInput("temperature", "negative", _edit("temperature", lambda x: -x), "value"),
    BadInput("temperature", "one request short", _edit("temperature", lambda x: x[:-1])),
    BadInput("temperature", "infinite", _edit("temperature", lambda x: x * float("inf")), "value"),
    BadInput("temperature", "int64", _edit("temperature", lambda x: x.long())),
    BadInput("top_k", "negative", _edit("top_k", lambda x: -x), "value"),
    BadInput("top_k", "float", _edit("top_k", lambda x: x.float())),
    BadInput("top_p", "0", _edit("top_p", lambda x: x * 0), "value"),
    BadInput("top_p", "above 1", _edit("top_p", lambda x: x + 1), "value"),
    BadInput("top_p", "one entry for three requests", _edit("top_p", lambda x: x[:1])),
    BadInput("seed", "float", _edit("seed", lambda x: x.float())),
    BadInput("seed", "one request short", _edit("seed", lambda x: x[:-1])),
    BadInput("position", "negative", _edit("position", lambda x: x - 1), "value"),
    BadInput("position", "beyond the Philox position range", _edit("position", lambda x: x + 2**31), "value"),
    BadInput("position", "float", _edit("position", lambda x: x.float())),
    BadInput("backend", "unknown backend", _set("backend", "gpu")),
    BadInput("max_draft_len", "negative", _set("max_draft_len", -1)),
    BadInput("max_draft_len", "shorter than the longest chain", _set("max_draft_len", 1)),
)
"""Malformed calls: each must raise ValueError or TypeError whose message names ``argument``. The last
three rows edit keywords of our API only (``backend``, ``max_draft_len``)."""


def _nan_row(kw: dict) -> None:
    kw["target_logits"] = kw["target_logits"].clone()
    kw["target_logits"][0, 1] = float("nan")
    kw["target_logits"][2, :] = float("nan")


def _inf_row(kw: dict) -> None:
    kw["target_logits"] = kw["target_logits"].clone()
    kw["target_logits"][0, 2] = float("inf")
    kw["target_logits"][3, :] = float("-inf")
    kw["target_logits"][4, 0] = float("inf")
    kw["target_logits"][4, 5] = float("inf")


HOSTILE_VALUES: tuple[BadInput, ...] = (
    BadInput("target_logits", "NaN entries and an all-NaN row", _nan_row, "value"),
    BadInput("target_logits", "+inf entries, tied +inf, an all -inf row", _inf_row, "value"),
)
"""Valid calls with hostile values: each must return (or raise ValueError naming the argument), and every
emitted token must be -1 padding or an id in [0, V)."""
