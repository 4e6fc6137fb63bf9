"""Temperature, min-p, top-k and top-p as transforms of a target distribution (the spec every backend follows).

All transforms act on *scaled logits* ``z = sanitize(logits.float() / temperature)`` per row:

- ``sanitize``: NaN becomes -inf (never sampled) and +inf becomes the largest finite float32, so that
  ``z - max(z)`` is never NaN. A row that is entirely -inf samples token 0.
- top-k keeps token v iff fewer than k tokens have a strictly larger z: ties at the k-th value are all
  kept, so the kept set can exceed k. ``top_k <= 0`` or ``top_k >= V`` disables it.
- top-p (applied after top-k, on the top-k-renormalised distribution) keeps token v iff the probability
  mass of tokens with strictly larger z is below ``top_p``. Tied tokens are kept or dropped together, the
  most likely token is always kept, and ``top_p = 1`` disables it.

Both rules depend only on the multiset of values, never on the order of indices, so every backend can
implement them with a threshold search instead of a full sort. Dropped tokens get z = -inf.

min-p (``min_p_logits``, vLLM's order: after temperature, before top-k and top-p) drops token v iff its
tempered probability ``softmax(z)_v`` is below ``min_p`` times the row's largest; it never drops the most
likely token, and ``min_p = 0`` or a greedy row leaves the row as it is. ``verify_chain`` / ``verify_tree``
apply it once to the logits, before any backend runs, so every backend and the sampling mask see the rows
it leaves.
"""

from __future__ import annotations

import torch

FLOAT32_MAX = torch.finfo(torch.float32).max
NEG_INF = float("-inf")


def sanitize(z: torch.Tensor) -> torch.Tensor:
    """NaN -> -inf, +inf -> float32 max (float32 in, float32 out)."""
    z = torch.where(torch.isnan(z), torch.full_like(z, NEG_INF), z)
    return torch.clamp(z, max=FLOAT32_MAX)


def scale_logits(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """[R, V] scaled, sanitized float32 logits ``z = logits / temperature`` (temperature [R] > 0)."""
    return sanitize(logits.float() / temperature.float()[:, None])


def greedy_logits(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] sanitized float32 logits for greedy rows (argmax with ties to the lowest index)."""
    return sanitize(logits.float())


def top_k_threshold(z: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[R] smallest value top-k keeps (the k-th largest z), -inf where ``top_k`` [R] disables it (<= 0 or >= V)."""
    vocab_size = z.shape[-1]
    sorted_desc = torch.sort(z, dim=-1, descending=True).values
    k = top_k.to(torch.int64)
    enabled = (k > 0) & (k < vocab_size)
    kth = sorted_desc.gather(-1, (k.clamp(1, vocab_size) - 1)[:, None])[:, 0]
    return torch.where(enabled, kth, NEG_INF)


def top_k_mask(z: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[R, V] bool: token kept by top-k. ``top_k`` [R] int; <= 0 or >= V disables it for that row."""
    return z >= top_k_threshold(z, top_k)[:, None]


def top_p_threshold(z: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[R] smallest value top-p keeps over softmax(z) (z already top-k masked), -inf where ``top_p`` >= 1
    disables it, +inf for a row that is all -inf.

    Keeps v iff mass(z_u > z_v) < top_p * mass(all); computed on unnormalised exp(z - max z).
    """
    sorted_desc = torch.sort(z, dim=-1, descending=True).values
    weights = torch.exp(sorted_desc - sorted_desc[:, :1])
    cum = torch.cumsum(weights, dim=-1)
    total = cum[:, -1:]
    exclusive = cum - weights
    # For tied values use the exclusive sum at the first element of the tie group (mass strictly above).
    neg = (-sorted_desc).contiguous()
    group_start = torch.searchsorted(neg, neg, right=False)
    mass_above = exclusive.gather(-1, group_start)
    keep_sorted = mass_above < top_p.float()[:, None] * total
    threshold = torch.where(keep_sorted, sorted_desc, torch.full_like(sorted_desc, float("inf")))
    return torch.where(top_p >= 1.0, NEG_INF, threshold.min(dim=-1).values)


def top_p_mask(z: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[R, V] bool: token kept by top-p over the distribution softmax(z) (z already top-k masked)."""
    return z >= top_p_threshold(z, top_p)[:, None]


def truncate(z: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Apply top-k then top-p to scaled logits; dropped tokens become -inf."""
    return truncate_with_threshold(z, top_k, top_p)[0]


def truncate_with_threshold(
    z: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``truncate``, and [R] the threshold it truncated with: the row keeps exactly its finite z >= threshold
    (-inf when neither rule truncates the row; +inf when top-p met a row that is all -inf)."""
    threshold = torch.full(z.shape[:1], NEG_INF, dtype=torch.float32, device=z.device)
    if top_k is not None:
        threshold = top_k_threshold(z, top_k)
        z = torch.where(z >= threshold[:, None], z, torch.full_like(z, NEG_INF))
    if top_p is not None:
        # Top-p's threshold is a value the top-k-masked row keeps (so >= top-k's), or -inf when off.
        threshold = torch.maximum(threshold, top_p_threshold(z, top_p))
        z = torch.where(z >= threshold[:, None], z, torch.full_like(z, NEG_INF))
    return z, threshold


def target_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """[R, V] float32 scaled and truncated logits whose softmax is the target distribution."""
    return truncate(scale_logits(logits, temperature), top_k, top_p)


def target_logits_with_threshold(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``target_logits`` and [R] the threshold it truncated with (``truncate_with_threshold``)."""
    return truncate_with_threshold(scale_logits(logits, temperature), top_k, top_p)


def kept_threshold(threshold: torch.Tensor, greedy: torch.Tensor, greedy_z: torch.Tensor) -> torch.Tensor:
    """[R] the threshold of each row's kept set (the sampling mask: its finite values at or above it): the
    truncation ``threshold`` [R] of a random row, the row max of ``greedy_logits`` ``greedy_z`` [R, V] (the
    argmax set) where ``greedy`` [R]."""
    return torch.where(greedy, greedy_z.max(dim=-1).values, threshold)


def min_p_logits(logits: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """[R, V] ``logits`` (same dtype) with the tokens min-p drops set to -inf: v is dropped iff
    ``softmax(z)_v < min_p * max_u softmax(z)_u``, z = ``scale_logits(logits, temperature)``; per row
    ``temperature`` [R] (0 = greedy: untouched) and ``min_p`` [R] in [0, 1] (0: untouched)."""
    sampled = temperature > 0
    tempered = softmax(scale_logits(logits, torch.where(sampled, temperature, torch.ones_like(temperature))))
    below = tempered < min_p.float()[:, None] * tempered.max(dim=-1, keepdim=True).values
    return logits.masked_fill(below & sampled[:, None], NEG_INF)


def softmax(z: torch.Tensor) -> torch.Tensor:
    """Softmax of float32 scaled logits; an all -inf row gives a one-hot on token 0."""
    m = z.max(dim=-1, keepdim=True).values
    finite = torch.isfinite(m)
    e = torch.exp(z - torch.where(finite, m, torch.zeros_like(m)))
    total = e.sum(dim=-1, keepdim=True)
    onehot0 = torch.zeros_like(z)
    onehot0[:, 0] = 1.0
    return torch.where(finite, e / total, onehot0)


def target_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """[R, V] float32 target distribution after temperature, top-k and top-p (temperature > 0)."""
    return softmax(target_logits(logits, temperature, top_k, top_p))
