"""Block verification of draft chains (Sun et al., "Block Verification Accelerates Speculative Decoding",
ICLR 2025): the readable, batched spec of ``verify_chain(..., method="block")``.

Rules (one request; rows j = 0 .. k as in ``reference/chain.py``; p_j = the truncated target at row j,
q_j = ``draft_probs`` row j, x_j = draft j, so row j decides the token at ``position + j``):

- weights: ``w_0 = 1``, ``w_{j+1} = min(1, w_j p_j(x_j) / q_j(x_j))`` (float32; 1 if q_j(x_j) = 0 < w_j p_j(x_j),
  0 if both are 0);
- the block ends at its first placeholder (or id outside [0, V)): K = that index, else K = k;
- residuals ``r_j = max(0, w_j p_j - q_j)`` with mass ``Z_j = sum r_j`` (summed in float64), and the stop
  probabilities ``h_j = Z_j / (Z_j + 1 - w_j)`` for 1 <= j < K (0 if the denominator is 0), ``h_K = w_K``;
- ``tau`` = the largest j in 1..K whose coin ``eta_j = philox.sequence_coins(seed, position, j)`` (=
  ``philox.uniform(seed, position | 2**31, 0, j)``: keyed by the round's first position, see there) has
  ``eta_j < h_j``; 0 if there is none;
- output: drafts x_0 .. x_{tau-1}, then from row tau at ``position + tau``: ``y ~ p_K`` by two-level
  Gumbel-max (``reference/gumbel.py``) on the scaled logits if tau = K (stream 2 when K = k, the bonus
  row; stream 1 when the block ended at a placeholder), else ``y ~ norm(r_tau)`` by two-level Gumbel-max
  on log r_tau on stream 1 (p_tau itself if r_tau is empty).

Greedy requests and deterministic drafts (no ``draft_probs``) run token-level verification (below).

Derivation (1-indexed prefixes: x^i = the first i drafts, Q(x^i) their draft probability; 0-indexed
rows: w_i p_i is the weight row after the prefix x^i). Let S_i = sum_x max(0, q_i(x) - w_i p_i(x)) =
Z_i + 1 - w_i, the probability that the next draft's weight falls: ``E[1 - w_{i+1} | x^i] = S_i``.

1. Backward induction: P(tau <= i - 1 | x^i) = 1 - w_i. At i = K it is 1 - h_K = 1 - w_K. Given it at
   i + 1, P(tau <= i | x^i) = E[1 - w_{i+1}] = S_i, and tau <= i - 1 needs eta_i >= h_i as well:
   (1 - h_i) S_i = S_i - Z_i = 1 - w_i.
2. Hence P(tau >= i, x^i) = Q(x^i) w_i and P(tau = i, x^i) = Q(x^i) h_i S_i = Q(x^i) Z_i.
3. Given that the verifier reaches row i (tau >= i, prefix x^i), the next emitted token is x_{i+1} with
   tau >= i + 1 (probability min(q_i, w_i p_i)(x_{i+1}) / w_i), or y ~ r_i / Z_i with tau = i (probability
   Z_i / w_i): in total ``(min(q_i, w_i p_i) + max(0, w_i p_i - q_i)) / w_i = p_i``. Every emitted token
   follows the target given the emitted prefix: the method is lossless. At row K (tau = K) it is p_K.

Acceptance: P(at least i accepted) = E[Q(x^i) w_i] with w_i >= prod_{j <= i} min(1, p_j / q_j) (by
induction, since w <= 1), the token-level value; the inequality is strict when a draft with p < q is
followed by one with p > q, so block >= token level, strictly in general for k >= 2 and equal for k = 1.
Sun et al. prove it optimal among valid verifiers of one draft block.

Deterministic drafts (one-hot q): w_i = prod_{j <= i} p_j(x_j), exactly token level's probability of
accepting the first i drafts, and no valid verifier can do better (the first i drafts can be accepted at
most with the target's probability of them); "block" then runs token level (same tokens).
"""

from __future__ import annotations

import torch

from . import gumbel, philox
from .chain import ChainResult, chain_spans
from .chain import verify_chain as verify_chain_token
from .sampling import greedy_logits, kept_threshold, softmax, target_logits_with_threshold

__all__ = ["last_stop", "prefix_coin", "ratio_weight", "residual_row", "stop_mass", "stop_probability", "verify_chain_block"]


