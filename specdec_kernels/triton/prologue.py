"""The prologue every per-request Triton kernel shares (chain, block, tree, traversal): the request's span of
drafts or nodes, and its sampling parameters."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _request_span(cu_ptr, b, total):
    """Request ``b``'s entries ``[first, end)`` of an array of ``total`` (drafts or tree nodes), its cu entries
    clamped into the array, since cu is unchecked under validate=False (``reference.chain.chain_spans``,
    ``reference.tree.tree_spans``): the identity on a valid cu."""
    first = tl.minimum(tl.maximum(tl.load(cu_ptr + b), 0), total)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + b + 1), first), total)
    return first, end


@triton.jit
def _request_sampling(b, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, position_ptr, vocab_size,
                      HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr):
    """Request ``b``'s sampling parameters, as every verification kernel reads them: (temperature with
    greedy requests at 1.0, greedy, seed, position, use_top_k, top_k, use_top_p, top_p)."""
    temperature = tl.load(temperature_ptr + b)
    greedy = temperature == 0.0
    temperature = tl.where(greedy, 1.0, temperature)
    seed = tl.load(seed_ptr + b)
    position = tl.load(position_ptr + b)
    use_top_k = False
    top_k = tl.zeros((), tl.int64)
    if HAS_TOP_K:
        top_k = tl.load(top_k_ptr + b).to(tl.int64)
        use_top_k = (top_k > 0) & (top_k < vocab_size)
    use_top_p = False
    top_p = 1.0
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + b)
        use_top_p = top_p < 1.0
    return temperature, greedy, seed, position, use_top_k, top_k, use_top_p, top_p
