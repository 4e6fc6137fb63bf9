"""The measurement protocol's figures of ``summary.json``: intervals of the speedups over comparison steps,
the end-to-end speedup with warm starts included, the break-even step count and the AR baseline's line.

Protocol (``step/grpo_step.py``): every ``compare_every``-th step generates its requests twice, with
the same policy snapshot, prompts and Philox keys: speculatively (the rollouts that train) and
autoregressively (timing only), in alternating order. Both arms run the policy on the same decode path
(``decode.py``) and sample through the same kernels without per-call validation.

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
"""

from __future__ import annotations

from ..step.decode import describe
from .intervals import bootstrap_ci, ratio_of_rates
from .state import RunState


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
