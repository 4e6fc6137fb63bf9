"""The default run repeated over seeds: the median and interval of every headline figure.

``python -m rl_loop.experiments.repeat --seeds 0,1,2 --out results/rl_loop/default`` runs ``python -m rl_loop`` (the
defaults, or ``--steps`` / ``--policy`` / ``--workload`` / ``--k``) once per seed into ``OUT/seed<s>/`` (``summary.json``,
``metrics.jsonl``, ``equivalence.json``) and writes ``OUT/repeat.json`` and ``OUT/repeat.md``: per figure the
median over seeds and the [min, max] range, each seed's value, and for the speedups a 95 % bootstrap
interval over every (seed, compared step) pair, resampled within seeds. The rollout speedup is also split by
which arm ran first in its step (``ar_first``: the comparison alternates the order), pooled and per seed,
since the order effect on a loaded host can be as large as the gain. Provenance (commit, date, CPU,
threads, the command) is recorded with the figures (and in each seed's ``summary.json``). ``--reuse``
keeps seeds already run, so a repeat can be split over several timing sessions.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import replace

import numpy as np

from ..config import POLICY_PRESETS, WORKLOADS, RunConfig, tiny_config, with_workload
from ..run.intervals import ratio_of_rates
from ..run.provenance import provenance
from ..run.usage import OneLineParser
from ..train import run

FIGURES = (
    "rollout_speedup", "step_speedup", "end_to_end_speedup", "break_even_steps", "mean_accepted_length",
    "spec_tokens_per_s", "ar_tokens_per_s", "test_accuracy_start", "test_accuracy_end",
    "test_greedy_accuracy_start", "test_greedy_accuracy_end", "val_accuracy_start", "val_accuracy_end",
    "output_gain_end", "equivalence_min_pvalue", "wall_s",
)


def pooled_ci(per_seed_rows: list[list[list[float]]], column: slice, resamples: int = 4000, seed: int = 0
              ) -> list[float] | None:
    """95 % bootstrap interval of the rate ratio over every seed's compared steps (steps resampled within
    each seed, so every seed keeps its weight)."""
    data = [np.asarray([r[column] for r in rows], dtype=float) for rows in per_seed_rows if len(rows) >= 2]
    if not data:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        draw = np.concatenate([d[rng.integers(0, len(d), len(d))] for d in data])
        values.append(ratio_of_rates(draw))
    lo, hi = np.quantile(values, [0.025, 0.975])
    return [float(lo), float(hi)]


ORDERS = (("ar_first", 1.0), ("spec_first", 0.0))
"""The two orders of a compared step, by its row's ``ar_first`` column (index 6)."""


def by_order(per_seed_rows: list[list[list[float]]]) -> dict:
    """The rollout speedup of the steps where the AR arm ran first and of those where speculation did: per
    order, the ratio of rates pooled over every seed's steps of that order, each seed's own ratio (None for a
    seed without such a step), the step count and the pooled bootstrap interval (resampled within seeds)."""
    out = {}
    for name, flag in ORDERS:
        kept = [[r for r in rows if len(r) > 6 and r[6] == flag] for rows in per_seed_rows]
        pooled = [r[:4] for rows in kept for r in rows]
        out[name] = {"steps": len(pooled),
                     "pooled": ratio_of_rates(np.asarray(pooled, dtype=float)) if pooled else None,
                     "per_seed": [ratio_of_rates(np.asarray([r[:4] for r in rows], dtype=float)) if rows else None
                                  for rows in kept],
                     "pooled_ci95": pooled_ci(kept, slice(0, 4))}
    return out


