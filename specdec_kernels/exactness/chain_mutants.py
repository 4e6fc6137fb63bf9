"""Planted-bug chain samplers: small modified copies of the reference, to prove the suite can fail.

:func:`mutant_chain` is the reference chain verification (``reference/chain.py``) with one planted bug
switched on by name; :func:`mutant_verifier` wraps it in ``verify_chain``'s public signature so the
exactness checks that run real backends run it unchanged. Each bug is one a sampler author could make:

- ``unnormalised_residual``: the recovery token is drawn by inverse CDF from max(0, p - q) *without*
  dividing by its mass (uniform compared to the unnormalised cumulative sum; overflow -> last token).
- ``coin_reused``: one acceptance coin per request (position of the first draft) for every draft row.
- ``draft_temperature_missing``: the target is tempered but the draft law is taken untempered
  (q^T renormalised, which undoes the temperature the drafter sampled with).
- ``bonus_wrong_row``: the bonus token is sampled from the previous (last draft) row.
- ``residual_q_minus_p``: recovery from norm(max(0, q - p)) instead of norm(max(0, p - q)).
- ``greedy_sampled``: greedy requests (temperature 0) are sampled at temperature 1.
- ``deterministic_resample_with_draft``: deterministic drafts accepted with probability p(x), and on
  rejection a fresh sample from p (which can be x again) instead of p without x.
- ``ratio_inverted``: stochastic drafts accepted with probability min(1, q(x) / p(x)).
- ``block_max_score``: two-level Gumbel-max (``reference/gumbel.py``) scoring each vocabulary block by its
  largest log-weight instead of its log-mass (logsumexp), which favours blocks with one strong token.
- ``block_noise_reused``: within the chosen block, every entry is perturbed with the block's own uniform
  (one noise value for the whole block), so the block's most likely token always wins.
- ``biased_first_token``: the design-point bug. With probability eps = 0.02 / m (its own uniform, on
  stream 3) the first row rejects and emits a sample from p restricted to its most likely tokens (those
  with less than half of the mass strictly above them; m = mass of the others). The first token's law
  is then the least favourable alternative at total-variation distance exactly 0.02 (mass moved in
  proportion to p, see ``stats.least_favourable_alternative``): the smallest, hardest-to-see error the
  suite's sample sizes are chosen to catch with power 0.999.

The shared-stream class (vLLM PR #54282, vllm-ascend's residual resample): one uniform serving two
decisions, which biases the output toward the draft's choices. The narrow case family of
``chain_law.NARROW_CASES`` (V = 16, the draft law the target's ranking reversed) rejects each:

- ``shared_stream``: the draft proposal, the acceptance coin and the recovery noise all come from one stream:
  the system drafts on the coin stream (:data:`DRAFT_STREAMS`; :func:`mutant_verifier` sets ``draft_stream``,
  which the narrow cases' in-system drafter reads) and the residual is resampled on it too, so token v's
  draft noise, its recovery noise and (v = 0) the coin are one Philox word.
- ``recovery_reuses_coin``: the recovery token is the inverse CDF of norm(max(0, p - q)) at the acceptance
  coin itself (which is conditioned to be large by the rejection).
- ``bonus_on_recovery_stream``: the bonus row samples with the recovery stream's words of the last draft
  row (its position, stream 1): after an accepted deterministic draft those are the very words whose
  Gumbel-max produced the draft, so the bonus repeats the draft's choice.
"""

from __future__ import annotations

import torch

from ..api import normalize_sampling_params
from ..reference import gumbel, philox
from ..reference.chain import ChainResult, row_layout
from ..reference.sampling import greedy_logits, softmax, target_logits

__all__ = ["MUTANTS", "DRAFT_STREAMS", "mutant_chain", "mutant_verifier"]

