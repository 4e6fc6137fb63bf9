"""``python -m rl_loop.sim sweep``: tables (CSV, Markdown) and plots of the projected speedups.

- ``speedup_vs_k``: generation and step speedup for k = 1..8, per preset;
- ``speedup_vs_acceptance``: a constant conditional acceptance rate from 0.3 to 0.95, at the preset's k
  and at the best k;
- ``speedup_vs_scale``: the same global batch spread over more or fewer generation replicas (GPUs),
  sync generation speedup and end-to-end (async) speedup;
- ``speedup_vs_async_split``: async speedup (same pools) against the share of devices that generate;
- ``speedup_vs_operating_point`` (235B): the knobs the paper names for its 235B projection, GPUs
  (512/1024/2048) x policy lag (1/2) x k (1..8), with the speculative async step time, so that the
  fastest configuration ("the most favourable operating point") can be read off;
- ``speedup_sensitivity`` (235B): the projection at its operating point (2048 GPUs, k = 6) under the inputs
  it rests on: the calibrated acceptance (0.80 / 0.85 / 0.90), the expert-parallel layout (EP8 / EP16 /
  EP32, replicas re-cut to keep 2048 GPUs) and the policy lag (1 / 2).

``--table NAME`` (repeatable) writes only the tables named.
"""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import replace

from ..run.provenance import provenance, row_provenance
from ..run.usage import OneLineParser, UsageError, check_out_dir
from .presets import PRESETS, Scenario, evaluate
from .step import async_split, simulate_async_fixed_split, simulate_step

K_VALUES = tuple(range(1, 9))
ACCEPTANCE_VALUES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
SCALE_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
ASYNC_FRACTIONS = (0.375, 0.5, 0.5625, 0.625, 0.6875, 0.75, 0.875)
OPERATING_GPUS = (512, 1024, 2048)
OPERATING_LAGS = (1, 2)
OPERATING_PRESET = "paper-235b"
SENSITIVITY_ACCEPTANCE = (0.80, 0.85, 0.90)
SENSITIVITY_EP = (8, 16, 32)
SENSITIVITY_LAGS = (1, 2)


TABLES = ("speedup_vs_k", "speedup_vs_acceptance", "speedup_vs_scale", "speedup_vs_async_split",
          "speedup_vs_operating_point", "speedup_sensitivity")


def sweep_k(scn: Scenario, ks: tuple[int, ...] = K_VALUES) -> list[dict]:
    """Generation and step speedup (sync) at each k."""
    ar = simulate_step(scn.setup, None, "sync")
    rows = []
    for k in ks:
        sp = simulate_step(scn.setup, scn.spec.with_k(k), "sync")
        rows.append({"preset": scn.name, "k": k, "tokens_per_step": scn.spec.with_k(k).expected_tokens(),
                     "generation_speedup": ar.phases["generation"] / sp.phases["generation"],
                     "step_speedup": ar.step_time / sp.step_time})
    return rows


def sweep_acceptance(scn: Scenario, rates: tuple[float, ...] = ACCEPTANCE_VALUES,
                     ks: tuple[int, ...] = K_VALUES) -> list[dict]:
    """Generation speedup at the preset's k and at the best k, for constant acceptance rates."""
    ar = simulate_step(scn.setup, None, "sync").phases["generation"]
    rows = []
    for a in rates:
        s = scn.with_acceptance((a,))
        by_k = {k: ar / simulate_step(s.setup, s.spec.with_k(k), "sync").phases["generation"] for k in ks}
        best = max(by_k, key=by_k.get)
        rows.append({"preset": scn.name, "acceptance": a, "k": scn.spec.k,
                     "generation_speedup": by_k[scn.spec.k], "best_k": best, "best_generation_speedup": by_k[best]})
    return rows


def sweep_scale(scn: Scenario, factors: tuple[float, ...] = SCALE_FACTORS) -> list[dict]:
    """Speedups when the same rollouts run on ``factor`` times the preset's generation replicas."""
    rows = []
    for f in factors:
        replicas = max(2, round(scn.setup.gen_par.replicas * f))
        s = replace(scn, setup=replace(scn.setup, gen_par=replace(scn.setup.gen_par, replicas=replicas)))
        r = evaluate(s, k_range=(scn.spec.k,))
        rows.append({"preset": scn.name, "gpus": s.setup.gpus, "generation_speedup": r["generation_speedup"],
                     "step_speedup": r["step_speedup"], "end_to_end_speedup": r["end_to_end_speedup"],
                     "async_speedup": r["async_speedup"]})
    return rows


