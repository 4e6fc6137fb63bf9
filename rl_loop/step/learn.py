"""The learning part of a step: score, GRPO-train the policy, adapt the drafter, weight-sync the engine."""

from __future__ import annotations

import time

import torch

from specdec_kernels.models import Qwen3

from ..config import RunConfig
from ..run.state import Session
from ..task import Problem
from . import grpo
from .batch import build_batch, score
from .drafting import distill_step
from .logprobs import kept_batch, policy_log_probs
from .rollouts import Rollouts


def policy_optimizer(policy: Qwen3, lr: float, output_gain_lr: float) -> torch.optim.AdamW:
    """AdamW over the policy in two parameter groups: every parameter but the output gain (``lr``), then the
    output gain, the final RMSNorm weight (``output_gain_lr``); :func:`set_learning_rates` sets both."""
    gain = policy.model.norm.weight
    rest = [p for p in policy.parameters() if p is not gain]
    groups = [{"params": rest, "lr": lr}, {"params": [gain], "lr": output_gain_lr}]
    return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))


def set_learning_rates(opt: torch.optim.Optimizer, rates: tuple[float, float], warmup_steps: int, step: int) -> None:
    """Step ``step``'s rates for the two groups of :func:`policy_optimizer`: ``rates`` (lr, output_gain_lr),
    both linearly warmed up over ``warmup_steps``."""
    warm = min(1.0, (step + 1) / max(warmup_steps, 1))
    for group, lr in zip(opt.param_groups, rates, strict=True):
        group["lr"] = lr * warm


def train_on_batch(
    policy: Qwen3, opt: torch.optim.Optimizer, ids: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor,
    cfg: RunConfig, ref: Qwen3 | None, behaviour: Qwen3 | None = None, kept: torch.Tensor | None = None,
) -> dict:
    """Recompute old log-probs, then ``cfg.minibatches`` clipped GRPO steps over the batch.

    ``behaviour``: the policy version that generated the rollouts when it differs from ``policy`` (async
    pipeline, lag 1); the old log-probs, hence the importance ratio, are taken under it. None: ``policy``.
    ``kept`` [N, T - 1, V] bool (``--mask-logprobs``): every log-probability (policy, old, reference) is taken
    over the recorded kept sets (``logprobs.kept_batch``).
    """
    t0 = time.perf_counter()
    dev = next(policy.parameters()).device
    ids, mask, adv = ids.to(dev), mask.to(dev), adv.to(dev)
    policy.eval()
    with torch.no_grad():
        old = policy_log_probs(policy if behaviour is None else behaviour, ids, cfg.temperature, kept)
        ref_lp = policy_log_probs(ref, ids, cfg.temperature, kept) if ref is not None and cfg.kl_coef > 0 else None
    t1 = time.perf_counter()
    policy.train()
    order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
    stats = []
    for chunk in order.chunk(cfg.minibatches):
        lp = policy_log_probs(policy, ids[chunk], cfg.temperature, None if kept is None else kept[chunk])
        out = grpo.grpo_loss(lp, old[chunk], adv[chunk], mask[chunk], cfg.clip_low, cfg.clip_high,
                             None if ref_lp is None else ref_lp[chunk], cfg.kl_coef)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        stats.append([out.loss.item(), out.clip_fraction.item(), out.mean_ratio.item(), out.kl.item(),
                      grad_norm.item()])
    policy.eval()
    mean = [sum(s[i] for s in stats) / len(stats) for i in range(5)]
    return {"loss": mean[0], "clip_fraction": mean[1], "ratio": mean[2], "kl": mean[3], "grad_norm": mean[4],
            "logprob_s": t1 - t0, "train_s": time.perf_counter() - t1}


def adapt_drafter(s: Session, step: int, prompts: list[list[int]], rollouts: Rollouts) -> float | None:
    """Online adaptation every ``drafter_adapt_every`` steps: ``drafter_adapt_steps`` updates of the drafter
    toward the (new) policy on the step's rollouts. Returns the last loss (None when not adapted)."""
    cfg = s.cfg
    if s.drafter_trainer is None or cfg.drafter_adapt_steps <= 0 or step % cfg.drafter_adapt_every:
        return None
    ids, mask = build_batch(prompts, rollouts.response_ids, rollouts.finished, s.tok)
    s.drafter_trainer.sync(s.policy, step + 1)  # shared weights (embedding) of the new policy first
    loss = None
    for _ in range(cfg.drafter_adapt_steps):
        loss = distill_step(s.drafter_trainer, s.policy, ids, mask)
    return loss


def learn(s: Session, step: int, problems: list[Problem], prompts: list[list[int]], rollouts: Rollouts, row: dict,
          behaviour: Qwen3 | None = None) -> None:
    """Score, GRPO-train on ``rollouts``, adapt the drafter, then weight-sync the engine (policy and drafter,
    versioned together as ``step + 1``); fills ``row``. ``behaviour``: see :func:`train_on_batch`."""
    cfg, tok, policy = s.cfg, s.tok, s.policy
    rewards = score(problems, rollouts, tok)
    adv = grpo.group_advantages(rewards, cfg.group_size, scale=cfg.scale_advantages)
    keep = (grpo.dynamic_sampling_mask(rewards, cfg.group_size) if cfg.dynamic_sampling
            else torch.ones_like(rewards, dtype=torch.bool))
    row.update(reward_mean=rewards.mean().item(), accuracy=(rewards == 1.0).float().mean().item(),
               kept_fraction=keep.float().mean().item(),
               response_length=sum(map(len, rollouts.response_ids)) / len(prompts),
               truncated=1.0 - sum(rollouts.finished) / len(prompts))
    train_stats = {"loss": 0.0, "clip_fraction": 0.0, "ratio": 1.0, "kl": 0.0, "grad_norm": 0.0, "logprob_s": 0.0,
                   "train_s": 0.0}
    if keep.any():
        idx = keep.nonzero().squeeze(1).tolist()
        ids, mask = build_batch([prompts[i] for i in idx], [rollouts.response_ids[i] for i in idx],
                                [rollouts.finished[i] for i in idx], tok)
        kept = None
        if cfg.mask_logprobs:
            if rollouts.masks is None:
                raise ValueError("--mask-logprobs needs rollouts recorded with their sampling masks (--record-mask)")
            kept = kept_batch([prompts[i] for i in idx], [rollouts.masks[i] for i in idx], mask.shape[1],
                              policy.config.vocab_size)
        set_learning_rates(s.opt, (cfg.lr, cfg.output_gain_lr), cfg.lr_warmup_steps, step)
        train_stats = train_on_batch(policy, s.opt, ids, mask, adv[keep], cfg, s.ref, behaviour, kept)
    row.update(train_stats, output_gain=policy.model.norm.weight.mean().item())  # the policy's sharpness
    t0 = time.perf_counter()
    loss = adapt_drafter(s, step, prompts, rollouts)
    if loss is not None:
        row["drafter_loss"] = loss
    s.engine.sync(step + 1)  # weight sync: the engine serves the new policy and drafter
    row["sync_adapt_s"] = time.perf_counter() - t0
