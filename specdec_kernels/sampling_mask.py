"""The sampling mask of a verification: for every emitted token, the token ids its row's target kept.

An RL trainer that recomputes log-probabilities needs the support the sampler drew from: vLLM's
``return_sampling_mask`` (``SamplingMaskLists`` in vllm/v1/outputs.py, vLLM 0.33) returns it per generated
token as CSR, and prime-rl trains with it. The verifier decides every emitted token from its row's
truncated target (an accepted draft, a recovery token drawn from a residual of it, or the bonus token), so
the mask of an emitted token is the kept set of the target at that row: the tokens with a finite scaled
logit after temperature, top-k and top-p (``reference/sampling.py``), which is exactly what the
non-speculative sampler would keep for that row. A greedy request (temperature 0) keeps its argmax set,
every token whose sanitised logit equals the row maximum (the greedy path emits the lowest of them). A row
that keeps nothing (every logit -inf or NaN) samples token 0, so its mask is {0}.

How it is computed: one shared post-pass over the emitted rows, the same for every backend, from the
normalised arguments and the result. It reproduces the reference's truncation bit for bit without
sorting rows: top-k reads the k-th largest value from ``torch.topk``; top-p walks the descending prefix
of the row (``torch.topk`` of growing width) with the reference's own float32 weights and cumulative sums,
whose prefix equals the reference's because the cumulative sum is sequential. The native CPU / CUDA and
Triton kernels compute the same thresholds during verification; writing them out from there (the fused
version) is not done yet, so a mask costs this extra pass (benchmarks/bench_sampling_mask.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .reference import sampling
from .reference.chain import ChainResult, chain_spans
from .reference.tree import TreeResult, tree_spans

__all__ = ["SamplingMask", "kept_sets", "chain_sampling_mask", "tree_sampling_mask"]

# First width of the top-p prefix search; doubled for the rows whose threshold lies beyond it.
_TOP_P_PREFIX = 256
# Rows up to this size sum top-p's total in sorted order, larger ones in index order (core/sampling.h).
_SORTED_TOTAL_MAX = 4096
# Emitted rows per chunk of the post-pass (bounds its float32 copies of the rows).
_ROWS_PER_CHUNK = 32


class SamplingMask(NamedTuple):
    """Kept token ids per emitted token, in CSR (vLLM's ``SamplingMaskLists`` as tensors).

    Emitted tokens are numbered request-major, in output order, -1 padding excluded: request b's are
    ``cu_num_emitted[b] ... cu_num_emitted[b + 1] - 1``, the same count as its non-negative
    ``output_token_ids``. Emitted token e kept ``indices[indptr[e]:indptr[e + 1]]``, ascending.
    """

    indptr: torch.Tensor  # [num_emitted + 1] int64
    indices: torch.Tensor  # [indptr[-1]] int32 token ids, ascending within each emitted token
    cu_num_emitted: torch.Tensor  # [B + 1] int64

    def tolist(self) -> list[list[list[int]]]:
        """Per request, per emitted token, the kept ids as Python lists (host copy; for tests and logging)."""
        indptr = self.indptr.tolist()
        ids = self.indices.tolist()
        cu = self.cu_num_emitted.tolist()
        return [[ids[indptr[e]:indptr[e + 1]] for e in range(cu[b], cu[b + 1])] for b in range(len(cu) - 1)]


# ----------------------------------------------------------------------------------------------------
# Kept sets of rows
# ----------------------------------------------------------------------------------------------------

def _top_k(z: torch.Tensor, top_k: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``z`` with top-k applied to ``rows`` (bool [R]): the reference rule z >= k-th largest value, read
    from ``torch.topk`` (the same value as the reference's sorted row at k - 1, ties counted)."""
    vocab_size = z.shape[1]
    k = top_k.to(torch.int64)
    rows = rows & (k > 0) & (k < vocab_size)
    idx = rows.nonzero().flatten()
    if idx.numel() == 0:
        return z
    k = k[idx]
    kth = torch.topk(z[idx], int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])
    z = z.clone()
    z[idx] = torch.where(z[idx] >= kth, z[idx], sampling.NEG_INF)
    return z


