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
    NARROW_CASES,
    case_by_name,
    law_check_for,
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
    result = law_check_for(case)(chain_mutants.mutant_verifier(bug), case, alpha).result
    print(f"mutant {bug}: case {case.name}: {result}")
    assert result.rejects(alpha), f"the suite did not catch mutant {bug!r}: {result}"


GREEDY_INERT = ("biased_first_token", "block_noise_reused")


@pytest.mark.parametrize("bug", chain_mutants.MUTANTS)
def test_mutant_matches_reference_where_its_bug_is_inert(bug):
    """Mutants are copies of the reference: on inputs their bug cannot touch, tokens are identical.

    Random requests (temperature in [0.5, 1.5], top-k / top-p on some) with deterministic drafts leave
    every stochastic-draft bug inert; stochastic drafts leave the deterministic-draft bug inert; k = 0
    leaves the bonus-row bugs inert; greedy requests leave the first-token bias and the within-block noise bug
    inert; a vocabulary of one two-level Gumbel-max block (V = 7) leaves the block-score bug inert.
    """
    g = torch.Generator().manual_seed(3)
    b, v = 64, 7
    k = 0 if bug in ("bonus_wrong_row", "bonus_on_recovery_stream") else 3
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
        assert case in FIRST_TOKEN_CASES + NARROW_CASES or case.name.startswith("seq-")


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


SHARED_STREAM_BUGS = ("shared_stream", "recovery_reuses_coin", "bonus_on_recovery_stream")


@pytest.mark.parametrize("bug", SHARED_STREAM_BUGS)
def test_narrow_cases_alone_see_the_shared_stream_bugs(bug):
    """The narrow design is what sees them: the suite's own case of the same draft kind (first-stoch-T1 /
    first-deter-T1, drafts drawn outside the system by a torch generator, V = 6) passes the very same mutant."""
    alpha = gof.SUITE_BUDGET.per_test_alpha
    narrow = case_by_name(MUTANT_CASES[bug])
    wide = case_by_name("first-stoch-T1" if narrow.drafts == "stochastic" else "first-deter-T1")
    verify = chain_mutants.mutant_verifier(bug)
    assert law_check_for(narrow)(verify, narrow, alpha).result.rejects(alpha)
    if bug != "recovery_reuses_coin":  # an inverse-CDF resample at the coin is biased whatever the drafts
        assert not law_check_for(wide)(verify, wide, alpha).result.rejects(alpha)
