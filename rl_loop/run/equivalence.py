"""Autoregressive vs speculative rollouts of one policy snapshot: identical at temperature 0, equal in law at 1.

``python -m rl_loop.run.equivalence --out DIR`` builds a policy (warm start) and drafter, or loads
``--policy DIR`` (a directory written by ``save_pretrained``), and writes ``DIR/equivalence.json``.

Tests (on one prompt set, the same number of samples per prompt in both arms, independent Philox keys):

- temperature 0: every response token-identical (exact check, no statistics);
- temperature 1, two-sample tests between the arms, each at ``alpha / number_of_tests`` (Bonferroni):
  chi-square on the token histogram at each of the first ``positions`` response positions (end of
  sequence is its own cell), chi-square on the response-length and reward histograms, and a two-sample
  Kolmogorov-Smirnov test on the sequence log-probability under the policy;
- a planted lossy verifier as the negative control, in the same run: chain speculation whose verifier is
  handed the target's own probabilities as the draft probabilities (the draft-prob / target mix-up bug:
  every draft is accepted, so the emitted law is the drafter's, not the policy's). The same tests between
  the autoregressive arm and this arm must reject (a check that cannot fail proves nothing). The control
  runs on every backend: an engine that cannot plant a verifier (vLLM) has its policy and drafter run by
  our engine for the control arm. Optionally (``control_temperature``) a second control samples the
  autoregressive arm at another temperature;
- power: the two-sample chi-square power (``stats.two_sample_chi2_power``: effective size n / 2 for two
  arms of n) to detect a total-variation difference ``power_tv`` per position test; the default sample
  size (16 prompts x 160 samples = 2560 per arm) gives >= 0.9 at TV 0.1 for up to 32 degrees of freedom.

The verdict, ``equivalence`` (:func:`verdict`), is the same on every backend: ``"fail"`` when a real check
rejects (greedy rollouts differ, or a temperature-1 test rejects); otherwise ``"underpowered"`` when the
planted control is not rejected (the sample is too small to decide: a ``--tiny`` run's 16 per arm), and
``"pass"`` when it is. ``pass`` is True / False / None (underpowered) for older consumers.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from scipy import stats as sps

import specdec_kernels as sk
from specdec_kernels.exactness.goodness_of_fit import two_sample_chi2

from ..step.engine import RolloutEngine
from ..step.learn import policy_log_probs
from ..step.rollouts import GenerationConfig, Rollouts, build_batch
from ..step.strategies import ChainSpeculation, Proposal, Verified
from ..task import CharTokenizer, Problem, reward
from .intervals import two_sample_chi2_power
from .provenance import provenance
from .state import Engine
from .usage import OneLineParser


@dataclass(frozen=True)
class EquivalenceConfig:
    num_prompts: int = 16
    samples_per_prompt: int = 160
    positions: int = 8
    alpha: float = 0.01  # family-wise false-positive rate of the temperature-1 tests
    power_tv: float = 0.1
    control_temperature: float | None = None  # optional second control: AR at this temperature
    seed: int = 0
    generation: GenerationConfig = field(default_factory=GenerationConfig)


def _two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """(p-value, df) of the chi-square two-sample test of two histograms."""
    res = two_sample_chi2(a, b)
    return res.pvalue, res.df


def _sequence_log_probs(engine: Engine, prompts: list[list[int]], out: Rollouts, tok: CharTokenizer) -> np.ndarray:
    ids, mask = build_batch(prompts, out.response_ids, out.finished, tok)
    with torch.no_grad():
        lp = policy_log_probs(engine.policy, ids).cpu()
    return (lp * mask).sum(1).numpy()


def vocab_size(engine: Engine, tok: CharTokenizer) -> int:
    """The token histograms' cells: the policy's vocabulary (an LLM-shape policy's 151936 rows; its
    tokens past the task's are rare but countable), else the tokenizer's."""
    policy = getattr(engine, "policy", None)
    return max(tok.vocab_size, policy.config.vocab_size if policy is not None else 0)


def _features(out: Rollouts, problems: list[Problem], tok: CharTokenizer, positions: int, vocab: int) -> dict:
    end = vocab  # extra cell: the sequence already ended at this position (EOS or cap)
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


class LossyChain(ChainSpeculation):
    """The planted lossy verifier of the negative control: ``verify_chain`` gets the target's own
    probabilities in place of the drafts' (a draft-prob / target mix-up), so ``min(1, p / q) = 1`` and every
    draft is accepted: the emitted law is the drafter's."""

    def verify(self, logits: torch.Tensor, proposal: Proposal, temperature: torch.Tensor, seed: torch.Tensor,
               position: torch.Tensor, backend: str) -> Verified:
        tokens, cu, _ = proposal.drafts.flat()
        r, n, v = logits.shape
        wrong_q = torch.softmax(logits[:, : self.depth] / temperature[:, None, None], -1).reshape(-1, v)
        res = sk.verify_chain(logits.reshape(r * n, v), tokens, cu, draft_probs=wrong_q, temperature=temperature,
                              seed=seed, position=position, backend=backend, max_draft_len=self.depth)
        return Verified(res.output_token_ids, res.num_accepted, None)


def _control_report(control: dict, alpha_each: float) -> dict:
    min_p = float(min(control["pvalues"].values()))
    return {"min_pvalue": min_p, "rejected": bool(min_p < alpha_each), "pvalues": control["pvalues"]}


PASS, FAIL, UNDERPOWERED = "pass", "fail", "underpowered"


def verdict(greedy_identical: bool, law_pass: bool, control_rejected: bool | None) -> str:
    """``"fail"`` when a real check rejects; else ``"pass"`` if the planted lossy control was rejected (the
    sample had the power to see a loss), ``"underpowered"`` if it was not or none could be planted."""
    if not (greedy_identical and law_pass):
        return FAIL
    return PASS if control_rejected else UNDERPOWERED


def _control_engine(engine: Engine) -> Engine | None:
    """An engine that can run the planted lossy verifier on ``engine``'s policy and drafter: ``engine``
    itself when it is ours, our engine on its policy and drafter otherwise (vLLM), None without a drafter."""
    drafter = getattr(engine, "drafter", None)
    if drafter is None:
        return None
    if hasattr(engine, "policy_step"):
        return engine
    policy, eos_id = getattr(engine, "policy", None), getattr(engine, "eos_id", None)
    return None if policy is None or eos_id is None else RolloutEngine(policy, drafter, eos_id)


def check_equivalence(
    engine: Engine, problems: list[Problem], tok: CharTokenizer, cfg: EquivalenceConfig
) -> dict:
    """Run the checks of the module docstring on ``problems[:num_prompts]``; returns a JSON-able report.

    The planted lossy control runs on our engine (``engine.RolloutEngine``) with ``engine``'s drafter:
    ``engine`` itself, or one built on its policy and drafter (vLLM). ``equivalence`` is :func:`verdict`.
    """
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
    seeds = rng.integers(0, 2**62, size=(4, len(prompts))).tolist()
    sample_cfg = replace(cfg.generation, temperature=1.0)
    ar = engine.generate(prompts, seeds[0], replace(sample_cfg, spec="none"))
    sp = engine.generate(prompts, seeds[1], sample_cfg)
    vocab = vocab_size(engine, tok)
    fa, fs = (_features(x, many, tok, cfg.positions, vocab) for x in (ar, sp))
    lp_a, lp_s = (_sequence_log_probs(engine, prompts, x, tok) for x in (ar, sp))
    main = compare_laws(fa, fs, lp_a, lp_s, cfg.positions, vocab)
    n_tests = len(main["pvalues"])
    alpha_each = cfg.alpha / n_tests
    min_p = min(main["pvalues"].values())
    law_pass = min_p >= alpha_each

    def control_of(out: Rollouts) -> dict:
        f = _features(out, many, tok, cfg.positions, vocab)
        lp = _sequence_log_probs(engine, prompts, out, tok)
        return _control_report(compare_laws(fa, f, lp_a, lp, cfg.positions, vocab), alpha_each)

    lossy = None
    control_engine = _control_engine(engine)
    if control_engine is not None:  # plant the lossy verifier
        planted = LossyChain(control_engine.drafter, sample_cfg.k, sample_cfg.temperature)
        lossy_out = control_engine.generate(prompts, seeds[2], replace(sample_cfg, spec="chain", verify="token"),
                                            strategy=planted)
        lossy = {**control_of(lossy_out), "verifier": "verify_chain with the target's probabilities as draft_probs",
                 "mean_accepted_length": lossy_out.stats.mean_accepted_length}
    temperature_control = None
    if cfg.control_temperature is not None:
        ctrl = engine.generate(prompts, seeds[3], replace(sample_cfg, spec="none", temperature=cfg.control_temperature))
        temperature_control = {"temperature": cfg.control_temperature, **control_of(ctrl)}
    n = len(prompts)
    df = max(main["max_df"], 1)
    power = two_sample_chi2_power(n, n, cfg.power_tv, df, alpha_each)
    control_rejected = None if lossy is None else lossy["rejected"]
    outcome = verdict(bool(greedy_identical), bool(law_pass), control_rejected)
    return {
        "equivalence": outcome,
        "pass": None if outcome == UNDERPOWERED else outcome == PASS,
        "greedy_identical": bool(greedy_identical),
        "law_pass": bool(law_pass),
        "control_rejected": control_rejected,
        "min_pvalue": float(min_p),
        "alpha_familywise": cfg.alpha,
        "alpha_per_test": alpha_each,
        "pvalues": main["pvalues"],
        "samples_per_arm": n,
        "power": {"tv": cfg.power_tv, "two_sample_power": power, "df_bound": df,
                  "statement": f"each per-position two-sample chi-square test ({n} samples per arm) detects a "
                               f"total-variation difference >= {cfg.power_tv} with probability >= {round(power, 4)} "
                               f"at level {alpha_each:.2g}"},
        "negative_control": lossy,
        "temperature_control": temperature_control,
        "speculative_mean_accepted_length": sp.stats.mean_accepted_length,
        "k": cfg.generation.k,
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m rl_loop.run.equivalence", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/equivalence", help="output directory (default: runs/equivalence)")
    parser.add_argument("--policy", default=None, help="policy directory from save_pretrained (default: warm start)")
    parser.add_argument("--drafter", default="eagle3", choices=("eagle3", "mtp", "draft_model"))
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=160, help="samples per prompt and arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="seconds-long configuration (tests)")
    args = parser.parse_args(argv)

    from specdec_kernels.models import Qwen3, load_pretrained

    from ..config import RunConfig, tiny_config
    from ..step.drafting import build_drafter, problem_batches, warm_start
    from ..step.engine import RolloutEngine
    from ..step.learn import supervised_warm_start
    from ..task import make_splits

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
    engine = RolloutEngine(policy, drafter, tok.eos_id, cfg.decode)
    eq_cfg = EquivalenceConfig(num_prompts=args.prompts, samples_per_prompt=args.samples, seed=args.seed,
                               generation=replace(cfg.generation(), k=args.k))
    result = check_equivalence(engine, val_set, tok, eq_cfg)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "equivalence.json"), "w") as f:
        command = " ".join(["python -m rl_loop.run.equivalence", *(sys.argv[1:] if argv is None else argv)])
        json.dump({**result, "provenance": provenance(command)}, f, indent=1)
    print(json.dumps({k: result[k] for k in ("equivalence", "greedy_identical", "law_pass", "min_pvalue")}))
    print(result["power"]["statement"])
    return 0 if result["equivalence"] == PASS else 1


if __name__ == "__main__":
    raise SystemExit(main())
