"""The chain-verification exactness checks: named cases and the functions that test a verifier on them.

A *verifier* is any callable with ``verify_chain``'s positional signature (``target_logits,
draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p, seed, position``),
e.g. ``functools.partial(specdec_kernels.verify_chain, backend="triton")`` or a planted-bug sampler
from :mod:`specdec_kernels.exactness.chain_mutants`. Two families of cases:

- :class:`FirstTokenCase`: one random (p, q) pair on a small vocabulary, a ragged batch of requests with
  0-2 drafts each (every row holds the same target logits); the first emitted token of every request
  must follow the (temperature / top-k / top-p truncated) target law.
- :class:`SequenceCase`: a toy Markov target and a drafter; the full speculative loop
  (:func:`markov_models.run_speculative`) must generate sequences whose law equals the enumerated
  autoregressive law.
- :class:`NarrowCase`: vLLM's narrow design (PR #54282): V = 16, the draft law the target's ranking reversed,
  one draft per request sampled *inside the system under test* (the system's own draft sampler where the
  verifier declares one, else Philox Gumbel-max on the system's draft stream, keyed like the verifier's draws);
  the law of (rejected first token | accepted draft's bonus token) must be exact. It is the case that sees one
  uniform shared between drafting, acceptance and resampling.

Each check runs the verifier with seeded inputs in group-sequential looks (:mod:`sequential`): the last look's
sample size comes from the power calculation (:func:`gof.sample_size`: detect any total-variation error of 0.02
with power 0.999 at the last look's share of the given alpha), earlier looks at 1/64 and 1/8 of it stop a run that
already rejects; it returns the deciding look's goodness-of-fit :class:`gof.TestResult`. Tokens outside [0, V)
land in an extra cell of probability 0, so they always fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..reference import philox
from . import goodness_of_fit as gof
from . import sequential
from .markov_models import (
    Drafter,
    MarkovModel,
    SamplingConfig,
    Verifier,
    random_markov,
    run_speculative,
    sequence_histogram,
    sequence_law,
    step_probs,
)

__all__ = [
    "FirstTokenCase",
    "SequenceCase",
    "FIRST_TOKEN_CASES",
    "SEQUENCE_CASES",
    "case_by_name",
    "first_token_law",
    "sample_first_tokens",
    "check_first_token_law",
    "sequence_case_models",
    "check_sequence_law",
    "LawCheck",
    "backend_verifier",
    "MUTANT_CASES",
    "NarrowCase",
    "NARROW_CASES",
    "narrow_law",
    "draft_stream",
    "draft_proposals",
    "sample_narrow",
    "check_narrow_law",
    "law_check_for",
    "law_plan",
]

TV = 0.02
POWER = 0.999


def backend_verifier(backend: str, device: torch.device | str = "cpu", method: str = "token") -> Verifier:
    """``verify_chain(..., backend=backend, method=method)`` on ``device``: inputs moved there, results back
    to the CPU."""
    from .. import verify_chain
    from ..reference.chain import ChainResult

    def verify(*args, **kwargs):  # kwargs: min_p, when a case sets it
        moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        res = verify_chain(*moved, backend=backend, method=method, **{k: v.to(device) for k, v in kwargs.items()})
        return ChainResult(res.output_token_ids.cpu(), res.num_accepted.cpu())

    verify.__name__ = f"verify_chain_{backend}" if method == "token" else f"verify_chain_{method}_{backend}"
    return verify


@dataclass(frozen=True)
class LawCheck:
    """A finished check: the deciding look's test result (p-value Bonferroni-adjusted for the looks, so
    ``result.rejects(alpha)`` is the verdict), the trials drawn until it, and the expected and observed cells;
    ``look`` of ``looks`` (:mod:`sequential`)."""

    result: gof.TestResult
    num_samples: int
    expected: torch.Tensor  # [C] float64 probabilities (last cell: invalid tokens, probability 0)
    observed: torch.Tensor  # [C] int64 counts
    look: int = 1
    looks: int = 1


def law_plan(law: torch.Tensor, alpha: float, tv: float, power: float, looks: bool = True,
             num_samples: int | None = None) -> sequential.LookPlan:
    """The looks of a check against ``law``: :func:`sequential.plan_looks` (``looks``), else one look at the design
    size (or at ``num_samples`` when given) with the whole of ``alpha``."""
    if num_samples is not None:
        return sequential.single_look(num_samples, alpha)
    if looks:
        return sequential.plan_looks(law, alpha, tv, power)
    return sequential.single_look(gof.sample_size(law, alpha, tv, power), alpha)


def _law_check(draw, law: torch.Tensor, plan: sequential.LookPlan) -> LawCheck:
    """Run ``plan``'s looks on ``draw(start, count)`` -> counts over ``law``'s cells and an invalid last cell."""
    expected = torch.cat([law, law.new_zeros(1)])
    run = sequential.run_looks(draw, expected / expected.sum(), plan)
    return LawCheck(run.result, run.num_samples, expected, run.observed, run.look, run.looks)


def _histogram_with_invalid(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V + 1] counts of tokens, the last cell counting anything outside [0, V)."""
    t = tokens.to(torch.int64)
    t = torch.where((t >= 0) & (t < vocab_size), t, torch.full_like(t, vocab_size))
    return torch.bincount(t, minlength=vocab_size + 1)


