"""The typed state of a run: what a step changes (:class:`RunState`), the objects it works with
(:class:`Session`), and the checkpoint that holds both, with resuming from it.

Resuming from ``OUT/checkpoint.pt``: the checkpoint is read and matched against the run asked for before
any work (:func:`read_checkpoint`, from ``checks.check_run``), and ``OUT/metrics.jsonl`` is cut back to
what it held when the checkpoint was written (:func:`cut_metrics`, from ``session.open_run``), so that no
step is logged twice after a kill. ``session.setup`` only loads the weights (:func:`load_checkpoint_file`):
the benchmarks load a finished or running run's checkpoint through it and change neither.

Checkpoint formats: 2 (this one) adds ``format``, ``metrics_bytes`` (the log's size at the checkpoint) and
``finished`` (written by the end of a run) to format 1 (the typed run state, which still loads: its log is
cut back by step). The flat checkpoints from before the typed run state (a top-level ``step``) hold other
weight names and state and are refused."""

from __future__ import annotations

import json
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
from .usage import UsageError


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
    test_start: dict | None = None  # held-out test correctness at the start (``session.evaluate_test``)
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
    test: list[Problem] = field(default_factory=list)  # held-out test split (``session.py``)


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
    """The checkpoint in ``out`` when resuming (:func:`load_checkpoint_file`: a missing or damaged one is an
    error), else None."""
    return load_checkpoint_file(out) if resume else None


CHECKPOINT_FORMAT = 2
REQUIRED_KEYS = frozenset({"state", "config", "policy", "opt", "drafter", "drafter_opt", "ref"})
# RunConfig fields a resumed run may change: where and how far it runs and what it reports at the end. Every
# other field (seed, k, temperature, spec, drafter, the models, the data, the optimisation, the threads, which
# set the float reduction order) shapes the trajectory, and a resume must continue the same one.
RESUMABLE = frozenset({"out", "steps", "resume", "verify_backend", "checkpoint_every", "equivalence",
                       "equivalence_prompts", "equivalence_samples", "plots", "progress", "dump_rollouts"})
# Trajectory fields added since checkpoints were first written, with the value every earlier run had.
ADDED_FIELDS = {"verify": "token", "top_k": 0, "top_p": 1.0}


def checkpoint_path(out: str) -> str:
    """The checkpoint of the run writing into ``out``."""
    return os.path.join(out, "checkpoint.pt")


def metrics_path(out: str) -> str:
    return os.path.join(out, "metrics.jsonl")


def _differences(asked: dict, saved: dict, prefix: str = "") -> list[str]:
    """``name (checkpoint X, asked Y)`` for every field both hold with different values (nested configs by
    their inner names); a field the checkpoint lacks (added since) is not compared."""
    out = []
    for name, value in asked.items():
        if prefix == "" and name in RESUMABLE or name not in saved:
            continue
        old = saved[name]
        if isinstance(value, dict) and isinstance(old, dict):
            out += _differences(value, old, f"{prefix}{name}.")
        elif value != old and not (isinstance(old, (list, tuple)) and list(old) == list(value or ())):
            out.append(f"{prefix}{name} (checkpoint {old!r}, asked {value!r})")
    return out


def load_checkpoint_file(out: str) -> dict:
    """``out/checkpoint.pt`` in a format this rl_loop reads; a :class:`UsageError` (one line) when there is
    none, it cannot be read, or its format is not one this rl_loop resumes."""
    path = checkpoint_path(out)
    if not os.path.isfile(path):
        cut = (" (only checkpoint.pt.tmp is there: the run was killed while writing its first checkpoint)"
               if os.path.exists(path + ".tmp") else "")
        raise UsageError(f"--resume: there is no checkpoint {path}{cut}; run without --resume to start afresh")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)  # the run's own file (optimizer states)
    except Exception as e:  # torch.load raises pickle, zip and runtime errors of every kind for a damaged file
        reason = (str(e).strip().splitlines() or [""])[0][:160]
        raise UsageError(f"--resume: {path} cannot be read, it is damaged or not a checkpoint "
                         f"({type(e).__name__}: {reason})") from e
    if not isinstance(ckpt, dict):
        raise UsageError(f"--resume: {path} holds a {type(ckpt).__name__}, not an rl_loop checkpoint")
    if "state" not in ckpt and "step" in ckpt:
        raise UsageError(f"--resume: {path} was written by an earlier rl_loop (before the typed run state) and "
                         "cannot be resumed; start a fresh run in another --out")
    fmt = ckpt.get("format", 1)
    if not isinstance(fmt, int) or fmt > CHECKPOINT_FORMAT or not REQUIRED_KEYS <= ckpt.keys():
        raise UsageError(f"--resume: {path} has checkpoint format {fmt!r} with keys {sorted(ckpt)}; this rl_loop "
                         f"resumes formats 1-{CHECKPOINT_FORMAT}")
    return ckpt


def read_checkpoint(cfg: RunConfig) -> dict:
    """``OUT/checkpoint.pt`` (:func:`load_checkpoint_file`), checked to continue the run ``cfg`` asks for: a
    :class:`UsageError` (one line) when its trajectory fields differ from ``cfg``'s (named) or it already holds
    ``cfg.steps`` steps."""
    ckpt = load_checkpoint_file(cfg.out)
    diff = _differences(asdict(cfg), {**ADDED_FIELDS, **ckpt["config"]})
    if diff:
        raise UsageError(f"--resume: the run asked for differs from the checkpoint's in {'; '.join(diff)}")
    step = ckpt["state"]["step"]
    finished = ckpt.get("finished", step >= ckpt["config"].get("steps", step))
    if finished and cfg.steps <= step:
        raise UsageError(f"--resume: {cfg.out} holds a finished run of {step} steps; pass --steps > {step} to "
                         "train it further")
    if cfg.steps < step:
        raise UsageError(f"--resume: the checkpoint is at step {step}, past --steps {cfg.steps}")
    return ckpt


def _before(line: str, step: int) -> bool:
    """A format-1 log line to keep: events before the checkpoint's step (and the start evaluation)."""
    try:
        row = json.loads(line)
    except ValueError:  # a line cut off by the kill
        return False
    return "step" not in row or row["step"] < step or (row.get("event") == "eval" and row["step"] == 0)


def cut_metrics(out: str, ckpt: dict) -> None:
    """Cut ``out/metrics.jsonl`` back to the rows it held when ``ckpt`` was written, and ``out/rollouts.jsonl``
    (``--dump-rollouts``) to the steps before the checkpoint's."""
    step = ckpt["state"]["step"]
    dump = os.path.join(out, "rollouts.jsonl")
    if os.path.exists(dump):
        with open(dump) as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        with open(dump, "w") as f:
            f.writelines(line + "\n" for line in lines if _before(line, step) and "step" in json.loads(line))
    path = metrics_path(out)
    if not os.path.exists(path):
        return
    size = ckpt.get("metrics_bytes")
    if size is not None:
        if os.path.getsize(path) > size:
            os.truncate(path, size)
        return
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    with open(path, "w") as f:
        f.writelines(line + "\n" for line in lines if _before(line, step))
