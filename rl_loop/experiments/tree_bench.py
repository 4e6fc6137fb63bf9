"""Rollout speed of one policy snapshot: autoregressive vs chain vs tree speculation.

``python -m rl_loop.experiments.tree_bench --run DIR [--k 3] [--top-k 2,3]`` loads ``DIR/checkpoint.pt`` (written by
``python -m rl_loop``) and generates the same requests (same prompts, Philox keys and rollout temperature)
autoregressively, with a chain of k drafts, and with draft trees of depth k (``TreeShape(k, top_k)``: top_k
children at the root and under the best node of each level), interleaved and repeated, all with the one
``RolloutEngine``. Reports per mode the median tokens-per-second ratio to autoregressive decoding (measured
side by side in one process) and the mean accepted length; writes ``DIR/tree_vs_chain.json``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
from dataclasses import replace

import torch

from ..run.session import setup
from ..run.usage import OneLineParser
from ..step.rollouts import GenerationConfig, TreeShape, request_seeds
from .bench import load_run_config


def compare(run_dir: str, k: int, top_ks: list[int], repeats: int = 3, num_requests: int = 64,
            temperature: float | None = None) -> list[dict]:
    """One row per mode: ``mode``, ``nodes`` (draft nodes per round), ``mean_accepted_length``,
    ``rollout_speedup`` (median over repeats of tokens/s divided by the AR tokens/s of the same repeat)."""
    cfg = replace(load_run_config(run_dir), out=run_dir, resume=True, spec="chain")
    torch.set_num_threads(cfg.num_threads)
    s = setup(cfg, lambda row: None)
    rng = random.Random(f"tree_bench/{cfg.seed}")
    problems = rng.sample(s.train, num_requests)
    prompts = [s.tok.encode(p.prompt, bos=True) for p in problems]
    seeds = request_seeds(cfg.seed + 7, 0, num_requests)
    temp = cfg.temperature if temperature is None else temperature
    base = GenerationConfig(max_new_tokens=cfg.max_new_tokens, temperature=temp, k=k, max_batch=cfg.max_batch,
                            spec="none")
    modes = [("autoregressive", base), ("chain", replace(base, spec="chain"))]
    modes += [(f"tree_top{t}", replace(base, spec="tree", tree=TreeShape(k, t))) for t in top_ks]
    ratios: dict[str, list[float]] = {m: [] for m, _ in modes}
    accepted: dict[str, list[float]] = {m: [] for m, _ in modes}
    for _ in range(repeats):
        ar_tps = None
        for mode, gen in modes:
            stats = s.engine.generate(prompts, seeds, gen).stats
            ar_tps = stats.tokens_per_s if mode == "autoregressive" else ar_tps
            ratios[mode].append(stats.tokens_per_s / ar_tps)
            accepted[mode].append(stats.mean_accepted_length)
    return [{"mode": m, "nodes": 0 if gen.spec == "none" else k if gen.spec == "chain" else gen.tree.num_nodes - 1,
             "depth": 0 if gen.spec == "none" else k, "temperature": temp,
             "mean_accepted_length": statistics.mean(accepted[m]),
             "rollout_speedup": statistics.median(ratios[m])} for m, gen in modes]


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m rl_loop.experiments.tree_bench", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a python -m rl_loop output directory (with checkpoint.pt)")
    p.add_argument("--k", type=int, default=3, help="chain length = tree depth")
    p.add_argument("--top-k", default="2,3", help="children per expanded tree node, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None, help="default: the run's rollout temperature")
    a = p.parse_args(argv)
    rows = compare(a.run, a.k, [int(x) for x in a.top_k.split(",")], a.repeats, a.requests, a.temperature)
    for row in rows:
        print(f"{row['mode']:>16}  nodes {row['nodes']:>2}  T={row['temperature']:.2f}  "
              f"accepted length {row['mean_accepted_length']:.3f}  rollout speedup {row['rollout_speedup']:.3f}x")
    with open(os.path.join(a.run, "tree_vs_chain.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
