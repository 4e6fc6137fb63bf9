"""Drafter-head step on CPU: the fused native decoder step vs the same layer as torch ops.

One head step = one Qwen3 decoder layer over ``n`` new tokens per request against a per-request KV cache,
then the final RMSNorm and LM head: ``native`` is ``specdec_kernels.native.decoder_step`` (one call),
``torch`` is ``specdec_kernels.models.Qwen3.step`` on a one-layer model (its inference path: fused q/k/v
and gate/up matrices, explicit attention against the cache): the same layer the drafter heads run. Both run in one process on the same weights,
cache and threads, interleaved; the script reports the ratio per shape and checks that both return the
same logits (to float32 rounding).

Shapes: rl_loop's drafter heads (hidden 96, 2 query heads / 1 KV head of 64) and a wider head (hidden
512, 8 / 2 heads of 64), for R requests x n new tokens (n = 1: a draft step; n = 4: the first step of a
proposal after k = 3 accepted drafts) against ``context`` cached tokens.

``python -m benchmarks.bench_decoder_step [--threads 1] [--out CSV]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import CsvWriter, default_csv_path, provenance
from specdec_kernels import native
from specdec_kernels.models import KVCache, ModelConfig, Qwen3

HEADS = {
    "rl_loop": ModelConfig(vocab_size=32, hidden_size=96, intermediate_size=256, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=64),
    "wide": ModelConfig(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=1,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=64),
}
CASE_COLUMNS = ("head", "requests", "new_tokens", "context", "threads")
RESULT_COLUMNS = ("speedup_vs_torch", "max_abs_diff")


def _interleaved(fns: dict, reps: int) -> dict[str, list[float]]:
    """Seconds per call of each callable, alternating between them every repetition."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


@torch.no_grad()
def bench_case(head: str, reqs: int, n: int, context: int, reps: int) -> dict:
    torch.manual_seed(0)
    model = Qwen3(HEADS[head]).eval()
    model.sync_inference_weights()
    cfg = model.config
    caches = [KVCache(cfg, reqs, context + n) for _ in range(2)]
    for c in caches:
        c.k.normal_(generator=torch.Generator().manual_seed(1))
        c.v.normal_(generator=torch.Generator().manual_seed(2))
    x = torch.randn(reqs, n, cfg.hidden_size)
    start = torch.full((reqs,), context, dtype=torch.long)
    depth = torch.arange(n).expand(reqs, n).contiguous()
    rows = torch.arange(reqs)
    ids = torch.zeros(reqs, n, dtype=torch.long)
    weights, rope = model.native_step_args(0)

    def run_torch():
        return model.step(ids, caches[0], None, start, context + n, depth=depth, inputs_embeds=x)[0]

    def run_native():
        return native.decoder_step(x, weights, caches[1].k[0], caches[1].v[0], rows, start, depth, rope,
                                   cfg.num_attention_heads, cfg.rms_norm_eps)[0]

    diff = float((run_torch() - run_native()).abs().max())
    times = _interleaved({"torch": run_torch, "native": run_native}, reps)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {"head": head, "requests": reqs, "new_tokens": n, "context": context, "threads": torch.get_num_threads(),
            "torch_ms": med["torch"] * 1e3, "native_ms": med["native"] * 1e3,
            "min_ms": {name: min(t) * 1e3 for name, t in times.items()}, "repeats": reps,
            "speedup_vs_torch": med["torch"] / med["native"], "max_abs_diff": diff}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_decoder_step", description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="rl_loop,wide")
    ap.add_argument("--requests", default="8,32,64")
    ap.add_argument("--new-tokens", default="1,4")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None, help="CSV path (default benchmarks/results/decoder_step_cpu_<time>.csv)")
    a = ap.parse_args(argv)
    if not native.has_op("decoder_step", "cpu"):
        raise SystemExit("specdec_kernels._C is not built with decoder_step (pip install -e .)")
    torch.set_num_threads(a.threads)
    device = torch.device("cpu")
    prov = provenance(device)
    out = a.out or default_csv_path("decoder_step", device)
    print("| head | R | n | torch ms | native ms | speedup | max |diff| |")
    print("|---|---|---|---|---|---|---|")
    with CsvWriter(out, CASE_COLUMNS + RESULT_COLUMNS) as w:
        for head in a.heads.split(","):
            for reqs in map(int, a.requests.split(",")):
                for n in map(int, a.new_tokens.split(",")):
                    r = bench_case(head, reqs, n, a.context, a.reps)
                    for provider in ("torch", "native"):
                        w.write({**prov, **{c: r[c] for c in CASE_COLUMNS + RESULT_COLUMNS}, "provider": provider,
                                 "median_ms": r[f"{provider}_ms"], "min_ms": r["min_ms"][provider],
                                 "repeats": r["repeats"], "status": "ok"})
                    print(f"| {head} | {reqs} | {n} | {r['torch_ms']:.3f} | {r['native_ms']:.3f} | "
                          f"{r['speedup_vs_torch']:.2f}x | {r['max_abs_diff']:.1e} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
