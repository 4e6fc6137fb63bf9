"""One sync GRPO step (``train.py``'s loop body; the seeds experiment trains its arms with it too)."""

from __future__ import annotations

from ..run.accounting import account_step, ar_first, compare_step, rollout_row
from ..run.rollout_dump import dump_rollouts
from ..run.state import Session
from .batch import step_requests
from .learn import learn


def grpo_step(s: Session, step: int) -> dict:
    """Generate the step's rollouts (every ``compare_every``-th step also autoregressively, side by side, the
    arm that runs first alternating), learn from them, account the step; returns its metrics row."""
    cfg = s.cfg
    problems, prompts, seeds = step_requests(cfg.seed, cfg.prompts_per_step, cfg.group_size, s.train, s.tok, step)
    ar = None
    compared, first = compare_step(cfg.spec, cfg.compare_every, step), ar_first(cfg.compare_every, step)
    # the same requests, same policy snapshot, autoregressive: timing side by side, arm order alternated
    if compared and first:
        ar = s.engine.generate(prompts, seeds, cfg.generation(spec="none")).stats
    rollouts = s.engine.generate(prompts, seeds, cfg.generation())
    if cfg.dump_rollouts:
        dump_rollouts(cfg.out, step, seeds, rollouts)
    if compared and not first:
        ar = s.engine.generate(prompts, seeds, cfg.generation(spec="none")).stats
    row = rollout_row(cfg.spec != "none", s.state, step, rollouts, ar, s.engine.version)
    if compared:
        row["ar_first"] = first
    learn(s, step, problems, prompts, rollouts, row)
    account_step(s.state, row, rollouts, ar)
    return row
