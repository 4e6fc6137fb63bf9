"""Tree speculation (``--spec tree``) on the one engine: lossless (token-identical at T=0, equal in law at
T=1), verified on the fastest backend (native CPU when built), and its checks have power."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from rl_loop.config import REQUIRED_SUMMARY_KEYS, tiny_config
from rl_loop.experiments import bench, tree_bench
from rl_loop.step import strategies
from rl_loop.step.drafting import build_drafter, distill_step
from rl_loop.step.engine import RolloutEngine
from rl_loop.step.rollouts import GenerationConfig, TreeShape
from rl_loop.train import run
from specdec_kernels.drafters.training import DrafterTrainer, TrainConfig
from specdec_kernels.exactness.goodness_of_fit import two_sample_chi2
from specdec_kernels.models import KVCache, ModelConfig
from specdec_kernels.models.tiny_qwen3 import spread_qwen3

pytestmark = [pytest.mark.rl, pytest.mark.usefixtures("one_thread")]

CFG = ModelConfig(num_hidden_layers=3, intermediate_size=96)
EOS = 2


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, 21, size=int(rng.integers(2, 7))).tolist()] for _ in range(n)]


@pytest.fixture(scope="module")
def policy_and_drafter():
    """A random policy with spread-out next-token distributions and an EAGLE-3 head distilled on its own
    samples, so trees are accepted at several depths and off the first branch."""
    torch.set_num_threads(1)
    policy = spread_qwen3(CFG)
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
    trainer = DrafterTrainer(drafter.head, TrainConfig(lr=3e-3, ttt_steps=3, decay=1.0))
    for _ in range(40):
        distill_step(trainer, policy, ids, mask)
    return policy, drafter


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.slow
def test_greedy_tree_speculation_is_token_identical_to_autoregressive(policy_and_drafter, k):
    policy, drafter = policy_and_drafter
    engine = RolloutEngine(policy, drafter, EOS)
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
    cfg = GenerationConfig(spec="tree", k=3, temperature=0.0, max_new_tokens=20, max_batch=6,
                           tree=TreeShape(depth=3, top_k=3, beam=2))
    engine = RolloutEngine(policy, drafter, EOS)
    ar = engine.generate(prompts, seeds, GenerationConfig(**{**cfg.__dict__, "spec": "none"}))
    wide = engine.generate(prompts, seeds, cfg)
    assert wide.response_ids == ar.response_ids
    assert wide.stats.mean_accepted_length > 1.5
    with monkeypatch.context() as m:
        m.setattr(strategies, "tree_attention_mask", _causal_mask)
        assert engine.generate(prompts, seeds, cfg).response_ids != ar.response_ids
    with monkeypatch.context() as m:
        m.setattr(KVCache, "gather_positions", lambda self, rows, src, dst: None)
        assert engine.generate(prompts, seeds, cfg).response_ids != ar.response_ids


def _causal_mask(parent: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Planted bug: every node sees every earlier node (siblings and cousins too), not only its ancestors."""
    n = parent.shape[1]
    return torch.ones(n, n, dtype=torch.bool).tril().expand(parent.shape[0], -1, -1)


def test_trees_verify_on_the_native_backend(policy_and_drafter, monkeypatch):
    """The default verification backend of trees is the engine's (native CPU when built), not a fallback."""
    import specdec_kernels as sk

    policy, drafter = policy_and_drafter
    seen = []
    verify = sk.verify_tree

    def spy(*args, **kwargs):
        seen.append(kwargs["backend"])
        return verify(*args, **kwargs)

    monkeypatch.setattr(strategies.sk, "verify_tree", spy)
    RolloutEngine(policy, drafter, EOS).generate(_prompts(2), [0, 1], GenerationConfig(spec="tree", max_new_tokens=4))
    assert seen and set(seen) == {sk.available_backends("cpu")[0]}


def _position_histograms(rollouts, positions: int) -> np.ndarray:
    out = np.zeros((positions, CFG.vocab_size + 1), dtype=np.int64)
    for r, f in zip(rollouts.response_ids, rollouts.finished, strict=True):
        seq = (r + ([EOS] if f else []))[:positions]
        for j in range(positions):
            out[j, seq[j] if j < len(seq) else CFG.vocab_size] += 1
    return out


