"""One RL step: generation, log-prob recomputation, training and weight sync, synchronous or async.

- ``sync`` (colocated): every device generates, then recomputes log-probs, then trains; weights are
  resharded from the trainer to the generation engine in place (NVLink).
- ``async`` with policy lag bounded by 1: a generation pool produces step n + 1's rollouts while a
  training pool consumes step n's, so in steady state a step takes the longer of the two plus the
  exposed weight push from trainer to generators. Every rollout of a step starts from the same policy
  version, so the generation pool drains at the end of each step and its long tail stays in the step.
  Systems that refill freed slots with the next step's prompts (``async_refill``: in-flight weight
  updates or partial rollouts; the lag is then no longer uniform within a batch) never drain; their
  generation costs the steady-state throughput of full slots
  (:func:`~rl_loop.sim.generation.simulate_steady_generation`).

The async split: how many generation replicas, the rest training. By default each pipeline gets the
split an RL engineer tunes it to, the one that balances its two pools (minimum step time over whole
replicas): generation slower than training wastes the trainers, and the reverse wastes the generators.
Speculation makes generation cheaper, so its balanced pool is smaller and the freed devices train; the
step speedup is then that of the devices' total work, not the generation speedup. Kept on the
autoregressive split instead, speculation buys only the imbalance that split leaves: once generation is
faster than training, training sets the step (``async_split(setup, spec, fixed=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .generation import (
    GenerationResult,
    Parallelism,
    Speculation,
    Workload,
    simulate_generation,
    simulate_steady_generation,
)
from .hardware import Hardware
from .model import ModelSpec


def training_time(hw: Hardware, model: ModelSpec, tokens: float, gpus: int) -> float:
    """Seconds for one optimizer step over ``tokens`` tokens: 6 x active params x tokens at the
    achieved training FLOP/s (``train_mfu`` of the dense peak) of ``gpus`` devices."""
    return 6.0 * model.active_params * tokens / (gpus * hw.flops(model.dtype) * hw.train_mfu)


def logprob_time(hw: Hardware, model: ModelSpec, tokens: float, gpus: int) -> float:
    """Seconds to recompute the old policy's log-probs: one forward, 2 x active params x tokens."""
    return 2.0 * model.active_params * tokens / (gpus * hw.flops(model.dtype) * hw.logprob_mfu)


def weight_sync_time(hw: Hardware, model: ModelSpec, gen_par: Parallelism, colocated: bool) -> float:
    """Seconds to move new policy weights into the generation engine: each generation device receives its
    shard, over NVLink when colocated (resharding in place) and over the network otherwise."""
    shard = model.total_params * model.bytes_per_param / gen_par.gpus_per_replica
    if colocated:
        return hw.scaleup_latency + shard / hw.scaleup_bandwidth
    return hw.scaleout_latency + shard / hw.scaleout_bandwidth


@dataclass(frozen=True)
class StepSetup:
    """Everything one RL step needs besides the speculation settings.

    ``gen_par`` lays out generation over all ``gpus`` (sync); in async mode some of its replicas generate
    (same replica shape) and the rest of the devices train: ``async_gen_fraction`` of the devices if given,
    else the balanced split of each pipeline; ``async_refill``: the generation pool never drains (module
    docstring). ``prepare_time`` covers data loading and engine preparation, identical with and without
    speculation.
    """

    hardware: Hardware
    model: ModelSpec
    gen_par: Parallelism
    workload: Workload
    async_gen_fraction: float | None = None
    async_refill: bool = False
    prepare_time: float = 0.0

    def __post_init__(self) -> None:
        if self.async_gen_fraction is not None and not 0.0 < self.async_gen_fraction < 1.0:
            raise ValueError(f"async_gen_fraction must be in (0, 1), got {self.async_gen_fraction}")

    @property
    def gpus(self) -> int:
        return self.gen_par.gpus

    @property
    def tokens(self) -> float:
        """Tokens trained on per step: prompts + responses."""
        wl = self.workload
        return float(wl.num_responses * wl.prompt_len + wl.response_lengths().sum())

    def pools(self, gen_replicas: int) -> tuple[Parallelism, int]:
        """(generation layout, training device count) when ``gen_replicas`` replicas generate."""
        gen = replace(self.gen_par, replicas=gen_replicas)
        return gen, self.gpus - gen.gpus


