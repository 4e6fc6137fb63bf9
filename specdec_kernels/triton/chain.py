"""Fused Triton chain verification: one program per request, straight from the target logits.

Each program walks its request's rows in order and stops at the first rejection, so it reads only the
rows whose decision is needed. Per row, everything is streamed over vocabulary tiles:

- greedy request: one pass (argmax of the sanitized logits, ties to the lowest index);
- deterministic drafts, random request: one pass (two-level Gumbel-max, ``reference/gumbel.py``: block
  scores over tiles, then the winning block's 16 entries; no normalizer);
- stochastic drafts: one online max/normalizer pass per draft row, plus one residual pass at the first
  rejection (the residual and the plain target are sampled in the same pass, for the empty-residual case);
- top-k / top-p: a threshold search instead of a sort. Scaled logits are mapped to an order-preserving
  int32 key; each search pass counts (top-k) or sums the mass above (top-p) at ``num_pivots`` candidate
  thresholds at once, shrinking the key interval ~(num_pivots + 1)-fold per pass. The kept set is then
  ``key(z) >= threshold``, exactly the reference's tie rules (``reference/sampling.py``).

Randomness is word ``i & 3`` of ``tl.rand4x(seed, (pos << 32) | (stream << 30) | (i >> 2))`` for draw index
``i`` (docs/design.md §4, ``triton/gumbel.py``), identical to the reference Philox, so the tokens equal the
reference's for the same seeds (up to floating-point near-ties in sums, exp and log).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..reference.chain import ChainResult
from ..reference.philox import STREAM_BONUS, STREAM_RECOVERY
from . import gumbel
from .prologue import _request_sampling, _request_span

__all__ = ["ChainKernelConfig", "chain_config", "verify_chain"]

_FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)
# Order-preserving int32 keys (see _order_key) of -inf and of the largest finite float32.
_KEY_NEG_INF = tl.constexpr(-2139095041)
_KEY_FLOAT32_MAX = tl.constexpr(2139095039)
_STREAM_RECOVERY = tl.constexpr(STREAM_RECOVERY)
_STREAM_BONUS = tl.constexpr(STREAM_BONUS)


# ----------------------------------------------------------------------------------------------------
# Typed launch configuration
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChainKernelConfig:
    """Launch parameters of the chain kernel.

    block_v: vocabulary tile of the streaming passes (argmax, Gumbel-max, normalizer, residual).
    search_block_v: tile of the top-k / top-p threshold-search passes, which hold a
        [num_pivots, search_block_v] comparison tile, hence smaller.
    num_pivots: candidate thresholds evaluated per search pass (power of two).
    num_warps: warps per program.
    """

    block_v: int
    search_block_v: int
    num_pivots: int
    num_warps: int


# (largest vocabulary, logit element size in bytes) -> config; first matching row wins. 16-bit logits
# move half the bytes per element, so their streaming tiles are twice as wide.
_CONFIG_TABLE: tuple[tuple[int, int, ChainKernelConfig], ...] = (
    (8192, 4, ChainKernelConfig(block_v=1024, search_block_v=256, num_pivots=16, num_warps=4)),
    (8192, 2, ChainKernelConfig(block_v=2048, search_block_v=256, num_pivots=16, num_warps=4)),
    (1 << 30, 4, ChainKernelConfig(block_v=4096, search_block_v=512, num_pivots=16, num_warps=8)),
    (1 << 30, 2, ChainKernelConfig(block_v=8192, search_block_v=512, num_pivots=16, num_warps=8)),
)


def chain_config(vocab_size: int, dtype: torch.dtype) -> ChainKernelConfig:
    """The launch config for ``vocab_size`` and logit ``dtype``; tiles never exceed next_pow2(V)."""
    element_size = torch.empty((), dtype=dtype).element_size()
    for max_vocab, size, config in _CONFIG_TABLE:
        if vocab_size <= max_vocab and element_size == size:
            cap = max(16, triton.next_power_of_2(vocab_size))  # tiles hold whole 16-entry blocks
            return ChainKernelConfig(
                block_v=min(config.block_v, cap),
                search_block_v=min(config.search_block_v, cap),
                num_pivots=config.num_pivots,
                num_warps=config.num_warps,
            )
    raise ValueError(f"no chain kernel config for vocab size {vocab_size} and dtype {dtype}")


# ----------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _scaled_logits(row_ptr, offs, mask, temperature):
    """Sanitized float32 ``logits / temperature`` of one tile (padding lanes -inf)."""
    x = tl.load(row_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
    z = tl.math.div_rn(x, temperature)
    z = tl.where(z != z, float("-inf"), z)
    return tl.minimum(z, _FLOAT32_MAX)


@triton.jit
def _order_key(z):
    """int32 key with key(a) < key(b) iff a < b for non-NaN float32 (-0.0 and +0.0 share a key)."""
    z = tl.where(z == 0.0, 0.0, z)
    bits = z.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _key_value(key):
    """The float32 whose order key is ``key`` (the inverse of ``_order_key``; key 0 gives +0.0)."""
    bits = key.to(tl.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _store_threshold(threshold_ptr, row, key, WRITE_THRESHOLD: tl.constexpr):
    """With ``WRITE_THRESHOLD`` (the sampling mask asked for), store row ``row``'s kept-set threshold, the value
    of its truncation key ``key``; nothing otherwise."""
    if WRITE_THRESHOLD:
        tl.store(threshold_ptr + row, _key_value(key))


@triton.jit
def _truncated_logits(row_ptr, offs, mask, temperature, threshold):
    """Scaled logits of one tile with tokens below the top-k/top-p key ``threshold`` set to -inf."""
    z = _scaled_logits(row_ptr, offs, mask, temperature)
    return tl.where(_order_key(z).to(tl.int64) >= threshold, z, float("-inf"))


@triton.jit
def _argmax_update(best_val, best_idx, score, start):
    """Fold the tile starting at vocabulary index ``start`` into a running (max, index) pair.

    Ties keep the lowest index: within a tile by tie_break_left, across tiles by the strict comparison.
    """
    tile_val, tile_idx = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
    better = tile_val > best_val
    best_idx = tl.where(better, start + tile_idx.to(tl.int64), best_idx)
    best_val = tl.where(better, tile_val, best_val)
    return best_val, best_idx


@triton.jit
def _greedy_argmax(row_ptr, vocab_size, BLOCK_V: tl.constexpr):
    """Argmax of the sanitized logits (ties to the lowest index) and the row max (the greedy kept set's
    threshold)."""
    best_val = float("-inf")
    best_idx = tl.zeros((), tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        z = _scaled_logits(row_ptr, offs, mask, 1.0)
        best_val, best_idx = _argmax_update(best_val, best_idx, z, start)
    return best_idx, best_val


@triton.jit
def _gumbel_argmax(row_ptr, vocab_size, temperature, threshold, seed, offset_base, BLOCK_V: tl.constexpr):
    """A sample of softmax(z) over the truncated row by two-level Gumbel-max (no normalizer)."""
    best_val = float("-inf")
    best_block = tl.zeros((), tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        z = tl.where(mask, _truncated_logits(row_ptr, offs, mask, temperature, threshold), float("-inf"))
        scores = gumbel.block_scores(z, start, seed, offset_base, BLOCK_V)
        best_val, best_block = gumbel.best_block_update(best_val, best_block, scores, start, BLOCK_V)
    v = gumbel.block_entries(best_block)
    mask = v < vocab_size
    z = tl.where(mask, _truncated_logits(row_ptr, v, mask, temperature, threshold), float("-inf"))
    return gumbel.pick_in_block(best_block, z, seed, offset_base)


@triton.jit
def _softmax_stats(row_ptr, vocab_size, temperature, threshold, BLOCK_V: tl.constexpr):
    """Row max m and normalizer sum(exp(z - m)) of the truncated row, online over tiles."""
    m = float("-inf")
    total = 0.0
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        z = _truncated_logits(row_ptr, offs, mask, temperature, threshold)
        new_m = tl.maximum(m, tl.max(z, axis=0))
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        total = total * tl.exp(m - safe_m) + tl.sum(tl.exp(z - safe_m), axis=0)
        m = new_m
    return m, total


@triton.jit
def _top_k_threshold(row_ptr, vocab_size, temperature, top_k,
                     BLOCK_V: tl.constexpr, NUM_PIVOTS: tl.constexpr):
    """Key of the k-th largest scaled logit: the largest t with count(key >= t) >= k."""
    lo = tl.full((), _KEY_NEG_INF, tl.int64)  # count(key >= lo) = V >= k
    hi = tl.full((), _KEY_FLOAT32_MAX, tl.int64)
    step = tl.arange(0, NUM_PIVOTS).to(tl.int64) + 1
    while lo < hi:
        pivots = lo + (((hi - lo) * step + NUM_PIVOTS) // (NUM_PIVOTS + 1))  # in (lo, hi]
        counts = tl.zeros((NUM_PIVOTS,), tl.int64)
        for start in range(0, vocab_size, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
            mask = offs < vocab_size
            key = _order_key(_scaled_logits(row_ptr, offs, mask, temperature)).to(tl.int64)
            above = (key[None, :] >= pivots[:, None]) & mask[None, :]
            counts += tl.sum(above.to(tl.int64), axis=1)
        enough = counts >= top_k
        new_lo = tl.max(tl.where(enough, pivots, lo), axis=0)
        hi = tl.min(tl.where(enough, hi, pivots - 1), axis=0)
        lo = new_lo
    return lo


@triton.jit
def _top_p_threshold(row_ptr, vocab_size, temperature, threshold, top_p,
                     BLOCK_V: tl.constexpr, SEARCH_BLOCK_V: tl.constexpr, NUM_PIVOTS: tl.constexpr):
    """Smallest key t with sum_{z > t} exp(z - m) < top_p * sum exp(z - m) over the top-k-kept row."""
    m, total = _softmax_stats(row_ptr, vocab_size, temperature, threshold, BLOCK_V)
    budget = top_p * total
    lo = threshold  # f(t) = total >= budget below the smallest kept value, so the answer is >= threshold
    hi = tl.full((), _KEY_FLOAT32_MAX, tl.int64)  # f(hi) = 0 < budget
    if m == float("-inf"):  # nothing kept: leave the row empty, like the reference
        lo = hi
    step = tl.arange(0, NUM_PIVOTS).to(tl.int64) + 1
    while lo < hi:
        pivots = lo + (hi - lo) * step // (NUM_PIVOTS + 1)  # in [lo, hi)
        mass = tl.zeros((NUM_PIVOTS,), tl.float32)
        for start in range(0, vocab_size, SEARCH_BLOCK_V):
            offs = start + tl.arange(0, SEARCH_BLOCK_V).to(tl.int64)
            mask = offs < vocab_size
            z = _truncated_logits(row_ptr, offs, mask, temperature, threshold)
            key = _order_key(z).to(tl.int64)
            weight = tl.exp(z - m)
            mass += tl.sum(tl.where(key[None, :] > pivots[:, None], weight[None, :], 0.0), axis=1)
        small = mass < budget
        new_hi = tl.min(tl.where(small, pivots, hi), axis=0)
        lo = tl.max(tl.where(small, lo, pivots + 1), axis=0)
        hi = new_hi
    return lo


@triton.jit
def _target_prob(row_ptr, token, temperature, threshold, m, total):
    """p(token) of the truncated target given its max and normalizer (one-hot on 0 for an empty row)."""
    z = _scaled_logits(row_ptr, token, token >= 0, temperature)
    z = tl.where(_order_key(z).to(tl.int64) >= threshold, z, float("-inf"))
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    p = tl.math.div_rn(tl.exp(z - safe_m), total)
    return tl.where(m == float("-inf"), tl.where(token == 0, 1.0, 0.0), p)


@triton.jit
def _residual_probs(row_ptr, q_row_ptr, offs, mask, temperature, threshold, m, total):
    """Target p and residual max(0, p - q) of a tile (p one-hot on 0 for an empty row)."""
    empty_row = m == float("-inf")
    safe_m = tl.where(empty_row, 0.0, m)
    z = _truncated_logits(row_ptr, offs, mask, temperature, threshold)
    p = tl.math.div_rn(tl.exp(z - safe_m), total)
    p = tl.where(empty_row, tl.where(offs == 0, 1.0, 0.0), p)
    q = tl.load(q_row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.where(mask, tl.maximum(p - q, 0.0), 0.0)
    return tl.where(mask, z, float("-inf")), r


@triton.jit
def _residual_sample(row_ptr, q_row_ptr, vocab_size, temperature, threshold, m, total, seed, offset_base,
                     BLOCK_V: tl.constexpr):
    """Sample norm(max(0, p - q)) by two-level Gumbel-max, or p itself when the residual is empty (one pass
    for both, then the winning block's 16 entries)."""
    best_r = float("-inf")
    block_r = tl.zeros((), tl.int64)
    best_z = float("-inf")
    block_z = tl.zeros((), tl.int64)
    max_r = 0.0
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V).to(tl.int64)
        mask = offs < vocab_size
        z, r = _residual_probs(row_ptr, q_row_ptr, offs, mask, temperature, threshold, m, total)
        max_r = tl.maximum(max_r, tl.max(r, axis=0))
        scores_r = gumbel.weight_block_scores(r, start, seed, offset_base, BLOCK_V)
        scores_z = gumbel.block_scores(z, start, seed, offset_base, BLOCK_V)
        best_r, block_r = gumbel.best_block_update(best_r, block_r, scores_r, start, BLOCK_V)
        best_z, block_z = gumbel.best_block_update(best_z, block_z, scores_z, start, BLOCK_V)
    use_r = max_r > 0.0
    block = tl.where(use_r, block_r, block_z)
    v = gumbel.block_entries(block)
    mask = v < vocab_size
    z, r = _residual_probs(row_ptr, q_row_ptr, v, mask, temperature, threshold, m, total)
    return gumbel.pick_in_block(block, tl.where(use_r, tl.log(r), z), seed, offset_base)


