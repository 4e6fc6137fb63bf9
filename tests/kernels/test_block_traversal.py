"""verify_chain(method="block") and verify_tree(method="traversal"): API, equivalences, backend equality.

- the method argument is validated (a clear error naming it);
- deterministic drafts / trees and greedy requests run token level: identical tokens;
- on a chain, traversal is block verification token for token (every backend);
- every backend emits the reference's tokens for the same seeds (ragged batches, fp32/bf16/fp16,
  top-k / top-p, placeholders, NaN/inf logits, V not a power of two, V = 151936), every CPU build alike;
- a request's tokens depend only on its own inputs and seed (batch invariance).
"""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import native
from tests.conftest import TRITON_RUNNABLE, slow_when_interpreted
from tests.kernels.test_tree import _chain_case as _chain_and_tree
from tests.native.test_native import _chain_case, _run, _tree_case, cpu_builds

NATIVE = native.has_op("verify_chain_block", "cpu")
BACKENDS = (["cpu"] if NATIVE else []) + (["triton"] if TRITON_RUNNABLE else [])
requires_native = pytest.mark.skipif(not NATIVE, reason="specdec_kernels._C not built (pip install -e .)")


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _assert_same(ref, got, what) -> None:
    for name, r, g in zip(ref._fields, ref, got, strict=True):
        if not torch.equal(r, g):
            bad = (r != g).reshape(r.shape[0], -1).any(-1).nonzero().flatten()[:4].tolist()
            raise AssertionError(f"{name} differs for requests {bad}: reference {r[bad]} vs {g[bad]}; {what}")


# ------------------------------------------------------------------------------------------------------
# API
# ------------------------------------------------------------------------------------------------------

def test_method_is_validated():
    gen = torch.Generator().manual_seed(0)
    c = _chain_case(3, 2, 11, torch.float32, gen, probs=True)
    t = _tree_case(3, 11, torch.float32, gen, probs=True)
    with pytest.raises(ValueError, match="method"):
        sk.verify_chain(**c, method="traversal")
    with pytest.raises(ValueError, match="method"):
        sk.verify_tree(**t, method="block")
    with pytest.raises(TypeError, match="method"):
        sk.verify_chain(**c, method=None)
    with pytest.raises(TypeError, match="method"):
        sk.verify_tree(**t, method=1)


@pytest.mark.parametrize("backend", slow_when_interpreted(["reference"] + BACKENDS))
def test_deterministic_drafts_and_greedy_requests_run_token_level(backend):
    """No draft probabilities (one-hot q): no valid verifier beats token level, so "block" / "traversal" emit
    its tokens; greedy requests in a stochastic batch follow the argmax exactly as token level does."""
    gen = torch.Generator().manual_seed(1)
    for probs, greedy in ((False, 0.3), (True, 1.0)):
        c = _chain_case(9, 4, 37, torch.float32, gen, probs=probs, greedy_frac=greedy, top_k=True)
        t = _tree_case(9, 37, torch.float32, gen, probs=probs, greedy_frac=greedy, top_p=True)
        _assert_same(sk.verify_chain(**c, backend="reference"), sk.verify_chain(**c, backend=backend, method="block"),
                     f"chain probs={probs}")
        _assert_same(sk.verify_tree(**t, backend="reference"),
                     sk.verify_tree(**t, backend=backend, method="traversal"), f"tree probs={probs}")


@pytest.mark.parametrize("backend,vocab", slow_when_interpreted(
    [("reference", 13), ("reference", 300)] + [(b, v) for b in BACKENDS for v in ((13,) if b == "triton" else (13, 300))]))
def test_traversal_on_a_chain_is_block_verification(backend, vocab):
    chain, tree, sampling = _chain_and_tree(12 if backend == "triton" else 96, 4, vocab, 2, True)
    rb = sk.verify_chain(*chain, **sampling, backend=backend, method="block")
    rt = sk.verify_tree(*tree, **sampling, backend=backend, method="traversal")
    assert torch.equal(rb.output_token_ids, rt.output_token_ids) and torch.equal(rb.num_accepted, rt.num_accepted)
    assert float(rb.num_accepted.float().mean()) > 0.3  # the comparison covers accepted prefixes


