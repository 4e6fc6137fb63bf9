"""Statistical exactness of block verification (chains) and traversal verification (trees).

Three checks per backend, each at the suite's per-test alpha with the power-derived sample size:

- whole-sequence law: speculative generation on toy Markov targets and drafters (chains of k = 1-4
  stochastic drafts; trees of widths 1-4 and depths 1-4 with i.i.d., without-replacement and deterministic
  siblings; temperature / top-k / top-p / greedy) has exactly the autoregressive law;
- step law: one verification's emitted sequences follow the method's exact enumerated law
  (``exact_verify``), which pins the method itself (its acceptance), not only losslessness;
- acceptance: on the same samples, the mean accepted length matches the exact expectation.
"""

from __future__ import annotations

import pytest

from specdec_kernels.exactness import block_traversal_law as btl
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import backend_verifier, check_sequence_law
from tests.conftest import DEVICE
from tests.exactness.test_chain_law import describe
from tests.exactness.tree_law_helpers import sequence_law_p_value, single_thread  # noqa: F401  (autouse fixture)

# Laws sampled to power 0.999 at total variation 0.02: the full suite runs them, the fast tier does not.
pytestmark = [pytest.mark.stat, pytest.mark.slow]


@pytest.mark.parametrize("case", btl.BLOCK_SEQUENCE_CASES, ids=lambda c: c.name)
def test_block_sequence_law(backend, case):
    alpha = gof.SUITE_BUDGET.claim(f"block-seq:{backend}:{case.name}")
    check = check_sequence_law(backend_verifier(backend, DEVICE, method="block"), case, alpha)
    assert not check.result.rejects(alpha), describe(check)


# The reference walks trees event by event in Python; it runs one case per sibling mode plus the deepest tree,
# the native backend (token-identical to it, tests/kernels/test_block_traversal.py) every case.
REFERENCE_TRAVERSAL_CASES = {("iid", "w3d2", "t1"), ("without_replacement", "w2d4", "t0.7-k2"),
                             ("deterministic", "w4d1", "t1"), ("iid", "chain4", "t0.7-k2")}


@pytest.mark.parametrize("mode,tree,setting", btl.TRAVERSAL_SEQUENCE_CASES,
                         ids=["-".join(c) for c in btl.TRAVERSAL_SEQUENCE_CASES])
def test_traversal_sequence_law(backend, mode, tree, setting):
    if backend == "reference" and (mode, tree, setting) not in REFERENCE_TRAVERSAL_CASES:
        pytest.skip("reference: one case per sibling mode (the native backend runs them all)")
    cfg = btl.SETTINGS[setting]
    alpha = gof.SUITE_BUDGET.claim(f"traversal-seq:{backend}:{mode}-{tree}-{setting}")
    seed = btl.TRAVERSAL_SEQUENCE_CASES.index((mode, tree, setting))
    p = sequence_law_p_value(btl.TREE_PATHS[tree], None if mode == "deterministic" else mode, cfg.temperature,
                             cfg.top_k, cfg.top_p, seed=seed, backend=backend, method="traversal", device=DEVICE)
    assert p >= alpha, f"sequence law rejected: p = {p:.3g} < {alpha:.3g}"


def _methods(case: btl.StepCase) -> list[tuple[str, str]]:
    """(method, api) pairs a step case checks: chains through verify_chain(block) and verify_tree(traversal)."""
    if case.step().is_chain:
        return [("block", "chain"), ("traversal", "tree")]
    return [("traversal", "tree")]


STEP_PARAMS = [(case, method, api) for case in btl.STEP_LAW_CASES for method, api in _methods(case)]


@pytest.mark.parametrize("case,method,api", STEP_PARAMS, ids=[f"{c.name}-{m}" for c, m, _ in STEP_PARAMS])
def test_step_law_and_acceptance(backend, case, method, api):
    name = f"step:{backend}:{case.name}:{method}"
    alpha = gof.SUITE_BUDGET.claim(name)
    z_alpha = gof.SUITE_BUDGET.claim(name + ":mean")
    check = btl.check_step_law(case, method, btl.step_verifier(method, backend, api, DEVICE), alpha, seed=11)
    assert not check.result.rejects(alpha), f"{check.result} with n = {check.num_samples}"
    assert abs(check.z) < btl.acceptance_z_critical(z_alpha), (
        f"mean accepted {check.mean_accepted:.4f} vs exact {check.exact_accepted:.4f} (z = {check.z:.2f})"
    )


def test_cases_cover_the_grid():
    assert {c.k for c in btl.BLOCK_SEQUENCE_CASES} == {1, 2, 3, 4}
    assert any(c.cfg.greedy for c in btl.BLOCK_SEQUENCE_CASES)
    assert any(c.cfg.top_k for c in btl.BLOCK_SEQUENCE_CASES) and any(c.cfg.top_p < 1 for c in btl.BLOCK_SEQUENCE_CASES)
    assert {m for m, _, _ in btl.TRAVERSAL_SEQUENCE_CASES} == {"iid", "without_replacement", "deterministic"}
    shapes = {t for _, t, _ in btl.TRAVERSAL_SEQUENCE_CASES}
    widths = {max(sum(1 for p in btl.TREE_PATHS[t] if p[:-1] == q) for q in [()] + btl.TREE_PATHS[t]) for t in shapes}
    depths = {max(len(p) for p in btl.TREE_PATHS[t]) for t in shapes}
    assert widths == {1, 2, 3, 4} and depths == {1, 2, 3, 4}
    assert REFERENCE_TRAVERSAL_CASES <= set(btl.TRAVERSAL_SEQUENCE_CASES)
