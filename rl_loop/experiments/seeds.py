"""Autoregressive vs speculative GRPO training over several seeds: reward curves and paired tests.

``python -m rl_loop.experiments.seeds --seeds 0,1,2 --steps 32 --out runs/seeds`` runs, for every seed, one warm start
(policy + drafter) and then two GRPO runs from it with the same requests and per-request Philox keys:
rollouts autoregressive (``spec="none"``) and speculative (``spec="chain"``, the run's drafter and k).
Speculation is lossless, so the two arms train on samples of the same law and their reward curves should
differ only by sampling noise. Per seed, a paired two-sided Wilcoxon signed-rank test compares the per-step
mean rollout rewards of the arms; a pooled test covers every (seed, step) pair. Writes
``OUT/seeds.json`` (curves, validation accuracy at the start and at the end of each arm, p-values) and
``OUT/seeds.png``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch

from ..config import RunConfig, tiny_config
from ..run.session import setup, validate
from ..run.usage import OneLineParser
from ..train import grpo_step


def paired_p(a: list[float], b: list[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired samples (1.0 when every pair is equal)."""
    from scipy.stats import wilcoxon

    if all(x == y for x, y in zip(a, b, strict=True)):
        return 1.0
    return float(wilcoxon(a, b).pvalue)


def train_arm(cfg: RunConfig, spec: str, weights: dict) -> dict:
    """GRPO from the warm-start ``weights`` with rollouts of ``spec``; returns the reward curve and accuracy."""
    arm = replace(cfg, spec=spec, warm_start_steps=0, drafter_warm_steps=0, compare_every=0)
    s = setup(arm, lambda row: None)
    s.policy.load_state_dict(weights["policy"])
    if s.drafter is not None:
        s.drafter.trainable().load_state_dict(weights["drafter"])
    s.engine.sync()
    rewards = [grpo_step(s, step)["reward_mean"] for step in range(arm.steps)]
    return {"reward": rewards, **{f"{k}_end": v for k, v in validate(s).items()}}


def compare_seed(cfg: RunConfig) -> dict:
    """One seed: warm start once, then the autoregressive and the speculative arm from the same weights."""
    s = setup(replace(cfg, spec="chain"), lambda row: None)
    weights = {"policy": {k: v.clone() for k, v in s.policy.state_dict().items()},
               "drafter": {k: v.clone() for k, v in s.drafter.trainable().state_dict().items()}}
    start = {f"{k}_start": v for k, v in validate(s).items()}
    ar, sp = train_arm(cfg, "none", weights), train_arm(cfg, "chain", weights)
    return {"seed": cfg.seed, **start, "ar": ar, "spec": sp,
            "wilcoxon_p": paired_p(ar["reward"], sp["reward"])}


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        ax.plot(r["ar"]["reward"], label="autoregressive")
        ax.plot(r["spec"]["reward"], label="speculative")
        ax.set_title(f"seed {r['seed']} (Wilcoxon p = {r['wilcoxon_p']:.2f})")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("mean rollout reward")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m rl_loop.experiments.seeds", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    p.add_argument("--steps", type=int, default=32, help="GRPO steps per arm")
    p.add_argument("--out", default="runs/seeds")
    p.add_argument("--tiny", action="store_true", help="seconds-long configuration (tests, smoke runs)")
    a = p.parse_args(argv)
    seeds = [int(x) for x in a.seeds.split(",")]
    if not seeds or a.steps < 2:
        raise ValueError("--seeds needs at least one seed and --steps at least 2 (a paired test needs pairs)")
    base = tiny_config() if a.tiny else RunConfig()
    base = replace(base, steps=a.steps, out=a.out, progress=False, plots=False, equivalence=False)
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(base.num_threads)
    results = [compare_seed(replace(base, seed=seed)) for seed in seeds]
    ar = [x for r in results for x in r["ar"]["reward"]]
    sp = [x for r in results for x in r["spec"]["reward"]]
    summary = {"steps": a.steps, "seeds": results, "pooled_wilcoxon_p": paired_p(ar, sp)}
    with open(os.path.join(a.out, "seeds.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(results, os.path.join(a.out, "seeds.png"))
    print("| seed | mean reward AR | mean reward spec | Wilcoxon p | val acc start | end AR | end spec |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seed']} | {sum(r['ar']['reward']) / a.steps:.3f} | {sum(r['spec']['reward']) / a.steps:.3f} "
              f"| {r['wilcoxon_p']:.2f} | {r['val_accuracy_start']:.3f} | {r['ar']['val_accuracy_end']:.3f} "
              f"| {r['spec']['val_accuracy_end']:.3f} |")
    print(f"pooled Wilcoxon p = {summary['pooled_wilcoxon_p']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
