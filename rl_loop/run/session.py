"""Opening, setting up and finishing a run (shared by the sync and async pipelines), and scoring
its policy: validation accuracy and the held-out test split, through any rollout engine (speculation is
lossless, so any spec mode scores the same).

The held-out test split holds problems never used to train, validate or choose a default, scored at the
start and the end of a run with per-problem (clustered) intervals, a paired interval of the change, greedy
accuracy and pass@k. It is drawn from its own random stream (``"test/<seed>"``) and excludes every prompt
of the run's train and validation splits, so no tuning decision (all made on validation accuracy) saw it."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import asdict, replace

import numpy as np
import torch

from specdec_kernels.drafters import CachedDrafter
from specdec_kernels.models import Qwen3, save_pretrained

from ..config import RunConfig
from ..step.drafting import adapter, build_drafter, problem_batches, warm_start
from ..step.engine import RolloutEngine, place
from ..step.learn import policy_optimizer, supervised_warm_start
from ..step.rollouts import GenerationConfig, request_seeds, score
from ..task import CharTokenizer, Problem, TaskConfig, make_problem, make_splits
from .intervals import clustered_mean, paired_change, pass_at_k
from .provenance import provenance
from .reports import ar_baseline, protocol_figures, summary_figures
from .state import (
    Engine,
    RunState,
    Session,
    cut_metrics,
    load_checkpoint,
    metrics_path,
    read_checkpoint,
    save_checkpoint,
)


def progress(iterable: Iterable, enabled: bool, **kw) -> Iterable:
    """``iterable``, with a tqdm progress bar when ``enabled``."""
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, **kw)


def open_run(cfg: RunConfig) -> Callable[[dict], None]:
    """Threads, OUT and ``metrics.jsonl`` (emptied, or cut back to the checkpoint when resuming); returns the
    ``log(row)`` function."""
    torch.set_num_threads(cfg.num_threads)
    os.makedirs(cfg.out, exist_ok=True)
    path = metrics_path(cfg.out)
    if cfg.resume:
        cut_metrics(cfg.out, read_checkpoint(cfg))  # no step logged twice after a kill
    elif os.path.exists(path):
        os.remove(path)

    def log(row: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    return log


@contextmanager
def _frozen(policy: Qwen3):
    """The policy's parameters need no gradient while a drafter is distilled from it."""
    for p in policy.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in policy.parameters():
            p.requires_grad_(True)


def make_engine(cfg: RunConfig, policy: Qwen3, drafter: CachedDrafter | None, tok: CharTokenizer) -> Engine:
    """The rollout engine of ``cfg.backend``: ours, or vLLM serving the policy and drafter."""
    if cfg.backend == "vllm":
        from ..backends.vllm_backend import make_vllm_engine

        return make_vllm_engine(cfg, policy, drafter, tok)
    return RolloutEngine(policy, drafter, tok.eos_id, cfg.decode)


def setup(cfg: RunConfig, log: Callable[[dict], None]) -> Session:
    """Tokenizer, splits, warm-started policy and drafter, engine and optimizers (or restored from OUT)."""
    torch.manual_seed(cfg.seed)
    tok = CharTokenizer()
    train_set, val_set = make_splits(replace(cfg.task, seed=cfg.seed))
    test_set = make_test_split(replace(cfg.task, seed=cfg.seed), cfg.num_test, train_set + val_set)
    policy = place(Qwen3(cfg.model), cfg.device)
    ckpt = load_checkpoint(cfg.out, cfg.resume)
    state = RunState() if ckpt is None else RunState.from_dict(ckpt["state"])
    if ckpt is None:
        t0 = time.perf_counter()
        losses = supervised_warm_start(policy, train_set, tok, cfg.warm_start_steps, cfg.warm_start_batch,
                                       cfg.warm_start_lr, cfg.seed)
        state.times.warm_start_s = time.perf_counter() - t0
        log({"event": "warm_start", "loss_first": losses[0] if losses else None,
             "loss_last": losses[-1] if losses else None, "seconds": state.times.warm_start_s})
    else:
        policy.load_state_dict(ckpt["policy"])
    policy.eval()
    drafter, trainer = None, None
    if cfg.spec != "none":
        drafter = build_drafter(cfg.drafter, policy, cfg.seed, device=cfg.device)
        if ckpt is None:
            t0 = time.perf_counter()
            with _frozen(policy):
                losses = warm_start(drafter, policy, problem_batches(train_set, tok, cfg.warm_start_batch, cfg.seed + 1),
                                    cfg.drafter_warm_steps, cfg.drafter_warm_lr, unroll=cfg.k - 1)
            state.times.drafter_warm_s = time.perf_counter() - t0
            log({"event": "drafter_warm_start", "loss_first": losses[0] if losses else None,
                 "loss_last": losses[-1] if losses else None, "seconds": state.times.drafter_warm_s})
        else:
            drafter.trainable().load_state_dict(ckpt["drafter"])
        trainer = adapter(drafter, cfg.drafter_adapt_lr, unroll=cfg.k - 1)
        if ckpt is not None and ckpt.get("drafter_opt") is not None:
            trainer.opt.load_state_dict(ckpt["drafter_opt"])
    engine = make_engine(cfg, policy, drafter, tok)
    engine.version = state.step  # the weights of the last update (version step); 0 for a fresh run
    opt = policy_optimizer(policy, cfg.lr, cfg.output_gain_lr)
    if ckpt is not None:
        opt.load_state_dict(ckpt["opt"])
    ref = None
    if cfg.kl_coef > 0:
        ref = place(Qwen3(cfg.model), cfg.device)
        ref.load_state_dict(policy.state_dict() if ckpt is None else ckpt["ref"])
        ref.eval()
    return Session(cfg=cfg, tok=tok, train=train_set, val=val_set[: cfg.num_val], policy=policy, drafter=drafter,
                   engine=engine, opt=opt, drafter_trainer=trainer, ref=ref, state=state, log=log, test=test_set)


