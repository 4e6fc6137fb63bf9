"""Readable, batched PyTorch reference for lossless chain verification (docs/design.md §2-§4).

Row layout: request b owns target rows ``cu[b] + b ... cu[b + 1] + b``; its ``k_b = cu[b+1] - cu[b]``
draft rows come first, then one bonus row. Row j of request b decides the token at absolute position
``position[b] + j``.

Per row (every row is computed; the kernels compute only what the first rejection needs, and because the
randomness is stateless the tokens are identical):

- greedy request (temperature 0): ``y = argmax(logits)`` (ties to the lowest index); a draft row accepts
  iff ``draft == y``.
- random request, deterministic drafts (no ``draft_probs``): ``y ~ p`` by two-level Gumbel-max
  (``reference/gumbel.py``) on the truncated scaled logits with recovery noise (stream 1); accept iff
  ``draft == y``. The bonus row samples with stream 2.
- random request, stochastic drafts: accept draft x iff ``coin * q(x) < p(x)`` (coin on stream 0), i.e.
  with probability min(1, p(x)/q(x)); the recovery token samples norm(max(0, p - q)) with stream 1, or p
  itself if that residual is numerically empty.

Placeholders (-1) and any id outside [0, V) are always rejected. A request's output is its accepted
drafts followed by the recovery token of the first rejected row, or by the bonus token if none was
rejected.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import gumbel, philox
from .sampling import greedy_logits, kept_threshold, softmax, target_logits_with_threshold


class ChainResult(NamedTuple):
    output_token_ids: torch.Tensor  # [B, K_max + 1] int32, -1 padded
    num_accepted: torch.Tensor  # [B] int32, accepted drafts (bonus excluded)


class RowLayout(NamedTuple):
    request: torch.Tensor  # [R] int64 request of each row
    local: torch.Tensor  # [R] int64 index of the row within its request (k_b for the bonus row)
    is_bonus: torch.Tensor  # [R] bool
    draft_index: torch.Tensor  # [R] int64 index into draft_token_ids (clamped; meaningless for bonus rows)
    in_span: torch.Tensor  # [R] bool: the row is one of its request's k_b + 1 rows (all True for a valid cu)


def chain_spans(
    cu_num_draft_tokens: torch.Tensor, num_drafts: int, max_draft_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's (first draft index, draft count k) [B] int64, clamped to stay in bounds.

    The identity on a valid ``cu``. With validation off, every backend clamps the same way: ``cu`` entries
    into [0, T], counts at 0 from below and at ``max_draft_len`` from above (drafts past it are ignored and
    the row after the last kept draft is sampled as the bonus row).
    """
    cu = cu_num_draft_tokens.to(torch.int64)
    start = cu[:-1].clamp(0, num_drafts)
    end = torch.maximum(cu[1:].clamp(0, num_drafts), start)
    count = end - start
    if max_draft_len is not None:
        count = count.clamp(max=max_draft_len)
    return start, count


def row_layout(cu_num_draft_tokens: torch.Tensor, num_rows: int, max_draft_len: int | None = None) -> RowLayout:
    """Map each of the T + B target rows to (request, local index, is_bonus) without host syncs.

    Request b owns rows ``start_b + b ... start_b + b + k_b`` (:func:`chain_spans`). Any ``cu`` stays in
    bounds: a row maps to the last request whose first row is at or before it, and rows outside that
    request's span (only with an inconsistent ``cu``) are marked ``in_span = False``.
    """
    cu = cu_num_draft_tokens.to(torch.int64)
    num_reqs = cu.numel() - 1
    device = cu.device
    num_drafts = num_rows - num_reqs
    start, count = chain_spans(cu, num_drafts, max_draft_len)
    first_row = start + torch.arange(num_reqs, device=device)
    row = torch.arange(num_rows, device=device)
    request = (torch.searchsorted(first_row.cummax(0).values, row, right=True) - 1).clamp(min=0)
    local = row - first_row[request]
    k = count[request]
    in_span = (local >= 0) & (local <= k)
    is_bonus = local == k
    draft_index = (start[request] + local).clamp(0, max(num_drafts - 1, 0))
    return RowLayout(request, local, is_bonus, draft_index, in_span)


