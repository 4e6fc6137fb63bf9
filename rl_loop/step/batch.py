"""A step's requests and the training batch built from its rollouts."""

from __future__ import annotations

import random

import torch

from ..task import CharTokenizer, Problem, reward
from .rollouts import Rollouts


def request_seeds(run_seed: int, step: int, n: int) -> list[int]:
    """Distinct int64 Philox keys for the n requests of a step (reproducible from the run seed)."""
    rng = random.Random(f"{run_seed}/{step}")
    return [rng.getrandbits(63) for _ in range(n)]


def step_requests(run_seed: int, prompts_per_step: int, group_size: int, train: list[Problem],
                  tok: CharTokenizer, step: int) -> tuple[list[Problem], list[list[int]], list[int]]:
    """Step ``step``'s problems (``prompts_per_step`` drawn from ``train``, each repeated ``group_size``
    times), their token prompts and Philox seeds, all reproducible from the run seed."""
    rng = random.Random(f"prompts/{run_seed}/{step}")
    problems = [p for p in rng.sample(train, prompts_per_step) for _ in range(group_size)]
    prompts = [tok.encode(p.prompt, bos=True) for p in problems]
    return problems, prompts, request_seeds(run_seed, step, len(prompts))


def build_batch(
    prompts: list[list[int]], responses: list[list[int]], finished: list[bool], tok: CharTokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, T] padded prompt + response (+ EOS), mask [N, T - 1]: logits row j predicts a response token)."""
    seqs = [p + r + ([tok.eos_id] if f else []) for p, r, f in zip(prompts, responses, finished, strict=True)]
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), tok.pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), t - 1, dtype=torch.bool)
    for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(p) - 1 : len(s) - 1] = True
    return ids, mask


def score(problems: list[Problem], rollouts: Rollouts, tok: CharTokenizer) -> torch.Tensor:
    """[N] rewards of the responses (``task.reward``)."""
    return torch.tensor([reward(p, tok.decode(r), f) for p, r, f in
                         zip(problems, rollouts.response_ids, rollouts.finished, strict=True)])
