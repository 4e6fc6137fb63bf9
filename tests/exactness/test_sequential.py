"""Group-sequential looks (specdec_kernels/exactness/sequential.py): the looks' alphas stay within the case's alpha
and the last look keeps the design's power, a lossless verifier passes, a gross bug stops at the first look, a
subtle one reaches the last look and is caught there, and a verdict replays from its seed."""

from __future__ import annotations

import math

import pytest
import torch

from specdec_kernels.exactness import chain_mutants, sequential
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import (
    backend_verifier,
    case_by_name,
    check_first_token_law,
    first_token_law,
    law_check_for,
    law_plan,
    sample_first_tokens,
)

ALPHA = gof.SUITE_BUDGET.per_test_alpha
LAW = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)


def test_the_looks_alphas_sum_to_at_most_the_case_alpha_and_the_last_look_keeps_the_power():
    plan = sequential.plan_looks(LAW, ALPHA, 0.02, 0.999)
    assert len(plan.sizes) == len(sequential.LOOK_FRACTIONS) and list(plan.sizes) == sorted(set(plan.sizes))
    assert sum(plan.alphas) <= ALPHA * (1 + 1e-12)
    assert plan.alphas[-1] < ALPHA  # the alpha is split, not spent whole at every look
    assert gof.chi2_power(plan.design_size, 0.02, LAW.numel() - 1, plan.alphas[-1]) >= 0.999
    assert plan.design_size >= gof.sample_size(LAW, ALPHA)  # the last look grows a little ...
    assert plan.design_size <= 1.01 * gof.sample_size(LAW, ALPHA)  # ... by under 1 %
    assert plan.sizes[0] == math.ceil(plan.design_size * sequential.LOOK_FRACTIONS[0])


def test_looks_that_would_repeat_a_size_are_dropped_with_their_alpha():
    plan = sequential.plan_looks(torch.tensor([1.0, 0.0]), ALPHA, 0.02, 0.999)  # a point mass: n = 342
    assert plan.sizes == (6, 43, 342) and sum(plan.alphas) <= ALPHA
    tiny = sequential.plan_looks(torch.tensor([1.0]), ALPHA, 0.5, 0.9)  # n = 4: 1/64 and 1/8 of it are one trial
    assert tiny.sizes == (1, 4) and sum(tiny.alphas) <= ALPHA


def test_the_cell_test_is_exact_and_flags_impossible_cells():
    assert sequential.cell_test([0, 3], [1.0, 0.0]).pvalue == 0.0
    # One cell of two: the two-sided binomial p-value of 9 of 10 at 1/2 is 22/1024; two cells: Bonferroni x 2.
    assert sequential.cell_test([9, 1], [0.5, 0.5]).pvalue == pytest.approx(2 * 22 / 1024)
    assert sequential.cell_test([5, 5], [0.5, 0.5]).pvalue == 1.0


def test_the_cell_test_holds_its_level_under_the_null():
    g = torch.Generator().manual_seed(5)
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03], dtype=torch.float64)
    draws = torch.multinomial(probs, 400 * 2000, replacement=True, generator=g).reshape(2000, 400)
    pvalues = [sequential.cell_test(torch.bincount(d, minlength=5), probs).pvalue for d in draws]
    assert sum(p < 0.01 for p in pvalues) <= 20 + 3 * math.sqrt(20)  # at most its level, with slack


def test_a_lossless_verifier_passes_every_look():
    case = case_by_name("first-stoch-T1")
    check = check_first_token_law(backend_verifier("reference"), case, ALPHA)
    assert not check.result.rejects(ALPHA) and (check.look, check.looks) == (3, 3)
    assert check.num_samples == law_plan(first_token_law(case), ALPHA, 0.02, 0.999).design_size


def test_a_gross_bug_stops_at_the_first_look():
    case = case_by_name("first-stoch-T1")
    check = check_first_token_law(chain_mutants.mutant_verifier("ratio_inverted"), case, ALPHA)
    plan = law_plan(first_token_law(case), ALPHA, 0.02, 0.999)
    assert check.result.rejects(ALPHA) and check.look == 1 and check.num_samples == plan.sizes[0]
    assert check.num_samples * 50 < plan.design_size


def test_a_subtle_bug_reaches_the_last_look_and_is_caught_there():
    case = case_by_name("first-stoch-T1")
    check = check_first_token_law(chain_mutants.mutant_verifier("biased_first_token"), case, ALPHA)
    assert check.result.rejects(ALPHA) and (check.look, check.looks) == (3, 3)


def test_a_verdict_replays_from_its_seed():
    case = case_by_name("seq-far-k3-T1-o2")
    verify = chain_mutants.mutant_verifier("coin_reused")
    first, again = (law_check_for(case)(verify, case, ALPHA) for _ in range(2))
    assert first.result.rejects(ALPHA) and first.look < first.looks
    assert (first.num_samples, first.look, first.result) == (again.num_samples, again.look, again.result)
    assert torch.equal(first.observed, again.observed)


def test_the_looks_draw_consecutive_chunks_of_one_seeded_run():
    """run_looks asks for trials [0, n1), [n1, n2), ... in order (a stopped run drew a prefix of the full run's
    chunks), and a chunk's draws depend only on (seed, start, count): the first look's counts are those of the
    first chunk alone."""
    calls = []

    def draw(start, count):
        calls.append((start, count))
        return torch.bincount(torch.zeros(count, dtype=torch.int64), minlength=2)  # always cell 0: passes

    plan = sequential.plan_looks(torch.tensor([1.0, 0.0]), ALPHA, 0.02, 0.999)
    sequential.run_looks(draw, torch.tensor([1.0, 0.0]), plan)
    assert calls == [(0, 6), (6, 37), (43, 299)]
    case = case_by_name("first-stoch-T1")
    verify = chain_mutants.mutant_verifier("ratio_inverted")
    check = check_first_token_law(verify, case, ALPHA)
    first_chunk = sample_first_tokens(verify, case, check.num_samples, start=0)
    assert torch.equal(check.observed[:-1], torch.bincount(first_chunk, minlength=case.vocab_size))
    later = sample_first_tokens(verify, case, check.num_samples, start=check.num_samples)
    assert not torch.equal(first_chunk, later)  # another chunk, other keys
