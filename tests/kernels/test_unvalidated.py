"""validate=False on inconsistent inputs: every backend stays in bounds and in the vocabulary.

With validation off (CUDA-graph capture) nothing reads tensor values, so the kernels meet whatever a caller's
bug produces. The cases the audit found (the reference's repeat_interleave writing out of bounds on negative
lengths, tree paths crashing on a bad cu, the Triton kernels reading logits row -99999 and writing past their
output row when max_draft_len is too small) are pinned below, then a seeded hypothesis campaign
(``tests.harness.fuzz``) draws decreasing / negative / past-the-end cu, garbage parents and ids,
widths too small, garbage sampling parameters, NaN/inf logits and guard rows that expose any out-of-bounds
read, and checks every backend (module docstring of ``fuzz``). Where the clamping rules define one answer
(a non-decreasing cu: ``reference.chain.chain_spans``, ``reference.tree.tree_spans``) the backends that answer
must agree token for token; the CPU backend alone may refuse an inconsistent cu (ValueError: it checks its
host-resident cu for free).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec_kernels as sk
from tests.conftest import DEVICE, INTERPRETED_TRITON
from tests.harness import fuzz
from tests.harness.fuzz import FuzzCall, chain_call, outcomes, problems, tree_call

BACKENDS = fuzz.default_backends(DEVICE)  # every backend, and the raw native op
FUZZ = settings(max_examples=80 if INTERPRETED_TRITON and "triton" in BACKENDS else 150, deadline=None,
                derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _call(op: str, vocab: int = 6, comparable: bool = False, **kwargs) -> FuzzCall:
    """A hand-written call whose logits sit between guard rows (token V - 1 only there)."""
    rows = kwargs["target_logits_rows"]
    gen = torch.Generator().manual_seed(rows * 7 + vocab)
    buffer = torch.full((rows + 2 * fuzz.GUARD_ROWS, vocab), -1.0e4)
    buffer[:, vocab - 1] = 1.0e4
    buffer[fuzz.GUARD_ROWS : fuzz.GUARD_ROWS + rows, : vocab - 1] = torch.randn(rows, vocab - 1, generator=gen)
    buffer[fuzz.GUARD_ROWS : fuzz.GUARD_ROWS + rows, vocab - 1] = float("-inf")
    kw = {k: v for k, v in kwargs.items() if k != "target_logits_rows"}
    num_reqs = kw["cu_num_draft_tokens" if op == "chain" else "cu_num_nodes"].numel() - 1
    kw.update(target_logits=buffer[fuzz.GUARD_ROWS : fuzz.GUARD_ROWS + rows], validate=False,
              temperature=torch.tensor([1.0, 0.0, 0.7, 1.3][:num_reqs]), seed=torch.arange(num_reqs) + 11)
    width = kw.get("max_draft_len" if op == "chain" else "max_depth")
    return FuzzCall(op, kw, vocab, rows, width, comparable, vocab - 1)


def _check(call: FuzzCall, backends: list[str] = BACKENDS) -> dict:
    results = outcomes(call, backends, DEVICE)
    assert not problems(call, results), problems(call, results)
    return results


CHAIN_CASES = {
    # repeat_interleave(output_size=N) wrote out of bounds on negative repeats (abort / free(): invalid pointer)
    "negative length": dict(cu_num_draft_tokens=torch.tensor([0, -3, 5]), max_draft_len=5),
    "sum past the end": dict(cu_num_draft_tokens=torch.tensor([0, 2, 9]), max_draft_len=9),
    # Triton read logits row -99999 + b
    "start far before the rows": dict(cu_num_draft_tokens=torch.tensor([-99999, 2, 5]), max_draft_len=5),
    "length far past the rows": dict(cu_num_draft_tokens=torch.tensor([0, 99999, 5]), max_draft_len=5),
    "int64 extremes": dict(cu_num_draft_tokens=torch.tensor([-(2**63), 2**63 - 1, 5]), max_draft_len=5),
    # Triton wrote past its output row
    "max_draft_len too small": dict(cu_num_draft_tokens=torch.tensor([0, 4, 5]), max_draft_len=1),
    "computed width, garbage cu": dict(cu_num_draft_tokens=torch.tensor([3, -7, 5]), max_draft_len=None),
}


@pytest.mark.parametrize("name", list(CHAIN_CASES))
@pytest.mark.slow
def test_chain_inconsistent_cu_stays_in_bounds(name):
    ids = torch.tensor([0, 1, 2, 3, 4])
    case = CHAIN_CASES[name]
    _check(_call("chain", draft_token_ids=ids, target_logits_rows=7, **case))
    probs = torch.softmax(torch.randn(5, 6, generator=torch.Generator().manual_seed(1)), -1)
    _check(_call("chain", draft_token_ids=ids, draft_probs=probs, target_logits_rows=7, **case))


def test_chain_longer_than_max_draft_len_is_cut_alike_everywhere():
    """A valid cu with max_draft_len too small: drafts past it are ignored and the row after the last kept
    draft is sampled as the bonus row, on every backend that answers (the CPU one refuses)."""
    cut = sk.verify_chain(torch.zeros(4, 6), torch.tensor([0, 0, 0]), torch.tensor([0, 3]), temperature=torch.zeros(1),
                          max_draft_len=1, validate=False, backend="reference")
    assert cut.output_token_ids.tolist() == [[0, 0]] and cut.num_accepted.tolist() == [1]
    call = _call("chain", comparable=True, draft_token_ids=torch.tensor([0, 1, 2, 3, 4]),
                 cu_num_draft_tokens=torch.tensor([0, 4, 5]), max_draft_len=2, target_logits_rows=7)
    results = _check(call)
    answered = [b for b, r in results.items() if not isinstance(r, Exception)]
    assert "reference" in answered and len(answered) >= 1
    assert isinstance(results.get("cpu", ValueError()), ValueError)


TREE_CASES = {
    "negative length": dict(cu_num_nodes=torch.tensor([0, -2, 5]), max_depth=None),
    "sum past the end": dict(cu_num_nodes=torch.tensor([0, 3, 9]), max_depth=3),
    "start far before the nodes": dict(cu_num_nodes=torch.tensor([-99999, 2, 5]), max_depth=2),
    "int64 extremes": dict(cu_num_nodes=torch.tensor([2**63 - 1, -(2**63), 5]), max_depth=None),
    "empty request": dict(cu_num_nodes=torch.tensor([0, 0, 5]), max_depth=None),
}


@pytest.mark.parametrize("name", list(TREE_CASES))
def test_tree_inconsistent_cu_stays_in_bounds(name):
    case = TREE_CASES[name]
    parent = torch.tensor([-1, 0, 0, -1, 0])
    ids = torch.tensor([0, 1, 2, 3, 4])
    _check(_call("tree", node_token_ids=ids, parent=parent, target_logits_rows=5, **case))
    probs = torch.softmax(torch.randn(5, 6, generator=torch.Generator().manual_seed(2)), -1)
    _check(_call("tree", node_token_ids=ids, parent=torch.tensor([7, -9, 2**62, 0, -(2**63)]), draft_probs=probs,
                 sibling_sampling="without_replacement", target_logits_rows=5, **case))


def test_tree_request_without_nodes_verifies_nothing():
    """A request whose clamped span is empty emits no token and no path, on every backend that answers."""
    call = _call("tree", comparable=True, node_token_ids=torch.tensor([0, 1, 2]), parent=torch.tensor([-1, 0, -1]),
                 cu_num_nodes=torch.tensor([0, 2, 2, 3]), max_depth=1, target_logits_rows=3)
    for res in _check(call).values():
        if not isinstance(res, Exception):
            assert res.output_token_ids[1].tolist() == [-1, -1] and res.accepted_nodes[1].tolist() == [-1, -1]
            assert int(res.num_accepted[1]) == 0


@given(call=chain_call())
@FUZZ
@pytest.mark.slow
def test_fuzz_chain_unvalidated(call):
    _check(call)


@given(call=tree_call())
@FUZZ
@pytest.mark.slow
def test_fuzz_tree_unvalidated(call):
    _check(call)


def _nan_off_draft(q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """q with NaN in one entry per row other than the drafted token's (a drafter bug; validation off)."""
    q = q.clone()
    q[torch.arange(len(ids)), (ids + 1) % q.shape[-1]] = float("nan")
    return q


