"""One RL step: generation, log-prob recomputation, training and weight sync, synchronous or async.

- ``sync`` (colocated): every device generates, then recomputes log-probs, then trains; weights are
  resharded from the trainer to the generation engine in place (NVLink).
- ``async``: a generation pool produces later steps' rollouts while a training pool consumes step n's,
  so in steady state a step takes the longer of the two plus the exposed weight push from trainer to
  generators. ``policy_lag`` L bounds how many policy versions a rollout may be behind the step that
  trains on it (NeMo-RL's ``max_trajectory_age_steps``), and with it how long one step's batch may take:
  - L = 1: a step's batch is generated from the newest weights and must be complete before that step
    trains, so the generation pool drains at the end of every step and its long tail stays in the step
    (NeMo-RL without in-flight weight updates waits for every pending generation before a refit);
  - L >= 2: a freed slot may take a prompt of a later step, so the pool never drains and decodes at full
    slots (NeMo-RL keeps up to ``num_prompts x max_trajectory_age_steps`` prompt groups in flight); a
    step then costs its tokens at that steady-state throughput
    (:func:`~rl_loop.sim.generation.simulate_steady_generation`), but no shorter than 1 / L of the batch's
    own makespan, since each batch must be complete within L steps (:func:`async_generation`).

The async split: how many generation replicas, the rest training. By default each pipeline gets the
split an RL engineer tunes it to, the one that balances its two pools (minimum step time over whole
replicas): generation slower than training wastes the trainers, and the reverse wastes the generators.
Speculation makes generation cheaper, so its balanced pool is smaller and the freed devices train; the
step speedup is then that of the devices' total work, not the generation speedup. Kept on the
autoregressive split instead (switching speculation on in a running async deployment), speculation buys
only the imbalance that split leaves: once generation is faster than training, training sets the step
(``async_split(setup, spec, fixed=...)``, :func:`async_speedup_at_exposure`).
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
from .model_spec import ModelSpec


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
    else the balanced split of each pipeline; ``policy_lag``: how many steps a rollout may lag the policy
    it trains (module docstring). ``async_exposed_share``: the operating point of the autoregressive async
    pipeline, the share of its step during which training waits on generation, when a measurement states
    it (:func:`async_speedup_at_exposure`). ``prepare_time`` covers data loading and engine preparation,
    identical with and without speculation.
    """

    hardware: Hardware
    model: ModelSpec
    gen_par: Parallelism
    workload: Workload
    async_gen_fraction: float | None = None
    policy_lag: int = 1
    async_exposed_share: float | None = None
    prepare_time: float = 0.0

    def __post_init__(self) -> None:
        if self.async_gen_fraction is not None and not 0.0 < self.async_gen_fraction < 1.0:
            raise ValueError(f"async_gen_fraction must be in (0, 1), got {self.async_gen_fraction}")
        if self.policy_lag < 1:
            raise ValueError(f"policy_lag must be >= 1, got {self.policy_lag}")
        if self.async_exposed_share is not None and not 0.0 < self.async_exposed_share < 1.0:
            raise ValueError(f"async_exposed_share must be in (0, 1), got {self.async_exposed_share}")

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


def async_generation(setup: StepSetup, spec: Speculation | None, gen_par: Parallelism) -> GenerationResult:
    """Generation seconds per async step on the pool ``gen_par`` under ``setup.policy_lag`` L.

    L = 1: the batch drains (:func:`~rl_loop.sim.generation.simulate_generation`). L >= 2: the larger of
    the steady-state cost at full slots with L steps' prompts admissible, and the drained makespan / L.
    """
    hw, model, wl, lag = setup.hardware, setup.model, setup.workload, setup.policy_lag
    drained = simulate_generation(hw, model, gen_par, wl, spec)
    if lag == 1:
        return drained
    steady = simulate_steady_generation(hw, model, gen_par, wl, spec, in_flight_steps=lag)
    if steady.time >= drained.time / lag:
        return steady
    return replace(drained, time=drained.time / lag,
                   breakdown={name: t / lag for name, t in drained.breakdown.items()})


def _async_step(setup: StepSetup, spec: Speculation | None, gen_replicas: int) -> StepResult:
    """Async step with ``gen_replicas`` generation replicas; with one replica in all there is nothing to
    split, and both phases share every device in turn (no overlap)."""
    hw, model, tokens = setup.hardware, setup.model, setup.tokens
    shared = setup.gen_par.replicas < 2
    gen_par, train_gpus = (setup.gen_par, setup.gpus) if shared else setup.pools(gen_replicas)
    gen = async_generation(setup, spec, gen_par)
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


def exposed_generation(result: StepResult) -> float:
    """Seconds of an async step during which training waits on generation (zero once training is the
    longer of the two)."""
    return max(result.phases["generation"] - result.phases["logprob"] - result.phases["training"], 0.0)


def async_speedup_at_exposure(setup: StepSetup, spec: Speculation, exposed_share: float) -> dict:
    """Async speedup (autoregressive -> ``spec`` on the same pools) at the autoregressive operating point
    where training waits on generation for ``exposed_share`` of the step.

    A measured async run states its operating point (how much generation its step exposes), not a split
    of our workload. Whole replicas give a few discrete exposed shares, so the point is taken between the
    two neighbouring splits that bracket it: a pool between the two sizes, its step times interpolated
    linearly. Returns the speedup, both step times and exposed generation seconds, the bracketing splits
    (generation replicas) and the interpolation weight of the smaller pool.
    """
    def point(n: int) -> tuple[float, float, float, float]:
        ar, sp = _async_step(setup, None, n), _async_step(setup, spec, n)
        return ar.step_time, exposed_generation(ar), sp.step_time, exposed_generation(sp)

    replicas = setup.gen_par.replicas
    if replicas < 3:
        raise ValueError("an operating point needs at least three generation replicas to split")
    n = min(max(async_split(setup, None, fixed=None), 1), replicas - 2)
    # Exposed generation grows as the pool shrinks: walk to the pair (n, n + 1) whose shares bracket it.
    lo, hi = point(n), point(n + 1)
    while lo[1] / lo[0] < exposed_share and n > 1:
        n, hi, lo = n - 1, lo, point(n - 1)
    while hi[1] / hi[0] > exposed_share and n < replicas - 2:
        n, lo, hi = n + 1, hi, point(n + 2)
    d_step, d_exposed = lo[0] - hi[0], lo[1] - hi[1]
    # Weight w of the smaller pool: (hi_exposed + w d_exposed) / (hi_step + w d_step) = exposed_share.
    denom = d_exposed - exposed_share * d_step
    w = 0.0 if denom == 0 else min(max((exposed_share * hi[0] - hi[1]) / denom, 0.0), 1.0)
    ar_step, ar_exposed, sp_step, sp_exposed = (b + w * (a - b) for a, b in zip(lo, hi, strict=True))
    return {"speedup": ar_step / sp_step, "ar_step": ar_step, "ar_exposed": ar_exposed, "spec_step": sp_step,
            "spec_exposed": sp_exposed, "splits": (n, n + 1), "weight": w}
