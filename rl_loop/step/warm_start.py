"""The policy: the library's Qwen3 (``specdec_kernels.models``, parameter names and ``save_pretrained``
layout of ``transformers.Qwen3ForCausalLM``) and its supervised warm start on the task's reference
solutions, so that RL starts with non-zero rewards."""

from __future__ import annotations

import math
import random
import time

import torch
import torch.nn.functional as F

from specdec_kernels.models import Qwen3

from ..task import CharTokenizer, Problem


def sft_batch(
    problems: list[Problem], tokenizer: CharTokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, T], target mask [B, T - 1]) for BOS + prompt + solution + EOS, loss on the response."""
    seqs, starts = [], []
    for p in problems:
        prompt = tokenizer.encode(p.prompt, bos=True)
        seqs.append(prompt + tokenizer.encode(p.solution) + [tokenizer.eos_id])
        starts.append(len(prompt))
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), t - 1, dtype=torch.bool)
    for i, (s, st) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, st - 1 : len(s) - 1] = True
    return ids, mask


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
