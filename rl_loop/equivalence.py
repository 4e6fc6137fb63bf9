"""Autoregressive vs speculative rollouts of one policy snapshot: identical at temperature 0, equal in law at 1.

``python -m rl_loop.equivalence --out DIR`` builds a policy (warm start) and drafter, or loads
``--policy DIR`` (a directory written by ``save_pretrained``), and writes ``DIR/equivalence.json``.

Tests (on one prompt set, the same number of samples per prompt in both arms, independent Philox keys):

- temperature 0: every response token-identical (exact check, no statistics);
- temperature 1, two-sample tests between the arms, each at ``alpha / number_of_tests`` (Bonferroni):
  chi-square on the token histogram at each of the first ``positions`` response positions (end of
  sequence is its own cell), chi-square on the response-length and reward histograms, and a two-sample
  Kolmogorov-Smirnov test on the sequence log-probability under the policy;
- a negative control: the same tests between autoregressive sampling at temperature 1 and at
  ``control_temperature`` must reject (shows the tests can fail on this data size);
- power: the chi-square power to detect a total-variation difference ``power_tv`` per position test.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from scipy import stats as sps

from specdec_kernels.testing.stats import chi2_power, two_sample_chi2

from .batch import build_batch
from .logprobs import policy_log_probs
from .rollouts import GenerationConfig, Rollouts
from .state import Engine
from .task import CharTokenizer, Problem, reward


@dataclass(frozen=True)
class EquivalenceConfig:
    num_prompts: int = 16
    samples_per_prompt: int = 24
    positions: int = 8
    alpha: float = 0.01  # family-wise false-positive rate of the temperature-1 tests
    power_tv: float = 0.15
    control_temperature: float = 1.6
    seed: int = 0
    generation: GenerationConfig = field(default_factory=GenerationConfig)


def _two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """(p-value, df) of the chi-square two-sample test of two histograms."""
    res = two_sample_chi2(a, b)
    return res.pvalue, res.df


def _sequence_log_probs(engine: Engine, prompts: list[list[int]], out: Rollouts, tok: CharTokenizer) -> np.ndarray:
    ids, mask = build_batch(prompts, out.response_ids, out.finished, tok)
    with torch.no_grad():
        lp = policy_log_probs(engine.policy, ids)
    return (lp * mask).sum(1).numpy()


def _features(out: Rollouts, problems: list[Problem], tok: CharTokenizer, positions: int) -> dict:
    v = tok.vocab_size
    end = v  # extra cell: the sequence already ended at this position (EOS or cap)
    tokens = np.full((len(out.response_ids), positions), end)
    for i, (r, f) in enumerate(zip(out.response_ids, out.finished, strict=True)):
        seq = (r + ([tok.eos_id] if f else []))[:positions]
        tokens[i, : len(seq)] = seq
    lengths = np.array([len(r) + int(f) for r, f in zip(out.response_ids, out.finished, strict=True)])
    rewards = np.array([reward(p, tok.decode(r), f) for p, r, f in
                        zip(problems, out.response_ids, out.finished, strict=True)])
    return {"tokens": tokens, "lengths": lengths, "rewards": rewards}


def compare_laws(fa: dict, fb: dict, lp_a: np.ndarray, lp_b: np.ndarray, positions: int, vocab: int) -> dict:
    """Every two-sample test between feature sets ``fa`` and ``fb``: {name: p-value}, and the max df."""
    pvalues: dict[str, float] = {}
    max_df = 1
    for j in range(positions):
        ca = np.bincount(fa["tokens"][:, j], minlength=vocab + 1)
        cb = np.bincount(fb["tokens"][:, j], minlength=vocab + 1)
        p, df = _two_sample(ca, cb)
        pvalues[f"token_at_{j}"] = p
        max_df = max(max_df, df)
    top = int(max(fa["lengths"].max(), fb["lengths"].max())) + 1
    pvalues["length"] = _two_sample(np.bincount(fa["lengths"], minlength=top),
                                    np.bincount(fb["lengths"], minlength=top))[0]
    cells = np.array([0.0, 0.1, 1.0])
    ra = np.array([(fa["rewards"] == c).sum() for c in cells])
    rb = np.array([(fb["rewards"] == c).sum() for c in cells])
    pvalues["reward"] = _two_sample(ra, rb)[0]
    pvalues["sequence_logprob"] = float(sps.ks_2samp(lp_a, lp_b).pvalue)
    return {"pvalues": pvalues, "max_df": max_df}


def check_equivalence(
    engine: Engine, problems: list[Problem], tok: CharTokenizer, cfg: EquivalenceConfig
) -> dict:
    """Run the checks of the module docstring on ``problems[:num_prompts]``; returns a JSON-able report."""
    if cfg.generation.spec == "none":
        raise ValueError("the equivalence check compares speculative rollouts: generation.spec must not be 'none'")
    probs = problems[: cfg.num_prompts]
    # temperature 0: exact
    prompts0 = [tok.encode(p.prompt, bos=True) for p in probs]
    greedy_cfg = replace(cfg.generation, temperature=0.0)
    ar0 = engine.generate(prompts0, [0] * len(prompts0), replace(greedy_cfg, spec="none"))
    sp0 = engine.generate(prompts0, [0] * len(prompts0), greedy_cfg)
    greedy_identical = ar0.response_ids == sp0.response_ids and ar0.finished == sp0.finished
    # temperature 1: equal in law
    many = [p for p in probs for _ in range(cfg.samples_per_prompt)]
    prompts = [tok.encode(p.prompt, bos=True) for p in many]
    rng = np.random.default_rng(cfg.seed)
    seeds = rng.integers(0, 2**62, size=(3, len(prompts))).tolist()
    sample_cfg = replace(cfg.generation, temperature=1.0)
    ar = engine.generate(prompts, seeds[0], replace(sample_cfg, spec="none"))
    sp = engine.generate(prompts, seeds[1], sample_cfg)
    ctrl = engine.generate(prompts, seeds[2], replace(sample_cfg, spec="none", temperature=cfg.control_temperature))
    fa, fs, fc = (_features(x, many, tok, cfg.positions) for x in (ar, sp, ctrl))
    lp_a, lp_s, lp_c = (_sequence_log_probs(engine, prompts, x, tok) for x in (ar, sp, ctrl))
    main = compare_laws(fa, fs, lp_a, lp_s, cfg.positions, tok.vocab_size)
    control = compare_laws(fa, fc, lp_a, lp_c, cfg.positions, tok.vocab_size)
    n_tests = len(main["pvalues"])
    alpha_each = cfg.alpha / n_tests
    min_p = min(main["pvalues"].values())
    power = chi2_power(len(prompts), cfg.power_tv, max(main["max_df"], 1), alpha_each)
    law_pass = min_p >= alpha_each
    return {
        "pass": bool(greedy_identical and law_pass),
        "greedy_identical": bool(greedy_identical),
        "law_pass": bool(law_pass),
        "min_pvalue": float(min_p),
        "alpha_familywise": cfg.alpha,
        "alpha_per_test": alpha_each,
        "pvalues": main["pvalues"],
        "samples_per_arm": len(prompts),
        "power": {"tv": cfg.power_tv, "per_position_chi2_power": power, "df_bound": main["max_df"],
                  "statement": f"each per-position chi-square test detects a total-variation difference >= "
                               f"{cfg.power_tv} with probability >= {round(power, 4)} "
                               f"at level {alpha_each:.2g}"},
        "negative_control": {
            "temperature": cfg.control_temperature,
            "min_pvalue": float(min(control["pvalues"].values())),
            "rejected": bool(min(control["pvalues"].values()) < alpha_each),
            "pvalues": control["pvalues"],
        },
        "speculative_mean_accepted_length": sp.stats.mean_accepted_length,
        "k": cfg.generation.k,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_loop.equivalence", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/equivalence", help="output directory (default: runs/equivalence)")
    parser.add_argument("--policy", default=None, help="policy directory from save_pretrained (default: warm start)")
    parser.add_argument("--drafter", default="eagle3", choices=("eagle3", "mtp", "draft_model"))
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=24, help="samples per prompt and arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="seconds-long configuration (tests)")
    args = parser.parse_args(argv)

    from specdec_kernels.models import Qwen3, load_pretrained

    from .config import RunConfig, tiny_config
    from .drafting import build_drafter, problem_batches, warm_start
    from .engine import RolloutEngine
    from .model import supervised_warm_start
    from .task import make_splits

    cfg = tiny_config() if args.tiny else RunConfig()
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(args.seed)
    tok = CharTokenizer()
    train_set, val_set = make_splits(replace(cfg.task, seed=args.seed))
    if args.policy:
        policy = load_pretrained(args.policy)
    else:
        policy = Qwen3(cfg.model)
        supervised_warm_start(policy, train_set, tok, cfg.warm_start_steps, cfg.warm_start_batch,
                              cfg.warm_start_lr, args.seed)
    policy.eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    drafter = build_drafter(args.drafter, policy, args.seed)
    warm_start(drafter, policy, problem_batches(train_set, tok, cfg.warm_start_batch, args.seed + 1),
               cfg.drafter_warm_steps, cfg.drafter_warm_lr, unroll=args.k - 1)
    engine = RolloutEngine(policy, drafter, tok.eos_id)
    eq_cfg = EquivalenceConfig(num_prompts=args.prompts, samples_per_prompt=args.samples, seed=args.seed,
                               generation=replace(cfg.generation(), k=args.k))
    result = check_equivalence(engine, val_set, tok, eq_cfg)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "equivalence.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("pass", "greedy_identical", "law_pass", "min_pvalue")}))
    print(result["power"]["statement"])
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
