"""rl_loop's drafters are the library's (``specdec_kernels.drafters``): building one for the policy, its
distillation warm start and its online adaptation on each step's rollouts.

- ``eagle3`` (default): :class:`~specdec_kernels.drafters.Eagle3Head` on the policy's residual stream at
  the inputs of layers ``default_feature_layers(L)`` (vLLM's layout: ``--backend vllm`` serves the same
  head as vLLM's ``eagle3`` speculator), full draft vocabulary, LM head initialised from the policy's;
- ``mtp``: :class:`~specdec_kernels.drafters.MtpHead` on the policy's final hidden state, sharing its
  embedding and LM head;
- ``draft_model``: a one-layer :class:`~specdec_kernels.models.Qwen3` language model.

Both heads and the one-layer draft model run each cached draft step as one native call when the extension
is built (``Eagle3Drafter(native=False)`` keeps the torch ops; same drafts, tested). Training is the
library's :class:`~specdec_kernels.drafters.training.DrafterTrainer` (forward KL to the policy, unrolled
three steps), on the response positions only.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import torch

from specdec_kernels.drafters import (
    CachedDrafter,
    DraftModelDrafter,
    Eagle3Drafter,
    Eagle3Head,
    MtpDrafter,
    MtpHead,
)
from specdec_kernels.drafters.features import capture_target_features
from specdec_kernels.drafters.training import DrafterTrainer, TrainConfig, head_features
from specdec_kernels.models import Qwen3

from ..task import CharTokenizer, Problem
from .engine import module_device, place
from .rollouts import sft_batch

DRAFTER_INTERMEDIATE = 256  # the heads' (and the draft model's) MLP width


def build_drafter(kind: str, policy: Qwen3, seed: int = 0, native: bool | None = None, device: str = "cpu"
                  ) -> CachedDrafter:
    """A fresh, untrained drafter of ``kind`` ("eagle3", "mtp" or "draft_model") for ``policy``, its weights
    on ``device`` in the device's dtype (``engine.place``: the policy's)."""
    torch.manual_seed(seed)
    if kind == "eagle3":
        head = Eagle3Head.for_target(policy, intermediate_size=DRAFTER_INTERMEDIATE)
        return Eagle3Drafter(place(head, device), native=native)
    if kind == "mtp":
        return MtpDrafter(place(MtpHead.from_target(policy, intermediate_size=DRAFTER_INTERMEDIATE), device),
                          native=native)
    if kind == "draft_model":
        cfg = replace(policy.config, num_hidden_layers=1, intermediate_size=DRAFTER_INTERMEDIATE)
        return DraftModelDrafter(place(Qwen3(cfg), device), native=native)
    raise ValueError(f"drafter must be 'eagle3', 'mtp' or 'draft_model', got {kind!r}")


def problem_batches(problems: list[Problem], tokenizer: CharTokenizer, batch_size: int, seed: int):
    """A ``batches()`` callable over reference solutions: (ids [B, T], mask [B, T - 1]) (warm starts)."""
    rng = random.Random(seed)
    return lambda: sft_batch(rng.sample(problems, min(batch_size, len(problems))), tokenizer)


def distill_step(trainer: DrafterTrainer, policy: Qwen3, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """One drafter update on sequences ``ids`` [B, T]: the policy's logits and features there (no grad),
    matched on the positions ``mask`` [B, T - 1] marks (logits row j predicts token j + 1)."""
    head = trainer.head
    dev = module_device(policy)
    ids, mask = ids.to(dev), mask.to(dev)
    with torch.no_grad():
        cap = capture_target_features(policy, ids, head.feature_layers if hasattr(head, "fc") else None)
    lengths = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=dev)
    target_mask = torch.cat([mask, torch.zeros_like(mask[:, :1])], 1)
    return trainer.step(ids, head_features(head, cap), cap.logits, lengths, target_mask)


def warm_start(drafter: CachedDrafter, policy: Qwen3, batches, steps: int, lr: float, unroll: int) -> list[float]:
    """Distil ``drafter`` from ``policy`` for ``steps`` steps on ``batches()`` (cosine learning rate from
    ``lr`` with a 10-step warm-up); ``unroll`` extra training-time-test steps (k - 1 trains every position
    a k-token proposal uses). Returns the losses."""
    trainer = DrafterTrainer(drafter.head, TrainConfig(lr=lr, ttt_steps=unroll + 1, decay=1.0, betas=(0.9, 0.98)))
    losses = []
    for step in range(steps):
        for g in trainer.opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps)) * min(1.0, (step + 1) / 10)
        losses.append(distill_step(trainer, policy, *batches()))
    return losses


def adapter(drafter: CachedDrafter, lr: float, unroll: int) -> DrafterTrainer:
    """The trainer of online adaptation (its optimizer state lives across RL steps and checkpoints)."""
    return DrafterTrainer(drafter.head, TrainConfig(lr=lr, ttt_steps=unroll + 1, decay=1.0, betas=(0.9, 0.98)))
