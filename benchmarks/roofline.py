"""Roofline for the verification ops: the bytes each op must move, against measured copy bandwidth.

Verification is memory-bound (a few flops per logit), so its roofline is bandwidth: an op cannot run
faster than ``min_bytes / copy_bandwidth``. The copy bandwidth is measured in the same run (a large
tensor clone), never taken from a datasheet.

Chain verification must read, for each request, every row whose decision is needed: the rows up to and
including the first rejection (all ``k_b + 1`` rows when every draft is accepted), plus the matching
draft-probability rows for stochastic drafts, plus the draft ids and the output. That is
:func:`chain_min_bytes`, computed from the outcome (``num_accepted``) of the run being timed. An
implementation that reads every row (softmax over the whole batch first) moves
:func:`chain_all_rows_bytes`.

``python -m benchmarks.roofline --device cpu`` prints the measured copy bandwidth.
"""

from __future__ import annotations

import argparse

import torch

from .common import OneLineParser, copy_bandwidth_gbs


def chain_min_bytes(
    num_accepted: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    vocab_size: int,
    logit_bytes: int,
    draft_prob_bytes: int | None,
) -> int:
    """Bytes any chain verifier must move given the outcome ``num_accepted`` [B] (k_b = num_draft_tokens [B]).

    Logit rows 0..num_accepted (inclusive) per request; for stochastic drafts (``draft_prob_bytes`` set)
    the draft-probability rows among them (the bonus row has none); draft ids (int64) and the int32 output
    ``[B, max_k + 1]`` plus ``num_accepted``.
    """
    decided = (num_accepted.to(torch.int64) + 1).clamp(max=num_draft_tokens.to(torch.int64) + 1)
    total = int(decided.sum()) * vocab_size * logit_bytes
    if draft_prob_bytes is not None:
        draft_rows = torch.minimum(decided, num_draft_tokens.to(torch.int64))
        total += int(draft_rows.sum()) * vocab_size * draft_prob_bytes
    return total + _small_bytes(num_draft_tokens)


def _small_bytes(num_draft_tokens: torch.Tensor) -> int:
    """Draft ids (int64) in, int32 tokens [B, max_k + 1] and num_accepted [B] out."""
    num_reqs = num_draft_tokens.numel()
    max_k = int(num_draft_tokens.max()) if num_reqs else 0
    return int(num_draft_tokens.sum()) * 8 + num_reqs * (max_k + 2) * 4


def chain_all_rows_bytes(
    num_draft_tokens: torch.Tensor, vocab_size: int, logit_bytes: int, draft_prob_bytes: int | None
) -> int:
    """Bytes read by an implementation that touches every logit row (and every draft-probability row)."""
    num_drafts = int(num_draft_tokens.sum())
    num_rows = num_drafts + num_draft_tokens.numel()
    total = num_rows * vocab_size * logit_bytes
    if draft_prob_bytes is not None:
        total += num_drafts * vocab_size * draft_prob_bytes
    return total + _small_bytes(num_draft_tokens)


def achieved_fraction(num_bytes: int, median_ms: float, copy_gbs: float) -> float:
    """Fraction of the measured copy bandwidth that moving ``num_bytes`` in ``median_ms`` represents."""
    if median_ms <= 0 or copy_gbs <= 0:
        return float("nan")
    return num_bytes / (median_ms * 1e-3) / 1e9 / copy_gbs


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python -m benchmarks.roofline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mib", type=int, default=None, help="size of the copied tensor in MiB")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    num_bytes = None if args.mib is None else args.mib << 20
    print(f"copy bandwidth on {device}: {copy_bandwidth_gbs(device, num_bytes):.1f} GB/s (read + write)")


if __name__ == "__main__":
    main()
