"""Fused drafter-head Triton kernels vs the torch spec (TRITON_INTERPRET=1 on CPU).

Accuracy rule (STYLE.md): the kernel's error against the float32 reference is at most twice the error of
the same math done by torch in bfloat16; token ids must be identical on float32 inputs.
"""

from __future__ import annotations

import copy

import pytest
import torch

from specdec_kernels.drafters import head_ops
from tests.conftest import DEVICE, requires_triton

# slow: kernels under the Triton interpreter on CPU machines, seconds per call
pytestmark = [pytest.mark.triton, requires_triton, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _triton(fn, *args):
    """``fn(*args, "triton")`` with its tensors on the test device (CUDA on a GPU; the interpreter runs CPU
    tensors), and its tensors back on the CPU to compare with the torch spec."""
    out = fn(*(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args), "triton")
    if isinstance(out, torch.Tensor):
        return out.cpu()
    return type(out)(*(t.cpu() for t in out))


def _vocab(vd: int, v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(v, generator=g)[:vd]).values
    return ids - torch.arange(vd)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("r,ht,h", [(5, 40, 24), (17, 32, 48)])
def test_fused_norm_fc_accuracy(norm, r, ht, h):
    torch.manual_seed(r + ht)
    x = torch.randn(r, 3 * ht) * 3
    nw = torch.rand(3, ht) + 0.5 if norm else None
    w = torch.randn(h, 3 * ht) / ht**0.5
    ref = head_ops.fuse_features(x, nw, w, 1e-6, "torch")
    bf = lambda t: None if t is None else t.bfloat16()
    low = head_ops.fuse_features(x.bfloat16(), bf(nw), w.bfloat16(), 1e-6, "torch")
    got = _triton(head_ops.fuse_features, x.bfloat16(), bf(nw), w.bfloat16(), 1e-6)
    assert got.dtype == torch.bfloat16 and got.shape == (r, h)
    assert _err(got, ref) <= 2 * _err(low, ref) + 1e-6
    got32 = _triton(head_ops.fuse_features, x, nw, w, 1e-6)
    torch.testing.assert_close(got32, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("r,h,vd,v", [(3, 32, 100, 160), (18, 40, 64, 64)])
def test_lm_head_topk(k, r, h, vd, v):
    torch.manual_seed(k + r)
    x = torch.randn(r, h)
    w = torch.randn(vd, h) / h**0.5
    d2t = _vocab(vd, v, r)
    ref = head_ops.head_topk(x, w, d2t, k, "torch")
    got = _triton(head_ops.head_topk, x, w, d2t, k)
    assert torch.equal(got.target_ids, ref.target_ids)
    torch.testing.assert_close(got.log_probs, ref.log_probs, rtol=1e-5, atol=1e-5)
    low = head_ops.head_topk(x.bfloat16(), w.bfloat16(), d2t, k, "torch")
    gotb = _triton(head_ops.head_topk, x.bfloat16(), w.bfloat16(), d2t, k)
    # compare log-probs of the reference's ids (ids may legitimately differ on bf16 near-ties)
    same = (gotb.target_ids == ref.target_ids) & (low.target_ids == ref.target_ids)
    assert _err(gotb.log_probs[same], ref.log_probs[same]) <= 2 * _err(low.log_probs[same], ref.log_probs[same]) + 1e-6


def test_lm_head_topk_ties_go_to_lowest_draft_id():
    x = torch.ones(2, 16)
    w = torch.zeros(80, 16)
    w[[5, 9, 70]] = 1.0  # three tied maxima in two different vocab tiles
    d2t = torch.zeros(80, dtype=torch.int64)
    got = _triton(head_ops.head_topk, x, w, d2t, 3)
    assert got.target_ids.tolist() == [[5, 9, 70]] * 2


@pytest.mark.parametrize("k", [1, 3])
def test_lm_head_sample_matches_reference(k):
    torch.manual_seed(k)
    r, h, vd, v = 7, 32, 90, 150
    x = torch.randn(r, h)
    w = torch.randn(vd, h) / h**0.5
    d2t = _vocab(vd, v, 3)
    temp = torch.tensor([1.0, 0.0, 0.5, 2.0, 1.0, 0.9, 0.0])
    seed = torch.arange(r) * 977 + 5
    pos = torch.arange(r) * 13 + (1 << 20)
    ref = head_ops.head_sample(x, w, d2t, v, temp, seed, pos, k, "torch")
    got = _triton(head_ops.head_sample, x, w, d2t, v, temp, seed, pos, k)
    assert torch.equal(got.target_ids, ref.target_ids)
    torch.testing.assert_close(got.log_probs, ref.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.q, ref.q, rtol=1e-5, atol=1e-7)


def test_drafter_backend_triton_matches_torch():
    from specdec_kernels.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head

    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config(80, 40, 32, 32, 64, 2, 1, 16, (0, 1, 2)))
    head.set_draft_vocab(torch.arange(0, 80, 2))
    with torch.no_grad():
        head.embed_tokens.weight.normal_()
    ids = torch.randint(0, 80, (2, 6))
    feats = torch.randn(2, 6, 96)
    out = []
    for backend, device in (("torch", "cpu"), ("triton", DEVICE)):
        d = Eagle3Drafter(copy.deepcopy(head).to(device), backend=backend)
        d.prefill(*(t.to(device) for t in (ids, torch.tensor([6, 3]), torch.tensor([1, 2]), feats)))
        tree = d.propose_tree(2, 2, 2, torch.tensor([1.0, 0.0], device=device), torch.tensor([3, 4], device=device))
        out.append(tree._replace(**{f: getattr(tree, f).cpu() for f in ("node_token_ids", "draft_probs")}))
    assert torch.equal(out[0].node_token_ids, out[1].node_token_ids)
    torch.testing.assert_close(out[0].draft_probs, out[1].draft_probs, rtol=1e-4, atol=1e-6)