# ----------------------------------------------------------------------------------------------------
# The kernel: one program per request
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _verify_chain_kernel(
    logits_ptr, draft_ids_ptr, cu_ptr, draft_probs_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, position_ptr,
    out_ptr, num_accepted_ptr, threshold_ptr,
    vocab_size, out_width, total_drafts,
    HAS_DRAFT_PROBS: tl.constexpr, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, WRITE_THRESHOLD: tl.constexpr,
    BLOCK_V: tl.constexpr, SEARCH_BLOCK_V: tl.constexpr, NUM_PIVOTS: tl.constexpr,
):
    b = tl.program_id(0)
    draft_start, draft_end = _request_span(cu_ptr, b, total_drafts)
    num_drafts = tl.minimum(draft_end - draft_start, out_width - 1)  # and the output row
    first_row = draft_start + b
    temperature, greedy, seed, position, use_top_k, top_k, use_top_p, top_p = _request_sampling(
        b, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, position_ptr, vocab_size, HAS_TOP_K, HAS_TOP_P)

    accepted = tl.zeros((), tl.int32)
    running = tl.full((), 1, tl.int1)
    for j in range(0, num_drafts + 1):
        if running:
            row_ptr = logits_ptr + (first_row + j) * vocab_size
            is_bonus = j == num_drafts
            draft = tl.load(draft_ids_ptr + draft_start + j, mask=~is_bonus, other=-1)
            valid = (~is_bonus) & (draft >= 0) & (draft < vocab_size)
            pos = position + j
            accept = tl.full((), 0, tl.int1)
            token = tl.zeros((), tl.int64)
            if greedy:
                token, row_max = _greedy_argmax(row_ptr, vocab_size, BLOCK_V)
                accept = valid & (token == draft)
                if WRITE_THRESHOLD:
                    tl.store(threshold_ptr + first_row + j, row_max)
            else:
                threshold = tl.full((), _KEY_NEG_INF, tl.int64)
                if use_top_k:
                    threshold = _top_k_threshold(row_ptr, vocab_size, temperature, top_k,
                                                 SEARCH_BLOCK_V, NUM_PIVOTS)
                if use_top_p:
                    threshold = _top_p_threshold(row_ptr, vocab_size, temperature, threshold, top_p,
                                                 BLOCK_V, SEARCH_BLOCK_V, NUM_PIVOTS)
                _store_threshold(threshold_ptr, first_row + j, threshold, WRITE_THRESHOLD)
                stream = tl.where(is_bonus, _STREAM_BONUS, _STREAM_RECOVERY).to(tl.int64)
                noise_base = (pos << 32) | (stream << 30)
                if HAS_DRAFT_PROBS:
                    if is_bonus:
                        token = _gumbel_argmax(row_ptr, vocab_size, temperature, threshold, seed,
                                               noise_base, BLOCK_V)
                    else:
                        m, total = _softmax_stats(row_ptr, vocab_size, temperature, threshold, BLOCK_V)
                        q_row_ptr = draft_probs_ptr + (draft_start + j) * vocab_size
                        safe_draft = tl.where(valid, draft, 0)
                        p_x = _target_prob(row_ptr, safe_draft, temperature, threshold, m, total)
                        q_x = tl.load(q_row_ptr + safe_draft).to(tl.float32)
                        coin = gumbel.uniform(seed, pos << 32, tl.zeros((), tl.int64))
                        accept = valid & (coin * q_x < p_x)
                        if not accept:
                            token = _residual_sample(row_ptr, q_row_ptr, vocab_size, temperature, threshold,
                                                     m, total, seed, noise_base, BLOCK_V)
                else:
                    token = _gumbel_argmax(row_ptr, vocab_size, temperature, threshold, seed,
                                           noise_base, BLOCK_V)
                    accept = valid & (token == draft)
            out = tl.where(accept, draft, token).to(tl.int32)
            tl.store(out_ptr + b * out_width + j, out)
            accepted += accept.to(tl.int32)
            running = accept
    tl.store(num_accepted_ptr + b, accepted)


