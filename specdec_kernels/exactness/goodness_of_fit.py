"""Exact and asymptotic goodness-of-fit tests, a false-positive budget and a power calculation.

These are the statistical primitives of the exactness suite: a sampler is lossless when the law of what
it emits equals a known target law, so every statistical test in the suite is a goodness-of-fit test of
observed counts against exact probabilities (or a two-sample test of two samplers' counts), run at a
fixed per-test significance level that comes from one suite-wide false-positive budget.

- :func:`gof_test` picks the exact multinomial test when the number of possible outcomes is small enough
  to enumerate, and Pearson's chi-square with small-expected-count pooling otherwise (or the G-test on
  request). Observing an outcome whose exact probability is 0 gives p-value 0.
- :func:`two_sample_chi2` compares two histograms (e.g. two backends' counts) with the same pooling.
- :class:`FalsePositiveBudget` splits a suite-wide alpha (Bonferroni) across named test cases.
- :func:`sample_size_for_tv` chooses the sample size that detects any total-variation error ``tv`` with a
  given power at a given alpha (formula in its docstring); :func:`chi2_power` evaluates that power.

Every function accepts array-likes (lists, numpy arrays, CPU torch tensors) and returns plain Python
values, so other sampler authors can reuse them without the rest of the package.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy import special, stats

__all__ = [
    "TestResult",
    "FalsePositiveBudget",
    "pool_small_cells",
    "chi2_gof",
    "g_test_gof",
    "multinomial_exact_test",
    "num_compositions",
    "gof_test",
    "two_sample_chi2",
    "total_variation",
    "chi2_power",
    "sample_size_for_tv",
    "least_favourable_alternative",
    "sample_size_for_point_mass",
    "sample_size",
    "SUITE_BUDGET",
]

MIN_EXPECTED = 5.0
EXACT_MAX_OUTCOMES = 200_000


class TestResult(NamedTuple):
    """Outcome of one test: ``pvalue`` is P(statistic at least this extreme | H0)."""

    statistic: float
    df: int
    pvalue: float
    method: str  # "chi2", "g", "exact", "impossible" (an outcome of probability 0 was observed), "degenerate"

    def rejects(self, alpha: float) -> bool:
        """True when H0 is rejected at level ``alpha``."""
        return self.pvalue < alpha


def _as_float_array(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().cpu().double().numpy()
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    return a


def _as_counts(x, name: str) -> np.ndarray:
    a = _as_float_array(x, name)
    if np.any(a != np.round(a)):
        raise ValueError(f"{name} must hold integer counts")
    return a


def _as_probs(x, name: str, size: int) -> np.ndarray:
    p = _as_float_array(x, name)
    if p.size != size:
        raise ValueError(f"{name} must have {size} entries like observed, got {p.size}")
    total = p.sum()
    if not abs(total - 1.0) < 1e-4:
        raise ValueError(f"{name} must sum to 1, got {total!r}")
    return p / total


# ----------------------------------------------------------------------------------------------------
# Suite-wide false-positive budget
# ----------------------------------------------------------------------------------------------------

@dataclass
class FalsePositiveBudget:
    """A suite-wide false-positive rate split evenly (Bonferroni) across at most ``capacity`` named tests.

    Every statistical test of a correct sampler claims one named slot and runs at
    :attr:`per_test_alpha` = ``total_alpha / capacity``; by the union bound the probability that any
    test of a correct sampler fails is at most ``total_alpha``. Claiming more than ``capacity`` distinct
    names raises, so the bound cannot silently break when cases are added (raise the capacity instead:
    sample sizes derived from :attr:`per_test_alpha` grow accordingly). Tests that are *expected* to
    reject (mutants) use :attr:`per_test_alpha` without claiming a slot.
    """

    total_alpha: float
    capacity: int
    _claimed: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.total_alpha < 1:
            raise ValueError(f"total_alpha must be in (0, 1), got {self.total_alpha}")
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {self.capacity!r}")

    @classmethod
    def for_cases(cls, total_alpha: float, names: list[str]) -> FalsePositiveBudget:
        """A budget split across exactly the given case names."""
        if len(set(names)) != len(names):
            raise ValueError("names must be distinct")
        return cls(total_alpha, len(names))

    @property
    def per_test_alpha(self) -> float:
        """Significance level of each test: ``total_alpha / capacity``."""
        return self.total_alpha / self.capacity

    @property
    def claimed(self) -> tuple[str, ...]:
        """Names claimed so far (in this process)."""
        return tuple(self._claimed)

    def claim(self, name: str) -> float:
        """Register test ``name`` against the budget and return its alpha (:attr:`per_test_alpha`)."""
        if name in self._claimed:
            raise ValueError(f"test name {name!r} already claimed a slot of the false-positive budget")
        if len(self._claimed) >= self.capacity:
            raise RuntimeError(
                f"false-positive budget exhausted: {self.capacity} tests already claimed "
                f"{self.total_alpha:g}; raise the capacity (per-test alpha and sample sizes follow)"
            )
        self._claimed.append(name)
        return self.per_test_alpha


SUITE_BUDGET = FalsePositiveBudget(total_alpha=1e-4, capacity=250)
"""The project's exactness-suite budget: every seeded statistical test of a correct sampler, across all
backends and ops, claims a slot; per-test alpha = 1e-4 / 250 = 4e-7."""


# ----------------------------------------------------------------------------------------------------
# Goodness of fit
# ----------------------------------------------------------------------------------------------------

def pool_small_cells(
    observed, expected, min_expected: float = MIN_EXPECTED
) -> tuple[np.ndarray, np.ndarray]:
    """Merge cells whose expected count is below ``min_expected`` so every pooled cell reaches it.

    Cells are merged in order of increasing expected count into one "rest" cell; if the rest cell is
    still below ``min_expected`` the smallest remaining regular cell joins it. Returns
    ``(observed, expected)`` of the pooled cells (the rest cell last). Pooling never raises the
    distance between the laws, so a test on pooled cells is valid (and a little less powerful).
    """
    obs = _as_float_array(observed, "observed")
    exp = _as_float_array(expected, "expected")
    if obs.size != exp.size:
        raise ValueError("observed and expected must have the same number of cells")
    order = np.argsort(exp, kind="stable")
    obs, exp = obs[order], exp[order]
    n_small = int(np.searchsorted(exp, min_expected, side="left"))
    rest_exp = exp[:n_small].sum()
    # The rest cell needs at least min_expected; borrow the smallest regular cells until it has it.
    while n_small < exp.size and 0 < rest_exp < min_expected:
        rest_exp += exp[n_small]
        n_small += 1
    if n_small == 0:
        return obs, exp
    pooled_obs = np.append(obs[n_small:], obs[:n_small].sum())
    pooled_exp = np.append(exp[n_small:], rest_exp)
    return pooled_obs, pooled_exp


def _impossible_or_degenerate(obs: np.ndarray, p: np.ndarray) -> TestResult | None:
    """Handle outcomes of probability 0 and laws with a single possible outcome."""
    if np.any((p == 0) & (obs > 0)):
        return TestResult(math.inf, 0, 0.0, "impossible")
    if np.count_nonzero(p > 0) <= 1:
        return TestResult(0.0, 0, 1.0, "degenerate")
    return None


def _asymptotic(observed, probs, min_expected: float, kind: str) -> TestResult:
    obs = _as_counts(observed, "observed")
    p = _as_probs(probs, "probs", obs.size)
    special_case = _impossible_or_degenerate(obs, p)
    if special_case is not None:
        return special_case
    n = obs.sum()
    keep = p > 0
    pooled_obs, pooled_exp = pool_small_cells(obs[keep], n * p[keep], min_expected)
    df = pooled_obs.size - 1
    if df < 1:
        return TestResult(0.0, 0, 1.0, "degenerate")
    if kind == "chi2":
        statistic = float(np.sum((pooled_obs - pooled_exp) ** 2 / pooled_exp))
    else:
        statistic = float(2.0 * np.sum(special.xlogy(pooled_obs, pooled_obs / pooled_exp)))
    return TestResult(statistic, df, float(stats.chi2.sf(statistic, df)), kind)


def chi2_gof(observed, probs, min_expected: float = MIN_EXPECTED) -> TestResult:
    """Pearson chi-square goodness of fit of counts ``observed`` [K] to probabilities ``probs`` [K].

    Cells of probability 0 drop out (observing one gives p-value 0); cells with expected count below
    ``min_expected`` are pooled (:func:`pool_small_cells`); df = pooled cells - 1.
    """
    return _asymptotic(observed, probs, min_expected, "chi2")


def g_test_gof(observed, probs, min_expected: float = MIN_EXPECTED) -> TestResult:
    """Likelihood-ratio (G) goodness of fit, same cell handling as :func:`chi2_gof`."""
    return _asymptotic(observed, probs, min_expected, "g")


def num_compositions(n: int, k: int) -> int:
    """Number of count vectors of ``k`` cells summing to ``n``: C(n + k - 1, k - 1)."""
    return math.comb(n + k - 1, k - 1) if k > 0 else int(n == 0)


def _compositions(n: int, k: int) -> np.ndarray:
    """[C(n+k-1, k-1), k] all count vectors of k cells summing to n (stars and bars)."""
    bars = np.array(list(itertools.combinations(range(n + k - 1), k - 1)), dtype=np.int64)
    bars = bars.reshape(-1, k - 1)
    edges = np.concatenate(
        [np.full((bars.shape[0], 1), -1), bars, np.full((bars.shape[0], 1), n + k - 1)], axis=1
    )
    return np.diff(edges, axis=1) - 1


def multinomial_exact_test(observed, probs, max_outcomes: int = EXACT_MAX_OUTCOMES) -> TestResult:
    """Exact multinomial test: p-value = P(outcome no more likely than the observed one | H0).

    Enumerates every count vector over the cells of positive probability (at most ``max_outcomes`` of
    them, else ValueError). The statistic is -log P(observed). Valid for any n; use it when expected
    counts are too small for the chi-square approximation.
    """
    obs = _as_counts(observed, "observed")
    p = _as_probs(probs, "probs", obs.size)
    special_case = _impossible_or_degenerate(obs, p)
    if special_case is not None:
        return special_case
    keep = p > 0
    obs, p = obs[keep].astype(np.int64), p[keep]
    n, k = int(obs.sum()), obs.size
    total = num_compositions(n, k)
    if total > max_outcomes:
        raise ValueError(
            f"exact multinomial test needs {total} outcomes (> max_outcomes={max_outcomes}); use chi2_gof"
        )
    outcomes = _compositions(n, k)
    log_p = np.log(p)

    def log_pmf(x: np.ndarray) -> np.ndarray:
        return special.gammaln(n + 1) - special.gammaln(x + 1).sum(-1) + (x * log_p).sum(-1)

    all_log = log_pmf(outcomes)
    obs_log = float(log_pmf(obs[None, :])[0])
    # Relative tolerance so that outcomes tied with the observed one in exact arithmetic count as ties.
    tol = 1e-9 * max(1.0, abs(obs_log))
    pvalue = float(np.exp(all_log[all_log <= obs_log + tol]).sum())
    return TestResult(-obs_log, k - 1, min(1.0, pvalue), "exact")


def gof_test(
    observed,
    probs,
    method: str = "auto",
    min_expected: float = MIN_EXPECTED,
    max_outcomes: int = EXACT_MAX_OUTCOMES,
) -> TestResult:
    """Goodness of fit of ``observed`` counts to ``probs``: exact when feasible, else pooled chi-square.

    ``method``: "auto" (exact multinomial if the outcomes over the cells of positive probability number
    at most ``max_outcomes``, else Pearson chi-square with pooling), "exact", "chi2" or "g".
    """
    if method == "exact":
        return multinomial_exact_test(observed, probs, max_outcomes)
    if method == "chi2":
        return chi2_gof(observed, probs, min_expected)
    if method == "g":
        return g_test_gof(observed, probs, min_expected)
    if method != "auto":
        raise ValueError(f"method must be 'auto', 'exact', 'chi2' or 'g', got {method!r}")
    obs = _as_counts(observed, "observed")
    p = _as_probs(probs, "probs", obs.size)
    if num_compositions(int(obs.sum()), int(np.count_nonzero(p > 0))) <= max_outcomes:
        return multinomial_exact_test(obs, p, max_outcomes)
    return chi2_gof(obs, p, min_expected)


def two_sample_chi2(counts_a, counts_b, min_expected: float = MIN_EXPECTED) -> TestResult:
    """Chi-square test that two histograms [K] come from the same (unknown) law (2 x K contingency).

    Cells empty in both samples drop out; cells whose expected count in either sample is below
    ``min_expected`` are pooled. df = pooled cells - 1.
    """
    a = _as_counts(counts_a, "counts_a")
    b = _as_counts(counts_b, "counts_b")
    if a.size != b.size:
        raise ValueError("counts_a and counts_b must have the same number of cells")
    n_a, n_b = a.sum(), b.sum()
    if n_a == 0 or n_b == 0:
        raise ValueError("both samples must be non-empty")
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    share = (a + b) / (n_a + n_b)
    # Pool on the smaller sample's expected counts (the binding one), carrying both samples along.
    small = min(n_a, n_b)
    order = np.argsort(share, kind="stable")
    a, b, share = a[order], b[order], share[order]
    pooled_a, pooled_exp = pool_small_cells(a, share * small, min_expected)
    pooled_b, _ = pool_small_cells(b, share * small, min_expected)
    if pooled_a.size < 2:
        return TestResult(0.0, 0, 1.0, "degenerate")
    table = np.stack([pooled_a, pooled_b])
    statistic, pvalue, df, _ = stats.chi2_contingency(table, correction=False)
    return TestResult(float(statistic), int(df), float(pvalue), "chi2")


def total_variation(p, q) -> float:
    """Total-variation distance 0.5 * sum |p - q| between two laws on the same cells."""
    a = _as_float_array(p, "p")
    b = _as_float_array(q, "q")
    if a.size != b.size:
        raise ValueError("p and q must have the same number of cells")
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


# ----------------------------------------------------------------------------------------------------
# Power
# ----------------------------------------------------------------------------------------------------

def chi2_power(n: int, tv: float, df: int, alpha: float) -> float:
    """Power of Pearson's chi-square (df degrees of freedom, level alpha) against any law at TV >= tv.

    Under an alternative p1 the statistic is approximately noncentral chi-square with noncentrality
    ``lambda = n * sum((p1 - p0)**2 / p0)``. By Cauchy-Schwarz,
    ``(sum |p1 - p0|)**2 <= sum((p1 - p0)**2 / p0) * sum(p0)``, so ``lambda >= n * (2 * tv)**2`` for
    every alternative at total-variation distance tv: the power is at least
    ``P(ncx2(df, 4 n tv^2) > chi2.isf(alpha, df))`` (equality for the least favourable alternative,
    :func:`least_favourable_alternative`).
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    critical = stats.chi2.isf(alpha, df)
    return float(stats.ncx2.sf(critical, df, 4.0 * n * tv * tv))


