"""The CUDA kernels, run on the CPU through the host emulation (specdec_kernels.exactness.cuda_emulation), emit the
reference's tokens for the same seeds.

The randomised cases of tests/native/test_native.py (ragged batches, fp32/bf16/fp16 logits, greedy/random mixes,
deterministic and stochastic drafts, top-k/top-p, placeholders, NaN/inf rows, trees of every sibling mode,
V = 151936), each under one of the thread schedules; a few under all of them; the exactness suite's
first-token cases (token equality on every case, the law itself on the point-mass cases and on one
full-power case whose batch of ~100k rows exceeds the grid's y limit); H200 and B200 launch
configurations; every __syncthreads of the kernels shown necessary by dropping it.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec_kernels as sk
from specdec_kernels.exactness import cuda_emulation
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import (
    FIRST_TOKEN_CASES,
    case_by_name,
    check_first_token_law,
    first_token_law,
)
from specdec_kernels.exactness.chain_law import sample_first_tokens as first_token_batch
from tests.harness import fuzz
from tests.native.test_native import CHAIN_CASES, TREE_CASES, _chain_case, _tree_case

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not cuda_emulation.available(), reason="CUDA host emulation not built (setup.py build_ext)"),
]

SCHEDULES = cuda_emulation.SCHEDULES


def _case_id(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items())


def _assert_same(ref, got, what) -> None:
    for name, r, g in zip(ref._fields, ref, got, strict=True):
        if not torch.equal(r, g):
            bad = (r != g).reshape(r.shape[0], -1).any(-1).nonzero().flatten()[:4].tolist()
            raise AssertionError(f"{name} differs for requests {bad}: reference {r[bad]} vs cuda_emulation {g[bad]}; {what}")


# ------------------------------------------------------------------------------------------------------
# The native backend's randomised cases
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CHAIN_CASES, ids=_case_id)
@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.slow
def test_chain_matches_reference(case, B):
    i = CHAIN_CASES.index(case)
    schedule = SCHEDULES[(i + B) % len(SCHEDULES)]
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(1000 * V + 10 * B + i)
    inputs = _chain_case(B, 5, V, dtype, gen, **case)
    ref = sk.verify_chain(**inputs, backend="reference")
    got = cuda_emulation.verify_chain(**inputs, schedule=schedule, schedule_seed=i, arch=cuda_emulation.ARCHS["h200"])
    _assert_same(ref, got, (case, schedule))


@pytest.mark.parametrize("case", TREE_CASES, ids=_case_id)
@pytest.mark.parametrize("B", [1, 7])
def test_tree_matches_reference(case, B):
    i = TREE_CASES.index(case)
    schedule = SCHEDULES[(i + B) % len(SCHEDULES)]
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(1000 * V + 10 * B + i)
    inputs = _tree_case(B, V, dtype, gen, **case)
    ref = sk.verify_tree(**inputs, backend="reference")
    got = cuda_emulation.verify_tree(**inputs, schedule=schedule, schedule_seed=i, arch=cuda_emulation.ARCHS["b200"])
    _assert_same(ref, got, (case, schedule))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("arch", sorted(cuda_emulation.ARCHS.values()))
def test_every_schedule_and_device_emits_the_same_tokens(schedule, arch):
    """The kernels that synchronise the most (threshold search, stochastic rows, residuals, stochastic
    trees of both sibling modes) under each interleaving and each device's launch configurations."""
    gen = torch.Generator().manual_seed(17)
    chain = _chain_case(6, 4, 3001, torch.bfloat16, gen, probs=True, top_k=True, top_p=True, greedy_frac=0.2)
    _assert_same(sk.verify_chain(**chain, backend="reference"),
                 cuda_emulation.verify_chain(**chain, schedule=schedule, schedule_seed=5, arch=arch), schedule)
    for sibling in ("iid", "without_replacement"):
        tree = _tree_case(5, 300, torch.float32, gen, probs=True, sibling=sibling, top_p=True, greedy_frac=0.2)
        _assert_same(sk.verify_tree(**tree, backend="reference"),
                     cuda_emulation.verify_tree(**tree, schedule=schedule, schedule_seed=5, arch=arch), (schedule, sibling))


@pytest.mark.parametrize(("B", "probs", "dtype"), [(1, True, torch.float32), (4, False, torch.bfloat16)])
@pytest.mark.slow
def test_chain_full_vocab(B, probs, dtype):
    """V = 151936 takes the 512-thread entries of the table; several blocks split each row."""
    gen = torch.Generator().manual_seed(7 + B + probs)
    inputs = _chain_case(B, 2, 151936, dtype, gen, probs=probs, top_k=B > 1, greedy_frac=0.25)
    got = cuda_emulation.verify_chain(**inputs, schedule="random", schedule_seed=B)
    _assert_same(sk.verify_chain(**inputs, backend="reference"), got, B)
    assert {x.threads for x in cuda_emulation.last_launches() if "row_pass" in x.kernel} == {512}