# ----------------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------------

def verify_chain(
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
    """Triton chain verification on validated, normalised inputs (see ``specdec_kernels.verify_chain``).

    Shapes as the reference: logits [T + B, V]; draft ids [T] int64; cu [B + 1] int64; draft_probs
    [T, V] or None; temperature, top_p float32 [B]; top_k int32 [B]; seed, position int64 [B].
    Returns int32 tokens [B, max_draft_len + 1] (-1 padded) and int32 accepted counts [B]. No host syncs.
    ``row_threshold`` [T + B] float32 or None: receives, for every row the kernel decides, the threshold of
    its kept set (``reference.sampling.kept_threshold``), from the keys the pass searches anyway.
    """
    num_reqs = cu_num_draft_tokens.numel() - 1
    vocab_size = target_logits.shape[1]
    device = target_logits.device
    out = torch.full((num_reqs, max_draft_len + 1), -1, dtype=torch.int32, device=device)
    num_accepted = torch.zeros(num_reqs, dtype=torch.int32, device=device)
    if num_reqs == 0:
        return ChainResult(out, num_accepted)
    config = chain_config(vocab_size, target_logits.dtype)
    # Absent optional tensors are never read (constexpr flags); any valid pointer stands in.
    _verify_chain_kernel[(num_reqs,)](
        target_logits, draft_token_ids, cu_num_draft_tokens,
        target_logits if draft_probs is None else draft_probs,
        temperature, temperature if top_k is None else top_k, temperature if top_p is None else top_p,
        seed, position, out, num_accepted, temperature if row_threshold is None else row_threshold,
        vocab_size, max_draft_len + 1, draft_token_ids.numel(),
        HAS_DRAFT_PROBS=draft_probs is not None, HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
        WRITE_THRESHOLD=row_threshold is not None,
        BLOCK_V=config.block_v, SEARCH_BLOCK_V=config.search_block_v, NUM_PIVOTS=config.num_pivots,
        num_warps=config.num_warps,
    )
    return ChainResult(out, num_accepted)