@pytest.mark.parametrize("method", ["block", "traversal"])
def test_batch_invariance(method):
    gen = torch.Generator().manual_seed(5)
    if method == "block":
        c = _chain_case(6, 3, 50, torch.float32, gen, probs=True, greedy_frac=0.0)
        full = sk.verify_chain(**c, backend="reference", method=method)
        cu = c["cu_num_draft_tokens"]
        b = 3
        lo, hi = int(cu[b]), int(cu[b + 1])
        single = sk.verify_chain(
            c["target_logits"][lo + b: hi + b + 1], c["draft_token_ids"][lo:hi], torch.tensor([0, hi - lo]),
            c["draft_probs"][lo:hi], c["temperature"][b:b + 1], seed=c["seed"][b:b + 1],
            position=c["position"][b:b + 1], backend="reference", method=method, max_draft_len=full.output_token_ids.shape[1] - 1,
        )
        assert torch.equal(single.output_token_ids[0], full.output_token_ids[b])
    else:
        t = _tree_case(6, 50, torch.float32, gen, probs=True, greedy_frac=0.0, sibling="without_replacement")
        full = sk.verify_tree(**t, backend="reference", method=method)
        cu = t["cu_num_nodes"]
        b = 2
        lo, hi = int(cu[b]), int(cu[b + 1])
        single = sk.verify_tree(
            t["target_logits"][lo:hi], t["node_token_ids"][lo:hi], t["parent"][lo:hi], torch.tensor([0, hi - lo]),
            t["draft_probs"][lo:hi], t["temperature"][b:b + 1], seed=t["seed"][b:b + 1],
            position=t["position"][b:b + 1], sibling_sampling="without_replacement", backend="reference",
            method=method, max_depth=full.output_token_ids.shape[1] - 1,
        )
        assert torch.equal(single.output_token_ids[0], full.output_token_ids[b])
        assert torch.equal(single.accepted_nodes[0], full.accepted_nodes[b])


def test_results_stay_in_vocabulary_with_nan_inf_and_placeholders():
    gen = torch.Generator().manual_seed(6)
    c = _chain_case(12, 4, 41, torch.float32, gen, probs=True, specials=True, top_k=True, top_p=True)
    res = sk.verify_chain(**c, backend="reference", method="block")
    emitted = res.output_token_ids.gather(1, res.num_accepted.long()[:, None])
    assert ((emitted >= 0) & (emitted < 41)).all()
    t = _tree_case(12, 41, torch.float32, gen, probs=True, top_k=True)
    t["target_logits"][::3, :5] = float("nan")
    t["target_logits"][1::4] = float("-inf")
    res = sk.verify_tree(**t, backend="reference", method="traversal")
    emitted = res.output_token_ids.gather(1, res.num_accepted.long()[:, None])
    assert ((emitted >= 0) & (emitted < 41)).all()
    for b in range(12):  # the accepted path is a parent-child chain of real nodes
        k = int(res.num_accepted[b])
        nodes = res.accepted_nodes[b, : k + 1].tolist()
        first = int(t["cu_num_nodes"][b])
        for j in range(1, k + 1):
            assert int(t["parent"][first + nodes[j]]) == nodes[j - 1]
            assert int(t["node_token_ids"][first + nodes[j]]) == int(res.output_token_ids[b, j - 1]) >= 0


def test_empty_batches_and_chains_without_drafts():
    for method in ("token", "block"):
        res = sk.verify_chain(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                              draft_probs=torch.zeros(0, 5), temperature=torch.zeros(0), backend="reference",
                              method=method)
        assert res.output_token_ids.shape == (0, 1)
    logits = torch.randn(2, 7)
    kw = dict(draft_probs=torch.zeros(0, 7), temperature=torch.ones(2), seed=torch.tensor([3, 4]), backend="reference")
    block = sk.verify_chain(logits, torch.zeros(0, dtype=torch.long), torch.zeros(3, dtype=torch.long), method="block", **kw)
    token = sk.verify_chain(logits, torch.zeros(0, dtype=torch.long), torch.zeros(3, dtype=torch.long), **kw)
    assert _same(block, token)  # k = 0: both sample the bonus row with the bonus stream


# ------------------------------------------------------------------------------------------------------
# Backend equality
# ------------------------------------------------------------------------------------------------------