@pytest.mark.slow
def test_tree_full_vocab():
    gen = torch.Generator().manual_seed(11)
    inputs = _tree_case(2, 151936, torch.float32, gen, probs=True, sibling="without_replacement", max_nodes=4)
    _assert_same(sk.verify_tree(**inputs, backend="reference"), cuda_emulation.verify_tree(**inputs, schedule="reverse"),
                 "full V")


def test_edge_shapes_and_max_depth():
    gen = torch.Generator().manual_seed(3)
    inputs = _chain_case(4, 0, 50, torch.float32, gen)  # k = 0 everywhere: bonus rows only
    _assert_same(sk.verify_chain(**inputs, backend="reference"), cuda_emulation.verify_chain(**inputs), "k=0")
    empty = cuda_emulation.verify_chain(torch.zeros(0, 10), torch.zeros(0, dtype=torch.int64),
                                   torch.zeros(1, dtype=torch.int64))
    assert empty.output_token_ids.shape == (0, 1) and empty.num_accepted.shape == (0,)
    tree = _tree_case(5, 30, torch.float32, gen, greedy_frac=1.0, max_nodes=8)
    kw = dict(max_depth=1, validate=False)
    _assert_same(sk.verify_tree(**tree, backend="reference", **kw), cuda_emulation.verify_tree(**tree, **kw), "max_depth")


def test_garbage_without_validation_stays_in_bounds():
    """validate=False: draft ids outside [0, V) are rejected, tokens stay in [0, V), and a chain longer
    than max_draft_len writes nothing outside its output row (the canaries around every buffer)."""
    V = 33
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(1))
    drafts = torch.tensor([-7, V, 5, 10**9])
    cu = torch.tensor([0, 2, 4])
    res = cuda_emulation.verify_chain(logits, drafts, cu, temperature=torch.tensor([0.0, 1.0]), seed=torch.tensor([1, 2]),
                                 validate=False, max_draft_len=2)
    assert int(res.num_accepted[0]) == 0
    emitted = res.output_token_ids[res.output_token_ids >= 0]
    assert bool(((emitted >= 0) & (emitted < V)).all())
    long = logits[:5].clone()
    long[:, 3] = 50.0  # greedy argmax 3 everywhere: every draft below is accepted
    res = cuda_emulation.verify_chain(long, torch.full((4,), 3), torch.tensor([0, 4]), validate=False, max_draft_len=1)
    assert res.output_token_ids.shape == (1, 2) and int(res.num_accepted[0]) <= 1


@given(call=st.one_of(fuzz.chain_call(), fuzz.tree_call()))
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_fuzz_unvalidated_stays_in_bounds(call):
    """validate=False on the fuzz campaign's inconsistent calls (decreasing / negative / past-the-end cu,
    garbage parents, ids, widths and sampling parameters): the emulated kernels read no guard row, write no
    canary, emit only tokens in [0, V), and agree with the reference wherever the clamping rules define one
    answer (tests/kernels/test_unvalidated.py runs the same campaign on the user backends)."""
    emulated = cuda_emulation.verify_chain if call.op == "chain" else cuda_emulation.verify_tree
    reference = sk.verify_chain if call.op == "chain" else sk.verify_tree
    results = {}
    for name, fn in (("cuda_emulation", emulated), ("reference", lambda **kw: reference(**kw, backend="reference"))):
        try:
            results[name] = fn(**call.kwargs)
        except Exception as exc:  # judged by fuzz.problems: no error is allowed here
            results[name] = exc
    assert not fuzz.problems(call, results), fuzz.problems(call, results)


def test_checks_are_the_apis():
    """Bad arguments raise what the public API raises, before anything is launched."""
    logits = torch.randn(3, 8)
    cases = [
        dict(draft_token_ids=torch.tensor([0, 9]), cu_num_draft_tokens=torch.tensor([0, 2])),
        dict(draft_token_ids=torch.tensor([0, 1]), cu_num_draft_tokens=torch.tensor([0, 1])),
        dict(draft_token_ids=torch.tensor([0, 1]), cu_num_draft_tokens=torch.tensor([0, 2]),
             temperature=torch.tensor([-1.0])),
    ]
    for kw in cases:
        with pytest.raises((ValueError, TypeError)) as api_error:
            sk.verify_chain(logits, **kw, backend="reference")
        with pytest.raises(type(api_error.value), match=re.escape(str(api_error.value))):
            cuda_emulation.verify_chain(logits, **kw)
    with pytest.raises(ValueError, match="schedule"):
        cuda_emulation.verify_chain(logits, torch.tensor([0, 1]), torch.tensor([0, 2]), schedule="sideways")


# ------------------------------------------------------------------------------------------------------
# The exactness suite's first-token cases
# ------------------------------------------------------------------------------------------------------

def _emulated(schedule: str):
    def verify(*args):
        return cuda_emulation.verify_chain(*args, schedule=schedule, schedule_seed=3)

    return verify


