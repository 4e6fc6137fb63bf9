"""rl_loop --pipeline async: Ray generator actor, versioned weight sync, policy lag <= 1, old log-probs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from rl_loop.config import REQUIRED_SUMMARY_KEYS, tiny_config
from rl_loop.pipelines.async_pipeline import GeneratorActor, check_async_config
from rl_loop.step import learn
from rl_loop.step.drafting import build_drafter
from rl_loop.step.engine import RolloutEngine
from rl_loop.step.learn import policy_log_probs, train_on_batch
from rl_loop.step.rollouts import GenerationConfig, build_batch
from rl_loop.task import CharTokenizer
from rl_loop.train import run
from specdec_kernels.models import ModelConfig, Qwen3

# Each async run starts a local Ray: one at a time under pytest-xdist (--dist loadgroup).
pytestmark = [pytest.mark.rl, pytest.mark.xdist_group("ray")]
torch.set_num_threads(1)
CFG = ModelConfig(num_hidden_layers=3, intermediate_size=96)


def _rows(path) -> list[dict]:
    return [r for r in map(json.loads, open(path)) if "event" not in r]


@pytest.mark.slow
def test_tiny_async_run_writes_summary_with_lag_at_most_one(tmp_path):
    summary = run(tiny_config(out=str(tmp_path / "async"), steps=2, pipeline="async"))
    for key in REQUIRED_SUMMARY_KEYS:
        assert key in summary, key
    assert summary["pipeline"] == "async"
    eq = json.load(open(tmp_path / "async" / "equivalence.json"))
    assert eq["greedy_identical"] and eq["law_pass"]
    # a tiny run is too small to reject the planted lossy control: underpowered, not failed
    assert summary["equivalence"] == eq["equivalence"] == ("pass" if eq["control_rejected"] else "underpowered")
    assert summary["equivalence_pass"] is (True if eq["control_rejected"] else None)
    assert summary["policy_lags"] == [0, 1] and summary["max_policy_lag"] == 1
    assert summary["async_step_speedup"] == pytest.approx(summary["sync_step_s"] / summary["async_step_s"])
    assert summary["mean_accepted_length"] == pytest.approx(1 + sum(summary["acceptance_by_position"]))
    on_disk = json.load(open(tmp_path / "async" / "summary.json"))
    assert on_disk["pipeline"] == "async" and on_disk["max_policy_lag"] == 1
    rows = _rows(tmp_path / "async" / "metrics.jsonl")
    assert [(r["step"], r["policy_version"], r["rollout_version"], r["policy_lag"]) for r in rows] == [
        (0, 0, 0, 0), (1, 1, 0, 1)]
    # Step 0 runs on the actor with the same weights, requests, seeds and drafter as the sync loop's step 0.
    run(tiny_config(out=str(tmp_path / "sync"), steps=1, equivalence=False))
    sync0 = _rows(tmp_path / "sync" / "metrics.jsonl")[0]
    for key in ("gen_tokens", "reward_mean", "response_length", "acceptance_by_position", "loss"):
        assert rows[0][key] == sync0[key], key


@pytest.mark.parametrize("overrides, flag", [
    ({"backend": "vllm"}, "--backend vllm"),
    ({"backend": "vllm", "spec": "none"}, "--backend vllm"),
])
def test_unsupported_async_combinations_raise(tmp_path, overrides, flag):
    cfg = replace(tiny_config(out=str(tmp_path)), pipeline="async", **overrides)
    with pytest.raises(ValueError, match=flag):
        run(cfg)
    with pytest.raises(ValueError, match="pipeline"):
        check_async_config(cfg)
    with pytest.raises(ValueError, match="--pipeline async"):
        check_async_config(tiny_config(out=str(tmp_path)))
    assert not (tmp_path / "metrics.jsonl").exists()  # rejected before any work


@pytest.mark.slow
def test_generator_actor_weight_push_matches_a_fresh_engine():
    torch.manual_seed(0)
    policy = Qwen3(CFG).eval()
    drafter = build_drafter("eagle3", policy, 0)
    eos = CharTokenizer().eos_id
    actor = GeneratorActor((policy, drafter), eos_id=eos)
    prompts, seeds = [[1, 5, 6, 7], [1, 9, 8]], [11, 12]
    gen = GenerationConfig(max_new_tokens=8, spec="chain", k=2, temperature=0.0, max_batch=4, backend="reference")
    before = actor.generate(prompts, seeds, gen, compare=False)[1].response_ids
    new = Qwen3(CFG).eval()  # different weights, pushed as version 3
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert actor.load_weights(3, new.state_dict(), drafter.trainable().state_dict()) == 3
    version, rollouts, ar = actor.generate(prompts, seeds, gen, compare=True)
    expected = RolloutEngine(new, None, eos).generate(prompts, seeds, replace(gen, spec="none")).response_ids
    assert version == 3 and rollouts.response_ids == expected and ar is not None
    assert before != expected  # the push changed the output, so the check has teeth


@pytest.mark.slow
def test_old_log_probs_come_from_the_behaviour_policy():
    torch.manual_seed(1)
    policy, behaviour = Qwen3(CFG).eval(), Qwen3(CFG).eval()
    ids, mask = build_batch([[1, 5, 6], [1, 7]], [[8, 9, 10], [11]], [True, False], CharTokenizer())
    adv = torch.tensor([1.0, -1.0])
    cfg = replace(tiny_config(), minibatches=1, temperature=0.7)
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)  # no update: the ratio is pi / pi_old exactly
    with torch.no_grad():
        lp = policy_log_probs(policy, ids, 0.7)
        lp_b = policy_log_probs(behaviour, ids, 0.7)
    expected = learn.grpo_loss(lp, lp_b, adv, mask, cfg.clip_low, cfg.clip_high).mean_ratio.item()
    lagged = train_on_batch(policy, opt, ids, mask, adv, cfg, None, behaviour=behaviour)
    on_policy = train_on_batch(policy, opt, ids, mask, adv, cfg, None)
    assert on_policy["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert lagged["ratio"] == pytest.approx(expected, rel=1e-5) and abs(expected - 1.0) > 1e-3
