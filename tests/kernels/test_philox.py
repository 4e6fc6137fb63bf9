"""Philox reference: bit-identical to Triton's tl.rand / tl.randint4x, and the docs/design.md §4 draw layout."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.reference import philox
from tests.conftest import requires_triton


def _triton_rand(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(seed_ptr, offset_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        s = tl.load(seed_ptr + i, mask=mask, other=0)
        o = tl.load(offset_ptr + i, mask=mask, other=0)
        tl.store(out_ptr + i, tl.rand(s, o), mask=mask)

    out = torch.empty(seed.shape, dtype=torch.float32, device=seed.device)
    n = seed.numel()
    kernel[(triton.cdiv(n, 1024),)](seed, offset, out, n, BLOCK=1024)
    return out


def _triton_randint4x(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(seed_ptr, offset_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        s = tl.load(seed_ptr + i, mask=mask, other=0)
        o = tl.load(offset_ptr + i, mask=mask, other=0)
        w0, w1, w2, w3 = tl.randint4x(s, o)
        tl.store(out_ptr + 4 * i, w0, mask=mask)
        tl.store(out_ptr + 4 * i + 1, w1, mask=mask)
        tl.store(out_ptr + 4 * i + 2, w2, mask=mask)
        tl.store(out_ptr + 4 * i + 3, w3, mask=mask)

    out = torch.empty(seed.numel() * 4, dtype=torch.int32, device=seed.device)
    n = seed.numel()
    kernel[(triton.cdiv(n, 1024),)](seed, offset, out, n, BLOCK=1024)
    return out.view(n, 4)


def _seeds_and_offsets(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    seed = torch.randint(-(2**63), 2**63 - 1, (n,), dtype=torch.int64, generator=g)
    offset = torch.randint(0, 2**62, (n,), dtype=torch.int64, generator=g)
    offset[:256] = torch.arange(256)  # small offsets (high word 0)
    offset[256:512] = philox.draw_offset(torch.arange(256), philox.STREAM_BONUS, philox.BLOCK_DRAWS + 9495)
    seed[:16] = torch.tensor([0, 1, -1, 2**32, 2**32 - 1, -(2**63), 2**63 - 1, 42] * 2)
    return seed, offset


@requires_triton
@pytest.mark.slow
def test_four_words_bit_identical_to_triton_randint4x():
    seed, offset = _seeds_and_offsets(4096)
    expected = _triton_randint4x(seed, offset)
    got = torch.stack(philox.randint4x(seed, offset), dim=-1).to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(got, expected.to(torch.int64) & 0xFFFFFFFF)
    u = torch.stack(philox.rand4x(seed, offset), dim=-1)
    assert torch.equal(u, philox.uint32_to_uniform(got))


def test_draw_layout():
    """Draw i is word i & 3 of the call at (position << 32) | (stream << 30) | (i >> 2); coins are draw 0."""
    seed = torch.tensor([5, -7, 2**40])
    pos = torch.tensor([0, 17, 2**31 - 1])
    for stream in (0, 1, 2):
        for i in (0, 1, 2, 3, 4, 151935, philox.BLOCK_DRAWS, philox.BLOCK_DRAWS + 9495):
            offset = (pos << 32) | (stream << 30) | (i >> 2)
            assert offset.tolist() == philox.draw_offset(pos, stream, i).tolist()
            expected = philox.rand4x(seed, offset)[i & 3]
            assert torch.equal(philox.uniform(seed, pos, stream, i), expected)
    assert torch.equal(philox.coins(seed, pos), philox.rand(seed, pos << 32))  # word 0 = Triton's tl.rand
    assert torch.equal(philox.coins(seed, pos, 5), philox.uniform(seed, pos, philox.STREAM_COIN, 5))


@pytest.mark.slow
def test_draws_are_distinct():
    """Entries, blocks, streams and positions never share a Philox counter and word."""
    index = torch.cat([torch.arange(151936), philox.BLOCK_DRAWS + torch.arange(9496)])
    keys = [philox.draw_offset(torch.tensor(p), s, index) * 4 + (index & 3) for p in (0, 1) for s in (0, 1, 2, 3)]
    flat = torch.cat(keys)
    assert flat.unique().numel() == flat.numel()


@requires_triton
def test_bit_identical_to_triton_rand():
    g = torch.Generator().manual_seed(1234)
    n = 8192
    seed = torch.randint(-(2**63), 2**63 - 1, (n,), dtype=torch.int64, generator=g)
    offset = torch.randint(0, 2**62, (n,), dtype=torch.int64, generator=g)
    offset[:256] = torch.arange(256)  # small offsets (high word 0)
    offset[256:512] = (torch.arange(256) << 32) | (2 << 30) | 151935  # the DESIGN layout, 64-bit
    seed[:16] = torch.tensor([0, 1, -1, 2**32, 2**32 - 1, -(2**63), 2**63 - 1, 42] * 2)
    expected = _triton_rand(seed, offset)
    got = philox.rand(seed, offset)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


@pytest.mark.slow
def test_uniform_range_and_moments():
    seed = torch.full((200_000,), 7, dtype=torch.int64)
    u = philox.rand(seed, torch.arange(200_000))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.003
    assert abs(float(u.var()) - 1 / 12) < 0.002


def test_rows_and_sequence_coins_follow_the_draw_layout():
    """uniform_rows (the drafters' noise) is draw v of each row; sequence coins set bit 31 of the position."""
    seed = torch.tensor([5, -7, 2**40])
    pos = torch.tensor([0, 17, 2**31 - 1])
    for stream in (1, 3):
        for vocab in (1, 6, 37):
            v = torch.arange(vocab)
            expected = philox.uniform(seed[:, None], pos[:, None], stream, v[None, :])
            assert torch.equal(philox.uniform_rows(seed, pos, stream, vocab), expected)
    with pytest.raises(ValueError, match="stream"):
        philox.uniform_rows(seed, pos, 4, 8)
    for index in (1, 2, 5, (1 << 30) - 1):
        expected = philox.uniform(seed, pos | philox.SEQUENCE_COIN_FLAG, philox.STREAM_COIN, index)
        assert torch.equal(philox.sequence_coins(seed, pos, index), expected)
        assert not torch.equal(philox.sequence_coins(seed, pos, index), philox.coins(seed, pos, index))


def test_streams_and_positions_are_distinct():
    seed = torch.tensor([3])
    rows = [philox.uniform_rows(seed, torch.tensor([p]), s, 64) for p in (0, 1) for s in (0, 1, 2)]
    flat = torch.cat(rows).flatten()
    assert flat.unique().numel() == flat.numel()
