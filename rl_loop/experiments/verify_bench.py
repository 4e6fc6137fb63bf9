"""Rollout speed and acceptance of one policy + drafter snapshot per verification method.

``python -m rl_loop.experiments.verify_bench --run DIR [--rounds 20] [--out FILE]`` loads ``DIR/checkpoint.pt`` (written by
``python -m rl_loop``; a finished or running run, which it does not change) and generates one GRPO step's
requests (``prompts_per_step`` prompts x ``group_size``, the run's temperature, ``max_new_tokens`` and
``max_batch``) with five arms on the one :class:`~rl_loop.step.engine.RolloutEngine`:

- ``autoregressive``;
- ``chain_token`` / ``chain_block``: a chain of k drafts verified token by token / with block verification;
- ``tree_token`` / ``tree_traversal``: the run's draft tree of depth k (``TreeShape.for_k``) verified by the
  token-level walk / with traversal verification.

Protocol: round r draws a fresh step's prompts and Philox keys (``rollouts.step_requests`` at step
``100_000 + r``, never a training step) and runs every arm on them, so the arms of a round sample the same
requests; arms are interleaved, in one order on even rounds and the reverse on odd rounds, after one untimed
warm-up pass of every arm. Per arm: the mean accepted length (tokens per verification round, pooled over the
rounds), tokens per second, and the rollout speedup (the arm's tokens/s over the autoregressive tokens/s,
pooled over the rounds), each with its per-round values and a 95 % percentile bootstrap interval over rounds;
and the paired gains block - token (chains) and traversal - token (trees) in accepted length. Then an untimed
pass reruns the chain_token arm on every round's requests with each stochastic chain verification also scored
exactly: the expected number of accepted drafts given the drafts, for token level and for block verification
on the very same drafts (``exact_verify.chain_conditional_accepted``; the coins integrated out). Its gain is
the measured gain without the coins' noise, which at high acceptance hides a small gain. Writes
``DIR/verify_methods.json`` (or ``--out``) with the settings and provenance (commit, date, CPU, threads,
command). Timings are only meaningful alone on the machine.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from unittest import mock

import numpy as np
import torch

import specdec_kernels as sk
from specdec_kernels.exactness.exact_verify import chain_conditional_accepted
from specdec_kernels.reference.sampling import target_probs

from ..run.checks import check_verify_backend
from ..run.intervals import bootstrap_ci, ratio_of_rates
from ..run.provenance import provenance
from ..run.session import setup
from ..run.usage import OneLineParser, UsageError
from ..step.rollouts import GenerationConfig, RolloutStats, step_requests
from .bench import load_run_config

PROG = "python -m rl_loop.experiments.verify_bench"
ARMS = (("autoregressive", "none", "token"), ("chain_token", "chain", "token"), ("chain_block", "chain", "block"),
        ("tree_token", "tree", "token"), ("tree_traversal", "tree", "traversal"))
GAINS = (("block_minus_token", "chain_block", "chain_token"), ("traversal_minus_token", "tree_traversal", "tree_token"))
FIRST_ROUND_STEP = 100_000  # rounds draw the requests of steps no run reaches


def arm_configs(base: GenerationConfig) -> dict[str, GenerationConfig]:
    """The generation config of every arm (``ARMS``) from the run's own."""
    return {name: replace(base, spec=spec, verify=verify) for name, spec, verify in ARMS}


def _accepted(data: np.ndarray) -> float:
    """Columns (emitted, rounds): tokens per verification round over the resampled rounds."""
    return float(data[:, 0].sum() / max(data[:, 1].sum(), 1))


def _gain(data: np.ndarray) -> float:
    """Columns (emitted a, rounds a, emitted b, rounds b): accepted length of a minus b."""
    return _accepted(data[:, :2]) - _accepted(data[:, 2:])


def summarize(stats: dict[str, list[RolloutStats]]) -> dict:
    """Per-arm figures and the paired gains from each arm's per-round stats (same rounds for every arm)."""
    ar = stats["autoregressive"]
    arms = {}
    for name, rows in stats.items():
        acc = np.array([[s.emitted_per_round, s.rounds] for s in rows], dtype=float)
        rate = np.array([[s.tokens, s.time_s, a.tokens, a.time_s] for s, a in zip(rows, ar, strict=True)])
        arms[name] = {
            "mean_accepted_length": _accepted(acc) if name != "autoregressive" else 1.0,
            "mean_accepted_length_ci": bootstrap_ci(acc, _accepted) if name != "autoregressive" else None,
            "mean_accepted_length_per_round": [s.mean_accepted_length for s in rows],
            "tokens_per_s": float(rate[:, 0].sum() / rate[:, 1].sum()),
            "tokens_per_s_per_round": [s.tokens_per_s for s in rows],
            "rollout_speedup": ratio_of_rates(rate),
            "rollout_speedup_ci": bootstrap_ci(rate, ratio_of_rates),
            "rollout_speedup_per_round": [s.tokens_per_s / a.tokens_per_s for s, a in zip(rows, ar, strict=True)],
            "acceptance_by_position": _pooled(rows).acceptance_by_position,
            "tokens": int(rate[:, 0].sum()), "time_s": float(rate[:, 1].sum()),
        }
    gains = {}
    for key, a, b in GAINS:
        paired = np.array([[x.emitted_per_round, x.rounds, y.emitted_per_round, y.rounds]
                           for x, y in zip(stats[a], stats[b], strict=True)], dtype=float)
        gains[key] = {"accepted_length_gain": _gain(paired), "ci": bootstrap_ci(paired, _gain),
                      "per_round": [x.mean_accepted_length - y.mean_accepted_length
                                    for x, y in zip(stats[a], stats[b], strict=True)]}
    return {"arms": arms, "gains": gains}


