"""The sampling mask (``return_mask=True``): per emitted token, the kept set of its row's target.

Every emitted token lies in its mask; each mask equals the non-speculative sampler's kept set of that row
(the reference's truncation, ``reference/sampling.py``, row by row in this file: an oracle independent of
``specdec_kernels.sampling_mask``); every backend and method gives the reference's mask; two planted bugs
(the untruncated row's set, the next row's set) fail these checks; the off path returns the plain result.
"""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import api
from specdec_kernels import sampling_mask as sm
from specdec_kernels.exactness import cuda_emulation
from specdec_kernels.reference import sampling
from tests.conftest import DEVICE, skip_if_interpreter_expensive, slow_when_interpreted
from tests.native.test_native import _chain_case, _tree_case

BACKENDS = sk.available_backends(DEVICE)

CHAIN_CASES = [
    dict(V=7, dtype=torch.float32, probs=False),
    dict(V=1000, dtype=torch.bfloat16, probs=True, top_k=True),
    dict(V=1000, dtype=torch.float16, probs=True, top_p=True),
    dict(V=4099, dtype=torch.float32, probs=False, top_k=True, top_p=True),
    dict(V=777, dtype=torch.float32, probs=True, specials=True, top_k=True, top_p=True),
    dict(V=5000, dtype=torch.float32, probs=True, top_p=True, greedy_frac=0.0, scale=0.05),  # wide top-p sets
]
TREE_CASES = [
    dict(V=50, dtype=torch.float32, probs=True, sibling="iid", top_p=True),
    dict(V=2000, dtype=torch.bfloat16, probs=False, top_k=True, top_p=True),
    dict(V=2000, dtype=torch.float32, probs=True, sibling="without_replacement", top_k=True, top_p=True),
]


def _case_id(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items() if k != "dtype") + f"-{str(case['dtype'])[6:]}"


def _chain_inputs(case: dict, B: int, seed: int) -> dict:
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    return _chain_case(B, 4, V, dtype, torch.Generator().manual_seed(seed), **case)


def _tree_inputs(case: dict, B: int, seed: int) -> dict:
    case = dict(case)
    V, dtype = case.pop("V"), case.pop("dtype")
    return _tree_case(B, V, dtype, torch.Generator().manual_seed(seed), **case)


# ------------------------------------------------------------------------------------------------------
# The oracle: the reference sampler's kept set of one row, and the row of each emitted token
# ------------------------------------------------------------------------------------------------------

def _oracle_row(row: torch.Tensor, temperature: float, top_k, top_p) -> list[int]:
    """Kept ids of one target row by the reference's own transforms (full sorts), as the non-speculative
    sampler keeps them: finite after truncation, the argmax set when greedy, [0] when nothing is."""
    row = row[None, :]
    if temperature == 0:
        g = sampling.greedy_logits(row)[0]
        ids = (g == g.max()).nonzero().flatten() if g.max() > float("-inf") else torch.zeros(0, dtype=torch.int64)
    else:
        k = None if top_k is None else torch.tensor([top_k])
        p = None if top_p is None else torch.tensor([top_p])
        z = sampling.target_logits(row, torch.tensor([temperature]), k, p)[0]
        ids = (z > float("-inf")).nonzero().flatten()
    return ids.tolist() or [0]


def _param(x, b):
    return None if x is None else x[b].item()


def check_mask(inputs: dict, result, mask: sk.SamplingMask, rows: list[list[int]]) -> None:
    """Raise AssertionError unless ``mask`` is, token for token, the oracle's kept set of the row each emitted
    token was decided at (``rows[b][j]`` for output slot j of request b) and holds the emitted token."""
    out = result.output_token_ids.cpu()
    logits = inputs["target_logits"]
    temperature, top_k, top_p = inputs["temperature"], inputs.get("top_k"), inputs.get("top_p")
    assert mask.indptr.dtype == torch.int64 and mask.indices.dtype == torch.int32
    assert mask.cu_num_emitted.dtype == torch.int64
    lists = mask.tolist()
    assert len(lists) == out.shape[0]
    for b, per_token in enumerate(lists):
        emitted = [t for t in out[b].tolist() if t >= 0]
        assert len(per_token) == len(emitted), f"request {b}: {len(per_token)} masks for {len(emitted)} tokens"
        for j, (token, kept) in enumerate(zip(emitted, per_token, strict=True)):
            assert token in kept, f"request {b} token {j}: emitted {token} not in its mask"
            want = _oracle_row(logits[rows[b][j]], temperature[b].item(), _param(top_k, b), _param(top_p, b))
            assert kept == want, (f"request {b} token {j} (row {rows[b][j]}): mask of {len(kept)} ids "
                                  f"{kept[:6]}... != the row's kept set of {len(want)} ids {want[:6]}...")