def verify_chain(
    target_logits_: torch.Tensor,
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
    """Reference chain verification on validated, normalised inputs (see ``specdec_kernels.verify_chain``).

    Shapes: logits [T + B, V]; draft ids [T]; cu [B + 1]; draft_probs [T, V] or None; temperature,
    top_k, top_p, seed, position [B] (top_k / top_p may be None). Returns int32 tokens [B, max_draft_len + 1]
    and int32 accepted counts [B]. ``row_threshold`` [T + B] float32 or None: when given, receives each row's
    kept-set threshold (``sampling.kept_threshold``: the truncation threshold, or the greedy row max), from
    which ``sampling_mask`` enumerates the sampling mask.
    """
    num_rows, vocab_size = target_logits_.shape
    num_reqs = cu_num_draft_tokens.numel() - 1
    device = target_logits_.device
    width = max_draft_len + 1
    if num_reqs == 0:
        empty = torch.empty((0, width), dtype=torch.int32, device=device)
        return ChainResult(empty, torch.empty(0, dtype=torch.int32, device=device))
    layout = row_layout(cu_num_draft_tokens, num_rows, max_draft_len)
    req = layout.request

    is_greedy = (temperature[req] == 0)[:, None]
    # Greedy rows use temperature 1 for the (ignored) random path so that nothing divides by zero.
    row_temp = torch.where(temperature[req] == 0, torch.ones_like(temperature[req]), temperature[req])
    z, threshold = target_logits_with_threshold(
        target_logits_, row_temp,
        None if top_k is None else top_k[req],
        None if top_p is None else top_p[req],
    )
    greedy_z = greedy_logits(target_logits_)
    greedy_tokens = torch.argmax(greedy_z, dim=-1)
    if row_threshold is not None:
        row_threshold.copy_(kept_threshold(threshold, is_greedy[:, 0], greedy_z))

    row_seed = seed[req]
    row_pos = position[req] + layout.local
    stream = torch.where(layout.is_bonus, philox.STREAM_BONUS, philox.STREAM_RECOVERY)

    has_draft = ~layout.is_bonus
    if num_rows > num_reqs:
        draft = torch.where(has_draft, draft_token_ids.to(torch.int64)[layout.draft_index], -1)
    else:
        draft = torch.full((num_rows,), -1, dtype=torch.int64, device=device)
    draft_valid = has_draft & (draft >= 0) & (draft < vocab_size)
    safe_draft = torch.where(draft_valid, draft, 0)

    sampled = gumbel.sample(z, row_seed, row_pos, stream)  # y ~ p for every row
    if draft_probs is None:
        random_accept = draft_valid & (sampled == draft)
        recovered = sampled
    else:
        p = softmax(z)
        q = torch.zeros_like(p)
        if num_rows > num_reqs:
            q = torch.where(has_draft[:, None], draft_probs.float()[layout.draft_index], q)
        p_x = p.gather(-1, safe_draft[:, None]).squeeze(-1)
        q_x = q.gather(-1, safe_draft[:, None]).squeeze(-1)
        coin = philox.coins(row_seed, row_pos)
        random_accept = draft_valid & (coin * q_x < p_x)
        diff = p - q
        residual = torch.where(diff > 0, diff, 0.0)  # max(0, p - q); a NaN q entry counts as 0, as in the kernels
        residual_empty = (residual.max(dim=-1).values <= 0)[:, None]
        log_residual = torch.where(residual_empty, z, torch.log(residual))
        resampled = gumbel.sample(log_residual, row_seed, row_pos, stream)
        recovered = torch.where(layout.is_bonus, sampled, resampled)

    accept = torch.where(is_greedy[:, 0], draft_valid & (greedy_tokens == draft), random_accept)
    token = torch.where(is_greedy[:, 0], greedy_tokens, recovered)

    # Accepted prefix length per request: first rejected row (bonus rows count as rejected).
    never = num_rows + 1
    rejected_local = torch.where(accept | ~layout.in_span, torch.full_like(layout.local, never), layout.local)
    first_reject = torch.full((num_reqs,), never, dtype=torch.int64, device=device)
    first_reject = first_reject.scatter_reduce(0, req, rejected_local, reduce="amin")
    # The bonus row always "rejects", so this is <= k_b; a request left without rows (only with an
    # inconsistent cu) accepts nothing and emits nothing.
    num_accepted = torch.where(first_reject == never, 0, first_reject)

    out = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
    emit = layout.in_span & (layout.local <= num_accepted[req])
    value = torch.where(layout.local < num_accepted[req], draft, token)
    col = layout.local.clamp(0, width - 1)
    flat = torch.where(emit, req * width + col, num_reqs * width)
    out_flat = torch.cat([out.view(-1), out.new_full((1,), -1)])
    out_flat = out_flat.scatter(0, flat, torch.where(emit, value, -1))
    out = out_flat[:-1].view(num_reqs, width)
    return ChainResult(out.to(torch.int32), num_accepted.to(torch.int32))
