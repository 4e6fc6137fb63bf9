"""``run(cfg)``: a GRPO run with lossless speculative rollouts, top to bottom.

1. check the run (a user mistake fails here in one line, before any work);
2. set up: task splits, tokenizer, policy (supervised warm start) and drafter (distilled from the policy),
   the rollout engine (in-process, a Ray pool, or vLLM), or all of it from ``OUT/checkpoint.pt``;
3. for each step (:func:`grpo_step`, below): sample prompts, generate ``group_size`` responses per prompt
   (speculative by default; every ``compare_every``-th step also autoregressively, side by side), score
   them, compute group-normalised advantages, drop all-equal groups, recompute old log-probs, take clipped
   GRPO gradient steps, adapt the drafter and sync the new weights into the engine (checked by fingerprint);
   log the row, validate every ``eval_every`` steps, checkpoint every ``checkpoint_every`` steps;
4. finish: validation and held-out accuracy at the end, the AR-vs-speculative equivalence check on the
   final policy, ``summary.json``, plots and the policy in transformers' layout.

``--pipeline async`` runs the same pieces with generation overlapped on Ray
(``pipelines/async_pipeline.py``).
"""

from __future__ import annotations

import time

from .config import RunConfig
from .run.checks import check_run
from .run.reports import account_step, ar_first, compare_step, dump_rollouts, reset_dump, rollout_row
from .run.session import evaluate_start, finish_run, open_run, progress, setup, validate
from .run.state import Session, save_checkpoint
from .step.learn import learn
from .step.rollouts import step_requests


def run(cfg: RunConfig) -> dict:
    """Run the whole pipeline; returns the summary dict (also written to ``OUT/summary.json``)."""
    check_run(cfg)
    if cfg.pipeline == "async":
        from .pipelines.async_pipeline import run_async

        return run_async(cfg)

    t_run = time.perf_counter()
    s = setup(cfg, open_run(cfg))
    if cfg.dump_rollouts and not cfg.resume:
        reset_dump(cfg.out)
    pool = None
    if cfg.rollout_workers > 1:  # every generation, evaluation included, split by group across Ray workers
        from .pipelines.ray_rollout import start_pool, stop_pool

        ray, pool, owns_ray = start_pool(s, max(1, cfg.num_threads // cfg.rollout_workers))
        s.engine = pool
    try:
        evaluate_start(s)
        st = s.state
        for step in progress(range(st.step, cfg.steps), cfg.progress, desc="grpo", initial=st.step,
                             total=cfg.steps):
            row = grpo_step(s, step)
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
