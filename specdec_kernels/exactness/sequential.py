"""Group-sequential looks within one exactness case: stop at the first look whose evidence is enough.

A case's law test is sized for its worst admissible error (total variation 0.02 at power 0.999,
:func:`gof.sample_size`), which a gross bug shows after a small fraction of the trials. :func:`run_looks` draws the
trials cumulatively in chunks and tests at a few looks (:data:`LOOK_FRACTIONS` of the design size), rejecting at
the first look whose p-value is below that look's share of the case's alpha:

- **False alarms.** The looks' alphas sum to the case's alpha (Bonferroni over looks), so a lossless verifier
  fails a case with probability at most alpha whatever the dependence between looks. Each early look spends
  :data:`EARLY_SHARE` of it; the last look the rest.
- **Power.** The last look's size is the design size recomputed at the last look's alpha, so the last look alone
  keeps power 0.999 at total variation 0.02; stopping earlier only ever ends a run that rejects.
- **Early looks' test.** Every cell's count against its exact binomial law (two-sided), Bonferroni over the cells
  of positive probability (:func:`cell_test`): valid at any sample size, where Pearson's chi-square at a few
  hundred trials and a far-tail alpha is not (a cell with expected count 5 passes chi-square's 4e-9 point about
  1,000 times as often as that). The last look runs the design test (:func:`gof.gof_test`).
- **Replay.** Chunk ``[start, stop)`` is drawn with :func:`chunk_seed` and :func:`chunk_keys`, so the trials up to look j are a
  prefix of the trials of a run to the last look: the same seed gives the same verdict, look and trials.

The reported p-value is the deciding look's, Bonferroni-adjusted (its raw p-value over its share of alpha), so
``result.rejects(alpha)`` is the sequential verdict for every caller.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from . import goodness_of_fit as gof

__all__ = ["LOOK_FRACTIONS", "EARLY_SHARE", "LookPlan", "plan_looks", "single_look", "chunk_seed", "chunk_keys",
           "cell_test", "Sequential", "run_looks"]

LOOK_FRACTIONS: tuple[float, ...] = (1 / 64, 1 / 8, 1.0)
"""Where the looks fall, as fractions of the last look's size (a geometric ladder, factor 8)."""
EARLY_SHARE = 0.01
"""The share of a case's alpha each look before the last spends; the last look spends the rest."""


@dataclass(frozen=True)
class LookPlan:
    """Cumulative trials at each look (increasing) and each look's alpha (summing to at most ``alpha``)."""

    sizes: tuple[int, ...]
    alphas: tuple[float, ...]
    alpha: float  # the case's alpha

    @property
    def design_size(self) -> int:
        """Trials of a run to the last look (every look of a passing case)."""
        return self.sizes[-1]


def plan_looks(probs, alpha: float, tv: float, power: float, fractions: tuple[float, ...] = LOOK_FRACTIONS,
               early_share: float = EARLY_SHARE) -> LookPlan:
    """The looks of a case with law ``probs``: the last at :func:`gof.sample_size` for the last look's alpha
    (``alpha`` less the early looks' shares), the earlier ones at ``fractions`` of it (looks that would repeat a
    size are dropped, and their alpha with them)."""
    if not fractions or fractions[-1] != 1.0 or any(b <= a for a, b in itertools.pairwise(fractions)):
        raise ValueError(f"fractions must increase to 1.0, got {fractions}")
    if not 0 <= early_share * (len(fractions) - 1) < 1:
        raise ValueError(f"early looks must leave the last look a share of alpha (early_share={early_share})")
    last_alpha = alpha * (1.0 - early_share * (len(fractions) - 1))
    n = gof.sample_size(probs, last_alpha, tv, power)
    early = sorted({max(1, math.ceil(f * n)) for f in fractions[:-1]} - {n})
    return LookPlan((*early, n), (*(alpha * early_share for _ in early), last_alpha), alpha)


