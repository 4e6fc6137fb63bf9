"""Drafter-head step on CPU: the fused native decoder step vs the same layer as torch ops (eager and compiled).

One head step = one Qwen3 decoder layer over ``n`` new tokens per request against a per-request KV cache,
then the final RMSNorm and LM head. Providers, on the same weights, inputs and threads:

- ``native``: ``specdec_kernels.native.decoder_step`` (one call);
- ``torch``: ``specdec_kernels.models.Qwen3.step`` on a one-layer model, eager under ``inference_mode`` (its
  inference path: fused q/k/v and gate/up matrices, explicit attention against the cache) — the same layer
  the drafter heads run;
- ``torch_compile``: the same ``Qwen3.step`` under ``torch.compile(dynamic=False)`` (one graph per shape,
  compiled before timing), the strongest plain-torch baseline here.

Every provider writes to its own copy of the cache; each provider's logits are checked against eager torch
(``max_abs_diff``, float32 rounding).

Protocol: every case is built (and compiled) first; then ``--rounds`` rounds each time every case and every
provider (``--reps`` calls, median), providers in one order on even rounds and reversed on odd rounds (the
case order too). A CSV row of a (case, provider) gives the min / median / max over rounds of those medians;
``vs_torch`` / ``vs_best_torch`` are the median [min, max] over rounds of ``torch time / provider time`` and
``min(torch, torch_compile) time / provider time`` of the same round. The weights and caches are small and
stay cache-resident, as they do in a rollout loop; caches are not evicted.

Shapes: rl_loop's drafter heads (hidden 96, 2 query heads / 1 KV head of 64, MLP 256, vocabulary 32) and a
wider head (hidden 512, 8 / 2 heads of 64, MLP 1536, vocabulary 2048), for R requests x n new tokens (n = 1:
a draft step; n = 4: the first step of a proposal after k = 3 accepted drafts) against ``context`` cached
tokens; R = 32 is rl_loop's rollout batch.

Usage (the committed CSV; run alone on the machine)::

    python -m benchmarks.bench_decoder_step --out results/benchmarks/decoder_step_cpu.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from benchmarks.common import (
    CsvWriter,
    OneLineParser,
    parse_int_list,
    parse_str_list,
    provenance,
    require_positive,
)
from specdec_kernels import native
from specdec_kernels.models import KVCache, ModelConfig, Qwen3

HEADS = {
    "rl_loop": ModelConfig(vocab_size=32, hidden_size=96, intermediate_size=256, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=64),
    "wide": ModelConfig(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=1,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=64),
}
PROVIDERS = ("torch", "torch_compile", "native")
CASE_COLUMNS = ("head", "requests", "new_tokens", "context", "threads")
RESULT_COLUMNS = ("max_ms", "rounds", "vs_torch", "vs_torch_min", "vs_torch_max", "vs_best_torch",
                  "vs_best_torch_min", "vs_best_torch_max", "max_abs_diff", "command")


def allow_compiled_cases() -> AbstractContextManager:
    """One graph per case is compiled from the same function: without this dynamo would fall back to eager
    torch after 8 shapes (its recompile limit) and the ``torch_compile`` rows would time eager torch."""
    return torch._dynamo.config.patch(recompile_limit=1024, fail_on_recompile_limit_hit=True)


@dataclass
class Case:
    head: str
    requests: int
    new_tokens: int
    calls: dict[str, Callable[[], torch.Tensor]]
    diffs: dict[str, float]


def build_case(head: str, reqs: int, n: int, context: int, providers: list[str]) -> Case:
    """The providers' callables on one set of weights, inputs and (per-provider) caches; checks their logits."""
    torch.manual_seed(0)
    model = Qwen3(HEADS[head]).eval()
    model.sync_inference_weights()
    cfg = model.config

    def filled_cache() -> KVCache:
        c = KVCache(cfg, reqs, context + n)
        c.k.normal_(generator=torch.Generator().manual_seed(1))
        c.v.normal_(generator=torch.Generator().manual_seed(2))
        return c

    caches = {name: filled_cache() for name in providers}
    x = torch.randn(reqs, n, cfg.hidden_size)
    start = torch.full((reqs,), context, dtype=torch.long)
    depth = torch.arange(n).expand(reqs, n).contiguous()
    rows = torch.arange(reqs)
    ids = torch.zeros(reqs, n, dtype=torch.long)
    weights, rope = model.native_step_args(0)

    def torch_step(cache: KVCache) -> torch.Tensor:
        return model.step(ids, cache, None, start, context + n, depth=depth, inputs_embeds=x)[0]

    compiled = torch.compile(torch_step, dynamic=False) if "torch_compile" in providers else None

    def inference(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            with torch.inference_mode():
                return fn()
        return call

    makers = {
        "torch": lambda: inference(lambda: torch_step(caches["torch"])),
        "torch_compile": lambda: inference(lambda: compiled(caches["torch_compile"])),
        "native": lambda: inference(lambda: native.decoder_step(
            x, weights, caches["native"].k[0], caches["native"].v[0], rows, start, depth, rope,
            cfg.num_attention_heads, cfg.rms_norm_eps)[0]),
    }
    calls = {name: makers[name]() for name in providers}
    with torch.inference_mode():
        expected = torch_step(filled_cache())
    diffs = {name: float((fn() - expected).abs().max()) for name, fn in calls.items()}  # warm-up + compile
    return Case(head, reqs, n, calls, diffs)


def _median_time(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(cases: list[Case], providers: list[str], rounds: int, reps: int) -> list[dict[str, list[float]]]:
    """Per case, per provider: the median seconds of ``reps`` calls in each round (interleaved, alternated)."""
    times: list[dict[str, list[float]]] = [{name: [] for name in providers} for _ in cases]
    for r in range(rounds):
        order = list(range(len(cases)))
        for i in order if r % 2 == 0 else order[::-1]:
            for name in providers if r % 2 == 0 else providers[::-1]:
                times[i][name].append(_median_time(cases[i].calls[name], reps))
    return times


def _spread(values: list[float], fmt: str = "{:.4g}") -> tuple[str, str, str]:
    return fmt.format(statistics.median(values)), fmt.format(min(values)), fmt.format(max(values))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m benchmarks.bench_decoder_step", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=parse_str_list, default=list(HEADS))
    ap.add_argument("--requests", type=parse_int_list, default=[8, 32, 64])
    ap.add_argument("--new-tokens", type=parse_int_list, default=[1, 4])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch and OpenMP threads (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of the whole interleaved sweep")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per provider, case and round (median)")
    ap.add_argument("--providers", type=parse_str_list, default=list(PROVIDERS))
    ap.add_argument("--out", required=True, help="CSV path (written when the sweep ends)")
    a = ap.parse_args(argv)
    bad = [h for h in a.heads if h not in HEADS] + [p for p in a.providers if p not in PROVIDERS]
    if bad or not a.heads or "torch" not in a.providers:
        ap.error(f"--heads from {','.join(HEADS)}, --providers from {','.join(PROVIDERS)} including torch "
                 f"(got {','.join(bad) or 'no torch'})")
    require_positive(ap, a, ("context", "threads", "rounds", "reps"))
    if not a.requests or not a.new_tokens or min(a.requests + a.new_tokens) < 1:
        ap.error("--requests and --new-tokens must be positive integers")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    with allow_compiled_cases():
        return run(a, argv)


def run(a: argparse.Namespace, argv: list[str] | None) -> int:
    if "native" in a.providers and not native.has_op("decoder_step", "cpu"):
        raise SystemExit("specdec_kernels._C is not built with decoder_step (pip install --no-build-isolation -e .)")
    torch.set_num_threads(a.threads)
    command = "python -m benchmarks.bench_decoder_step " + " ".join(sys.argv[1:] if argv is None else argv)
    info = {**provenance(torch.device("cpu")), "command": command.strip()}
    if native.has_device("cpu"):
        info["device"] += f" isa={native._load().CPU_ISA}"
    t0 = time.perf_counter()
    cases = [build_case(h, r, n, a.context, a.providers) for h in a.heads for r in a.requests for n in a.new_tokens]
    print(f"built {len(cases)} cases in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    times = measure(cases, a.providers, a.rounds, a.reps)
    torches = [p for p in ("torch", "torch_compile") if p in a.providers]
    print("| head | R | n | " + " | ".join(f"{p} ms [min, max]" for p in a.providers)
          + " | native / best torch [min, max] |")
    print("|---|---|---|" + "---|" * (len(a.providers) + 1))
    with CsvWriter(a.out, CASE_COLUMNS + RESULT_COLUMNS) as w:
        for case, t in zip(cases, times, strict=True):
            best = [min(t[p][r] for p in torches) for r in range(a.rounds)]
            base = {**info, "head": case.head, "requests": case.requests, "new_tokens": case.new_tokens,
                    "context": a.context, "threads": a.threads, "rounds": a.rounds, "repeats": a.reps, "status": "ok"}
            cells, ratio = [], "-"
            for name in a.providers:
                ms = [x * 1e3 for x in t[name]]
                med, lo, hi = _spread(ms)
                vs, vs_lo, vs_hi = _spread([tt / x for tt, x in zip(t["torch"], t[name], strict=True)], "{:.3f}")
                vb, vb_lo, vb_hi = _spread([b / x for b, x in zip(best, t[name], strict=True)], "{:.3f}")
                w.write({**base, "provider": name, "median_ms": med, "min_ms": lo, "max_ms": hi,
                         "vs_torch": vs, "vs_torch_min": vs_lo, "vs_torch_max": vs_hi, "vs_best_torch": vb,
                         "vs_best_torch_min": vb_lo, "vs_best_torch_max": vb_hi,
                         "max_abs_diff": f"{case.diffs[name]:.2e}"})
                cells.append(f"{med} [{lo}, {hi}]")
                if name == "native":
                    ratio = f"{vb}x [{vb_lo}, {vb_hi}]"
            print(f"| {case.head} | {case.requests} | {case.new_tokens} | " + " | ".join(cells)
                  + f" | {ratio} |")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
