"""Philox4x32-10 in torch integer arithmetic, bit-identical to Triton's ``tl.rand(seed, offset)``.

Every backend draws its randomness from this one stateless generator (DESIGN.md §4)::

    u = rand(seed, offset),   offset = (position << 32) | (stream << 30) | v

``seed`` is a request's 64-bit key, ``position`` the absolute position of the token being decided,
``stream`` one of :data:`STREAM_COIN`, :data:`STREAM_RECOVERY`, :data:`STREAM_BONUS`, and ``v`` the
vocabulary index (0 for coins). The counter is (offset_lo, offset_hi, 0, 0), the key (seed_lo, seed_hi),
the output the first Philox word mapped to a 31-bit uniform in [0, 1) exactly as Triton maps it.

All arithmetic is done on int64 tensors holding uint32 values, so the functions run on any device
and never leave it (no host syncs).
"""

from __future__ import annotations

import torch

STREAM_COIN = 0
STREAM_RECOVERY = 1
STREAM_BONUS = 2

MAX_POSITION = (1 << 31) - 1
MAX_VOCAB = 1 << 30
SEQUENCE_COIN_FLAG = 1 << 31
"""Set in the position field of sequence-level coins (block / traversal verification): no real position
reaches it, so these coins never share a counter with any per-position draw (below)."""

_MASK32 = 0xFFFFFFFF
_ROUND_A = 0xD2511F53
_ROUND_B = 0xCD9E8D57
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
# Triton's uint_to_uniform_float scale for 32-bit words: the largest value with (2**31 - 1) * scale < 1.
UNIFORM_SCALE = 4.6566127342e-10
N_ROUNDS = 10


def _mulhilo32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` for a uint32 constant ``a`` and uint32 values ``b``.

    The full product needs 64 unsigned bits, which int64 cannot hold, so ``b`` is split in 16-bit halves.
    """
    b_hi = b >> 16
    b_lo = b & 0xFFFF
    p_hi = a * b_hi  # < 2**48
    p_lo = a * b_lo  # < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (p_lo + ((p_hi & 0xFFFF) << 16)) & _MASK32
    return hi, lo


def philox4x32(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
    k0: torch.Tensor, k1: torch.Tensor, n_rounds: int = N_ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32 rounds on int64 tensors holding uint32 values (broadcasting), as Triton's philox_impl."""
    for _ in range(n_rounds):
        hi_b, lo_b = _mulhilo32(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo32(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def randint(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """First Philox word as uint32 (in int64), as Triton's ``tl.randint(seed, offset)`` with int64 offsets.

    ``seed`` and ``offset`` are int64 tensors that broadcast against each other.
    """
    seed = seed.to(torch.int64)
    offset = offset.to(torch.int64)
    k0 = seed & _MASK32
    k1 = (seed >> 32) & _MASK32
    c0 = offset & _MASK32
    c1 = (offset >> 32) & _MASK32
    zero = torch.zeros_like(c0)
    out, _, _, _ = philox4x32(c0, c1, zero, zero, k0, k1)
    return out


def uint32_to_uniform(x: torch.Tensor) -> torch.Tensor:
    """Map uint32 words (in int64) to float32 in [0, 1) exactly as Triton's ``uint_to_uniform_float``."""
    # Triton bitcasts to int32 and folds negatives with bitwise not: x >= 2**31 becomes 2**32 - 1 - x.
    folded = torch.where(x >= (1 << 31), _MASK32 - x, x)
    scale = torch.tensor(UNIFORM_SCALE, dtype=torch.float32, device=x.device)
    return folded.to(torch.float32) * scale


def rand(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Uniform float32 in [0, 1), bit-identical to Triton's ``tl.rand(seed, offset)``."""
    return uint32_to_uniform(randint(seed, offset))


def make_offset(position: torch.Tensor, stream: int, vocab_index: torch.Tensor | int = 0) -> torch.Tensor:
    """``(position << 32) | (stream << 30) | vocab_index`` as int64 (DESIGN.md §4), broadcasting."""
    if not 0 <= stream < 4:
        raise ValueError(f"stream must be in [0, 4), got {stream}")
    return (position.to(torch.int64) << 32) | (stream << 30) | vocab_index


def uniform_rows(seed: torch.Tensor, position: torch.Tensor, stream: int, vocab_size: int) -> torch.Tensor:
    """[R, V] float32 uniforms for rows with per-row ``seed`` [R] and ``position`` [R] on one stream."""
    v = torch.arange(vocab_size, device=position.device, dtype=torch.int64)
    offset = make_offset(position[:, None], stream, v[None, :])
    return rand(seed[:, None], offset)


def coins(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """[R] float32 acceptance coins (stream 0, vocabulary index 0)."""
    return rand(seed, make_offset(position, STREAM_COIN))


def sequence_coins(seed: torch.Tensor, position: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """float32 coins of block and traversal verification: ``rand(seed, ((position | 2**31) << 32) | index)``.

    ``position`` is the request's (the verification round's first position) and ``index`` the tested
    node (chain: prefix length). Per-position streams cannot serve here: these methods test nodes deeper
    than what they accept, and the next round starts right after the accepted tokens, so a coin keyed by
    the node's own position would be drawn again, already conditioned, by the next round. Keying by the
    round's start instead gives every round fresh coins (round starts strictly increase).
    """
    return rand(seed, make_offset(position | SEQUENCE_COIN_FLAG, STREAM_COIN, index))
