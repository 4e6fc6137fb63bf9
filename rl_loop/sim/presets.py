"""Named scenarios: the paper's 8B and 235B setups, with every workload input stated as an assumption.

The workload inputs (acceptance curves, response lengths, batch sizes) are chosen from what each setup
implies and documented beside it; the one exception is the 235B drafter's acceptance, which no setup
detail we could read states: it is taken from the paper's 512-GPU projection (``PAPER_235B_512``) and
every 2048-GPU figure is predicted with it. The async 8B presets sit at the autoregressive operating
point the paper measured (how much of the step was exposed generation), not at a split of our own.
``paper`` holds the paper's figures so that every simulated number can be printed next to the one it
should reproduce.
"""

from __future__ import annotations

from dataclasses import replace

from .generation import Parallelism, Speculation, Workload
from .hardware import GB200
from .model_spec import QWEN3_8B, QWEN3_235B_A22B, eagle3_head
from .scenario import Scenario
from .step import StepSetup, async_speedup_at_exposure, simulate_async_fixed_split, simulate_step

K_RANGE = tuple(range(1, 9))


def evaluate(scn: Scenario, k: int | None = None, k_range: tuple[int, ...] = K_RANGE) -> dict:
    """Simulate ``scn`` at draft length ``k`` (default: the scenario's) and find the best k.

    Returns, autoregressive -> speculative:
    - ``generation_speedup``, ``step_speedup``: synchronous (colocated) rollouts and steps;
    - ``async_speedup``: async steps on the same pools, speculation switched on in the autoregressive
      deployment (the paper's 8B measurement): at ``setup.async_exposed_share`` when the setup states the
      autoregressive operating point (``async_operating_point`` holds the detail), else on the split that
      balances the autoregressive pipeline;
    - ``async_rollout_speedup``: generation seconds per async step on the autoregressive pipeline's pool;
    - ``end_to_end_speedup``: async steps, each pipeline on the split that balances it (a deployment
      tuned for each, the paper's 235B projection); ``sync_to_async_speedup``: sync autoregressive ->
      async speculative steps;
    - ``best_k`` (highest sync generation speedup over ``k_range``), the per-k generation speedups and the
      phase times.
    """
    k = scn.spec.k if k is None else k
    spec = scn.spec.with_k(k)
    setup = scn.setup
    sync_ar = simulate_step(setup, None, "sync")
    sync_sp = simulate_step(setup, spec, "sync")
    async_ar = simulate_step(setup, None, "async")
    async_sp = simulate_step(setup, spec, "async")
    async_same = simulate_async_fixed_split(setup, spec)  # speculation on the autoregressive split
    operating_point = None
    async_speedup = async_ar.step_time / async_same.step_time
    if setup.async_exposed_share is not None and setup.gen_par.replicas >= 3:
        operating_point = async_speedup_at_exposure(setup, spec, setup.async_exposed_share)
        async_speedup = operating_point["speedup"]
    gen_ar = sync_ar.phases["generation"]
    by_k = {}
    for kk in k_range:
        t = sync_sp.phases["generation"] if kk == k else simulate_step(setup, spec.with_k(kk), "sync").phases["generation"]
        by_k[kk] = gen_ar / t
    best_k = max(by_k, key=by_k.get)
    return {
        "preset": scn.name,
        "k": k,
        "tokens_per_step": spec.expected_tokens(),
        "policy_lag": setup.policy_lag,
        "generation_speedup": gen_ar / sync_sp.phases["generation"],
        "step_speedup": sync_ar.step_time / sync_sp.step_time,
        "async_speedup": async_speedup,
        "async_rollout_speedup": async_ar.phases["generation"] / async_same.phases["generation"],
        "end_to_end_speedup": async_ar.step_time / async_sp.step_time,
        "sync_to_async_speedup": sync_ar.step_time / async_sp.step_time,
        "best_k": best_k,
        "generation_speedup_by_k": by_k,
        "generation_fraction_ar": sync_ar.generation_fraction,
        "async_operating_point": operating_point,
        "phases_sync_ar": sync_ar.phases,
        "phases_sync_spec": sync_sp.phases,
        "phases_async_ar": async_ar.phases,
        "phases_async_spec": async_sp.phases,
        "mean_batch_ar": sync_ar.generation.mean_batch,
    }


