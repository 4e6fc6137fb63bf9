"""The Triton tree kernel emits the reference's tokens for the same seeds (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.drafters.tree_builder import TreeTopology, build_static_tree, full_tree_paths
from specdec_kernels.exactness import markov_trees
from tests.conftest import DEVICE, REPO, requires_triton

pytestmark = [
    pytest.mark.triton,
    requires_triton,
    pytest.mark.slow,  # kernels under the Triton interpreter on CPU machines: seconds per call
    # log(0) = -inf is intended (zero-probability tokens); numpy warns about it under the interpreter.
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
]


def _case(num_reqs, vocab, paths, sibling_sampling, top_k, top_p, dtype=torch.float32, seed=0):
    """A batch of Markov-drafted trees whose target logits favour the drafts, so paths go deep."""
    g = torch.Generator().manual_seed(seed)
    target, draft = markov_trees.markov_tables(vocab, seed, scale=2.0, draft_noise=0.5)
    context = torch.randint(0, vocab, (num_reqs, 1), generator=g)
    tree = build_static_tree(markov_trees.MarkovDrafter(draft), context, TreeTopology.from_paths(paths),
                             sibling_sampling, g)
    logits = target[tree.node_token_ids].to(dtype)
    temp = torch.rand(num_reqs, generator=g) + 0.4
    temp[::4] = 0.0
    kw = dict(
        temperature=temp,
        top_k=torch.randint(0, vocab + 2, (num_reqs,), generator=g, dtype=torch.int32) if top_k else None,
        top_p=torch.where(torch.arange(num_reqs) % 3 == 0, 1.0, torch.rand(num_reqs, generator=g) * 0.8 + 0.15)
        if top_p else None,
        seed=torch.randint(-(2**63), 2**63 - 1, (num_reqs,), generator=g),
        position=torch.randint(0, 2**20, (num_reqs,), generator=g),
        sibling_sampling=sibling_sampling or "iid",
    )
    args = (logits, tree.node_token_ids, tree.parent, tree.cu_num_nodes, tree.draft_probs)
    return [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args], {
        k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()
    }


def _assert_same(args, kw):
    ref = sk.verify_tree(*args, **kw, backend="reference")
    tri = sk.verify_tree(*args, **kw, backend="triton")
    assert torch.equal(ref.output_token_ids, tri.output_token_ids)
    assert torch.equal(ref.accepted_nodes, tri.accepted_nodes)
    assert torch.equal(ref.num_accepted, tri.num_accepted)
    return ref


@pytest.mark.parametrize(
    "sibling_sampling,top_k,top_p,dtype",
    [
        (None, False, False, torch.float32),
        (None, True, True, torch.bfloat16),
        ("iid", False, True, torch.float16),
        ("iid", True, False, torch.float32),
        ("without_replacement", False, False, torch.float32),
        ("without_replacement", True, True, torch.float32),
    ],
)
def test_triton_matches_reference(sibling_sampling, top_k, top_p, dtype):
    args, kw = _case(8, 29, full_tree_paths([3, 2, 1]), sibling_sampling, top_k, top_p, dtype, seed=7)
    ref = _assert_same(args, kw)
    assert float(ref.num_accepted.float().mean()) > 0.5  # the comparison covers accepted paths


def test_triton_ragged_placeholders_and_nan():
    args, kw = _case(6, 17, [(0,), (1,), (2,), (0, 0), (2, 0), (2, 1)], "iid", False, False, seed=3)
    logits, tokens, parent, cu, q = args
    logits[0] = float("nan")
    logits[7, :4] = float("inf")
    tokens[8] = -1  # placeholder
    # Make the batch ragged: cut the last request to its root and first child.
    keep = cu[-2] + 2
    args = [logits[:keep], tokens[:keep], parent[:keep], torch.cat([cu[:-1], keep.view(1)]), q[:keep]]
    _assert_same(args, kw)


def test_triton_chain_as_tree_and_deep_max_depth():
    args, kw = _case(8, 23, full_tree_paths([1, 1, 1, 1]), None, False, False, seed=5)
    ref = sk.verify_tree(*args, **kw, backend="reference", max_depth=6)
    tri = sk.verify_tree(*args, **kw, backend="triton", max_depth=6)
    assert all(torch.equal(a, b) for a, b in zip(ref, tri, strict=True))


@pytest.mark.slow
def test_triton_large_vocabulary():
    """V = 151936 (Qwen): greedy, deterministic and stochastic (RRS) walks along planted paths."""
    vocab = 151936
    g = torch.Generator().manual_seed(0)
    parent = torch.tensor([-1, 0, 0, 1, 2, -1, 0, 0, 2])
    tokens = torch.tensor([-1, 70000, 151935, 5, 123456, -1, 17, 151000, 99999])
    cu = torch.tensor([0, 5, 9])
    logits = torch.randn(9, vocab, generator=g).to(torch.bfloat16)
    # Plant the path root -> node 2 -> node 4 in request 0 and root -> node 2 -> node 8 in request 1.
    for row, tok in ((0, 151935), (2, 123456), (5, 151000), (7, 99999)):
        logits[row, tok] = 30.0
    q = torch.softmax(torch.randn(9, vocab, generator=g), -1)
    for mode, dp in (("iid", None), ("without_replacement", q)):
        kw = dict(temperature=torch.tensor([0.0, 0.8]), seed=torch.tensor([11, 12]),
                  position=torch.tensor([100, 200]), sibling_sampling=mode)
        args = [a.to(DEVICE) if a is not None else None for a in (logits, tokens, parent, cu, dp)]
        ref = _assert_same(args, {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
        assert ref.num_accepted.tolist() == [2, 2]


_COMPILE_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_kernels.triton.tree import _tree_kernel

ptr, i64 = "*i64", "i64"
signature = {
    "logits_ptr": "*bf16", "stride_logits": i64, "tokens_ptr": ptr, "first_child_ptr": ptr,
    "next_sibling_ptr": ptr, "slot_ptr": ptr, "cu_ptr": ptr, "q_ptr": "*fp32", "stride_q": i64,
    "temp_ptr": "*fp32", "top_k_ptr": "*i32", "top_p_ptr": "*fp32", "seed_ptr": ptr, "pos_ptr": ptr,
    "p_ws_ptr": "*fp32", "q_ws_ptr": "*fp32", "out_ptr": "*i32", "path_ptr": "*i32", "num_acc_ptr": "*i32",
    "threshold_ptr": "*fp32", "V": "i32", "max_depth": "i32", "num_nodes": "i64", "STOCHASTIC": "constexpr",
    "WITHOUT_REPLACEMENT": "constexpr", "HAS_TOP_K": "constexpr", "HAS_TOP_P": "constexpr",
    "WRITE_THRESHOLD": "constexpr", "BLOCK": "constexpr",
}
constexprs = {"STOCHASTIC": True, "WITHOUT_REPLACEMENT": True, "HAS_TOP_K": True, "HAS_TOP_P": True,
              "WRITE_THRESHOLD": True, "BLOCK": 1024}
compiled = triton.compile(ASTSource(_tree_kernel, signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32))
assert "ptx" in compiled.asm
# Every float32 division correctly rounded (tl.math.div_rn): a float32 / lowers to div.full.f32 (89 of them
# when _scaled, _init_p, _update_residual and _remove_token divided with /).
assert "div.full.f32" not in compiled.asm["ptx"] and "div.rn.f32" in compiled.asm["ptx"]
"""


