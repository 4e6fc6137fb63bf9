"""``cpu-here``: calibrate the simulator on this machine from micro-measurements, then check it against
measured rollouts.

1. Micro-measurements, none of which runs the rollout engine: memory bandwidth (large copies) and the
   rate at which skinny GEMMs stream weights that are not in cache, matmul FLOP/s (a GEMM of the target's
   widths), the per-call overhead of a model forward (a Qwen3 with every
   width shrunk to 16, at 1 and at N layers, so nothing but the framework's per-call and per-layer work is
   timed), and the samplers' cost (``verify_chain`` with and without drafts, per vocabulary element).
2. Diagnostics: the tiny target's and draft's measured forward cost against the number of tokens, beside
   the roofline's prediction.
3. The check: autoregressive and speculative rollouts of :mod:`rl_loop.sim.harness` for k in {1, 3, 5},
   interleaved, against the simulator's prediction. The acceptance curve measured in each speculative run
   is the simulator's workload input for that k (a property of the drafter, not a speedup); everything
   else comes from step 1.

Timing uses the thread's CPU clock with one torch thread: on a machine shared with other jobs, wall time
mostly measures the other jobs, while CPU time measures our work (memory-bandwidth interference remains).

Usage: ``python -m rl_loop.sim.calibrate [--out DIR] [--rounds N] [--quick]``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ..run.provenance import provenance
from ..run.usage import OneLineParser
from .engine_costs import cpu_time
from .generation import Parallelism, Speculation, Workload, forward_time, simulate_generation
from .hardware import Hardware
from .harness import HarnessConfig, RunResult, build_models, run_rollouts
from .scenario import Scenario
from .step import StepSetup

# A 38M-parameter target and its one-layer truncation as the draft (~70% acceptance at temperature 1).
DEFAULT_HARNESS = HarnessConfig(vocab_size=512, hidden_size=512, intermediate_size=1536, num_layers=12,
                                num_heads=8, num_kv_heads=4, head_dim=64, draft_layers=1, late_layer_scale=0.1,
                                batch=4)
QUICK_HARNESS = HarnessConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=4,
                              num_heads=2, num_kv_heads=1, head_dim=64, batch=3, response_median=12,
                              max_response_len=32)


# ----------------------------------------------------------------------------------------------------
# 1. Micro-measurements
# ----------------------------------------------------------------------------------------------------

def measure_bandwidth(megabytes: int = 64, repeats: int = 7) -> float:
    """Memory bandwidth in bytes/s from a large float32 copy (bytes read + bytes written)."""
    src = torch.rand(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    t = cpu_time(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / t


def measure_stream_bandwidth(m: int, k: int, n: int, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s at which float32 GEMMs of ``m`` rows stream their weights from memory: ``[m, k] x [k, n]``
    over enough distinct [n, k] matrices (``megabytes`` in all) that none stays in cache, minus the
    matmul time those FLOPs take at cache-resident speed (``measure_matmul_flops``)."""
    count = max(2, megabytes * 2**20 // (4 * n * k))
    weights = [torch.randn(n, k) for _ in range(count)]
    x = torch.randn(m, k)

    def stream():
        for w in weights:
            torch.nn.functional.linear(x, w)

    t = cpu_time(stream, repeats)
    t_flop = 2.0 * m * k * n * count / measure_matmul_flops(64, k, n, repeats)
    return 4 * n * k * count / max(t - t_flop, 1e-9)


def measure_matmul_flops(m: int, k: int, n: int, repeats: int = 7) -> float:
    """FLOP/s of an [m, k] x [k, n] float32 GEMM (``torch.nn.functional.linear``)."""
    x, w = torch.randn(m, k), torch.randn(n, k)
    t = cpu_time(lambda: torch.nn.functional.linear(x, w), repeats)
    return 2.0 * m * k * n / t


def _decode_call(model, batch: int, new_tokens: int, context: int = 32) -> Callable[[], object]:
    """A function running one cached forward of ``batch x new_tokens`` tokens after ``context`` cached
    tokens, called exactly as the harness calls the model (explicit mask and positions)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.zeros(batch, context, dtype=torch.long), past_key_values=cache, use_cache=True)
    mask = torch.ones(batch, context + new_tokens, dtype=torch.long)
    ids = torch.zeros(batch, new_tokens, dtype=torch.long)
    pos = torch.arange(context, context + new_tokens).expand(batch, new_tokens)

    @torch.no_grad()
    def call():
        if cache.get_seq_length() > context:
            cache.crop(context)
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)

    return call


def measure_forward_overhead(num_layers: int, repeats: int = 9) -> tuple[float, float]:
    """(per-call, per-layer) seconds of a forward whose every width is 16: framework work only."""
    times = []
    for layers in (1, num_layers):
        cfg = HarnessConfig(vocab_size=16, hidden_size=16, intermediate_size=16, num_layers=layers,
                            num_heads=1, num_kv_heads=1, head_dim=16, draft_layers=1)
        model, _ = build_models(cfg)
        times.append(cpu_time(_decode_call(model, 1, 1), repeats))
    per_layer = max(0.0, (times[1] - times[0]) / max(num_layers - 1, 1))
    return max(0.0, times[0] - per_layer), per_layer


def measure_sampler(vocab_size: int, rows: int, backend: str = "reference", repeats: int = 9) -> tuple[float, float]:
    """(fixed, per-element) seconds of ``verify_chain``: the sampler with no drafts over ``rows`` and
    ``4 x rows`` rows, fitted linearly in rows x vocabulary."""
    import specdec_kernels as sk

    def call(r: int) -> float:
        logits = torch.randn(r, vocab_size)
        cu = torch.zeros(r + 1, dtype=torch.int64)
        empty = torch.empty(0, dtype=torch.int64)
        temp, seed = torch.ones(r), torch.arange(r, dtype=torch.int64)
        return cpu_time(lambda: sk.verify_chain(logits, empty, cu, temperature=temp, seed=seed, backend=backend),
                        repeats)

    small, large = call(rows), call(4 * rows)
    per_element = max(0.0, (large - small) / (3 * rows * vocab_size))
    return max(0.0, small - per_element * rows * vocab_size), per_element


def measure_draft_sampling(vocab_size: int, rows: int, repeats: int = 9) -> float:
    """Seconds to turn one drafter forward's logits into a sampled draft (softmax + multinomial)."""
    logits = torch.randn(rows, vocab_size)
    gen = torch.Generator().manual_seed(0)
    return cpu_time(lambda: torch.multinomial(torch.softmax(logits, -1), 1, generator=gen), repeats)


@dataclass
class Calibration:
    """What was measured, in SI units."""

    bandwidth: float
    stream_bandwidth: float
    matmul_flops: float
    forward_overhead: float
    layer_overhead: float
    sampler_fixed: float
    sampler_per_element: float
    draft_sampling: float

    def hardware(self) -> Hardware:
        """The ``cpu-here`` accelerator: copy bandwidth as the peak, the GEMM weight-streaming rate as
        the achieved fraction of it, the measured matmul FLOP/s as achieved compute, no overlap of the
        two (one core); one CPU thread has no interconnect (collectives never happen with one device)."""
        return Hardware(
            name="cpu-here", hbm_bandwidth=self.bandwidth,
            dense_flops={"fp32": self.matmul_flops, "bf16": self.matmul_flops},
            hbm_capacity=8e9, scaleup_bandwidth=self.bandwidth, scaleup_latency=0.0, scaleup_domain=1,
            scaleout_bandwidth=self.bandwidth, scaleout_latency=0.0,
            mem_efficiency=min(1.0, self.stream_bandwidth / self.bandwidth), flop_efficiency=1.0,
            overlap=False, host_overlap=False, train_mfu=0.5, logprob_mfu=0.8,
            forward_overhead=self.forward_overhead, layer_overhead=self.layer_overhead,
            step_overhead=0.0, spec_step_overhead=0.0, draft_token_overhead=self.draft_sampling,
            graph_max_tokens=1 << 30, kernel_overhead=self.sampler_fixed,
            sampler_element_time=self.sampler_per_element,
            notes="calibrated by rl_loop.sim.calibrate from micro-measurements on this machine",
        )


def calibrate(cfg: HarnessConfig = DEFAULT_HARNESS, repeats: int = 9) -> Calibration:
    """Run every micro-measurement for a harness of shape ``cfg`` (one torch thread)."""
    torch.set_num_threads(1)
    fixed, per_layer = measure_forward_overhead(cfg.num_layers, repeats)
    s_fixed, s_elem = measure_sampler(cfg.vocab_size, cfg.batch, cfg.backend, repeats)
    return Calibration(
        bandwidth=measure_bandwidth(repeats=repeats),
        stream_bandwidth=measure_stream_bandwidth(cfg.batch, cfg.hidden_size, cfg.intermediate_size,
                                                  repeats=max(3, repeats // 2)),
        matmul_flops=measure_matmul_flops(64, cfg.hidden_size, cfg.intermediate_size, repeats),
        forward_overhead=fixed, layer_overhead=per_layer, sampler_fixed=s_fixed, sampler_per_element=s_elem,
        draft_sampling=measure_draft_sampling(cfg.vocab_size, cfg.batch, repeats),
    )


# ----------------------------------------------------------------------------------------------------
# Scenario for the simulator
# ----------------------------------------------------------------------------------------------------

def harness_workload(cfg: HarnessConfig) -> Workload:
    """The harness's rollouts as a simulator workload (same response lengths, one replica, all at once)."""
    return Workload(num_prompts=1, samples_per_prompt=cfg.batch, prompt_len=cfg.prompt_len,
                    response_median=cfg.response_median, response_sigma=cfg.response_sigma,
                    max_response_len=cfg.max_response_len, max_num_seqs=cfg.batch)


def harness_spec(cfg: HarnessConfig, k: int, acceptance: tuple[float, ...]) -> Speculation:
    """The harness's speculation: a truncated-target draft model, stochastic drafts, no KV compaction."""
    return Speculation(k=k, acceptance=tuple(acceptance), drafter=cfg.draft_spec(),
                       draft_probs=cfg.temperature > 0, kv_compaction=False)


def cpu_here_scenario(cfg: HarnessConfig = DEFAULT_HARNESS, calibration: Calibration | None = None,
                      acceptance: tuple[float, ...] | None = None, k: int = 3) -> Scenario:
    """The ``cpu-here`` preset: micro-measured hardware, the harness's model and workload, and an
    acceptance curve measured by one short speculative run of the harness (unless given)."""
    calibration = calibration or calibrate(cfg)
    if acceptance is None:
        target, draft = build_models(cfg)
        acceptance = run_rollouts(target, draft, cfg, k=5, run_seed=99).acceptance_curve
    setup = StepSetup(hardware=calibration.hardware(), model=cfg.target_spec(), gen_par=Parallelism(),
                      workload=harness_workload(cfg), async_gen_fraction=0.5)
    return Scenario(
        name="cpu-here", description="tiny Qwen3 (transformers, fp32) on this machine's CPU, one thread",
        setup=setup, spec=harness_spec(cfg, k, acceptance),
        assumptions=(f"calibration: {asdict(calibration)}",
                     f"acceptance measured by the harness: {tuple(round(a, 3) for a in acceptance)}",
                     "training and log-probs at 50% / 80% of the measured matmul FLOP/s (projection only)"),
    )


# ----------------------------------------------------------------------------------------------------
# 2-3. Diagnostics and the check against measured rollouts
# ----------------------------------------------------------------------------------------------------

def forward_cost_table(cfg: HarnessConfig, hw: Hardware, target, draft, repeats: int = 5) -> list[dict]:
    """Measured vs roofline-predicted seconds of target forwards over batch x n tokens (n = 1 is an
    autoregressive step, n = k + 1 a verification) and of one draft forward."""
    rows = []
    ctx = 32
    for name, model, spec, ns in (("target", target, cfg.target_spec(), (1, 2, 4, 6)),
                                  ("draft", draft, cfg.draft_spec(), (1,))):
        for n in ns:
            measured = cpu_time(_decode_call(model, cfg.batch, n, ctx), repeats)
            predicted = float(forward_time(hw, spec, Parallelism(), cfg.batch, n, cfg.batch * (ctx + n / 2)))
            rows.append({"model": name, "batch": cfg.batch, "tokens_per_seq": n, "measured_s": measured,
                         "predicted_s": predicted, "ratio": predicted / measured})
    return rows


def compare(cfg: HarnessConfig = DEFAULT_HARNESS, ks: tuple[int, ...] = (1, 3, 5), rounds: int = 3,
            calibration: Calibration | None = None, log: Callable[[str], None] = print) -> dict:
    """Measure AR and speculative rollouts (interleaved, ``rounds`` times, minimum CPU time each) and
    predict each speedup from the calibration plus the acceptance curve measured for that k."""
    torch.set_num_threads(1)
    calibration = calibration or calibrate(cfg)
    hw = calibration.hardware()
    log(f"calibration: {json.dumps(asdict(calibration))}")
    target, draft = build_models(cfg)
    diagnostics = forward_cost_table(cfg, hw, target, draft)
    for row in diagnostics:
        log(f"  forward {row['model']:6s} n={row['tokens_per_seq']}: measured {row['measured_s'] * 1e3:7.2f} ms,"
            f" roofline {row['predicted_s'] * 1e3:7.2f} ms")
    best: dict[int, float] = {}
    runs: dict[int, RunResult] = {}
    for k in (0, *ks):  # warm-up: first calls allocate and fill caches
        run_rollouts(target, draft, cfg, k, run_seed=rounds)
    for r in range(rounds):
        for k in (0, *ks):
            t0 = time.thread_time()
            res = run_rollouts(target, draft, cfg, k, run_seed=r)
            elapsed = time.thread_time() - t0
            best[k] = min(best.get(k, float("inf")), elapsed)
            if k in runs:  # pool acceptance counts over rounds
                res.rounds += runs[k].rounds
                res.steps += runs[k].steps
                res.accepted_at = [a + b for a, b in zip(res.accepted_at, runs[k].accepted_at, strict=True)]
            runs[k] = res
            log(f"  round {r} k={k}: {elapsed:.3f} s CPU, {res.steps} steps")
    workload = harness_workload(cfg)
    model = cfg.target_spec()
    predicted_ar = simulate_generation(hw, model, Parallelism(), workload)
    rows = []
    for k in ks:
        acc = runs[k].acceptance_curve
        pred = simulate_generation(hw, model, Parallelism(), workload, harness_spec(cfg, k, acc))
        measured = best[0] / best[k]
        predicted = predicted_ar.time / pred.time
        rows.append({"k": k, "acceptance": acc, "tokens_per_step": runs[k].tokens_per_step,
                     "measured_speedup": measured, "predicted_speedup": predicted,
                     "error": predicted / measured - 1.0, "measured_s": best[k], "predicted_s": pred.time,
                     "measured_steps": runs[k].steps / rounds, "predicted_steps": pred.steps})
    return {"harness": asdict(cfg), "calibration": asdict(calibration), "forward_costs": diagnostics,
            "autoregressive": {"measured_s": best[0], "predicted_s": predicted_ar.time,
                               "measured_steps": runs[0].steps / rounds, "predicted_steps": predicted_ar.steps},
            "speedups": rows}


def format_table(result: dict) -> str:
    """Markdown table of measured vs predicted rollout speedups (median and spread over rounds where the
    measurement repeats them)."""
    lines = ["| k | tokens/step (measured) | measured speedup (median) | spread (min-max) | predicted | error |",
             "|---|---|---|---|---|---|"]
    for r in result["speedups"]:
        spread = f"{r['measured_min']:.3f}-{r['measured_max']:.3f}" if "measured_min" in r else "-"
        lines.append(f"| {r['k']} | {r['tokens_per_step']:.2f} | {r['measured_speedup']:.3f}x | {spread} | "
                     f"{r['predicted_speedup']:.3f}x | {r['error'] * 100:+.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m rl_loop.sim.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/sim",
                        help="directory for cpu_here_harness.json / cpu_here_engine.json (default runs/sim)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved measurement rounds (default 3 for the harness, 5 for the engine)")
    parser.add_argument("--quick", action="store_true", help="a much smaller harness (smoke test)")
    parser.add_argument("--target", choices=("harness", "engine"), default="harness",
                        help="harness: the transformers harness, roofline from hardware micro-measurements; "
                             "engine: rl_loop's RolloutEngine, priced from its components' micro-measurements")
    parser.add_argument("--engine-state", default=None,
                        help="engine target: cache the warm-started policy and drafter weights in this file")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    os.makedirs(args.out, exist_ok=True)
    command = " ".join(["python -m rl_loop.sim.calibrate", *(sys.argv[1:] if argv is None else argv)])
    if args.target == "engine":
        from .engine_costs import build_engine, compare_engine

        cfg_e, state = build_engine(state_path=args.engine_state)
        result = {**compare_engine(cfg_e, state, rounds=args.rounds or 5), "provenance": provenance(command)}
        path = os.path.join(args.out, "cpu_here_engine.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=2, default=float)
        print(format_table(result))
        print(f"max |error|: {max(abs(r['error']) for r in result['speedups']) * 100:.1f}%  ->  {path}")
        return 0
    cfg = QUICK_HARNESS if args.quick else DEFAULT_HARNESS
    result = {**compare(cfg, rounds=args.rounds or 3), "provenance": provenance(command)}
    path = os.path.join(args.out, "cpu_here_harness.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=float)
    print(format_table(result))
    print(f"max |error|: {max(abs(r['error']) for r in result['speedups']) * 100:.1f}%  ->  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