@pytest.mark.parametrize("case", FIRST_TOKEN_CASES, ids=lambda c: c.name)
@pytest.mark.slow
def test_first_token_case_tokens(case):
    """Every first-token case's batch (64 requests): the emulated kernels emit the reference's tokens, so
    they inherit the reference's law on it."""
    ref = first_token_batch(lambda *a: sk.verify_chain(*a, backend="reference"), case, 64)
    got = first_token_batch(_emulated(SCHEDULES[FIRST_TOKEN_CASES.index(case) % len(SCHEDULES)]), case, 64)
    assert torch.equal(ref, got), case.name


POINT_MASS_CASES = [c.name for c in FIRST_TOKEN_CASES if first_token_law(c).max() == 1.0]


@pytest.mark.stat
@pytest.mark.parametrize("name", POINT_MASS_CASES)
@pytest.mark.slow
def test_first_token_law(name):
    """The law check itself, at the suite's sample size and alpha, on the cases whose (truncated) target is
    a point mass (342 requests each; the others need ~50k, minutes in the emulation)."""
    case = case_by_name(name)
    alpha = gof.SUITE_BUDGET.claim(f"chain:cuda_emulation:{case.name}")
    check = check_first_token_law(_emulated("random"), case, alpha)
    assert not check.result.rejects(alpha), f"{check.result} with n={check.num_samples}"


@pytest.mark.slow
def test_rows_beyond_the_grid_y_limit():
    """70000 rows (a first-token batch is ~100k): the row kernels' grid stops at 65535 rows in y and each
    block loops over the rows beyond (rows past the limit used to be a launch error on the GPU)."""
    B, V = 70_000, 5
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(B, V, generator=gen)
    temperature = torch.where(torch.arange(B) % 2 == 0, 0.0, 1.0)
    kw = dict(temperature=temperature, seed=torch.arange(B), position=torch.arange(B))
    args = (logits, torch.zeros(0, dtype=torch.int64), torch.zeros(B + 1, dtype=torch.int64))
    got = cuda_emulation.verify_chain(*args, **kw)
    _assert_same(sk.verify_chain(*args, **kw, backend="reference"), got, "70000 rows")
    row_pass = next(x for x in cuda_emulation.last_launches() if "row_pass" in x.kernel)
    assert row_pass.grid[1] == 65535


# ------------------------------------------------------------------------------------------------------
# Every barrier is needed: dropping one changes tokens (or trips the emulation) under some schedule
# ------------------------------------------------------------------------------------------------------

def _barrier_cases():
    gen = torch.Generator().manual_seed(23)
    chain = _chain_case(5, 3, 2003, torch.float32, gen, probs=True, top_k=True, top_p=True, greedy_frac=0.2)
    tree = _tree_case(16, 200, torch.float32, gen, probs=True, sibling="without_replacement", greedy_frac=0.0,
                      max_nodes=12)
    # A greedy path accepted to the end: consecutive block reductions with nothing between them.
    logits = torch.randn(4, 300, generator=gen)
    tokens = [0] + [int(logits[i].argmax()) for i in range(3)]
    path = dict(target_logits=logits, node_token_ids=torch.tensor(tokens), parent=torch.tensor([-1, 0, 1, 2]),
                cu_num_nodes=torch.tensor([0, 4]))
    return [("chain", chain), ("tree", tree), ("tree", path)]


@pytest.mark.slow
def test_every_syncthreads_is_needed():
    """Plant a missing __syncthreads at each barrier the kernels reach: some schedule must catch it. The
    planted bug proves the schedules can fail a test; a barrier nothing catches would be dead weight."""
    runs = {"chain": (sk.verify_chain, cuda_emulation.verify_chain), "tree": (sk.verify_tree, cuda_emulation.verify_tree)}
    sites: dict[str, list[tuple[str, dict]]] = {}
    for kind, inputs in _barrier_cases():
        ref_fn, emu_fn = runs[kind]
        ref = ref_fn(**inputs, backend="reference")
        _assert_same(ref, emu_fn(**inputs), kind)
        for site in cuda_emulation.last_barrier_sites():
            sites.setdefault(site, []).append((kind, inputs, ref))
    assert any(s.startswith("cuda_common.cuh") for s in sites) and any(s.startswith("tree.cuh") for s in sites)
    uncaught = []
    for site, uses in sites.items():
        caught = False
        for kind, inputs, ref in uses:
            for schedule in SCHEDULES:
                try:
                    got = runs[kind][1](**inputs, schedule=schedule, schedule_seed=1, drop_barrier=site)
                except cuda_emulation.EmulationError:
                    caught = True
                else:
                    caught = caught or not all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
                if caught:
                    break
            if caught:
                break
        if not caught:
            uncaught.append(site)
    assert not uncaught, f"dropping these barriers changed nothing under any schedule: {uncaught}"
