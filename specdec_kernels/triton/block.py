"""Fused Triton block verification of chains (``verify_chain(method="block")``): one program per request.

Emits the reference's tokens (``reference/block.py``, whose docstring derives the rules) for the same
seeds. Each program walks its block's rows once: per row the truncation thresholds (as the chain kernel),
the online softmax statistics, the residual mass ``sum max(0, w p - q)`` (float64) for the stop
probability, and the next weight from p(x) and q(x); rows after the weight reaches 0 are skipped. The
token after the accepted prefix takes one more pass over row tau (two-level Gumbel-max, ``triton/gumbel.py``,
on log max(0, w p - q), or on the scaled logits at the block's last row). Greedy requests follow the argmax as token level does;
deterministic drafts run the token-level kernel (``triton/chain.py``).

The helpers here (sequence-level coin, weights, residual mass and sampling) are shared with the traversal
kernel (``triton/traversal.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.chain import ChainResult
from ..reference.philox import SEQUENCE_COIN_FLAG, STREAM_BONUS, STREAM_RECOVERY
from . import gumbel
from .chain import (
    _KEY_NEG_INF,
    _greedy_argmax,
    _gumbel_argmax,
    _softmax_stats,
    _store_threshold,
    _target_prob,
    _top_k_threshold,
    _top_p_threshold,
    _truncated_logits,
    chain_config,
)
from .chain import verify_chain as verify_chain_token
from .prologue import _request_sampling, _request_span

__all__ = ["verify_chain_block"]

_SEQUENCE_COIN_FLAG = tl.constexpr(SEQUENCE_COIN_FLAG)
_STREAM_RECOVERY = tl.constexpr(STREAM_RECOVERY)
_STREAM_BONUS = tl.constexpr(STREAM_BONUS)


# ----------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _sequence_coin(seed, position, index):
    """``philox.sequence_coins``: uniform(seed, position | 2**31, stream 0, index)."""
    offset_base = (position.to(tl.int64) | _SEQUENCE_COIN_FLAG) << 32
    return gumbel.uniform(seed, offset_base, index + tl.zeros((), tl.int64))


@triton.jit
def _ratio_weight(num, q_x):
    """float32 min(1, num / q_x): 1 when num >= q_x and num > 0, 0 when num = 0."""
    safe_q = tl.where(q_x > 0, q_x, 1.0)
    return tl.where(num >= q_x, tl.where(num > 0, 1.0, 0.0), tl.math.div_rn(num, safe_q))


@triton.jit
def _stop_probability(mass, weight):
    """float64 Z / (Z + 1 - w), 0 where the denominator is 0."""
    denom = mass + (1.0 - weight.to(tl.float64))
    return tl.where(denom > 0, mass / tl.where(denom > 0, denom, 1.0), 0.0)


@triton.jit
def _probs(row_ptr, offs, mask, temperature, threshold, m, total):
    """p of one tile of the truncated target given its max and normalizer (one-hot on 0 if empty)."""
    z = _truncated_logits(row_ptr, offs, mask, temperature, threshold)
    empty_row = m == float("-inf")
    p = tl.math.div_rn(tl.exp(z - tl.where(empty_row, 0.0, m)), total)
    return tl.where(empty_row, tl.where(offs == 0, 1.0, 0.0), tl.where(mask, p, 0.0))


@triton.jit
def _weighted_residual(row_ptr, q_row_ptr, offs, mask, temperature, threshold, m, total, w):
    """max(0, w p - q) of one tile (0 on padding lanes)."""
    p = _probs(row_ptr, offs, mask, temperature, threshold, m, total)
    q = tl.load(q_row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return tl.where(mask, tl.maximum(w * p - q, 0.0), 0.0)


@triton.jit
def _weighted_mass(row_ptr, q_row_ptr, vocab_size, temperature, threshold, m, total, w, BLOCK_V: tl.constexpr):
    """float64 sum max(0, w p - q) over the row."""
    mass = tl.zeros((), tl.float64)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        r = _weighted_residual(row_ptr, q_row_ptr, offs, mask, temperature, threshold, m, total, w)
        mass += tl.sum(r.to(tl.float64), axis=0)
    return mass


@triton.jit
def _weighted_residual_sample(row_ptr, q_row_ptr, vocab_size, temperature, threshold, m, total, w, seed, offset_base,
                              BLOCK_V: tl.constexpr):
    """Two-level Gumbel-max sample of norm(max(0, w p - q)), or of p itself when that residual is empty (one
    pass for both, then the winning block's 16 entries)."""
    best_r = float("-inf")
    block_r = tl.zeros((), tl.int64)
    best_z = float("-inf")
    block_z = tl.zeros((), tl.int64)
    max_r = 0.0
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        z = tl.where(mask, _truncated_logits(row_ptr, offs, mask, temperature, threshold), float("-inf"))
        r = _weighted_residual(row_ptr, q_row_ptr, offs, mask, temperature, threshold, m, total, w)
        max_r = tl.maximum(max_r, tl.max(r, axis=0))
        scores_r = gumbel.weight_block_scores(r, start, seed, offset_base, BLOCK_V)
        scores_z = gumbel.block_scores(z, start, seed, offset_base, BLOCK_V)
        best_r, block_r = gumbel.best_block_update(best_r, block_r, scores_r, start, BLOCK_V)
        best_z, block_z = gumbel.best_block_update(best_z, block_z, scores_z, start, BLOCK_V)
    use_r = max_r > 0.0
    block = tl.where(use_r, block_r, block_z)
    v = gumbel.block_entries(block)
    mask = v < vocab_size
    z = tl.where(mask, _truncated_logits(row_ptr, v, mask, temperature, threshold), float("-inf"))
    r = _weighted_residual(row_ptr, q_row_ptr, v, mask, temperature, threshold, m, total, w)
    return gumbel.pick_in_block(block, tl.where(use_r, tl.log(r), z), seed, offset_base)


@triton.jit
def _threshold(row_ptr, vocab_size, temperature, use_top_k, top_k, use_top_p, top_p,
               HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, BLOCK_V: tl.constexpr,
               SEARCH_BLOCK_V: tl.constexpr, NUM_PIVOTS: tl.constexpr):
    """The truncation key threshold of one row (top-k, then top-p), as the chain kernel."""
    threshold = tl.full((), _KEY_NEG_INF, tl.int64)
    if HAS_TOP_K:
        if use_top_k:
            threshold = _top_k_threshold(row_ptr, vocab_size, temperature, top_k, SEARCH_BLOCK_V, NUM_PIVOTS)
    if HAS_TOP_P:
        if use_top_p:
            threshold = _top_p_threshold(row_ptr, vocab_size, temperature, threshold, top_p, BLOCK_V,
                                         SEARCH_BLOCK_V, NUM_PIVOTS)
    return threshold


# ----------------------------------------------------------------------------------------------------
# The kernel: one program per request
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _verify_chain_block_kernel(
    logits_ptr, draft_ids_ptr, cu_ptr, draft_probs_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, position_ptr,
    out_ptr, num_accepted_ptr, threshold_ptr,
    vocab_size, out_width, total_drafts,
    HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, WRITE_THRESHOLD: tl.constexpr,
    BLOCK_V: tl.constexpr, SEARCH_BLOCK_V: tl.constexpr, NUM_PIVOTS: tl.constexpr,
):
    b = tl.program_id(0)
    draft_start, draft_end = _request_span(cu_ptr, b, total_drafts)
    num_drafts = tl.minimum(draft_end - draft_start, out_width - 1)  # and the output row
    first_row = draft_start + b
    temperature, greedy, seed, position, use_top_k, top_k, use_top_p, top_p = _request_sampling(
        b, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, position_ptr, vocab_size, HAS_TOP_K, HAS_TOP_P)

    # The block ends at its first placeholder.
    block_len = num_drafts
    for j in range(0, num_drafts):
        x = tl.load(draft_ids_ptr + draft_start + j)
        block_len = tl.where((block_len == num_drafts) & ((x < 0) | (x >= vocab_size)), j, block_len)

    tau = tl.zeros((), tl.int64)
    token = tl.zeros((), tl.int64)
    emitted = tl.full((), 0, tl.int1)
    if greedy:  # the longest prefix of drafts matching the argmax, then the argmax
        running = tl.full((), 1, tl.int1)
        for j in range(0, num_drafts + 1):
            if running:
                y, row_max = _greedy_argmax(logits_ptr + (first_row + j) * vocab_size, vocab_size, BLOCK_V)
                if WRITE_THRESHOLD:
                    tl.store(threshold_ptr + first_row + j, row_max)
                x = tl.load(draft_ids_ptr + draft_start + j, mask=j < num_drafts, other=-1)
                if (j < num_drafts) & (x == y):
                    tau += 1
                else:
                    token = y
                    running = tl.zeros((), tl.int1)
        emitted = tl.full((), 1, tl.int1)
    else:
        w = tl.full((), 1.0, tl.float32)
        # Not `w_tau = w`: the compiler finds loop-carried names by comparing each name's value before and
        # after one pass over the body, and `w_tau = w` in the body would leave w_tau's value unchanged
        # (both names hold the same initial value), so w_tau would not be carried out of the loop.
        w_tau = tl.full((), 1.0, tl.float32)
        running = tl.full((), 1, tl.int1)
        for j in range(0, num_drafts + 1):
            if running & (j <= block_len):
                row_ptr = logits_ptr + (first_row + j) * vocab_size
                threshold = _threshold(row_ptr, vocab_size, temperature, use_top_k, top_k, use_top_p, top_p,
                                       HAS_TOP_K, HAS_TOP_P, BLOCK_V, SEARCH_BLOCK_V, NUM_PIVOTS)
                _store_threshold(threshold_ptr, first_row + j, threshold, WRITE_THRESHOLD)
                if j == block_len:  # h = w: a stop here is the largest; emit from p itself
                    stop = j == 0
                    if j > 0:
                        stop = _sequence_coin(seed, position, j).to(tl.float64) < w.to(tl.float64)
                    if stop:
                        stream = tl.where(block_len == num_drafts, _STREAM_BONUS, _STREAM_RECOVERY).to(tl.int64)
                        token = _gumbel_argmax(row_ptr, vocab_size, temperature, threshold, seed,
                                               ((position + j) << 32) | (stream << 30), BLOCK_V)
                        tau = j
                        emitted = tl.full((), 1, tl.int1)
                    running = tl.zeros((), tl.int1)
                else:
                    m, total = _softmax_stats(row_ptr, vocab_size, temperature, threshold, BLOCK_V)
                    q_row_ptr = draft_probs_ptr + (draft_start + j) * vocab_size
                    if j > 0:
                        mass = _weighted_mass(row_ptr, q_row_ptr, vocab_size, temperature, threshold, m, total, w,
                                              BLOCK_V)
                        if _sequence_coin(seed, position, j).to(tl.float64) < _stop_probability(mass, w):
                            tau = j
                            w_tau = w
                    x = tl.load(draft_ids_ptr + draft_start + j)
                    p_x = _target_prob(row_ptr, x, temperature, threshold, m, total)
                    q_x = tl.load(q_row_ptr + x).to(tl.float32)
                    w = _ratio_weight(w * p_x, q_x)
                    running = w != 0.0
        if not emitted:  # y ~ norm(max(0, w_tau p_tau - q_tau)) from row tau < block_len
            row_ptr = logits_ptr + (first_row + tau) * vocab_size
            threshold = _threshold(row_ptr, vocab_size, temperature, use_top_k, top_k, use_top_p, top_p,
                                   HAS_TOP_K, HAS_TOP_P, BLOCK_V, SEARCH_BLOCK_V, NUM_PIVOTS)
            m, total = _softmax_stats(row_ptr, vocab_size, temperature, threshold, BLOCK_V)
            token = _weighted_residual_sample(row_ptr, draft_probs_ptr + (draft_start + tau) * vocab_size,
                                              vocab_size, temperature, threshold, m, total, w_tau, seed,
                                              ((position + tau) << 32) | (_STREAM_RECOVERY << 30), BLOCK_V)
    for j in range(0, num_drafts):
        if j < tau:
            tl.store(out_ptr + b * out_width + j, tl.load(draft_ids_ptr + draft_start + j).to(tl.int32))
    tl.store(out_ptr + b * out_width + tau, token.to(tl.int32))
    tl.store(num_accepted_ptr + b, tau.to(tl.int32))


def verify_chain_block(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seed: torch.Tensor,
    position: torch.Tensor,
    max_draft_len: int,
    row_threshold: torch.Tensor | None = None,
) -> ChainResult:
    """Triton block verification on validated, normalised inputs (``verify_chain``'s contract). No host syncs.
    ``row_threshold``: as ``triton.chain.verify_chain``'s (every row the block walk reads)."""
    if draft_probs is None:
        return verify_chain_token(target_logits, draft_token_ids, cu_num_draft_tokens, None, temperature, top_k,
                                  top_p, seed, position, max_draft_len, row_threshold)
    num_reqs = cu_num_draft_tokens.numel() - 1
    vocab_size = target_logits.shape[1]
    device = target_logits.device
    out = torch.full((num_reqs, max_draft_len + 1), -1, dtype=torch.int32, device=device)
    num_accepted = torch.zeros(num_reqs, dtype=torch.int32, device=device)
    if num_reqs == 0:
        return ChainResult(out, num_accepted)
    config = chain_config(vocab_size, target_logits.dtype)
    _verify_chain_block_kernel[(num_reqs,)](
        target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs,
        temperature, temperature if top_k is None else top_k, temperature if top_p is None else top_p,
        seed, position, out, num_accepted, temperature if row_threshold is None else row_threshold,
        vocab_size, max_draft_len + 1, draft_token_ids.numel(),
        HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None, WRITE_THRESHOLD=row_threshold is not None,
        BLOCK_V=config.block_v, SEARCH_BLOCK_V=config.search_block_v, NUM_PIVOTS=config.num_pivots,
        num_warps=config.num_warps,
    )
    return ChainResult(out, num_accepted)
