"""rl_loop.step.learn's GRPO functions: advantages, dynamic sampling, clipped token-level loss, k3 KL."""

from __future__ import annotations

import pytest
import torch

from rl_loop.step import learn

pytestmark = pytest.mark.rl
torch.set_num_threads(1)  # tiny shapes: extra threads only add synchronisation overhead


def test_group_advantages_normalise_within_groups():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.1, 0.1, 0.1, 0.1])
    adv = learn.group_advantages(r, 4)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-4)
    assert torch.equal(adv[4:], torch.zeros(4))  # all-equal group: no signal
    centred = learn.group_advantages(r, 4, scale=False)
    assert torch.allclose(centred[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    with pytest.raises(ValueError, match="group_size"):
        learn.group_advantages(r[:7], 4)


def test_dynamic_sampling_drops_all_equal_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 0.1, 0.1, 0.1, 0.0, 1.0])
    keep = learn.dynamic_sampling_mask(r, 2)
    assert keep.tolist() == [False, False, True, True, False, False, True, True]


def test_loss_at_ratio_one_is_minus_mean_token_advantage():
    lp = torch.log(torch.rand(3, 5))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0, 0.5])
    out = learn.grpo_loss(lp, lp.clone(), adv, mask)
    # token-level: every real token weighs the same (9 tokens), not every sequence
    expected = -(3 * 1.0 + 5 * -2.0 + 1 * 0.5) / 9
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.clip_fraction.item() == 0.0 and out.mean_ratio.item() == pytest.approx(1.0)


def test_clip_higher_is_asymmetric_and_gradients_vanish_outside_the_trust_region():
    old = torch.zeros(1, 4)
    log_ratio = torch.log(torch.tensor([[0.5, 0.9, 1.25, 1.5]]))
    mask = torch.ones(1, 4, dtype=torch.bool)
    for sign in (1.0, -1.0):
        lp = (old + log_ratio).requires_grad_(True)
        out = learn.grpo_loss(lp, old, torch.tensor([sign]), mask, clip_low=0.2, clip_high=0.28)
        out.loss.backward()
        grad_zero = (lp.grad == 0).squeeze(0).tolist()
        if sign > 0:  # positive advantage: ratios above 1 + 0.28 are clipped (1.25 is inside: clip-higher)
            assert grad_zero == [False, False, False, True]
        else:  # negative advantage: ratios below 1 - 0.2 are clipped
            assert grad_zero == [True, False, False, False]
        assert out.clip_fraction.item() == pytest.approx(0.25)


def test_k3_kl_is_nonnegative_zero_at_equality_and_added_to_the_loss():
    lp = torch.log(torch.rand(4, 6))
    ref = torch.log(torch.rand(4, 6))
    kl = learn.k3_kl(lp, ref)
    assert (kl >= 0).all() and torch.equal(learn.k3_kl(lp, lp), torch.zeros_like(lp))
    mask = torch.ones(4, 6, dtype=torch.bool)
    adv = torch.zeros(4)
    out = learn.grpo_loss(lp, lp, adv, mask, ref_log_probs=ref, kl_coef=0.5)
    assert out.loss.item() == pytest.approx(0.5 * kl.mean().item(), rel=1e-5)
    assert out.kl.item() == pytest.approx(kl.mean().item(), rel=1e-5)


def test_token_log_probs_gathers_targets():
    logits = torch.randn(2, 3, 7)
    targets = torch.randint(0, 7, (2, 3))
    lp = learn.token_log_probs(logits, targets)
    assert torch.allclose(lp.exp().sum(), torch.softmax(logits, -1).gather(-1, targets[..., None]).sum())
