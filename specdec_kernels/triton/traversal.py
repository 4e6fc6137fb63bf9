"""Fused Triton traversal verification of trees (``verify_tree(method="traversal")``): one program per request.

Emits the reference's tokens (``reference/traversal.py``, whose docstring derives the rules) for the same
seeds. Each program runs the depth-first traversal with an explicit path: the per-depth scalars (node,
next child, mass M, divisor, whether a child was deleted) live in registers of ``BLOCK_D`` lanes, the
per-depth mass rows (and, without replacement, the running draft laws) in a [B, D + 1, V] float32
workspace. Entering a node reads its target row (truncation thresholds, softmax statistics, ``r = a p``);
deleting a rejected child is one pass over its parent's row; dead subtrees (weight 0) are never read.
Every helper that writes a workspace row starts and ends with a barrier: all of the program's threads read
single entries of those rows (a weight, a draft probability), and a thread that ran ahead into the next
write would change what a slower thread still reads (seen on an H200 as 3 requests in 65476 taking another
path than the reference).
Greedy requests follow the argmax as token level does; deterministic trees run the token-level kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.philox import STREAM_BONUS, STREAM_RECOVERY
from ..reference.tree import TreeResult, tree_layout
from . import gumbel
from .block import _probs, _ratio_weight, _sequence_coin, _softmax_stats, _threshold
from .chain import _greedy_argmax, _gumbel_argmax, _store_threshold, chain_config
from .prologue import _request_sampling, _request_span
from .tree import verify_tree as verify_tree_token

__all__ = ["verify_tree_traversal"]

_STREAM_RECOVERY = tl.constexpr(STREAM_RECOVERY)
_STREAM_BONUS = tl.constexpr(STREAM_BONUS)
_INDEX_MASK = tl.constexpr((1 << 30) - 1)


@triton.jit
def _get(values, idx, d):
    return tl.sum(tl.where(idx == d, values, 0), axis=0)


@triton.jit
def _set(values, idx, d, value):
    return tl.where(idx == d, value, values)


@triton.jit
def _store_mass_row(row_ptr, r_ptr, vocab_size, temperature, threshold, m, total, a, BLOCK_V: tl.constexpr):
    """r = a * p over the row (p the truncated target)."""
    tl.debug_barrier()  # no thread still reads the old row (the walk reads single entries of it)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        p = _probs(row_ptr, offs, mask, temperature, threshold, m, total)
        tl.store(r_ptr + offs, a * p, mask=mask)
    tl.debug_barrier()


@triton.jit
def _delete_update(r_ptr, divisor, q_ptr, vocab_size, BLOCK_V: tl.constexpr):
    """r <- max(0, r / divisor - q) in place; returns its sum (float64)."""
    tl.debug_barrier()  # no thread still reads the old row (the walk reads single entries of it)
    mass = tl.zeros((), tl.float64)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        q = tl.load(q_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        new = tl.where(mask, tl.maximum(tl.math.div_rn(r, divisor) - q, 0.0), 0.0)
        tl.store(r_ptr + offs, new, mask=mask)
        mass += tl.sum(new.to(tl.float64), axis=0)
    tl.debug_barrier()
    return mass


@triton.jit
def _copy_row(src_ptr, dst_ptr, vocab_size, BLOCK_V: tl.constexpr):
    tl.debug_barrier()  # no thread still reads the old row (the walk reads single entries of it)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32), mask=mask)
    tl.debug_barrier()


@triton.jit
def _remove_token(q_ptr, vocab_size, x, BLOCK_V: tl.constexpr):
    """q <- norm(q with q(x) = 0), all zeros when nothing is left."""
    tl.debug_barrier()  # no thread still reads the old row (the walk reads single entries of it)
    tl.store(q_ptr + x, 0.0)
    tl.debug_barrier()
    total = tl.zeros((), tl.float32)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        total += tl.sum(tl.load(q_ptr + offs, mask=offs < vocab_size, other=0.0), axis=0)
    tl.debug_barrier()
    safe = tl.where(total > 0, total, 1.0)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        q = tl.load(q_ptr + offs, mask=mask, other=0.0)
        tl.store(q_ptr + offs, tl.where(total > 0, tl.math.div_rn(q, safe), 0.0), mask=mask)
    tl.debug_barrier()


@triton.jit
def _log_sample(r_ptr, vocab_size, seed, offset_base, BLOCK_V: tl.constexpr):
    """Two-level Gumbel-max sample of norm(r) over a workspace row of nonnegative weights r."""
    best = float("-inf")
    block = tl.zeros((), tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        r = tl.load(r_ptr + offs, mask=offs < vocab_size, other=0.0)
        scores = gumbel.weight_block_scores(r, start, seed, offset_base, BLOCK_V)
        best, block = gumbel.best_block_update(best, block, scores, start, BLOCK_V)
    v = gumbel.block_entries(block)
    r = tl.load(r_ptr + v, mask=v < vocab_size, other=0.0)
    return gumbel.pick_in_block(block, tl.log(r), seed, offset_base)


@triton.jit
def _traversal_kernel(
    logits_ptr, tokens_ptr, first_child_ptr, next_sibling_ptr, cu_ptr, q_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, position_ptr, r_ws_ptr, q_ws_ptr,
    out_ptr, path_ptr, num_accepted_ptr, threshold_ptr, vocab_size, max_depth, num_nodes,
    WITHOUT_REPLACEMENT: tl.constexpr, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, WRITE_THRESHOLD: tl.constexpr,
    BLOCK_V: tl.constexpr, SEARCH_BLOCK_V: tl.constexpr, NUM_PIVOTS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    width = max_depth + 1
    # A request left without nodes verifies nothing (its outputs stay -1, 0 accepted).
    root, end = _request_span(cu_ptr, b, num_nodes)
    temperature, greedy, seed, position, use_top_k, top_k, use_top_p, top_p = _request_sampling(
        b, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, position_ptr, vocab_size, HAS_TOP_K, HAS_TOP_P)

    if end > root:
        idx = tl.arange(0, BLOCK_D).to(tl.int64)
        path = tl.zeros((BLOCK_D,), tl.int64) + root
        d = tl.zeros((), tl.int64)
        token = tl.zeros((), tl.int64)
        if greedy:  # the token-level walk: descend into the first child whose token is the argmax
            active = tl.full((), 1, tl.int1)
            while active:
                node = _get(path, idx, d)
                y, row_max = _greedy_argmax(logits_ptr + node * vocab_size, vocab_size, BLOCK_V)
                if WRITE_THRESHOLD:
                    tl.store(threshold_ptr + node, row_max)
                c = tl.where(d < max_depth, tl.load(first_child_ptr + node), -1)
                found = tl.full((), -1, tl.int64)
                while (c >= 0) & (found < 0):
                    found = tl.where(tl.load(tokens_ptr + c) == y, c, found)
                    c = tl.load(next_sibling_ptr + c)
                if found >= 0:
                    d += 1
                    path = _set(path, idx, d, found)
                else:
                    token = y
                    active = tl.zeros((), tl.int1)
        else:
            ws = r_ws_ptr + b * width * vocab_size
            qws = q_ws_ptr + b * width * vocab_size
            cursor = tl.full((BLOCK_D,), -1, tl.int64)
            mass = tl.zeros((BLOCK_D,), tl.float64)
            last = tl.zeros((BLOCK_D,), tl.float64)
            divisor = tl.full((BLOCK_D,), 1.0, tl.float32)
            deleted = tl.zeros((BLOCK_D,), tl.int32)
            alive = tl.zeros((BLOCK_D,), tl.int32)
            # Enter the root: m = p, M = 1.
            threshold = _threshold(logits_ptr + root * vocab_size, vocab_size, temperature, use_top_k, top_k, use_top_p,
                                   top_p, HAS_TOP_K, HAS_TOP_P, BLOCK_V, SEARCH_BLOCK_V, NUM_PIVOTS)
            _store_threshold(threshold_ptr, root, threshold, WRITE_THRESHOLD)
            m, total = _softmax_stats(logits_ptr + root * vocab_size, vocab_size, temperature, threshold, BLOCK_V)
            _store_mass_row(logits_ptr + root * vocab_size, ws, vocab_size, temperature, threshold, m, total, 1.0,
                            BLOCK_V)
            if WITHOUT_REPLACEMENT:
                _copy_row(q_ptr + root * vocab_size, qws, vocab_size, BLOCK_V)
            mass = _set(mass, idx, 0, 1.0)
            alive = _set(alive, idx, 0, 1)
            cursor = _set(cursor, idx, 0, tl.where(max_depth > 0, tl.load(first_child_ptr + root), -1))
            active = tl.full((), 1, tl.int1)
            while active:
                node = _get(path, idx, d)
                c = _get(cursor, idx, d)
                searching = c >= 0
                while searching:  # skip placeholders: no update
                    x = tl.load(tokens_ptr + c)
                    if (x >= 0) & (x < vocab_size):
                        searching = tl.zeros((), tl.int1)
                    else:
                        c = tl.load(next_sibling_ptr + c)
                        searching = c >= 0
                if (_get(alive, idx, d) != 0) & (d < max_depth) & (c >= 0):
                    cursor = _set(cursor, idx, d, tl.load(next_sibling_ptr + c))
                    x = tl.load(tokens_ptr + c)
                    num = tl.math.div_rn(tl.load(ws + d * vocab_size + x), _get(divisor, idx, d))
                    if WITHOUT_REPLACEMENT:
                        q_x = tl.load(qws + d * vocab_size + x)
                    else:
                        q_x = tl.load(q_ptr + node * vocab_size + x).to(tl.float32)
                    a = _ratio_weight(num, q_x)
                    d += 1
                    path = _set(path, idx, d, c)
                    cursor = _set(cursor, idx, d, tl.where(d < max_depth, tl.load(first_child_ptr + c), -1))
                    mass = _set(mass, idx, d, a.to(tl.float64))
                    divisor = _set(divisor, idx, d, 1.0)
                    deleted = _set(deleted, idx, d, 0)
                    alive = _set(alive, idx, d, (a > 0).to(tl.int32))
                    if a > 0:
                        row_ptr = logits_ptr + c * vocab_size
                        threshold = _threshold(row_ptr, vocab_size, temperature, use_top_k, top_k, use_top_p, top_p,
                                               HAS_TOP_K, HAS_TOP_P, BLOCK_V, SEARCH_BLOCK_V, NUM_PIVOTS)
                        _store_threshold(threshold_ptr, c, threshold, WRITE_THRESHOLD)
                        m, total = _softmax_stats(row_ptr, vocab_size, temperature, threshold, BLOCK_V)
                        _store_mass_row(row_ptr, ws + d * vocab_size, vocab_size, temperature, threshold, m, total, a,
                                        BLOCK_V)
                        if WITHOUT_REPLACEMENT:
                            _copy_row(q_ptr + c * vocab_size, qws + d * vocab_size, vocab_size, BLOCK_V)
                elif d == 0:
                    active = tl.zeros((), tl.int1)  # the root is always accepted when reached
                else:
                    coin = _sequence_coin(seed, position, (node - root) & _INDEX_MASK)
                    if coin.to(tl.float64) < _get(mass, idx, d):
                        active = tl.zeros((), tl.int1)
                    else:  # delete the node from its parent's mass
                        up = d - 1
                        if WITHOUT_REPLACEMENT:
                            q_up = qws + up * vocab_size
                        else:
                            q_up = q_ptr + _get(path, idx, up) * vocab_size
                        z = _delete_update(ws + up * vocab_size, _get(divisor, idx, up), q_up, vocab_size, BLOCK_V)
                        denom = z + (1.0 - _get(mass, idx, up))
                        mass = _set(mass, idx, up, tl.where(denom > 0, z / tl.where(denom > 0, denom, 1.0), 0.0))
                        divisor = _set(divisor, idx, up, tl.where(denom > 0, denom.to(tl.float32), 1.0))
                        deleted = _set(deleted, idx, up, 1)
                        last = _set(last, idx, up, z)
                        if WITHOUT_REPLACEMENT:
                            _remove_token(qws + up * vocab_size, vocab_size, tl.load(tokens_ptr + node), BLOCK_V)
                        d = up
            # Emission at the accepted node.
            node = _get(path, idx, d)
            pos = position + d
            if (_get(deleted, idx, d) != 0) & (_get(last, idx, d) > 0):
                token = _log_sample(ws + d * vocab_size, vocab_size, seed, (pos << 32) | (_STREAM_RECOVERY << 30),
                                    BLOCK_V)
            else:
                leaf = (d >= max_depth) | (tl.load(first_child_ptr + node) < 0)
                stream = tl.where((_get(deleted, idx, d) == 0) & leaf, _STREAM_BONUS, _STREAM_RECOVERY).to(tl.int64)
                row_ptr = logits_ptr + node * vocab_size
                threshold = _threshold(row_ptr, vocab_size, temperature, use_top_k, top_k, use_top_p, top_p,
                                       HAS_TOP_K, HAS_TOP_P, BLOCK_V, SEARCH_BLOCK_V, NUM_PIVOTS)
                _store_threshold(threshold_ptr, node, threshold, WRITE_THRESHOLD)
                token = _gumbel_argmax(row_ptr, vocab_size, temperature, threshold, seed, (pos << 32) | (stream << 30),
                                       BLOCK_V)
        for i in range(0, BLOCK_D):
            if i < d:
                tl.store(out_ptr + b * width + i, tl.load(tokens_ptr + _get(path, idx, i + 1)).to(tl.int32))
            if i <= d:
                tl.store(path_ptr + b * width + i, (_get(path, idx, i) - root).to(tl.int32))
        tl.store(out_ptr + b * width + d, token.to(tl.int32))
        tl.store(num_accepted_ptr + b, d.to(tl.int32))


def verify_tree_traversal(
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
    """Triton traversal verification on validated, normalised inputs (``verify_tree``'s contract). No host syncs.
    ``row_threshold``: as ``triton.tree.verify_tree``'s (every node the traversal enters, the accepted path
    included)."""
    if draft_probs is None:
        return verify_tree_token(target_logits_, node_token_ids, parent, cu_num_nodes, None, temperature, top_k,
                                 top_p, seed, position, sibling_sampling, max_depth, row_threshold)
    vocab_size = target_logits_.shape[1]
    num_reqs = cu_num_nodes.numel() - 1
    device = target_logits_.device
    width = max_depth + 1
    out = torch.full((num_reqs, width), -1, dtype=torch.int32, device=device)
    path = torch.full((num_reqs, width), -1, dtype=torch.int32, device=device)
    num_accepted = torch.zeros(num_reqs, dtype=torch.int32, device=device)
    if num_reqs == 0:
        return TreeResult(out, path, num_accepted)
    layout = tree_layout(cu_num_nodes, parent)
    without_replacement = sibling_sampling == "without_replacement"
    r_ws = torch.empty((num_reqs, width, vocab_size), dtype=torch.float32, device=device)
    q_ws = torch.empty((num_reqs if without_replacement else 1, width if without_replacement else 1, vocab_size),
                       dtype=torch.float32, device=device)
    config = chain_config(vocab_size, target_logits_.dtype)
    _traversal_kernel[(num_reqs,)](
        target_logits_, node_token_ids, layout.first_child, layout.next_sibling, cu_num_nodes, draft_probs,
        temperature, temperature if top_k is None else top_k, temperature if top_p is None else top_p,
        seed, position, r_ws, q_ws, out, path, num_accepted, temperature if row_threshold is None else row_threshold,
        vocab_size, max_depth, node_token_ids.numel(),
        WITHOUT_REPLACEMENT=without_replacement, HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
        WRITE_THRESHOLD=row_threshold is not None,
        BLOCK_V=config.block_v, SEARCH_BLOCK_V=config.search_block_v, NUM_PIVOTS=config.num_pivots,
        BLOCK_D=triton.next_power_of_2(width), num_warps=config.num_warps,
    )
    return TreeResult(out, path, num_accepted)
