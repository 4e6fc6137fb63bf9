"""Mutation power of the block / traversal checks: every planted bug is rejected at the suite's alpha.

Each mutant (``exactness/block_traversal_mutants.py``) is the reference with one wrong line; it runs through the
very check and case that tests/exactness/test_block_traversal_law.py runs on real backends and must be rejected. Where a bug
is invisible to a check by construction (siblings drawn i.i.d. with identical subtrees are exchangeable,
so their order does not matter; a per-position coin is exact within one verification), the inert case is
shown too.
"""

from __future__ import annotations

import pytest

from specdec_kernels.exactness import block_traversal_law as btl
from specdec_kernels.exactness import block_traversal_mutants
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import backend_verifier, check_sequence_law
from tests.exactness.tree_law_helpers import single_thread  # noqa: F401  (autouse fixture)

# Laws sampled to power 0.999 at total variation 0.02: the full suite runs them, the fast tier does not.
pytestmark = [pytest.mark.stat, pytest.mark.slow]

ALPHA = gof.SUITE_BUDGET.per_test_alpha  # same alpha as the real samplers; no slot: rejection expected
CASES = {c.name: c for c in btl.STEP_CASES}
SEQUENCE_CASES = {c.name: c for c in btl.BLOCK_SEQUENCE_CASES}


def test_every_mutant_has_a_case():
    assert set(btl.MUTANT_CASES) == set(block_traversal_mutants.MUTANTS)


@pytest.mark.parametrize("bug", list(block_traversal_mutants.MUTANTS))
def test_suite_rejects_mutant(bug):
    target = btl.MUTANT_CASES[bug]
    with block_traversal_mutants.planted(bug):
        if target in SEQUENCE_CASES:
            case = SEQUENCE_CASES[target]
            result = check_sequence_law(backend_verifier("reference", method="block"), case, ALPHA).result
        else:
            case = CASES[target]
            method, api = ("block", "chain") if bug.startswith("block") else ("traversal", "tree")
            result = btl.check_step_law(case, method, btl.step_verifier(method, "reference", api), ALPHA, seed=11).result
    print(f"mutant {bug}: case {case.name}: {result}")
    assert result.rejects(ALPHA), f"the suite did not catch mutant {bug!r}: {result}"


SYMMETRIC_IID = btl.StepCase("w2d2-iid-t1", btl.SHAPES["w2d2"], "iid", btl.SETTINGS["t1"], seed=77)


@pytest.mark.parametrize("bug,case", [("traversal_reversed_siblings", SYMMETRIC_IID),
                                      ("block_coin_per_position", CASES["chain4-iid-t0.8-k3-p0.9"])])
def test_inert_where_theory_says_so(bug, case):
    """Reversing i.i.d. siblings of a symmetric tree (the sibling subtrees are exchangeable) and
    per-position coins within one step leave the step law exact."""
    method, api = ("block", "chain") if bug.startswith("block") else ("traversal", "tree")
    with block_traversal_mutants.planted(bug):
        result = btl.check_step_law(case, method, btl.step_verifier(method, "reference", api), ALPHA, seed=11).result
    assert not result.rejects(ALPHA), result


def test_planted_restores_the_reference():
    import specdec_kernels.reference.block as ref_block

    before = ref_block.stop_mass
    with block_traversal_mutants.planted("block_weights_token_residual"):
        assert ref_block.stop_mass is not before
    assert ref_block.stop_mass is before
    with pytest.raises(ValueError, match="bug"):
        with block_traversal_mutants.planted("nope"):
            pass
