"""``python -m rl_loop.experiments.gpu_rollout``: the GPU rollout figure, AR vs speculative rollouts of the LLM-shape
policy (``config.llm_policy``: Qwen3-0.6B's shape, V = 151936) at T = 1, k = 3, EAGLE-3 drafter.

One warm start (policy SFT, then drafter distillation, both on the device), then for each of ``--seeds``
request-seed sets, ``--repeats`` pairs of rollouts of the same requests, one per arm, the arm that goes
first alternating from pair to pair (and from seed to seed), after one untimed pair per batch shape that
captures the CUDA graphs. Both arms run the same engine, policy forward path (CUDA graphs on cuda) and
verification kernel (``verify_chain`` backend auto). The figure is the ratio of response tokens per second,
speculative over AR, pooled over all pairs, with a percentile bootstrap interval over pairs, and per seed.

Budget (``--device cuda``, unmeasured: no GPU was available when this was written): warm start ~60-90 s
(300 SFT steps of 32 sequences x ~45 tokens and 300 drafter steps of the 0.6B bf16 policy, overhead-bound
at this batch), graph captures and 3 seeds x 8 pairs of 128-request rollouts (~1 s a pair: ~48 AR rounds
of a graphed 0.6B forward) ~30-60 s, CUDA and model start-up ~20 s: about 2.5 of the 4 minutes. ``--device cpu --tiny`` is the same path at hidden 64 x 3 layers (same V), a dry
run the tests execute.

Writes ``OUT/gpu_rollout.json``: the figure, the regime (policy size, vocabulary, batch, k, T), every
pair's counters, the warm start, and provenance (command, commit, machine).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

import numpy as np
import torch

from specdec_kernels.models import num_parameters

from ..config import RunConfig, llm_policy, llm_tiny_policy, tiny_config
from ..run.intervals import bootstrap_ci, ratio_of_rates
from ..run.provenance import provenance
from ..run.session import setup
from ..run.usage import OneLineParser, UsageError
from ..step.engine import DEVICES, check_device
from ..step.rollouts import request_seeds
from ..task import VOCAB_SIZE, TaskConfig

PROG = "python -m rl_loop.experiments.gpu_rollout"
ARTEFACT = "gpu_rollout.json"


def rollout_config(device: str, tiny: bool, out: str) -> RunConfig:
    """The measured configuration: the LLM-shape policy (``tiny``: its CPU variant with a seconds-long warm
    start and a small batch), T = 1, k = 3, EAGLE-3, token-level chain verification."""
    if tiny:
        return tiny_config(out=out, device=device, model=llm_tiny_policy(), warm_start_steps=2, warm_start_batch=4,
                           drafter_warm_steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, max_batch=4)
    return RunConfig(out=out, device=device, model=llm_policy(), steps=0, task=TaskConfig(num_train=4096, num_val=64),
                     warm_start_steps=300, warm_start_batch=32, warm_start_lr=3e-4, drafter_warm_steps=300,
                     prompts_per_step=16, group_size=8, max_batch=128, plots=False, progress=False)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(cfg: RunConfig, seeds: int, repeats: int) -> dict:
    """Warm start, then the interleaved pairs (module docstring). Returns the artefact's body."""
    t0 = time.perf_counter()
    s = setup(cfg, lambda row: None)
    _sync(cfg.device)
    warm_s = time.perf_counter() - t0
    spec, ar = cfg.generation(), cfg.generation(spec="none")
    problems = s.val[: cfg.prompts_per_step]  # prompts the warm starts never saw
    prompts = [s.tok.encode(p.prompt, bos=True) for p in problems for _ in range(cfg.group_size)]
    for gen in (ar, spec):  # captures each arm's graphs (and warms caches) outside the timed pairs
        s.engine.generate(prompts, request_seeds(cfg.seed, -1, len(prompts)), gen)
    pairs = []
    for seed in range(seeds):
        for r in range(repeats):
            keys = request_seeds(cfg.seed + 1 + seed, r, len(prompts))
            order = (("ar", ar), ("spec", spec)) if (seed + r) % 2 == 0 else (("spec", spec), ("ar", ar))
            row = {"seed": seed, "repeat": r, "first": order[0][0]}
            for name, gen in order:
                _sync(cfg.device)
                t = time.perf_counter()
                out = s.engine.generate(prompts, keys, gen)
                _sync(cfg.device)
                tokens = [x for resp in out.response_ids for x in resp]
                row[name] = {"tokens": out.stats.tokens, "time_s": time.perf_counter() - t,
                             "mean_accepted_length": out.stats.mean_accepted_length,
                             "out_of_task_tokens": sum(x >= VOCAB_SIZE for x in tokens)}
            pairs.append(row)
    cols = [[p["spec"]["tokens"], p["spec"]["time_s"], p["ar"]["tokens"], p["ar"]["time_s"]] for p in pairs]
    per_seed = {str(seed): ratio_of_rates(np.array([c for c, p in zip(cols, pairs, strict=True) if p["seed"] == seed]))
                for seed in range(seeds)}
    c = cfg.model
    return {
        "rollout_speedup": ratio_of_rates(np.array(cols)),
        "rollout_speedup_ci": bootstrap_ci(cols, ratio_of_rates),
        "rollout_speedup_by_seed": per_seed,
        "spec_tokens_per_s": sum(r[0] for r in cols) / sum(r[1] for r in cols),
        "ar_tokens_per_s": sum(r[2] for r in cols) / sum(r[3] for r in cols),
        "mean_accepted_length": float(np.mean([p["spec"]["mean_accepted_length"] for p in pairs])),
        "out_of_task_fraction": sum(p[a]["out_of_task_tokens"] for p in pairs for a in ("ar", "spec"))
        / max(1, sum(p[a]["tokens"] for p in pairs for a in ("ar", "spec"))),
        "regime": {"policy_parameters": num_parameters(s.policy), "vocab_size": c.vocab_size,
                   "task_tokens": VOCAB_SIZE, "hidden_size": c.hidden_size, "layers": c.num_hidden_layers,
                   "heads": [c.num_attention_heads, c.num_key_value_heads, c.head_dim],
                   "dtype": str(next(s.policy.parameters()).dtype), "requests": len(prompts),
                   "max_batch": cfg.max_batch, "k": cfg.k, "temperature": cfg.temperature,
                   "max_new_tokens": cfg.max_new_tokens, "drafter": cfg.drafter, "verify_backend": spec.backend,
                   "decode_path": s.engine.policy_step.path, "cuda_graphs": s.engine.graphed is not None},
        "seeds": seeds, "repeats": repeats, "pairs": pairs,
        "warm_start_s": warm_s, "warm_start": asdict(s.state.times),
        "config": asdict(cfg),
    }


