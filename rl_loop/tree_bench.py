"""Rollout speed of one policy snapshot: autoregressive vs chain vs tree speculation at equal node budgets.

``python -m rl_loop.tree_bench --run DIR [--k 3] [--budgets 3,6]`` loads ``DIR/checkpoint.pt`` (written by
``python -m rl_loop``; its drafter must be eagle3 or mtp) and generates the same requests (same prompts,
Philox keys and rollout temperature) autoregressively, with a chain of k drafts, and with EAGLE-2 trees of
each node budget (depth k; stochastic for sampled requests, plus the deterministic EAGLE-2 tree), interleaved and
repeated. Reports per mode the median tokens-per-second ratio
to autoregressive decoding (measured side by side in one process) and the mean accepted length; writes
``DIR/tree_vs_chain.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from dataclasses import replace

import torch

from .bench import load_run_config
from .engine import GenerationConfig
from .train import request_seeds, setup
from .tree_engine import TreeRolloutEngine, tree_shape_for


def compare(run_dir: str, k: int, budgets: list[int], repeats: int = 3, num_requests: int = 64,
            temperature: float | None = None) -> list[dict]:
    """One row per mode: ``mode``, ``budget`` (draft nodes per round), ``mean_accepted_length``,
    ``rollout_speedup`` (median over repeats of tokens/s divided by the AR tokens/s of the same repeat)."""
    cfg = replace(load_run_config(run_dir), out=run_dir, resume=True, spec="tree")
    torch.set_num_threads(cfg.num_threads)
    s = setup(cfg, lambda row: None)
    tok, policy, drafter = s["tok"], s["policy"], s["drafter"]
    rng = random.Random(f"tree_bench/{cfg.seed}")
    problems = rng.sample(s["train"], num_requests)
    prompts = [tok.encode(p.prompt, bos=True) for p in problems]
    seeds = request_seeds(cfg.seed + 7, 0, num_requests)
    temp = cfg.temperature if temperature is None else temperature
    base = GenerationConfig(max_new_tokens=cfg.max_new_tokens, temperature=temp, k=k, max_batch=cfg.max_batch,
                            spec="none")
    modes = [("autoregressive", 0, None), ("chain", k, None)]
    modes += [("tree", b, tree_shape_for(k, budget=b)) for b in budgets]
    if temp > 0:  # the EAGLE-2 deterministic tree at the sampling temperature, for comparison
        modes += [("tree_deterministic", b, replace(tree_shape_for(k, budget=b), stochastic_when_sampling=False))
                  for b in budgets]
    engines = {(m, b): TreeRolloutEngine(policy, drafter, tok.eos_id, shape=shape) for m, b, shape in modes}
    ratios: dict[tuple[str, int], list[float]] = {(m, b): [] for m, b, _ in modes}
    accepted: dict[tuple[str, int], list[float]] = {(m, b): [] for m, b, _ in modes}
    for _ in range(repeats):
        ar_tps = None
        for mode, budget, _ in modes:
            gen = replace(base, spec={"autoregressive": "none", "chain": "chain"}.get(mode, "tree"))
            stats = engines[(mode, budget)].generate(prompts, seeds, gen).stats
            ar_tps = stats.tokens_per_s if mode == "autoregressive" else ar_tps
            ratios[(mode, budget)].append(stats.tokens_per_s / ar_tps)
            accepted[(mode, budget)].append(stats.mean_accepted_length)
    return [{"mode": m, "budget": b, "depth": k if m != "autoregressive" else 0, "temperature": temp,
             "mean_accepted_length": statistics.mean(accepted[(m, b)]),
             "rollout_speedup": statistics.median(ratios[(m, b)])} for m, b, _ in modes]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a python -m rl_loop output directory (with checkpoint.pt)")
    p.add_argument("--k", type=int, default=3, help="chain length = tree depth")
    p.add_argument("--budgets", default=None, help="tree node budgets, comma-separated (default: k,2k)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None, help="default: the run's rollout temperature")
    a = p.parse_args(argv)
    budgets = [int(x) for x in a.budgets.split(",")] if a.budgets else [a.k, 2 * a.k]
    rows = compare(a.run, a.k, budgets, a.repeats, a.requests, a.temperature)
    for row in rows:
        print(f"{row['mode']:>18}  budget {row['budget']:>2}  T={row['temperature']:.2f}  "
              f"accepted length {row['mean_accepted_length']:.3f}  rollout speedup {row['rollout_speedup']:.3f}x")
    with open(os.path.join(a.run, "tree_vs_chain.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
