"""Two peers' exactness-test designs, written anew over our verifier interface, to measure our suite against.

Each suite takes a *verifier* (``verify_chain``'s positional signature, as in :mod:`.chain_law`; optional
``draft_stream`` / ``draft_sampler`` attributes say how the system under test draws its own drafts) and returns
a :class:`SuiteRun`: every test it ran with its statistic, threshold, p-value, trial count and seconds.

- :func:`vllm_v2_suite` follows the design of vLLM's Model Runner V2 rejection-sampler tests
  (``tests/v1/spec_decode/test_probabilistic_rejection_sampler_utils.py``, and the narrow test of vLLM
  PR #54282). *Wide*: one random target and one random draft logit vector over a wide vocabulary, drafts drawn
  outside the system from the draft law (``torch.multinomial``), k in {1, 3} drafts per trial at temperature
  in {0.6, 1}, trials = 10 x V; the emitted token at every position (over the trials that reach it) against
  the target law by Pearson chi-square, cells with expected count below 5 pooled into one, rejecting when
  chi2 > df + 10 sqrt(2 df) (about ten standard deviations). *Greedy*: temperature 0, k in {1, 3}: every
  emitted token is the target argmax. *Narrow*: V = 16, the draft law the target's probabilities in reverse
  rank order, one draft per trial drawn *inside* the system (:func:`chain_law.draft_proposals`), 200,000
  trials, each position's tokens against the target law with the same threshold.
- :func:`deepspec_pr48_suite` follows the design of DeepSpec PR #48 (``test_speculative_sampling_exactness``):
  CPU only, 20,000 rounds of k = 3 drafts with proposals drawn outside the system from the declared draft law
  (a different target and draft law per position), the committed token at every position against a float64
  reference law by chi-square at a per-test false-alarm rate of 1e-9; and its *negative control*: proposals
  drawn from a law other than the declared one must be rejected at position 0; the control's law is chosen
  from the exact position-0 law so that its noncentrality is the PR's 356 (:func:`deepspec_control`).

Only the designs are the peers'; sizes can be reduced (the arguments; :data:`VLLM_V2_SIZES` and
:data:`DEEPSPEC_PR48_SIZES` hold the peers' own), which the power table states.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from scipy import stats

from .chain_law import draft_proposals
from .markov_models import Verifier

__all__ = ["PeerTest", "SuiteRun", "VllmV2Sizes", "DeepSpecSizes", "VLLM_V2_SIZES", "DEEPSPEC_PR48_SIZES",
           "pooled_chi2", "ten_sigma_threshold", "vllm_v2_suite", "deepspec_pr48_suite",
           "deepspec_control", "DEEPSPEC_CONTROL_NONCENTRALITY"]

MIN_EXPECTED = 5.0
DEEPSPEC_FALSE_ALARM = 1e-9
DEEPSPEC_CONTROL_NONCENTRALITY = 356.0  # the PR's analytic noncentrality of its negative control
MAX_CHUNK_ENTRIES = 1 << 25  # logits entries per verifier call (128 MiB of float32): wide suites run in chunks


@dataclass(frozen=True)
class PeerTest:
    """One test of a peer design: ``rejects`` when ``statistic > threshold`` (or an invalid token appeared)."""

    name: str
    statistic: float
    df: int
    threshold: float
    pvalue: float
    trials: int
    seconds: float

    @property
    def rejects(self) -> bool:
        return self.statistic > self.threshold


@dataclass(frozen=True)
class SuiteRun:
    """The tests a suite ran, in order; with ``stop_at_first_rejection`` it stops at the first that rejects.
    ``control``: the negative control's test (DeepSpec design), which must reject for the suite to be sound."""

    suite: str
    tests: tuple[PeerTest, ...]
    control: PeerTest | None = None
    sizes: dict = field(default_factory=dict)

    @property
    def caught(self) -> bool:
        return any(t.rejects for t in self.tests)

    @property
    def rejecting(self) -> PeerTest | None:
        return next((t for t in self.tests if t.rejects), None)

    @property
    def smallest_p(self) -> float:
        return min(t.pvalue for t in self.tests)

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tests)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.tests)


def ten_sigma_threshold(df: int) -> float:
    """vLLM's rejection threshold: df + 10 sqrt(2 df), ten standard deviations above chi2's mean."""
    return df + 10.0 * math.sqrt(2.0 * df)