def sample_size_for_tv(tv: float = 0.02, df: int = 5, alpha: float = 5e-7, power: float = 0.999) -> int:
    """Smallest n such that the chi-square test at ``alpha`` detects any TV error >= ``tv`` w.p. >= ``power``.

    Solves ``P(ncx2(df, lambda) > chi2.isf(alpha, df)) = power`` for the noncentrality ``lambda`` and
    returns ``ceil(lambda / (4 tv^2))`` (see :func:`chi2_power` for the bound). ``df`` is the number of
    tested cells minus one; pass an upper bound when pooling may reduce it (power grows as df shrinks
    for fixed lambda, so the bound is conservative).
    """
    if not 0 < tv <= 1:
        raise ValueError(f"tv must be in (0, 1], got {tv}")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("alpha and power must be in (0, 1)")
    critical = stats.chi2.isf(alpha, df)
    lo, hi = 0.0, 1.0
    while stats.ncx2.sf(critical, df, hi) < power:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if stats.ncx2.sf(critical, df, mid) < power:
            lo = mid
        else:
            hi = mid
    return int(math.ceil(hi / (4.0 * tv * tv)))


def least_favourable_alternative(p0, tv: float) -> np.ndarray:
    """A law at total variation ``tv`` from ``p0`` whose chi-square noncentrality is n * (2 tv)^2.

    Moves mass proportionally to p0 from one half of the cells (by probability) to the other: the
    equality case of the Cauchy-Schwarz bound in :func:`chi2_power`. Exact when p0 splits into two
    groups of equal mass (e.g. uniform over an even number of cells).
    """
    p = _as_float_array(p0, "p0")
    p = p / p.sum()
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    sign = np.where(cum - p[order] < 0.5, 1.0, -1.0)
    plus = p[order][sign > 0].sum()
    minus = 1.0 - plus
    if minus <= 0 or tv > min(plus, minus):
        raise ValueError("p0 cannot be split to move that much mass")
    delta = np.where(sign > 0, p[order] * tv / plus, -p[order] * tv / minus)
    out = np.empty_like(p)
    out[order] = p[order] + delta
    return out


def sample_size_for_point_mass(tv: float = 0.02, power: float = 0.999) -> int:
    """Smallest n such that a sampler putting mass >= ``tv`` off a one-outcome law is caught w.p. >= power.

    Any observed outcome of probability 0 gives p-value 0, so power = 1 - (1 - tv)^n.
    """
    if not 0 < tv < 1 or not 0 < power < 1:
        raise ValueError("tv and power must be in (0, 1)")
    return int(math.ceil(math.log1p(-power) / math.log1p(-tv)))


def sample_size(probs, alpha: float, tv: float = 0.02, power: float = 0.999) -> int:
    """Sample size for a goodness-of-fit test against the law ``probs`` (cells of probability 0 excluded).

    One possible outcome: :func:`sample_size_for_point_mass`; else :func:`sample_size_for_tv` with
    df = (number of cells of positive probability) - 1.
    """
    p = _as_float_array(probs, "probs")
    support = int(np.count_nonzero(p > 0))
    if support == 0:
        raise ValueError("probs has no positive cell")
    if support == 1:
        return sample_size_for_point_mass(tv, power)
    return sample_size_for_tv(tv, support - 1, alpha, power)
