"""The held-out test split: problems never used to train, validate or choose a default, scored at the start
and the end of a run with per-problem (clustered) intervals, a paired interval of the change, greedy
accuracy and pass@k.

The split is drawn from its own random stream (``"test/<seed>"``) and excludes every prompt of the run's
train and validation splits, so no tuning decision (all made on validation accuracy) ever saw it.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np

from ..step.batch import request_seeds, score
from ..step.rollouts import GenerationConfig
from ..task import CharTokenizer, Problem, TaskConfig, make_problem
from .intervals import clustered_mean, paired_change, pass_at_k
from .state import Engine

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