def pooled_chi2(tokens: torch.Tensor, law: torch.Tensor, min_expected: float = MIN_EXPECTED
                ) -> tuple[float, int]:
    """(Pearson chi2, df) of ``tokens`` [n] against ``law`` [V] float64, cells with expected count below
    ``min_expected`` pooled into one (dropped when the pool itself is below it). A token outside [0, V) gives
    chi2 = inf; fewer than two cells give (0, 0)."""
    v, n = law.numel(), tokens.numel()
    if n == 0:
        return 0.0, 0
    t = tokens.to(torch.int64)
    if bool(((t < 0) | (t >= v)).any()):
        return math.inf, max(v - 1, 1)
    observed = torch.bincount(t, minlength=v).double()
    expected = law.double() * n
    keep = expected >= min_expected
    obs, exp = observed[keep], expected[keep]
    pool_exp = expected[~keep].sum()
    if pool_exp >= min_expected:
        obs = torch.cat([obs, observed[~keep].sum()[None]])
        exp = torch.cat([exp, pool_exp[None]])
    df = obs.numel() - 1
    if df < 1:
        return 0.0, 0
    return float(((obs - exp) ** 2 / exp).sum()), df


def _test(name: str, tokens: torch.Tensor, law: torch.Tensor, threshold_of: Callable[[int], float],
          trials: int, started: float) -> PeerTest:
    chi2, df = pooled_chi2(tokens, law)
    p = 1.0 if df == 0 else (0.0 if math.isinf(chi2) else float(stats.chi2.sf(chi2, df)))
    return PeerTest(name, chi2, df, threshold_of(df) if df else math.inf, p, trials, time.perf_counter() - started)