def aggregate(summaries: list[dict], per_seed_rows: list[list[list[float]]]) -> dict:
    """Median, range and per-seed values of every figure in :data:`FIGURES` (None-valued seeds left out)."""
    out: dict = {}
    for name in FIGURES:
        values = [s.get(name) for s in summaries]
        present = [v for v in values if v is not None]
        out[name] = {"median": statistics.median(present) if present else None,
                     "range": [min(present), max(present)] if present else None, "per_seed": values}
    out["rollout_speedup"]["pooled_ci95"] = pooled_ci(per_seed_rows, slice(0, 4))
    out["rollout_speedup"]["by_order"] = by_order(per_seed_rows)
    out["equivalence"] = [s.get("equivalence") for s in summaries]  # "pass" / "fail" / "underpowered"
    out["equivalence_pass"] = [s.get("equivalence_pass") for s in summaries]
    out["equivalence_control_rejected"] = [s.get("equivalence_control_rejected") for s in summaries]
    out["test_accuracy_change"] = [s.get("test_accuracy_change") for s in summaries]
    return out


def markdown(agg: dict, seeds: list[int]) -> str:
    lines = [f"| figure | median | range over seeds {seeds} |", "|---|---|---|"]
    for name in FIGURES:
        a = agg[name]
        if a["median"] is None:
            lines.append(f"| {name} | n/a | n/a |")
            continue
        lo, hi = a["range"]
        lines.append(f"| {name} | {a['median']:.4g} | [{lo:.4g}, {hi:.4g}] |")
    ci = agg["rollout_speedup"]["pooled_ci95"]
    if ci is not None:
        lines.append(f"\nrollout_speedup pooled 95 % bootstrap interval: [{ci[0]:.3f}, {ci[1]:.3f}]")
    for name, _ in ORDERS:
        o = agg["rollout_speedup"]["by_order"][name]
        if o["pooled"] is None:
            lines.append(f"rollout_speedup, {name} steps: none")
            continue
        seeds_text = ", ".join("n/a" if v is None else f"{v:.3f}" for v in o["per_seed"])
        ci_text = "" if o["pooled_ci95"] is None else f", 95 % [{o['pooled_ci95'][0]:.3f}, {o['pooled_ci95'][1]:.3f}]"
        lines.append(f"rollout_speedup, {name} steps ({o['steps']}): pooled {o['pooled']:.3f}{ci_text}; "
                     f"per seed {seeds_text}")
    lines.append(f"equivalence_pass per seed: {agg['equivalence_pass']}; "
                 f"control rejected: {agg['equivalence_control_rejected']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m rl_loop.experiments.repeat", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    p.add_argument("--out", default="runs/repeat")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the configuration's)")
    p.add_argument("--policy", choices=tuple(POLICY_PRESETS), default=None, help="policy shape preset")
    p.add_argument("--workload", choices=tuple(WORKLOADS), default="default", help="task mix")
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads of both arms (default: the config's)")
    p.add_argument("--reuse", action="store_true",
                   help="keep the runs whose OUT/seed<s>/summary.json exists (a repeat split over several sessions)")
    p.add_argument("--tiny", action="store_true", help="seconds-long configuration (tests, smoke runs)")
    a = p.parse_args(argv)
    try:
        seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {a.seeds!r}")
    base = tiny_config() if a.tiny else RunConfig()
    base = replace(base, progress=False, plots=False)
    if a.steps is not None:
        base = replace(base, steps=a.steps)
    if a.policy is not None:
        base = replace(base, model=POLICY_PRESETS[a.policy]())
    base = with_workload(base, a.workload)
    if a.k is not None:
        base = replace(base, k=a.k)
    if a.threads is not None:
        base = replace(base, num_threads=a.threads)
    summaries, rows = [], []
    for seed in seeds:
        out = os.path.join(a.out, f"seed{seed}")
        done = os.path.join(out, "summary.json")
        if a.reuse and os.path.exists(done):
            with open(done) as f:
                summaries.append(json.load(f))
        else:
            summaries.append(run(replace(base, seed=seed, out=out)))
        rows.append(summaries[-1].get("comparison_rows", []))
    agg = aggregate(summaries, rows)
    command = None if argv is None else " ".join(["python -m rl_loop.experiments.repeat", *argv])
    report = {"provenance": provenance(command), "seeds": seeds, "steps": base.steps,
              "k": base.k, "rollout_temperature": base.temperature, "threads": base.num_threads, "figures": agg}
    with open(os.path.join(a.out, "repeat.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(agg, seeds)
    with open(os.path.join(a.out, "repeat.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