# ----------------------------------------------------------------------------------------------------
# Per-position law: the first emitted token
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FirstTokenCase:
    """One random (p, q) pair; ``drafts`` is "deterministic" (no draft probs) or "stochastic".

    ``q_zero``: q is zero on the most likely target token (stochastic) — the residual must supply it.
    Deterministic drafts are the target argmax (50%), a uniform token (30%) or a placeholder (20%).
    """

    name: str
    vocab_size: int
    cfg: SamplingConfig
    drafts: str
    seed: int
    q_zero: bool = False
    max_k: int = 2
    cheap: bool = False  # also run under the Triton interpreter (only point-mass laws: n = 342)

    def pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(target logits [V] float32, draft law q [V] float32) of this case."""
        g = torch.Generator().manual_seed(10_000 + self.seed)
        logits = torch.randn(self.vocab_size, generator=g) * 1.5
        q = torch.softmax(torch.randn(self.vocab_size, generator=g) * 1.5, dim=-1)
        if self.q_zero:
            q[torch.argmax(logits)] = 0.0
            q = q / q.sum()
        return logits.float(), q.float()


def first_token_law(case: FirstTokenCase) -> torch.Tensor:
    """[V] float64 law of the first emitted token: the truncated target (one-hot argmax when greedy)."""
    logits, _ = case.pair()
    return step_probs(logits[None, :], case.cfg)[0].double()


def sample_first_tokens(verify: Verifier, case: FirstTokenCase, num_requests: int, start: int = 0) -> torch.Tensor:
    """Run one ragged batch of ``num_requests`` independent requests, trials ``start`` on of the case (seeded with
    :func:`sequential.chunk_seed`); return their first tokens [N]."""
    v = case.vocab_size
    logits, q = case.pair()
    g = torch.Generator().manual_seed(sequential.chunk_seed(case.seed, start))
    k = torch.randint(0, case.max_k + 1, (num_requests,), generator=g)
    cu = torch.zeros(num_requests + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(k, 0)
    num_drafts = int(cu[-1])
    draft_probs = None
    if case.drafts == "stochastic":
        drafts = torch.multinomial(q, num_drafts, replacement=True, generator=g) if num_drafts else \
            torch.empty(0, dtype=torch.int64)
        draft_probs = q.expand(num_drafts, v).contiguous()
    elif case.drafts == "deterministic":
        choice = torch.rand(num_drafts, generator=g)
        uniform = torch.randint(0, v, (num_drafts,), generator=g)
        drafts = torch.where(choice < 0.5, torch.argmax(logits), torch.where(choice < 0.8, uniform, -1))
    else:
        raise ValueError(f"drafts must be 'deterministic' or 'stochastic', got {case.drafts!r}")
    b = num_requests
    target = logits.expand(num_drafts + b, v).contiguous()
    temperature = torch.full((b,), float(case.cfg.temperature))
    top_k = torch.full((b,), case.cfg.top_k, dtype=torch.int32) if case.cfg.top_k else None
    top_p = torch.full((b,), case.cfg.top_p) if case.cfg.top_p < 1 else None
    seed = sequential.chunk_keys(case.seed, start, b)
    position = torch.randint(0, 1 << 20, (b,), generator=g)
    res = verify(target, drafts, cu, draft_probs, temperature, top_k, top_p, seed, position,
                 **case.cfg.extra_kwargs(b))
    return res.output_token_ids[:, 0]


def check_first_token_law(
    verify: Verifier, case: FirstTokenCase, alpha: float, tv: float = TV, power: float = POWER, looks: bool = True
) -> LawCheck:
    """Goodness of fit of the first emitted tokens to :func:`first_token_law`; the last look's sample size detects
    any total-variation error ``tv`` with probability ``power`` at its share of ``alpha`` (:func:`law_plan`)."""
    law = first_token_law(case)

    def draw(start: int, count: int) -> torch.Tensor:
        return _histogram_with_invalid(sample_first_tokens(verify, case, count, start), case.vocab_size)

    return _law_check(draw, law, law_plan(law, alpha, tv, power, looks))


def _first_token_cases() -> tuple[FirstTokenCase, ...]:
    cases = []
    truncations = [("", 0, 1.0), ("-topk3", 3, 1.0), ("-topp0.8", 0, 0.8)]
    seed = 1
    for drafts in ("deterministic", "stochastic"):
        for temperature in (0.3, 1.0, 2.0):
            for suffix, top_k, top_p in truncations:
                vocab = 5 + seed % 3  # 5, 6, 7: never a power of two
                cfg = SamplingConfig(temperature, top_k, top_p)
                name = f"first-{drafts[:5]}-T{temperature:g}{suffix}"
                cases.append(FirstTokenCase(name, vocab, cfg, drafts, seed, q_zero=seed % 2 == 0))
                seed += 1
        cases.append(FirstTokenCase(f"first-{drafts[:5]}-greedy", 6, SamplingConfig(0.0), drafts, seed,
                                    cheap=True))
        seed += 1
    cases.append(FirstTokenCase("first-stoch-T0.7-topk4-topp0.9", 8, SamplingConfig(0.7, 4, 0.9),
                                "stochastic", seed))
    # Vocabularies spanning several two-level Gumbel-max blocks (16 entries each, the last one partial).
    cases.append(FirstTokenCase("first-deter-V40-T1", 40, SamplingConfig(1.0), "deterministic", seed + 1))
    cases.append(FirstTokenCase("first-stoch-V40-T1", 40, SamplingConfig(1.0), "stochastic", seed + 2, q_zero=True))
    return tuple(cases)


FIRST_TOKEN_CASES: tuple[FirstTokenCase, ...] = _first_token_cases()


# ----------------------------------------------------------------------------------------------------
# Whole-sequence law with toy Markov models
# ----------------------------------------------------------------------------------------------------

DRAFTERS = ("self", "close", "far", "zeros", "greedy", "ngram", "unlikely")


@dataclass(frozen=True)
class SequenceCase:
    """Speculative generation of ``length`` tokens from a toy Markov target with drafter ``drafter``.

    Drafters: "self" (samples from the target law itself: q = p, acceptance 1), "close" (samples from a
    perturbed target), "far" (samples from an unrelated peaky model), "zeros" (samples from a model that
    never proposes token 1, where p > 0), "greedy" (deterministic argmax of the perturbed target),
    "ngram" (deterministic, history lookup with placeholders), "unlikely" (always proposes the target's
    least likely token).
    """

    name: str
    drafter: str
    k: int
    cfg: SamplingConfig
    seed: int
    vocab_size: int = 3
    order: int = 1
    length: int = 4
    cap_drafts: bool = True
    cheap: bool = False


def sequence_case_models(case: SequenceCase) -> tuple[MarkovModel, Drafter]:
    """The (target, drafter) pair of a case, built from its seed."""
    g = torch.Generator().manual_seed(20_000 + case.seed)
    prompt = tuple(range(case.order))
    target = random_markov(case.vocab_size, case.order, g, scale=1.5, prompt=prompt)
    close = MarkovModel(target.table + 0.7 * torch.randn(target.table.shape, generator=g), prompt)
    draft_cfg = SamplingConfig(case.cfg.temperature if case.cfg.temperature > 0 else 1.0)
    if case.drafter == "self":
        return target, Drafter("sample", target, case.cfg if not case.cfg.greedy else draft_cfg)
    if case.drafter == "close":
        return target, Drafter("sample", close, draft_cfg)
    if case.drafter == "far":
        return target, Drafter("sample", random_markov(case.vocab_size, case.order, g, 3.0, prompt), draft_cfg)
    if case.drafter == "zeros":
        table = close.table.clone()
        table[..., 1] = float("-inf")
        return target, Drafter("sample", MarkovModel(table, prompt), draft_cfg)
    if case.drafter == "greedy":
        return target, Drafter("greedy", close)
    if case.drafter == "ngram":
        return target, Drafter("ngram")
    if case.drafter == "unlikely":
        least = int(torch.argmin(target.table.reshape(-1, case.vocab_size).mean(0)))
        return target, Drafter("constant", token=least)
    raise ValueError(f"unknown drafter {case.drafter!r}")


def check_sequence_law(
    verify: Verifier, case: SequenceCase, alpha: float, tv: float = TV, power: float = POWER, looks: bool = True
) -> LawCheck:
    """Goodness of fit of speculatively generated sequences to the enumerated autoregressive law (looks and sample
    sizes as in :func:`check_first_token_law`)."""
    target, drafter = sequence_case_models(case)
    law = sequence_law(target, case.length, case.cfg)

    def draw(start: int, count: int) -> torch.Tensor:
        run = run_speculative(target, drafter, case.cfg, count, case.length, case.k, seed=case.seed, verify=verify,
                              cap_drafts=case.cap_drafts, start=start)
        tokens = run.tokens
        valid = ((tokens >= 0) & (tokens < case.vocab_size)).all(dim=1)
        counts = sequence_histogram(tokens[valid], case.vocab_size)
        return torch.cat([counts, counts.new_tensor([int((~valid).sum())])])

    return _law_check(draw, law, law_plan(law, alpha, tv, power, looks))


def _sequence_cases() -> tuple[SequenceCase, ...]:
    cfgs = [SamplingConfig(1.0), SamplingConfig(0.7, top_k=2), SamplingConfig(2.0, top_p=0.8)]
    cases = []
    seed = 1
    for i, drafter in enumerate(DRAFTERS):
        for j, k in enumerate((1, 3, 5)):
            cfg = cfgs[(i + j) % 3]
            order = 1 + (i + j) % 2
            cases.append(SequenceCase(f"seq-{drafter}-k{k}-{cfg.label()}-o{order}", drafter, k, cfg, seed,
                                      order=order, cap_drafts=k != 5))
            seed += 1
    for drafter in ("close", "greedy"):
        cases.append(SequenceCase(f"seq-{drafter}-k3-greedy", drafter, 3, SamplingConfig(0.0), seed, cheap=True))
        seed += 1
    return tuple(cases)


SEQUENCE_CASES: tuple[SequenceCase, ...] = _sequence_cases()


# ----------------------------------------------------------------------------------------------------
# Narrow design: V = 16, reversed draft ranking, drafts sampled inside the system under test
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NarrowCase:
    """vLLM's narrow shared-stream design: V = 16 at temperature 1, q = the target law's probabilities
    assigned in reverse rank order (q's largest value on p's least likely token).

    Every request has one draft row and one bonus row, both with the case's target logits, at a random
    ``position`` with key ``seed * 2**32 + n``. The draft ``x ~ q`` is drawn by the system under test
    (:func:`draft_proposals`). ``drafts``: "stochastic" (q handed to the verifier) or "deterministic" (x alone,
    a point-mass draft).
    """

    name: str
    drafts: str
    seed: int
    vocab_size: int = 16
    scale: float = 1.5  # target logits ~ normal(0, scale)

    @property
    def cfg(self) -> SamplingConfig:
        return SamplingConfig(1.0)

    def pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(target logits [V] float32, draft law q [V] float32: p's values in reverse rank order)."""
        g = torch.Generator().manual_seed(30_000 + self.seed)
        logits = (torch.randn(self.vocab_size, generator=g) * self.scale).float()
        p = torch.softmax(logits, dim=-1)
        q = torch.empty_like(p)
        q[torch.argsort(p, descending=True)] = torch.sort(p).values
        return logits, q


