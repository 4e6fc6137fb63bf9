"""The CUDA block and traversal kernels (block.cuh, traversal.cuh, block_traversal_cuda.cu), run on the CPU through
the host emulation (specdec_kernels.exactness.cuda_emulation), emit the reference's tokens for the same seeds.

The backend-equality cases of tests/kernels/test_block_traversal.py (ragged batches, fp32/bf16/fp16, top-k / top-p,
NaN/inf rows and placeholders, both sibling modes, greedy / random mixes, V = 151936), each under one of the
thread schedules, on H200 and B200; traversal on a chain equals block verification; max_depth and broken
parents without validation; the fuzz campaign's inconsistent calls stay in bounds; every __syncthreads of
the two kernels shown necessary by dropping it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec_kernels as sk
from specdec_kernels.exactness import cuda_emulation
from tests.harness import fuzz
from tests.kernels.test_block_traversal import CHAIN_CASES, TREE_CASES, _label
from tests.kernels.test_tree import _chain_case as _chain_and_tree
from tests.native.test_native import ROOT, _chain_case, _tree_case

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not cuda_emulation.available(), reason="CUDA host emulation not built (setup.py build_ext)"),
]

SCHEDULES = cuda_emulation.SCHEDULES
ARCHS = sorted(cuda_emulation.ARCHS.values())


def _assert_same(ref, got, what) -> None:
    for name, r, g in zip(ref._fields, ref, got, strict=True):
        if not torch.equal(r, g):
            bad = (r != g).reshape(r.shape[0], -1).any(-1).nonzero().flatten()[:4].tolist()
            raise AssertionError(f"{name} differs for requests {bad}: reference {r[bad]} vs cuda_emulation {g[bad]}; {what}")


def _kernels() -> set[str]:
    return {launch.kernel.split("<")[0].rsplit("::", 1)[-1] for launch in cuda_emulation.last_launches()}


@pytest.mark.parametrize("case", CHAIN_CASES, ids=_label)
def test_block_matches_reference(case):
    i = CHAIN_CASES.index(case)
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(V + len(case))
    for B in (1, 9):
        c = _chain_case(B, 5, V, dtype, gen, probs=True, **case)
        kw = dict(schedule=SCHEDULES[(i + B) % len(SCHEDULES)], schedule_seed=B, arch=ARCHS[(i + B) % 2])
        got = cuda_emulation.verify_chain(**c, method="block", **kw)
        assert _kernels() == {"chain_block_kernel"}
        _assert_same(sk.verify_chain(**c, backend="reference", method="block"), got, f"B={B} {case} {kw}")


@pytest.mark.parametrize("case", TREE_CASES, ids=_label)
def test_traversal_matches_reference(case):
    i = TREE_CASES.index(case)
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(V + 7 * len(case))
    for B in (1, 9):
        t = _tree_case(B, V, dtype, gen, probs=True, max_nodes=12, **case)
        kw = dict(schedule=SCHEDULES[(i + B + 1) % len(SCHEDULES)], schedule_seed=B, arch=ARCHS[(i + B) % 2])
        got = cuda_emulation.verify_tree(**t, method="traversal", **kw)
        assert _kernels() == {"tree_traversal_kernel"}
        _assert_same(sk.verify_tree(**t, backend="reference", method="traversal"), got, f"B={B} {case} {kw}")


def test_deterministic_drafts_run_token_level_and_traversal_on_a_chain_is_block():
    """No draft probabilities: "block" / "traversal" run the token-level kernels (as the binding does) and
    emit token level's tokens; on a chain, the traversal kernel emits the block kernel's tokens."""
    gen = torch.Generator().manual_seed(1)
    c = _chain_case(6, 4, 37, torch.float32, gen, probs=False, greedy_frac=0.3, top_k=True)
    t = _tree_case(6, 37, torch.float32, gen, probs=False, greedy_frac=0.3, top_p=True)
    _assert_same(sk.verify_chain(**c, backend="reference"), cuda_emulation.verify_chain(**c, method="block"), "chain")
    assert "chain_block_kernel" not in _kernels()
    _assert_same(sk.verify_tree(**t, backend="reference"), cuda_emulation.verify_tree(**t, method="traversal"), "tree")
    assert "tree_traversal_kernel" not in _kernels()
    chain, tree, sampling = _chain_and_tree(24, 4, 300, 2, True)
    rb = cuda_emulation.verify_chain(*chain, **sampling, method="block", schedule="random", schedule_seed=4)
    rt = cuda_emulation.verify_tree(*tree, **sampling, method="traversal", schedule="eager")
    assert torch.equal(rb.output_token_ids, rt.output_token_ids) and torch.equal(rb.num_accepted, rt.num_accepted)
    assert float(rb.num_accepted.float().mean()) > 0.3  # the comparison covers accepted prefixes


@pytest.mark.slow
def test_full_vocabulary():
    gen = torch.Generator().manual_seed(15)
    c = _chain_case(2, 3, 151936, torch.bfloat16, gen, probs=True, greedy_frac=0.0)
    t = _tree_case(1, 151936, torch.float32, gen, probs=True, sibling="without_replacement", greedy_frac=0.0,
                   max_nodes=5)
    _assert_same(sk.verify_chain(**c, backend="reference", method="block"),
                 cuda_emulation.verify_chain(**c, method="block", arch=cuda_emulation.ARCHS["b200"]), "block V=151936")
    _assert_same(sk.verify_tree(**t, backend="reference", method="traversal"),
                 cuda_emulation.verify_tree(**t, method="traversal"), "traversal V=151936")


def test_traversal_max_depth_and_broken_parents():
    gen = torch.Generator().manual_seed(9)
    t = _tree_case(10, 60, torch.float32, gen, probs=True, greedy_frac=0.0, max_nodes=12)
    for depth in (1, 2):
        kw = dict(method="traversal", max_depth=depth, validate=False)
        _assert_same(sk.verify_tree(**t, backend="reference", **kw), cuda_emulation.verify_tree(**t, **kw),
                     f"max_depth={depth}")
    t["parent"] = torch.where(torch.rand(t["parent"].shape, generator=gen) < 0.2, 9, t["parent"])
    kw = dict(method="traversal", validate=False, max_depth=5)
    _assert_same(sk.verify_tree(**t, backend="reference", **kw), cuda_emulation.verify_tree(**t, **kw), "broken parents")


@given(call=st.one_of(fuzz.chain_call(), fuzz.tree_call()), data=st.data())
@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.slow
def test_fuzz_unvalidated_stays_in_bounds(call, data):
    """validate=False on the fuzz campaign's inconsistent calls, with draft probabilities added where the
    call has none (the kernels run only on stochastic drafts): no guard row read, no canary written, tokens
    in [0, V), agreement with the reference wherever the clamping rules define one answer."""
    kwargs = dict(call.kwargs, method="block" if call.op == "chain" else "traversal")
    rows = (kwargs["draft_token_ids"] if call.op == "chain" else kwargs["node_token_ids"]).numel()
    if kwargs.get("draft_probs") is None and call.vocab > 0:
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
        probs = torch.rand(rows, call.vocab, generator=g)
        kwargs["draft_probs"] = probs / probs.sum(-1, keepdim=True)
    emulated = cuda_emulation.verify_chain if call.op == "chain" else cuda_emulation.verify_tree
    reference = sk.verify_chain if call.op == "chain" else sk.verify_tree
    results = {}
    for name, fn in (("cuda_emulation", emulated), ("reference", lambda **kw: reference(**kw, backend="reference"))):
        try:
            results[name] = fn(**kwargs)
        except Exception as exc:  # judged by fuzz.problems: no error is allowed here
            results[name] = exc
    assert not fuzz.problems(call, results), fuzz.problems(call, results)


def _close_draft_chain(gen: torch.Generator, B: int = 6, k: int = 4, V: int = 1001) -> dict:
    """Drafts from a draft model close to the target (q = softmax(z + small noise)): the residual
    max(0, w p - q) is small where p is large, so a thread that reads a row's p where it should read the
    residual (or another thread's p too early) picks a visibly different token."""
    logits = torch.randn(B * (k + 1), V, generator=gen) * 2.0
    rows = (torch.arange(B)[:, None] * (k + 1) + torch.arange(k)).flatten()
    q = torch.softmax(logits[rows] + 0.2 * torch.randn(B * k, V, generator=gen), -1)
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1)
    return dict(target_logits=logits, draft_token_ids=drafts, cu_num_draft_tokens=torch.arange(B + 1) * k,
                draft_probs=q, temperature=torch.ones(B), seed=torch.arange(B) * 101 + 7,
                position=torch.arange(B) * 13)


