"""Which decode path is fastest for the policy, and which regime each policy shape is in, measured.

``python -m rl_loop.experiments.decode_bench --out DIR`` times, for each policy preset (``config.POLICY_PRESETS``) and
each candidate path — ``torch`` (``Qwen3.step`` as framework ops), ``native`` (every layer through the
fused ``native.decoder_step``) and ``compile`` (``torch.compile`` of ``Qwen3.step``, one graph per shape)
— one engine forward at the rollout batch against a KV cache of a typical length: a one-token decode
(an autoregressive round) and a (k + 1)-row verification forward (a chain round). Candidates are
interleaved within each repeat (order rotated), repeated, and reported as medians with the interquartile
range. It also times the autoregressive arm's sampling call (``verify_chain`` with zero drafts) with and
without argument validation. ``verify / decode`` is the regime: ~1 when a forward is bound by streaming the
weights or by per-op overhead (verification is almost free), ~k + 1 when it is bound by arithmetic.
Writes ``DIR/decode_paths.json`` (with provenance) and prints a markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable

import torch

import specdec_kernels as sk
from specdec_kernels.models import KVCache, Qwen3, num_parameters

from ..config import POLICY_PRESETS
from ..run.provenance import provenance
from ..run.usage import OneLineParser
from ..step.engine import PolicyStep
from ..step.rollouts import resolve_verify_backend


def _time(fn: Callable[..., object], inner: int, *args: object) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        fn(*args)
    return (time.perf_counter() - t0) / inner


def _candidates(policy: Qwen3, with_compile: bool) -> dict[str, Callable]:
    native = PolicyStep(policy, "native")
    native.sync()
    out: dict[str, Callable] = {"torch": policy.step, "native": native}
    if with_compile:
        out["compile"] = torch.compile(policy.step, dynamic=False)
    return out


def bench_shape(name: str, batch: int, k: int, context: int, repeats: int, inner: int, with_compile: bool) -> dict:
    """Medians (ms) of a one-token decode and a (k + 1)-row forward per candidate for preset ``name``."""
    torch.manual_seed(0)
    policy = Qwen3(POLICY_PRESETS[name]()).eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    policy.sync_inference_weights()
    cache = KVCache(policy.config, batch, context + k + 2)
    start = torch.full((batch,), context, dtype=torch.long)
    one = torch.randint(0, policy.config.vocab_size, (batch, 1))
    rows = torch.randint(0, policy.config.vocab_size, (batch, k + 1))
    cands = _candidates(policy, with_compile)
    compile_s = {}
    with torch.no_grad():
        for cname, fn in cands.items():  # warm up (and compile) every candidate and shape
            t0 = time.perf_counter()
            for _ in range(3):
                fn(one, cache, None, start, context + 1)
                fn(rows, cache, None, start, context + k + 1)
            compile_s[cname] = time.perf_counter() - t0
        times: dict[str, dict[str, list[float]]] = {c: {"decode": [], "verify": []} for c in cands}
        names = list(cands)
        for r in range(repeats):
            for cname in names[r % len(names):] + names[: r % len(names)]:
                fn = cands[cname]
                times[cname]["decode"].append(_time(fn, inner, one, cache, None, start, context + 1))
                times[cname]["verify"].append(_time(fn, inner, rows, cache, None, start, context + k + 1))
    result: dict = {"preset": name, "parameters": num_parameters(policy),
                    "weight_mb": 4 * num_parameters(policy) / 2**20, "batch": batch, "k": k, "context": context,
                    "warmup_s": compile_s, "paths": {}}
    for cname, t in times.items():
        d, v = (sorted(t[x]) for x in ("decode", "verify"))
        result["paths"][cname] = {
            "decode_ms": 1e3 * statistics.median(d), "decode_iqr_ms": [1e3 * d[len(d) // 4], 1e3 * d[3 * len(d) // 4]],
            "verify_ms": 1e3 * statistics.median(v), "verify_iqr_ms": [1e3 * v[len(v) // 4], 1e3 * v[3 * len(v) // 4]],
        }
    best = min(result["paths"], key=lambda c: result["paths"][c]["decode_ms"])
    result["fastest_decode"] = best
    result["verify_over_decode"] = result["paths"][best]["verify_ms"] / result["paths"][best]["decode_ms"]
    return result


def bench_sampling(batch: int, vocab: int, repeats: int, inner: int) -> dict:
    """The autoregressive sampling call (``verify_chain`` with zero drafts), validated vs not (µs)."""
    backend = resolve_verify_backend("default")
    logits = torch.randn(batch, vocab)
    empty, cu = torch.zeros(0, dtype=torch.long), torch.zeros(batch + 1, dtype=torch.long)
    temp, seed, pos = torch.ones(batch), torch.arange(batch), torch.full((batch,), 7)
    out = {}
    for validate in (True, False):
        def call(validate=validate):
            return sk.verify_chain(logits, empty, cu, temperature=temp, seed=seed, position=pos, backend=backend,
                                   max_draft_len=0, validate=validate)
        call()
        out["validated" if validate else "unvalidated"] = sorted(_time(call, inner) for _ in range(repeats))
    return {"backend": backend, "batch": batch, "vocab": vocab,
            **{f"{name}_us": 1e6 * statistics.median(v) for name, v in out.items()}}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m rl_loop.experiments.decode_bench", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/decode_bench")
    p.add_argument("--presets", default=",".join(POLICY_PRESETS), help="comma-separated policy presets")
    p.add_argument("--batch", type=int, default=32, help="rollout batch (RunConfig.max_batch)")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--context", type=int, default=40, help="cached tokens per request")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--inner", type=int, default=20, help="calls per timing")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    a = p.parse_args(argv)
    presets = a.presets.split(",")
    unknown = [x for x in presets if x not in POLICY_PRESETS]
    if unknown:
        p.error(f"unknown presets {unknown}; choose from {tuple(POLICY_PRESETS)}")
    torch.set_num_threads(a.threads)
    shapes = [bench_shape(x, a.batch, a.k, a.context, a.repeats, a.inner, not a.no_compile) for x in presets]
    sampling = bench_sampling(a.batch, POLICY_PRESETS[presets[0]]().vocab_size, a.repeats, 10 * a.inner)
    command = None if argv is None else " ".join(["python -m rl_loop.experiments.decode_bench", *argv])
    report = {"provenance": provenance(command), "shapes": shapes,
              "ar_sampling": sampling}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "decode_paths.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("| preset | params | path | decode ms | (k+1)-row verify ms | verify / decode |")
    print("|---|---|---|---|---|---|")
    for s in shapes:
        for cname, t in s["paths"].items():
            print(f"| {s['preset']} | {s['parameters'] / 1e6:.1f}M | {cname} | {t['decode_ms']:.2f} | "
                  f"{t['verify_ms']:.2f} | {t['verify_ms'] / t['decode_ms']:.2f} |")
    print(f"AR sampling call ({sampling['backend']}): validated {sampling['validated_us']:.0f} us, "
          f"unvalidated {sampling['unvalidated_us']:.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
