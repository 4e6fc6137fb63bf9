"""Two-level Gumbel-max (reference/gumbel.py): its law, its edge rows, and every backend on rows built to
stress the native block search (ties, -inf blocks, float32-max logits, partial blocks, split rows)."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import native
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.reference import gumbel, philox
from tests.conftest import DEVICE, TRITON_RUNNABLE

NEG_INF = float("-inf")
FLOAT32_MAX = torch.finfo(torch.float32).max


def _law_row() -> torch.Tensor:
    """37 log-weights: three blocks (the last one partial), one block entirely -inf, a few -inf entries."""
    g = torch.Generator().manual_seed(7)
    z = torch.randn(37, generator=g) * 1.5
    z[16:32] = NEG_INF
    z[[3, 35]] = NEG_INF
    return z


@pytest.mark.stat
@pytest.mark.slow
def test_sample_follows_softmax():
    """The samples of one row over many seeds follow softmax(z) exactly (goodness of fit at the suite's alpha)."""
    z = _law_row()
    law = torch.softmax(z.double(), dim=0)
    alpha = gof.SUITE_BUDGET.claim("gumbel:two-level-law")
    n = gof.sample_size(law, alpha, 0.02, 0.999)
    seed = torch.arange(n, dtype=torch.int64) * 7919 + 11
    position = torch.randint(0, 1 << 20, (n,), generator=torch.Generator().manual_seed(1))
    tokens = gumbel.sample(z.expand(n, -1).contiguous(), seed, position, philox.STREAM_RECOVERY)
    assert bool(((tokens >= 0) & (tokens < 37) & torch.isfinite(z[tokens])).all())
    result = gof.gof_test(torch.bincount(tokens, minlength=37), law)
    assert not result.rejects(alpha), result


def test_edge_rows():
    """All -inf samples token 0; a single finite entry is always sampled; float32-max ties go to the lowest index."""
    rows = torch.full((3, 40), NEG_INF)
    rows[1, 33] = 0.0
    rows[2, [5, 21, 39]] = FLOAT32_MAX
    seed = torch.tensor([1, 2, 3])
    tokens = gumbel.sample(rows, seed, torch.tensor([0, 5, 9]), torch.tensor([1, 2, 1]))
    assert tokens.tolist() == [0, 33, 5]


def test_stream_and_block_draws_matter():
    """Level 1 reads block draws, level 2 entry draws: changing the stream changes samples of a flat row."""
    z = torch.zeros(64, 64)
    seed = torch.arange(64)
    pos = torch.zeros(64, dtype=torch.int64)
    a = gumbel.sample(z, seed, pos, 1)
    b = gumbel.sample(z, seed, pos, 2)
    assert not torch.equal(a, b)
    assert a.unique().numel() > 20  # a flat row spreads over its blocks and their entries


def _stress_rows(vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Rows that exercise the native search: flat, peaked, ties, -inf blocks, float32-max entries."""
    rows = [
        torch.randn(vocab, generator=gen) * 2,                            # flat: every block a candidate
        torch.randn(vocab, generator=gen) * 12,                           # peaked: most groups skipped
        torch.zeros(vocab),                                               # all ties: equal block bounds
        torch.where(torch.rand(vocab, generator=gen) < 0.9, NEG_INF, 1.0),  # mostly -inf blocks
        torch.randn(vocab, generator=gen).clamp(max=3.0).round(),         # many equal maxima per block
    ]
    huge = torch.randn(vocab, generator=gen)
    huge[torch.randint(0, vocab, (3,), generator=gen)] = float("inf")     # sanitized to float32 max
    rows.append(huge)
    return torch.stack(rows)


CPU = native.has_device("cpu")


@pytest.mark.native
@pytest.mark.skipif(not CPU, reason="specdec_kernels._C not built")
@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 63, 65, 513, 4097, 20000])
@pytest.mark.parametrize("split", [False, True], ids=["by-request", "split-row"])
def test_native_matches_reference_on_stress_rows(vocab, split):
    """Bonus-row sampling (k = 0) of the stress rows; split: one request at a time, its row across threads."""
    gen = torch.Generator().manual_seed(vocab)
    rows = _stress_rows(vocab, gen)
    if split:
        rows = rows[:1]
    rows = rows.repeat(4 if split else 2, 1)
    n = rows.shape[0]
    kwargs = dict(temperature=torch.rand(n, generator=gen) + 0.3, seed=torch.randint(0, 2**62, (n,), generator=gen),
                  position=torch.randint(0, 1 << 20, (n,), generator=gen))
    empty = torch.zeros(0, dtype=torch.int64)
    cu = torch.zeros(n + 1, dtype=torch.int64)
    for dtype in (torch.float32, torch.bfloat16):
        logits = rows.to(dtype)
        ref = sk.verify_chain(logits, empty, cu, backend="reference", **kwargs)
        got = sk.verify_chain(logits, empty, cu, backend="cpu", **kwargs)
        assert torch.equal(ref.output_token_ids, got.output_token_ids), (dtype, ref.output_token_ids, got.output_token_ids)


@pytest.mark.triton
@pytest.mark.skipif(not TRITON_RUNNABLE, reason="needs triton and a GPU, or TRITON_INTERPRET=1 on CPU")
@pytest.mark.slow
def test_triton_matches_reference_on_stress_rows():
    gen = torch.Generator().manual_seed(3)
    rows = _stress_rows(70, gen)
    n = rows.shape[0]
    kwargs = dict(temperature=torch.rand(n, generator=gen) + 0.3, seed=torch.randint(0, 2**62, (n,), generator=gen),
                  position=torch.randint(0, 1 << 20, (n,), generator=gen))
    empty = torch.zeros(0, dtype=torch.int64)
    cu = torch.zeros(n + 1, dtype=torch.int64)
    ref = sk.verify_chain(rows, empty, cu, backend="reference", **kwargs)
    on_device = {name: t.to(DEVICE) for name, t in kwargs.items()}
    got = sk.verify_chain(rows.to(DEVICE), empty.to(DEVICE), cu.to(DEVICE), backend="triton", **on_device)
    assert torch.equal(ref.output_token_ids, got.output_token_ids.cpu())
