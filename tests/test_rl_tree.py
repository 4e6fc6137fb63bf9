"""rl_loop.tree_engine: tree-speculative rollouts are lossless (token-identical at T=0, equal in law at T=1)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import rl_loop.tree_engine as tree_engine
from rl_loop.drafters import build_drafter, distill
from rl_loop.engine import GenerationConfig, RolloutEngine
from rl_loop.model import KVCache, ModelConfig, Qwen3
from rl_loop.train import REQUIRED_SUMMARY_KEYS, run, tiny_config
from rl_loop.tree_engine import TreeRolloutEngine, TreeShape, sampled_paths, tree_shape_for
from specdec_kernels.testing.stats import two_sample_chi2

pytestmark = pytest.mark.rl
torch.set_num_threads(1)

CFG = ModelConfig(num_hidden_layers=3, intermediate_size=96)
EOS = 2


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, 21, size=int(rng.integers(2, 7))).tolist()] for _ in range(n)]


@pytest.fixture(scope="module")
def policy_and_drafter():
    """A random policy with spread-out next-token distributions and an EAGLE-3 head distilled on its own
    samples, so trees are accepted at several depths and off the first branch."""
    g = torch.Generator().manual_seed(0)
    policy = Qwen3(CFG)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.12)
    policy.eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    drafter = build_drafter("eagle3", policy)
    prompts = _prompts(32, seed=5)
    samples = RolloutEngine(policy, drafter, EOS).generate(
        prompts, list(range(32)), GenerationConfig(spec="none", temperature=1.0, max_new_tokens=16, max_batch=32))
    seqs = [p + r for p, r in zip(prompts, samples.response_ids, strict=True)]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width - 1, dtype=torch.bool)
    for i, (p, s) in enumerate(zip(prompts, seqs, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(p) - 1 : len(s) - 1] = True
    torch.manual_seed(0)
    distill(drafter, policy, lambda: (ids, mask), 40, lr=3e-3)
    return policy, drafter


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_tree_speculation_is_token_identical_to_autoregressive(policy_and_drafter, k):
    policy, drafter = policy_and_drafter
    engine = TreeRolloutEngine(policy, drafter, EOS)
    prompts, seeds = _prompts(12), list(range(12))
    ar = engine.generate(prompts, seeds, GenerationConfig(spec="none", temperature=0.0, max_new_tokens=20, max_batch=5))
    tr = engine.generate(prompts, seeds, GenerationConfig(spec="tree", k=k, temperature=0.0, max_new_tokens=20,
                                                          max_batch=5))
    assert tr.response_ids == ar.response_ids and tr.finished == ar.finished
    assert tr.stats.forwards < ar.stats.forwards  # the distilled head is accepted
    assert all(0 <= t < CFG.vocab_size for r in tr.response_ids for t in r)
    # acceptance statistics: one entry per depth, non-increasing, consistent with the mean accepted length
    by_pos = tr.stats.acceptance_by_position
    assert len(by_pos) == k and all(a >= b for a, b in zip(by_pos, by_pos[1:], strict=False))
    assert tr.stats.mean_accepted_length == pytest.approx(1 + sum(by_pos))
    assert tr.stats.mean_accepted_length > 1.2


def test_wide_tree_and_planted_bugs_are_caught(policy_and_drafter, monkeypatch):
    """A wider tree (branches accepted off the first child) is exact; a causal instead of ancestor mask, or
    a missing KV compaction, changes the greedy tokens (the identity test has power)."""
    policy, drafter = policy_and_drafter
    prompts, seeds = _prompts(12, seed=3), list(range(12))
    cfg = GenerationConfig(spec="tree", k=3, temperature=0.0, max_new_tokens=20, max_batch=6)
    ar = RolloutEngine(policy, drafter, EOS).generate(prompts, seeds, GenerationConfig(**{**cfg.__dict__, "spec": "none"}))
    wide = TreeRolloutEngine(policy, drafter, EOS, shape=TreeShape(depth=3, top_k=3, beam=2, budget=7))
    assert wide.generate(prompts, seeds, cfg).response_ids == ar.response_ids
    with monkeypatch.context() as m:
        m.setattr(tree_engine, "tree_attention_mask", _causal_mask)
        assert wide.generate(prompts, seeds, cfg).response_ids != ar.response_ids
    with monkeypatch.context() as m:
        m.setattr(KVCache, "gather_positions", lambda self, rows, src, dst: None)
        assert wide.generate(prompts, seeds, cfg).response_ids != ar.response_ids


def _causal_mask(parent: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Planted bug: every node sees every earlier node (siblings and cousins too), not only its ancestors."""
    n = parent.shape[1]
    return torch.ones(n, n, dtype=torch.bool).tril().expand(parent.shape[0], -1, -1)