def _run_trials(verify: Verifier, target_logits: torch.Tensor, draft_probs: torch.Tensor | None,
                drafts: torch.Tensor, temperature: float, seed: torch.Tensor, position: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``n`` trials of ``k`` drafts each (``target_logits`` [k + 1, V]: one row per position, the same
    for every trial; ``draft_probs`` [k, V] or None; ``drafts`` [n, k]), in chunks of at most
    :data:`MAX_CHUNK_ENTRIES` logits. Returns (output_token_ids [n, k + 1] int64, num_accepted [n] int64)."""
    n, k = drafts.shape
    v = target_logits.shape[-1]
    chunk = max(1, MAX_CHUNK_ENTRIES // ((k + 1) * v))
    outs, accs = [], []
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        m = hi - lo
        res = verify(target_logits.repeat(m, 1), drafts[lo:hi].reshape(-1), torch.arange(m + 1) * k,
                     None if draft_probs is None else draft_probs.repeat(m, 1), torch.full((m,), temperature),
                     None, None, seed[lo:hi], position[lo:hi])
        outs.append(res.output_token_ids.to(torch.int64))
        accs.append(res.num_accepted.to(torch.int64))
    return torch.cat(outs), torch.cat(accs)


def _law(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float64 law of ``logits`` at ``temperature`` (one-hot argmax at 0)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(torch.argmax(logits, -1), logits.shape[-1]).double()
    return torch.softmax(logits.double() / temperature, dim=-1)


def _emitted(out: torch.Tensor, accepted: torch.Tensor, pos: int) -> torch.Tensor:
    """Tokens emitted at position ``pos`` (trials that accepted at least ``pos`` drafts)."""
    return out[accepted >= pos, pos]


# ----------------------------------------------------------------------------------------------------
# vLLM Model Runner V2 design
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VllmV2Sizes:
    """``wide_vocab`` (trials = ``trials_per_token`` x V per configuration), the configurations (k, T), the
    greedy k, and the narrow test's trials."""

    wide_vocab: int = 4096
    trials_per_token: int = 10
    wide_configs: tuple[tuple[int, float], ...] = ((1, 0.6), (3, 0.6), (1, 1.0), (3, 1.0))
    greedy_steps: tuple[int, ...] = (1, 3)
    narrow_trials: int = 200_000
    narrow_vocab: int = 16


VLLM_V2_SIZES = VllmV2Sizes()
"""vLLM's own sizes: V = 4096 with 40,960 trials per configuration; the narrow test's 200,000 trials."""


def _vllm_wide(verify: Verifier, v: int, trials: int, k: int, temperature: float, seed: int) -> list[PeerTest]:
    started = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(v, generator=g)
    draft_law = _law(torch.randn(v, generator=g), temperature if temperature > 0 else 1.0).float()
    greedy = temperature == 0
    drafts = torch.multinomial(draft_law, trials * k, replacement=True, generator=g).view(trials, k)
    keys = seed * (1 << 32) + torch.arange(trials, dtype=torch.int64)
    position = torch.arange(trials, dtype=torch.int64) * (k + 1)
    out, accepted = _run_trials(verify, target.expand(k + 1, v), None if greedy else draft_law.expand(k, v),
                                drafts, temperature, keys, position)
    law = _law(target, temperature)
    label = f"wide-V{v}-k{k}-T{temperature:g}"
    if greedy:
        emitted = torch.arange(k + 1)[None, :] <= accepted[:, None]
        wrong = int((emitted & (out != int(torch.argmax(target)))).sum())
        return [PeerTest(f"greedy-V{v}-k{k}", float(wrong), 0, 0.0, 0.0 if wrong else 1.0, trials,
                         time.perf_counter() - started)]
    tests = []
    for pos in range(k + 1):
        tests.append(_test(f"{label}-pos{pos}", _emitted(out, accepted, pos), law, ten_sigma_threshold,
                           trials if pos == 0 else 0, started))
        started = time.perf_counter()
    return tests


def _reversed_rank(p: torch.Tensor) -> torch.Tensor:
    """p's values in reverse rank order: the largest on p's least likely token."""
    q = torch.empty_like(p)
    q[torch.argsort(p, descending=True)] = torch.sort(p).values
    return q


def _vllm_narrow(verify: Verifier, v: int, trials: int, seed: int) -> list[PeerTest]:
    started = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(v, generator=g) * 1.5
    p = torch.softmax(target, -1)
    q = _reversed_rank(p)
    keys = seed * (1 << 32) + torch.arange(trials, dtype=torch.int64)
    position = torch.randint(0, 1 << 20, (trials,), generator=g)
    drafts = draft_proposals(verify, q, keys, position)  # drawn inside the system under test
    out, accepted = _run_trials(verify, target.expand(2, v), q[None, :], drafts[:, None], 1.0, keys, position)
    law = _law(target, 1.0)
    tests = []
    for pos in range(2):
        tests.append(_test(f"narrow-V{v}-reversed-pos{pos}", _emitted(out, accepted, pos), law,
                           ten_sigma_threshold, trials if pos == 0 else 0, started))
        started = time.perf_counter()
    return tests


def vllm_v2_suite(verify: Verifier, sizes: VllmV2Sizes = VLLM_V2_SIZES, seed: int = 42,
                  stop_at_first_rejection: bool = False) -> SuiteRun:
    """vLLM V2's design (module docstring): the wide tests per configuration, the greedy tests, the narrow test,
    in that order; each configuration's seed is ``seed`` plus its index."""
    v = sizes.wide_vocab
    trials = sizes.trials_per_token * v
    parts: list[Callable[[], list[PeerTest]]] = []
    for i, (k, temperature) in enumerate(sizes.wide_configs):
        parts.append(lambda k=k, t=temperature, i=i: _vllm_wide(verify, v, trials, k, t, seed + i))
    for i, k in enumerate(sizes.greedy_steps):
        parts.append(lambda k=k, i=i: _vllm_wide(verify, v, trials, k, 0.0, seed + 10 + i))
    parts.append(lambda: _vllm_narrow(verify, sizes.narrow_vocab, sizes.narrow_trials, seed + 20))
    tests: list[PeerTest] = []
    for part in parts:
        tests += part()
        if stop_at_first_rejection and any(t.rejects for t in tests):
            break
    return SuiteRun("vllm-v2", tuple(tests), sizes=dict(sizes.__dict__))


# ----------------------------------------------------------------------------------------------------
# DeepSpec PR #48 design
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeepSpecSizes:
    """Rounds, drafts per round and vocabulary of the lossless test and of its negative control."""

    rounds: int = 20_000
    steps: int = 3
    vocab: int = 16


DEEPSPEC_PR48_SIZES = DeepSpecSizes()
"""DeepSpec PR #48's 20,000 rounds (its description names no k or V: 3 and 16 here)."""


def _deepspec_laws(sizes: DeepSpecSizes, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(target logits [k + 1, V], declared draft law [k, V]): a different pair per position."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(sizes.steps + 1, sizes.vocab, generator=g) * 1.5
    draft = torch.softmax(torch.randn(sizes.steps, sizes.vocab, generator=g) * 1.5, -1)
    return target, draft


def _position0_law(p: torch.Tensor, q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Exact law of the first committed token of a lossless verifier when proposals come from r but the
    declared draft law is q: ``l(y) = r(y) a(y) + (1 - sum_x r(x) a(x)) norm(max(0, p - q))(y)``, a = min(1, p/q)."""
    a = torch.where(q > 0, torch.clamp(p / q, max=1.0), torch.ones_like(p))
    residual = torch.clamp(p - q, min=0.0)
    mass = residual.sum()
    rest = residual / mass if mass > 0 else torch.zeros_like(p)
    return r * a + (1.0 - (r * a).sum()) * rest


def deepspec_control(sizes: DeepSpecSizes = DEEPSPEC_PR48_SIZES, seed: int = 0) -> tuple[float, float]:
    """(mixing weight w, noncentrality) of the negative control: proposals come from ``(1 - w) q + w q_rev``
    (q_rev: the declared law q in reverse rank order) with w chosen so that position 0's noncentrality
    ``rounds * sum((l - p)^2 / p)`` (``l`` the exact law, linear in the proposal law, so quadratic in w) is
    DeepSpec's :data:`DEEPSPEC_CONTROL_NONCENTRALITY` (w at most 1)."""
    target, draft = _deepspec_laws(sizes, seed)
    p, q = _law(target[0], 1.0), draft[0].double()
    full = _position0_law(p, q, _reversed_rank(q))
    unit = float(sizes.rounds * ((full - p) ** 2 / p).sum())  # noncentrality at w = 1
    w = min(1.0, math.sqrt(DEEPSPEC_CONTROL_NONCENTRALITY / unit))
    law = _position0_law(p, q, (1 - w) * q + w * _reversed_rank(q))
    return w, float(sizes.rounds * ((law - p) ** 2 / p).sum())


def _control_proposal_law(draft: torch.Tensor, weight: float) -> torch.Tensor:
    """The law the negative control draws proposals from instead of the declared one."""
    return torch.stack([(1 - weight) * row + weight * _reversed_rank(row) for row in draft])


def _deepspec_round(verify: Verifier, sizes: DeepSpecSizes, seed: int, control: bool) -> list[PeerTest]:
    started = time.perf_counter()
    target, draft = _deepspec_laws(sizes, seed)
    proposal = _control_proposal_law(draft, deepspec_control(sizes, seed)[0]) if control else draft
    g = torch.Generator().manual_seed(seed + 1)
    n, k = sizes.rounds, sizes.steps
    drafts = torch.stack([torch.multinomial(proposal[j], n, replacement=True, generator=g) for j in range(k)], 1)
    keys = seed * (1 << 32) + torch.arange(n, dtype=torch.int64)
    position = torch.randint(0, 1 << 20, (n,), generator=g)
    out, accepted = _run_trials(verify, target, draft, drafts, 1.0, keys, position)
    threshold = lambda df: float(stats.chi2.isf(DEEPSPEC_FALSE_ALARM, df))  # noqa: E731
    positions = range(1) if control else range(k + 1)
    tests = []
    for pos in positions:
        name = "negative-control-pos0" if control else f"lossless-k{k}-V{sizes.vocab}-pos{pos}"
        tests.append(_test(name, _emitted(out, accepted, pos), _law(target[pos], 1.0), threshold,
                           n if pos == 0 else 0, started))
        started = time.perf_counter()
    return tests


def deepspec_pr48_suite(verify: Verifier, sizes: DeepSpecSizes = DEEPSPEC_PR48_SIZES, seed: int = 0,
                        stop_at_first_rejection: bool = False) -> SuiteRun:
    """DeepSpec PR #48's design (module docstring): the lossless test at every position, then the negative
    control (run on the same verifier; it must reject for the suite's verdict to mean anything)."""
    tests = _deepspec_round(verify, sizes, seed, control=False)
    if stop_at_first_rejection and any(t.rejects for t in tests):
        return SuiteRun("deepspec-pr48", tuple(tests), None, dict(sizes.__dict__))
    (control,) = _deepspec_round(verify, sizes, seed, control=True)
    return SuiteRun("deepspec-pr48", tuple(tests), control, dict(sizes.__dict__))