class ConditionalRecorder:
    """Stands in for ``specdec_kernels.verify_chain`` during the untimed pass: every call with stochastic drafts
    is scored exactly (expected accepted drafts given the drafts, token level and block) before the real call
    runs. ``sums`` = (token, block, chains scored); greedy requests (temperature 0) are not scored."""

    def __init__(self, real) -> None:
        self.real = real
        self.sums = np.zeros(3)

    def __call__(self, target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
                 top_k=None, top_p=None, seed=None, position=None, backend="auto", **kwargs):
        if draft_probs is not None and temperature is not None and cu_num_draft_tokens.numel() > 1:
            self._score(target_logits, draft_token_ids, cu_num_draft_tokens.to(torch.int64), draft_probs,
                        temperature, top_k, top_p)
        return self.real(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
                         seed, position, backend, **kwargs)

    def _score(self, logits, drafts, cu, q, temperature, top_k, top_p) -> None:
        b = cu.numel() - 1
        k = int(cu[1] - cu[0])
        if k == 0 or not bool(((cu[1:] - cu[:-1]) == k).all()):
            raise ValueError("ConditionalRecorder scores chains of one length per call (rl_loop's chains)")
        sampled = temperature > 0
        if not bool(sampled.any()):
            return
        rows = lambda x: None if x is None else x[sampled].repeat_interleave(k + 1)  # noqa: E731
        p = target_probs(logits.view(b, k + 1, -1)[sampled].reshape(-1, logits.shape[-1]).float(),
                         rows(temperature), rows(top_k), rows(top_p)).view(-1, k + 1, logits.shape[-1])
        exp = chain_conditional_accepted(p, q.view(b, k, -1)[sampled], drafts.view(b, k)[sampled])
        self.sums += [float(exp["token"].sum()), float(exp["block"].sum()), int(sampled.sum())]


def summarize_conditional(per_round: np.ndarray) -> dict:
    """Rows (token sum, block sum, chains) per round: pooled means, the block - token gain and 95 % intervals."""
    mean = lambda col: lambda d: float(d[:, col].sum() / max(d[:, 2].sum(), 1))  # noqa: E731
    gain = lambda d: float((d[:, 1].sum() - d[:, 0].sum()) / max(d[:, 2].sum(), 1))  # noqa: E731
    return {"token_expected_accepted_drafts": mean(0)(per_round), "token_ci": bootstrap_ci(per_round, mean(0)),
            "block_expected_accepted_drafts": mean(1)(per_round), "block_ci": bootstrap_ci(per_round, mean(1)),
            "block_minus_token": gain(per_round), "block_minus_token_ci": bootstrap_ci(per_round, gain),
            "chains_scored": int(per_round[:, 2].sum()),
            "per_round": [[float(x) for x in row] for row in per_round]}


def _pooled(rows: list[RolloutStats]) -> RolloutStats:
    total = RolloutStats()
    for s in rows:
        total.merge(s)
    return total


