"""rl_loop.run.equivalence at a tiny size: passes on the real engine, and its negative control rejects; a sample
too small to reject the control is "underpowered", on every engine."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from rl_loop.run import equivalence
from rl_loop.run.equivalence import EquivalenceConfig, check_equivalence, main, verdict
from rl_loop.run.intervals import two_sample_chi2_power
from rl_loop.step.engine import RolloutEngine
from rl_loop.step.rollouts import GenerationConfig
from rl_loop.task import CharTokenizer, TaskConfig, make_splits
from specdec_kernels.drafters import DraftModelDrafter
from specdec_kernels.models import ModelConfig, Qwen3

pytestmark = [pytest.mark.rl, pytest.mark.stat]
torch.set_num_threads(1)


@pytest.mark.parametrize("spec, verify", [("chain", "token"), ("chain", "block"), ("tree", "traversal")])
@pytest.mark.slow
def test_check_equivalence_passes_with_power_and_a_rejecting_control(spec, verify):
    torch.manual_seed(0)
    tok = CharTokenizer()
    policy = Qwen3(ModelConfig(num_hidden_layers=2, intermediate_size=96)).eval()
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.12)
    draft = copy.deepcopy(policy)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.03 * torch.randn_like(p))
    engine = RolloutEngine(policy, DraftModelDrafter(draft), tok.eos_id)
    _, val = make_splits(TaskConfig(num_train=10, num_val=4))
    cfg = EquivalenceConfig(num_prompts=4, samples_per_prompt=100, positions=4, control_temperature=2.0,
                            generation=GenerationConfig(max_new_tokens=6, k=3, max_batch=128, spec=spec,
                                                        verify=verify))
    res = check_equivalence(engine, val, tok, cfg)
    assert res["greedy_identical"] and res["law_pass"]
    # Every method must reject the planted lossy control: at this size the check has the power to.
    assert res["control_rejected"] is True, res["negative_control"]
    assert res["equivalence"] == "pass" and res["pass"] is True
    assert res["min_pvalue"] >= res["alpha_per_test"]
    assert res["temperature_control"]["rejected"] is True, res["temperature_control"]
    n = 4 * 100
    assert res["samples_per_arm"] == n
    assert res["power"]["two_sample_power"] == pytest.approx(
        two_sample_chi2_power(n, n, cfg.power_tv, res["power"]["df_bound"], cfg.alpha / len(res["pvalues"])))
    assert set(res["pvalues"]) >= {"token_at_0", "length", "reward", "sequence_logprob"}


@pytest.mark.slow
def test_module_entry_point_writes_a_report(tmp_path):
    rc = main(["--tiny", "--out", str(tmp_path), "--prompts", "2", "--samples", "6"])
    report = json.load(open(os.path.join(tmp_path, "equivalence.json")))
    assert rc == (0 if report["equivalence"] == "pass" else 1)
    # 12 samples per arm cannot reject the planted control: underpowered, not failed
    assert report["equivalence"] == "underpowered" and report["pass"] is None
    assert report["provenance"]["command"].startswith("python -m rl_loop.run.equivalence")
    assert report["provenance"]["commit"] and report["provenance"]["cpu"]
    assert report["greedy_identical"] is True


@pytest.mark.parametrize("greedy, law, control, want", [
    (True, True, True, "pass"), (True, True, False, "underpowered"), (True, True, None, "underpowered"),
    (False, True, True, "fail"), (True, False, True, "fail"), (True, False, False, "fail"),
])
def test_verdict_says_underpowered_when_the_control_is_not_rejected(greedy, law, control, want):
    assert verdict(greedy, law, control) == want


def test_the_control_runs_for_an_engine_that_cannot_plant_it():
    """An engine without our policy step (vLLM's) gets the planted control on our engine, with its own
    policy and drafter, so its verdict follows the same rule; without a drafter there is no control."""
    tok = CharTokenizer()
    policy = Qwen3(ModelConfig(num_hidden_layers=1, intermediate_size=32)).eval()
    drafter = DraftModelDrafter(copy.deepcopy(policy))

    class Served:  # the attributes VllmRolloutEngine exposes
        def __init__(self, drafter):
            self.policy, self.drafter, self.eos_id = policy, drafter, tok.eos_id

    ours = RolloutEngine(policy, drafter, tok.eos_id)
    assert equivalence._control_engine(ours) is ours
    planted = equivalence._control_engine(Served(drafter))
    assert isinstance(planted, RolloutEngine) and planted.policy is policy and planted.drafter is drafter
    assert equivalence._control_engine(Served(None)) is None
