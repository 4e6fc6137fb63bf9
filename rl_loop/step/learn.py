"""The learning part of a step: score, GRPO-train the policy, adapt the drafter, weight-sync the
engine; and the policy's supervised warm start on the task's reference solutions (so that RL starts with
non-zero rewards).

GRPO as pure functions: group-normalised advantages, dynamic sampling, clipped token-level loss, k3 KL.
Shapes: ``N`` responses in groups of ``G`` consecutive rows (the G samples of one prompt); token tensors are
``[N, T]`` over response positions with a bool ``mask`` marking real (non-padding) tokens. Log-probabilities
of sequences under the policy are the trainer's side of GRPO."""

from __future__ import annotations

import math
import random
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specdec_kernels.models import Qwen3

from ..config import RunConfig
from ..run.state import Session
from ..task import CharTokenizer, Problem
from .drafting import distill_step
from .rollouts import RolloutMask, Rollouts, build_batch, score, sft_batch


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
    over the recorded kept sets (:func:`kept_batch`).
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
        out = grpo_loss(lp, old[chunk], adv[chunk], mask[chunk], cfg.clip_low, cfg.clip_high,
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
    adv = group_advantages(rewards, cfg.group_size, scale=cfg.scale_advantages)
    keep = (dynamic_sampling_mask(rewards, cfg.group_size) if cfg.dynamic_sampling
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


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """[N] advantages ``(r - mean_group) / (std_group + eps)`` (``scale=False``: mean-centred only).

    ``std`` is the population standard deviation of the group; a group whose rewards are all equal gets
    zero advantages (and is dropped by :func:`dynamic_sampling_mask`).
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)
    centred = r - r.mean(1, keepdim=True)
    if scale:
        centred = centred / (r.std(1, unbiased=False, keepdim=True) + eps)
    return centred.view(-1)


def dynamic_sampling_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] bool: True for responses whose group has at least two distinct rewards (DAPO dynamic sampling)."""
    r = rewards.view(-1, group_size)
    keep = (r != r[:, :1]).any(1)
    return keep.repeat_interleave(group_size)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, kept: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] log-probability of ``targets`` [B, T] under ``logits`` [B, T, V] (float32).

    ``kept`` [B, T, V] bool: the log-softmax is restricted to it (logits outside set to -inf), i.e. the
    log-probability under the truncated distribution the token was sampled from (top-k / top-p); it equals the
    full one minus the log of the kept mass, and is the full one where everything is kept.
    """
    z = logits.float()
    if kept is not None:
        z = z.masked_fill(~kept, float("-inf"))
    return torch.log_softmax(z, -1).gather(-1, targets[..., None]).squeeze(-1)


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): ``exp(ref - lp) - (ref - lp) - 1`` (>= 0, unbiased)."""
    d = ref_log_probs - log_probs
    return torch.exp(d) - d - 1


class LossOutput(NamedTuple):
    loss: torch.Tensor  # scalar
    clip_fraction: torch.Tensor  # fraction of tokens whose ratio was clipped
    mean_ratio: torch.Tensor
    kl: torch.Tensor  # mean k3 KL (0 without a reference)


def grpo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossOutput:
    """Clipped-ratio policy loss averaged over every real token of the batch (token-level, DAPO style).

    ``ratio = exp(lp - old_lp)`` is clipped to ``[1 - clip_low, 1 + clip_high]`` (clip-higher: a wider
    upper range keeps exploration alive); per token ``-min(ratio * A, clip(ratio) * A)``, plus
    ``kl_coef * k3`` when ``ref_log_probs`` is given. Inputs: ``log_probs``, ``old_log_probs``,
    ``ref_log_probs``, ``mask`` [N, T]; ``advantages`` [N] (broadcast over tokens).
    """
    if log_probs.shape != old_log_probs.shape or log_probs.shape != mask.shape:
        raise ValueError("log_probs, old_log_probs and mask must have the same shape")
    if clip_low < 0 or clip_high < 0:
        raise ValueError("clip_low and clip_high must be >= 0")
    m = mask.float()
    denom = m.sum().clamp(min=1.0)
    ratio = torch.exp(log_probs - old_log_probs)
    adv = advantages[:, None].float()
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    kl = torch.zeros((), dtype=log_probs.dtype)
    if ref_log_probs is not None:
        kl_tok = k3_kl(log_probs, ref_log_probs)
        kl = (kl_tok * m).sum() / denom
        per_token = per_token + kl_coef * kl_tok
    loss = (per_token * m).sum() / denom
    with torch.no_grad():
        was_clipped = ((ratio * adv) > (clipped * adv)).float()
        clip_fraction = (was_clipped * m).sum() / denom
        mean_ratio = (ratio * m).sum() / denom
    return LossOutput(loss, clip_fraction, mean_ratio, kl.detach())


def policy_log_probs(policy: Qwen3, ids: torch.Tensor, temperature: float = 1.0,
                     kept: torch.Tensor | None = None) -> torch.Tensor:
    """[N, T - 1] log-probability of each next token under the policy at ``temperature`` (> 0).

    The trainer scores rollouts under the same tempered distribution they were sampled from, so the
    GRPO ratio is on-policy for the rollout temperature. ``kept`` [N, T - 1, V] bool (:func:`kept_batch`):
    restrict each row's log-softmax to the ids the sampler kept there (``--mask-logprobs``). On the policy's
    device (``ids`` moved there).
    """
    ids = ids.to(next(policy.parameters()).device)
    logits, _ = policy(ids)
    return token_log_probs(logits[:, :-1] / temperature, ids[:, 1:], kept)


def kept_batch(prompts: list[list[int]], masks: list[RolloutMask], width: int, vocab_size: int) -> torch.Tensor:
    """[N, width, V] bool kept sets laid out as ``rollouts.build_batch``'s mask [N, width]: row ``len(prompt) - 1 + t``
    (whose logits predict response token t, then the EOS) keeps ``masks[i]``'s token t; every other row keeps
    the whole vocabulary (the loss mask drops those rows)."""
    kept = torch.ones(len(prompts), width, vocab_size, dtype=torch.bool)
    for i, (prompt, mask) in enumerate(zip(prompts, masks, strict=True)):
        n = mask.indptr.numel() - 1
        rows = torch.repeat_interleave(torch.arange(n) + len(prompt) - 1, mask.indptr.diff())
        kept[i, len(prompt) - 1:len(prompt) - 1 + n] = False
        kept[i, rows, mask.indices.long()] = True
    return kept


def supervised_warm_start(
    model: Qwen3,
    problems: list[Problem],
    tokenizer: CharTokenizer,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    time_limit_s: float | None = None,
) -> list[float]:
    """Next-token cross-entropy on reference solutions (cosine LR), so RL starts with non-zero rewards.

    Stops after ``steps`` or ``time_limit_s`` seconds, whichever comes first. Returns the loss curve.
    """
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    losses: list[float] = []
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps)) * min(1.0, (step + 1) / 20)
        ids, mask = (t.to(device) for t in sft_batch(rng.sample(problems, min(batch_size, len(problems))),
                                                      tokenizer))
        logits, _ = model(ids)
        loss = F.cross_entropy(logits[:, :-1][mask], ids[:, 1:][mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
            break
    model.eval()
    return losses
