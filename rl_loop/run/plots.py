"""Plots of a run directory: reward/accuracy curves, acceptance by position, time breakdown, spec vs AR.

``python -m rl_loop.run.plots OUT`` redraws them from ``OUT/metrics.jsonl`` and ``OUT/summary.json``.
"""

from __future__ import annotations

import json
import os
import sys


def _load(out: str) -> tuple[list[dict], dict]:
    rows = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            rows.append(json.loads(line))
    summary = {}
    path = os.path.join(out, "summary.json")
    if os.path.exists(path):
        with open(path) as f:
            summary = json.load(f)
    return rows, summary


def make_plots(out: str) -> list[str]:
    """Write the PNGs into ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, summary = _load(out)
    steps = [r for r in rows if "step" in r and "event" not in r]
    evals = [r for r in rows if r.get("event") == "eval"]
    paths = []

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot([r["step"] for r in steps], [r["reward_mean"] for r in steps], label="mean reward")
    ax[0].plot([r["step"] for r in steps], [r["accuracy"] for r in steps], label="train accuracy (T=1)")
    ax[0].set_xlabel("step")
    ax[0].legend()
    ax[0].set_title("rollout reward")
    ax[1].plot([r["step"] for r in evals], [r["val_accuracy"] for r in evals], "o-")
    ax[1].set_xlabel("step")
    ax[1].set_title("validation accuracy (greedy)")
    fig.tight_layout()
    paths.append(os.path.join(out, "reward_accuracy.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    acc = summary.get("acceptance_by_position")
    if acc:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(range(1, len(acc) + 1), acc)
        ax.set_xlabel("draft position")
        ax.set_ylabel("P(accepted)")
        ax.set_ylim(0, 1)
        ax.set_title(f"acceptance by position (k={summary.get('k')}, "
                     f"mean accepted length {summary.get('mean_accepted_length', 0):.2f})")
        fig.tight_layout()
        paths.append(os.path.join(out, "acceptance_by_position.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    if steps:
        parts = ("gen_s", "logprob_s", "train_s", "sync_adapt_s")
        totals = [sum(r.get(p, 0.0) for r in steps) for p in parts]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(["generation", "log-probs", "training", "sync+drafter"], totals)
        ax.set_ylabel("seconds (all steps)")
        ax.set_title("time breakdown")
        fig.tight_layout()
        paths.append(os.path.join(out, "time_breakdown.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    cmp = [r for r in steps if "ar_gen_s" in r]
    if cmp:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["step"] for r in cmp], [r["gen_tokens"] / r["gen_s"] for r in cmp], "o-", label="speculative")
        ax.plot([r["step"] for r in cmp], [r["ar_gen_tokens"] / r["ar_gen_s"] for r in cmp], "o-",
                label="autoregressive")
        ax.set_xlabel("step")
        ax.set_ylabel("rollout tokens / s")
        ax.set_title(f"same policy, same requests (speedup {summary.get('rollout_speedup') or 0:.2f}x)")
        ax.legend()
        fig.tight_layout()
        paths.append(os.path.join(out, "spec_vs_ar.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


if __name__ == "__main__":
    for p in make_plots(sys.argv[1] if len(sys.argv) > 1 else "runs/latest"):
        print(p)