def single_look(num_samples: int, alpha: float) -> LookPlan:
    """One look at ``num_samples`` trials with the whole of ``alpha`` (a fixed-size test)."""
    return LookPlan((num_samples,), (alpha,), alpha)


def chunk_seed(seed: int, start: int) -> int:
    """The generator seed of the chunk of trials that starts at trial ``start`` of a case seeded ``seed``: ``seed``
    itself for the first chunk, ``seed + start * 2**32`` after it (the chunks' Philox keys are
    ``seed * 2**32 + start + i``, distinct across chunks)."""
    if start < 0 or not 0 <= seed < 1 << 31:
        raise ValueError(f"seed must be in [0, 2**31) and start >= 0, got {seed}, {start}")
    return seed + (start << 32)


def chunk_keys(seed: int, start: int, count: int) -> torch.Tensor:
    """[count] int64 Philox keys of trials ``start .. start + count - 1`` of a case seeded ``seed``:
    ``seed * 2**32 + trial``, so a trial's key is the same whichever chunk draws it."""
    return seed * (1 << 32) + start + torch.arange(count, dtype=torch.int64)


def cell_test(observed, probs) -> gof.TestResult:
    """Each cell's count against Binomial(n, p_cell), two-sided, Bonferroni over the cells of positive probability:
    p-value = min(1, cells * min over cells of min(1, 2 min(P(X <= x), P(X >= x)))). Exact at any n (no asymptotic
    approximation); a count in a cell of probability 0 gives p-value 0. Statistic: -log10 of the smallest cell
    p-value."""
    obs = np.asarray(torch.as_tensor(observed).double().cpu(), dtype=np.float64).reshape(-1)
    p = np.asarray(torch.as_tensor(probs).double().cpu(), dtype=np.float64).reshape(-1)
    p = p / p.sum()
    if np.any((p == 0) & (obs > 0)):
        return gof.TestResult(math.inf, 0, 0.0, "impossible")
    keep = p > 0
    n, x, q = int(obs.sum()), obs[keep], p[keep]
    two_sided = np.minimum(1.0, 2.0 * np.minimum(stats.binom.cdf(x, n, q), stats.binom.sf(x - 1, n, q)))
    smallest = float(two_sided.min())
    statistic = -math.log10(smallest) if smallest > 0 else math.inf
    return gof.TestResult(statistic, int(keep.sum()) - 1, min(1.0, smallest * int(keep.sum())), "cells")


@dataclass(frozen=True)
class Sequential:
    """A finished sequential test: the deciding look's result (p-value adjusted, see the module docstring), its
    raw p-value, the trials drawn until it, the look (1-based) and the looks planned, and the counts."""

    result: gof.TestResult
    raw_pvalue: float
    num_samples: int
    look: int
    looks: int
    observed: torch.Tensor


def run_looks(draw: Callable[[int, int], torch.Tensor], probs: torch.Tensor, plan: LookPlan) -> Sequential:
    """Test at each look of ``plan`` in turn, stopping at the first that rejects at its alpha (else at the last).

    ``draw(start, count)`` -> [C] int64 counts of ``count`` trials from trial ``start`` on (seeded with
    :func:`chunk_seed`, so chunks concatenate to one run); ``probs`` [C] is the exact law. The looks before the last
    run :func:`cell_test`, the last :func:`gof.gof_test`.
    """
    observed = torch.zeros(probs.numel(), dtype=torch.int64)
    start = 0
    for j, (size, look_alpha) in enumerate(zip(plan.sizes, plan.alphas, strict=True)):
        observed = observed + draw(start, size - start)
        start = size
        last = j == len(plan.sizes) - 1
        raw = gof.gof_test(observed, probs) if last else cell_test(observed, probs)
        if last or raw.rejects(look_alpha):
            share = look_alpha / plan.alpha
            adjusted = raw._replace(pvalue=min(1.0, raw.pvalue / share))
            return Sequential(adjusted, raw.pvalue, size, j + 1, len(plan.sizes), observed)
    raise AssertionError("unreachable: the last look always returns")
