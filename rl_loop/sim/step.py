"""One RL step: generation, log-prob recomputation, training and weight sync, synchronous or async.

- ``sync`` (colocated): every device generates, then recomputes log-probs, then trains; weights are
  resharded from the trainer to the generation engine in place (NVLink).
- ``async`` with policy lag bounded by 1: a generation pool produces step n + 1's rollouts while a
  training pool consumes step n's, so in steady state a step takes the longer of the two plus the
  exposed weight push from trainer to generators.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .generation import GenerationResult, Parallelism, Speculation, Workload, simulate_generation
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

    ``gen_par`` lays out generation over all ``gpus`` (sync); in async mode ``async_gen_fraction`` of the
    devices generate (same replica shape, fewer replicas) and the rest train. ``prepare_time`` covers data
    loading and engine preparation, identical with and without speculation.
    """

    hardware: Hardware
    model: ModelSpec
    gen_par: Parallelism
    workload: Workload
    async_gen_fraction: float = 0.5
    prepare_time: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.async_gen_fraction < 1.0:
            raise ValueError(f"async_gen_fraction must be in (0, 1), got {self.async_gen_fraction}")

    @property
    def gpus(self) -> int:
        return self.gen_par.gpus

    @property
    def tokens(self) -> float:
        """Tokens trained on per step: prompts + responses."""
        wl = self.workload
        return float(wl.num_responses * wl.prompt_len + wl.response_lengths().sum())

    def async_pools(self) -> tuple[Parallelism, int]:
        """(generation layout, training device count) of the async split; with a single generation
        replica there is nothing to split and both phases share every device (no overlap)."""
        if self.gen_par.replicas < 2:
            return self.gen_par, 0
        replicas = min(self.gen_par.replicas - 1, max(1, round(self.gen_par.replicas * self.async_gen_fraction)))
        gen = replace(self.gen_par, replicas=replicas)
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
        gen_par, train_gpus = setup.async_pools()
        shared = train_gpus == 0
        gen = simulate_generation(hw, model, gen_par, setup.workload, spec)
        phases = {
            "prepare": setup.prepare_time,
            "weight_sync": weight_sync_time(hw, model, gen_par, colocated=shared),
            "generation": gen.time,
            "logprob": logprob_time(hw, model, tokens, train_gpus or setup.gpus),
            "training": training_time(hw, model, tokens, train_gpus or setup.gpus),
        }
        trained = phases["logprob"] + phases["training"]
        overlapped = phases["generation"] + trained if shared else max(phases["generation"], trained)
        return StepResult("async", phases["prepare"] + phases["weight_sync"] + overlapped, phases, gen)
    raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