def narrow_law(case: NarrowCase) -> torch.Tensor:
    """[2V] float64 law of a request's outcome: cell y < V = rejected, first token y; cell V + y = draft
    accepted, bonus token y.

    Stochastic drafts accept x with probability min(q(x), p(x)) in total and reject to y with max(0, p - q);
    deterministic drafts (x ~ q handed alone) accept with q(x) p(x) and reject to y with p(y)(1 - q(y)). The
    bonus token is then an independent draw from p.
    """
    logits, q = case.pair()
    p = step_probs(logits[None, :], case.cfg)[0].double()
    q = q.double()
    if case.drafts == "stochastic":
        reject = torch.clamp(p - q, min=0.0)
        accept = torch.minimum(p, q).sum()
    else:
        reject = p * (1.0 - q)
        accept = (p * q).sum()
    law = torch.cat([reject, accept * p])
    return law / law.sum()


def draft_stream(verify: Verifier) -> int:
    """The Philox stream the system under test draws its drafts on: ``verify.draft_stream`` where the verifier
    declares one (a planted bug does), else the drafters' :data:`philox.STREAM_DRAFT`."""
    return int(getattr(verify, "draft_stream", philox.STREAM_DRAFT))


def draft_proposals(verify: Verifier, q: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """[N] int64 drafts ``x ~ q`` (q [V] at temperature 1), request n keyed by ``(seed[n], position[n])``, drawn
    as the system under test draws its drafts: by ``verify.draft_sampler(draft_logits [N, V] float32,
    temperature [N], seed [N] int64, position [N] int64)`` where the verifier declares one (a peer whose drafter
    samples its own proposals, e.g. vLLM V2's ``gumbel_sample(is_drafting=True)``), else as our drafters draw
    (``reference/drafter.logits_sample``): Gumbel-max with ``philox.uniform_rows(key, position, stream, V)`` on
    :func:`draft_stream`."""
    n, v = seed.numel(), q.numel()
    sampler = getattr(verify, "draft_sampler", None)
    if sampler is not None:
        drafts = sampler(torch.log(q).float().expand(n, v).contiguous(), torch.ones(n), seed, position)
        return drafts.to(torch.int64).cpu()
    u = philox.uniform_rows(seed, position, draft_stream(verify), v)
    return torch.argmax(torch.log(q)[None, :] - torch.log(-torch.log(u)), dim=-1)


def sample_narrow(verify: Verifier, case: NarrowCase, num_requests: int, start: int = 0) -> torch.Tensor:
    """Run ``num_requests`` one-draft requests, trials ``start`` on of the case (seeded with
    :func:`sequential.chunk_seed`); return each one's cell of :func:`narrow_law` [N] (2V: an invalid outcome: a
    token outside [0, V), or an accepted token that is not the draft)."""
    if case.drafts not in ("stochastic", "deterministic"):
        raise ValueError(f"drafts must be 'deterministic' or 'stochastic', got {case.drafts!r}")
    v, n = case.vocab_size, num_requests
    logits, q = case.pair()
    g = torch.Generator().manual_seed(sequential.chunk_seed(case.seed, start))
    seed = sequential.chunk_keys(case.seed, start, n)
    position = torch.randint(0, 1 << 20, (n,), generator=g)
    drafts = draft_proposals(verify, q, seed, position)
    draft_probs = q.expand(n, v).contiguous() if case.drafts == "stochastic" else None
    res = verify(logits.expand(2 * n, v).contiguous(), drafts, torch.arange(n + 1), draft_probs,
                 torch.ones(n), None, None, seed, position)
    out = res.output_token_ids.to(torch.int64)
    accepted = res.num_accepted.to(torch.int64) == 1
    token = torch.where(accepted, out[:, 1], out[:, 0])
    valid = (token >= 0) & (token < v) & (~accepted | (out[:, 0] == drafts))
    return torch.where(valid, token + v * accepted, 2 * v)


def check_narrow_law(
    verify: Verifier, case: NarrowCase, alpha: float, tv: float = TV, power: float = POWER,
    num_samples: int | None = None, looks: bool = True,
) -> LawCheck:
    """Goodness of fit of :func:`sample_narrow`'s cells to :func:`narrow_law`, looks and sample sizes as in
    :func:`check_first_token_law`, or one look at ``num_samples`` trials when given (the power measurements use
    that)."""
    law = narrow_law(case)

    def draw(start: int, count: int) -> torch.Tensor:
        return torch.bincount(sample_narrow(verify, case, count, start), minlength=2 * case.vocab_size + 1)

    return _law_check(draw, law, law_plan(law, alpha, tv, power, looks, num_samples))


NARROW_CASES: tuple[NarrowCase, ...] = (
    NarrowCase("narrow-stoch-V16-reversed", "stochastic", 1),
    NarrowCase("narrow-deter-V16-reversed", "deterministic", 2),
)


def case_by_name(name: str) -> FirstTokenCase | SequenceCase | NarrowCase:
    """Look a case up in :data:`FIRST_TOKEN_CASES`, :data:`SEQUENCE_CASES` or :data:`NARROW_CASES`."""
    for case in FIRST_TOKEN_CASES + SEQUENCE_CASES + NARROW_CASES:
        if case.name == name:
            return case
    raise KeyError(name)


def law_check_for(case: FirstTokenCase | SequenceCase | NarrowCase):
    """The check function of a case's kind: :func:`check_first_token_law`, :func:`check_sequence_law` or
    :func:`check_narrow_law` (each ``(verify, case, alpha, tv, power, looks=True)``)."""
    if isinstance(case, FirstTokenCase):
        return check_first_token_law
    if isinstance(case, SequenceCase):
        return check_sequence_law
    if isinstance(case, NarrowCase):
        return check_narrow_law
    raise TypeError(f"not a law case: {case!r}")


MUTANT_CASES: dict[str, str] = {
    "unnormalised_residual": "first-stoch-T1",
    "coin_reused": "seq-far-k3-T1-o2",
    "draft_temperature_missing": "first-stoch-T2",
    "bonus_wrong_row": "seq-self-k3-T0.7-k2-o2",
    "residual_q_minus_p": "first-stoch-T1",
    "greedy_sampled": "first-deter-greedy",
    "deterministic_resample_with_draft": "first-deter-T1",
    "ratio_inverted": "first-stoch-T1",
    "block_max_score": "first-deter-V40-T1",
    "block_noise_reused": "first-stoch-V40-T1",
    "biased_first_token": "first-stoch-T1",
    "shared_stream": "narrow-stoch-V16-reversed",
    "recovery_reuses_coin": "narrow-stoch-V16-reversed",
    "bonus_on_recovery_stream": "narrow-deter-V16-reversed",
}
"""For each planted bug of :mod:`mutants`, the suite case whose check must reject it (coin_reused needs
several stochastic drafts with varying p/q; bonus_wrong_row needs full acceptance, hence the self drafter; the
shared-stream bugs need the narrow design, whose drafts are sampled inside the system under test)."""
