"""Two-level Gumbel-max: how every backend samples a row (docs/design.md §2, §4).

A sample ``y ~ norm(exp(z))`` of a row of log-weights ``z`` [V] (scaled, truncated logits; or the log of
nonnegative weights such as a residual ``max(0, p - q)``; -inf = excluded) is drawn in two levels over
fixed vocabulary blocks of :data:`BLOCK` = 16 consecutive entries (block ``b`` holds ``16 b ... 16 b + 15``,
the last one possibly shorter):

1. every block gets its log-mass ``L_b = logsumexp(z_v, v in b)`` and one uniform
   ``u_b = uniform(seed, position, stream, BLOCK_DRAWS + b)``; the block is ``b* = argmax_b L_b - log(-log u_b)``;
2. within ``b*``, ``y = argmax_{v in b*} z_v - log(-log u_v)`` with ``u_v = uniform(seed, position, stream, v)``.

Ties go to the lowest index at both levels (so an all -inf row samples token 0). Why this is exact: the
maximum of a block's Gumbel-perturbed entries is itself Gumbel with location ``L_b`` and independent of
which entry attains it, so level 1 picks block b with probability ``exp(L_b) / sum exp(L)``, and level 2
picks v within it with probability ``exp(z_v - L_b)``; the product is ``softmax(z)_v``.

Why two levels: a kernel needs only each block's maximum and one Philox word per block to rule a block
out (its score is at most ``max z + log 16 - log(1 - u_b)``), so a row costs one pass at memory speed;
the exact ``L_b`` (16 exps) is computed only for the blocks that can still win. One-level Gumbel-max needs
a Philox word for almost every entry of a flat row, which is compute-bound on a CPU.

Backends agree token for token with this reference up to floating-point near-ties (``L_b`` is a sum of
exps, rounded differently by each backend's exp and summation order).
"""

from __future__ import annotations

import torch

from . import philox

BLOCK = 16


def num_blocks(vocab_size: int) -> int:
    """Number of vocabulary blocks of a row of ``vocab_size`` entries."""
    return (vocab_size + BLOCK - 1) // BLOCK


def blocked(log_weights: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R, num_blocks, BLOCK], the last block padded with -inf."""
    rows, vocab_size = log_weights.shape
    pad = num_blocks(vocab_size) * BLOCK - vocab_size
    padded = torch.nn.functional.pad(log_weights, (0, pad), value=float("-inf"))
    return padded.view(rows, num_blocks(vocab_size), BLOCK)


def block_log_mass(log_weights: torch.Tensor) -> torch.Tensor:
    """[R, num_blocks] ``L_b = logsumexp`` of each block's log-weights (-inf for an empty block)."""
    return torch.logsumexp(blocked(log_weights), dim=-1)


def gumbel_noise(u: torch.Tensor) -> torch.Tensor:
    """``log(-log u)``: a score is ``log_weight - gumbel_noise(u)``."""
    return torch.log(-torch.log(u))


def sample(
    log_weights: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, stream: torch.Tensor | int
) -> torch.Tensor:
    """[R] int64 two-level Gumbel-max samples of the rows of ``log_weights`` [R, V] float32.

    ``seed``, ``position`` [R] int64 and ``stream`` (an int or [R]) key each row's uniforms.
    """
    rows = log_weights.shape[0]
    device = log_weights.device
    stream = torch.as_tensor(stream, dtype=torch.int64, device=device).expand(rows)
    blocks = blocked(log_weights)
    block_ids = torch.arange(blocks.shape[1], device=device)
    u_block = philox.uniform(seed[:, None], position[:, None], stream[:, None], philox.BLOCK_DRAWS + block_ids)
    chosen = torch.argmax(torch.logsumexp(blocks, dim=-1) - gumbel_noise(u_block), dim=-1)
    entries = blocks.gather(1, chosen[:, None, None].expand(rows, 1, BLOCK)).squeeze(1)
    v = chosen[:, None] * BLOCK + torch.arange(BLOCK, device=device)
    u_entry = philox.uniform(seed[:, None], position[:, None], stream[:, None], v)
    return chosen * BLOCK + torch.argmax(entries - gumbel_noise(u_entry), dim=-1)
