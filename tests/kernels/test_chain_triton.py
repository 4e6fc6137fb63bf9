"""The fused Triton chain kernel emits the reference's tokens for the same seeds (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from tests.conftest import DEVICE, requires_triton

pytestmark = [
    pytest.mark.triton,
    requires_triton,
    pytest.mark.slow,  # kernels under the Triton interpreter on CPU machines: seconds per call
    # The interpreter evaluates log(0) for zero uniforms / empty residual entries (-inf is intended) and
    # 0/0 on empty rows, whose probabilities are then replaced by the one-hot on token 0.
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning"),
]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _make_batch(
    gen: torch.Generator,
    num_reqs: int,
    vocab_size: int,
    max_k: int,
    dtype: torch.dtype = torch.float32,
    stochastic: bool = False,
    top_k: bool = False,
    top_p: bool = False,
    greedy_frac: float = 0.3,
    placeholder_frac: float = 0.1,
) -> dict:
    """A ragged CPU batch whose drafts are often accepted, so that accept, reject and bonus paths all run."""
    ks = torch.randint(0, max_k + 1, (num_reqs,), generator=gen)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int64)
    cu[1:] = ks.cumsum(0)
    num_drafts = int(cu[-1])
    logits = torch.randn(num_drafts + num_reqs, vocab_size, generator=gen) * 3.0
    rows = torch.arange(num_drafts) + torch.repeat_interleave(torch.arange(num_reqs), ks)
    draft_probs = None
    if stochastic:
        # q close to the target, drafts drawn from q: acceptance is likely but not certain.
        q_logits = logits[rows] + torch.randn(num_drafts, vocab_size, generator=gen)
        draft_probs = torch.softmax(q_logits, dim=-1)
        drafts = torch.multinomial(draft_probs, 1, generator=gen).squeeze(-1) if num_drafts else rows
    else:
        drafts = torch.where(
            torch.rand(num_drafts, generator=gen) < 0.7,
            logits[rows].argmax(-1),
            torch.randint(0, vocab_size, (num_drafts,), generator=gen),
        )
    drafts = torch.where(torch.rand(num_drafts, generator=gen) < placeholder_frac, -1, drafts)
    temperature = torch.rand(num_reqs, generator=gen) * 1.5 + 0.2
    temperature[torch.rand(num_reqs, generator=gen) < greedy_frac] = 0.0
    batch = dict(
        target_logits=logits.to(dtype),
        draft_token_ids=drafts,
        cu_num_draft_tokens=cu,
        draft_probs=draft_probs,
        temperature=temperature,
        top_k=torch.randint(0, 12, (num_reqs,), generator=gen).to(torch.int32) if top_k else None,
        top_p=(torch.rand(num_reqs, generator=gen) * 0.9 + 0.1) if top_p else None,
        seed=torch.randint(-(2**63), 2**63 - 1, (num_reqs,), dtype=torch.int64, generator=gen),
        position=torch.randint(0, 2**20, (num_reqs,), generator=gen),
    )
    if top_p:
        batch["top_p"][torch.rand(num_reqs, generator=gen) < 0.2] = 1.0
    return batch


def _on_device(batch: dict) -> dict:
    return {name: None if x is None else x.to(DEVICE) for name, x in batch.items()}


def _assert_same(batch: dict, max_draft_len: int | None = None, validate: bool = True) -> sk.ChainResult:
    """Reference and Triton on DEVICE emit identical tokens; returns the Triton result on the CPU."""
    batch = _on_device(batch)
    ref = sk.verify_chain(**batch, backend="reference", max_draft_len=max_draft_len, validate=validate)
    got = sk.verify_chain(**batch, backend="triton", max_draft_len=max_draft_len, validate=validate)
    assert got.output_token_ids.dtype == torch.int32 and got.num_accepted.dtype == torch.int32
    assert torch.equal(got.num_accepted, ref.num_accepted), (got.num_accepted, ref.num_accepted)
    assert torch.equal(got.output_token_ids, ref.output_token_ids), (got.output_token_ids, ref.output_token_ids)
    vocab_size = batch["target_logits"].shape[1]
    width = got.output_token_ids.shape[1]
    emitted = torch.arange(width, device=got.num_accepted.device)[None, :] <= got.num_accepted[:, None]
    tokens = got.output_token_ids
    assert bool(((tokens >= 0) & (tokens < vocab_size))[emitted].all())
    assert bool((tokens[~emitted] == -1).all())
    return sk.ChainResult(got.output_token_ids.cpu(), got.num_accepted.cpu())


def _assert_mixed_outcomes(result: sk.ChainResult, batch: dict) -> None:
    """Guard against vacuous comparisons: some drafts accepted and some rejected."""
    cu = batch["cu_num_draft_tokens"]
    lengths = cu[1:] - cu[:-1]
    assert int(result.num_accepted.sum()) > 0
    assert bool((result.num_accepted < lengths).any())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
def test_matches_reference_ragged(dtype, stochastic):
    gen = torch.Generator().manual_seed(10 * DTYPES.index(dtype) + stochastic)
    for _ in range(3):
        batch = _make_batch(gen, num_reqs=16, vocab_size=203, max_k=5, dtype=dtype, stochastic=stochastic)
        result = _assert_same(batch, max_draft_len=6)  # wider than needed: padding columns stay -1
        _assert_mixed_outcomes(result, batch)


@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
@pytest.mark.parametrize("truncation", ["top_k", "top_p", "top_k+top_p"])
def test_matches_reference_truncated(truncation, stochastic):
    gen = torch.Generator().manual_seed(100 + 10 * len(truncation) + stochastic)
    for trial in range(3):
        batch = _make_batch(
            gen, num_reqs=8, vocab_size=157 + 64 * trial, max_k=4, stochastic=stochastic,
            top_k="top_k" in truncation, top_p="top_p" in truncation, greedy_frac=0.15,
        )
        _assert_same(batch)


def test_truncation_ties_follow_the_reference_rule():
    """Tied logits at the top-k / top-p boundary are kept or dropped together, as in the reference."""
    gen = torch.Generator().manual_seed(7)
    vocab_size = 64
    levels = torch.tensor([2.0, 1.0, 1.0, 1.0, 0.0, 0.0, -0.0, -1.0])
    batch = _make_batch(gen, num_reqs=10, vocab_size=vocab_size, max_k=2, top_k=True, top_p=True, greedy_frac=0.0)
    num_rows = batch["target_logits"].shape[0]
    logits = levels[torch.randint(0, levels.numel(), (num_rows, vocab_size), generator=gen)]
    batch["target_logits"] = logits
    # k = 40 and 45 put the k-th value in the zero group, where +0.0 and -0.0 must tie.
    batch["top_k"] = torch.tensor([1, 2, 3, 4, 40, 45, 30, 0, 63, 2], dtype=torch.int32)
    batch["top_p"] = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 0.2, 0.4, 0.6, 0.8])
    batch["temperature"] = torch.full((10,), 0.7)
    for stochastic in (False, True):
        if stochastic:
            num_drafts = batch["draft_token_ids"].numel()
            batch["draft_probs"] = torch.softmax(torch.randn(num_drafts, vocab_size, generator=gen), -1)
        _assert_same(batch)
    # Signed zeros on top: top_k = 1 must keep +0.0 and -0.0 together (they compare equal).
    signed = torch.tensor([0.0, -0.0, -3.0])
    batch["target_logits"] = signed[torch.randint(0, 3, (num_rows, vocab_size), generator=gen)]
    batch["top_k"] = torch.ones(10, dtype=torch.int32)
    batch["top_p"] = None
    _assert_same(batch)


def test_k0_requests_and_empty_batch():
    gen = torch.Generator().manual_seed(3)
    batch = _make_batch(gen, num_reqs=6, vocab_size=100, max_k=0)
    result = _assert_same(batch)
    assert result.output_token_ids.shape == (6, 1)
    assert bool((result.num_accepted == 0).all())
    empty = _on_device(_make_batch(gen, num_reqs=0, vocab_size=100, max_k=3))
    result = sk.verify_chain(**empty, backend="triton", max_draft_len=3)
    assert result.output_token_ids.shape == (0, 4) and result.num_accepted.shape == (0,)


def test_out_of_range_draft_ids_are_placeholders():
    """With validation off, ids outside [0, V) are rejected like -1 and never read memory."""
    gen = torch.Generator().manual_seed(11)
    for stochastic in (False, True):
        batch = _make_batch(gen, num_reqs=6, vocab_size=90, max_k=3, stochastic=stochastic, placeholder_frac=0.0)
        drafts = batch["draft_token_ids"].clone()
        drafts[::2] = torch.tensor([90, 10**9, -5, -(10**12)]).repeat(drafts.numel())[: drafts[::2].numel()]
        batch["draft_token_ids"] = drafts
        _assert_same(batch, validate=False)


@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
def test_nan_and_inf_rows(stochastic):
    gen = torch.Generator().manual_seed(5 + stochastic)
    vocab_size = 77
    batch = _make_batch(gen, num_reqs=10, vocab_size=vocab_size, max_k=3, stochastic=stochastic,
                        top_k=True, top_p=True, greedy_frac=0.3, placeholder_frac=0.0)
    logits = batch["target_logits"].clone()
    num_rows = logits.shape[0]
    kind = torch.arange(num_rows) % 6
    logits[kind == 0] = float("-inf")                       # empty rows: token 0
    logits[kind == 1] = float("nan")                        # all NaN: also empty
    sprinkle = torch.rand(num_rows, vocab_size, generator=gen)
    two = (kind == 2)[:, None]
    logits = torch.where(two & (sprinkle < 0.3), float("nan"), logits)
    logits = torch.where(two & (sprinkle > 0.9), float("inf"), logits)   # several +inf: ties at float32 max
    three = (kind == 3)[:, None]
    logits = torch.where(three & (sprinkle < 0.8), float("-inf"), logits)
    batch["target_logits"] = logits
    drafts = batch["draft_token_ids"].clone()
    drafts[: drafts.numel() // 3] = 0  # token 0 is the empty rows' token: exercises their acceptance
    batch["draft_token_ids"] = drafts
    if stochastic:
        q = batch["draft_probs"].clone()
        q[:, 0] = torch.where(torch.rand(q.shape[0], generator=gen) < 0.5, 0.0, 0.5)
        batch["draft_probs"] = q
    _assert_same(batch)


def test_ties_across_tiles_keep_the_lowest_index():
    """Constant rows and rows with several +inf logits spanning many tiles (V = 2500)."""
    gen = torch.Generator().manual_seed(2500)
    vocab_size = 2500
    for stochastic in (False, True):
        batch = _make_batch(gen, num_reqs=6, vocab_size=vocab_size, max_k=1, stochastic=stochastic, greedy_frac=0.5)
        logits = batch["target_logits"].clone()
        logits[0::2] = 1.5
        logits[1::2, 1200::700] = float("inf")
        batch["target_logits"] = logits
        _assert_same(batch)


def test_empty_residual_samples_the_target():
    """q == p exactly (one-hot target via top_k = 1): a rejected placeholder samples p itself."""
    gen = torch.Generator().manual_seed(99)
    vocab_size = 50
    batch = _make_batch(gen, num_reqs=6, vocab_size=vocab_size, max_k=3, stochastic=True,
                        greedy_frac=0.0, placeholder_frac=0.0)
    batch["top_k"] = torch.ones(6, dtype=torch.int32)
    logits = batch["target_logits"]
    logits[:, 0] = -10.0  # the target's argmax is never token 0, where an all -inf residual would land
    cu = batch["cu_num_draft_tokens"]
    ks = cu[1:] - cu[:-1]
    rows = torch.arange(int(cu[-1])) + torch.repeat_interleave(torch.arange(6), ks)
    argmax = logits[rows].argmax(-1)
    batch["draft_probs"] = torch.nn.functional.one_hot(argmax, vocab_size).float()
    drafts = argmax.clone()
    drafts[1::2] = -1  # rejected placeholders with an empty residual
    batch["draft_token_ids"] = drafts
    result = _assert_same(batch)
    _assert_mixed_outcomes(result, batch)


def test_vocab_151936():
    """A real vocabulary size (not a power of two, many tiles), greedy and random, fp32 and bf16."""
    gen = torch.Generator().manual_seed(151936)
    for dtype in (torch.float32, torch.bfloat16):
        batch = _make_batch(gen, num_reqs=3, vocab_size=151936, max_k=2, dtype=dtype, greedy_frac=0.34)
        _assert_same(batch)


def test_vocab_large_stochastic_top_k():
    """Several tiles in every pass (V = 5000 is not a tile multiple), stochastic with top-k and top-p."""
    gen = torch.Generator().manual_seed(5000)
    batch = _make_batch(gen, num_reqs=3, vocab_size=5000, max_k=2, stochastic=True,
                        top_k=True, top_p=True, greedy_frac=0.0)
    batch["top_k"] = torch.tensor([0, 700, 3000], dtype=torch.int32)
    _assert_same(batch)


def test_config_table_covers_supported_shapes():
    from specdec_kernels.triton.chain import chain_config

    for dtype in DTYPES:
        for vocab_size in (1, 7, 1000, 32000, 151936, 262144):
            config = chain_config(vocab_size, dtype)
            assert config.block_v <= max(16, triton_next_pow2(vocab_size))  # whole 16-entry Gumbel blocks
            assert config.block_v % 16 == 0
            assert config.search_block_v <= config.block_v
            assert config.num_pivots & (config.num_pivots - 1) == 0


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