@pytest.mark.slow
def test_nan_draft_probs_count_as_zero_in_the_residual_on_every_backend():
    """max(0, p - q) with a NaN q entry is 0 in the kernels; the reference used to keep the NaN (clamp), so its
    residual sample disagreed with theirs (chain and tree)."""
    gen = torch.Generator().manual_seed(3)
    b, k, v = 64, 3, 8
    logits = torch.randn(b * (k + 1), v, generator=gen)
    ids = torch.randint(0, v, (b * k,), generator=gen)
    q = _nan_off_draft(torch.softmax(torch.randn(b * k, v, generator=gen), -1), ids)
    cu = torch.arange(0, b * k + 1, k)
    out = {be: sk.verify_chain(logits.to(DEVICE), ids.to(DEVICE), cu.to(DEVICE), q.to(DEVICE),
                               torch.ones(b, device=DEVICE), seed=torch.arange(b, device=DEVICE), backend=be,
                               validate=False).output_token_ids.cpu() for be in sk.available_backends(DEVICE)}
    assert len(out) >= 2, out.keys()
    for be, tokens in out.items():
        assert torch.equal(tokens, out["reference"]), be

    n = 5  # per request: the root, its two children and one child under each
    parent = torch.tensor([-1, 0, 0, 1, 2]).repeat(b)
    node_ids = torch.randint(0, v, (b * n,), generator=gen)
    tree_logits = torch.randn(b * n, v, generator=gen)
    tq = _nan_off_draft(torch.softmax(torch.randn(b * n, v, generator=gen), -1), node_ids)
    cu_nodes = torch.arange(0, b * n + 1, n)
    trees = {be: sk.verify_tree(tree_logits.to(DEVICE), node_ids.to(DEVICE), parent.to(DEVICE), cu_nodes.to(DEVICE),
                                tq.to(DEVICE), torch.ones(b, device=DEVICE), seed=torch.arange(b, device=DEVICE),
                                sibling_sampling="without_replacement", backend=be,
                                validate=False).output_token_ids.cpu() for be in sk.available_backends(DEVICE)}
    for be, tokens in trees.items():
        assert torch.equal(tokens, trees["reference"]), be


@given(call=st.one_of(chain_call(), tree_call()), data=st.data())
@settings(max_examples=30 if INTERPRETED_TRITON and "triton" in BACKENDS else 60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.slow
def test_fuzz_block_and_traversal_unvalidated(call, data):
    """The same campaign through verify_chain(method="block") / verify_tree(method="traversal"), with draft
    probabilities added where the call has none (the optimal methods differ from token level only then)."""
    kwargs = dict(call.kwargs, method="block" if call.op == "chain" else "traversal")
    if kwargs.get("draft_probs") is None:
        rows = (kwargs["draft_token_ids"] if call.op == "chain" else kwargs["node_token_ids"]).numel()
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
        probs = torch.rand(rows, call.vocab, generator=g)
        kwargs["draft_probs"] = probs / probs.sum(-1, keepdim=True)
    _check(dataclasses.replace(call, kwargs=kwargs), [b for b in BACKENDS if b != "raw"])