def measure(run_dir: str, rounds: int = 20, threads: int | None = None, verify_backend: str | None = None
            ) -> dict:
    """Run the protocol of the module docstring on ``run_dir``'s checkpoint; returns the report (JSON-able).
    A :class:`UsageError` (one line in the CLI) when the run cannot be benchmarked as asked."""
    if rounds < 3:
        raise UsageError(f"--rounds must be >= 3 (interleaved, order alternated, repeated), got {rounds}")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    if verify_backend is not None:
        check_verify_backend(verify_backend)
    if not os.path.isfile(os.path.join(run_dir, "checkpoint.pt")):
        raise UsageError(f"--run {run_dir} holds no checkpoint.pt (a python -m rl_loop output directory)")
    cfg = load_run_config(run_dir)
    if cfg.spec == "none":
        raise UsageError(f"--run {run_dir} has no drafter (a --spec none run); benchmark a speculative run")
    # the checkpoint's weights on our engine (a vLLM run's too), its drafter loaded (spec != none)
    cfg = replace(cfg, out=run_dir, resume=True, backend="own", rollout_workers=1,
                  num_threads=cfg.num_threads if threads is None else threads,
                  verify_backend=cfg.verify_backend if verify_backend is None else verify_backend)
    torch.set_num_threads(cfg.num_threads)
    s = setup(cfg, lambda row: None)
    configs = arm_configs(cfg.generation())
    order = list(configs)
    _, prompts, seeds = step_requests(cfg.seed, cfg.prompts_per_step, cfg.group_size, s.train, s.tok, FIRST_ROUND_STEP - 1)
    for name in order:  # untimed warm-up: allocator, caches, lazily built kernels
        s.engine.generate(prompts[: cfg.max_batch], seeds[: cfg.max_batch], configs[name])
    stats: dict[str, list[RolloutStats]] = {name: [] for name in order}
    for r in range(rounds):
        _, prompts, seeds = step_requests(cfg.seed, cfg.prompts_per_step, cfg.group_size, s.train, s.tok, FIRST_ROUND_STEP + r)
        for name in order if r % 2 == 0 else order[::-1]:
            stats[name].append(s.engine.generate(prompts, seeds, configs[name]).stats)
    scored = []
    for r in range(rounds):  # untimed: the chain_token arm again, each stochastic verification scored exactly
        _, prompts, seeds = step_requests(cfg.seed, cfg.prompts_per_step, cfg.group_size, s.train, s.tok, FIRST_ROUND_STEP + r)
        recorder = ConditionalRecorder(sk.verify_chain)
        with mock.patch.object(sk, "verify_chain", recorder):
            s.engine.generate(prompts, seeds, configs["chain_token"])
        scored.append(recorder.sums.copy())
    gen = configs["tree_token"]
    return {
        **summarize(stats),
        "conditional_chain": summarize_conditional(np.array(scored)),
        "settings": {"rounds": rounds, "requests_per_round": len(prompts), "prompts_per_round": cfg.prompts_per_step,
                     "group_size": cfg.group_size, "temperature": gen.temperature, "k": gen.k,
                     "tree": {"depth": gen.tree_shape.depth, "top_k": gen.tree_shape.top_k,
                              "beam": gen.tree_shape.beam, "draft_nodes": gen.tree_shape.num_nodes - 1},
                     "max_new_tokens": gen.max_new_tokens, "max_batch": gen.max_batch,
                     "verify_backend": gen.backend, "decode_path": s.engine.summary().get("decode_path"),
                     "drafter": cfg.drafter, "run_spec": cfg.spec, "run_verify": cfg.verify,
                     "checkpoint_step": s.state.step, "threads": torch.get_num_threads(),
                     "order": order, "first_round_step": FIRST_ROUND_STEP},
        "provenance": provenance(),
    }


def table(report: dict) -> str:
    """The report as a markdown table (figures with their 95 % intervals over rounds)."""
    def ci(v: list[float] | None, fmt: str) -> str:
        return "" if v is None else f" [{v[0]:{fmt}}, {v[1]:{fmt}}]"

    lines = ["| arm | mean accepted length | tokens/s | rollout speedup vs AR |", "|---|---|---|---|"]
    for name, a in report["arms"].items():
        lines.append(f"| {name} | {a['mean_accepted_length']:.3f}{ci(a['mean_accepted_length_ci'], '.3f')} | "
                     f"{a['tokens_per_s']:.0f} (rounds {min(a['tokens_per_s_per_round']):.0f}-"
                     f"{max(a['tokens_per_s_per_round']):.0f}) | "
                     f"{a['rollout_speedup']:.3f}x{ci(a['rollout_speedup_ci'], '.3f')} |")
    for key, g in report["gains"].items():
        lines.append(f"{key}: {g['accepted_length_gain']:+.4f}{ci(g['ci'], '+.4f')} tokens per round")
    c = report.get("conditional_chain")
    if c:
        lines.append(f"given the drafts (chain_token arm, {c['chains_scored']} chains): token "
                     f"{c['token_expected_accepted_drafts']:.4f}{ci(c['token_ci'], '.4f')}, block "
                     f"{c['block_expected_accepted_drafts']:.4f}{ci(c['block_ci'], '.4f')} expected accepted drafts; "
                     f"block - token {c['block_minus_token']:+.5f}{ci(c['block_minus_token_ci'], '+.5f')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a python -m rl_loop output directory (with checkpoint.pt)")
    p.add_argument("--rounds", type=int, default=20, help="rounds of all five arms (>= 3)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the run's)")
    p.add_argument("--verify-backend", default=None, help="specdec_kernels backend (default: the run's)")
    p.add_argument("--out", default=None, help="report path (default: RUN/verify_methods.json)")
    a = p.parse_args(argv)
    try:
        report = measure(a.run, a.rounds, a.threads, a.verify_backend)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    out = a.out or os.path.join(a.run, "verify_methods.json")
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
