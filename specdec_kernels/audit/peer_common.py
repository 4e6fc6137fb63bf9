"""Pieces shared by the adapters for peers that take target *probabilities* and fixed-length chains
(FlashInfer ``chain_speculative_sampling``, SGLang ``tree_speculative_sampling_target_only``).

Those kernels verify, they do not transform: the caller computes the target probabilities. The adapters do
that with our reference transforms (temperature, top-k, top-p; one-hot argmax for greedy requests), so the
audit tests the peer's verification against the law those probabilities define. Their batches are
rectangular and they have no placeholder id, so a request's chain is cut at its first placeholder (a
placeholder is always rejected, so the emitted law is the same) and requests are grouped by chain length,
one call per group.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ..reference import sampling
from ..reference.chain import ChainResult

__all__ = ["row_target_probs", "effective_lengths", "check_parameters", "group_seed", "ChainGroups", "group_chains"]


def row_target_probs(target_logits, cu, temperature, top_k, top_p) -> torch.Tensor:
    """[T + B, V] float32 target law of every row: reference transforms, one-hot argmax for greedy requests."""
    num_reqs = cu.numel() - 1
    lengths = (cu[1:] - cu[:-1]).to(torch.int64)
    req = torch.repeat_interleave(torch.arange(num_reqs), lengths + 1)
    temperature = torch.zeros(num_reqs) if temperature is None else temperature.float()
    t = temperature[req]
    greedy = t == 0
    probs = sampling.target_probs(
        target_logits, torch.where(greedy, torch.ones_like(t), t),
        None if top_k is None else top_k[req], None if top_p is None else top_p[req])
    argmax = torch.argmax(sampling.greedy_logits(target_logits), dim=-1)
    onehot = torch.nn.functional.one_hot(argmax, target_logits.shape[-1]).float()
    return torch.where(greedy[:, None], onehot, probs)


def effective_lengths(draft_token_ids, cu, vocab_size: int) -> list[int]:
    """Each request's chain length up to (excluding) its first draft outside [0, V) (placeholders)."""
    out = []
    ids = draft_token_ids.tolist()
    for b in range(cu.numel() - 1):
        lo, hi = int(cu[b]), int(cu[b + 1])
        k = 0
        while lo + k < hi and 0 <= ids[lo + k] < vocab_size:
            k += 1
        out.append(k)
    return out


def check_parameters(fn, expected: tuple[str, ...], required: tuple[str, ...], where: str) -> str | None:
    """None when ``fn`` takes every parameter of ``required`` by name and none outside ``expected``'s
    optional extras is mandatory; else a one-line reason."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return f"cannot read the signature of {where}"
    missing = [p for p in required if p not in params]
    if missing:
        return f"{where} lacks parameters {missing} (adapter written for {expected})"
    extra = [n for n, p in params.items() if n not in expected and p.default is inspect.Parameter.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if extra:
        return f"{where} has required parameters the adapter does not know: {extra}"
    return None


def group_seed(seed, position, members: list[int]) -> int:
    """One generator seed for a group call (these peers take one seed per call, not one per request)."""
    value = 0
    for b in members:
        value = (value * 1_000_003 + int(seed[b]) * 7919 + int(position[b])) % (1 << 62)
    return value


@dataclass
class ChainGroups:
    """One verifier call translated for a peer with rectangular batches: each request's target law and
    chain length, the requests grouped by that length, and the (-1 padded) output buffers the groups fill.

    ``probs`` [T + B, V] float32 (:func:`row_target_probs`); ``cu`` int64; ``groups``: (chain length,
    request indices) in ascending length; ``out`` [B, K_max + 1] int32; ``accepted`` [B] int32."""

    cu: torch.Tensor
    probs: torch.Tensor
    seed: torch.Tensor
    position: torch.Tensor
    groups: list[tuple[int, list[int]]]
    out: torch.Tensor
    accepted: torch.Tensor

    def generator(self, members: list[int], device: torch.device | str) -> torch.Generator:
        """The one generator of a group call, keyed by its members' seeds and positions."""
        return torch.Generator(device).manual_seed(group_seed(self.seed, self.position, members))

    def result(self) -> ChainResult:
        return ChainResult(self.out, self.accepted)


def group_chains(target_logits, draft_token_ids, cu_num_draft_tokens, temperature, top_k, top_p, seed,
                 position) -> ChainGroups:
    """The shared first half of the FlashInfer / SGLang adapters: target probabilities, chains cut at
    their first placeholder, requests grouped by chain length, outputs allocated (seed / position 0 when
    not given)."""
    num_reqs = cu_num_draft_tokens.numel() - 1
    vocab = target_logits.shape[-1]
    cu = cu_num_draft_tokens.to(torch.int64)
    seed = torch.zeros(num_reqs, dtype=torch.int64) if seed is None else seed
    position = torch.zeros(num_reqs, dtype=torch.int64) if position is None else position
    probs = row_target_probs(target_logits.float(), cu, temperature, top_k, top_p)
    ks = effective_lengths(draft_token_ids, cu, vocab)
    width = int((cu[1:] - cu[:-1]).max()) + 1 if num_reqs else 1
    groups = [(k, [b for b in range(num_reqs) if ks[b] == k]) for k in sorted(set(ks))]
    return ChainGroups(cu, probs, seed, position, groups, torch.full((num_reqs, width), -1, dtype=torch.int32),
                       torch.zeros(num_reqs, dtype=torch.int32))