@pytest.mark.stat
@pytest.mark.slow
def test_sampled_tree_speculation_has_the_autoregressive_law(policy_and_drafter):
    """Per-position token histograms of tree-speculative (siblings drawn without replacement on the draft
    stream, recursive rejection sampling) vs autoregressive rollouts at T = 1.

    Power: 2000 rollouts per side, 33 cells, alpha 2.5e-4 per position; a two-sample test is about a
    one-sample test at n / 2, and ``chi2_power(1000, tv=0.15, df=32, alpha)`` is 0.999, so any per-position
    error of TV >= 0.15 is caught almost surely (TV >= 0.12: about 0.9)."""
    policy, drafter = policy_and_drafter
    n, positions = 2000, 4
    prompt = [[1, 5, 9, 7]] * n
    cfg = GenerationConfig(spec="tree", temperature=1.0, max_new_tokens=positions, max_batch=250, k=3,
                           tree=TreeShape(depth=3, top_k=3, beam=2))
    engine = RolloutEngine(policy, drafter, EOS)
    ar = engine.generate(prompt, list(range(n)), GenerationConfig(**{**cfg.__dict__, "spec": "none"}))
    tr = engine.generate(prompt, list(range(10_000, 10_000 + n)), cfg)
    assert tr.stats.mean_accepted_length > 1.1  # accept and reject paths are both exercised
    h_ar, h_tr = _position_histograms(ar, positions), _position_histograms(tr, positions)
    alpha = 1e-3 / positions
    pvalues = [two_sample_chi2(h_ar[j], h_tr[j]).pvalue for j in range(positions)]
    assert min(pvalues) > alpha, pvalues


def test_tree_shape_validation():
    assert TreeShape.for_k(3) == TreeShape(depth=3, top_k=2, beam=1)
    assert TreeShape(3, 2, 1).num_nodes == 7 and TreeShape(3, 3, 2).num_nodes == 1 + 3 + 6 + 6
    with pytest.raises(ValueError, match="depth"):
        TreeShape(depth=0)


@pytest.mark.slow
def test_cli_tree_run_writes_summary(tmp_path):
    out = str(tmp_path / "tree")
    summary = run(tiny_config(spec="tree", out=out, steps=1))
    with open(os.path.join(out, "summary.json")) as f:
        written = json.load(f)
    for key in REQUIRED_SUMMARY_KEYS:
        assert key in written
    assert written["spec"] == "tree" and len(written["acceptance_by_position"]) == written["k"]
    # a tree's accepted path: draft j at depth j, accepted only below an accepted node
    assert summary["mean_accepted_length"] == pytest.approx(1 + sum(written["acceptance_by_position"]))
    assert written["equivalence"] in ("pass", "underpowered")
    # the snapshot tools read the run's checkpoint: the k sweep and AR vs chain vs trees, side by side
    assert bench.main(["--run", out, "--ks", "1,2", "--repeats", "1", "--requests", "8"]) == 0
    with open(os.path.join(out, "k_sweep.json")) as f:
        sweep = json.load(f)
    assert [r["k"] for r in sweep] == [1, 2] and all(r["speedups"] == [r["rollout_speedup"]] for r in sweep)
    assert all(r["mean_accepted_length"] == pytest.approx(1 + sum(r["acceptance_by_position"])) for r in sweep)
    tree_bench.main(["--run", out, "--top-k", "2", "--repeats", "1", "--requests", "4"])
    with open(os.path.join(out, "tree_vs_chain.json")) as f:
        modes = {r["mode"]: r for r in json.load(f)}
    assert set(modes) == {"autoregressive", "chain", "tree_top2"}
    assert modes["autoregressive"]["rollout_speedup"] == 1.0 and modes["tree_top2"]["nodes"] == 6
    assert modes["autoregressive"]["mean_accepted_length"] == 1.0  # one token per round, no drafts
    assert all(1.0 <= r["mean_accepted_length"] <= 1 + written["k"] for r in modes.values())  # k drafts + bonus