def _barrier_cases():
    """Stochastic chains and trees with and without truncation (top-k / top-p add block reductions between
    a row's use and the next row's writes, which would hide a missing barrier there), and a close draft
    model (a small residual, so that stale probabilities change tokens)."""
    gen = torch.Generator().manual_seed(23)
    cases = [("chain", _chain_case(5, 4, 2003, torch.float32, gen, probs=True, top_k=True, top_p=True, greedy_frac=0.0)),
             ("chain", _chain_case(6, 4, 1001, torch.float32, gen, probs=True, greedy_frac=0.0)),
             ("chain", _close_draft_chain(torch.Generator().manual_seed(31)))]
    for sibling, truncated in (("iid", True), ("iid", False), ("without_replacement", False)):
        cases.append(("tree", _tree_case(8, 200, torch.float32, gen, probs=True, sibling=sibling, greedy_frac=0.0,
                                         max_nodes=12, top_k=truncated)))
    return cases


RUNS = {"chain": (sk.verify_chain, cuda_emulation.verify_chain, "block"),
        "tree": (sk.verify_tree, cuda_emulation.verify_tree, "traversal")}


def barrier_uses() -> dict[str, list]:
    """Every __syncthreads the block / traversal kernels reach on the barrier cases: site -> [(kind, inputs,
    reference result)]."""
    sites: dict[str, list] = {}
    for kind, inputs in _barrier_cases():
        ref_fn, emu_fn, method = RUNS[kind]
        ref = ref_fn(**inputs, backend="reference", method=method)
        _assert_same(ref, emu_fn(**inputs, method=method), kind)
        for site in cuda_emulation.last_barrier_sites():
            sites.setdefault(site, []).append((kind, inputs, ref))
    return sites


