"""The async GRPO pipeline: rollouts generated on a Ray actor, overlapped with training, policy lag <= 1.

A :class:`GeneratorActor` holds its own copy of the policy and the drafter and the same
:class:`~rl_loop.step.engine.RolloutEngine` (same requests, same per-request Philox seeds as the sync loop:
:func:`rl_loop.step.rollouts.step_requests`). The trainer (this process) runs :func:`run_async`:

    version v = number of policy updates applied so far (the actor starts with the setup's weights, v0)
    submit generate(step s0)
    for step t:
        wait for rollouts(t), generated under version g (the actor tags them)
        submit generate(t + 1)                 # runs on the actor, under the weights it holds now
        train on rollouts(t)                   # old log-probs under version g (a kept snapshot)
        v += 1; adapt the drafter
        push weights (policy + drafter, tagged v) to the actor   # queued behind generate(t + 1)

Actor calls run in submission order, so ``generate(t + 1)`` sees the weights pushed after step ``t - 1``:
the rollouts trained at step t come from version ``t - 1`` (lag 1; lag 0 on the first step), never older.
The importance ratio of the clipped GRPO loss is ``pi_v / pi_g``: the trainer recomputes the old log-probs
with a snapshot of version g (see :func:`rl_loop.step.learn.train_on_batch`), so the ratio stays correct under
the lag. Each metrics row records ``policy_version``, ``rollout_version`` and ``policy_lag``. After a resume
the pipeline refills from the checkpoint's weights (the first resumed step has lag 0).

With ``--rollout-workers N`` the generator is a :class:`~rl_loop.pipelines.ray_rollout.RolloutPool` of N actors:
each step's groups are split across them, every push is one ``ray.put`` of the weights that every worker
loads behind its pending ``generate``, so all N generate step t + 1 under the same version and the lag
bound holds unchanged (the pool checks that a step's shares agree on the version).

``ray.init()`` starts a local Ray (max(2, N) CPUs) unless ``RAY_ADDRESS`` is set, in which case the same
code attaches to that cluster (the ``rl_loop`` package must be importable on its nodes).
"""

from __future__ import annotations

import time

import torch

from specdec_kernels.models import Qwen3

from ..config import RunConfig
from ..run.reports import account_step, compare_step, dump_rollouts, reset_dump, rollout_row
from ..run.session import evaluate_start, finish_run, open_run, progress, setup, validate
from ..run.state import save_checkpoint
from ..step.learn import learn
from ..step.rollouts import step_requests
from .ray_rollout import GeneratorActor, RolloutPool, init_ray, weights


def check_async_config(cfg: RunConfig) -> None:
    """Reject combinations ``--pipeline async`` does not support, with the flags named."""
    if cfg.pipeline != "async":
        raise ValueError(f"run_async needs --pipeline async, got {cfg.pipeline!r}")
    if cfg.backend == "vllm":
        raise ValueError("--backend vllm runs with --pipeline sync only")