CHAIN_CASES = [
    dict(V=7, dtype=torch.float32),
    dict(V=1000, dtype=torch.float32, top_k=True),
    dict(V=1000, dtype=torch.bfloat16, top_p=True),
    dict(V=4099, dtype=torch.float16, top_k=True, top_p=True),
    dict(V=777, dtype=torch.float32, specials=True),
    dict(V=64, dtype=torch.float32, greedy_frac=0.0, scale=0.01),
]
TREE_CASES = [
    dict(V=50, dtype=torch.float32, sibling="iid"),
    dict(V=50, dtype=torch.float32, sibling="without_replacement"),
    dict(V=2000, dtype=torch.bfloat16, sibling="iid", top_k=True, top_p=True),
    dict(V=2000, dtype=torch.float16, sibling="without_replacement", top_p=True),
    dict(V=301, dtype=torch.float32, sibling="without_replacement", greedy_frac=0.0, top_k=True),
]


def _label(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items()).replace("torch.", "")


@requires_native
@pytest.mark.parametrize("case", CHAIN_CASES, ids=_label)
def test_block_cpu_matches_reference(case):
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(V + len(case))
    for B in (1, 24):
        c = _chain_case(B, 5, V, dtype, gen, probs=True, **case)
        _assert_same(sk.verify_chain(**c, backend="reference", method="block"),
                     sk.verify_chain(**c, backend="cpu", method="block"), f"B={B} {case}")


@requires_native
@pytest.mark.parametrize("case", TREE_CASES, ids=_label)
def test_traversal_cpu_matches_reference(case):
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(V + 7 * len(case))
    for B in (1, 24):
        t = _tree_case(B, V, dtype, gen, probs=True, max_nodes=12, **case)
        _assert_same(sk.verify_tree(**t, backend="reference", method="traversal"),
                     sk.verify_tree(**t, backend="cpu", method="traversal"), f"B={B} {case}")


@requires_native
def test_traversal_cpu_max_depth_and_broken_parents():
    gen = torch.Generator().manual_seed(9)
    t = _tree_case(10, 60, torch.float32, gen, probs=True, greedy_frac=0.0, max_nodes=12)
    for depth in (1, 2):
        _assert_same(sk.verify_tree(**t, backend="reference", method="traversal", max_depth=depth, validate=False),
                     sk.verify_tree(**t, backend="cpu", method="traversal", max_depth=depth, validate=False),
                     f"max_depth={depth}")
    t["parent"] = torch.where(torch.rand(t["parent"].shape, generator=gen) < 0.2, 9, t["parent"])
    _assert_same(sk.verify_tree(**t, backend="reference", method="traversal", validate=False, max_depth=5),
                 sk.verify_tree(**t, backend="cpu", method="traversal", validate=False, max_depth=5), "broken parents")


@requires_native
@pytest.mark.slow
def test_every_build_emits_the_same_tokens():
    code = """
        import torch, specdec_kernels as sk
        from tests.native.test_native import _chain_case, _tree_case
        gen = torch.Generator().manual_seed(15)
        c = _chain_case(3, 3, 4099, torch.bfloat16, gen, probs=True, greedy_frac=0.0, top_k=True)
        t = _tree_case(3, 4099, torch.float32, gen, probs=True, sibling="without_replacement", greedy_frac=0.0)
        rc = sk.verify_chain(**c, backend="cpu", method="block")
        rt = sk.verify_tree(**t, backend="cpu", method="traversal")
        ok = all(torch.equal(a, b) for a, b in zip(sk.verify_chain(**c, backend="reference", method="block"), rc))
        ok &= all(torch.equal(a, b) for a, b in zip(sk.verify_tree(**t, backend="reference", method="traversal"), rt))
        print(ok, rc.output_token_ids.tolist(), rt.output_token_ids.tolist())
    """
    outs = set()
    for isa in cpu_builds():
        proc = _run(code, SPECDEC_CPU_ISA=isa, OMP_NUM_THREADS="2")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.startswith("True"), (isa, proc.stdout)
        outs.add(proc.stdout)
    assert len(outs) == 1, outs


@requires_native
@pytest.mark.slow
def test_full_vocabulary():
    gen = torch.Generator().manual_seed(15)
    c = _chain_case(2, 3, 151936, torch.bfloat16, gen, probs=True, greedy_frac=0.0)
    t = _tree_case(1, 151936, torch.float32, gen, probs=True, sibling="without_replacement", greedy_frac=0.0,
                   max_nodes=5)
    _assert_same(sk.verify_chain(**c, backend="reference", method="block"),
                 sk.verify_chain(**c, backend="cpu", method="block"), "block V=151936")
    _assert_same(sk.verify_tree(**t, backend="reference", method="traversal"),
                 sk.verify_tree(**t, backend="cpu", method="traversal"), "traversal V=151936")


