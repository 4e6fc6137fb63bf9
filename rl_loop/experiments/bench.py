"""Rollout speed of one policy snapshot: autoregressive vs chain speculation, swept over k.

``python -m rl_loop.experiments.bench --run DIR [--ks 1,2,3,5,7]`` loads ``DIR/checkpoint.pt`` (a finished or running
``python -m rl_loop`` output) and generates the same requests (same prompts, same Philox keys, rollout
temperature) autoregressively and speculatively, interleaved and repeated, and reports the median
tokens-per-second ratio and the mean accepted length per k. Writes ``DIR/k_sweep.json``.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import fields, replace

import torch

from specdec_kernels.models import ModelConfig

from ..config import RunConfig
from ..run.session import setup
from ..run.usage import OneLineParser
from ..step.rollouts import request_seeds
from ..task import TaskConfig


def load_run_config(run_dir: str) -> RunConfig:
    raw = torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=False)["config"]
    raw["model"] = ModelConfig(**raw["model"])
    task = raw["task"]
    raw["task"] = TaskConfig(**{**task, "families": tuple(task["families"]),
                                "difficulties": tuple(task["difficulties"])})
    names = {f.name for f in fields(RunConfig)}
    return RunConfig(**{k: v for k, v in raw.items() if k in names})


def sweep(run_dir: str, ks: list[int], repeats: int = 3, num_requests: int = 64,
          temperature: float | None = None, verify_backend: str | None = None) -> list[dict]:
    cfg = replace(load_run_config(run_dir), out=run_dir, resume=True)
    if verify_backend is not None:
        cfg = replace(cfg, verify_backend=verify_backend)
    torch.set_num_threads(cfg.num_threads)
    s = setup(cfg, lambda row: None)
    tok, engine = s.tok, s.engine
    problems = [p for p in s.train[: num_requests // cfg.group_size] for _ in range(cfg.group_size)]
    prompts = [tok.encode(p.prompt, bos=True) for p in problems]
    seeds = request_seeds(cfg.seed, 10_000, len(prompts))
    base = cfg.generation() if temperature is None else cfg.generation(temperature=temperature)
    chain_verify = "block" if base.verify == "block" else "token"  # the run's chain method (a tree run's: token)
    rows = []
    for k in ks:
        ratios, taus, acc = [], [], None
        for _ in range(repeats):
            ar = engine.generate(prompts, seeds, replace(base, spec="none"))
            sp = engine.generate(prompts, seeds, replace(base, spec="chain", k=k, verify=chain_verify))
            ratios.append(sp.stats.tokens_per_s / ar.stats.tokens_per_s)
            taus.append(sp.stats.mean_accepted_length)
            acc = sp.stats.acceptance_by_position
        rows.append({"k": k, "rollout_speedup": statistics.median(ratios), "speedups": ratios,
                     "mean_accepted_length": statistics.mean(taus), "acceptance_by_position": acc,
                     "temperature": base.temperature, "max_batch": base.max_batch, "requests": len(prompts),
                     "verify_backend": base.backend})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m rl_loop.experiments.bench", description=__doc__.split("\n")[0])
    p.add_argument("--run", default="runs/latest", help="run directory with checkpoint.pt")
    p.add_argument("--ks", default="1,2,3,5,7")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None, help="default: the run's rollout temperature")
    p.add_argument("--verify-backend", default=None, help="default: the run's verification backend")
    a = p.parse_args(argv)
    rows = sweep(a.run, [int(x) for x in a.ks.split(",")], a.repeats, a.requests, a.temperature, a.verify_backend)
    name = "k_sweep.json" if a.verify_backend is None else f"k_sweep_{a.verify_backend}.json"
    with open(os.path.join(a.run, name), "w") as f:
        json.dump(rows, f, indent=1)
    print("| k | rollout speedup (median) | mean accepted length |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['rollout_speedup']:.2f}x | {r['mean_accepted_length']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["sweep", "load_run_config"]
