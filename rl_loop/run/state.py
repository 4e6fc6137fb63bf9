"""The typed state of a run: what a step changes (:class:`RunState`), the objects it works with
(:class:`Session`) and the checkpoint that holds both."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from specdec_kernels.drafters import CachedDrafter
from specdec_kernels.drafters.training import DrafterTrainer
from specdec_kernels.models import Qwen3

from ..config import RunConfig
from ..step.rollouts import GenerationConfig, Rollouts, RolloutStats
from ..task import CharTokenizer, Problem
from .resume import CHECKPOINT_FORMAT, checkpoint_path, load_checkpoint_file, metrics_path


class Engine(Protocol):
    """What the loop needs of a rollout engine (ours: ``engine.RolloutEngine``; ``vllm_backend``'s)."""

    policy: Qwen3
    version: int  # the weights version served (tagged by ``sync``)

    def generate(self, prompts: list[list[int]], seeds: list[int], config: GenerationConfig) -> Rollouts: ...

    def sync(self, version: int | None = None) -> None: ...

    def summary(self) -> dict: ...


@dataclass
class Comparison:
    """Running totals over the steps that also generated their requests autoregressively, side by side."""

    spec_tokens: int = 0
    spec_s: float = 0.0
    ar_tokens: int = 0
    ar_s: float = 0.0
    spec_step_s: float = 0.0  # generation + log-probs + training of the compared steps, speculative rollouts
    ar_step_s: float = 0.0  # the same with the autoregressive rollouts' generation time
    adapt_s: float = 0.0  # weight sync + drafter adaptation over every step (amortised into spec steps)
    steps: int = 0
    compared: int = 0
    # one row per compared step: [spec_tokens, spec_s, ar_tokens, ar_s, spec_step_s, ar_step_s, ar_first]
    per_step: list[list[float]] = field(default_factory=list)

    @property
    def spec_tokens_per_s(self) -> float | None:
        return self.spec_tokens / self.spec_s if self.spec_s > 0 else None

    @property
    def ar_tokens_per_s(self) -> float | None:
        return self.ar_tokens / self.ar_s if self.ar_s > 0 else None

    @property
    def rollout_speedup(self) -> float | None:
        if self.spec_s > 0 and self.ar_s > 0:
            return self.spec_tokens_per_s / self.ar_tokens_per_s
        return None

    @property
    def step_speedup(self) -> float | None:
        """AR step time over speculative step time (which also pays the sync and adaptation)."""
        if self.spec_step_s <= 0:
            return None
        return self.ar_step_s / (self.spec_step_s + self.compared * self.adapt_s / max(self.steps, 1))


@dataclass
class WarmStartTimes:
    warm_start_s: float | None = None
    drafter_warm_s: float | None = None


@dataclass
class RunState:
    """What the steps of a run change, checkpointed with the weights."""

    step: int = 0
    val_accuracy_start: float | None = None
    val_greedy_accuracy_start: float | None = None
    spec_stats: RolloutStats = field(default_factory=RolloutStats)
    comparison: Comparison = field(default_factory=Comparison)
    times: WarmStartTimes = field(default_factory=WarmStartTimes)
    test_start: dict | None = None  # held-out test correctness at the start (``heldout.evaluate_test``)
    last_acceptance: list[float] | None = None  # the last step's acceptance by position (collapse warning)

    @staticmethod
    def from_dict(d: dict) -> RunState:
        return RunState(step=d["step"], val_accuracy_start=d["val_accuracy_start"],
                        val_greedy_accuracy_start=d["val_greedy_accuracy_start"],
                        spec_stats=RolloutStats(**d["spec_stats"]), comparison=Comparison(**d["comparison"]),
                        times=WarmStartTimes(**d["times"]), test_start=d.get("test_start"),
                        last_acceptance=d.get("last_acceptance"))


@dataclass
class Session:
    """The objects of one run: data, models, the rollout engine, optimizers, state and the metrics log."""

    cfg: RunConfig
    tok: CharTokenizer
    train: list[Problem]
    val: list[Problem]
    policy: Qwen3
    drafter: CachedDrafter | None
    engine: Engine
    opt: torch.optim.Optimizer
    drafter_trainer: DrafterTrainer | None
    ref: Qwen3 | None
    state: RunState
    log: Callable[[dict], None]
    test: list[Problem] = field(default_factory=list)  # held-out test split (``heldout.py``)


def save_checkpoint(s: Session, finished: bool = False) -> None:
    """Weights, optimizer states, the run state, the config and the size of ``metrics.jsonl`` (what a resume
    cuts it back to), written atomically to ``OUT/checkpoint.pt``; ``finished`` by the end of a run."""
    log = metrics_path(s.cfg.out)
    ckpt = {
        "format": CHECKPOINT_FORMAT, "finished": finished,
        "metrics_bytes": os.path.getsize(log) if os.path.exists(log) else 0,
        "state": asdict(s.state), "config": asdict(s.cfg),
        "policy": s.policy.state_dict(), "opt": s.opt.state_dict(),
        "drafter": None if s.drafter is None else s.drafter.trainable().state_dict(),
        "drafter_opt": None if s.drafter_trainer is None else s.drafter_trainer.opt.state_dict(),
        "ref": None if s.ref is None else s.ref.state_dict(),
    }
    tmp = checkpoint_path(s.cfg.out) + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, checkpoint_path(s.cfg.out))


def load_checkpoint(out: str, resume: bool) -> dict | None:
    """The checkpoint in ``out`` when resuming (``resume.load_checkpoint_file``: a missing or damaged one is an
    error), else None."""
    return load_checkpoint_file(out) if resume else None