def caught(site: str, uses: list) -> bool:
    """Whether dropping ``site`` changes the tokens or trips the emulation under some schedule."""
    for kind, inputs, ref in uses:
        _, emu_fn, method = RUNS[kind]
        for schedule in SCHEDULES:
            try:
                got = emu_fn(**inputs, method=method, schedule=schedule, schedule_seed=1, drop_barrier=site)
            except cuda_emulation.EmulationError:
                return True
            if not all(torch.equal(a, b) for a, b in zip(ref, got, strict=True)):
                return True
    return False


_CHILD = """
import sys
from tests.native.test_cuda_emulated_block_traversal import barrier_uses, caught
done = set(sys.argv[1:])
for site, uses in barrier_uses().items():
    if site not in done:
        print("start", site, flush=True)
        print("caught" if caught(site, uses) else "uncaught", site, flush=True)
"""


OWN = ("block.cuh", "traversal.cuh")
"""The kernels' own barriers; the shared reductions of cuda_common.cuh are shown necessary by
tests/native/test_cuda_emulated_kernels.py on the token-level kernels."""
NOT_EXPOSED: set[str] = set()
"""Own barriers these inputs do not expose (found by this test); any other uncaught one fails it."""


@pytest.mark.slow
def test_every_syncthreads_is_needed():
    """Plant a missing __syncthreads at each barrier the block / traversal kernels reach: some schedule must
    catch each of their own (but the ones listed in NOT_EXPOSED). Without a barrier, threads may read state
    another thread has not written yet (the poisoned workspace) and follow it out of bounds, which crashes
    the process: the trials run in a child process, a crash counts as caught (the planted bug showing), and
    the child is restarted after the site that crashed it."""
    sites = barrier_uses()
    assert any(s.startswith("block.cuh") for s in sites) and any(s.startswith("traversal.cuh") for s in sites)
    verdicts: dict[str, str] = {}
    while len(verdicts) < len(sites):
        proc = subprocess.run([sys.executable, "-c", _CHILD, *verdicts], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT}, timeout=900)
        started = None
        for line in proc.stdout.splitlines():
            word, site = line.split(" ", 1)
            if word == "start":
                started = site
            else:
                verdicts[site], started = word, None
        if proc.returncode == 0:
            break
        assert started is not None and proc.returncode < 0, proc.stderr[-2000:]  # killed by a signal mid-site
        verdicts[started] = "caught"
    assert set(verdicts) == set(sites), (verdicts, list(sites))
    uncaught = {site for site, verdict in verdicts.items() if verdict == "uncaught" and site.split(":")[0] in OWN}
    assert uncaught <= NOT_EXPOSED, f"dropping these barriers changed nothing under any schedule: {uncaught}"
