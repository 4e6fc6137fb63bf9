"""Drafter-head ops and a full EAGLE-3 propose round: eager torch vs the strongest alternative of the device.

Head ops (``specdec_kernels.drafters.head_ops``): ``norm_fc`` (per-chunk RMSNorm of the captured features +
``fc``), ``lm_head_top1`` / ``lm_head_top8`` (LM head over the draft vocabulary + top-k through ``d2t``),
``lm_head_sample_q`` (LM head, temperature 1, softmax, Gumbel draw on Philox stream 3 and the q row over the
target vocabulary). Providers: ``torch`` (the eager spec, under ``inference_mode``), ``torch_compile`` (the
same function under ``torch.compile(dynamic=False)``, compiled before timing) and ``triton`` (the fused
kernels; GPU only).

Propose round (``Eagle3Drafter.propose(k, temperature=1, seed, position)``: k sampled drafts and their q
rows per request, as an RL rollout asks): ``torch`` (``native=False``: each head step as torch ops),
``native`` (CPU: each head step as one ``specdec_kernels.native.decoder_step`` call) and ``triton`` (GPU:
``backend="triton"``). ``torch.compile`` of a propose round (Python cache bookkeeping between steps) is not
offered; ``bench_decoder_step`` times the compiled head step itself.

On CPU the Triton kernels run only under ``TRITON_INTERPRET=1``, whose timings mean nothing: their rows are
written with ``status = skipped: ...``. Every other provider is checked against eager torch: the same
target ids (``matches_torch``; ``norm_fc``: ``max_abs_diff``).

Protocol: every case is built and warmed up (compiled) first; then ``--rounds`` rounds each time every
case and every provider (``--reps`` calls, median), providers in one order on even rounds and reversed on
odd rounds (the case order too). A row gives min / median / max over rounds; ``vs_torch`` is the median
[min, max] over rounds of ``torch time / provider time``. Weights stay cache-resident, as in a rollout loop.

Shapes (CPU): rl_loop's EAGLE-3 head (policy hidden 96, 2 / 1 heads of 64, MLP 256, vocabulary 32 = the
draft vocabulary) and a wider head (hidden 512, 8 / 2 heads of 64, MLP 1536, vocabulary 8192, draft
vocabulary 2048), R = 32 requests (rl_loop's rollout batch), k = 3, 64-token prompts. GPU (``--device
cuda``): hidden 4096, draft vocabulary 32000, vocabulary 151936, bf16 ops.

Usage (the committed CSV; run alone on the machine)::

    python -m benchmarks.bench_drafter --out results/benchmarks/drafter_cpu.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.bench_decoder_step import allow_compiled_cases
from benchmarks.common import (
    CsvWriter,
    OneLineParser,
    parse_int_list,
    parse_str_list,
    provenance,
    require_positive,
)
from specdec_kernels import native as native_ext
from specdec_kernels.drafters import head_ops
from specdec_kernels.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head


@dataclass(frozen=True)
class HeadShape:
    vocab: int
    draft_vocab: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int = 64


HEADS = {
    "rl_loop": HeadShape(32, 32, 96, 256, 2, 1),
    "wide": HeadShape(8192, 2048, 512, 1536, 8, 2),
    "gpu": HeadShape(151936, 32000, 4096, 14336, 32, 8, 128),
}
OPS = ("norm_fc", "lm_head_top1", "lm_head_top8", "lm_head_sample_q")
OP_PROVIDERS = ("torch", "torch_compile", "triton")
PROPOSE_PROVIDERS = ("torch", "native", "triton")
CASE_COLUMNS = ("op", "head", "rows", "hidden", "draft_vocab", "vocab", "k", "temperature", "dtype", "threads")
RESULT_COLUMNS = ("max_ms", "rounds", "vs_torch", "vs_torch_min", "vs_torch_max", "matches_torch", "max_abs_diff",
                  "command")
SKIP_TRITON_CPU = "skipped: Triton on CPU runs only under TRITON_INTERPRET=1 (timings meaningless)"


@dataclass
class Case:
    row: dict
    calls: dict[str, Callable[[], object]] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    checks: dict[str, dict] = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inference(fn: Callable[[], object]) -> Callable[[], object]:
    def call() -> object:
        with torch.inference_mode():
            return fn()
    return call


def _check(name: str, out: object, ref: object) -> dict:
    if name == "norm_fc":
        return {"max_abs_diff": f"{float((out.float() - ref.float()).abs().max()):.2e}"}
    return {"matches_torch": "yes" if torch.equal(out, ref) else "no"}


def op_cases(shape: HeadShape, head: str, rows: int, dtype: torch.dtype, device: torch.device,
             providers: list[str], threads: int) -> list[Case]:
    g = torch.Generator().manual_seed(0)
    hid, vd, v = shape.hidden, shape.draft_vocab, shape.vocab
    x = (torch.randn(rows, 3 * hid, generator=g) * 2).to(device, dtype)
    nw = (torch.rand(3, hid, generator=g) + 0.5).to(device, dtype)
    fc = (torch.randn(hid, 3 * hid, generator=g) / (3 * hid) ** 0.5).to(device, dtype)
    h = torch.randn(rows, hid, generator=g).to(device, dtype)
    w = (torch.randn(vd, hid, generator=g) / hid**0.5).to(device, dtype)
    d2t = (torch.sort(torch.randperm(v, generator=g)[:vd]).values - torch.arange(vd)).to(device)
    temp = torch.ones(rows, device=device)
    seed = torch.arange(rows, device=device)
    pos = torch.full((rows,), 100, device=device, dtype=torch.int64)
    ops = {
        "norm_fc": lambda p: head_ops.fuse_features(x, nw, fc, 1e-6, p),
        "lm_head_top1": lambda p: head_ops.head_topk(h, w, d2t, 1, p).target_ids,
        "lm_head_top8": lambda p: head_ops.head_topk(h, w, d2t, 8, p).target_ids,
        "lm_head_sample_q": lambda p: head_ops.head_sample(h, w, d2t, v, temp, seed, pos, 1, p).target_ids,
    }
    cases = []
    for name, op in ops.items():
        case = Case({"op": name, "head": head, "rows": rows, "hidden": hid, "draft_vocab": vd, "vocab": v,
                     "temperature": 1 if name == "lm_head_sample_q" else "", "dtype": str(dtype).split(".")[-1],
                     "threads": threads})
        for p in providers:
            if p == "triton" and device.type != "cuda":
                case.status[p] = SKIP_TRITON_CPU
            elif p == "torch_compile":
                case.calls[p] = _inference(torch.compile(lambda op=op: op("torch"), dynamic=False))
            else:
                case.calls[p] = _inference(lambda op=op, p=p: op(p))
        cases.append(case)
    return cases


def propose_case(shape: HeadShape, head: str, batch: int, k: int, context: int, device: torch.device,
                 providers: list[str], threads: int) -> Case:
    torch.manual_seed(0)
    eagle = Eagle3Head(Eagle3Config(shape.vocab, shape.draft_vocab, shape.hidden, shape.hidden, shape.intermediate,
                                    shape.heads, shape.kv_heads, shape.head_dim)).to(device)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape.vocab, (batch, context), generator=g).to(device)
    feats = torch.randn(batch, context, eagle.feature_size, generator=g).to(device)
    temp = torch.ones(batch, device=device)
    seed = torch.arange(batch, device=device)
    case = Case({"op": f"eagle3_propose_k{k}", "head": head, "rows": batch, "hidden": shape.hidden,
                 "draft_vocab": shape.draft_vocab, "vocab": shape.vocab, "k": k, "temperature": 1,
                 "dtype": "float32", "threads": threads})
    for p in providers:
        if p == "triton" and device.type != "cuda":
            case.status[p] = SKIP_TRITON_CPU
            continue
        if p == "native" and (device.type != "cpu" or not native_ext.has_op("decoder_step", "cpu")):
            case.status[p] = "skipped: the native decoder step is a CPU op of the compiled extension"
            continue
        d = Eagle3Drafter(eagle, backend="triton" if p == "triton" else "torch", native=p == "native")
        with torch.inference_mode():
            d.prefill(ids, torch.full((batch,), context, device=device), ids[:, 0], feats)
        case.calls[p] = _inference(lambda d=d: d.propose(k, temp, seed).token_ids)
    return case


def _median_time(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(cases: list[Case], rounds: int, reps: int, device: torch.device) -> list[dict[str, list[float]]]:
    """Per case, per timed provider: the median seconds of ``reps`` calls in each round (interleaved, alternated)."""
    times: list[dict[str, list[float]]] = [{p: [] for p in c.calls} for c in cases]
    for r in range(rounds):
        order = list(range(len(cases)))
        for i in order if r % 2 == 0 else order[::-1]:
            names = list(cases[i].calls)
            for p in names if r % 2 == 0 else names[::-1]:
                times[i][p].append(_median_time(cases[i].calls[p], reps, device))
    return times


def _spread(values: list[float], fmt: str) -> tuple[str, str, str]:
    return fmt.format(statistics.median(values)), fmt.format(min(values)), fmt.format(max(values))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m benchmarks.bench_drafter", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--heads", type=parse_str_list, default=None, help="default rl_loop,wide (CPU), gpu (CUDA)")
    ap.add_argument("--rows", type=parse_int_list, default=[32], help="requests per op call / propose batch")
    ap.add_argument("--k", type=int, default=3, help="drafts per propose round")
    ap.add_argument("--context", type=int, default=64, help="prompt tokens prefilled before proposing")
    ap.add_argument("--threads", type=int, default=1, help="torch and OpenMP threads (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of the whole interleaved sweep")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per provider, case and round (median)")
    ap.add_argument("--providers", type=parse_str_list, default=["torch", "torch_compile", "native", "triton"])
    ap.add_argument("--skip-ops", action="store_true", help="time the propose round only")
    ap.add_argument("--out", required=True, help="CSV path (written when the sweep ends)")
    a = ap.parse_args(argv)
    a.heads = a.heads or (["gpu"] if a.device == "cuda" else ["rl_loop", "wide"])
    bad = [h for h in a.heads if h not in HEADS] + [p for p in a.providers if p not in OP_PROVIDERS + PROPOSE_PROVIDERS]
    if bad or "torch" not in a.providers:
        ap.error(f"--heads from {','.join(HEADS)}, --providers from torch,torch_compile,native,triton including "
                 f"torch (got {','.join(bad) or 'no torch'})")
    require_positive(ap, a, ("k", "context", "threads", "rounds", "reps"))
    if not a.rows or min(a.rows) < 1:
        ap.error("--rows must be positive integers")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    with allow_compiled_cases():
        return run(a, argv)


def run(a: argparse.Namespace, argv: list[str] | None) -> int:
    device = torch.device(a.device)
    torch.set_num_threads(a.threads)
    command = "python -m benchmarks.bench_drafter " + " ".join(sys.argv[1:] if argv is None else argv)
    info = {**provenance(device), "command": command.strip()}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    cases: list[Case] = []
    for head in a.heads:
        for rows in a.rows:
            if not a.skip_ops:
                cases += op_cases(HEADS[head], head, rows, dtype, device,
                                  [p for p in a.providers if p in OP_PROVIDERS], a.threads)
            cases.append(propose_case(HEADS[head], head, rows, a.k, a.context, device,
                                      [p for p in a.providers if p in PROPOSE_PROVIDERS], a.threads))
    for case in cases:  # warm-up (and compilation), and the check against eager torch
        ref = case.calls["torch"]()
        for p, fn in case.calls.items():
            case.checks[p] = _check(case.row["op"], fn(), ref)
    print(f"built {len(cases)} cases in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    times = measure(cases, a.rounds, a.reps, device)
    print("| op | head | rows | provider | ms [min, max] | torch / provider [min, max] | check |")
    print("|---|---|---|---|---|---|---|")
    with CsvWriter(a.out, CASE_COLUMNS + RESULT_COLUMNS) as w:
        for case, t in zip(cases, times, strict=True):
            base = {**info, **case.row, "rounds": a.rounds, "repeats": a.reps}
            for p in [p for p in a.providers if p in case.calls or p in case.status]:
                if p in case.status:
                    w.write({**base, "provider": p, "status": case.status[p]})
                    continue
                med, lo, hi = _spread([x * 1e3 for x in t[p]], "{:.4g}")
                vs, vs_lo, vs_hi = _spread([tt / x for tt, x in zip(t["torch"], t[p], strict=True)], "{:.3f}")
                w.write({**base, **case.checks[p], "provider": p, "status": "ok", "median_ms": med, "min_ms": lo,
                         "max_ms": hi, "vs_torch": vs, "vs_torch_min": vs_lo, "vs_torch_max": vs_hi})
                check = next(iter(case.checks[p].values()))
                print(f"| {case.row['op']} | {case.row['head']} | {case.row['rows']} | {p} | {med} [{lo}, {hi}] | "
                      f"{vs}x [{vs_lo}, {vs_hi}] | {check} |")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
