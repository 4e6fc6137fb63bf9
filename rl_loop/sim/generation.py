"""Rollout generation time: a roofline per decode step, over a batch that shrinks as responses finish.

One *engine step* decodes every active sequence of a replica once: autoregressively one token, or with
chain speculation ``k`` drafter forwards, one target forward over ``k + 1`` tokens per sequence
(verification) and the rejection sampler. A step's time is the roofline of what the target and drafter
read (weights, KV cache) and compute, plus communication and host overheads. Sequences are admitted into
``max_num_seqs`` slots as earlier ones finish; a sequence of length ``n`` needs ``ceil(n / tau)`` steps,
``tau`` being the expected tokens per step (1 without speculation). Synchronous RL waits for the last
sequence, so the long tail of the length distribution sets generation time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import numpy as np

from .hardware import Hardware
from .model_spec import ModelSpec


@dataclass(frozen=True)
class Parallelism:
    """How a phase is laid out: ``tp``-way tensor and ``ep``-way expert parallel replicas, ``replicas`` of
    them (data parallel). Within a replica attention is data-parallel across the ``ep`` ranks, so each rank
    holds the KV cache of ``1 / ep`` of the sequences."""

    tp: int = 1
    ep: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "replicas"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.ep

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


@dataclass(frozen=True)
class Speculation:
    """Chain speculation: ``k`` drafts per step.

    ``acceptance[i]`` is the probability that draft ``i + 1`` is accepted given drafts ``1..i`` were (the
    per-position acceptance curve); a curve shorter than ``k`` repeats its last value, so a single number
    is a constant rate. ``drafter`` is run once per proposed token (None: a free drafter such as n-gram
    lookup). ``draft_probs``: stochastic drafts, so the rejection sampler also reads the draft
    distributions. ``kv_compaction``: the engine keeps only accepted tokens' KV (a request's context grows
    by the tokens it emits); without it every verified slot stays in the cache, masked, and the context
    grows by ``k + 1`` slots per step.
    """

    k: int
    acceptance: tuple[float, ...]
    drafter: ModelSpec | None = None
    draft_probs: bool = False
    kv_compaction: bool = True

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.acceptance:
            raise ValueError("acceptance must hold at least one rate")
        if any(not 0.0 <= a <= 1.0 for a in self.acceptance):
            raise ValueError(f"acceptance rates must lie in [0, 1], got {self.acceptance}")

    def rate(self, position: int) -> float:
        """Conditional acceptance of draft ``position`` (1-based)."""
        return self.acceptance[min(position, len(self.acceptance)) - 1]

    def expected_tokens(self) -> float:
        """Expected tokens emitted per step: 1 (correction or bonus) + expected accepted drafts."""
        total, survive = 1.0, 1.0
        for i in range(1, self.k + 1):
            survive *= self.rate(i)
            total += survive
        return total

    def tokens_distribution(self) -> np.ndarray:
        """P(a step emits j + 1 tokens) for j = 0..k accepted drafts."""
        probs, survive = [], 1.0
        for i in range(1, self.k + 1):
            a = self.rate(i)
            probs.append(survive * (1.0 - a))
            survive *= a
        probs.append(survive)
        return np.asarray(probs)

    def with_k(self, k: int) -> Speculation:
        return replace(self, k=k)


@dataclass(frozen=True)
class Workload:
    """One RL step's rollouts: ``num_prompts x samples_per_prompt`` responses whose lengths follow a
    log-normal (``response_median``, ``response_sigma``) truncated at ``max_response_len`` (truncated
    responses pile up at the cap, as in RL). ``max_num_seqs`` caps concurrent sequences per replica (the
    engine's limit; the KV-cache capacity may cap it further)."""

    num_prompts: int
    samples_per_prompt: int
    prompt_len: int
    response_median: float
    response_sigma: float
    max_response_len: int
    max_num_seqs: int = 1024

    @property
    def num_responses(self) -> int:
        return self.num_prompts * self.samples_per_prompt

    def response_lengths(self) -> np.ndarray:
        """Deterministic sample of response lengths: the distribution's quantiles in a fixed shuffled
        order (arrival order is unrelated to length)."""
        from scipy.stats import norm

        n = self.num_responses
        q = (np.arange(n) + 0.5) / n
        lengths = self.response_median * np.exp(self.response_sigma * norm.ppf(q))
        lengths = np.clip(np.round(lengths), 1, self.max_response_len)
        return np.random.default_rng(0).permutation(lengths)

    def with_(self, **changes) -> Workload:
        return replace(self, **changes)


# ----------------------------------------------------------------------------------------------------
# Roofline of one forward pass
# ----------------------------------------------------------------------------------------------------

def _link(hw: Hardware, group: int) -> tuple[float, float]:
    """(bandwidth, latency) of a collective over ``group`` devices: NVLink if it fits the domain."""
    if group <= hw.scaleup_domain:
        return hw.scaleup_bandwidth, hw.scaleup_latency
    return hw.scaleout_bandwidth, hw.scaleout_latency


def forward_time(
    hw: Hardware,
    model: ModelSpec,
    par: Parallelism,
    num_seqs: np.ndarray | float,
    tokens_per_seq: float,
    context_sum: np.ndarray | float,
) -> np.ndarray:
    """Seconds for one forward of a replica over ``num_seqs`` sequences x ``tokens_per_seq`` new tokens,
    attending over ``context_sum`` cached tokens in total (arrays broadcast; zero sequences cost zero).

    time = max(bytes / achieved bandwidth, FLOPs / achieved FLOP/s) + collectives + host overhead, per
    device (the sum instead of the max where ``hw.overlap`` is false): dense weights split ``tp`` ways,
    experts and KV cache ``tp x ep`` ways.
    """
    num_seqs = np.asarray(num_seqs, dtype=np.float64)
    context_sum = np.asarray(context_sum, dtype=np.float64)
    tokens = num_seqs * tokens_per_seq
    tp, ep = par.tp, par.ep
    b = model.bytes_per_param
    dense_bytes = model.dense_params * b
    miss = (1.0 - model.experts_per_token / model.num_experts) ** tokens if model.is_moe else 0.0
    expert_bytes = model.num_layers * model.num_experts * (1.0 - miss) * model.expert_params * b if model.is_moe else 0.0
    kv_bytes = model.kv_bytes_per_token * context_sum
    bytes_per_dev = dense_bytes / tp + (expert_bytes + kv_bytes) / (tp * ep)
    flops_per_dev = (model.linear_flops(tokens) + model.attention_flops(tokens_per_seq, context_sum)) / (tp * ep)
    t_mem = bytes_per_dev / (hw.hbm_bandwidth * hw.mem_efficiency)
    t_flop = flops_per_dev / (hw.flops(model.dtype) * hw.flop_efficiency)
    comm = np.zeros_like(tokens)
    act_bytes = tokens / ep * model.hidden_size * b  # activations of one data-parallel rank
    if tp > 1:
        bw, lat = _link(hw, tp)
        comm = comm + 2 * model.num_layers * (lat + 2 * (tp - 1) / tp * act_bytes / bw)  # 2 all-reduces / layer
    if ep > 1 and model.is_moe:
        bw, lat = _link(hw, tp * ep)
        a2a = act_bytes * model.experts_per_token * (ep - 1) / ep
        comm = comm + 2 * model.num_layers * (lat + a2a / bw)  # dispatch + combine
    device = (np.maximum(t_mem, t_flop) if hw.overlap else t_mem + t_flop) + comm
    overhead = hw.forward_overhead + hw.layer_overhead * model.num_layers
    eager = tokens / ep > hw.graph_max_tokens  # graphs are captured per data-parallel rank
    total = np.where(eager, np.maximum(device, hw.eager_layer_overhead * model.num_layers), device) + overhead
    return np.where(num_seqs > 0, total, 0.0)


def sampler_time(hw: Hardware, model: ModelSpec, par: Parallelism, rows: np.ndarray | float,
                 with_draft_probs: bool = False) -> np.ndarray:
    """Seconds for a (rejection) sampler over ``rows`` vocabulary rows of float32 logits (plus the draft
    distributions when ``with_draft_probs``): memory-bound, one small kernel."""
    rows = np.asarray(rows, dtype=np.float64)
    elements = rows * model.vocab_size * (2 if with_draft_probs else 1) / par.ep
    if hw.sampler_element_time is not None:  # measured (CPU): cost per vocabulary element
        t = hw.kernel_overhead + elements * hw.sampler_element_time
    else:
        t = hw.kernel_overhead + elements * 4 / (hw.hbm_bandwidth * hw.mem_efficiency)
    return np.where(rows > 0, t, 0.0)


def kv_capacity_seqs(hw: Hardware, model: ModelSpec, par: Parallelism, workload: Workload,
                     drafter: ModelSpec | None = None, memory_fraction: float = 0.9) -> int:
    """Concurrent sequences whose KV cache fits in a replica (average occupancy: prompt + mean length)."""
    weights = model.total_params * model.bytes_per_param + (drafter.total_params * drafter.bytes_per_param if drafter else 0)
    free = memory_fraction * hw.hbm_capacity * par.gpus_per_replica - weights
    per_token = model.kv_bytes_per_token + (drafter.kv_bytes_per_token if drafter else 0)
    mean_len = float(np.mean(workload.response_lengths()))
    if free <= 0:
        raise ValueError(f"{model.name} does not fit in {par.gpus_per_replica} x {hw.name}")
    return max(1, int(free / (per_token * (workload.prompt_len + mean_len))))


# ----------------------------------------------------------------------------------------------------
# Simulation of one replica and of the whole generation phase
# ----------------------------------------------------------------------------------------------------

@dataclass
class GenerationResult:
    """Generation phase: wall time (slowest replica), steps, tokens and a time breakdown in seconds."""

    time: float
    steps: int
    tokens: int
    tokens_per_step: float
    breakdown: dict[str, float] = field(default_factory=dict)
    mean_batch: float = 0.0

    @property
    def throughput(self) -> float:
        return self.tokens / self.time


MONTE_CARLO_DRAWS = 200_000


def steps_needed(todo: np.ndarray, spec: Speculation | None, seed: int = 0) -> np.ndarray:
    """Engine steps each request needs to emit ``todo`` tokens.

    Without speculation a step emits one token. With it, a step emits 1..k + 1 tokens at random (the
    acceptance curve), so requests of equal length finish at different steps and the slowest one, which
    synchronous RL waits for, needs more than ``todo / tau`` steps. Sampled exactly (seeded) when cheap;
    otherwise by the renewal-process normal approximation: mean ``n / tau``, variance ``n var / tau^3``.
    """
    todo = np.asarray(todo, dtype=np.float64)
    if spec is None:
        return np.ceil(todo - 1e-9).astype(np.int64)
    rng = np.random.default_rng(seed)
    p = spec.tokens_distribution()
    sizes = np.arange(1, len(p) + 1)
    tau = float(p @ sizes)
    var = float(p @ sizes**2) - tau**2
    max_steps = int(np.ceil(todo.max(initial=0.0)))
    if todo.size * max_steps <= MONTE_CARLO_DRAWS:
        emitted = np.cumsum(rng.choice(sizes, size=(todo.size, max(max_steps, 1)), p=p), axis=1)
        return np.where(todo > 0, (emitted < todo[:, None]).sum(axis=1) + 1, 0).astype(np.int64)
    mean = todo / tau
    sd = np.sqrt(np.maximum(todo, 0.0) * var / tau**3)
    return np.where(todo > 0, np.maximum(1, np.ceil(mean + sd * rng.standard_normal(todo.size))), 0).astype(np.int64)


def _schedule(lengths: np.ndarray, spec: Speculation | None, slots: int,
              prefill_emits: bool = True, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Start and end step of each request under FIFO admission into ``slots`` concurrent slots. When
    prefill emits a request's first token (``prefill_emits``), a response of ``n`` tokens needs the steps
    to emit ``n - 1``, otherwise ``n`` (:func:`steps_needed`)."""
    todo = np.maximum(lengths - 1, 0) if prefill_emits else np.asarray(lengths, dtype=np.float64)
    steps = steps_needed(todo, spec, seed)
    starts = np.empty_like(steps)
    free = [0] * min(slots, len(lengths))
    heapq.heapify(free)
    for i, n in enumerate(steps):
        t = heapq.heappop(free)
        starts[i] = t
        heapq.heappush(free, t + int(n))
    return starts, starts + steps


class RooflineCosts:
    """Seconds of each part of an engine step from the roofline (the default cost model).

    Any object with the same five methods can stand in for it, e.g. costs measured component by component
    on a real engine (:mod:`rl_loop.sim.calibrate`). Arrays are over steps: ``count`` active sequences and
    ``context`` cached tokens in total at each step.
    """

    def __init__(self, hw: Hardware, model: ModelSpec, par: Parallelism, spec: Speculation | None) -> None:
        self.hw, self.model, self.par, self.spec = hw, model, par, spec
        self.host_overlap = hw.host_overlap

    def target(self, count: np.ndarray, tokens_per_seq: int, context: np.ndarray) -> np.ndarray:
        return forward_time(self.hw, self.model, self.par, count, tokens_per_seq, context)

    def drafter(self, count: np.ndarray, k: int, context: np.ndarray) -> np.ndarray:
        """All ``k`` proposals of one step (one drafter forward per proposed token)."""
        if self.spec is None or self.spec.drafter is None:
            return np.zeros_like(count)
        par = Parallelism(tp=self.par.tp, ep=1, replicas=self.par.replicas) if self.par.ep == 1 else self.par
        return k * forward_time(self.hw, self.spec.drafter, par, count, 1, context)

    def sampler(self, count: np.ndarray, k: int) -> np.ndarray:
        probs = self.spec is not None and self.spec.draft_probs and k > 0
        return sampler_time(self.hw, self.model, self.par, count * (k + 1), probs)

    def overhead(self, count: np.ndarray, k: int) -> np.ndarray:
        """Host work of one step: scheduling, plus speculation's bookkeeping and per-draft costs."""
        extra = self.hw.spec_step_overhead + k * self.hw.draft_token_overhead if k else 0.0
        return np.where(count > 0, self.hw.step_overhead + extra, 0.0)

    def prefill(self, num_seqs: int, prompt_len: int) -> float:
        ctx = num_seqs * prompt_len / 2
        t = forward_time(self.hw, self.model, self.par, num_seqs, prompt_len, ctx) + sampler_time(
            self.hw, self.model, self.par, num_seqs)
        if self.spec is not None and self.spec.drafter is not None:
            t = t + forward_time(self.hw, self.spec.drafter, self.par, num_seqs, prompt_len, ctx)
        return float(t)


def simulate_replica(hw: Hardware, model: ModelSpec, par: Parallelism, workload: Workload,
                     lengths: np.ndarray, spec: Speculation | None, slots: int, costs=None,
                     prefill_emits: bool = True) -> GenerationResult:
    """Decode ``lengths`` (one replica's responses) step by step; see the module docstring. ``costs``
    prices each part of a step (default :class:`RooflineCosts`)."""
    costs = costs or RooflineCosts(hw, model, par, spec)
    lengths = np.asarray(lengths, dtype=np.float64)
    # Few short responses: the sampled tail is noisy, so average the step over several seeded samples.
    small = spec is not None and lengths.size * lengths.max(initial=1.0) * SMALL_REPEATS <= MONTE_CARLO_DRAWS
    runs = [_simulate_once(costs, workload, lengths, spec, slots, prefill_emits, seed)
            for seed in range(SMALL_REPEATS if small else 1)]
    parts = {name: float(np.mean([r[0][name] for r in runs])) for name in runs[0][0]}
    steps = int(round(np.mean([r[1] for r in runs])))
    tau = spec.expected_tokens() if spec else 1.0
    return GenerationResult(time=sum(parts.values()), steps=steps, tokens=int(np.sum(lengths)),
                            tokens_per_step=tau, breakdown=parts, mean_batch=float(np.mean([r[2] for r in runs])))


SMALL_REPEATS = 16


def _simulate_once(costs, workload: Workload, lengths: np.ndarray, spec: Speculation | None, slots: int,
                   prefill_emits: bool, seed: int) -> tuple[dict[str, float], int, float]:
    """One sampled decode of a replica: (seconds by part, steps, mean batch)."""
    tau = spec.expected_tokens() if spec else 1.0
    k = spec.k if spec else 0
    growth = tau if spec is None or spec.kv_compaction else k + 1.0  # KV slots added per step
    starts, ends = _schedule(lengths, spec, slots, prefill_emits, seed)
    horizon = int(ends.max())
    count = np.zeros(horizon + 1)
    offset = np.zeros(horizon + 1)  # sum over active of (prompt - start * growth); context = offset + t*growth*count
    np.add.at(count, starts, 1.0)
    np.add.at(count, ends, -1.0)
    off = workload.prompt_len - starts * growth
    np.add.at(offset, starts, off)
    np.add.at(offset, ends, -off)
    count = np.cumsum(count)[:horizon]
    context = np.cumsum(offset)[:horizon] + np.arange(horizon) * growth * count

    device = {"target": costs.target(count, k + 1, context), "sampler": costs.sampler(count, k)}
    if spec is not None:
        device["drafter"] = costs.drafter(count, k, context)
    host = costs.overhead(count, k)
    if getattr(costs, "host_overlap", False):  # host work hides behind the device's; only the excess shows
        host = np.maximum(host - sum(device.values()), 0.0)
    parts = {"prefill": costs.prefill(len(lengths), workload.prompt_len), "overhead": float(host.sum()),
             **{name: float(t.sum()) for name, t in device.items()}}
    return parts, horizon, float(count.mean()) if horizon else 0.0


def simulate_generation(hw: Hardware, model: ModelSpec, par: Parallelism, workload: Workload,
                        spec: Speculation | None = None) -> GenerationResult:
    """Generation time of one RL step: responses dealt round-robin to ``par.replicas`` replicas, each
    simulated on its own; the phase ends with the slowest replica."""
    lengths = workload.response_lengths()
    slots = min(workload.max_num_seqs,
                kv_capacity_seqs(hw, model, par, workload, spec.drafter if spec else None))
    results = [simulate_replica(hw, model, par, workload, lengths[r::par.replicas], spec, slots)
               for r in range(min(par.replicas, len(lengths)))]
    slowest = max(results, key=lambda r: r.time)
    return GenerationResult(time=slowest.time, steps=slowest.steps, tokens=int(lengths.sum()),
                            tokens_per_step=slowest.tokens_per_step, breakdown=slowest.breakdown,
                            mean_batch=slowest.mean_batch)


def simulate_steady_generation(hw: Hardware, model: ModelSpec, par: Parallelism, workload: Workload,
                               spec: Speculation | None = None, in_flight_steps: int = 1) -> GenerationResult:
    """Generation time of one RL step when the engine never drains (asynchronous RL that refills slots).

    An async generation pool that need not wait for a step's last response gives each freed slot a
    prompt of a later step, so every replica decodes at full slots all the time, and one step's rollouts
    cost their tokens at that steady-state throughput. A slot then holds a response picked in proportion
    to its length and is, on average, half way through it, so the mean cached context is
    ``prompt + E[L^2] / (2 E[L])``. In flight per replica: ``in_flight_steps`` steps' share of the
    responses (the policy lag bounds how many steps may be in flight at once), capped by ``max_num_seqs``
    and the KV capacity. The long tail that synchronous RL waits for, where speculation gains most (a few
    sequences, latency-bound steps), is hidden; what is left is the speculative speedup at a full batch.
    """
    costs = RooflineCosts(hw, model, par, spec)
    lengths = workload.response_lengths()
    per_replica = len(lengths) / par.replicas
    mean_ctx = workload.prompt_len + float(np.mean(lengths**2) / (2 * np.mean(lengths)))
    capacity = kv_capacity_seqs(hw, model, par, workload, spec.drafter if spec else None)
    slots = np.asarray(float(max(1, min(workload.max_num_seqs, capacity, round(in_flight_steps * per_replica)))))
    tau = spec.expected_tokens() if spec else 1.0
    k = spec.k if spec else 0
    context = slots * mean_ctx
    device = {"target": costs.target(slots, k + 1, context), "sampler": costs.sampler(slots, k)}
    if spec is not None:
        device["drafter"] = costs.drafter(slots, k, context)
    host = costs.overhead(slots, k)
    if costs.host_overlap:
        host = np.maximum(host - sum(device.values()), 0.0)
    steps = per_replica * float(np.mean(lengths)) / (float(slots) * tau)
    parts = {"prefill": costs.prefill(int(round(per_replica)), workload.prompt_len), "overhead": float(host) * steps,
             **{name: float(t) * steps for name, t in device.items()}}
    return GenerationResult(time=sum(parts.values()), steps=int(np.ceil(steps)), tokens=int(lengths.sum()),
                            tokens_per_step=tau, breakdown=parts, mean_batch=float(slots))


def generation_speedup(hw: Hardware, model: ModelSpec, par: Parallelism, workload: Workload,
                       spec: Speculation) -> float:
    """Autoregressive generation time / speculative generation time for the same rollouts."""
    return simulate_generation(hw, model, par, workload).time / simulate_generation(hw, model, par, workload, spec).time


__all__ = [
    "Parallelism", "Speculation", "Workload", "GenerationResult", "forward_time", "sampler_time",
    "kv_capacity_seqs", "simulate_replica", "RooflineCosts", "simulate_generation", "simulate_steady_generation",
    "generation_speedup",
]
