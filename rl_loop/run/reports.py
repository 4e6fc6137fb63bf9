"""What a run reports: per-step metrics rows, the speculative-vs-autoregressive totals, the
measurement protocol's ``summary.json`` figures, the plots, and the ``--dump-rollouts`` file.

Protocol (``train.grpo_step``): every ``compare_every``-th step generates its requests twice, with the same
policy snapshot, prompts and Philox keys: speculatively (the rollouts that train) and autoregressively
(timing only), in alternating order. Both arms run the policy on the same decode path (``step/engine.py``)
and sample through the same kernels without per-call validation.

- ``rollout_speedup``: speculative tokens/s over autoregressive tokens/s, summed over compared steps;
  ``rollout_speedup_ci``: 95 % percentile bootstrap over compared steps (a step is the unit).
- ``step_speedup``: AR step time (AR rollouts + log-probs + training) over the speculative step time
  (which also pays weight sync + drafter adaptation, amortised); ``step_speedup_ci`` likewise.
- ``end_to_end_speedup``: the whole AR run's wall time over the whole speculative run's, warm starts
  included. The AR run is modelled from this run's own measurements: the same wall time, minus the
  drafter warm start, the drafter sync/adaptation and the speculative rollouts, plus those rollouts at
  the measured AR rate (``rollout_speedup`` x their time). Measurement-only work is left out of both (the
  side-by-side AR rollouts, the equivalence check); evaluation is counted at the speculative rate in both,
  which favours the AR arm.
- ``break_even_steps``: GRPO steps after which the per-step saving has repaid the drafter warm start
  (None when speculation saves nothing per step).

Plots: reward/accuracy curves, acceptance by position, time breakdown, spec vs AR;
``python -m rl_loop.run.reports OUT`` redraws them from ``OUT/metrics.jsonl`` and ``OUT/summary.json``.

``--dump-rollouts``: one line per step in ``OUT/rollouts.jsonl``, ``{"step", "seeds", "responses",
"finished"}`` (request order; responses are token ids without EOS). Two runs with the same seeds must write
the same lines whatever their rollout workers."""

from __future__ import annotations

import json
import os
import sys
import warnings

from ..step.engine import describe
from ..step.rollouts import Rollouts, RolloutStats
from .intervals import bootstrap_ci, ratio_of_rates
from .state import RunState


def compare_step(spec: str, compare_every: int, step: int) -> bool:
    """Whether ``step`` of a run with rollouts of ``spec`` also generates its requests autoregressively for
    the side-by-side timing (every ``compare_every``-th step; 0: never)."""
    return spec != "none" and compare_every > 0 and step % compare_every == 0


