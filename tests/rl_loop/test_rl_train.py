"""rl_loop.step.learn optimisation pieces: the policy optimizer's parameter groups and their learning rates."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rl_loop.config import tiny_config
from rl_loop.step.learn import policy_optimizer, set_learning_rates, train_on_batch
from rl_loop.step.rollouts import build_batch
from rl_loop.task import CharTokenizer
from specdec_kernels.models import ModelConfig, Qwen3

pytestmark = pytest.mark.rl
torch.set_num_threads(1)
CFG = ModelConfig(num_hidden_layers=2, intermediate_size=64)


@pytest.mark.slow
def test_output_gain_learns_at_its_own_warmed_up_rate():
    torch.manual_seed(0)
    policy = Qwen3(CFG).eval()
    cfg = replace(tiny_config(), lr=1e-5, output_gain_lr=4e-3, lr_warmup_steps=4, minibatches=1)
    opt = policy_optimizer(policy, cfg.lr, cfg.output_gain_lr)
    gain = policy.model.norm.weight
    grouped = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in policy.parameters())  # every parameter, once
    assert [id(p) for p in opt.param_groups[1]["params"]] == [id(gain)]

    set_learning_rates(opt, (cfg.lr, cfg.output_gain_lr), cfg.lr_warmup_steps, 0)  # first of 4 warm-up steps
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-5 / 4, 4e-3 / 4])
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    ids, mask = build_batch([[1, 5, 6], [1, 7]], [[8, 9, 10], [11]], [True, False], CharTokenizer())
    train_on_batch(policy, opt, ids, mask, torch.tensor([1.0, -1.0]), cfg, None)
    moved = {name: (p.detach() - before[name]).abs().max().item() for name, p in policy.named_parameters()}
    # Adam's first step moves each coordinate by ~its rate: the gain ~1e-3, nothing else more than ~2.5e-6
    assert moved["model.norm.weight"] == pytest.approx(1e-3, rel=0.05)
    assert max(v for name, v in moved.items() if name != "model.norm.weight") < 3e-6

    set_learning_rates(opt, (cfg.lr, cfg.output_gain_lr), cfg.lr_warmup_steps, 10)  # past the warm-up: the configured rates
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-5, 4e-3])
