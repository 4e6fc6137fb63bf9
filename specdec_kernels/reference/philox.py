"""Philox4x32-10 in torch integer arithmetic, bit-identical to Triton's ``tl.rand4x`` / ``tl.rand``.

Every verification backend draws its randomness from this one stateless generator (docs/design.md §4)::

    u = uniform(seed, position, stream, i)
      = word (i & 3) of rand4x(seed, offset),   offset = (position << 32) | (stream << 30) | (i >> 2)

``seed`` is a request's 64-bit key, ``position`` the absolute position of the token being decided,
``stream`` one of :data:`STREAM_COIN`, :data:`STREAM_RECOVERY`, :data:`STREAM_BONUS` (the verifiers) or
:data:`STREAM_DRAFT` (the drafters), and ``i`` the draw index: the vocabulary index ``v`` for a vocabulary
entry's noise, :data:`BLOCK_DRAWS` + ``b`` for the noise of vocabulary block ``b``
(``reference/gumbel.py``), the sibling slot for coins (0 in chains). One Philox call (counter (offset_lo,
offset_hi, 0, 0), key (seed_lo, seed_hi)) yields four 32-bit words, each mapped to a 31-bit uniform in [0,
1) exactly as Triton maps it, so four consecutive draw indices share one call.

Block and traversal verification's sequence-level coins (:func:`sequence_coins`) draw on stream 0 with
bit 31 of the position set (:data:`SEQUENCE_COIN_FLAG`); the drafters' sampling noise is stream 3
(``drafters/base.py``), one draw per vocabulary index. :func:`rand` / :func:`randint` (the first word
alone) are Triton's ``tl.rand`` / ``tl.randint``.

All arithmetic is done on int64 tensors holding uint32 values, so the functions run on any device
and never leave it (no host syncs).
"""

from __future__ import annotations

import torch

STREAM_COIN = 0
STREAM_RECOVERY = 1
STREAM_BONUS = 2
STREAM_DRAFT = 3
"""Philox stream used for sampling draft tokens (streams 0-2 belong to the verifiers)."""

MAX_POSITION = (1 << 31) - 1
MAX_VOCAB = 1 << 30
# Draw index of vocabulary block 0 (block b draws BLOCK_DRAWS + b): above every vocabulary index, and
# (BLOCK_DRAWS + b) >> 2 stays below bit 30, the stream bits.
BLOCK_DRAWS = MAX_VOCAB
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


def randint4x(
    seed: torch.Tensor, offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four Philox words as uint32 (in int64), as Triton's ``tl.randint4x(seed, offset)``.

    ``seed`` and ``offset`` are int64 tensors that broadcast against each other.
    """
    seed = seed.to(torch.int64)
    offset = offset.to(torch.int64)
    k0 = seed & _MASK32
    k1 = (seed >> 32) & _MASK32
    c0 = offset & _MASK32
    c1 = (offset >> 32) & _MASK32
    c0, c1 = torch.broadcast_tensors(c0, c1)
    zero = torch.zeros_like(c0)
    return philox4x32(c0, c1, zero, zero, k0, k1)


def randint(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """First Philox word as uint32 (in int64), as Triton's ``tl.randint(seed, offset)`` with int64 offsets."""
    return randint4x(seed, offset)[0]


def uint32_to_uniform(x: torch.Tensor) -> torch.Tensor:
    """Map uint32 words (in int64) to float32 in [0, 1) exactly as Triton's ``uint_to_uniform_float``."""
    # Triton bitcasts to int32 and folds negatives with bitwise not: x >= 2**31 becomes 2**32 - 1 - x.
    folded = torch.where(x >= (1 << 31), _MASK32 - x, x)
    scale = torch.tensor(UNIFORM_SCALE, dtype=torch.float32, device=x.device)
    return folded.to(torch.float32) * scale


def rand(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Uniform float32 in [0, 1), bit-identical to Triton's ``tl.rand(seed, offset)``."""
    return uint32_to_uniform(randint(seed, offset))


def rand4x(
    seed: torch.Tensor, offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four uniform float32 in [0, 1), bit-identical to Triton's ``tl.rand4x(seed, offset)``."""
    w0, w1, w2, w3 = randint4x(seed, offset)
    return uint32_to_uniform(w0), uint32_to_uniform(w1), uint32_to_uniform(w2), uint32_to_uniform(w3)


def draw_offset(position: torch.Tensor, stream: torch.Tensor | int, index: torch.Tensor | int) -> torch.Tensor:
    """``(position << 32) | (stream << 30) | (index >> 2)``: the Philox counter of draw ``index`` (broadcasting)."""
    index = torch.as_tensor(index, dtype=torch.int64, device=position.device)
    stream = torch.as_tensor(stream, dtype=torch.int64, device=position.device)
    return (position.to(torch.int64) << 32) | (stream << 30) | (index >> 2)


def uniform(
    seed: torch.Tensor, position: torch.Tensor, stream: torch.Tensor | int, index: torch.Tensor | int
) -> torch.Tensor:
    """Float32 uniform of draw ``index`` on (seed, position, stream): word ``index & 3`` of one Philox call.

    All arguments broadcast against each other; ``index`` in [0, 2^32).
    """
    index = torch.as_tensor(index, dtype=torch.int64, device=position.device)
    words = torch.stack(randint4x(seed, draw_offset(position, stream, index)), dim=-1)
    word = words.gather(-1, torch.broadcast_to(index & 3, words.shape[:-1])[..., None]).squeeze(-1)
    return uint32_to_uniform(word)


def uniform_rows(seed: torch.Tensor, position: torch.Tensor, stream: int, vocab_size: int) -> torch.Tensor:
    """[R, V] float32 uniforms ``uniform(seed, position, stream, v)``, v < V, for per-row ``seed`` and
    ``position`` [R]: every vocabulary entry's noise on one stream (the drafters' stream 3)."""
    if not 0 <= stream < 4:
        raise ValueError(f"stream must be in [0, 4), got {stream}")
    calls = torch.arange((vocab_size + 3) // 4, device=position.device, dtype=torch.int64)
    words = randint4x(seed[:, None], draw_offset(position[:, None], stream, calls[None, :] << 2))
    return uint32_to_uniform(torch.stack(words, dim=-1).flatten(1)[:, :vocab_size])


def coins(seed: torch.Tensor, position: torch.Tensor, slot: torch.Tensor | int = 0) -> torch.Tensor:
    """[R] float32 acceptance coins: stream 0, draw index = the sibling slot (0 in chains)."""
    return uniform(seed, position, STREAM_COIN, slot)


def sequence_coins(seed: torch.Tensor, position: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """float32 coins of block and traversal verification: ``uniform(seed, position | 2**31, 0, index)``.

    ``position`` is the request's (the verification round's first position) and ``index`` the tested
    node (chain: prefix length). Per-position streams cannot serve here: these methods test nodes deeper
    than what they accept, and the next round starts right after the accepted tokens, so a coin keyed by
    the node's own position would be drawn again, already conditioned, by the next round. Keying by the
    round's start instead gives every round fresh coins (round starts strictly increase).
    """
    return uniform(seed, position | SEQUENCE_COIN_FLAG, STREAM_COIN, index)