def ar_first(compare_every: int, step: int) -> bool:
    """Whether a compared step runs its autoregressive rollouts before the speculative ones: every other
    compared step, so neither arm always runs on a warm (or cold) cache and allocator."""
    return compare_every > 0 and (step // compare_every) % 2 == 1


COLLAPSE_FACTOR = 0.1  # a first-draft acceptance below this fraction of the previous step's is a collapse


class AcceptanceCollapseWarning(UserWarning):
    """The drafts' acceptance collapsed from one step to the next (a drafter that missed a weight sync)."""


def check_acceptance(state: RunState, step: int, version: int | None, by_position: list[float]) -> bool:
    """Warn (:class:`AcceptanceCollapseWarning`, naming the step and the weights version) when the first
    draft's acceptance rate fell below ``COLLAPSE_FACTOR`` of the previous step's; remembers this step's
    rates in ``state.last_acceptance``. Returns whether it warned. The first position decides: it counts
    every round, the later ones only the rounds that got that far (noisy on small batches)."""
    prev, state.last_acceptance = state.last_acceptance, list(by_position)
    if not prev or not by_position or not prev[0] > 0 or by_position[0] >= COLLAPSE_FACTOR * prev[0]:
        return False
    warnings.warn(f"draft acceptance collapsed at step {step} (weights version {version}): per position "
                  f"{_rates(by_position)}, {_rates(prev)} the step before; a drafter that missed a weight sync "
                  "looks like this", AcceptanceCollapseWarning, stacklevel=2)
    return True


def _rates(rates: list[float]) -> str:
    return "[" + ", ".join(f"{a:.3f}" for a in rates) + "]"


def rollout_row(speculative: bool, state: RunState, step: int, rollouts: Rollouts, ar: RolloutStats | None,
                version: int | None = None) -> dict:
    """The generation part of a step's metrics row (``speculative``: the rollouts were drafted and verified;
    ``ar``: stats of the side-by-side AR rollouts; ``version``:
    the weights version that generated the rollouts); books the speculative counters into
    ``state.spec_stats`` and warns on an acceptance collapse (:func:`check_acceptance`)."""
    row: dict = {"step": step, "gen_s": rollouts.stats.time_s, "gen_tokens": rollouts.stats.tokens}
    if version is not None:
        row["weights_version"] = version
    if speculative:
        state.spec_stats.merge(rollouts.stats)
        row.update(mean_accepted_length=rollouts.stats.mean_accepted_length,
                   acceptance_by_position=rollouts.stats.acceptance_by_position)
        if rollouts.stats.rounds and check_acceptance(state, step, version, row["acceptance_by_position"]):
            row["acceptance_collapse"] = True
    if ar is not None:
        row.update(ar_gen_s=ar.time_s, ar_gen_tokens=ar.tokens)
    return row


def account_step(state: RunState, row: dict, rollouts: Rollouts, ar: RolloutStats | None) -> None:
    """Per-step time (``row["step_s"]``) and the running spec-vs-AR totals in ``state.comparison``."""
    drafter_s = row["sync_adapt_s"]
    row["step_s"] = row["gen_s"] + row["logprob_s"] + row["train_s"] + drafter_s
    c = state.comparison
    c.adapt_s += drafter_s  # sync + adaptation, amortised over every step
    c.steps += 1
    if ar is not None:
        c.spec_tokens += rollouts.stats.tokens
        c.spec_s += rollouts.stats.time_s
        c.ar_tokens += ar.tokens
        c.ar_s += ar.time_s
        c.compared += 1
        # same training work on both sides; the speculative step also pays weight sync + adaptation
        spec_step = row["gen_s"] + row["logprob_s"] + row["train_s"]
        ar_step = ar.time_s + row["logprob_s"] + row["train_s"]
        c.spec_step_s += spec_step
        c.ar_step_s += ar_step
        c.per_step.append([rollouts.stats.tokens, rollouts.stats.time_s, ar.tokens, ar.time_s, spec_step, ar_step,
                           float(row.get("ar_first", False))])
        row["rollout_speedup"] = rollouts.stats.tokens_per_s / max(ar.tokens_per_s, 1e-9)


def summary_figures(state: RunState) -> dict:
    """The speed and acceptance figures of ``summary.json`` from the run state."""
    stats, c = state.spec_stats, state.comparison
    return {
        "rollout_speedup": c.rollout_speedup,
        "step_speedup": c.step_speedup,
        "mean_accepted_length": stats.mean_accepted_length if stats.rounds else None,
        "acceptance_by_position": stats.acceptance_by_position if stats.rounds else None,
        "spec_tokens_per_s": c.spec_tokens_per_s,
        "ar_tokens_per_s": c.ar_tokens_per_s,
        "time_breakdown_s": {
            "generation": stats.time_s, "draft": stats.draft_s, "target_forward": stats.target_s,
            "verify": stats.verify_s, "prefill": stats.prefill_s,
        },
        "warm_start_s": state.times.warm_start_s,
        "drafter_warm_s": state.times.drafter_warm_s,
    }


def _step_rates(data):
    """Rows ``[spec_step_s + adapt share, ar_step_s]`` as (work, time) columns: AR time over spec time."""
    import numpy as np

    ones = np.ones(len(data))
    return ratio_of_rates(np.stack([ones, data[:, 0], ones, data[:, 1]], 1))


def ar_baseline(decode_path: str, verify_backend: str) -> str:
    """One line describing the autoregressive arm (both arms share the policy path)."""
    return (f"{describe(decode_path)}; sampling: verify_chain with zero drafts (Gumbel-max on Philox stream 2), "
            f"backend {verify_backend}, validate=False; one host copy of the sampled ids per token "
            "(EOS / length bookkeeping); same threads and requests as the speculative arm")


def protocol_figures(state: RunState, wall_s: float, equivalence_s: float) -> dict:
    """Intervals, end-to-end speedup and break-even steps (module docstring) from the run state."""
    c, t = state.comparison, state.times
    rows = c.per_step
    adapt_share = c.adapt_s / max(c.steps, 1)
    rollout_ci = bootstrap_ci([r[:4] for r in rows], ratio_of_rates)
    step_ci = bootstrap_ci([[r[4] + adapt_share, r[5]] for r in rows], _step_rates)
    out: dict = {"rollout_speedup_ci": rollout_ci, "step_speedup_ci": step_ci,
                 "rollout_speedup_per_step": [(r[0] / r[1]) / (r[2] / r[3]) for r in rows],
                 "ar_first_steps": int(sum(r[6] for r in rows)), "compared_steps": len(rows),
                 "comparison_rows": rows,
                 "end_to_end_speedup": None, "break_even_steps": None}
    speedup = c.rollout_speedup
    if speedup is None:
        return out
    spec_gen = state.spec_stats.time_s
    drafter_warm = t.drafter_warm_s or 0.0
    spec_run = wall_s - c.ar_s - equivalence_s
    ar_run = spec_run - drafter_warm - c.adapt_s - spec_gen + spec_gen * speedup
    out["end_to_end_speedup"] = ar_run / spec_run if spec_run > 0 else None
    out["end_to_end_s"] = {"spec_run_modelled": spec_run, "ar_run_modelled": ar_run, "drafter_warm": drafter_warm,
                           "drafter_sync_adapt": c.adapt_s, "spec_rollouts": spec_gen,
                           "ar_rollouts_modelled": spec_gen * speedup}
    if c.compared:
        saving = (c.ar_step_s - c.spec_step_s) / c.compared - adapt_share
        out["step_saving_s"] = saving
        out["break_even_steps"] = drafter_warm / saving if saving > 0 else None
    return out


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


def dump_path(out: str) -> str:
    """The dump of the run writing into ``out``."""
    return os.path.join(out, "rollouts.jsonl")


def reset_dump(out: str) -> None:
    """Start an empty dump (a fresh run does; a resumed one appends to its dump)."""
    if os.path.exists(dump_path(out)):
        os.remove(dump_path(out))


def dump_rollouts(out: str, step: int, seeds: list[int], rollouts: Rollouts) -> None:
    """Append step ``step``'s line to the dump in ``out``."""
    line = {"step": step, "seeds": seeds, "responses": rollouts.response_ids, "finished": rollouts.finished}
    with open(dump_path(out), "a") as f:
        f.write(json.dumps(line) + "\n")


def read_dump(path: str) -> list[dict]:
    """The lines of a dump, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    for p in make_plots(sys.argv[1] if len(sys.argv) > 1 else "runs/latest"):
        print(p)
