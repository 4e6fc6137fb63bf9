"""The statistical primitives themselves: validity (calibration under H0) and power (vs simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from specdec_kernels.exactness import goodness_of_fit as gof

# Seeded simulations; a deviation this unlikely under a correct implementation fails the test.
SIM_ALPHA = 1e-4


def _binomial_upper_ok(rejections: int, trials: int, rate: float) -> bool:
    """False when ``rejections`` is significantly above ``trials * rate`` (one-sided, SIM_ALPHA)."""
    return sps.binom.sf(rejections - 1, trials, rate) > SIM_ALPHA


# ----------------------------------------------------------------------------------------------------
# Goodness of fit
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["chi2", "g"])
def test_asymptotic_pvalues_uniform_under_h0(method):
    rng = np.random.default_rng(11)
    p = np.array([0.3, 0.25, 0.2, 0.15, 0.07, 0.03])
    pvalues = [gof.gof_test(rng.multinomial(2000, p), p, method=method).pvalue for _ in range(1500)]
    assert sps.kstest(pvalues, "uniform").pvalue > SIM_ALPHA


@pytest.mark.slow
def test_pooled_chi2_is_valid_with_small_expected_counts():
    """Many cells with expected counts < 5: pooling keeps the size at or below alpha (within noise)."""
    rng = np.random.default_rng(12)
    p = np.array([0.5, 0.3] + [0.2 / 20] * 20)  # twenty cells of expected 0.6 at n = 60
    pvalues = np.array([gof.chi2_gof(rng.multinomial(60, p), p).pvalue for _ in range(3000)])
    for a in (0.01, 0.05, 0.2):
        assert _binomial_upper_ok(int((pvalues < a).sum()), pvalues.size, a)
    assert (pvalues < 0.05).mean() > 0.02  # not vacuous either


def test_exact_test_matches_brute_force_and_binomtest():
    p = np.array([0.5, 0.3, 0.2])
    obs = np.array([1, 1, 4])
    outcomes = [np.array(x) for x in np.ndindex(7, 7, 7) if sum(x) == 6]
    pmf = np.array([sps.multinomial.pmf(x, 6, p) for x in outcomes])
    p_obs = sps.multinomial.pmf(obs, 6, p)
    expected = pmf[pmf <= p_obs * (1 + 1e-9)].sum()
    assert gof.multinomial_exact_test(obs, p).pvalue == pytest.approx(expected, rel=1e-9)
    for k in (3, 10, 17):
        got = gof.multinomial_exact_test([k, 40 - k], [0.3, 0.7]).pvalue
        assert got == pytest.approx(sps.binomtest(k, 40, 0.3).pvalue, rel=1e-6)


@pytest.mark.slow
def test_exact_test_is_valid():
    rng = np.random.default_rng(13)
    p = np.array([0.6, 0.25, 0.1, 0.05])
    pvalues = np.array([gof.multinomial_exact_test(rng.multinomial(12, p), p).pvalue for _ in range(2000)])
    for a in (0.01, 0.05, 0.2):
        assert _binomial_upper_ok(int((pvalues <= a).sum()), pvalues.size, a)


def test_gof_auto_method_and_special_cells():
    assert gof.gof_test([3, 2, 1], [0.5, 0.3, 0.2]).method == "exact"
    assert gof.gof_test([30000, 20000, 10000], [0.5, 0.3, 0.2]).method == "chi2"
    impossible = gof.gof_test([10, 0, 1], [0.5, 0.5, 0.0])
    assert impossible.pvalue == 0.0 and impossible.method == "impossible"
    assert gof.gof_test([10, 0, 0], [1.0, 0.0, 0.0]).pvalue == 1.0
    assert gof.gof_test([5, 5, 0], [0.5, 0.5, 0.0], method="chi2").df == 1  # zero cells drop out
    assert gof.gof_test([500, 500], [0.9, 0.1]).rejects(1e-6)
    with pytest.raises(ValueError, match="probs"):
        gof.gof_test([1, 2], [0.5, 0.6])
    with pytest.raises(ValueError, match="method"):
        gof.gof_test([1, 2], [0.5, 0.5], method="ks")
    with pytest.raises(ValueError, match="observed"):
        gof.gof_test([1.5, 2], [0.5, 0.5])


def test_pool_small_cells_reaches_min_expected_and_preserves_totals():
    rng = np.random.default_rng(14)
    for _ in range(200):
        k = int(rng.integers(2, 30))
        exp = rng.dirichlet(np.full(k, 0.3)) * rng.integers(5, 200)
        obs = rng.poisson(exp)
        po, pe = gof.pool_small_cells(obs, exp)
        assert po.sum() == obs.sum() and pe.sum() == pytest.approx(exp.sum())
        if exp.sum() >= 5:
            assert pe.min() >= 5 - 1e-9


@pytest.mark.slow
def test_two_sample_chi2_calibration_and_power():
    rng = np.random.default_rng(15)
    p = np.array([0.4, 0.3, 0.2, 0.05, 0.03, 0.02])
    pvalues = [gof.two_sample_chi2(rng.multinomial(3000, p), rng.multinomial(5000, p)).pvalue
               for _ in range(1500)]
    assert sps.kstest(pvalues, "uniform").pvalue > SIM_ALPHA
    q = gof.least_favourable_alternative(p, 0.05)
    assert gof.two_sample_chi2(rng.multinomial(20000, p), rng.multinomial(20000, q)).rejects(1e-6)
    with pytest.raises(ValueError, match="same number"):
        gof.two_sample_chi2([1, 2], [1, 2, 3])


def test_total_variation():
    assert gof.total_variation([0.5, 0.5], [1.0, 0.0]) == pytest.approx(0.5)
    q = gof.least_favourable_alternative([0.25] * 4, 0.02)
    assert gof.total_variation([0.25] * 4, q) == pytest.approx(0.02)


# ----------------------------------------------------------------------------------------------------
# Budget
# ----------------------------------------------------------------------------------------------------

def test_false_positive_budget():
    budget = gof.FalsePositiveBudget(1e-4, capacity=4)
    assert budget.per_test_alpha == pytest.approx(2.5e-5)
    assert budget.claim("a") == budget.per_test_alpha
    with pytest.raises(ValueError, match="already claimed"):
        budget.claim("a")
    for name in "bcd":
        budget.claim(name)
    with pytest.raises(RuntimeError, match="exhausted"):
        budget.claim("e")
    assert budget.claimed == ("a", "b", "c", "d")
    assert gof.FalsePositiveBudget.for_cases(1e-3, ["x", "y"]).per_test_alpha == pytest.approx(5e-4)
    assert gof.SUITE_BUDGET.per_test_alpha == pytest.approx(4e-7)
    with pytest.raises(ValueError, match="total_alpha"):
        gof.FalsePositiveBudget(0.0, 3)


# ----------------------------------------------------------------------------------------------------
# Power
# ----------------------------------------------------------------------------------------------------

def _simulated_power(n: int, p0: np.ndarray, p1: np.ndarray, alpha: float, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, p1, size=trials)
    statistic = ((counts - n * p0) ** 2 / (n * p0)).sum(-1)
    return float((statistic > sps.chi2.isf(alpha, p0.size - 1)).mean())


def test_power_calculation_matches_simulation():
    """At the least favourable alternative the simulated power equals the noncentral chi-square power."""
    p0 = np.full(6, 1 / 6)
    alpha, tv = 1e-3, 0.05
    n = gof.sample_size_for_tv(tv, df=5, alpha=alpha, power=0.9)
    assert gof.chi2_power(n, tv, 5, alpha) >= 0.9 > gof.chi2_power(n - 2, tv, 5, alpha)
    p1 = gof.least_favourable_alternative(p0, tv)
    trials = 4000
    sim = _simulated_power(n, p0, p1, alpha, trials, seed=16)
    sd = math.sqrt(0.9 * 0.1 / trials)
    assert abs(sim - gof.chi2_power(n, tv, 5, alpha)) < 4.5 * sd
    # Any other alternative at the same TV is detected at least as often (the bound is a bound).
    p2 = p0.copy()
    p2[0] += tv
    p2[1] -= tv
    assert _simulated_power(n, p0, p2, alpha, trials, seed=17) >= 0.9 - 4.5 * sd


def test_suite_design_point_power():
    """The suite's own sample size (TV 0.02, power 0.999, per-test alpha) is confirmed by simulation."""
    alpha = gof.SUITE_BUDGET.per_test_alpha
    p0 = np.full(6, 1 / 6)
    n = gof.sample_size_for_tv(0.02, df=5, alpha=alpha, power=0.999)
    assert 40_000 < n < 60_000
    sim = _simulated_power(n, p0, gof.least_favourable_alternative(p0, 0.02), alpha, 3000, seed=18)
    assert sim >= 0.995


def test_sample_sizes():
    alpha = 4e-7
    sizes = [gof.sample_size_for_tv(0.02, df, alpha) for df in (1, 5, 20, 80)]
    assert sizes == sorted(sizes)
    assert gof.sample_size_for_tv(0.01, 5, alpha) > 3.9 * gof.sample_size_for_tv(0.02, 5, alpha)
    n = gof.sample_size_for_point_mass(0.02, 0.999)
    assert (1 - 0.02) ** n <= 1e-3 < (1 - 0.02) ** (n - 1)
    assert gof.sample_size([0.0, 1.0, 0.0], alpha) == n
    assert gof.sample_size([0.2, 0.8, 0.0], alpha) == gof.sample_size_for_tv(0.02, 1, alpha)
