"""Fused Triton tree verification: one program per request walks its tree from the root.

Emits the reference's tokens (``reference/tree.py``) for the same seeds. At every step the program reads
only the current node's target row (and, for stochastic trees, its draft row), so a request reads
depth + 1 rows, never all of its N. Top-k and top-p use exact threshold searches (bisection over the
order-preserving integer image of float32, 32 passes) instead of a sort; they keep exactly the tokens the
reference keeps. Stochastic trees keep the running residual p (and, for recursive rejection sampling,
the running q) in a [B, V] float32 workspace.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.tree import TreeResult, tree_layout
from . import gumbel
from .chain import _key_value
from .prologue import _request_span

FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)


# ----------------------------------------------------------------------------------------------------
# Device helpers (row-wise, looping over the vocabulary in BLOCK chunks)
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _scaled(row_ptr, offs, V, temp, GREEDY: tl.constexpr):
    """Sanitized float32 scaled logits of one block (masked lanes -inf). Divides with ``div_rn`` as the chain
    kernel and torch do: Triton lowers a float32 ``/`` to ``div.full.f32`` on NVIDIA GPUs (up to 2 ulp off)."""
    x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    if not GREEDY:
        x = tl.math.div_rn(x, temp)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.minimum(x, FLOAT32_MAX)
    return tl.where(offs < V, x, float("-inf"))


@triton.jit
def _order_key(z):
    """int64 key with key(a) < key(b) iff a < b for non-NaN float32 (-0 and +0 map to the same key)."""
    z = tl.where(z == 0.0, 0.0, z)
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def _masked(z, key, kth_key, top_p_key):
    return tl.where((key >= kth_key) & (key >= top_p_key), z, float("-inf"))


@triton.jit
def _top_k_key(row_ptr, V, temp, k, BLOCK: tl.constexpr):
    """Key of the k-th largest scaled logit (every token at or above it is kept), by bisection."""
    lo = _order_key(tl.full((), float("-inf"), tl.float32))
    hi = _order_key(tl.full((), FLOAT32_MAX, tl.float32))
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        count = tl.zeros((), tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = _scaled(row_ptr, offs, V, temp, False)
            count += tl.sum(((_order_key(z) >= mid) & (offs < V)).to(tl.int64), axis=0)
        ok = count >= k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _row_max_sum(row_ptr, V, temp, kth_key, top_p_key, BLOCK: tl.constexpr):
    """Max m of the truncated scaled logits and sum of exp(z - m) (m = -inf for an all -inf row)."""
    m = tl.full((), float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = _scaled(row_ptr, offs, V, temp, False)
        z = _masked(z, _order_key(z), kth_key, top_p_key)
        m = tl.maximum(m, tl.max(z, axis=0))
    shift = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = _scaled(row_ptr, offs, V, temp, False)
        z = _masked(z, _order_key(z), kth_key, top_p_key)
        total += tl.sum(tl.exp(z - shift), axis=0)
    return m, total


@triton.jit
def _top_p_key(row_ptr, V, temp, kth_key, top_p, BLOCK: tl.constexpr):
    """Smallest key t with mass(z > t) < top_p * mass(all) over the top-k-kept tokens, by bisection."""
    no_cut = _order_key(tl.full((), float("-inf"), tl.float32))
    m, total = _row_max_sum(row_ptr, V, temp, kth_key, no_cut, BLOCK)
    shift = tl.where(m == float("-inf"), 0.0, m)
    limit = top_p * total
    lo = no_cut
    hi = _order_key(tl.full((), FLOAT32_MAX, tl.float32))
    for _ in range(32):
        mid = lo + (hi - lo) // 2
        mass = tl.zeros((), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = _scaled(row_ptr, offs, V, temp, False)
            key = _order_key(z)
            z = _masked(z, key, kth_key, no_cut)
            mass += tl.sum(tl.where(key > mid, tl.exp(z - shift), 0.0), axis=0)
        ok = mass < limit
        hi = tl.where(ok, mid, hi)
        lo = tl.where(ok, lo, mid)
    return hi


@triton.jit
def _argmax_update(best, best_i, x, start):
    """Running argmax with ties to the lowest index across blocks (x is the block starting at start)."""
    block_best = tl.max(x, axis=0)
    block_i = tl.argmax(x, axis=0, tie_break_left=True) + start
    better = block_best > best
    return tl.where(better, block_best, best), tl.where(better, block_i.to(tl.int64), best_i)


@triton.jit
def _noise_base(pos, stream):
    return (pos << 32) | (stream.to(tl.int64) << 30)


@triton.jit
def _sample_row(row_ptr, V, temp, kth_key, top_p_key, seed, pos, stream, GREEDY: tl.constexpr,
                BLOCK: tl.constexpr):
    """argmax of the greedy logits, or the two-level Gumbel-max sample of the truncated scaled logits; and,
    when greedy, the row max (the greedy kept set's threshold)."""
    best = tl.full((), float("-inf"), tl.float32)
    best_i = tl.zeros((), tl.int64)
    base = _noise_base(pos, stream)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = _scaled(row_ptr, offs, V, temp, GREEDY)
        if GREEDY:
            best, best_i = _argmax_update(best, best_i, z, start)
        else:
            z = _masked(z, _order_key(z), kth_key, top_p_key)
            scores = gumbel.block_scores(z, start, seed, base, BLOCK)
            best, best_i = gumbel.best_block_update(best, best_i, scores, start, BLOCK)
    if not GREEDY:
        v = gumbel.block_entries(best_i)
        z = _scaled(row_ptr, v, V, temp, False)
        z = _masked(z, _order_key(z), kth_key, top_p_key)
        best_i = gumbel.pick_in_block(best_i, z, seed, base)
    return best_i, best


@triton.jit
def _find_child(tokens_ptr, next_sibling_ptr, first, y):
    """First child (in sibling order) whose token is y, or -1."""
    c = first
    found = tl.full((), -1, tl.int64)
    while (c >= 0) & (found < 0):
        tok = tl.load(tokens_ptr + c)
        found = tl.where(tok == y, c, found)
        c = tl.load(next_sibling_ptr + c)
    return found


@triton.jit
def _init_p(row_ptr, p_ptr, V, temp, kth_key, top_p_key, BLOCK: tl.constexpr):
    """p = softmax(truncated scaled logits) into the workspace (one-hot on 0 for an all -inf row)."""
    tl.debug_barrier()  # no thread still reads the previous row (the walk reads single entries of it)
    m, total = _row_max_sum(row_ptr, V, temp, kth_key, top_p_key, BLOCK)
    finite = m != float("-inf")
    shift = tl.where(finite, m, 0.0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = _scaled(row_ptr, offs, V, temp, False)
        z = _masked(z, _order_key(z), kth_key, top_p_key)
        p = tl.where(finite, tl.math.div_rn(tl.exp(z - shift), total), tl.where(offs == 0, 1.0, 0.0))
        tl.store(p_ptr + offs, p, mask=offs < V)


@triton.jit
def _update_residual(p_ptr, q_ptr, V, BLOCK: tl.constexpr):
    """p <- norm(max(0, p - q)), unless that residual is empty."""
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        p = tl.load(p_ptr + offs, mask=offs < V, other=0.0)
        q = tl.load(q_ptr + offs, mask=offs < V, other=0.0).to(tl.float32)
        total += tl.sum(tl.maximum(p - q, 0.0), axis=0)
    tl.debug_barrier()
    if total > 0:
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            p = tl.load(p_ptr + offs, mask=offs < V, other=0.0)
            q = tl.load(q_ptr + offs, mask=offs < V, other=0.0).to(tl.float32)
            tl.store(p_ptr + offs, tl.math.div_rn(tl.maximum(p - q, 0.0), total), mask=offs < V)
    tl.debug_barrier()


@triton.jit
def _remove_token(q_ptr, V, x, BLOCK: tl.constexpr):
    """q <- norm(q with q(x) = 0), all zeros when nothing is left."""
    tl.debug_barrier()  # no thread still reads the old row (the walk reads single entries of it)
    tl.store(q_ptr + x, 0.0)
    tl.debug_barrier()
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        total += tl.sum(tl.load(q_ptr + offs, mask=offs < V, other=0.0), axis=0)
    tl.debug_barrier()
    safe_total = tl.where(total > 0, total, 1.0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        q = tl.load(q_ptr + offs, mask=offs < V, other=0.0)
        tl.store(q_ptr + offs, tl.where(total > 0, tl.math.div_rn(q, safe_total), 0.0), mask=offs < V)
    tl.debug_barrier()


@triton.jit
def _copy_row(src_ptr, dst_ptr, V, BLOCK: tl.constexpr):
    tl.debug_barrier()  # no thread still reads the old row (the walk reads single entries of it)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(src_ptr + offs, mask=offs < V, other=0.0).to(tl.float32)
        tl.store(dst_ptr + offs, x, mask=offs < V)
    tl.debug_barrier()


@triton.jit
def _log_p_sample(p_ptr, V, seed, pos, BLOCK: tl.constexpr):
    """Two-level Gumbel-max sample of norm(p) over the workspace row, on the recovery stream."""
    best = tl.full((), float("-inf"), tl.float32)
    best_block = tl.zeros((), tl.int64)
    base = _noise_base(pos, tl.full((), 1, tl.int64))
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        p = tl.load(p_ptr + offs, mask=offs < V, other=0.0)
        scores = gumbel.weight_block_scores(p, start, seed, base, BLOCK)
        best, best_block = gumbel.best_block_update(best, best_block, scores, start, BLOCK)
    v = gumbel.block_entries(best_block)
    p = tl.load(p_ptr + v, mask=v < V, other=0.0)
    return gumbel.pick_in_block(best_block, tl.log(p), seed, base)


# ----------------------------------------------------------------------------------------------------
# The walk
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _tree_kernel(
    logits_ptr, stride_logits, tokens_ptr, first_child_ptr, next_sibling_ptr, slot_ptr, cu_ptr,
    q_ptr, stride_q, temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, pos_ptr, p_ws_ptr, q_ws_ptr,
    out_ptr, path_ptr, num_acc_ptr, threshold_ptr, V, max_depth, num_nodes,
    STOCHASTIC: tl.constexpr, WITHOUT_REPLACEMENT: tl.constexpr, HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr, WRITE_THRESHOLD: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    width = max_depth + 1
    # A request left without nodes verifies nothing.
    root, end = _request_span(cu_ptr, b, num_nodes)
    temp = tl.load(temp_ptr + b)
    seed = tl.load(seed_ptr + b)
    pos0 = tl.load(pos_ptr + b)
    greedy = temp == 0
    safe_temp = tl.where(greedy, 1.0, temp)
    k = tl.zeros((), tl.int64)
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + b).to(tl.int64)
    top_p = 1.0
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + b)
    p_row = p_ws_ptr + b * V
    q_row = q_ws_ptr + b * V
    no_cut = _order_key(tl.full((), float("-inf"), tl.float32))

    cur = root
    d = tl.zeros((), tl.int64)
    active = (end > root).to(tl.int32)
    if active != 0:
        tl.store(path_ptr + b * width, 0)
    while (d <= max_depth) & (active != 0):
        row = logits_ptr + cur * stride_logits
        first = tl.load(first_child_ptr + cur)
        first = tl.where(d < max_depth, first, -1)
        is_leaf = first < 0
        pos = pos0 + d
        stream = tl.where(is_leaf, 2, 1).to(tl.int64)
        child = tl.full((), -1, tl.int64)
        y = tl.zeros((), tl.int64)
        if greedy:
            y, row_max = _sample_row(row, V, safe_temp, no_cut, no_cut, seed, pos, stream, True, BLOCK)
            if WRITE_THRESHOLD:
                tl.store(threshold_ptr + cur, row_max)
            child = _find_child(tokens_ptr, next_sibling_ptr, first, y)
        else:
            kth_key = no_cut
            if HAS_TOP_K:
                if (k > 0) & (k < V):
                    kth_key = _top_k_key(row, V, safe_temp, k, BLOCK)
            top_p_key = no_cut
            if HAS_TOP_P:
                if top_p < 1.0:
                    top_p_key = _top_p_key(row, V, safe_temp, kth_key, top_p, BLOCK)
            if WRITE_THRESHOLD:  # the row keeps its keys at or above both
                tl.store(threshold_ptr + cur, _key_value(tl.maximum(kth_key, top_p_key)))
            stochastic = first >= 0
            if not STOCHASTIC:
                stochastic = first < -1  # always False: deterministic tree
            if stochastic:
                _init_p(row, p_row, V, safe_temp, kth_key, top_p_key, BLOCK)
                q_src = q_ptr + cur * stride_q
                if WITHOUT_REPLACEMENT:
                    _copy_row(q_src, q_row, V, BLOCK)
                    q_src = q_row
                tl.debug_barrier()
                c = first
                while (c >= 0) & (child < 0):
                    x = tl.load(tokens_ptr + c)
                    if (x >= 0) & (x < V):
                        s = tl.load(slot_ptr + c)
                        coin = gumbel.uniform(seed, pos << 32, s.to(tl.int64))
                        p_x = tl.load(p_row + x)
                        q_x = tl.load(q_src + x).to(tl.float32)
                        if coin * q_x < p_x:
                            child = c
                        else:
                            _update_residual(p_row, q_src, V, BLOCK)
                            if WITHOUT_REPLACEMENT:
                                _remove_token(q_row, V, x, BLOCK)
                    c = tl.load(next_sibling_ptr + c)
                if child < 0:
                    y = _log_p_sample(p_row, V, seed, pos, BLOCK)
            else:
                y, _ = _sample_row(row, V, safe_temp, kth_key, top_p_key, seed, pos, stream, False, BLOCK)
                child = _find_child(tokens_ptr, next_sibling_ptr, first, y)
        if child >= 0:
            tl.store(out_ptr + b * width + d, tl.load(tokens_ptr + child).to(tl.int32))
            tl.store(path_ptr + b * width + d + 1, (child - root).to(tl.int32))
            cur = child
        else:
            tl.store(out_ptr + b * width + d, y.to(tl.int32))
            tl.store(num_acc_ptr + b, d.to(tl.int32))
            active = tl.zeros((), tl.int32)
        d += 1


def _block_size(vocab_size: int) -> int:
    return min(4096, triton.next_power_of_2(max(vocab_size, 16)))


def verify_tree(
    target_logits_: torch.Tensor,
    node_token_ids: torch.Tensor,
    parent: torch.Tensor,
    cu_num_nodes: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seed: torch.Tensor,
    position: torch.Tensor,
    sibling_sampling: str,
    max_depth: int,
    row_threshold: torch.Tensor | None = None,
) -> TreeResult:
    """Triton tree verification on validated, normalised inputs (same contract as the reference).
    ``row_threshold`` [N] float32 or None: receives, for every node the walk decides at (the accepted path and
    the node it stops at), the threshold of its row's kept set (``reference.sampling.kept_threshold``)."""
    num_nodes, vocab_size = target_logits_.shape
    num_reqs = cu_num_nodes.numel() - 1
    device = target_logits_.device
    width = max_depth + 1
    out = torch.full((num_reqs, width), -1, dtype=torch.int32, device=device)
    path = torch.full((num_reqs, width), -1, dtype=torch.int32, device=device)
    num_accepted = torch.zeros(num_reqs, dtype=torch.int32, device=device)
    if num_reqs == 0:
        return TreeResult(out, path, num_accepted)
    layout = tree_layout(cu_num_nodes, parent)
    stochastic = draft_probs is not None
    without_replacement = stochastic and sibling_sampling == "without_replacement"
    p_ws = torch.empty((num_reqs if stochastic else 1, vocab_size), dtype=torch.float32, device=device)
    q_ws = torch.empty((num_reqs if without_replacement else 1, vocab_size), dtype=torch.float32, device=device)
    q = draft_probs if stochastic else p_ws
    _tree_kernel[(num_reqs,)](
        target_logits_, target_logits_.stride(0), node_token_ids, layout.first_child, layout.next_sibling,
        layout.sibling_slot, cu_num_nodes, q, q.stride(0), temperature,
        top_k if top_k is not None else temperature, top_p if top_p is not None else temperature,
        seed, position, p_ws, q_ws, out, path, num_accepted, temperature if row_threshold is None else row_threshold,
        vocab_size, max_depth, num_nodes,
        STOCHASTIC=stochastic, WITHOUT_REPLACEMENT=without_replacement, HAS_TOP_K=top_k is not None,
        HAS_TOP_P=top_p is not None, WRITE_THRESHOLD=row_threshold is not None, BLOCK=_block_size(vocab_size),
    )
    return TreeResult(out, path, num_accepted)