def ratio_weight(num: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """float32 ``min(1, num / q_x)``: 1 when num >= q_x and num > 0, 0 when num = 0, else num / q_x."""
    one = torch.ones_like(num)
    return torch.where(num >= q_x, torch.where(num > 0, one, torch.zeros_like(num)),
                       num / torch.where(q_x > 0, q_x, one))


def residual_row(w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[B, V] float32 ``max(0, w p - q)``: the block residual after an accepted prefix of weight w [B]."""
    return torch.clamp(w[:, None] * p - q, min=0.0)


def stop_mass(w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[B] float64 ``Z = sum max(0, w p - q)``, the mass of :func:`residual_row` (summed in float64)."""
    return torch.clamp(w[:, None] * p - q, min=0.0).double().sum(-1)


def prefix_coin(seed: torch.Tensor, position: torch.Tensor, j: int) -> torch.Tensor:
    """[B] float32 coin of the test of prefix length j (sequence-level coins, see ``philox.sequence_coins``)."""
    return philox.sequence_coins(seed, position, j)


def last_stop(tau: torch.Tensor, j: int, stop: torch.Tensor) -> torch.Tensor:
    """tau after row j's test: the largest stopping row so far (the rows are tested in order)."""
    return torch.where(stop, j, tau)


def stop_probability(mass: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float64 ``Z / (Z + 1 - w)`` for residual masses Z (float64) and weights w; 0 where that is 0 / 0."""
    denom = mass + (1.0 - weight.double())
    return torch.where(denom > 0, mass / torch.where(denom > 0, denom, 1.0), torch.zeros_like(mass))


def verify_chain_block(
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
    """Reference block verification on validated, normalised inputs (``verify_chain``'s signature).

    Loops over the row index j (vectorised over requests) because each weight depends on the previous
    one; every request's rows 0 .. K are read. ``row_threshold``: as ``reference.chain.verify_chain``'s.
    """
    if draft_probs is None:
        return verify_chain_token(target_logits_, draft_token_ids, cu_num_draft_tokens, None, temperature, top_k,
                                  top_p, seed, position, max_draft_len, row_threshold)
    vocab_size = target_logits_.shape[1]
    num_reqs = cu_num_draft_tokens.numel() - 1
    device = target_logits_.device
    width = max_draft_len + 1
    drafts = draft_token_ids.to(torch.int64)
    # Each chain's first draft and length, clamped as every backend clamps them (the identity on a valid cu).
    start, k = chain_spans(cu_num_draft_tokens, drafts.numel(), max_draft_len)
    first_row = start + torch.arange(num_reqs, device=device)
    is_greedy = temperature == 0
    temp = torch.where(is_greedy, torch.ones_like(temperature), temperature)

    def draft_at(j: int) -> torch.Tensor:
        """[B] draft j of each request (-1 past its chain)."""
        if drafts.numel() == 0:
            return torch.full((num_reqs,), -1, dtype=torch.int64, device=device)
        idx = (start + j).clamp(max=drafts.numel() - 1)
        return torch.where(j < k, drafts[idx], -1)

    def rows_at(j: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row j of every request (clamped to its bonus row): scaled truncated logits z [B, V], the draft
        row q [B, V] (zeros for the bonus row) and the greedy argmax [B]."""
        local = torch.minimum(torch.as_tensor(j, device=device).expand(num_reqs), k)
        logits = target_logits_[first_row + local]
        z, threshold = target_logits_with_threshold(logits, temp, top_k, top_p)
        greedy_z = greedy_logits(logits)
        if row_threshold is not None:
            row_threshold[first_row + local] = kept_threshold(threshold, is_greedy, greedy_z)
        q = torch.zeros(num_reqs, vocab_size, dtype=torch.float32, device=device)
        if drafts.numel():
            q_rows = draft_probs.float()[(start + local).clamp(max=drafts.numel() - 1)]
            q = torch.where((local < k)[:, None], q_rows, q)
        return z, q, torch.argmax(greedy_z, dim=-1)

    # The block length K: the first placeholder, else k.
    block_len = k.clone()
    for j in range(max_draft_len - 1, -1, -1):
        x = draft_at(j)
        block_len = torch.where((j < k) & ((x < 0) | (x >= vocab_size)), j, block_len)

    w = torch.ones(num_reqs, dtype=torch.float32, device=device)  # w_j
    tau = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    w_tau = w.clone()
    greedy_len = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    greedy_alive = torch.ones(num_reqs, dtype=torch.bool, device=device)
    for j in range(width):
        live = j <= block_len
        z, q, argmax = rows_at(j)
        p = softmax(z)
        if j >= 1:
            mass = stop_mass(w, p, q)
            h = torch.where(j == block_len, w.double(), stop_probability(mass, w))
            coin = prefix_coin(seed, position, j)
            stop = live & (coin.double() < h)
            w_tau = torch.where(last_stop(tau, j, stop) == j, w, w_tau)
            tau = last_stop(tau, j, stop)
        x = draft_at(j)
        greedy_alive = greedy_alive & (x == argmax)  # placeholders (-1) never match
        greedy_len = greedy_len + greedy_alive.to(torch.int64)
        safe_x = torch.where((x >= 0) & (x < vocab_size), x, 0)
        num = w * p.gather(-1, safe_x[:, None]).squeeze(-1)
        w = torch.where(j < block_len, ratio_weight(num, q.gather(-1, safe_x[:, None]).squeeze(-1)), w)

    # Emission from row tau (random requests) or the first mismatch (greedy requests).
    z, q, _ = rows_at(tau)
    final = tau == block_len
    stream = torch.where(final & (block_len == k), philox.STREAM_BONUS, philox.STREAM_RECOVERY)
    residual = residual_row(w_tau, softmax(z), q)
    empty = (residual.max(dim=-1).values <= 0)[:, None]
    token = gumbel.sample(torch.where(final[:, None] | empty, z, torch.log(residual)), seed, position + tau, stream)
    _, _, greedy_token = rows_at(greedy_len)
    num_accepted = torch.where(is_greedy, greedy_len, tau)
    token = torch.where(is_greedy, greedy_token, token)

    col = torch.arange(width, device=device)
    if drafts.numel():
        draft_cols = drafts[(start[:, None] + col[None, :]).clamp(max=drafts.numel() - 1)]
    else:
        draft_cols = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
    out = torch.where(col[None, :] < num_accepted[:, None], draft_cols, -1)
    out = torch.where(col[None, :] == num_accepted[:, None], token[:, None], out)
    return ChainResult(out.to(torch.int32), num_accepted.to(torch.int32))