def _ptxas_absent() -> str | None:
    """Why Triton has no ptxas for sm_90 (looked up as its compiler does: $TRITON_PTXAS_BLACKWELL_PATH, then
    the copy bundled with triton), or None when it has one."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        get_ptxas(90)
    except RuntimeError as err:  # triton.knobs: "Cannot find ptxas-blackwell"
        return str(err)
    return None


def test_kernel_compiles_for_sm90_without_a_gpu():
    """Ahead-of-time compile to Hopper PTX/cubin in a subprocess without the interpreter: the interpreter
    does not type-check control flow, the compiler does (scalar ifs, while loops, loop-carried values); and
    the PTX divides float32 only with div.rn (the interpreter's numpy division is exact either way). Skips
    only when ptxas is absent; a ptxas that runs and fails is a failure."""
    import os
    import subprocess
    import sys

    absent = _ptxas_absent()
    if absent is not None:
        pytest.skip(f"no ptxas for sm_90 ({absent}): the PTX cannot be assembled")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_triton_unvalidated_broken_trees_match_reference_in_bounds():
    """validate=False: parents pointing forward / out of the request detach nodes, out-of-range tokens
    are skipped, nodes below max_depth are ignored; both backends agree and stay in the vocabulary."""
    args, kw = _case(4, 13, full_tree_paths([2, 2, 1]), "without_replacement", False, False, seed=9)
    logits, tokens, parent, cu, q = args
    parent = parent.clone()
    parent[2] = 5  # forward
    parent[14] = 40  # out of its request
    tokens = tokens.clone()
    tokens[3] = 13  # out of range
    tokens[16] = -7
    args = [logits, tokens, parent, cu, q]
    ref = sk.verify_tree(*args, **kw, backend="reference", validate=False, max_depth=2)
    tri = sk.verify_tree(*args, **kw, backend="triton", validate=False, max_depth=2)
    assert all(torch.equal(a, b) for a, b in zip(ref, tri, strict=True))
    assert ((ref.output_token_ids >= -1) & (ref.output_token_ids < 13)).all()
