"""The sampling mask from the backends' own thresholds (``row_threshold``): every backend (the reference, the
native CPU, Triton and CUDA kernels) writes, in the verification pass, the threshold each decided row was
truncated with, and the mask is the finite scaled logits at or above it (``sampling_mask.kept_by_threshold``).

Checked here, per backend (CUDA through its host emulation, ``exactness.cuda_emulation``, and on a GPU where
there is one): the kept set of its thresholds is the reference sampler's kept
set (``tests/kernels/test_sampling_mask.py``'s oracle: full sorts) on rows built to sit on the boundaries
(tie groups at top-k's k-th value and at top-p's limit, tied greedy maxima, rows that keep nothing, NaN and
+inf logits, k past the finite values, V = 151936 rows); every decided row gets a threshold, the reference's
value wherever the row keeps something; and asking for them changes no token (the same call with and without
``row_threshold``, bit for bit, and the reference's tokens).
"""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import api, native
from specdec_kernels import sampling_mask as sm
from specdec_kernels.exactness import cuda_emulation
from tests.conftest import DEVICE, TRITON_RUNNABLE, skip_if_interpreter_expensive, slow_when_interpreted
from tests.kernels.test_sampling_mask import (
    CHAIN_CASES,
    TREE_CASES,
    _case_id,
    _chain_inputs,
    _chain_oracle_rows,
    _moved,
    _tree_inputs,
    _tree_oracle_rows,
    check_mask,
)

# Every backend that runs here, and "cuda_emulation" (the CUDA kernels on the host, through
# exactness.cuda_emulation rather than the api). Triton runs on DEVICE (the interpreter on CPU machines, where
# its cases are marked slow).
BACKENDS = (["reference"] + (["cpu"] if native.has_device("cpu") else [])
            + (["cuda"] if native.has_device("cuda") else [])
            + ([pytest.param("cuda_emulation", marks=pytest.mark.native)] if cuda_emulation.available() else [])
            + (["triton"] if TRITON_RUNNABLE else []))
NEG_INF, INF, NAN = float("-inf"), float("inf"), float("nan")


def _device(backend: str) -> str:
    return DEVICE if backend == "triton" else "cuda" if backend == "cuda" else "cpu"


def _emulated_op(op: str):
    """The CUDA host emulation of ``op`` with a backend function's signature (normalised positional arguments,
    ``row_threshold``)."""
    if op in ("chain", "chain_block"):
        method = "block" if op == "chain_block" else "token"
        return lambda *args, row_threshold=None: cuda_emulation.verify_chain(
            *args[:9], method=method, max_draft_len=args[9], row_threshold=row_threshold)
    method = "traversal" if op == "tree_traversal" else "token"
    return lambda *args, row_threshold=None: cuda_emulation.verify_tree(
        *args[:11], method=method, max_depth=args[11], row_threshold=row_threshold)


def _backend_op(backend: str, op: str):
    if backend == "cuda_emulation":
        return _emulated_op(op)
    return api._resolve(backend, torch.device(_device(backend)), op)


def _assert_reference_thresholds(args: tuple, temperature: torch.Tensor, rows: torch.Tensor, emitted: torch.Tensor,
                                 threshold: torch.Tensor, want: torch.Tensor) -> None:
    """The backend's ``threshold`` equals the reference's ``want`` at the row ``rows`` [B, W] of every emitted
    token (``emitted`` [B, W]) whose row keeps something; a row that keeps nothing may hold any threshold that
    keeps nothing (the reference writes top-p's +inf there, the native CPU kernel -inf: both masks are {0})."""
    decided = rows[emitted]
    t = temperature[:, None].expand_as(rows)[emitted]
    z = args[0][decided].float() / torch.where(t == 0, 1.0, t)[:, None]  # as the mask's compare scales rows
    nonempty = sm.kept_by_threshold(z, want[decided]).any(dim=-1)
    got, ref = threshold[decided], want[decided]
    assert not torch.isnan(got).any(), "a decided row without a threshold"
    same = (got == ref) | ~nonempty
    assert bool(same.all()), f"thresholds differ from the reference's: {got[~same]} != {ref[~same]}"
    assert not sm.kept_by_threshold(z[~nonempty], got[~nonempty]).any()