def _chain_oracle_rows(inputs: dict, result) -> list[list[int]]:
    cu = inputs["cu_num_draft_tokens"].tolist()
    return [[cu[b] + b + j for j in range(result.output_token_ids.shape[1])] for b in range(len(cu) - 1)]


def _tree_oracle_rows(inputs: dict, result) -> list[list[int]]:
    cu = inputs["cu_num_nodes"].tolist()
    nodes = result.accepted_nodes.cpu().tolist()
    return [[cu[b] + n for n in nodes[b]] for b in range(len(cu) - 1)]


def _moved(inputs: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _on_cpu(result, mask):
    return type(result)(*(t.cpu() for t in result)), sk.SamplingMask(*(t.cpu() for t in mask))


def _assert_same_mask(got: sk.SamplingMask, want: sk.SamplingMask, what) -> None:
    for name, g, w in zip(want._fields, got, want, strict=True):
        assert torch.equal(g, w), f"{name} differs from the reference's: {what}"


# ------------------------------------------------------------------------------------------------------
# kept_ids: the post-pass equals the reference's truncation row for row
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("V", [7, 300, 4096, 4097, 20011])
@pytest.mark.parametrize("scale", [0.01, 1.0, 3.0, 12.0])
def test_kept_sets_equal_reference_truncation(V, scale):
    gen = torch.Generator().manual_seed(V * 100 + int(scale * 100))
    R = 16
    logits = torch.randn(R, V, generator=gen) * scale
    logits[0] = float("-inf")  # keeps nothing: {0}
    logits[1, :3] = float("nan")
    logits[2] = torch.round(logits[2])  # ties everywhere, at top-k's k-th value and top-p's boundary
    logits[3, V // 2] = float("inf")
    logits[4, : V // 2] = float("-inf")  # fewer finite values than some k
    temperature = torch.rand(R, generator=gen) + 0.2
    temperature[::5] = 0.0
    top_k = torch.randint(0, min(V, 600), (R,), generator=gen, dtype=torch.int32)
    top_p = torch.rand(R, generator=gen) * 0.99 + 0.01
    top_p[::7] = 1.0
    top_k[5] = 1  # k-th value = the max
    logits[6, : V // 3] = logits[6].max()  # ties at the max past k
    top_k[6] = 3
    for k, p in [(top_k, top_p), (None, top_p), (top_k, None), (None, None)]:
        ids = sm.kept_ids(logits, temperature, k, p)
        assert len(ids) == R and all(x.dtype == torch.int32 for x in ids)
        for r in range(R):
            got = ids[r].tolist()
            want = _oracle_row(logits[r], temperature[r].item(), _param(k, r), _param(p, r))
            assert got == want, f"row {r} (top_k {k is not None}, top_p {p is not None}): {len(got)} != {len(want)} ids"


def test_wide_top_p_sets():
    """Near-uniform rows keep thousands of tokens under top_p=0.99 (the boundary deep inside the row)."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 20000, generator=gen) * 0.01
    ids = sm.kept_ids(logits, torch.ones(4), None, torch.full((4,), 0.99))
    assert all(x.numel() > 10000 for x in ids)
    want = sampling.target_logits(logits, torch.ones(4), None, torch.full((4,), 0.99)) > float("-inf")
    assert [x.tolist() for x in ids] == [w.nonzero().flatten().tolist() for w in want]


# ------------------------------------------------------------------------------------------------------
# Every backend and method: the oracle's masks, and the reference's
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", slow_when_interpreted(BACKENDS))
@pytest.mark.parametrize("method", api.CHAIN_METHODS)
@pytest.mark.parametrize("case", CHAIN_CASES, ids=_case_id)
def test_chain_mask(case, method, backend):
    i = CHAIN_CASES.index(case)
    inputs = _chain_inputs(case, 6, 100 + i)
    ref, ref_mask = sk.verify_chain(**inputs, backend="reference", method=method, return_mask=True)
    check_mask(inputs, ref, ref_mask, _chain_oracle_rows(inputs, ref))
    if backend != "reference":
        device = "cpu" if backend == "cpu" else DEVICE
        res, mask = _on_cpu(*sk.verify_chain(**_moved(inputs, device), backend=backend, method=method,
                                             return_mask=True))
        assert torch.equal(res.output_token_ids, ref.output_token_ids)
        _assert_same_mask(mask, ref_mask, (backend, method, case))


@pytest.mark.parametrize("backend", slow_when_interpreted(BACKENDS))
@pytest.mark.parametrize("method", api.TREE_METHODS)
@pytest.mark.parametrize("case", TREE_CASES, ids=_case_id)
def test_tree_mask(case, method, backend):
    i = TREE_CASES.index(case)
    inputs = _tree_inputs(case, 5, 200 + i)
    ref, ref_mask = sk.verify_tree(**inputs, backend="reference", method=method, return_mask=True)
    check_mask(inputs, ref, ref_mask, _tree_oracle_rows(inputs, ref))
    if backend != "reference":
        device = "cpu" if backend == "cpu" else DEVICE
        res, mask = _on_cpu(*sk.verify_tree(**_moved(inputs, device), backend=backend, method=method,
                                            return_mask=True))
        assert torch.equal(res.output_token_ids, ref.output_token_ids)
        _assert_same_mask(mask, ref_mask, (backend, method, case))


@pytest.mark.native
@pytest.mark.skipif(not cuda_emulation.available(), reason="CUDA host emulation not built (setup.py build_ext)")
@pytest.mark.parametrize("case", [CHAIN_CASES[3], CHAIN_CASES[4]], ids=_case_id)
@pytest.mark.parametrize("method", api.CHAIN_METHODS)
def test_chain_mask_cuda_emulation(case, method):
    """The CUDA kernels (host emulation) emit the reference's tokens, and the mask from the thresholds they
    write is the reference's."""
    inputs = _chain_inputs(case, 6, 300)
    ref, ref_mask = sk.verify_chain(**inputs, backend="reference", method=method, return_mask=True)
    args = api.checked_chain_args(**inputs)
    threshold = api._threshold_buffer(args[0])
    res = cuda_emulation.verify_chain(**inputs, method=method, row_threshold=threshold)
    mask = sm.chain_sampling_mask(args, res, threshold)
    check_mask(inputs, res, mask, _chain_oracle_rows(inputs, res))
    _assert_same_mask(mask, ref_mask, ("cuda_emulation", method, case))


@pytest.mark.native
@pytest.mark.skipif(not cuda_emulation.available(), reason="CUDA host emulation not built (setup.py build_ext)")
@pytest.mark.parametrize("method", api.TREE_METHODS)
def test_tree_mask_cuda_emulation(method):
    case = TREE_CASES[2]
    inputs = _tree_inputs(case, 5, 301)
    ref, ref_mask = sk.verify_tree(**inputs, backend="reference", method=method, return_mask=True)
    args = api.checked_tree_args(**inputs)
    threshold = api._threshold_buffer(args[0])
    res = cuda_emulation.verify_tree(**inputs, method=method, row_threshold=threshold)
    mask = sm.tree_sampling_mask(args, res, threshold)
    check_mask(inputs, res, mask, _tree_oracle_rows(inputs, res))
    _assert_same_mask(mask, ref_mask, ("cuda_emulation", method, case))


def _support_row(kind: str) -> tuple[torch.Tensor, dict, list[int]]:
    """One target row, its truncation and its kept set: top-k with a tie at the k-th value (V = 50), or top-p
    over V = 5000 (the native kernel's bucketed search) keeping six tokens against a long thin tail."""
    if kind == "top_k":
        row = torch.full((50,), -2.0)
        row[[7, 3, 11, 20, 21, 40, 41]] = torch.tensor([3.0, 2.9, 2.8, 2.6, 2.6, 2.0, 1.9])
        return row, dict(top_k=4, top_p=0.999), [3, 7, 11, 20, 21]
    row = torch.full((5000,), -3.0)
    hot = [4321, 17, 999, 2500, 3, 4998]
    row[hot] = torch.tensor([5.0, 4.9, 4.8, 4.7, 4.6, 4.5])
    return row, dict(top_k=0, top_p=0.7), sorted(hot)


@pytest.mark.parametrize("backend", slow_when_interpreted(BACKENDS))
@pytest.mark.parametrize("kind", ["top_k", "top_p"])
def test_mask_is_the_support_the_backend_samples(kind, backend):
    """One row, 400 seeds: the tokens a backend draws are exactly its mask (each kept token has probability
    >= 4 %, so every one shows up with these seeds, and the truncated ones never may)."""
    skip_if_interpreter_expensive(backend, cheap=kind == "top_k")
    n = 400
    row, trunc, want = _support_row(kind)
    device = "cpu" if backend == "cpu" else DEVICE
    args = dict(temperature=torch.ones(n), top_k=torch.full((n,), trunc["top_k"], dtype=torch.int32),
                top_p=torch.full((n,), trunc["top_p"]), seed=torch.arange(n) * 7919,
                position=torch.zeros(n, dtype=torch.int64))
    no_drafts = torch.zeros(0, dtype=torch.int64, device=device)
    cu = torch.zeros(n + 1, dtype=torch.int64, device=device)
    res, mask = sk.verify_chain(row.expand(n, -1).contiguous().to(device), no_drafts, cu, **_moved(args, device),
                                backend=backend, return_mask=True)
    res, mask = _on_cpu(res, mask)
    assert all(k == [want] for k in mask.tolist())
    assert sorted(set(res.output_token_ids[:, 0].tolist())) == want


def test_greedy_mask_is_the_tied_argmax_set():
    """A greedy row with tied maxima keeps every tied token; the greedy path emits the lowest of them."""
    logits = torch.zeros(2, 10)
    logits[0, [3, 6, 8]] = 5.0
    logits[1, 2] = 1.0
    res, mask = sk.verify_chain(logits, torch.tensor([6]), torch.tensor([0, 1]), temperature=torch.zeros(1),
                                backend="reference", return_mask=True)
    assert res.output_token_ids.tolist() == [[3, -1]]  # draft 6 rejected: the argmax with ties to index 3
    assert mask.tolist() == [[[3, 6, 8]]]


def test_row_keeping_nothing_masks_token_zero():
    logits = torch.full((1, 10), float("-inf"))
    res, mask = sk.verify_chain(logits, torch.zeros(0, dtype=torch.int64), torch.tensor([0, 0]),
                                temperature=torch.ones(1), seed=torch.tensor([1]), return_mask=True)
    assert res.output_token_ids.tolist() == [[0]]
    assert mask.tolist() == [[[0]]]


def test_empty_batch():
    for verify, args in ((sk.verify_chain, (torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64))),
                         (sk.verify_tree, (torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64),
                                           torch.zeros(0, dtype=torch.int64)))):
        _, mask = verify(*args, torch.zeros(1, dtype=torch.int64), backend="reference", return_mask=True)
        assert mask.indptr.tolist() == [0] and mask.indices.numel() == 0 and mask.cu_num_emitted.tolist() == [0]


@pytest.mark.parametrize("backend", slow_when_interpreted([b for b in BACKENDS if b != "cpu"]))
def test_chains_cut_at_max_draft_len(backend):
    """validate=False with chains longer than max_draft_len: the row after the last kept draft is the bonus
    row, and the mask follows it (the CPU backend raises on such a cu instead)."""
    inputs = _chain_inputs(CHAIN_CASES[3], 6, 104)
    assert int((inputs["cu_num_draft_tokens"][1:] - inputs["cu_num_draft_tokens"][:-1]).max()) > 1
    device = "cpu" if backend == "cpu" else DEVICE
    res, mask = _on_cpu(*sk.verify_chain(**_moved(inputs, device), backend=backend, max_draft_len=1,
                                         validate=False, return_mask=True))
    check_mask(inputs, res, mask, _chain_oracle_rows(inputs, res))


# ------------------------------------------------------------------------------------------------------
# Planted bugs fail the checks above
# ------------------------------------------------------------------------------------------------------

def _untruncated_kept_ids(logits, temperature, top_k, top_p):
    return _KEPT_IDS(logits, temperature, None, None)


def _untruncated_by_threshold(z, threshold):
    return z > float("-inf")


_KEPT_IDS = sm.kept_ids


@pytest.mark.parametrize("mutant", ["untruncated_row", "next_row"])
def test_planted_bugs_fail(mutant, monkeypatch):
    """Both ways to the mask (the thresholds every backend writes, the post-pass ``kept_ids`` that re-derives
    them) fail the checks with the untruncated row's set, or with the next row's."""
    if mutant == "untruncated_row":
        monkeypatch.setattr(sm, "kept_ids", _untruncated_kept_ids)
        monkeypatch.setattr(sm, "kept_by_threshold", _untruncated_by_threshold)
    else:
        chain_rows, tree_rows = sm.chain_rows, sm.tree_rows
        monkeypatch.setattr(sm, "chain_rows", lambda cu, n, w: chain_rows(cu, n, w) + 1)
        monkeypatch.setattr(sm, "tree_rows", lambda cu, n, nodes: tree_rows(cu, n, nodes) + 1)
    inputs = _chain_inputs(CHAIN_CASES[3], 6, 103)
    res, mask = sk.verify_chain(**inputs, backend="reference", return_mask=True)
    post_pass = sm.chain_sampling_mask(api.checked_chain_args(**inputs), res)
    for m in (mask, post_pass):
        with pytest.raises(AssertionError):
            check_mask(inputs, res, m, _chain_oracle_rows(inputs, res))
    inputs = _tree_inputs(TREE_CASES[1], 5, 201)
    res, mask = sk.verify_tree(**inputs, backend="reference", return_mask=True)
    post_pass = sm.tree_sampling_mask(api.checked_tree_args(**inputs), res)
    for m in (mask, post_pass):
        with pytest.raises(AssertionError):
            check_mask(inputs, res, m, _tree_oracle_rows(inputs, res))


# ------------------------------------------------------------------------------------------------------
# The argument, and the off path
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [1, 0, "yes", None, torch.tensor(True)])
def test_return_mask_must_be_a_bool(value):
    chain = _chain_inputs(CHAIN_CASES[0], 2, 1)
    tree = _tree_inputs(TREE_CASES[0], 2, 1)
    with pytest.raises(TypeError, match="return_mask must be a bool"):
        sk.verify_chain(**chain, return_mask=value)
    with pytest.raises(TypeError, match="return_mask must be a bool"):
        sk.verify_tree(**tree, return_mask=value)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "triton"])
def test_off_returns_the_plain_result_and_builds_no_mask(backend, monkeypatch):
    """Off (the default), on the checked path and on the unchecked CPU one, a call returns its result alone
    and never builds a mask."""
    def forbidden(*args):
        raise AssertionError("the mask was built with return_mask=False")

    monkeypatch.setattr(sm, "chain_sampling_mask", forbidden)
    monkeypatch.setattr(sm, "tree_sampling_mask", forbidden)
    inputs = _moved(_chain_inputs(CHAIN_CASES[0], 3, 2), "cpu" if backend == "cpu" else DEVICE)
    for validate in (True, False):
        for kwargs in ({}, {"return_mask": False}):
            res = sk.verify_chain(**inputs, backend=backend, validate=validate, max_draft_len=4, **kwargs)
            assert isinstance(res, sk.ChainResult)
    tree = _moved(_tree_inputs(TREE_CASES[0], 2, 2), "cpu" if backend == "cpu" else DEVICE)
    assert isinstance(sk.verify_tree(**tree, backend=backend), sk.TreeResult)