def _position_histograms(rollouts, positions: int) -> np.ndarray:
    out = np.zeros((positions, CFG.vocab_size + 1), dtype=np.int64)
    for r, f in zip(rollouts.response_ids, rollouts.finished, strict=True):
        seq = (r + ([EOS] if f else []))[:positions]
        for j in range(positions):
            out[j, seq[j] if j < len(seq) else CFG.vocab_size] += 1
    return out


@pytest.mark.stat
@pytest.mark.parametrize("stochastic", [True, False], ids=["rrs_tree", "deterministic_tree"])
def test_sampled_tree_speculation_has_the_autoregressive_law(policy_and_drafter, stochastic):
    """Per-position token histograms of tree-speculative vs autoregressive rollouts at T = 1: siblings
    drawn without replacement (recursive rejection sampling) and the deterministic EAGLE-2 tree.

    Power: 2000 rollouts per side, 33 cells, alpha 2.5e-4 per position; a two-sample test is about a
    one-sample test at n / 2, and ``chi2_power(1000, tv=0.15, df=32, alpha)`` is 0.999, so any per-position
    error of TV >= 0.15 is caught almost surely (TV >= 0.12: about 0.9)."""
    policy, drafter = policy_and_drafter
    n, positions = 2000, 4
    prompt = [[1, 5, 9, 7]] * n
    cfg = GenerationConfig(spec="tree", temperature=1.0, max_new_tokens=positions, max_batch=250, k=3)
    engine = TreeRolloutEngine(policy, drafter, EOS, shape=TreeShape(depth=3, top_k=3, beam=2, budget=5,
                                                                stochastic_when_sampling=stochastic))
    ar = engine.generate(prompt, list(range(n)), GenerationConfig(**{**cfg.__dict__, "spec": "none"}))
    tr = engine.generate(prompt, list(range(10_000, 10_000 + n)), cfg)
    assert tr.stats.mean_accepted_length > 1.1  # accept and reject paths are both exercised
    h_ar, h_tr = _position_histograms(ar, positions), _position_histograms(tr, positions)
    alpha = 1e-3 / positions
    pvalues = [two_sample_chi2(h_ar[j], h_tr[j]).pvalue for j in range(positions)]
    assert min(pvalues) > alpha, pvalues


def test_tree_shape_and_drafter_validation(policy_and_drafter):
    policy, _ = policy_and_drafter
    assert tree_shape_for(3) == TreeShape(depth=3, top_k=2, beam=2, budget=3)
    assert sampled_paths(3, 3) == [(0,), (0, 0), (0, 0, 0)]  # equal node budget: the chain
    assert sampled_paths(3, 7) == [(0,), (0, 0), (0, 0, 0), (1,), (0, 1), (0, 0, 1), (2,)]
    assert sampled_paths(3, 2) == [(0,), (0, 0)]
    with pytest.raises(ValueError, match="budget"):
        TreeShape(depth=1, top_k=2, beam=2, budget=3)
    with pytest.raises(ValueError, match="beam"):
        TreeShape(depth=2, top_k=1, beam=2, budget=1)
    engine = TreeRolloutEngine(policy, build_drafter("draft_model", policy), EOS)
    with pytest.raises(ValueError, match="EAGLE-3"):
        engine.generate([[1, 4]], [0], GenerationConfig(spec="tree"))
    with pytest.raises(ValueError, match="drafter"):
        run(tiny_config(spec="tree", drafter="draft_model", out="/nonexistent"))


def test_cli_tree_run_writes_summary(tmp_path):
    out = str(tmp_path / "tree")
    summary = run(tiny_config(spec="tree", out=out, steps=1))
    with open(os.path.join(out, "summary.json")) as f:
        written = json.load(f)
    for key in REQUIRED_SUMMARY_KEYS:
        assert key in written
    assert written["spec"] == "tree" and summary["mean_accepted_length"] >= 1.0
    assert len(written["acceptance_by_position"]) == written["k"]
    assert written["equivalence_pass"] is not None
