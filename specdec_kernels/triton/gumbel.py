"""Triton device helpers of two-level Gumbel-max (``reference/gumbel.py``) and the Philox draws (docs/design.md §4).

A kernel streams a row over tiles of ``BLOCK_V`` entries (a multiple of 16, starting at multiples of it):
:func:`block_scores` / :func:`weight_block_scores` give the tile's level-1 scores ``L_b - log(-log u_b)``,
a running argmax keeps the best block, and the caller then scores the winning block's 16 entries with
:func:`entry_noise` (level 2). The uniforms are :func:`uniform`: word ``i & 3`` of ``tl.rand4x(seed,
offset_base | (i >> 2))``, ``offset_base = (position << 32) | (stream << 30)``, bit-identical to
``reference/philox.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..reference.gumbel import BLOCK as _BLOCK
from ..reference.philox import BLOCK_DRAWS as _BLOCK_DRAWS

BLOCK = tl.constexpr(_BLOCK)
BLOCK_DRAWS = tl.constexpr(_BLOCK_DRAWS)


@triton.jit
def uniform(seed, offset_base, index):
    """Float32 uniform of draw ``index`` (int64) on the counter family ``offset_base``."""
    u0, u1, u2, u3 = tl.rand4x(seed, offset_base | (index >> 2))
    word = index & 3
    return tl.where(word == 0, u0, tl.where(word == 1, u1, tl.where(word == 2, u2, u3)))


@triton.jit
def entry_noise(seed, offset_base, v):
    """``log(-log u_v)`` of vocabulary entries ``v``: an entry's level-2 score is ``z_v - entry_noise``."""
    return tl.log(-tl.log(uniform(seed, offset_base, v)))


@triton.jit
def _block_noise(seed, offset_base, start, BLOCK_V: tl.constexpr):
    block = start // BLOCK + tl.arange(0, BLOCK_V // BLOCK).to(tl.int64)
    return tl.log(-tl.log(uniform(seed, offset_base, BLOCK_DRAWS + block)))


@triton.jit
def block_scores(z, start, seed, offset_base, BLOCK_V: tl.constexpr):
    """[BLOCK_V // 16] level-1 scores of the blocks of a tile of log-weights ``z`` (logsumexp per block)."""
    zb = tl.reshape(z, (BLOCK_V // BLOCK, BLOCK))
    m = tl.max(zb, axis=1)
    safe = tl.where(m == float("-inf"), 0.0, m)
    mass = tl.where(m == float("-inf"), float("-inf"), m + tl.log(tl.sum(tl.exp(zb - safe[:, None]), axis=1)))
    return mass - _block_noise(seed, offset_base, start, BLOCK_V)


@triton.jit
def weight_block_scores(w, start, seed, offset_base, BLOCK_V: tl.constexpr):
    """[BLOCK_V // 16] level-1 scores of the blocks of a tile of nonnegative weights ``w`` (log of the sum)."""
    mass = tl.log(tl.sum(tl.reshape(w, (BLOCK_V // BLOCK, BLOCK)), axis=1))
    return mass - _block_noise(seed, offset_base, start, BLOCK_V)


@triton.jit
def best_block_update(best_val, best_block, scores, start, BLOCK_V: tl.constexpr):
    """Fold a tile's block scores into the running (score, block), ties to the lowest block."""
    tile_val, tile_idx = tl.max(scores, axis=0, return_indices=True, return_indices_tie_break_left=True)
    better = tile_val > best_val
    best_block = tl.where(better, start // BLOCK + tile_idx.to(tl.int64), best_block)
    best_val = tl.where(better, tile_val, best_val)
    return best_val, best_block


@triton.jit
def block_entries(block):
    """The 16 vocabulary indices of ``block`` (int64)."""
    return block * BLOCK + tl.arange(0, BLOCK).to(tl.int64)


@triton.jit
def pick_in_block(block, log_weights, seed, offset_base):
    """Level 2: argmax of ``log_weights - entry_noise`` over the block's 16 entries (ties to the lowest)."""
    v = block_entries(block)
    score = log_weights - entry_noise(seed, offset_base, v)
    _, idx = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
    return block * BLOCK + idx.to(tl.int64)


__all__ = [
    "BLOCK", "BLOCK_DRAWS", "uniform", "entry_noise", "block_scores", "weight_block_scores", "best_block_update",
    "block_entries", "pick_in_block",
]
