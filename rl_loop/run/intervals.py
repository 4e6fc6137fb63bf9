"""The statistics behind the figures of a run: bootstrap intervals of speedups, clustered (per-problem)
accuracy intervals, pass@k and the power of the equivalence check's two-sample tests.

Every function is pure (numpy in, floats out) and seeded by literals, so a figure replays exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from specdec_kernels.exactness.goodness_of_fit import chi2_power, sample_size_for_tv

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def bootstrap_ci(rows: Sequence[Sequence[float]], statistic: Callable[[np.ndarray], float], level: float = 0.95,
                 resamples: int = 4000, seed: int = 0) -> list[float] | None:
    """Percentile bootstrap interval of ``statistic`` over ``rows`` (one row per comparison step, resampled
    with replacement as units). ``statistic`` takes a [n, m] array. None for fewer than 2 rows."""
    data = np.asarray(rows, dtype=float)
    if data.ndim != 2 or data.shape[0] < 2:
        return None
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.shape[0], size=(resamples, data.shape[0]))
    values = np.array([statistic(data[i]) for i in idx])
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


def ratio_of_rates(data: np.ndarray) -> float:
    """Columns (a_work, a_time, b_work, b_time): (sum a_work / sum a_time) / (sum b_work / sum b_time), the
    throughput ratio of arm a over arm b (b_work = a_work for step times: the ratio of summed times)."""
    a_work, a_time, b_work, b_time = data.sum(0)
    return float((a_work / a_time) / (b_work / b_time))


def clustered_mean(per_problem: np.ndarray) -> dict:
    """Mean accuracy of ``per_problem`` [P, m] (m samples of each of P problems, 0/1) with the standard error
    of the per-problem means: samples of one problem are correlated, so they are one cluster, not m
    independent draws. Returns {mean, se, ci95}."""
    x = np.asarray(per_problem, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"per_problem must be [P >= 2, m], got shape {x.shape}")
    means = x.mean(1)
    mean, se = float(means.mean()), float(means.std(ddof=1) / math.sqrt(len(means)))
    return {"mean": mean, "se": se, "ci95": [mean - Z95 * se, mean + Z95 * se]}


def paired_change(start: np.ndarray, end: np.ndarray) -> dict:
    """Mean change in per-problem accuracy from ``start`` to ``end`` ([P, m] each, same problems) with its
    paired, clustered standard error and 95 % interval."""
    s, e = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    if s.shape != e.shape:
        raise ValueError(f"start and end must have the same shape, got {s.shape} and {e.shape}")
    d = e.mean(1) - s.mean(1)
    if len(d) < 2:
        raise ValueError("a paired change needs at least 2 problems")
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))
    return {"mean": mean, "se": se, "ci95": [mean - Z95 * se, mean + Z95 * se]}


def pass_at_k(per_problem: np.ndarray, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) averaged over problems: 1 - C(m - c, k) / C(m, k) for c correct
    of the m samples of a problem."""
    x = np.asarray(per_problem)
    m = x.shape[1]
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] (samples per problem), got {k}")
    c = x.sum(1).astype(int)
    return float(np.mean([1.0 - math.comb(m - ci, k) / math.comb(m, k) for ci in c]))


def two_sample_chi2_power(n1: int, n2: int, tv: float, df: int, alpha: float) -> float:
    """Power of the two-sample chi-square homogeneity test (level ``alpha``, ``df`` degrees of freedom)
    against any pair of laws at total-variation distance >= ``tv``, with ``n1`` and ``n2`` samples.

    Under the alternative the statistic is about noncentral chi-square with noncentrality
    ``lambda = n1 n2 / (n1 + n2) * sum((p1 - p2)**2 / pbar)`` (``pbar`` the pooled law), and by
    Cauchy-Schwarz ``sum((p1 - p2)**2 / pbar) >= (2 tv)**2``: the one-sample bound
    (``specdec_kernels.exactness.goodness_of_fit.chi2_power``) at the effective size ``n1 n2 / (n1 + n2)`` (n / 2 for
    equal arms, not n).
    """
    if n1 < 1 or n2 < 1:
        raise ValueError(f"n1 and n2 must be >= 1, got {n1} and {n2}")
    n_eff = n1 * n2 / (n1 + n2)
    return chi2_power(n_eff, tv, df, alpha)


def two_sample_size(tv: float, df: int, alpha: float, power: float) -> int:
    """Samples per arm (equal arms) for :func:`two_sample_chi2_power` >= ``power`` at ``tv``."""
    return 2 * sample_size_for_tv(tv, df, alpha, power)
