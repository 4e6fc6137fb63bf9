"""Validation accuracy of the policy, through any rollout engine (speculation is lossless)."""

from __future__ import annotations

from dataclasses import replace

from ..step.batch import request_seeds, score
from ..step.rollouts import GenerationConfig
from ..task import CharTokenizer, Problem
from .heldout import evaluate_test
from .state import Engine, Session


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