def machine(device: str) -> str:
    """The accelerator's name on cuda, else the CPU's (``provenance``)."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return provenance()["cpu"]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=DEVICES, default="cuda")
    p.add_argument("--out", default="runs/gpu_rollout", help="output directory (writes gpu_rollout.json)")
    p.add_argument("--tiny", action="store_true", help="the V = 151936 CPU variant, seconds-long (a dry run)")
    p.add_argument("--seeds", type=int, default=3, help="request-seed sets")
    p.add_argument("--repeats", type=int, default=8, help="interleaved AR / speculative pairs per seed")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    a = p.parse_args(argv)
    try:
        check_device(a.device)
        if a.seeds < 1 or a.repeats < 1:
            raise UsageError(f"--seeds and --repeats must be >= 1, got {a.seeds} and {a.repeats}")
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    cfg = rollout_config(a.device, a.tiny, a.out)
    body = measure(cfg, a.seeds, a.repeats)
    record = provenance()
    command = " ".join([*PROG.split(), *(sys.argv[1:] if argv is None else argv)])
    artefact = {**body, "command": command, "commit": record["commit"], "dirty": record["dirty"],
                "machine": machine(a.device), "device": a.device, "provenance": record}
    path = os.path.join(a.out, ARTEFACT)
    with open(path, "w") as f:
        json.dump(artefact, f, indent=1)
    ci = body["rollout_speedup_ci"]
    print(f"rollout speedup {body['rollout_speedup']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
          + f" ({body['regime']['policy_parameters'] / 1e6:.0f}M parameters, V = {body['regime']['vocab_size']}, "
          f"{body['regime']['requests']} requests, k = {cfg.k}, T = {cfg.temperature}) on {artefact['machine']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