def run_async(cfg: RunConfig) -> dict:
    """Async pipeline run (see the module docstring); returns the summary (also in ``OUT/summary.json``).

    The summary has the sync run's keys plus ``pipeline: "async"``, ``max_policy_lag`` and
    ``async_step_s`` / ``sync_step_s`` / ``async_step_speedup``: the mean wall time of an overlapped step
    against the sum of the same steps' measured phases (generation + log-probs + training + sync/adaptation,
    what the sync pipeline pays one after the other), over the steps without side-by-side AR rollouts when
    there are any (``async_compared_steps`` of them). Both sides run on the same cores here, so the phases
    are measured under the overlap's contention.
    """
    check_async_config(cfg)
    t_run = time.perf_counter()
    log = open_run(cfg)
    threads = max(1, cfg.num_threads // 2)  # the trainer and the generator actor share the cores
    torch.set_num_threads(threads)
    s = setup(cfg, log)
    st = s.state
    evaluate_start(s)
    if cfg.dump_rollouts and not cfg.resume:
        reset_dump(cfg.out)
    ray, owns_ray = init_ray(num_cpus=max(2, cfg.rollout_workers))
    pool, pool_summary = None, {}
    try:
        version = st.step  # one update per step: after a resume the trainer holds version `step`
        s.policy.eval()
        worker_threads = max(1, (cfg.num_threads - threads) // cfg.rollout_workers)
        pool = RolloutPool(ray, s.policy, s.drafter, s.tok.eos_id, cfg.rollout_workers, cfg.group_size,
                           worker_threads, version=version)
        snapshots = {version: weights(s.policy, None)[0]}  # policy versions the workers may still generate with
        behaviour = Qwen3(cfg.model)
        behaviour.eval()
        gen = cfg.generation()

        def submit(step: int):
            problems, prompts, seeds = step_requests(cfg.seed, cfg.prompts_per_step, cfg.group_size, s.train,
                                                     s.tok, step)
            compared = compare_step(cfg.spec, cfg.compare_every, step)
            return problems, prompts, seeds, pool.submit(prompts, seeds, gen, compared)

        pending = submit(st.step) if st.step < cfg.steps else None
        lags, step_walls = [], []
        for step in progress(range(st.step, cfg.steps), cfg.progress, desc="grpo async", initial=st.step,
                             total=cfg.steps):
            t0 = time.perf_counter()
            problems, prompts, seeds, call = pending
            rollout_version, rollouts, ar = pool.collect(call)
            wait_s = time.perf_counter() - t0
            pending = submit(step + 1) if step + 1 < cfg.steps else None  # overlaps with the training below
            lag = version - rollout_version
            if not 0 <= lag <= 1:
                raise RuntimeError(f"policy lag {lag} at step {step}: the pipeline must keep it in [0, 1]")
            if cfg.dump_rollouts:
                dump_rollouts(cfg.out, step, seeds, rollouts)
            old = None
            if lag:
                behaviour.load_state_dict(snapshots[rollout_version])
                old = behaviour
            row = rollout_row(cfg.spec != "none", st, step, rollouts, ar, rollout_version)
            learn(s, step, problems, prompts, rollouts, row, behaviour=old)
            account_step(st, row, rollouts, ar)
            version += 1
            t_push = time.perf_counter()
            policy_state = pool.sync(version)  # one put; every worker loads it behind generate(step + 1)
            snapshots = {v: w for v, w in snapshots.items() if v >= version - 1}
            snapshots[version] = policy_state
            row.update(policy_version=version - 1, rollout_version=rollout_version, policy_lag=lag,
                       wait_s=wait_s, push_s=time.perf_counter() - t_push)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                row.update(validate(s))
            row["async_step_s"] = time.perf_counter() - t0
            lags.append(lag)
            step_walls.append((row["async_step_s"], row["step_s"], ar is not None))
            log(row)
            st.step = step + 1
            if cfg.checkpoint_every and st.step % cfg.checkpoint_every == 0:
                save_checkpoint(s)
        pool_summary = pool.summary()
    finally:
        if pool is not None:
            pool.shutdown()
        if owns_ray:
            ray.shutdown()
    # Steps that also ran the side-by-side AR rollouts make the trainer wait for them too (a sync step does
    # not count them), so the comparison uses the other steps when there are any.
    plain = [w for w in step_walls if not w[2]] or step_walls
    async_s = sum(w[0] for w in plain)
    sync_s = sum(w[1] for w in plain)
    extra = {
        "max_policy_lag": max(lags) if lags else None,
        "policy_lags": lags,
        "async_step_s": async_s / len(plain) if plain else None,
        "sync_step_s": sync_s / len(plain) if plain else None,
        "async_compared_steps": len(plain),
        "async_step_speedup": sync_s / async_s if async_s > 0 else None,
        **pool_summary,
    }
    return finish_run(s, t_run, extra)


__all__ = ["GeneratorActor", "RolloutPool", "check_async_config", "run_async"]