@dataclass
class StepResult:
    """Seconds per phase and per step; ``generation`` keeps the generation detail."""

    mode: str
    step_time: float
    phases: dict[str, float]
    generation: GenerationResult = field(repr=False, default=None)

    @property
    def generation_fraction(self) -> float:
        return self.phases["generation"] / sum(self.phases.values())


def simulate_step(setup: StepSetup, spec: Speculation | None = None, mode: str = "sync") -> StepResult:
    """Simulate one RL step in ``mode`` ("sync" or "async"), with ``spec`` or autoregressive rollouts."""
    hw, model = setup.hardware, setup.model
    tokens = setup.tokens
    if mode == "sync":
        gen = simulate_generation(hw, model, setup.gen_par, setup.workload, spec)
        phases = {
            "prepare": setup.prepare_time,
            "weight_sync": weight_sync_time(hw, model, setup.gen_par, colocated=True),
            "generation": gen.time,
            "logprob": logprob_time(hw, model, tokens, setup.gpus),
            "training": training_time(hw, model, tokens, setup.gpus),
        }
        return StepResult("sync", sum(phases.values()), phases, gen)
    if mode == "async":
        return _async_step(setup, spec, async_split(setup, spec))
    raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")


def _async_step(setup: StepSetup, spec: Speculation | None, gen_replicas: int) -> StepResult:
    """Async step with ``gen_replicas`` generation replicas; with one replica in all there is nothing to
    split, and both phases share every device in turn (no overlap)."""
    hw, model, tokens = setup.hardware, setup.model, setup.tokens
    shared = setup.gen_par.replicas < 2
    gen_par, train_gpus = (setup.gen_par, setup.gpus) if shared else setup.pools(gen_replicas)
    simulate = simulate_steady_generation if setup.async_refill else simulate_generation
    gen = simulate(hw, model, gen_par, setup.workload, spec)
    phases = {
        "prepare": setup.prepare_time,
        "weight_sync": weight_sync_time(hw, model, gen_par, colocated=shared),
        "generation": gen.time,
        "logprob": logprob_time(hw, model, tokens, train_gpus),
        "training": training_time(hw, model, tokens, train_gpus),
    }
    trained = phases["logprob"] + phases["training"]
    overlapped = phases["generation"] + trained if shared else max(phases["generation"], trained)
    return StepResult("async", phases["prepare"] + phases["weight_sync"] + overlapped, phases, gen)


def async_split(setup: StepSetup, spec: Speculation | None, fixed: Speculation | None | bool = False) -> int:
    """Generation replicas of the async split: ``setup.async_gen_fraction`` of the devices if set, else
    the split that minimises the step time of the pipeline with ``spec`` (balanced pools); with
    ``fixed`` = a speculation setting or None (autoregressive), the split balanced for that pipeline."""
    replicas = setup.gen_par.replicas
    if replicas < 2:
        return replicas
    if setup.async_gen_fraction is not None:
        return min(replicas - 1, max(1, round(replicas * setup.async_gen_fraction)))
    tuned = spec if fixed is False else fixed
    # Generation time falls and training time rises with n: bisect for the crossing, then take the best
    # of its neighbours (the generation tail makes the curve slightly bumpy).
    lo, hi = 1, replicas - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = _async_step(setup, tuned, mid)
        if r.phases["generation"] > r.phases["logprob"] + r.phases["training"]:
            lo = mid
        else:
            hi = mid
    candidates = range(max(1, lo - 1), min(replicas - 1, hi + 1) + 1)
    return min(candidates, key=lambda n: _async_step(setup, tuned, n).step_time)


def simulate_async_fixed_split(setup: StepSetup, spec: Speculation | None) -> StepResult:
    """Async step with ``spec`` on the split balanced for autoregressive rollouts (pools not re-tuned)."""
    return _async_step(setup, spec, async_split(setup, spec, fixed=None))
