"""Per-step metrics rows, the speculative-vs-autoregressive totals and the run's ``summary.json`` figures."""

from __future__ import annotations

import warnings

from ..step.rollouts import Rollouts, RolloutStats
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
