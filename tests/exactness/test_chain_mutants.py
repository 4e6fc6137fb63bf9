"""Mutation power: the exactness checks reject every planted-bug sampler at the suite's alpha.

Each mutant (specdec_kernels/exactness/chain_mutants.py) is the reference chain verifier with one bug. It runs
through the very check function and case that tests/exactness/test_chain_law.py runs on real backends, at the
same per-test alpha; the check must reject it. A suite that cannot fail would fail here.
"""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.exactness import chain_mutants
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import (
    FIRST_TOKEN_CASES,
    MUTANT_CASES,
    FirstTokenCase,
    case_by_name,
    check_first_token_law,
    check_sequence_law,
)

# Laws sampled to power 0.999 at total variation 0.02: the full suite runs them, the fast tier does not.
pytestmark = [pytest.mark.stat, pytest.mark.slow]


def test_every_mutant_has_a_case():
    assert set(MUTANT_CASES) == set(chain_mutants.MUTANTS)
    assert len(chain_mutants.MUTANTS) >= 6


@pytest.mark.parametrize("bug", chain_mutants.MUTANTS)
def test_suite_rejects_mutant(bug):
    alpha = gof.SUITE_BUDGET.per_test_alpha  # same alpha as the real samplers; no slot: rejection expected
    case = case_by_name(MUTANT_CASES[bug])
    check = check_first_token_law if isinstance(case, FirstTokenCase) else check_sequence_law
    result = check(chain_mutants.mutant_verifier(bug), case, alpha).result
    print(f"mutant {bug}: case {case.name}: {result}")
    assert result.rejects(alpha), f"the suite did not catch mutant {bug!r}: {result}"


GREEDY_INERT = ("biased_first_token", "block_noise_reused")


@pytest.mark.parametrize("bug", chain_mutants.MUTANTS)
def test_mutant_matches_reference_where_its_bug_is_inert(bug):
    """Mutants are copies of the reference: on inputs their bug cannot touch, tokens are identical.

    Random requests (temperature in [0.5, 1.5], top-k / top-p on some) with deterministic drafts leave
    every stochastic-draft bug inert; stochastic drafts leave the deterministic-draft bug inert; k = 0
    leaves the bonus-row bug inert; greedy requests leave the first-token bias and the within-block noise bug
    inert; a vocabulary of one two-level Gumbel-max block (V = 7) leaves the block-score bug inert.
    """
    g = torch.Generator().manual_seed(3)
    b, v = 64, 7
    k = 0 if bug == "bonus_wrong_row" else 3
    logits = torch.randn(b * (k + 1), v, generator=g)
    drafts = torch.randint(-1, v, (b * k,), generator=g)
    cu = torch.arange(b + 1) * k
    kwargs = dict(
        temperature=torch.zeros(b) if bug in GREEDY_INERT else 0.5 + torch.rand(b, generator=g),
        top_k=torch.randint(0, v + 1, (b,), generator=g, dtype=torch.int32),
        top_p=torch.where(torch.rand(b, generator=g) < 0.5, 0.8, 1.0),
        seed=torch.arange(b),
    )
    if bug == "deterministic_resample_with_draft":
        kwargs["draft_probs"] = torch.softmax(torch.randn(b * k, v, generator=g), -1)
    ref = sk.verify_chain(logits, drafts, cu, backend="reference", **kwargs)
    mut = chain_mutants.mutant_verifier(bug)(logits, drafts, cu, **kwargs)
    assert torch.equal(ref.output_token_ids, mut.output_token_ids)
    assert torch.equal(ref.num_accepted, mut.num_accepted)


def test_mutant_cases_are_suite_cases():
    """The rejecting cases are the ones test_chain_law runs (same names, same parameters)."""
    for name in MUTANT_CASES.values():
        case = case_by_name(name)
        assert case in FIRST_TOKEN_CASES or case.name.startswith("seq-")


def test_draft_temperature_bug_is_inert_at_temperature_one():
    """Stochastic drafts at temperature 1 (what a path that hands processed logits, like the vLLM V2 drop-in,
    verifies): the missing draft temperature changes nothing, so the audit can report the bug inert there
    instead of missed; at temperature 2 it acts."""
    g = torch.Generator().manual_seed(4)
    b, k, v = 256, 3, 9
    logits = torch.randn(b * (k + 1), v, generator=g)
    q = torch.softmax(torch.randn(b * k, v, generator=g), -1)
    drafts = torch.multinomial(q, 1, generator=g).squeeze(1)
    cu = torch.arange(b + 1) * k
    mutant = chain_mutants.mutant_verifier("draft_temperature_missing")
    for t, same in ((1.0, True), (2.0, False)):
        kwargs = dict(draft_probs=q, temperature=torch.full((b,), t), seed=torch.arange(b))
        ref = sk.verify_chain(logits, drafts, cu, backend="reference", **kwargs)
        mut = mutant(logits, drafts, cu, **kwargs)
        assert torch.equal(ref.output_token_ids, mut.output_token_ids) == same
