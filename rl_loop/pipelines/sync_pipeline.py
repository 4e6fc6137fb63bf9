"""The sync GRPO pipeline: for each step generate -> (AR side by side) -> learn -> account, one after the other.

Reads top to bottom; every piece lives in its own module (``batch``, ``learn``, ``accounting``,
``evaluation``, ``session``), shared with the async pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ..config import RunConfig
from ..run.accounting import account_step, ar_first, compare_step, rollout_row
from ..run.evaluation import evaluate_start, validate
from ..run.rollout_dump import dump_rollouts, reset_dump
from ..run.session import finish_run, open_run, setup
from ..run.state import Session, save_checkpoint
from ..step.batch import step_requests
from ..step.learn import learn


def progress(iterable: Iterable, enabled: bool, **kw) -> Iterable:
    """``iterable``, with a tqdm progress bar when ``enabled``."""
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, **kw)


def rl_step(s: Session, step: int) -> dict:
    """One sync GRPO step; returns its metrics row."""
    cfg = s.cfg
    problems, prompts, seeds = step_requests(cfg, s.train, s.tok, step)
    ar = None
    compared, first = compare_step(cfg, step), ar_first(cfg, step)
    # the same requests, same policy snapshot, autoregressive: timing side by side, arm order alternated
    if compared and first:
        ar = s.engine.generate(prompts, seeds, cfg.generation(spec="none")).stats
    rollouts = s.engine.generate(prompts, seeds, cfg.generation())
    dump_rollouts(cfg, step, seeds, rollouts)
    if compared and not first:
        ar = s.engine.generate(prompts, seeds, cfg.generation(spec="none")).stats
    row = rollout_row(cfg, s.state, step, rollouts, ar, s.engine.version)
    if compared:
        row["ar_first"] = first
    learn(s, step, problems, prompts, rollouts, row)
    account_step(s.state, row, rollouts, ar)
    return row


def run_sync(cfg: RunConfig) -> dict:
    """Sync pipeline run; returns the summary (also written to ``OUT/summary.json``).

    With ``cfg.rollout_workers > 1`` the session's engine is a :class:`~rl_loop.pipelines.ray_rollout.RolloutPool`
    (every generation, evaluation included, split by group across Ray workers; weights published once per
    update); otherwise the engine runs in this process.
    """
    t_run = time.perf_counter()
    s = setup(cfg, open_run(cfg))
    reset_dump(cfg)
    pool = None
    if cfg.rollout_workers > 1:
        from .ray_rollout import start_pool, stop_pool

        ray, pool, owns_ray = start_pool(s, threads_per_worker(cfg))
        s.engine = pool
    try:
        st = s.state
        evaluate_start(s)
        for step in progress(range(st.step, cfg.steps), cfg.progress, desc="grpo", initial=st.step,
                             total=cfg.steps):
            row = rl_step(s, step)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                row.update(validate(s))
            s.log(row)
            st.step = step + 1
            if cfg.checkpoint_every and st.step % cfg.checkpoint_every == 0:
                save_checkpoint(s)
        return finish_run(s, t_run)
    finally:
        if pool is not None:
            stop_pool(ray, pool, owns_ray)


def threads_per_worker(cfg: RunConfig) -> int:
    """Torch threads of each Ray rollout worker: the run's threads shared by the workers (at least one)."""
    return max(1, cfg.num_threads // cfg.rollout_workers)
