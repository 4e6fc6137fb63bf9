"""Statistical exactness of chain verification: emitted laws equal the (truncated) target laws.

Every case runs at the suite's per-test alpha (``gof.SUITE_BUDGET``, Bonferroni) with a sample size
that detects a total-variation error of 0.02 with power 0.999; inputs and seeds are fixed, so each test
is deterministic. The same check functions reject every planted bug (tests/exactness/test_chain_mutants.py).
"""

from __future__ import annotations

import pytest

from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import (
    FIRST_TOKEN_CASES,
    NARROW_CASES,
    SEQUENCE_CASES,
    LawCheck,
    backend_verifier,
    check_first_token_law,
    check_narrow_law,
    check_sequence_law,
)
from tests.conftest import DEVICE, skip_if_interpreter_expensive

# Laws sampled to power 0.999 at total variation 0.02: the full suite runs them, the fast tier does not.
pytestmark = [pytest.mark.stat, pytest.mark.slow]


def describe(check: LawCheck) -> str:
    """Failure message: the test result and the largest discrepancies between observed and expected."""
    n = int(check.observed.sum())
    expected = check.expected * n
    gap = (check.observed.double() - expected).abs()
    worst = gap.argsort(descending=True)[:5].tolist()
    cells = ", ".join(f"cell {i}: observed {int(check.observed[i])} expected {expected[i]:.1f}" for i in worst)
    return f"{check.result} with n={check.num_samples}; {cells}"


@pytest.mark.parametrize("case", FIRST_TOKEN_CASES, ids=lambda c: c.name)
def test_first_token_law(backend, case):
    """The first emitted token of each request follows the truncated target law."""
    skip_if_interpreter_expensive(backend, case.cheap)
    alpha = gof.SUITE_BUDGET.claim(f"chain:{backend}:{case.name}")
    check = check_first_token_law(backend_verifier(backend, DEVICE), case, alpha)
    assert not check.result.rejects(alpha), describe(check)


@pytest.mark.parametrize("case", SEQUENCE_CASES, ids=lambda c: c.name)
def test_sequence_law(backend, case):
    """Speculative generation with toy Markov models has exactly the autoregressive sequence law."""
    skip_if_interpreter_expensive(backend, case.cheap)
    alpha = gof.SUITE_BUDGET.claim(f"chain:{backend}:{case.name}")
    check = check_sequence_law(backend_verifier(backend, DEVICE), case, alpha)
    assert not check.result.rejects(alpha), describe(check)


@pytest.mark.parametrize("case", NARROW_CASES, ids=lambda c: c.name)
def test_narrow_law(backend, case):
    """vLLM's narrow design (V = 16, draft ranking reversed, drafts drawn on the draft stream with the
    verifier's keys): rejected first tokens and accepted drafts' bonus tokens follow their exact law."""
    skip_if_interpreter_expensive(backend, False)
    alpha = gof.SUITE_BUDGET.claim(f"chain:{backend}:{case.name}")
    check = check_narrow_law(backend_verifier(backend, DEVICE), case, alpha)
    assert not check.result.rejects(alpha), describe(check)


def test_cases_cover_the_required_grid():
    """The case tables cover temperatures {0.3, 1, 2}, top-k, top-p, both draft kinds and k in {1, 3, 5}."""
    temps = {c.cfg.temperature for c in FIRST_TOKEN_CASES}
    assert {0.0, 0.3, 1.0, 2.0} <= temps
    for drafts in ("deterministic", "stochastic"):
        sub = [c for c in FIRST_TOKEN_CASES if c.drafts == drafts]
        assert any(c.cfg.top_k for c in sub) and any(c.cfg.top_p < 1 for c in sub)
    assert {c.k for c in SEQUENCE_CASES} == {1, 3, 5}
    kinds = {c.drafter for c in SEQUENCE_CASES}
    assert {"self", "close", "far", "zeros", "greedy", "ngram", "unlikely"} <= kinds
    names = [c.name for c in FIRST_TOKEN_CASES + SEQUENCE_CASES]
    assert len(names) == len(set(names))