# ----------------------------------------------------------------------------------------------------
# The paper's setups
# ----------------------------------------------------------------------------------------------------

# The paper's asynchronous 8B measurement: the autoregressive async step took 75.0 s, 10.4 s of it
# generation the trainer waited on (exposed); with speculation 60.5 s, 0.6 s exposed (1.24x).
PAPER_8B_ASYNC_EXPOSED_SHARE = 10.4 / 75.0

_8B_COMMON = (
    "hardware: GB200 datasheet peaks; 80% of HBM bandwidth and 70% of dense BF16 peak achieved in decode, "
    "40% MFU in training, 45% in log-prob recomputation",
    "host costs per engine step: 1 ms scheduling, +1 ms speculation bookkeeping, +150 us per proposed "
    "token, on the critical path (the measured engine scheduled speculative steps synchronously); CUDA "
    "graphs up to 512 tokens per forward",
    "layout: Qwen3-8B BF16, one replica per GPU (TP=1) x 32; training on the same 32 GPUs (colocated)",
    "async (the paper's measurement, async autoregressive -> async speculative): separate generation and "
    "training pools (NeMo-RL async GRPO is not colocated), policy lag 1 (NeMo-RL's default trajectory age), "
    "speculation switched on without re-splitting the pools; the autoregressive pipeline at the paper's "
    "operating point, 10.4 s of its 75.0 s step exposed generation (13.9%); the paper's async workload and "
    "split are not stated in what we could read, so both 8B workloads are placed at that point",
    "drafter: EAGLE-3 head (one Qwen3-8B layer, 3h x h fusion, 32k draft vocabulary), deterministic drafts",
    "batch: 256 prompts x 16 samples = 4096 responses per step, 128 per GPU, admitted as KV capacity allows",
)

PAPER_8B_THINK = Scenario(
    name="paper-8b-think",
    description="Qwen3-8B, RL-Think (continue RL of a reasoning model), 32 GB200, synchronous GRPO",
    setup=StepSetup(
        hardware=GB200, model=QWEN3_8B, gen_par=Parallelism(tp=1, ep=1, replicas=32),
        workload=Workload(num_prompts=256, samples_per_prompt=16, prompt_len=512, response_median=4000,
                          response_sigma=0.7, max_response_len=16384),
        async_exposed_share=PAPER_8B_ASYNC_EXPOSED_SHARE,
    ),
    spec=Speculation(k=3, acceptance=(0.60, 0.55, 0.50, 0.46, 0.43, 0.40, 0.38, 0.36),
                     drafter=eagle3_head(QWEN3_8B)),
    assumptions=_8B_COMMON + (
        "responses: log-normal, median 4000 tokens, sigma 0.7, cap 16384 (long reasoning traces, ~2% hit the cap)",
        "acceptance (conditional, by draft position): 0.60, 0.55, 0.50, 0.46, 0.43, ... -> 2.1 tokens/step at "
        "k = 3: a generic EAGLE-3 draft at temperature 1 on long reasoning traces",
    ),
    paper={"generation_speedup": 1.54, "step_speedup": 1.35, "best_k": 3, "async_speedup": 1.24},
)

PAPER_8B_ZERO = Scenario(
    name="paper-8b-zero",
    description="Qwen3-8B-Base, RL-Zero (learn reasoning from a base model), 32 GB200, synchronous GRPO",
    setup=replace(PAPER_8B_THINK.setup, workload=Workload(
        num_prompts=256, samples_per_prompt=16, prompt_len=256, response_median=1500, response_sigma=0.7,
        max_response_len=8192)),
    spec=Speculation(k=3, acceptance=(0.70, 0.63, 0.57, 0.52, 0.48, 0.45, 0.42, 0.40),
                     drafter=eagle3_head(QWEN3_8B)),
    assumptions=_8B_COMMON + (
        "responses: log-normal, median 1500 tokens, sigma 0.7, cap 8192 (a base model's shorter traces)",
        "acceptance (conditional): 0.70, 0.63, 0.57, 0.52, 0.48, ... -> 2.4 tokens/step at k = 3: a "
        "domain-aligned draft (trained on math RL data) on simpler traces",
    ),
    paper={"generation_speedup": 1.77, "step_speedup": 1.41, "best_k": 3, "async_speedup": 1.24},
)

