"""Exact argument checks: the right exception, the right argument, one host sync.

The Python API (``verify_chain`` / ``verify_tree``), the raw torch ops (``torch.ops.specdec.*``, checked by
``csrc/checks.h``, shared by the CPU and CUDA bindings) and ``native.decoder_step`` raise ValueError for
values and shapes and TypeError for types, naming the argument that is wrong first. int64 arguments are
read as int64 (no truncation to int32, no overflow in a bound check), and validation reads every value
back in one host sync.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import specdec_kernels as sk
from specdec_kernels import native
from specdec_kernels.reference.philox import MAX_POSITION

needs_native = pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built")


def _chain(vocab: int = 12, ks=(2, 0, 3), **overrides) -> dict:
    gen = torch.Generator().manual_seed(sum(ks) * 31 + vocab)
    num_drafts, num_reqs = sum(ks), len(ks)
    kw = dict(
        target_logits=torch.randn(num_drafts + num_reqs, vocab, generator=gen),
        draft_token_ids=torch.randint(0, vocab, (num_drafts,), generator=gen),
        cu_num_draft_tokens=torch.tensor([0, *np.cumsum(ks).tolist()]),
        temperature=torch.full((num_reqs,), 0.9), seed=torch.arange(num_reqs) + 5,
        position=torch.zeros(num_reqs, dtype=torch.int64), backend="reference",
    )
    kw.update(overrides)
    return kw


def _tree(**overrides) -> dict:
    gen = torch.Generator().manual_seed(1)
    parent = torch.tensor([-1, 0, 0, 1, -1, 0, 1])
    kw = dict(target_logits=torch.randn(7, 9, generator=gen), node_token_ids=torch.tensor([-1, 1, 2, 3, -1, 4, 5]),
              parent=parent, cu_num_nodes=torch.tensor([0, 4, 7]), temperature=torch.tensor([0.8, 0.0]),
              seed=torch.tensor([3, 4]), backend="reference")
    kw.update(overrides)
    return kw


# ------------------------------------------------------------------------------------------------------
# int64 arguments: no truncation, no overflow
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("top_k", [2**32 + 3, 2**31, 2**40])
def test_int64_top_k_past_int32_means_disabled(top_k):
    """2**32 + 3 used to narrow to 3 (top-3 sampling) and 2**31 to a negative value (rejected): any value
    >= V disables top-k, so the tokens equal those without top-k, seed for seed."""
    plain = sk.verify_chain(**_chain())
    big = sk.verify_chain(**_chain(top_k=torch.full((3,), top_k)))
    assert torch.equal(big.output_token_ids, plain.output_token_ids)
    sampled = {int(sk.verify_chain(**_chain(ks=(0,), top_k=torch.tensor([top_k]), temperature=torch.ones(1),
                                             seed=torch.tensor([s]))).output_token_ids[0, 0]) for s in range(60)}
    assert len(sampled) > 3


def test_negative_int64_top_k_is_rejected_not_wrapped():
    with pytest.raises(ValueError, match="top_k"):
        sk.verify_chain(**_chain(top_k=torch.tensor([-(2**63), 3, 3])))
    with pytest.raises(ValueError, match="top_k"):
        sk.verify_chain(**_chain(top_k=torch.tensor([-(2**32) + 3, 3, 3])))  # would narrow to 3


@pytest.mark.parametrize("position", [2**63 - 1, 2**62, MAX_POSITION, MAX_POSITION - 2])
def test_position_plus_chain_length_cannot_overflow_past_the_check(position):
    """position + k used to overflow int64 for position = 2**63 - 1 and pass the bound."""
    with pytest.raises(ValueError, match="position"):
        sk.verify_chain(**_chain(ks=(3,), position=torch.tensor([position])))
    sk.verify_chain(**_chain(ks=(3,), position=torch.tensor([MAX_POSITION - 3])))
    if position > MAX_POSITION - 2:  # the deepest node is at depth 2
        with pytest.raises(ValueError, match="position"):
            sk.verify_tree(**_tree(position=torch.tensor([position, 0])))


@pytest.mark.parametrize("name,value,exc", [
    ("max_draft_len", 2**62, ValueError), ("max_draft_len", MAX_POSITION + 1, ValueError),
    ("max_draft_len", True, TypeError), ("max_draft_len", 2.0, TypeError), ("max_draft_len", -1, ValueError),
])
def test_output_width_is_bounded_and_typed(name, value, exc):
    """max_draft_len = 2**62 used to fail in the allocator ("Storage size calculation overflowed")."""
    with pytest.raises(exc, match=name):
        sk.verify_chain(**_chain(**{name: value}))
    with pytest.raises(exc, match="max_depth"):
        sk.verify_tree(**_tree(max_depth=value))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.1])
def test_chain_draft_probs_must_be_finite_and_non_negative(bad):
    """As verify_tree already required: a NaN / inf / negative q is refused, not silently verified."""
    q = torch.softmax(torch.randn(5, 12), -1)
    q[3, 4] = bad
    with pytest.raises(ValueError, match="draft_probs must be finite and >= 0"):
        sk.verify_chain(**_chain(draft_probs=q))


def test_numpy_integer_width_is_accepted():
    res = sk.verify_chain(**_chain(max_draft_len=np.int64(4)))
    assert res.output_token_ids.shape == (3, 5)


# ------------------------------------------------------------------------------------------------------
# Messages blame the right argument; meta tensors
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference"] + (["cpu"] if native.has_device("cpu") else []))
def test_decreasing_cu_is_blamed_on_cu_not_on_max_draft_len(backend):
    kw = _chain(ks=(5, 0), cu_num_draft_tokens=torch.tensor([0, 5, 3]), draft_token_ids=torch.zeros(3, dtype=torch.long),
                target_logits=torch.zeros(5, 4), max_draft_len=3, backend=backend)
    with pytest.raises(ValueError, match="cu_num_draft_tokens must be non-decreasing"):
        sk.verify_chain(**kw)
    if backend == "cpu":  # the CPU kernel checks its host-resident cu even without validation
        with pytest.raises(ValueError, match="cu_num_draft_tokens must be non-decreasing"):
            sk.verify_chain(**kw, validate=False)


@pytest.mark.slow
def test_meta_tensors_get_a_clear_message_and_trace_without_validation():
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in _chain().items()}
    with pytest.raises(ValueError, match="meta tensors carry no values"):
        sk.verify_chain(**meta)
    with pytest.raises(ValueError, match="meta tensors carry no values"):
        sk.verify_chain(**meta, validate=False)  # max_draft_len=None must be read
    res = sk.verify_chain(**meta, validate=False, max_draft_len=3)
    assert res.output_token_ids.shape == (3, 4) and res.output_token_ids.device.type == "meta"


# ------------------------------------------------------------------------------------------------------
# One host sync
# ------------------------------------------------------------------------------------------------------

class _HostReads(TorchDispatchMode):
    """Counts the ops that read device values back to the host (each a sync on a GPU)."""

    SYNCING = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique",
               "aten._unique", "aten.equal", "aten.is_nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith(self.SYNCING) or (name == "aten.repeat_interleave" and "output_size" not in (kwargs or {})
                                               and len(args) < 3):
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def host_reads():
    mode = _HostReads()
    original = torch.Tensor.tolist

    def tolist(self):
        mode.count += 1
        return original(self)

    torch.Tensor.tolist = tolist
    try:
        with mode:
            yield mode
    finally:
        torch.Tensor.tolist = original


@pytest.mark.parametrize("options", [
    dict(), dict(top_k=torch.tensor([3, 0, 20]), top_p=torch.tensor([0.9, 1.0, 0.5])),
    dict(draft_probs="q", top_k=torch.tensor([3, 0, 20]), max_draft_len=3),
])
def test_validated_chain_reads_values_back_once(options):
    kw = _chain(**options)
    if options.get("draft_probs") == "q":
        kw["draft_probs"] = torch.softmax(torch.randn(5, 12), -1)
    with host_reads() as reads:  # the reference chain kernel itself never syncs
        sk.verify_chain(**kw)
    assert reads.count <= 1
    kw.update(validate=False, max_draft_len=3)
    with host_reads() as reads:
        sk.verify_chain(**kw)
    assert reads.count == 0


@needs_native
def test_validated_tree_reads_values_back_once():
    for kw in (_tree(backend="cpu"), _tree(backend="cpu", draft_probs=torch.softmax(torch.randn(7, 9), -1),
                                           sibling_sampling="without_replacement", max_depth=3)):
        with host_reads() as reads:
            sk.verify_tree(**kw)
        assert reads.count <= 1
    with host_reads() as reads:
        sk.verify_tree(**_tree(backend="cpu", validate=False, max_depth=2))
    assert reads.count == 0


# ------------------------------------------------------------------------------------------------------
# Raw ops (csrc/checks.h): ValueError / TypeError, V = 0 refused
# ------------------------------------------------------------------------------------------------------

def _raw_chain(vocab=4, **changes):
    args = dict(target_logits=torch.randn(3, vocab), draft_token_ids=torch.tensor([0, 1]), cu=torch.tensor([0, 2]),
                draft_probs=None, temperature=torch.ones(1), top_k=None, top_p=None,
                seed=torch.zeros(1, dtype=torch.long), position=torch.zeros(1, dtype=torch.long), max_draft_len=2)
    args.update(changes)
    return tuple(args.values())


def _raw_tree(**changes):
    args = dict(target_logits=torch.randn(2, 4), node_token_ids=torch.tensor([0, 1]), parent=torch.tensor([-1, 0]),
                cu=torch.tensor([0, 2]), draft_probs=None, temperature=torch.ones(1), top_k=None, top_p=None,
                seed=torch.zeros(1, dtype=torch.long), position=torch.zeros(1, dtype=torch.long),
                sibling_sampling="iid", max_depth=1)
    args.update(changes)
    return tuple(args.values())


RAW_CHAIN_CASES = [
    (dict(target_logits=torch.empty(3, 0)), ValueError, "vocabulary size"),  # used to emit token 0
    (dict(target_logits=torch.randn(4, 4)), ValueError, "T \\+ B = 2 \\+ 1 rows"),
    (dict(temperature=torch.ones(2)), ValueError, "temperature must have one entry per request"),
    (dict(seed=torch.zeros(1)), TypeError, "seed must be Long"),
    (dict(target_logits=torch.randn(3, 4).double()), TypeError, "target_logits must be float32"),
    (dict(draft_probs=torch.rand(2, 5)), ValueError, "draft_probs must have shape \\[T, V\\]"),
    (dict(top_k=torch.ones(1, dtype=torch.long)), TypeError, "top_k must be Int"),
    (dict(max_draft_len=2**62), ValueError, "max_draft_len must be in"),
    (dict(max_draft_len=1), ValueError, "max_draft_len = 1 is smaller than the chain of request 0"),
    (dict(cu=torch.tensor([1, 2])), ValueError, "cu_num_draft_tokens must start at 0"),
    (dict(cu=torch.tensor([0, 3])), ValueError, "cu_num_draft_tokens\\[-1\\] must equal"),
    (dict(draft_token_ids=torch.tensor([[0, 1]])), ValueError, "draft_token_ids must be 1-D"),
]


@needs_native
@pytest.mark.parametrize("changes,exc,match", RAW_CHAIN_CASES)
def test_raw_chain_op_raises_value_and_type_errors(changes, exc, match):
    with pytest.raises(exc, match=match):
        torch.ops.specdec.verify_chain(*_raw_chain(**changes))


@needs_native
@pytest.mark.parametrize("changes,exc,match", [
    (dict(target_logits=torch.empty(2, 0)), ValueError, "vocabulary size"),  # used to emit token 0
    (dict(parent=torch.tensor([-1, 0, 0])), ValueError, "one entry per row"),
    (dict(sibling_sampling="beam"), ValueError, "sibling_sampling"),
    (dict(cu=torch.tensor([0, 3, 2]), temperature=torch.ones(2), seed=torch.zeros(2, dtype=torch.long),
          position=torch.zeros(2, dtype=torch.long)), ValueError, "cu_num_nodes must be non-decreasing, got 3 then 2"),
    (dict(parent=torch.tensor([-1.0, 0.0])), TypeError, "parent must be Long"),
    (dict(max_depth=-1), ValueError, "max_depth must be in"),
])
def test_raw_tree_op_raises_value_and_type_errors(changes, exc, match):
    with pytest.raises(exc, match=match):
        torch.ops.specdec.verify_tree(*_raw_tree(**changes))


# ------------------------------------------------------------------------------------------------------
# native.decoder_step: overflow-safe checks, ValueError / TypeError
# ------------------------------------------------------------------------------------------------------

def _step_args(reqs: int = 2, n: int = 2, heads: int = 2, kv_heads: int = 1, head_dim: int = 8) -> dict:
    gen = torch.Generator().manual_seed(0)
    hidden, inter, vocab, batch, cache_len, positions = 16, 24, 10, 3, 16, 32

    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.1

    weights = [1 + w(hidden), w((heads + 2 * kv_heads) * head_dim, hidden), 1 + w(head_dim), 1 + w(head_dim),
               w(hidden, heads * head_dim), 1 + w(hidden), w(2 * inter, hidden), w(hidden, inter), 1 + w(hidden),
               w(vocab, hidden)]
    angles = torch.arange(positions)[:, None] * 0.1 * (torch.arange(head_dim // 2) + 1)
    return dict(x=w(reqs, n, hidden), weights=weights, k_cache=torch.zeros(batch, kv_heads, cache_len, head_dim),
                v_cache=torch.zeros(batch, kv_heads, cache_len, head_dim), rows=torch.arange(reqs),
                start=torch.zeros(reqs, dtype=torch.long), depth=torch.arange(n).expand(reqs, n).contiguous(),
                rope=torch.stack([angles.cos(), angles.sin()], -1), num_heads=heads, eps=1e-6)


@needs_native
@pytest.mark.parametrize("changes,exc,match", [
    # start + n overflowed int64 and passed; the negative depths then put start + depth in the rope table
    (dict(start=torch.tensor([2**63 - 2, 0]), depth=torch.tensor([[-(2**63 - 2), -(2**63 - 2) + 1], [0, 1]])),
     ValueError, "start\\[0\\] \\+ n = 9223372036854775806 \\+ 2 exceeds the cache length 16"),
    (dict(depth=torch.tensor([[-(2**63), 0], [0, 1]])), ValueError, "is outside the rope table"),
    (dict(depth=torch.tensor([[2**63 - 1, 0], [0, 1]]), start=torch.tensor([3, 0])), ValueError, "outside the rope table"),
    # (num_heads + 2 kv_heads) * D overflowed to the real qkv rows: the loops then ran 2**62 heads
    (dict(num_heads=2 + 2**62), ValueError, "num_heads = 4611686018427387906 does not fit the qkv weight"),
    (dict(num_heads=2**62), ValueError, "does not fit the qkv weight"),
    (dict(start=torch.tensor([-1, 0])), ValueError, "start\\[0\\] = -1 must be >= 0"),  # was "exceeds the cache"
    (dict(rows=torch.tensor([0, 3])), ValueError, "rows\\[1\\] = 3 is outside the cache batch"),
    (dict(x=torch.zeros(2, 2, 16, dtype=torch.float64)), TypeError, "x must be Float"),
    (dict(x=torch.zeros(2, 2, 16, device="meta")), ValueError, "x must be on cpu, got meta"),
    (dict(k_cache=torch.zeros(3, 1, 16, 0), v_cache=torch.zeros(3, 1, 16, 0)), ValueError, "head_dim"),
])
def test_decoder_step_checks_without_overflow(changes, exc, match):
    args = _step_args()
    args.update(changes)
    with pytest.raises(exc, match=match):
        native.decoder_step(**args)


@needs_native
def test_decoder_step_valid_call_runs():
    logits, hidden = native.decoder_step(**_step_args())
    assert logits.shape == (2, 2, 10) and hidden.shape == (2, 2, 16) and torch.isfinite(logits).all()


def _mutations(x):
    """Wrong shapes, dtypes and layouts for one raw-op tensor argument."""
    if x is None:
        return [torch.zeros(3, 4), torch.zeros(2, dtype=torch.long)]
    out = [x.float(), x.long(), x.int(), x.double(), x.reshape(1, -1), x[:0], torch.cat([x, x]),
           x.to(torch.bool), torch.zeros(())]
    if x.dim() >= 1 and x.numel() > 1:
        out.append(torch.stack([x, x], -1)[..., 0])  # non-contiguous
    return out


@needs_native
@settings(max_examples=120, deadline=None, derandomize=True)
@given(op=st.sampled_from(["chain", "tree"]), index=st.integers(0, 11), choice=st.integers(0, 10),
       width=st.sampled_from([0, 1, 2, 5, 2**31, 2**62, -1]))
@pytest.mark.slow
def test_fuzz_raw_op_arguments_raise_value_or_type_errors(op, index, choice, width):
    """One raw-op argument replaced by a wrong shape / dtype / layout, and any width: the op answers in range
    or raises ValueError / TypeError (never a crash or another error)."""
    args = list(_raw_chain() if op == "chain" else _raw_tree())
    width_at = len(args) - 1
    args[width_at] = width
    slot = index % (width_at if op == "chain" else width_at - 1)  # tensor slots (not sibling_sampling)
    if width < 2**31:
        variants = _mutations(args[slot])
        args[slot] = variants[choice % len(variants)]
    fn = torch.ops.specdec.verify_chain if op == "chain" else torch.ops.specdec.verify_tree
    try:
        res = fn(*args)
    except (ValueError, TypeError):
        return
    vocab = args[0].shape[-1]
    assert all(((r >= -1) & (r < max(vocab, args[0].shape[0]))).all() for r in res)


@pytest.mark.skipif(not native.available(), reason="needs the compiled extension")
def test_a_resolved_native_op_is_reused_and_a_wrong_device_still_fails():
    """The API keeps the native op it resolved for a backend named explicitly (the lookup costs tens of us
    per call from cold caches), and the cache never answers for a device that backend cannot run on."""
    from specdec_kernels import api

    cpu = torch.device("cpu")
    first = api._resolve("cpu", cpu, "chain")
    assert api._resolve("cpu", cpu, "chain") is first is native.op("verify_chain", "cpu")
    assert api._resolve("cpu", cpu, "tree") is native.op("verify_tree", "cpu")
    with pytest.raises(ValueError, match="backend='cuda' needs cuda tensors"):
        api._resolve("cuda", cpu, "chain")
    with pytest.raises(ValueError, match="backend='cpu' needs cpu tensors"):
        api._resolve("cpu", torch.device("meta"), "chain")
    with pytest.raises(ValueError, match="backend must be one of"):
        api._resolve("meta", torch.device("meta"), "chain")  # backend == device type, yet no native backend


# ------------------------------------------------------------------------------------------------------
# Unvalidated CPU calls: the op's own checks, the Python layer's errors
# ------------------------------------------------------------------------------------------------------

@needs_native
@pytest.mark.parametrize("backend", ["cpu", "auto"])
def test_unvalidated_cpu_calls_skip_the_python_checks_and_keep_their_errors(backend, monkeypatch):
    """An unvalidated call with nothing to normalise goes straight to the native op (the Python checks cost
    ~90 us of a call from cold caches); anything the op rejects is retried on the checked path, so int32 or
    non-contiguous inputs still verify, and a bad argument gets the Python layer's message, not the op's."""
    from specdec_kernels import api

    kw = _chain(backend=backend, validate=False, max_draft_len=3, draft_probs=torch.softmax(torch.randn(5, 12), -1))
    expected = {m: sk.verify_chain(**{**kw, "backend": "reference", "method": m}) for m in ("token", "block")}
    for method in expected:  # the first call of each method resolves its op on the checked path
        sk.verify_chain(**kw, method=method)
    checked = []
    original = api.checked_chain_args
    monkeypatch.setattr(api, "checked_chain_args", lambda *a, **k: checked.append(1) or original(*a, **k))

    def run(**changes):
        checked.clear()
        res = sk.verify_chain(**{**kw, **changes})
        want = expected[changes.get("method", "token")]
        assert torch.equal(res.output_token_ids, want.output_token_ids)
        assert torch.equal(res.num_accepted, want.num_accepted)
        return len(checked)

    assert run() == 0
    assert run(top_p=torch.ones(3)) == 0
    assert run(method="block") == 0
    cu32 = kw["cu_num_draft_tokens"].to(torch.int32)
    assert run(cu_num_draft_tokens=cu32) == 1  # int32 cu: converted on the checked path
    wide = torch.zeros(8, 24)  # T + B rows
    wide[:, ::2] = kw["target_logits"]
    assert run(target_logits=wide[:, ::2]) == 1  # non-contiguous logits: made contiguous there
    assert run(top_k=torch.zeros(3, dtype=torch.int64)) == 1  # top-k is clamped and narrowed there
    assert run(max_draft_len=np.int64(3)) == 1
    with pytest.raises(ValueError, match=r"temperature must have one entry per request \(3\), got 2"):
        sk.verify_chain(**{**kw, "temperature": torch.ones(2)})
    with pytest.raises(TypeError, match="seed must be a torch.Tensor, got list"):
        sk.verify_chain(**{**kw, "seed": [1, 2, 3]})
    with pytest.raises(TypeError, match="max_draft_len must be an int or None, got bool"):
        sk.verify_chain(**{**kw, "max_draft_len": True})
    with pytest.raises(ValueError, match="max_draft_len must be in"):
        sk.verify_chain(**{**kw, "max_draft_len": -1})
    with pytest.raises(ValueError, match="method must be one of"):
        sk.verify_chain(**{**kw, "method": "tokens"})
    with pytest.raises(ValueError, match="cu_num_draft_tokens must be non-decreasing"):  # the op's host check
        sk.verify_chain(**{**kw, "cu_num_draft_tokens": torch.tensor([0, 5, 3, 5])})