MUTANTS = (
    "unnormalised_residual",
    "coin_reused",
    "draft_temperature_missing",
    "bonus_wrong_row",
    "residual_q_minus_p",
    "greedy_sampled",
    "deterministic_resample_with_draft",
    "ratio_inverted",
    "block_max_score",
    "block_noise_reused",
    "biased_first_token",
    "shared_stream",
    "recovery_reuses_coin",
    "bonus_on_recovery_stream",
)
DRAFT_STREAMS = {"shared_stream": philox.STREAM_COIN}
"""The Philox stream a system with the bug drafts on, where it is not the drafters' STREAM_DRAFT: the
verifier :func:`mutant_verifier` returns carries it as ``draft_stream`` (``chain_law.draft_stream``)."""
BIAS_TV = 0.02
STREAM_BIAS = 3


def _sample(bug: str, log_weights: torch.Tensor, seed: torch.Tensor, position: torch.Tensor,
            stream: torch.Tensor | int) -> torch.Tensor:
    """``gumbel.sample``, with the block-level bugs planted when ``bug`` names one."""
    if bug not in ("block_max_score", "block_noise_reused"):
        return gumbel.sample(log_weights, seed, position, stream)
    rows = log_weights.shape[0]
    device = log_weights.device
    stream = torch.as_tensor(stream, dtype=torch.int64, device=device).expand(rows)
    blocks = gumbel.blocked(log_weights)
    block_ids = torch.arange(blocks.shape[1], device=device)
    u_block = philox.uniform(seed[:, None], position[:, None], stream[:, None], philox.BLOCK_DRAWS + block_ids)
    mass = blocks.max(dim=-1).values if bug == "block_max_score" else torch.logsumexp(blocks, dim=-1)
    chosen = torch.argmax(mass - gumbel.gumbel_noise(u_block), dim=-1)
    entries = blocks.gather(1, chosen[:, None, None].expand(rows, 1, gumbel.BLOCK)).squeeze(1)
    v = chosen[:, None] * gumbel.BLOCK + torch.arange(gumbel.BLOCK, device=device)
    u_entry = philox.uniform(seed[:, None], position[:, None], stream[:, None], v)
    if bug == "block_noise_reused":
        u_entry = u_block.gather(1, chosen[:, None]).expand_as(u_entry)
    return chosen * gumbel.BLOCK + torch.argmax(entries - gumbel.gumbel_noise(u_entry), dim=-1)


