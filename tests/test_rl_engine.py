"""rl_loop.engine: speculative rollouts are lossless (token-identical at T=0, equal in law at T=1)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rl_loop.drafters import DraftModelDrafter, build_drafter
from rl_loop.engine import GenerationConfig, RolloutEngine
from rl_loop.model import ModelConfig, Qwen3
from specdec_kernels.testing.stats import two_sample_chi2

pytestmark = pytest.mark.rl
torch.set_num_threads(1)  # tiny shapes: extra threads only add synchronisation overhead on a shared machine

CFG = ModelConfig(num_hidden_layers=3, intermediate_size=96)
EOS = 2


def _peaky(model: Qwen3, scale: float, seed: int) -> Qwen3:
    """Random weights with spread-out but non-uniform next-token distributions (few near-ties)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


@pytest.fixture(scope="module")
def policy():
    return _peaky(Qwen3(CFG), 0.12, 0)


def _perturbed_copy(policy: Qwen3, noise: float) -> Qwen3:
    d = copy.deepcopy(policy)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return d


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, 21, size=int(rng.integers(2, 7))).tolist()] for _ in range(n)]


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "draft_model", "copy"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculation_is_token_identical_to_autoregressive(policy, kind, k):
    drafter = DraftModelDrafter(_perturbed_copy(policy, 0.003)) if kind == "copy" else build_drafter(kind, policy)
    engine = RolloutEngine(policy, drafter, EOS)
    prompts = _prompts(12)
    seeds = list(range(12))
    ar = engine.generate(prompts, seeds, GenerationConfig(spec="none", temperature=0.0, max_new_tokens=20, max_batch=5))
    sp = engine.generate(prompts, seeds, GenerationConfig(spec="chain", k=k, temperature=0.0, max_new_tokens=20,
                                                          max_batch=5))
    assert sp.response_ids == ar.response_ids and sp.finished == ar.finished
    assert sp.stats.forwards <= ar.stats.forwards
    assert all(0 <= t < CFG.vocab_size for r in sp.response_ids for t in r)
    if kind == "copy":  # a near-perfect drafter is accepted almost always
        assert sp.stats.mean_accepted_length > 1 + 0.5 * k


def test_requests_sharing_a_prompt_reuse_its_prefill(policy, monkeypatch):
    """A GRPO group shares one prompt: the call prefills each distinct prompt once (one forward for all),
    and every request started from the copied keys/values decodes as if it had been prefilled alone."""
    engine = RolloutEngine(policy, build_drafter("eagle3", policy), EOS)
    a, b = _prompts(2, seed=4)
    prompts = [a] * 5 + [b] * 3
    cfg = GenerationConfig(spec="chain", k=2, temperature=0.0, max_new_tokens=10, max_batch=3)
    prefill_rows = []
    step = policy.step

    def counting_step(input_ids, cache, rows, start, kv_len, **kw):
        if input_ids.shape[1] > cfg.k + 1:  # a prefill (prompt rows), not a decode or verification
            prefill_rows.append(input_ids.shape[0])
        return step(input_ids, cache, rows, start, kv_len, **kw)

    monkeypatch.setattr(policy, "step", counting_step)
    shared = engine.generate(prompts, list(range(8)), cfg)
    assert prefill_rows == [2]
    alone = [engine.generate([p], [0], cfg).response_ids[0] for p in (a, b)]
    assert shared.response_ids == [alone[0]] * 5 + [alone[1]] * 3


def test_rollouts_do_not_depend_on_the_batch(policy):
    """Continuous batching with 3 slots or 16: each request's tokens depend only on its own seed."""
    engine = RolloutEngine(policy, DraftModelDrafter(_perturbed_copy(policy, 0.05)), EOS)
    prompts = _prompts(10, seed=1)
    seeds = [11 * i + 3 for i in range(10)]
    a = engine.generate(prompts, seeds, GenerationConfig(spec="none", temperature=1.0, max_new_tokens=12, max_batch=3))
    b = engine.generate(prompts, seeds, GenerationConfig(spec="none", temperature=1.0, max_new_tokens=12, max_batch=16))
    assert a.response_ids == b.response_ids
    c = engine.generate(prompts, seeds, GenerationConfig(spec="chain", temperature=0.0, max_new_tokens=12, max_batch=3))
    d = engine.generate(prompts, seeds, GenerationConfig(spec="none", temperature=0.0, max_new_tokens=12, max_batch=16))
    assert c.response_ids == d.response_ids


def _position_histograms(rollouts, positions: int) -> np.ndarray:
    out = np.zeros((positions, CFG.vocab_size + 1), dtype=np.int64)
    for r, f in zip(rollouts.response_ids, rollouts.finished, strict=True):
        seq = (r + ([EOS] if f else []))[:positions]
        for j in range(positions):
            out[j, seq[j] if j < len(seq) else CFG.vocab_size] += 1
    return out


class _LyingDrafter(DraftModelDrafter):
    """Planted bug: reports a uniform q to the verifier instead of the q it sampled from."""

    def propose(self, slots, k, temperature, generator):
        drafts, q = super().propose(slots, k, temperature, generator)
        return drafts, torch.full_like(q, 1.0 / q.shape[-1])


@pytest.mark.stat
def test_sampled_speculation_has_the_autoregressive_law_and_the_test_has_power(policy):
    prompt = [[1, 5, 9, 7]] * 800
    cfg = GenerationConfig(temperature=1.0, max_new_tokens=4, max_batch=200, k=3)
    draft = _perturbed_copy(policy, 0.03)
    engine = RolloutEngine(policy, DraftModelDrafter(draft), EOS)
    ar = engine.generate(prompt, list(range(800)), GenerationConfig(**{**cfg.__dict__, "spec": "none"}))
    sp = engine.generate(prompt, list(range(10_000, 10_800)), cfg)
    assert 1.5 < sp.stats.mean_accepted_length < 3.5  # both accept and reject paths are exercised
    h_ar, h_sp = _position_histograms(ar, 4), _position_histograms(sp, 4)
    alpha = 1e-3 / 4
    pvalues = [two_sample_chi2(h_ar[j], h_sp[j]).pvalue for j in range(4)]
    assert min(pvalues) > alpha, pvalues
    bug = RolloutEngine(policy, _LyingDrafter(draft), EOS).generate(prompt, list(range(20_000, 20_800)), cfg)
    h_bug = _position_histograms(bug, 4)
    assert min(two_sample_chi2(h_ar[j], h_bug[j]).pvalue for j in range(4)) < alpha


def test_bad_arguments_raise(policy):
    engine = RolloutEngine(policy, None, EOS)
    with pytest.raises(ValueError, match="seeds"):
        engine.generate([[1, 4]], [0, 1], GenerationConfig(spec="none"))
    with pytest.raises(ValueError, match="drafter"):
        engine.generate([[1, 4]], [0], GenerationConfig(spec="chain"))
    with pytest.raises(ValueError, match="spec"):
        GenerationConfig(spec="beam")
    with pytest.raises(ValueError, match="k"):
        GenerationConfig(k=0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.generate([[1] * 250], [0], GenerationConfig(spec="none", max_new_tokens=20))
