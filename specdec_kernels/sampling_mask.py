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

Every backend (reference, native CPU, Triton, CUDA; every method) computes it in its own verification pass.
Asked for the mask, the pass writes, per row it decides, the threshold it truncated that row with
(``row_threshold``: top-k's k-th value or top-p's smallest kept value, whichever is larger; the row max for a
greedy row; -inf for an untruncated row; ``reference.sampling.truncate_with_threshold``): the native CPU
kernels from ``prepare_row`` (csrc/include/specdec/host/chain.h), the Triton and CUDA kernels as the value of
the order key their threshold search ends at (Triton: ``triton/chain.py`` ``_store_threshold``, behind the
``WRITE_THRESHOLD`` constexpr; CUDA: ``key_threshold`` of ``row_lo_key``'s key, cuda_common.cuh, stored
where the row is decided). The mask is then one compare per emitted row (:func:`kept_by_threshold`): the ids
whose scaled logit, ``sanitize(logit / temperature)`` in float32 as every backend scales it (correctly
rounded: Triton divides with ``div_rn``), is finite and at or above its row's threshold. It is the set the
backend sampled from by construction: no threshold is re-derived here. Off, the kernels are passed a null
pointer (reference: None; Triton: the constexpr flag off) and write nothing. A row that keeps nothing may hold
any threshold that keeps nothing (the reference writes top-p's +inf there, the native and CUDA kernels -inf);
its mask is {0} either way.

:func:`kept_ids` re-derives the kept sets from the arguments alone, by the truncation rule of
``reference/sampling.py`` without sorting rows: top-k's set is the k largest values from ``torch.topk`` (the
whole row's k-th value when ties run past k); top-p's threshold follows the native CPU kernel's algorithm
(core/sampling.h: float64 masses, a histogram over the high 16 bits of the order key, one bucket sorted).
No backend uses it any more; ``chain_sampling_mask`` / ``tree_sampling_mask`` without thresholds run it (the
tests' second way to the mask, and ``bench_sampling_mask``'s ``post_pass`` mode). Its top-p masses are
float64 sums of float32 weights computed as the native CPU kernel does, so on a tie group whose mass above
rounds to the other side of ``top_p * total`` in another backend's arithmetic it can differ from that
backend's own kept set, which the fused thresholds never do.

Cost: ``benchmarks/bench_sampling_mask.py`` (on and off, interleaved; the recorded run is in
results/benchmarks/, see results/README.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .reference import sampling
from .reference.chain import ChainResult, chain_spans
from .reference.tree import TreeResult, tree_spans

__all__ = ["SamplingMask", "kept_ids", "kept_by_threshold", "chain_sampling_mask", "tree_sampling_mask"]

# Top-p as core/sampling.h: rows of up to _SORTED_TOTAL_MAX tokens are sorted whole, larger ones bucketed by
# the high 16 bits of the order key.
_SORTED_TOTAL_MAX = 4096
_BUCKETS = 1 << 16
# Emitted rows per chunk of the post-pass (bounds its float32 copies of the rows).
_ROWS_PER_CHUNK = 32


class SamplingMask(NamedTuple):
    """Kept token ids per emitted token, in CSR (vLLM's ``SamplingMaskLists`` as tensors).

    Emitted tokens are numbered request-major, in output order, -1 padding excluded: request b's are
    ``cu_num_emitted[b] ... cu_num_emitted[b + 1] - 1``, the same count as its non-negative
    ``output_token_ids``. Emitted token e kept ``indices[indptr[e]:indptr[e + 1]]``, ascending. vLLM's
    ``SamplingMaskLists(token_ids, offsets, cu_num_generated_tokens)`` is ``(indices, indptr, cu_num_emitted)``.
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

def _order_bucket(z: torch.Tensor) -> torch.Tensor:
    """int32 high 16 bits of core/math.h ``order_key`` (float32 bits made order-preserving as uint32:
    ~b for negative floats, b | 2^31 otherwise), in int32 arithmetic: the key minus 2^31 is
    b ^ (0x7fffffff if b < 0 else 0), an arithmetic shift of which is the bucket minus 2^15."""
    bits = z.view(torch.int32)
    return ((bits ^ ((bits >> 31) * -0x7FFFFFFF)) >> 16) + 0x8000


def _exp_f32(x: torch.Tensor) -> torch.Tensor:
    """float32 exp as core/math.h ``exp_f32`` (the native kernels' top-p weights): computed in float64 and
    rounded once. torch's float32 exp is off by one ulp on ~1 % of inputs."""
    return torch.exp(x.double()).float()


def _walk_groups(desc: torch.Tensor, cum: torch.Tensor, zmax: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """core/sampling.h ``walk_top_p_groups``: the last kept value of ``desc`` (descending), mass ``cum``
    (float64) above its first element; +inf when none is kept. A tie group is kept iff
    ``float(mass above + w) - w < limit`` at its first element, the mass summed in float64 in order."""
    if desc.numel() == 0:
        return torch.full((), float("inf"), device=desc.device)
    weights = _exp_f32(desc - zmax)
    above = torch.cumsum(torch.cat([cum.reshape(1), weights.double()]), dim=0)[:-1]
    exclusive = (above + weights.double()).float() - weights
    first = torch.ones_like(desc, dtype=torch.bool)
    first[1:] = desc[1:] != desc[:-1]
    failed = (first & ~(exclusive < limit)).nonzero()
    end = int(failed[0]) if failed.numel() else desc.numel()
    return desc[end - 1] if end else torch.full((), float("inf"), device=desc.device)


def _top_p_threshold(z: torch.Tensor, top_p: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Top-p's smallest kept value of one row ``z`` [n] (index order, top-k applied, max finite), by the
    native CPU kernel's algorithm (core/sampling.h ``top_p_threshold``): weights w = exp(z - max), their
    total summed in float64 in index order (rows of up to ``_SORTED_TOTAL_MAX`` tokens: the sorted row,
    walked whole), per-bucket float64 masses over the high 16 bits of the order key, the bucket where the
    mass above crosses ``top_p * total``, and only that bucket sorted and walked. ``z`` may hold the top-k
    candidates alone (-inf padded): the dropped tokens have weight 0 and change none of these sums.

    It keeps exactly the reference's set (``sampling.top_p_mask``) except where float64 sums in another
    order, or torch's float32 exp (the reference's) against this correctly rounded one, round a tie group's
    mass above to the other side of the limit: the reference and the native kernel can disagree there too.
    """
    zmax = z.max()
    if vocab_size <= _SORTED_TOTAL_MAX:
        desc = torch.sort(z, descending=True).values
        limit = top_p.float() * torch.cumsum(_exp_f32(desc - zmax).double(), dim=0)[-1].float()
        return _walk_groups(desc, torch.zeros((), dtype=torch.float64, device=z.device), zmax, limit)
    weights = _exp_f32(z - zmax).double()
    limit = top_p.float() * torch.cumsum(weights, dim=0)[-1].float()
    bucket = _order_bucket(z)
    mass = torch.bincount(bucket, weights=weights, minlength=_BUCKETS).flip(0)  # largest values first
    before = torch.cumsum(torch.cat([mass.new_zeros(1), mass[:-1]]), dim=0)
    nonempty = (mass != 0).to(torch.uint8)
    # The buckets whose mass above is below the limit are a prefix (the mass above never decreases); the
    # chosen one is the last non-empty bucket in it, or the first non-empty bucket.
    below = int((before.float() < limit).sum())
    first = int(nonempty.argmax())
    chosen = _last_set(nonempty, below)
    chosen = first if chosen is None or chosen < first else chosen
    threshold = _walk_groups(torch.sort(z[bucket == _BUCKETS - 1 - chosen], descending=True).values,
                             before[chosen], zmax, limit)
    previous = _last_set(nonempty, chosen)
    if torch.isinf(threshold) and previous is not None:
        # Rounding put the boundary at the bucket's edge: every group of the bucket before it is kept.
        threshold = z[bucket == _BUCKETS - 1 - previous].min()
    return threshold


def _last_set(flags: torch.Tensor, end: int) -> int | None:
    """The last index below ``end`` where the uint8 ``flags`` is set, or None."""
    if end <= 0:
        return None
    last = end - 1 - int(flags[:end].flip(0).argmax())
    return last if bool(flags[last]) else None


def _split_rows(keep: torch.Tensor) -> list[torch.Tensor]:
    """The kept ids of each row of ``keep`` [R, V] bool, int32 ascending (a whole row as one arange)."""
    vocab_size = keep.shape[1]
    full = keep.all(dim=-1).tolist()
    everything = torch.arange(vocab_size, dtype=torch.int32, device=keep.device)
    return [everything if f else keep[r].nonzero().flatten().to(torch.int32) for r, f in enumerate(full)]


def _dense_ids(z: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> list[torch.Tensor]:
    """Kept ids of random rows by whole-row masks: top-k from the k-th largest value (``torch.topk``),
    then top-p from :func:`_top_p_threshold`. The path of rows without top-k, and of those whose ties at the k-th
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
        on = ((top_p < 1.0) & (z.max(dim=-1).values > sampling.NEG_INF)).nonzero().flatten().tolist()
        if on:
            z = z.clone()
            for r in on:
                z[r] = torch.where(z[r] >= _top_p_threshold(z[r], top_p[r], vocab_size), z[r], sampling.NEG_INF)
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
        # The candidates in index order (-inf padding last), as the native kernel sums the masked row.
        by_index = vals.gather(1, torch.argsort(torch.where(inside, idx, vocab_size), dim=-1))
        on = ((top_p < 1.0) & (vals[:, 0] > sampling.NEG_INF)).nonzero().flatten().tolist()
        for r in on:
            keep[r] &= vals[r] >= _top_p_threshold(by_index[r], top_p[r], vocab_size)
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

def _emitted_rows(rows: torch.Tensor, emitted: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The request [E] and the target row [E] of each emitted token (``emitted`` [B, W] bool, request-major),
    from the rows [B, W] of the output slots, clamped into the ``num_rows`` of the logits."""
    num_reqs, width = emitted.shape
    req = torch.arange(num_reqs, device=rows.device)[:, None].expand(num_reqs, width)[emitted]
    return req, rows[emitted].clamp(0, max(num_rows - 1, 0))


def _csr(logits, rows, emitted, temperature, top_k, top_p) -> SamplingMask:
    """The mask of the emitted tokens (``emitted`` [B, W] bool) decided at target rows ``rows`` [B, W]."""
    req, row = _emitted_rows(rows, emitted, logits.shape[0])
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


def kept_by_threshold(z: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """[R, V] bool: the kept set of rows of scaled logits ``z`` [R, V] truncated at ``threshold`` [R] (a
    backend's ``row_threshold``): the finite values at or above it.

    ``z`` may be unsanitised (``logits / temperature``): a NaN compares false (as its sanitised -inf is
    dropped) and +inf is at or above every threshold (as its sanitised float32 max is: thresholds are
    sanitised values), so one compare against ``max(threshold, -float32 max)`` is the whole rule (a NaN
    threshold, a row the kernel did not write, keeps nothing)."""
    return z >= torch.clamp(threshold, min=-sampling.FLOAT32_MAX)[:, None]


def _threshold_csr(logits, rows, emitted, temperature, row_threshold) -> SamplingMask:
    """The mask of the emitted tokens (``emitted`` [B, W] bool) decided at target rows ``rows`` [B, W], from
    the thresholds the verification wrote (``row_threshold`` [rows] float32): per emitted row, the ids whose
    scaled logit (float32 ``logit / temperature``, greedy rows at temperature 1: how the reference and the
    native CPU kernels scale) is finite and at or above its row's threshold, or [0] where that set is empty."""
    device = logits.device
    req, row = _emitted_rows(rows, emitted, logits.shape[0])
    temperature = temperature[req]
    temperature = torch.where(temperature == 0, 1.0, temperature)
    threshold = row_threshold[row]
    columns = torch.arange(logits.shape[1], dtype=torch.int32, device=device)
    counts, ids = [torch.zeros(1, dtype=torch.int64, device=device)], []
    for lo in range(0, row.numel(), _ROWS_PER_CHUNK):
        part = slice(lo, lo + _ROWS_PER_CHUNK)
        z = logits[row[part]].float().div_(temperature[part, None])  # a copy: advanced indexing
        keep = kept_by_threshold(z, threshold[part])
        count = keep.view(torch.uint8).sum(dim=-1, dtype=torch.int32).long()  # ~10x a bool tensor's sum
        empty = count == 0
        if bool(empty.any()):  # a row that keeps nothing samples token 0
            keep[:, 0] |= empty
            count = count + empty
        counts.append(count)
        if bool((count == columns.numel()).all()):  # every row whole (untruncated, all finite): no select
            ids += [columns] * count.numel()  # copied once, by the cat below
        else:
            ids.append(columns.expand_as(keep)[keep])  # row-major: each row's ids ascending
    indices = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int32, device=device)
    cu = torch.cat([counts[0], torch.cumsum(emitted.sum(dim=-1), 0)])
    return SamplingMask(torch.cumsum(torch.cat(counts), 0), indices, cu)


def chain_sampling_mask(args: tuple, result: ChainResult, row_threshold: torch.Tensor | None = None) -> SamplingMask:
    """The sampling mask of a ``verify_chain`` call from its normalised arguments
    (``api.checked_chain_args``), its result, and the row thresholds its backend wrote (``row_threshold``
    [T + B]); without them, by the post-pass (:func:`kept_ids`)."""
    logits, drafts, cu, _, temperature, top_k, top_p = args[:7]
    out = result.output_token_ids
    rows = chain_rows(cu, drafts.numel(), out.shape[1])
    if row_threshold is not None:
        return _threshold_csr(logits, rows, out >= 0, temperature, row_threshold)
    return _csr(logits, rows, out >= 0, temperature, top_k, top_p)


def tree_sampling_mask(args: tuple, result: TreeResult, row_threshold: torch.Tensor | None = None) -> SamplingMask:
    """The sampling mask of a ``verify_tree`` call from its normalised arguments
    (``api.checked_tree_args``), its result, and the row thresholds its backend wrote (``row_threshold`` [N]);
    without them, by the post-pass (:func:`kept_ids`)."""
    logits, _, parent, cu, _, temperature, top_k, top_p = args[:8]
    rows = tree_rows(cu, parent.numel(), result.accepted_nodes)
    if row_threshold is not None:
        return _threshold_csr(logits, rows, result.output_token_ids >= 0, temperature, row_threshold)
    return _csr(logits, rows, result.output_token_ids >= 0, temperature, top_k, top_p)
