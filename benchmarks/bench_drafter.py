"""Drafter-head ops and a full EAGLE-3 propose round: fused Triton kernels vs the eager torch modules.

Providers: ``torch`` (eager, always) and ``triton`` (only on a GPU: under TRITON_INTERPRET=1 timings mean
nothing, so on CPU the script measures eager torch alone). Speed is reported as ratios measured side by
side in one run; the script also checks that both providers return the same token ids.

``python -m benchmarks.bench_drafter --help``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec_kernels.drafters import head_ops
from specdec_kernels.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head


def _time(fn, device: torch.device, reps: int) -> float:
    """Median seconds per call."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def bench_ops(rows: int, hidden: int, draft_vocab: int, vocab: int, dtype: torch.dtype, device: torch.device,
              providers: list[str], reps: int) -> list[dict]:
    g = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, 3 * hidden, generator=g) * 2).to(device, dtype)
    nw = (torch.rand(3, hidden, generator=g) + 0.5).to(device, dtype)
    fc = (torch.randn(hidden, 3 * hidden, generator=g) / (3 * hidden) ** 0.5).to(device, dtype)
    h = torch.randn(rows, hidden, generator=g).to(device, dtype)
    w = (torch.randn(draft_vocab, hidden, generator=g) / hidden**0.5).to(device, dtype)
    d2t = (torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values - torch.arange(draft_vocab)).to(device)
    temp = torch.ones(rows, device=device)
    seed = torch.arange(rows, device=device)
    pos = torch.full((rows,), 100, device=device, dtype=torch.int64)
    ops = {
        "norm_fc": lambda p: head_ops.fuse_features(x, nw, fc, 1e-6, p),
        "lm_head_top1": lambda p: head_ops.head_topk(h, w, d2t, 1, p).target_ids,
        "lm_head_top8": lambda p: head_ops.head_topk(h, w, d2t, 8, p).target_ids,
        "lm_head_sample_q": lambda p: head_ops.head_sample(h, w, d2t, vocab, temp, seed, pos, 1, p).target_ids,
    }
    out = []
    for name, op in ops.items():
        row = {"op": name, "rows": rows, "hidden": hidden, "draft_vocab": draft_vocab, "dtype": str(dtype)}
        results = {}
        for p in providers:
            row[f"{p}_ms"] = round(1e3 * _time(lambda p=p, op=op: op(p), device, reps), 4)
            results[p] = op(p)
        if "triton" in results and name != "norm_fc":
            row["same_ids"] = bool(torch.equal(results["triton"], results["torch"]))
        if "triton" in providers:
            row["speedup_triton_vs_torch"] = round(row["torch_ms"] / row["triton_ms"], 3)
        out.append(row)
    return out


def bench_propose(batch: int, k: int, hidden: int, vocab: int, draft_vocab: int, device: torch.device,
                  providers: list[str], reps: int) -> dict:
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config(vocab, draft_vocab, hidden, hidden, 4 * hidden, max(1, hidden // 128),
                                   1, 128 if hidden >= 128 else hidden, (2, 3, 4))).to(device)
    ids = torch.randint(0, vocab, (batch, 256), device=device)
    feats = torch.randn(batch, 256, 3 * hidden, device=device)
    row = {"op": f"eagle3_propose_k{k}", "batch": batch, "hidden": hidden, "draft_vocab": draft_vocab}
    for p in providers:
        d = Eagle3Drafter(head, backend=p)
        d.prefill(ids, torch.full((batch,), 256, device=device), ids[:, 0], feats)
        row[f"{p}_ms"] = round(1e3 * _time(lambda d=d: d.propose(k), device, reps), 4)
    if "triton" in providers:
        row["speedup_triton_vs_torch"] = round(row["torch_ms"] / row["triton_ms"], 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU smoke run)")
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    providers = ["torch"] + (["triton"] if device.type == "cuda" else [])
    if args.quick or device.type == "cpu":
        shapes = [(8, 256, 2048, 8192)]
        prop = (4, 4, 256, 8192, 2048)
        dtype = torch.float32
    else:
        shapes = [(8, 4096, 32000, 151936), (64, 4096, 32000, 151936), (256, 4096, 32000, 151936)]
        prop = (32, 5, 4096, 151936, 32000)
        dtype = torch.bfloat16
    rows = []
    for r, h, vd, v in shapes:
        rows += bench_ops(r, h, vd, v, dtype, device, providers, args.reps)
    rows.append(bench_propose(prop[0], prop[1], prop[2], prop[3], prop[4], device, providers, max(3, args.reps // 4)))
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": str(device), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