# The 235B drafter's acceptance is the one input the paper's 235B figures pin down without the layout or
# the async model: its 512-GPU projection at k = 3 (2.72x rollout speedup) needs a constant conditional
# acceptance of 0.85 in this cost model (0.80 -> 2.52x, 0.90 -> 2.93x). Every 2048-GPU figure is then a
# prediction.
ACCEPTANCE_235B = 0.85

_235B_COMMON = (
    "hardware: GB200 as for 8B; MoE training at 30% MFU and log-probs at 35% (all-to-all heavy)",
    "layout: generation replicas of 16 GPUs (EP=16, attention data-parallel); training on all devices "
    "(sync) or on those the async split leaves",
    "batch: 2048 prompts x 16 samples = 32768 responses per step; lengths as RL-Think",
    "drafter: EAGLE-3 head, constant conditional acceptance 0.85, the value at which this model gives the "
    "paper's 512-GPU, k = 3 rollout speedup of 2.72x (the paper's 235B acceptance is not stated in what we "
    "could read; 0.80, our earlier guess, gives 2.52x there)",
    "routing: uniform over experts (every expert is read at full batch; in the tail, k + 1 tokens per "
    "sequence touch more experts than 1, so verification costs more than a decode)",
    "engine: host scheduling overlapped with the device (async scheduling with speculative decoding, as "
    "current vLLM/SGLang do at scale); the 8B presets model the measured engine, whose host work adds",
    "async: each pipeline (autoregressive, speculative) on the split of generation and training devices "
    "that balances it, the operating point a deployment is tuned to; 'end-to-end' compares the two async "
    "pipelines, as the paper's 8B async figure does",
)

PAPER_235B = Scenario(
    name="paper-235b",
    description="Qwen3-235B-A22B (MoE), 2048 GB200, async GRPO with policy lag 2 (the paper's most favourable point)",
    setup=StepSetup(
        hardware=GB200.with_(train_mfu=0.30, logprob_mfu=0.35, host_overlap=True), model=QWEN3_235B_A22B,
        gen_par=Parallelism(tp=1, ep=16, replicas=128),
        workload=Workload(num_prompts=2048, samples_per_prompt=16, prompt_len=512, response_median=4000,
                          response_sigma=0.7, max_response_len=16384),
        policy_lag=2,
    ),
    spec=Speculation(k=6, acceptance=(ACCEPTANCE_235B,), drafter=eagle3_head(QWEN3_235B_A22B)),
    assumptions=_235B_COMMON + (
        "operating point: 2048 GPUs, policy lag 2, as the paper names; k = 6, the fastest speculative step of "
        "the sweep over GPUs (512/1024/2048) x lag (1/2) x k (1..8) (sweep speedup_vs_operating_point)",
        "policy lag 2: freed slots take the next step's prompts, so the generation pool never drains and "
        "decodes at full slots (up to two steps' prompts in flight, as NeMo-RL admits num_prompts x age); a "
        "batch must still finish within two steps",
    ),
    paper={"async_rollout_speedup": 3.5, "end_to_end_speedup": 2.5},
)

PAPER_235B_512 = Scenario(
    name="paper-235b-512",
    description="Qwen3-235B-A22B (MoE), 512 GB200, async GRPO with policy lag 1, k = 3 (the paper's first projection)",
    setup=replace(PAPER_235B.setup, gen_par=replace(PAPER_235B.setup.gen_par, replicas=32), policy_lag=1),
    spec=PAPER_235B.spec.with_k(3),
    assumptions=_235B_COMMON + (
        "operating point: 512 GPUs and k = 3 as the paper states; policy lag 1 (not stated; NeMo-RL's default)",
        "the rollout speedup here is the calibration of the acceptance (not a validation); the end-to-end "
        "figure is a prediction",
    ),
    paper={"generation_speedup": 2.72, "end_to_end_speedup": 1.70},
)

PRESETS: dict[str, Scenario] = {s.name: s for s in (PAPER_8B_THINK, PAPER_8B_ZERO, PAPER_235B, PAPER_235B_512)}


def get_preset(name: str) -> Scenario:
    """A scenario by name; ``cpu-here`` is calibrated on this machine (slow: micro-measurements)."""
    if name == "cpu-here":
        from .calibrate import cpu_here_scenario

        return cpu_here_scenario()
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS) + ['cpu-here']}")
    return PRESETS[name]