def _top_p(z: torch.Tensor, top_p: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``z`` with top-p applied to ``rows`` (bool [R]), by the reference's arithmetic (``top_p_mask``) on the
    descending prefix of each row that holds its threshold instead of the fully sorted row."""
    vocab_size = z.shape[1]
    rows = rows & (top_p < 1.0) & (z.max(dim=-1).values > sampling.NEG_INF)
    idx = rows.nonzero().flatten()
    if idx.numel() == 0:
        return z
    zr = z[idx]
    zmax = zr.max(dim=-1, keepdim=True).values
    total = _top_p_total(zr, zmax)
    limit = top_p[idx].float()[:, None] * total
    threshold = torch.full((idx.numel(), 1), float("inf"), device=z.device)
    pending = torch.arange(idx.numel(), device=z.device)
    width = min(_TOP_P_PREFIX, vocab_size)
    while pending.numel():
        desc = torch.topk(zr[pending], width, dim=-1).values
        weights = torch.exp(desc - zmax[pending])
        exclusive = torch.cumsum(weights, dim=-1) - weights
        neg = (-desc).contiguous()
        mass_above = exclusive.gather(-1, torch.searchsorted(neg, neg, right=False))
        keep = mass_above < limit[pending]
        kept_min = torch.where(keep, desc, float("inf")).min(dim=-1, keepdim=True).values
        # A row whose whole prefix is kept may keep more beyond it: widen the prefix for it.
        done = ~keep[:, -1] | (width == vocab_size)
        threshold[pending[done]] = kept_min[done]
        pending = pending[~done]
        width = min(2 * width, vocab_size)
    z = z.clone()
    z[idx] = torch.where(zr >= threshold, zr, sampling.NEG_INF)
    return z


def _top_p_total(zr: torch.Tensor, zmax: torch.Tensor) -> torch.Tensor:
    """[R, 1] float32 total weight of top-p's limit, accumulated in float64 as the native CPU kernel does
    (core/sampling.h ``top_p_threshold``): over the sorted row up to ``_SORTED_TOTAL_MAX`` tokens (the
    reference's cumulative sum), else in index order, sequentially, then rounded to float32.

    A float64 sum of float32 weights depends on its order only through its last bits; the float32 total
    differs between orders only when those straddle a float32 rounding boundary, and top-p then changes
    only if a tie group's mass above sits on the limit. That is the one place where the reference, the
    native kernels and this pass may differ; no sort is needed for the large rows.
    """
    weights = torch.exp(zr - zmax)
    if zr.shape[1] <= _SORTED_TOTAL_MAX:
        weights = torch.sort(weights, dim=-1, descending=True).values
    return torch.cumsum(weights.double(), dim=-1)[:, -1:].float()


def kept_sets(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:
    """[R, V] bool kept set of each row: finite after temperature, top-k and top-p (temperature > 0), the
    argmax set for temperature 0, {0} where nothing is kept. Per-row parameters [R] (top_k / top_p may be
    None); equal to ``sampling.target_logits(...) > -inf`` row for row."""
    greedy = temperature == 0
    z = sampling.scale_logits(logits, torch.where(greedy, 1.0, temperature))  # greedy: sampling.greedy_logits
    truncated = z
    if top_k is not None:
        truncated = _top_k(truncated, top_k, ~greedy)
    if top_p is not None:
        truncated = _top_p(truncated, top_p, ~greedy)
    zmax = z.max(dim=-1, keepdim=True).values
    keep = torch.where(greedy[:, None], (z == zmax) & (zmax > sampling.NEG_INF), truncated > sampling.NEG_INF)
    keep[:, 0] |= ~keep.any(dim=-1)
    return keep


# ----------------------------------------------------------------------------------------------------
# Emitted rows of a verification, and the CSR mask
# ----------------------------------------------------------------------------------------------------

def _csr(logits, rows, emitted, temperature, top_k, top_p) -> SamplingMask:
    """The mask of the emitted tokens (``emitted`` [B, W] bool) decided at target rows ``rows`` [B, W]."""
    num_reqs, width = emitted.shape
    req = torch.arange(num_reqs, device=logits.device)[:, None].expand(num_reqs, width)[emitted]
    row = rows[emitted].clamp(0, max(logits.shape[0] - 1, 0))
    temperature, top_k, top_p = temperature[req], _take(top_k, req), _take(top_p, req)
    ids = torch.arange(logits.shape[1], dtype=torch.int32, device=logits.device)
    indices, counts = [], []
    for lo in range(0, row.numel(), _ROWS_PER_CHUNK):
        part = slice(lo, lo + _ROWS_PER_CHUNK)
        keep = kept_sets(logits[row[part]], temperature[part], _take(top_k, part), _take(top_p, part))
        indices.append(torch.masked_select(ids[None, :], keep))
        counts.append(keep.sum(dim=-1))
    zero = torch.zeros(1, dtype=torch.int64, device=logits.device)
    indptr = torch.cat([zero, *counts]).cumsum(0)
    indices = torch.cat(indices) if indices else ids[:0]
    cu = torch.cat([zero, torch.cumsum(emitted.sum(dim=-1), 0)])
    return SamplingMask(indptr, indices, cu)


def _take(x: torch.Tensor | None, index) -> torch.Tensor | None:
    return None if x is None else x[index]


def chain_rows(cu: torch.Tensor, num_drafts: int, width: int) -> torch.Tensor:
    """[B, width] int64 target row of each output slot of a chain verification: slot j of request b is
    decided at row ``start_b + b + j`` (``reference.chain.chain_spans``)."""
    start = chain_spans(cu, num_drafts)[0]
    first_row = start + torch.arange(cu.numel() - 1, device=cu.device)
    return first_row[:, None] + torch.arange(width, device=cu.device)[None, :]


def tree_rows(cu: torch.Tensor, num_nodes: int, accepted_nodes: torch.Tensor) -> torch.Tensor:
    """[B, D + 1] int64 target row of each output slot of a tree verification: slot j of request b is
    decided at the row of ``accepted_nodes[b, j]``, the node the emitted token is a child of."""
    start = tree_spans(cu, num_nodes)[0]
    return start[:, None] + accepted_nodes.to(torch.int64)


def chain_sampling_mask(args: tuple, result: ChainResult) -> SamplingMask:
    """The sampling mask of a ``verify_chain`` call from its normalised arguments
    (``api.checked_chain_args``) and its result."""
    logits, drafts, cu, _, temperature, top_k, top_p = args[:7]
    out = result.output_token_ids
    return _csr(logits, chain_rows(cu, drafts.numel(), out.shape[1]), out >= 0, temperature, top_k, top_p)


def tree_sampling_mask(args: tuple, result: TreeResult) -> SamplingMask:
    """The sampling mask of a ``verify_tree`` call from its normalised arguments
    (``api.checked_tree_args``) and its result."""
    logits, _, parent, cu, _, temperature, top_k, top_p = args[:8]
    rows = tree_rows(cu, parent.numel(), result.accepted_nodes)
    return _csr(logits, rows, result.output_token_ids >= 0, temperature, top_k, top_p)