def finish_run(s: Session, t_run: float, extra: dict | None = None) -> dict:
    """Final evaluation, checkpoint, exported policy, equivalence check, ``summary.json`` (+ ``extra``), plots."""
    cfg, st = s.cfg, s.state
    gen = cfg.generation()
    val_end = validate(s)
    s.log({"event": "eval", "step": cfg.steps, **val_end})
    save_checkpoint(s, finished=True)
    save_pretrained(s.policy, os.path.join(cfg.out, "policy"), s.tok)

    test = {}
    if s.test and st.test_start is not None:
        test = heldout_report(st.test_start, evaluate_test(s.engine, s.test, s.tok, gen, cfg.test_samples, cfg.seed))
    eq = {"equivalence": None, "equivalence_pass": None, "equivalence_min_pvalue": None,
          "equivalence_control_rejected": None}
    t_eq = time.perf_counter()
    if cfg.equivalence and s.drafter is not None:
        from .equivalence import EquivalenceConfig, check_equivalence

        eq_cfg = EquivalenceConfig(num_prompts=cfg.equivalence_prompts, samples_per_prompt=cfg.equivalence_samples,
                                   seed=cfg.seed, generation=gen)
        result = check_equivalence(s.engine, s.val, s.tok, eq_cfg)
        with open(os.path.join(cfg.out, "equivalence.json"), "w") as f:
            json.dump({**result, "provenance": provenance()}, f, indent=1)
        eq = {"equivalence": result["equivalence"], "equivalence_pass": result["pass"],
              "equivalence_min_pvalue": result["min_pvalue"],
              "equivalence_control_rejected": result["control_rejected"],
              "equivalence_power_tv": result["power"]["tv"],
              "equivalence_power": result["power"]["two_sample_power"]}
    equivalence_s = time.perf_counter() - t_eq

    figures = summary_figures(st)
    engine_info = s.engine.summary()
    protocol = protocol_figures(st, time.perf_counter() - t_run, equivalence_s)
    summary = {
        **{k: figures.pop(k) for k in ("rollout_speedup", "step_speedup", "mean_accepted_length",
                                       "acceptance_by_position")},
        **{k: protocol.pop(k) for k in ("rollout_speedup_ci", "step_speedup_ci", "end_to_end_speedup",
                                        "break_even_steps")},
        "rollout_temperature": cfg.temperature,
        "ar_baseline": ar_baseline(engine_info.get("decode_path", cfg.backend), gen.backend),
        **eq,
        **test,
        "val_accuracy_start": st.val_accuracy_start,
        "val_accuracy_end": val_end["val_accuracy"],
        "val_greedy_accuracy_start": st.val_greedy_accuracy_start,
        "val_greedy_accuracy_end": val_end["val_greedy_accuracy"],
        "eval_samples": cfg.eval_samples,
        "k": cfg.k,
        "spec": cfg.spec, "drafter": cfg.drafter, "pipeline": cfg.pipeline, "backend": cfg.backend,
        "workload": cfg.workload, "verify": cfg.verify,
        "verify_backend": gen.backend, "steps": cfg.steps, "seed": cfg.seed,
        **figures,
        **protocol,
        "equivalence_s": equivalence_s,
        "output_gain_end": float(s.policy.model.norm.weight.detach().mean()),  # the policy's learned sharpness
        **engine_info,
        **(extra or {}),
        "config": asdict(cfg),
        "provenance": provenance(),
        "wall_s": time.perf_counter() - t_run,
    }
    with open(os.path.join(cfg.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if cfg.plots:
        from .reports import make_plots

        make_plots(cfg.out)
    return summary


def evaluate(engine: Engine, problems: list[Problem], tok: CharTokenizer, gen: GenerationConfig,
             samples: int = 0, seed: int = 0) -> float:
    """Accuracy on ``problems``; speculation is lossless, so any spec mode works.

    ``samples=0``: greedy (temperature 0). Otherwise the mean over ``samples`` responses per problem at
    ``gen.temperature``, drawn with Philox keys fixed by ``seed``: every evaluation of a run uses the same
    keys, so two evaluations differ by the policy, not by the draw.
    """
    if samples:
        problems = [p for p in problems for _ in range(samples)]
        seeds = request_seeds(seed, -1, len(problems))  # step -1: never a training step's keys
    else:
        seeds, gen = [0] * len(problems), replace(gen, temperature=0.0)
    prompts = [tok.encode(p.prompt, bos=True) for p in problems]
    rewards = score(problems, engine.generate(prompts, seeds, gen), tok)
    return int((rewards == 1.0).sum()) / max(len(rewards), 1)


def validate(s: Session) -> dict:
    """``val_accuracy`` (see ``RunConfig.eval_samples``; greedy when it is 0) and ``val_greedy_accuracy`` of
    the current policy on the validation problems."""
    cfg, gen = s.cfg, s.cfg.generation()
    greedy = evaluate(s.engine, s.val, s.tok, gen)
    sampled = evaluate(s.engine, s.val, s.tok, gen, cfg.eval_samples, cfg.seed) if cfg.eval_samples else greedy
    return {"val_accuracy": sampled, "val_greedy_accuracy": greedy}


def evaluate_start(s: Session) -> None:
    """The start-of-run validation (once per run: a resumed run keeps its first one)."""
    st = s.state
    if st.val_accuracy_start is None:
        v = validate(s)
        st.val_accuracy_start, st.val_greedy_accuracy_start = v["val_accuracy"], v["val_greedy_accuracy"]
        s.log({"event": "eval", "step": 0, **v})
    if st.test_start is None and s.test:
        st.test_start = evaluate_test(s.engine, s.test, s.tok, s.cfg.generation(), s.cfg.test_samples, s.cfg.seed)


TEST_STEP = -2  # Philox keys of the test evaluation: never a training step's (>= 0) nor validation's (-1)


def make_test_split(task: TaskConfig, num_test: int, exclude: list[Problem]) -> list[Problem]:
    """``num_test`` distinct problems of the task's families and difficulties, none of whose prompts is in
    ``exclude`` (the run's train + validation problems)."""
    if num_test < 0:
        raise ValueError(f"num_test must be >= 0, got {num_test}")
    rng = random.Random(f"test/{task.seed}")
    seen = {p.prompt for p in exclude}
    out: list[Problem] = []
    attempts = 0
    while len(out) < num_test:
        attempts += 1
        if attempts > 200 * (num_test + 1):
            raise ValueError("not enough distinct problems outside train and validation for num_test")
        p = make_problem(rng, rng.choice(task.families), rng.choice(task.difficulties))
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return out


def correctness(engine: Engine, problems: list[Problem], tok: CharTokenizer, gen: GenerationConfig,
                samples: int, seed: int) -> np.ndarray:
    """[P, samples] 0/1 exact-answer correctness of ``samples`` responses per problem at ``gen.temperature``
    (fixed Philox keys from ``seed``: the start and end evaluations draw with the same keys), or [P, 1]
    greedy when ``samples`` is 0."""
    if samples:
        many = [p for p in problems for _ in range(samples)]
        seeds = request_seeds(seed, TEST_STEP, len(many))
    else:
        many, seeds, gen = problems, [0] * len(problems), replace(gen, temperature=0.0)
    prompts = [tok.encode(p.prompt, bos=True) for p in many]
    rewards = score(many, engine.generate(prompts, seeds, gen), tok).numpy()
    return (rewards == 1.0).astype(np.int8).reshape(len(problems), max(samples, 1))


def evaluate_test(engine: Engine, problems: list[Problem], tok: CharTokenizer, gen: GenerationConfig,
                  samples: int, seed: int) -> dict:
    """The sampled and greedy correctness matrices of the test split (lists, for the checkpoint)."""
    return {"sampled": correctness(engine, problems, tok, gen, samples, seed).tolist(),
            "greedy": correctness(engine, problems, tok, gen, 0, seed).tolist()}


def heldout_report(start: dict, end: dict) -> dict:
    """``summary.json``'s test-split figures from the start and end :func:`evaluate_test` results."""
    s, e = np.array(start["sampled"]), np.array(end["sampled"])
    gs, ge = np.array(start["greedy"]), np.array(end["greedy"])
    cs, ce = clustered_mean(s), clustered_mean(e)
    m = s.shape[1]
    return {
        "test_problems": int(s.shape[0]), "test_samples_per_problem": int(m),
        "test_accuracy_start": cs["mean"], "test_accuracy_start_se": cs["se"],
        "test_accuracy_end": ce["mean"], "test_accuracy_end_se": ce["se"],
        "test_accuracy_change": paired_change(s, e),
        "test_greedy_accuracy_start": float(gs.mean()), "test_greedy_accuracy_end": float(ge.mean()),
        "test_greedy_accuracy_change": paired_change(gs, ge),
        f"test_pass_at_{m}_start": pass_at_k(s, m), f"test_pass_at_{m}_end": pass_at_k(e, m),
    }