def _sample_rows(bug: str, rows: torch.Tensor, log_weights: torch.Tensor, seed: torch.Tensor,
                 position: torch.Tensor, stream: torch.Tensor | int, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`_sample` on the rows where ``rows`` [R] bool is set, written into ``out`` (default: -1 elsewhere).
    A row's sample depends on its own log-weights and key only, so it equals that row of sampling all rows."""
    if out is None:
        out = torch.full(rows.shape, -1, dtype=torch.int64, device=rows.device)
    i = torch.nonzero(rows).squeeze(1)
    if i.numel():
        stream = stream[i] if isinstance(stream, torch.Tensor) else stream
        out = out.clone()
        out[i] = _sample(bug, log_weights[i], seed[i], position[i], stream)
    return out


def mutant_chain(
    bug: str,
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
) -> ChainResult:
    """``reference.chain.verify_chain`` (normalised inputs) with the planted bug ``bug`` (see MUTANTS)."""
    if bug not in MUTANTS:
        raise ValueError(f"bug must be one of {MUTANTS}, got {bug!r}")
    num_rows, vocab_size = target_logits_.shape
    num_reqs = cu_num_draft_tokens.numel() - 1
    device = target_logits_.device
    layout = row_layout(cu_num_draft_tokens, num_rows)
    req = layout.request

    if bug == "greedy_sampled":
        temperature = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    logits_rows = target_logits_
    if bug == "bonus_wrong_row":
        prev = torch.where(layout.is_bonus & (layout.local > 0), torch.arange(num_rows, device=device) - 1,
                           torch.arange(num_rows, device=device))
        logits_rows = target_logits_[prev]

    is_greedy = (temperature[req] == 0)[:, None]
    row_temp = torch.where(temperature[req] == 0, torch.ones_like(temperature[req]), temperature[req])
    z = target_logits(
        logits_rows, row_temp,
        None if top_k is None else top_k[req],
        None if top_p is None else top_p[req],
    )
    greedy_tokens = torch.argmax(greedy_logits(target_logits_), dim=-1)

    row_seed = seed[req]
    row_pos = position[req] + layout.local
    stream = torch.where(layout.is_bonus, philox.STREAM_BONUS, philox.STREAM_RECOVERY)
    sample_pos, sample_stream = row_pos, stream
    if bug == "bonus_on_recovery_stream":
        late_bonus = layout.is_bonus & (layout.local > 0)
        sample_pos = torch.where(late_bonus, row_pos - 1, row_pos)
        sample_stream = torch.where(late_bonus, philox.STREAM_RECOVERY, stream)

    has_draft = ~layout.is_bonus
    if num_rows > num_reqs:
        draft = torch.where(has_draft, draft_token_ids.to(torch.int64)[layout.draft_index], -1)
    else:
        draft = torch.full((num_rows,), -1, dtype=torch.int64, device=device)
    draft_valid = has_draft & (draft >= 0) & (draft < vocab_size)
    safe_draft = torch.where(draft_valid, draft, 0)
    coin_pos = position[req] if bug == "coin_reused" else row_pos
    coin = philox.coins(row_seed, coin_pos)

    # Acceptance first, then the Gumbel-max samples only where a token they give is read: the point-mass
    # acceptance's sampled draft rows, and the one row per request whose own token is emitted (its first
    # rejected draft row, or its bonus row). A sample is a function of its own row and key alone, so the
    # tokens are those of sampling every row; sampling all of them was most of the time at V = 4096.
    point_mass = draft_probs is None and bug != "deterministic_resample_with_draft"
    sampled = None
    if point_mass:
        sampled = _sample_rows(bug, draft_valid & ~is_greedy[:, 0], z, row_seed, sample_pos, sample_stream)
    p = softmax(z)
    q = None
    if draft_probs is None:
        if point_mass:
            random_accept = draft_valid & (sampled == draft)
        else:
            p_x = p.gather(-1, safe_draft[:, None]).squeeze(-1)
            random_accept = draft_valid & (coin < p_x)
    else:
        q = torch.zeros_like(p)
        if num_rows > num_reqs:
            q = torch.where(has_draft[:, None], draft_probs.float()[layout.draft_index], q)
        if bug == "draft_temperature_missing":
            tempered = q ** row_temp[:, None]
            tempered = tempered / tempered.sum(-1, keepdim=True).clamp(min=1e-30)
            # At temperature 1 the bug is a no-op: keep q's own bits there (renormalising would move a few
            # coin comparisons by rounding, so a path that hands processed logits at temperature 1, like the
            # vLLM V2 drop-in, could not tell the bug inert from missed).
            q = torch.where((row_temp == 1.0)[:, None], q, tempered)
        p_x = p.gather(-1, safe_draft[:, None]).squeeze(-1)
        q_x = q.gather(-1, safe_draft[:, None]).squeeze(-1)
        if bug == "ratio_inverted":
            random_accept = draft_valid & (coin * p_x < q_x)
        else:
            random_accept = draft_valid & (coin * q_x < p_x)

    if bug == "biased_first_token":
        u = philox.uniform(row_seed, row_pos, STREAM_BIAS, philox.BLOCK_DRAWS - 1)
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        top_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < 0.5
        top = torch.zeros_like(top_sorted).scatter(-1, order, top_sorted)
        rest_mass = (p * ~top).sum(-1)
        eps = torch.where(rest_mass > 0, (BIAS_TV / rest_mass.clamp(min=1e-30)).clamp(max=1.0), 0.0)
        biased = (layout.local == 0) & (u < eps)
        random_accept = random_accept & ~biased

    accept = torch.where(is_greedy[:, 0], draft_valid & (greedy_tokens == draft), random_accept)
    rejected_local = torch.where(accept, torch.full_like(layout.local, num_rows + 1), layout.local)
    first_reject = torch.full((num_reqs,), num_rows + 1, dtype=torch.int64, device=device)
    num_accepted = first_reject.scatter_reduce(0, req, rejected_local, reduce="amin")

    e = torch.nonzero(layout.local == num_accepted[req]).squeeze(1)  # the emitted rows
    e_seed, e_pos, e_stream, e_z = row_seed[e], row_pos[e], stream[e], z[e]
    e_sampling = ~is_greedy[e, 0]
    e_bonus = layout.is_bonus[e]
    known = None if sampled is None else sampled[e]
    if q is None:
        needs_sample = e_sampling
    else:
        e_p, e_q = p[e], q[e]
        residual = torch.clamp(e_q - e_p if bug == "residual_q_minus_p" else e_p - e_q, min=0.0)
        residual_empty = (residual.max(dim=-1).values <= 0)[:, None]
        inverse_cdf = bug in ("unnormalised_residual", "recovery_reuses_coin")
        needs_sample = e_sampling & (e_bonus | (residual_empty[:, 0] if inverse_cdf else False))
    if known is not None:
        needs_sample = needs_sample & (known < 0)
    e_sampled = _sample_rows(bug, needs_sample, e_z, e_seed, sample_pos[e], sample_stream[e], known)
    if q is None:
        e_recovered = e_sampled
    else:
        resampling = e_sampling & ~e_bonus
        if inverse_cdf:
            cdf = torch.cumsum(residual, dim=-1)
            if bug == "recovery_reuses_coin":
                u = coin[e][:, None] * cdf[:, -1:]
            else:
                u = philox.uniform(e_seed, e_pos, e_stream, 0)[:, None]
            idx = torch.searchsorted(cdf, u.contiguous(), right=True).squeeze(-1)
            resampled = torch.where(residual_empty[:, 0], e_sampled, idx.clamp(max=vocab_size - 1))
        else:
            log_residual = torch.where(residual_empty, e_z, torch.log(residual))
            resample_stream = philox.STREAM_COIN if bug == "shared_stream" else e_stream
            resampled = _sample_rows(bug, resampling, log_residual, e_seed, e_pos, resample_stream)
        e_recovered = torch.where(e_bonus, e_sampled, resampled)
    if bug == "biased_first_token":
        e_biased = torch.nonzero(biased[e]).squeeze(1)
        top_log_p = torch.where(top[e[e_biased]], torch.log(p[e[e_biased]]), float("-inf"))
        e_recovered = e_recovered.clone()
        e_recovered[e_biased] = gumbel.sample(top_log_p, e_seed[e_biased], e_pos[e_biased], STREAM_BIAS)
    token = torch.full((num_rows,), -1, dtype=torch.int64, device=device)
    token[e] = torch.where(is_greedy[e, 0], greedy_tokens[e], e_recovered)

    width = max_draft_len + 1
    out = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
    emit = layout.local <= num_accepted[req]
    value = torch.where(layout.local < num_accepted[req], draft, token)
    col = layout.local.clamp(max=width - 1)
    flat = torch.where(emit, req * width + col, num_reqs * width)
    out_flat = torch.cat([out.view(-1), out.new_full((1,), -1)])
    out_flat = out_flat.scatter(0, flat, torch.where(emit, value, -1))
    out = out_flat[:-1].view(num_reqs, width)
    return ChainResult(out.to(torch.int32), num_accepted.to(torch.int32))


def mutant_verifier(bug: str):
    """A callable with ``verify_chain``'s positional signature that runs :func:`mutant_chain` with ``bug``.

    Inputs are normalised like the public API (dtypes, defaults) but not range-checked.
    """
    if bug not in MUTANTS:
        raise ValueError(f"bug must be one of {MUTANTS}, got {bug!r}")

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None, backend=None, **_):
        num_reqs = cu_num_draft_tokens.numel() - 1
        cu = cu_num_draft_tokens.to(torch.int64)
        temperature, top_k, top_p, seed, position = normalize_sampling_params(
            num_reqs, target_logits.device, temperature, top_k, top_p, seed, position, validate=False
        )
        max_draft_len = int((cu[1:] - cu[:-1]).max()) if num_reqs else 0
        return mutant_chain(
            bug, target_logits.contiguous(), draft_token_ids.to(torch.int64), cu, draft_probs,
            temperature, top_k, top_p, seed, position, max_draft_len,
        )

    verify.__name__ = f"mutant_{bug}"
    if bug in DRAFT_STREAMS:
        verify.draft_stream = DRAFT_STREAMS[bug]
    return verify