def sweep_async_split(scn: Scenario, fractions: tuple[float, ...] = ASYNC_FRACTIONS) -> list[dict]:
    """Async speedup (async AR -> async speculative) as the generation pool's share of devices varies:
    once speculation makes generation faster than training, training sets the step."""
    rows = []
    for f in fractions:
        setup = replace(scn.setup, async_gen_fraction=f)
        ar, sp = simulate_step(setup, None, "async"), simulate_step(setup, scn.spec, "async")
        rows.append({"preset": scn.name, "async_gen_fraction": f, "async_speedup": ar.step_time / sp.step_time,
                     "generation_ar_s": ar.phases["generation"], "generation_spec_s": sp.phases["generation"],
                     "train_s": ar.phases["logprob"] + ar.phases["training"]})
    return rows


def sweep_operating_points(scn: Scenario, gpus: tuple[int, ...] = OPERATING_GPUS,
                           lags: tuple[int, ...] = OPERATING_LAGS, ks: tuple[int, ...] = K_VALUES) -> list[dict]:
    """For each GPU count (whole replicas of the preset's shape) x policy lag x k: the sync generation
    speedup, the async rollout speedup (generation per step on the autoregressive pool), the end-to-end
    speedup (async, each pipeline on its balanced split) and both async step times; ``fastest`` marks
    the row with the shortest speculative async step."""
    rows = []
    for n_gpus in gpus:
        par = replace(scn.setup.gen_par, replicas=max(2, n_gpus // scn.setup.gen_par.gpus_per_replica))
        for lag in lags:
            setup = replace(scn.setup, gen_par=par, policy_lag=lag)
            sync_ar = simulate_step(setup, None, "sync").phases["generation"]
            n_ar = async_split(setup, None)
            async_ar = simulate_step(setup, None, "async")
            for k in ks:
                spec = scn.spec.with_k(k)
                sync_sp = simulate_step(setup, spec, "sync").phases["generation"]
                same = simulate_async_fixed_split(setup, spec)
                async_sp = simulate_step(setup, spec, "async")
                rows.append({"preset": scn.name, "gpus": par.gpus, "policy_lag": lag, "k": k,
                             "generation_speedup": sync_ar / sync_sp,
                             "async_rollout_speedup": async_ar.phases["generation"] / same.phases["generation"],
                             "end_to_end_speedup": async_ar.step_time / async_sp.step_time,
                             "async_ar_step_s": async_ar.step_time, "async_spec_step_s": async_sp.step_time,
                             "gen_replicas_ar": n_ar, "gen_replicas_spec": async_split(setup, spec),
                             "fastest": False})
    min(rows, key=lambda r: r["async_spec_step_s"])["fastest"] = True
    return rows


def sweep_sensitivity(scn: Scenario, rates: tuple[float, ...] = SENSITIVITY_ACCEPTANCE,
                      eps: tuple[int, ...] = SENSITIVITY_EP, lags: tuple[int, ...] = SENSITIVITY_LAGS) -> list[dict]:
    """The preset's projection at its k and GPU count for each constant acceptance x expert-parallel width
    (replicas re-cut so the generation GPUs stay the preset's) x policy lag: sync generation speedup, async
    rollout speedup and end-to-end speedup; ``preset_point`` marks the preset's own inputs."""
    gpus = scn.setup.gen_par.gpus
    setups, autoregressive = {}, {}  # per (EP, lag): the layout, and its AR steps (no acceptance in them)
    for ep in eps:
        par = replace(scn.setup.gen_par, ep=ep, replicas=max(2, gpus // (scn.setup.gen_par.tp * ep)))
        for lag in lags:
            setup = setups[ep, lag] = replace(scn.setup, gen_par=par, policy_lag=lag)
            autoregressive[ep, lag] = (simulate_step(setup, None, "sync").phases["generation"],
                                       simulate_step(setup, None, "async"))
    rows = []
    for a in rates:
        spec = replace(scn.spec, acceptance=(a,))
        for ep in eps:
            for lag in lags:
                setup, par = setups[ep, lag], setups[ep, lag].gen_par
                sync_ar, async_ar = autoregressive[ep, lag]
                same = simulate_async_fixed_split(setup, spec)
                rows.append({"preset": scn.name, "acceptance": a, "ep": ep, "gpus": par.gpus, "policy_lag": lag,
                             "k": spec.k,
                             "generation_speedup": sync_ar / simulate_step(setup, spec, "sync").phases["generation"],
                             "async_rollout_speedup": async_ar.phases["generation"] / same.phases["generation"],
                             "end_to_end_speedup": async_ar.step_time / simulate_step(setup, spec, "async").step_time,
                             "preset_point": (a, ep, lag) == (scn.spec.acceptance[0], scn.setup.gen_par.ep,
                                                              scn.setup.policy_lag)})
    return rows


def _write(rows: list[dict], out: str, name: str, prov: dict[str, str]) -> None:
    """``name.csv`` (the rows, each with the provenance columns ``command``, ``git_commit``, ``device``) and
    ``name.md`` (the rows as a table under a comment naming the command and commit)."""
    with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], *prov])
        w.writeheader()
        w.writerows({**r, **prov} for r in rows)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(f"<!-- {prov['command']} ({prov['git_commit']}, {prov['device']}) -->\n\n")
        f.write("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n")
        for r in rows:
            f.write("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |\n")


def _plot(groups: dict[str, list[dict]], x: str, ys: tuple[str, ...], path: str, xlabel: str, log_x: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in groups.items():
        for y in ys:
            ax.plot([r[x] for r in rows], [r[y] for r in rows], marker="o", label=f"{name} {y.replace('_', ' ')}")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup (x)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m rl_loop.sim sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS),
                        help="preset(s) to sweep (repeatable; default: all paper presets)")
    parser.add_argument("--out", default="runs/sim/sweep", help="output directory (default runs/sim/sweep)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--table", action="append", choices=TABLES, help="table(s) to write (repeatable; default: all)")
    args = parser.parse_args(argv)
    names = args.preset or sorted(PRESETS)
    command = " ".join(["python -m rl_loop.sim sweep", *(sys.argv[2:] if argv is None else argv)])
    prov = row_provenance(provenance(command))
    try:
        check_out_dir(args.out)  # creates it
    except UsageError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    # name: (rows for one preset, x, ys, x label, log x, presets it applies to)
    tables = {"speedup_vs_k": (sweep_k, "k", ("generation_speedup", "step_speedup"), "draft length k", False, names),
              "speedup_vs_acceptance": (sweep_acceptance, "acceptance", ("generation_speedup", "best_generation_speedup"),
                                        "conditional acceptance rate (constant)", False, names),
              "speedup_vs_scale": (sweep_scale, "gpus", ("generation_speedup", "end_to_end_speedup"),
                                   "GPUs (same global batch)", True, names),
              "speedup_vs_async_split": (sweep_async_split, "async_gen_fraction", ("async_speedup",),
                                         "share of devices generating (async, same pools)", False, names),
              "speedup_vs_operating_point": (sweep_operating_points, "k", ("async_rollout_speedup", "end_to_end_speedup"),
                                             "draft length k", False, [n for n in names if n == OPERATING_PRESET]),
              "speedup_sensitivity": (sweep_sensitivity, "acceptance", ("end_to_end_speedup",),
                                      "conditional acceptance rate (constant)", False,
                                      [n for n in names if n == OPERATING_PRESET])}
    for table, (fn, x, ys, xlabel, log_x, presets) in tables.items():
        if not presets or args.table and table not in args.table:
            continue
        rows = [r for name in presets for r in fn(PRESETS[name])]
        _write(rows, args.out, table, prov)
        if not args.no_plots:
            # One line per preset, or per (GPUs, policy lag) for the operating points.
            groups: dict[str, list[dict]] = {}
            for r in rows:
                key = (f"EP{r['ep']}, lag {r['policy_lag']}" if "ep" in r else
                       f"{r['gpus']} GPUs, lag {r['policy_lag']}" if "policy_lag" in r else r["preset"])
                groups.setdefault(key, []).append(r)
            _plot(groups, x, ys, os.path.join(args.out, f"{table}.png"), xlabel, log_x)
        print(f"wrote {os.path.join(args.out, table)}.csv/.md" + ("" if args.no_plots else "/.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
