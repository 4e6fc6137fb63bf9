"""rl_loop.step.engine: speculative rollouts are lossless (token-identical at T=0, equal in law at T=1) and batch
invariant (a request's tokens depend on its own prompt and seed only)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rl_loop.step.drafting import build_drafter
from rl_loop.step.engine import RolloutEngine
from rl_loop.step.rollouts import GenerationConfig, TreeShape
from specdec_kernels.drafters import DraftModelDrafter, DraftProposal
from specdec_kernels.exactness.goodness_of_fit import two_sample_chi2
from specdec_kernels.models import ModelConfig, Qwen3

pytestmark = [pytest.mark.rl, pytest.mark.usefixtures("one_thread")]

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


def _drafter(kind: str, policy: Qwen3):
    """A drafter whose proposals get accepted sometimes (random heads are pulled toward the policy)."""
    if kind == "copy":
        return DraftModelDrafter(_perturbed_copy(policy, 0.003))
    drafter = build_drafter(kind, policy, seed=1)
    if kind == "draft_model":  # a one-layer LM with the policy's embedding and first attention block
        with torch.no_grad():
            lm = drafter.model
            lm.model.embed_tokens.weight.copy_(policy.model.embed_tokens.weight)
            lm.model.layers[0].self_attn.load_state_dict(policy.model.layers[0].self_attn.state_dict())
    return drafter


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, 21, size=int(rng.integers(2, 7))).tolist()] for _ in range(n)]


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "draft_model", "copy"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculation_is_token_identical_to_autoregressive(policy, kind, k):
    engine = RolloutEngine(policy, _drafter(kind, policy), EOS)
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
    step = engine.policy_step  # the engine's policy forward, whichever decode path it runs

    def counting_step(input_ids, cache, rows, start, kv_len, **kw):
        if input_ids.shape[1] > cfg.k + 1:  # a prefill (prompt rows), not a decode or verification
            prefill_rows.append(input_ids.shape[0])
        return step(input_ids, cache, rows, start, kv_len, **kw)

    monkeypatch.setattr(engine, "policy_step", counting_step)
    shared = engine.generate(prompts, list(range(8)), cfg)
    assert prefill_rows == [2]
    alone = [engine.generate([p], [0], cfg).response_ids[0] for p in (a, b)]
    assert shared.response_ids == [alone[0]] * 5 + [alone[1]] * 3


# token level: every drafter, greedy and sampled; block / traversal: sampled drafts (greedy requests carry
# deterministic drafts, which both methods verify at token level) of the EAGLE-3 head and the draft model
INVARIANCE_CASES = [(spec, "token", kind, t) for spec in ("chain", "tree") for kind in ("eagle3", "mtp", "draft_model")
                    for t in (0.0, 1.0)]
INVARIANCE_CASES += [(spec, verify, kind, 1.0) for spec, verify in (("chain", "block"), ("tree", "traversal"))
                     for kind in ("eagle3", "draft_model")]


@pytest.mark.parametrize("spec, verify, kind, temperature", INVARIANCE_CASES)
def test_rollouts_are_batch_invariant(policy, kind, spec, verify, temperature):
    """A request's tokens are the same alone, in a batch, with another max_batch and in another slot
    (drafts, tree siblings and verification all drawn by the request's seed and absolute position), with
    every verification method."""
    engine = RolloutEngine(policy, _drafter(kind, policy), EOS)
    prompts = _prompts(8, seed=2)
    seeds = [1000 + 37 * i for i in range(8)]
    cfg = GenerationConfig(spec=spec, k=3, temperature=temperature, max_new_tokens=10, max_batch=8,
                           tree=TreeShape(3, top_k=2, beam=2), verify=verify)
    batch = engine.generate(prompts, seeds, cfg).response_ids
    assert engine.generate(prompts, seeds, GenerationConfig(**{**cfg.__dict__, "max_batch": 3})).response_ids == batch
    order = [5, 2, 7, 0, 3, 6, 1, 4]  # other slots, other neighbours
    shuffled = engine.generate([prompts[i] for i in order], [seeds[i] for i in order], cfg).response_ids
    assert shuffled == [batch[i] for i in order]
    for i in (0, 6):
        assert engine.generate([prompts[i]], [seeds[i]], cfg).response_ids[0] == batch[i]
    if temperature > 0:  # the seeds matter: the comparison is not between constant outputs
        other = engine.generate(prompts, [s + 1 for s in seeds], cfg).response_ids
        assert other != batch


def test_batch_invariance_check_has_power(policy, monkeypatch):
    """Planted bug (what rl_loop did before): drafts drawn from a generator seeded with the batch's seeds.
    The emitted tokens then depend on the batch, and the invariance check sees it."""
    import specdec_kernels.drafters.cached as cached

    def batch_uniforms(seed, position, vocab_size):
        g = torch.Generator().manual_seed(int(seed.sum()) & 0x7FFFFFFF)
        return torch.rand((seed.numel(), vocab_size), generator=g).clamp_(min=1e-20)

    monkeypatch.setattr(cached, "draft_uniforms", batch_uniforms)
    engine = RolloutEngine(policy, _drafter("eagle3", policy), EOS)
    prompts, seeds = _prompts(8, seed=2), [1000 + 37 * i for i in range(8)]
    cfg = GenerationConfig(spec="chain", k=3, temperature=1.0, max_new_tokens=10, max_batch=8)
    batch = engine.generate(prompts, seeds, cfg).response_ids
    alone = [engine.generate([p], [s], cfg).response_ids[0] for p, s in zip(prompts, seeds, strict=True)]
    assert alone != batch


def _position_histograms(rollouts, positions: int) -> np.ndarray:
    out = np.zeros((positions, CFG.vocab_size + 1), dtype=np.int64)
    for r, f in zip(rollouts.response_ids, rollouts.finished, strict=True):
        seq = (r + ([EOS] if f else []))[:positions]
        for j in range(positions):
            out[j, seq[j] if j < len(seq) else CFG.vocab_size] += 1
    return out


class _LyingDrafter(DraftModelDrafter):
    """Planted bug: reports a uniform q to the verifier instead of the q it sampled from."""

    def propose(self, k, temperature=None, seed=None, position=None, rows=None):
        prop = super().propose(k, temperature, seed, position, rows)
        return DraftProposal(prop.token_ids, torch.full_like(prop.probs, 1.0 / prop.probs.shape[-1]))


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
    with pytest.raises(ValueError, match="2 tokens"):
        RolloutEngine(policy, build_drafter("eagle3", policy), EOS).generate([[1]], [0], GenerationConfig())