@requires_native
@pytest.mark.slow
def test_torch_ops_trace_under_compile():
    gen = torch.Generator().manual_seed(2)
    c = _chain_case(5, 3, 300, torch.float32, gen, probs=True, greedy_frac=0.0)
    args = (c["target_logits"], c["draft_token_ids"], c["cu_num_draft_tokens"], c["draft_probs"], c["temperature"],
            None, None, c["seed"], c["position"], 3)
    out = torch.compile(lambda *a: torch.ops.specdec.verify_chain_block(*a), fullgraph=True, backend="eager")(*args)
    ref = sk.verify_chain(**c, backend="reference", method="block", max_draft_len=3)
    assert torch.equal(out[0], ref.output_token_ids) and torch.equal(out[1], ref.num_accepted)


requires_triton = pytest.mark.skipif(not TRITON_RUNNABLE, reason="needs triton and a GPU, or TRITON_INTERPRET=1")


@requires_triton
@pytest.mark.parametrize("case", [CHAIN_CASES[0], CHAIN_CASES[2], CHAIN_CASES[4]], ids=_label)
@pytest.mark.slow
def test_block_triton_matches_reference(case):
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(3 * V + len(case))
    c = _chain_case(6, 4, V, dtype, gen, probs=True, **case)
    _assert_same(sk.verify_chain(**c, backend="reference", method="block"),
                 sk.verify_chain(**c, backend="triton", method="block"), case)


@requires_triton
@pytest.mark.parametrize("case", [TREE_CASES[0], TREE_CASES[1], TREE_CASES[3]], ids=_label)
@pytest.mark.slow
def test_traversal_triton_matches_reference(case):
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    gen = torch.Generator().manual_seed(5 * V + len(case))
    t = _tree_case(6, V, dtype, gen, probs=True, max_nodes=10, **case)
    _assert_same(sk.verify_tree(**t, backend="reference", method="traversal"),
                 sk.verify_tree(**t, backend="triton", method="traversal"), case)


@requires_triton
@pytest.mark.slow
def test_triton_full_vocabulary():
    gen = torch.Generator().manual_seed(21)
    c = _chain_case(1, 2, 151936, torch.bfloat16, gen, probs=True, greedy_frac=0.0)
    _assert_same(sk.verify_chain(**c, backend="reference", method="block"),
                 sk.verify_chain(**c, backend="triton", method="block"), "block V=151936")
    t = _tree_case(1, 151936, torch.float32, gen, probs=True, sibling="without_replacement", greedy_frac=0.0,
                   max_nodes=4)
    _assert_same(sk.verify_tree(**t, backend="reference", method="traversal"),
                 sk.verify_tree(**t, backend="triton", method="traversal"), "traversal V=151936")


def test_drafts_from_the_target_are_all_accepted():
    """q = p: every weight stays 1, so block accepts the whole block and traversal its first leaf's path."""
    gen = torch.Generator().manual_seed(8)
    B, k, V = 16, 4, 30
    logits = torch.randn(B * (k + 1), V, generator=gen) * 2
    rows = (torch.arange(B)[:, None] * (k + 1) + torch.arange(k)).flatten()
    p = torch.softmax(logits[rows], -1)
    drafts = torch.multinomial(p, 1, generator=gen).squeeze(1)
    kw = dict(temperature=torch.ones(B), seed=torch.arange(B), backend="reference")
    res = sk.verify_chain(logits, drafts, torch.arange(B + 1) * k, p, method="block", **kw)
    assert (res.num_accepted == k).all()
    parents = torch.tensor([-1, 0, 0, 1, 1])  # root -> (1, 2); 1 -> (3, 4)
    tree_logits = torch.randn(B * 5, V, generator=gen) * 2
    q = torch.softmax(tree_logits, -1)
    tokens = torch.full((B, 5), -1)
    for i in range(1, 5):
        tokens[:, i] = torch.multinomial(q.view(B, 5, V)[:, int(parents[i])], 1, generator=gen).squeeze(1)
    res = sk.verify_tree(tree_logits, tokens.flatten(), parents.repeat(B), torch.arange(B + 1) * 5, q,
                         method="traversal", **kw)
    assert (res.num_accepted == 2).all() and (res.accepted_nodes[:, 1] == 1).all() and (res.accepted_nodes[:, 2] == 3).all()