def _boundary_rows(V: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows [R, V] whose kept sets sit on the rules' boundaries, with their temperature, top_k, top_p [R]."""
    rows, params = [], []

    def add(values: dict[int, float], temperature=1.0, top_k=0, top_p=1.0, fill=-4.0):
        row = torch.full((V,), fill)
        for i, v in values.items():
            row[i] = v
        rows.append(row)
        params.append((temperature, top_k, top_p))

    add({7: 3.0, 3: 2.9, 11: 2.75, 20: 2.5, 21: 2.5, 40: 2.0}, top_k=4)  # tie at the k-th value: 5 kept
    add({5: 3.0, 6: 2.0, 9: 2.0, 30: 2.0, 31: 2.0, 50: 1.0}, top_k=3)  # a tie group from k-1 past k: 5 kept
    # Top-p at a tie group: one token of weight 1, three of e^-1, 60 of e^-5 (mass above the three: 0.399).
    add({8: 1.0, 2: 0.0, 12: 0.0, 63: 0.0}, top_p=0.41)  # just below it: all 4 kept
    add({8: 1.0, 2: 0.0, 12: 0.0, 63: 0.0}, top_p=0.39)  # just above it: the max alone
    add({8: 1.0, 2: 0.0, 12: 0.0, 63: 0.0}, top_k=2, top_p=0.9)  # top-k's tie (4 kept), then top-p over them
    add({1: 5.0, 4: 5.0, 60: 5.0, 9: 4.0}, temperature=0.0)  # greedy with tied maxima
    add({1: 5.0, 4: 5.0, 60: 5.0, 9: 4.0}, temperature=0.0, top_k=1, top_p=0.1)  # greedy ignores truncation
    add({}, fill=NEG_INF)  # keeps nothing: {0}
    add({}, fill=NEG_INF, top_k=3, top_p=0.5)
    add({}, temperature=0.0, fill=NEG_INF)
    add({3: NAN, 4: INF, 5: INF, 6: 1.0}, top_k=2)  # +inf is the largest finite float, NaN is never kept
    add({3: NAN, 4: INF, 6: 1.0}, temperature=0.0)
    add({10: 1.0, 11: 0.5, 12: 0.25}, top_k=10, fill=NEG_INF)  # k past the finite values: all 3 kept
    add({10: 1.0, 11: 0.5, 12: 0.25, 13: NAN}, fill=NEG_INF)  # untruncated: the finite values
    add({0: 2.0, 33: 1.9, 34: 1.9}, temperature=0.7, top_k=5, top_p=0.8)
    add({}, fill=0.0, top_p=0.3)  # a flat row: one tie group, always kept whole
    add({}, fill=0.0, top_k=7)  # a flat row: top-k's tie keeps all of it
    logits = torch.stack(rows)
    temperature, top_k, top_p = (torch.tensor(x) for x in zip(*params, strict=True))
    return logits, temperature.float(), top_k.to(torch.int32), top_p.float()


def _large_rows(V: int = 151936) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen-sized rows (the native top-p's bucketed search): random logits with planted ties at top-k's k-th
    value, at a top-p boundary, and at a greedy maximum."""
    gen = torch.Generator().manual_seed(151936)
    logits = torch.randn(5, V, generator=gen) * 2.0
    logits[0, torch.topk(logits[0], 60).indices[45:52]] = logits[0].topk(50).values[-1]  # tie across k = 50
    logits[1, :9] = logits[1].max() + 1.0  # nine tied tokens on top: top-p keeps or drops them together
    logits[2, 1000:1003] = logits[2].max() + 0.5  # tied greedy maxima
    logits[3, : V // 2] = NEG_INF
    temperature = torch.tensor([1.0, 0.8, 0.0, 1.3, 0.6])
    top_k = torch.tensor([50, 0, 0, 200, 1000], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.4, 0.9, 0.95, 0.7])
    return logits, temperature, top_k, top_p


def _one_row_requests(logits, temperature, top_k, top_p, dtype, backend, op: str):
    """Every row its own request with no drafts (chain: the bonus row; tree: a lone root), verified with
    the mask; returns (result, mask, oracle rows)."""
    R = logits.shape[0]
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=torch.arange(R) * 31 + 5,
                  position=torch.zeros(R, dtype=torch.int64))
    if op == "chain":
        inputs = dict(target_logits=logits.to(dtype), draft_token_ids=torch.zeros(0, dtype=torch.int64),
                      cu_num_draft_tokens=torch.zeros(R + 1, dtype=torch.int64), **params)
        verify, checked, sampling_mask = sk.verify_chain, api.checked_chain_args, sm.chain_sampling_mask
    else:
        inputs = dict(target_logits=logits.to(dtype), node_token_ids=torch.full((R,), -1, dtype=torch.int64),
                      parent=torch.full((R,), -1, dtype=torch.int64), cu_num_nodes=torch.arange(R + 1), **params)
        verify, checked, sampling_mask = sk.verify_tree, api.checked_tree_args, sm.tree_sampling_mask
    if backend == "cuda_emulation":  # what verify_* does with return_mask=True, on the emulated op
        args = checked(**inputs)
        threshold = api._threshold_buffer(args[0])
        res = _emulated_op(op)(*args, row_threshold=threshold)
        mask = sampling_mask(args, res, threshold)
    else:
        res, mask = verify(**_moved(inputs, _device(backend)), backend=backend, return_mask=True)
    res, mask = type(res)(*(t.cpu() for t in res)), sk.SamplingMask(*(t.cpu() for t in mask))
    return res, mask, [[r] for r in range(R)]


@pytest.mark.parametrize("op", ["chain", "tree"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", slow_when_interpreted(BACKENDS))
def test_thresholds_keep_the_truncated_set_on_boundaries(backend, dtype, op):
    logits, temperature, top_k, top_p = _boundary_rows()
    res, mask, rows = _one_row_requests(logits, temperature, top_k, top_p, dtype, backend, op)
    inputs = dict(target_logits=logits.to(dtype), temperature=temperature, top_k=top_k, top_p=top_p)
    check_mask(inputs, res, mask, rows)
    sizes = [len(m[0]) for m in mask.tolist()]
    assert sizes[:5] == [5, 5, 4, 1, 4] and sizes[5:10] == [3, 3, 1, 1, 1] and sizes[12:14] == [3, 3]


@pytest.mark.parametrize("backend", slow_when_interpreted(BACKENDS))
def test_thresholds_keep_the_truncated_set_at_v151936(backend):
    skip_if_interpreter_expensive(backend, cheap=False)
    logits, temperature, top_k, top_p = _large_rows()
    res, mask, rows = _one_row_requests(logits, temperature, top_k, top_p, torch.bfloat16, backend, "chain")
    inputs = dict(target_logits=logits.to(torch.bfloat16), temperature=temperature, top_k=top_k, top_p=top_p)
    check_mask(inputs, res, mask, rows)


def _with_and_without(backend: str, op: str, args: tuple):
    """``op``'s backend function on ``args`` (moved to the backend's device) without and with ``row_threshold``:
    (plain result, result, thresholds), on the CPU; and the reference's (result, thresholds)."""
    device = torch.device(_device(backend))
    fn = _backend_op(backend, op)
    moved = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    plain = fn(*moved)
    threshold = api._threshold_buffer(moved[0])
    res = fn(*moved, row_threshold=threshold)
    on_cpu = [type(r)(*(t.cpu() for t in r)) for r in (plain, res)]
    if backend == "reference":
        return *on_cpu, threshold, on_cpu[1], threshold
    ref_threshold = api._threshold_buffer(args[0])
    ref = api._REFERENCE_OPS[op](*args, row_threshold=ref_threshold)
    return *on_cpu, threshold.cpu(), ref, ref_threshold


@pytest.mark.parametrize("backend", slow_when_interpreted(BACKENDS))
@pytest.mark.parametrize("method", api.CHAIN_METHODS)
@pytest.mark.parametrize("case", CHAIN_CASES, ids=_case_id)
def test_chain_thresholds_change_no_token(case, method, backend):
    """The backend's chain op with and without ``row_threshold``: the same tokens bit for bit, and the
    reference's; every decided row written (no NaN left) with the reference's threshold, and the mask from them
    is the oracle's."""
    inputs = _chain_inputs(case, 6, 400 + CHAIN_CASES.index(case))
    args = api.checked_chain_args(**inputs)
    plain, res, threshold, ref, ref_threshold = _with_and_without(backend, api._METHOD_OPS["chain", method], args)
    assert all(torch.equal(a, b) for a, b in zip(plain, res, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(ref, res, strict=True))
    rows = sm.chain_rows(args[2], args[1].numel(), res.output_token_ids.shape[1])
    _assert_reference_thresholds(args, args[4], rows, res.output_token_ids >= 0, threshold, ref_threshold)
    check_mask(inputs, res, sm.chain_sampling_mask(args, res, threshold), _chain_oracle_rows(inputs, res))


@pytest.mark.parametrize("backend", slow_when_interpreted(BACKENDS))
@pytest.mark.parametrize("method", api.TREE_METHODS)
@pytest.mark.parametrize("case", TREE_CASES, ids=_case_id)
def test_tree_thresholds_change_no_token(case, method, backend):
    inputs = _tree_inputs(case, 5, 500 + TREE_CASES.index(case))
    args = api.checked_tree_args(**inputs)
    plain, res, threshold, ref, ref_threshold = _with_and_without(backend, api._METHOD_OPS["tree", method], args)
    assert all(torch.equal(a, b) for a, b in zip(plain, res, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(ref, res, strict=True))
    rows = sm.tree_rows(args[3], args[2].numel(), res.accepted_nodes)
    _assert_reference_thresholds(args, args[5], rows, res.output_token_ids >= 0, threshold, ref_threshold)
    check_mask(inputs, res, sm.tree_sampling_mask(args, res, threshold), _tree_oracle_rows(inputs, res))



@pytest.mark.native
@pytest.mark.skipif(not native.has_device("cpu"), reason="native extension not built")
def test_raw_op_checks_row_threshold():
    """The native op checks its ``row_threshold`` (one entry per logits row, float32, 1-D, contiguous) and
    names it; None (the default) is the plain op."""
    logits = torch.randn(3, 10)
    args = (logits, torch.tensor([1, 2]), torch.tensor([0, 2]), None, torch.ones(1), None, None,
            torch.tensor([1]), torch.tensor([0]), 2)
    plain = torch.ops.specdec.verify_chain(*args)
    threshold = torch.full((3,), NAN)
    with_threshold = torch.ops.specdec.verify_chain(*args, threshold)
    assert all(torch.equal(a, b) for a, b in zip(plain, with_threshold, strict=True))
    decided = int(plain[1][0]) + 1  # the rows up to the first rejection (or the bonus row): untruncated, -inf
    assert threshold[:decided].tolist() == [NEG_INF] * decided and threshold[decided:].isnan().all()
    with pytest.raises(ValueError, match="row_threshold must have one entry per row"):
        torch.ops.specdec.verify_chain(*args, torch.zeros(2))
    with pytest.raises(TypeError, match="row_threshold must be"):
        torch.ops.specdec.verify_chain(*args, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="row_threshold must be contiguous"):
        torch.ops.specdec.verify_chain(*args, torch.zeros(6)[::2])


def test_kept_by_threshold_on_unsanitised_logits():
    """One compare on ``logits / temperature`` keeps what the sanitised row keeps: NaN never, +inf as the
    float32 max, -inf never; a -inf threshold keeps the finite values, a NaN one (an unwritten row) nothing."""
    z = torch.tensor([[NAN, INF, NEG_INF, 1.0, -3.0e38, 3.4028234663852886e38]] * 4)
    threshold = torch.tensor([NEG_INF, 1.0, 3.4028234663852886e38, NAN])
    keep = sm.kept_by_threshold(z, threshold)
    sanitised = sm.sampling.sanitize(z)
    want = (sanitised >= threshold[:, None]) & (sanitised > NEG_INF)
    assert torch.equal(keep, want)
    assert keep.tolist()[0] == [False, True, False, True, True, True] and not keep[3].any()
