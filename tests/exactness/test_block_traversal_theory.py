"""Exact theory of block and traversal verification, by enumeration (no sampling, no backend).

Every toy step of ``block_traversal_law.STEP_CASES`` (chains and trees of widths 1-4 and depths 1-4; i.i.d.,
without-replacement and deterministic siblings; temperature / top-k / top-p; greedy) is enumerated in
float64 with the rules written from the papers (``exactness/exact_verify.py``, independent of the
references): every method is lossless, block = traversal on chains, and the sequence-level methods
accept at least as much as token level, strictly exactly where the block-verification inequality is
strict. The optimal-acceptance bounds (Hu et al.; the coupling LP) dominate every method.
"""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.exactness import block_traversal_law as btl
from specdec_kernels.exactness import exact_verify as ev

CASES = btl.STEP_CASES


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_method_is_lossless_and_sequence_level_dominates(case):
    step = case.step()
    methods = ("token", "traversal") + (("block",) if step.is_chain else ())
    for method in methods:
        gap = ev.lossless_gap(step, method)
        assert gap < 1e-12, f"{method} is not lossless on {case.name}: max law error {gap:.3g}"
    token = ev.expected_accepted_length(step, "token")
    traversal = ev.expected_accepted_length(step, "traversal")
    if step.is_chain:
        block_law = ev.accepted_length_law(step, "block")
        assert torch.allclose(block_law, ev.accepted_length_law(step, "traversal"), atol=1e-12, rtol=0)
    strict = ev.gain_condition(step)
    if strict:
        assert traversal > token + 1e-6, f"{case.name}: traversal {traversal:.6f} vs token {token:.6f}"
    else:
        assert abs(traversal - token) < 1e-12, f"{case.name}: traversal {traversal:.6f} vs token {token:.6f}"
    if step.max_depth == 1:  # at depth 1 traversal is recursive rejection sampling, whatever the tree
        assert not strict


def test_the_grid_covers_widths_depths_modes_and_strict_gains():
    steps = [c.step() for c in CASES]
    assert {max(len(k) for k in s.children) for s in steps} == {1, 2, 3, 4}
    assert {s.max_depth for s in steps} == {1, 2, 3, 4}
    assert {s.siblings for s in steps} == set(ev.SIBLING_MODES)
    assert sum(ev.gain_condition(s) for s in steps if s.is_chain) >= 2
    assert sum(ev.gain_condition(s) for s in steps if not s.is_chain) >= 6


@pytest.mark.parametrize("shape", ["chain2", "chain4"])
def test_block_with_one_hot_drafts_is_token_level(shape):
    """Deterministic drafts are a one-hot q: block verification's rule then has token level's emission law
    (hence its acceptance law) exactly, so nothing is lost by running token level for method="block"."""
    case = btl.StepCase(shape, btl.SHAPES[shape], "deterministic", btl.SETTINGS["t1"], seed=3)
    assert torch.allclose(btl.step_emission_law(case, "block"), btl.step_emission_law(case, "token"),
                          atol=1e-12, rtol=0)


def test_bounds_dominate_and_match_hu_at_depth_one():
    for case in CASES:
        step = case.step()
        if step.max_depth != 1:
            continue
        hu = ev.hu_optimal_acceptance(step)
        assert abs(ev.coupling_bound(step) - hu) < 1e-7
        assert hu >= ev.expected_accepted_length(step, "traversal") - 1e-12
        if step.siblings == "deterministic":  # a fixed tree: target-only verification is optimal
            assert abs(hu - ev.expected_accepted_length(step, "token")) < 1e-12
    for name in ("chain3-iid-t1.3-p0.8", "w2d2-without_replacement-t1"):
        step = next(c for c in CASES if c.name == name).step()
        assert ev.coupling_bound(step) >= ev.expected_accepted_length(step, "traversal") - 1e-7


def test_hu_bound_of_one_draft_is_one_minus_total_variation():
    g = torch.Generator().manual_seed(4)
    target = torch.softmax(torch.randn(5, 5, generator=g).double(), -1)
    draft = torch.softmax(torch.randn(5, 5, generator=g).double(), -1)
    step = ev.ToyStep(target, draft, ev.chain_parents(1), "iid", root_token=2)
    tv = 0.5 * float((target[2] - draft[2]).abs().sum())
    assert abs(ev.hu_optimal_acceptance(step) - (1 - tv)) < 1e-12
    assert abs(ev.expected_accepted_length(step, "token") - (1 - tv)) < 1e-12
    with pytest.raises(ValueError, match="depth-1"):
        ev.hu_optimal_acceptance(ev.ToyStep(target, draft, ev.chain_parents(2), "iid"))


def test_a_lossy_rule_shows_a_gap():
    """The exactness measure can fail: siblings drawn without replacement but verified as i.i.d. draws."""
    step = next(c for c in CASES if c.name == "w2d2-without_replacement-t1").step()
    for method in ("token", "traversal"):
        assert ev.lossless_gap(step, method, verify_siblings="iid") > 1e-3


def test_invalid_steps_raise():
    t = torch.full((3, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="siblings"):
        ev.ToyStep(t, t, (-1, 0), "beam")
    with pytest.raises(ValueError, match="parents"):
        ev.ToyStep(t, t, (-1, 1), "iid")
    with pytest.raises(ValueError, match="chains"):
        ev.emission_law(ev.ToyStep(t, t, (-1, 0, 0), "iid"), "block")
    with pytest.raises(ValueError, match="method"):
        ev.emission_law(ev.ToyStep(t, t, (-1, 0), "iid"), "beam")
