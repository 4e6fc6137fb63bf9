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

__all__ = ["SamplingMask", "kept_ids", "chain_sampling_mask", "tree_sampling_mask"]

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

def _top_p_total(weights: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
    """[R, 1] float32 total of top-p's limit: the weights accumulated sequentially in float64, then rounded,
    as the native CPU kernel does (core/sampling.h ``top_p_threshold``): in descending order (the
    reference's cumulative sum) for rows of up to ``_SORTED_TOTAL_MAX`` tokens, else in index order;
    ``order`` [R, n] gives index order's permutation of ``weights`` when they are not in it.

    A float64 sum of float32 weights depends on its order only in its last bits: the float32 total differs
    between orders only when those straddle a float32 rounding boundary, and top-p's set then changes only if
    a tie group's mass above sits on the limit. That is the one place where the reference, the native kernels
    and this pass can differ; summing large rows in index order spares them a sort.
    """
    if order is not None:
        weights = weights.gather(1, order)
    elif weights.shape[1] <= _SORTED_TOTAL_MAX:
        weights = torch.sort(weights, dim=-1, descending=True).values
    return torch.cumsum(weights.double(), dim=-1)[:, -1:].float()


def _top_p_keep(desc: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """[R, n] bool: top-p keeps each of the descending values ``desc`` (a prefix of the sorted row, its max
    first), by the reference's arithmetic (``sampling.top_p_mask``): float32 weights, their cumulative sum,
    and the mass above each tie group's first element below ``limit`` [R, 1]."""
    weights = torch.exp(desc - desc[:, :1])
    exclusive = torch.cumsum(weights, dim=-1) - weights
    neg = (-desc).contiguous()
    return exclusive.gather(-1, torch.searchsorted(neg, neg, right=False)) < limit


def _top_p_rows(z: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[R, 1] top-p threshold of whole rows ``z`` (top-k already applied, max finite): the smallest kept
    value, found on a descending prefix (``torch.topk``) that widens until it holds the threshold."""
    vocab_size = z.shape[1]
    zmax = z.max(dim=-1, keepdim=True).values
    limit = top_p.float()[:, None] * _top_p_total(torch.exp(z - zmax))
    threshold = torch.full_like(zmax, float("inf"))
    pending = torch.arange(z.shape[0], device=z.device)
    width = min(_TOP_P_PREFIX, vocab_size)
    while pending.numel():
        desc = torch.topk(z[pending], width, dim=-1).values
        keep = _top_p_keep(desc, limit[pending])
        # A row whose whole prefix is kept may keep more beyond it: widen the prefix for it.
        done = ~keep[:, -1] | (width == vocab_size)
        threshold[pending[done]] = torch.where(keep, desc, float("inf")).min(dim=-1, keepdim=True).values[done]
        pending = pending[~done]
        width = min(2 * width, vocab_size)
    return threshold


def _split_rows(keep: torch.Tensor) -> list[torch.Tensor]:
    """The kept ids of each row of ``keep`` [R, V] bool, int32 ascending (a whole row as one arange)."""
    vocab_size = keep.shape[1]
    full = keep.all(dim=-1).tolist()
    everything = torch.arange(vocab_size, dtype=torch.int32, device=keep.device)
    return [everything if f else keep[r].nonzero().flatten().to(torch.int32) for r, f in enumerate(full)]


def _dense_ids(z: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> list[torch.Tensor]:
    """Kept ids of random rows by whole-row masks: top-k from the k-th largest value (``torch.topk``),
    then top-p from :func:`_top_p_rows`. The path of rows without top-k, and of those whose ties at the k-th
    value run past k."""
    vocab_size = z.shape[1]
    if top_k is not None:
        k = top_k.to(torch.int64)
        on = ((k > 0) & (k < vocab_size)).nonzero().flatten()
        if on.numel():
            kth = torch.topk(z[on], int(k[on].max()), dim=-1).values.gather(1, (k[on] - 1)[:, None])
            z = z.clone()
            z[on] = torch.where(z[on] >= kth, z[on], sampling.NEG_INF)
    if top_p is not None:
        on = ((top_p < 1.0) & (z.max(dim=-1).values > sampling.NEG_INF)).nonzero().flatten()
        if on.numel():
            z = z.clone()
            z[on] = torch.where(z[on] >= _top_p_rows(z[on], top_p[on]), z[on], sampling.NEG_INF)
    return _split_rows(z > sampling.NEG_INF)


def _top_k_ids(z: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor | None
               ) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """Kept ids of random rows with top-k on (0 < k < V), from ``torch.topk`` alone: the k largest values
    are the row's top-k set unless ties at the k-th value run past it, and top-p then walks those k sorted
    values (the rest of the row has weight 0). Returns each row's ids, None for the rows with such ties
    (left to :func:`_dense_ids`), and those rows' bool [R]."""
    vocab_size = z.shape[1]
    k = k.to(torch.int64)[:, None]
    vals, idx = torch.topk(z, min(int(k.max()) + 1, vocab_size), dim=-1)
    kth = vals.gather(1, k - 1)
    tied = (vals.gather(1, k.clamp(max=vals.shape[1] - 1)) == kth) & (k < vals.shape[1])
    inside = torch.arange(vals.shape[1], device=z.device)[None, :] < k
    vals = torch.where(inside, vals, sampling.NEG_INF)
    keep = inside & (vals > sampling.NEG_INF)
    if top_p is not None:
        on = ((top_p < 1.0) & (vals[:, 0] > sampling.NEG_INF))[:, None]
        weights = torch.exp(vals - vals[:, :1])
        # Index order of the candidates for the total (-inf weights are 0 and add nothing to it).
        order = None if vocab_size <= _SORTED_TOTAL_MAX else torch.argsort(torch.where(inside, idx, vocab_size))
        limit = top_p.float()[:, None] * _top_p_total(weights, order)
        kept = _top_p_keep(vals, limit)
        threshold = torch.where(kept, vals, float("inf")).min(dim=-1, keepdim=True).values
        keep &= ~on | (vals >= threshold)
    ids = torch.sort(torch.where(keep, idx, vocab_size), dim=-1).values.to(torch.int32)
    counts, tied = keep.sum(dim=-1).tolist(), tied[:, 0]
    return [None if t else ids[r, :n] for r, (n, t) in enumerate(zip(counts, tied.tolist(), strict=True))], tied


def kept_ids(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Kept ids of each row of ``logits`` [R, V], int32 ascending: finite after temperature, top-k and top-p
    (temperature > 0), the argmax set for temperature 0, [0] where nothing is kept. Per-row parameters [R]
    (top_k / top_p may be None); row for row the ids of ``sampling.target_logits(...) > -inf``."""
    num_rows, vocab_size = logits.shape
    greedy = temperature == 0
    # sampling.scale_logits (greedy rows: sampling.greedy_logits), with its sanitize in one pass.
    z = torch.nan_to_num(logits.float() / torch.where(greedy, 1.0, temperature)[:, None],
                         nan=sampling.NEG_INF, posinf=sampling.FLOAT32_MAX, neginf=sampling.NEG_INF)
    out: list[torch.Tensor | None] = [None] * num_rows
    rest = ~greedy
    g = greedy.nonzero().flatten()
    if g.numel():
        zmax = z[g].max(dim=-1, keepdim=True).values
        for r, ids in zip(g.tolist(), _split_rows((z[g] == zmax) & (zmax > sampling.NEG_INF)), strict=True):
            out[r] = ids
    if top_k is not None:
        on = (rest & (top_k > 0) & (top_k < vocab_size)).nonzero().flatten()
        if on.numel():
            ids, tied = _top_k_ids(z[on], top_k[on], None if top_p is None else top_p[on])
            for r, row_ids in zip(on.tolist(), ids, strict=True):
                out[r] = row_ids
            rest[on] = tied
    r_rest = rest.nonzero().flatten()
    if r_rest.numel():
        ids = _dense_ids(z[r_rest], None if top_k is None else top_k[r_rest], None if top_p is None else top_p[r_rest])
        for r, row_ids in zip(r_rest.tolist(), ids, strict=True):
            out[r] = row_ids
    zero = torch.zeros(1, dtype=torch.int32, device=logits.device)
    return [ids if ids.numel() else zero for ids in out]


# ----------------------------------------------------------------------------------------------------
# Emitted rows of a verification, and the CSR mask
# ----------------------------------------------------------------------------------------------------

def _csr(logits, rows, emitted, temperature, top_k, top_p) -> SamplingMask:
    """The mask of the emitted tokens (``emitted`` [B, W] bool) decided at target rows ``rows`` [B, W]."""
    num_reqs, width = emitted.shape
    req = torch.arange(num_reqs, device=logits.device)[:, None].expand(num_reqs, width)[emitted]
    row = rows[emitted].clamp(0, max(logits.shape[0] - 1, 0))
    temperature, top_k, top_p = temperature[req], _take(top_k, req), _take(top_p, req)
    per_row: list[torch.Tensor] = []
    for lo in range(0, row.numel(), _ROWS_PER_CHUNK):
        part = slice(lo, lo + _ROWS_PER_CHUNK)
        per_row += kept_ids(logits[row[part]], temperature[part], _take(top_k, part), _take(top_p, part))
    zero = torch.zeros(1, dtype=torch.int64, device=logits.device)
    counts = torch.tensor([ids.numel() for ids in per_row], dtype=torch.int64, device=logits.device)
    indptr = torch.cat([zero, counts.cumsum(0)])
    indices = torch.cat(per_row) if per_row else torch.zeros(0, dtype=torch.int32, device=logits.device)
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
