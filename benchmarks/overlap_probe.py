"""How much of a case's row compute the memory stream hides: ours against a read of as many bytes, cold and
rerun, beside the case's compute measured with its rows in the cache.

    OMP_NUM_THREADS=1 python -m benchmarks.overlap_probe --family flat --dtype bfloat16 --mode random_stoch

The case is one of ``bench_native_cpu``'s (the same inputs, ``build_cases``), verified by
``verify_chain(..., backend="cpu")`` on this process's threads. Each of ``--rounds`` rounds times, in an
order alternated between rounds, ours and a read of as many bytes as the case must read
(``native.stream_sum`` over that prefix of its logits, 16-bit logits read as 32-bit words:
``bench_native_cpu``'s same-size read), each once right after the benchmark's cache eviction (cold) and once
right after a call of its own (rerun: whatever the caches kept). Then the case's compute: every request
verified alone, ``--cache-calls`` times in a row on one thread (its logit rows, at most four of 151936 bf16
entries, stay in L2; fp32 rows of that size overflow a 2 MiB L2), the median less the median of the same
call on the request's rows cut to 64 entries (the call's fixed cost), summed over the requests. Printed:
the medians with their spread, that compute per thread (the threads share the requests), and the exposed
fraction (cold ours - cold read) / compute per thread: 0 when the stream hides all the compute, 1 when none
of it, above 1 when the kernel also reads slower than the plain read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

import specdec_kernels as sk
from benchmarks.bench_native_cpu import (
    DRAFTS,
    DTYPES,
    FAMILIES,
    MODES,
    Case,
    _evict_caches,
    _keys,
    build_cases,
    family_logits,
    must_read_bytes,
    same_size_words,
)
from benchmarks.common import OneLineParser, require_positive, time_fn
from specdec_kernels import native


def _request_call(case: Case, args, b: int, width: int | None) -> Callable[[], object]:
    """verify_chain on request b alone (its k + 1 rows), the rows cut to `width` entries if given."""
    rows = case.logits[b * (args.k + 1):(b + 1) * (args.k + 1)]
    drafts = case.drafts[b * args.k:(b + 1) * args.k]
    probs = None if case.draft_probs is None else case.draft_probs[b * args.k:(b + 1) * args.k]
    if width is not None:
        rows, drafts = rows[:, :width].contiguous(), drafts % width
        probs = None if probs is None else (probs[:, :width] / probs[:, :width].sum(-1, keepdim=True)).contiguous()
    seed, position = _keys(args)
    cu = torch.tensor([0, args.k])
    temp = case.temperature[b:b + 1]
    return lambda: sk.verify_chain(rows, drafts, cu, draft_probs=probs, temperature=temp, seed=seed[b:b + 1],
                                   position=position[b:b + 1], backend="cpu", max_draft_len=args.k, validate=False)


def _median_of(fn: Callable[[], object], calls: int) -> float:
    """Median seconds of `calls` warm calls (one call before, untimed)."""
    return time_fn(fn, torch.device("cpu"), warmup=1, repeats=calls).median_ms / 1e3


def cached_compute(case: Case, args) -> tuple[float, int]:
    """Seconds of row work of the whole case on one thread with each request's rows cached (the call's
    fixed cost removed), and the number of rows the case reads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one request's rows would otherwise be split across the threads
    try:
        total, rows = 0.0, 0
        for b in range(args.batch):
            call = _request_call(case, args, b, None)
            full = _median_of(call, args.cache_calls)
            fixed = _median_of(_request_call(case, args, b, 64), args.cache_calls)
            total += max(full - fixed, 0.0)
            rows += int(call().num_accepted[0]) + 1
        return total, rows
    finally:
        torch.set_num_threads(threads)


def measure(case: Case, args) -> dict[str, list[float]]:
    """Per round: ours and the read, cold (after the eviction) and rerun."""
    seed, position = _keys(args)
    cu = torch.arange(args.batch + 1) * args.k
    fns = {
        "ours": lambda: sk.verify_chain(case.logits, case.drafts, cu, draft_probs=case.draft_probs,
                                        temperature=case.temperature, seed=seed, position=position, backend="cpu",
                                        max_draft_len=args.k, validate=False),
    }
    words = same_size_words(case, must_read_bytes(case, fns["ours"]().num_accepted))
    fns["read"] = lambda: native.stream_sum(words)
    out: dict[str, list[float]] = {f"{name} {kind}": [] for name in fns for kind in ("cold", "rerun")}
    for fn in fns.values():
        fn()
    for r in range(args.rounds):
        for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            _evict_caches()
            t0 = time.perf_counter()
            fns[name]()
            t1 = time.perf_counter()
            fns[name]()
            out[f"{name} cold"].append(t1 - t0)
            out[f"{name} rerun"].append(time.perf_counter() - t1)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m benchmarks.overlap_probe",
                      description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--family", choices=FAMILIES, default="flat")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    p.add_argument("--mode", choices=MODES, default="random_stoch")
    p.add_argument("--drafts", choices=DRAFTS, default="accept")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--cache-calls", type=int, default=30, help="calls per request for the cached compute")
    args = p.parse_args(argv)
    require_positive(p, args, ("batch", "k", "vocab", "rounds", "cache_calls"))
    if args.vocab < 64:
        p.error(f"--vocab must be >= 64 (the fixed-cost call cuts rows to 64 entries), got {args.vocab}")
    return args


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    logits = family_logits(args.family, args.batch * (args.k + 1), args.vocab, gen)
    case_args = argparse.Namespace(batch=args.batch, k=args.k, vocab=args.vocab, dtypes=[args.dtype],
                                   modes=[args.mode], drafts=[args.drafts])
    case = build_cases(logits, args.family, case_args, gen)[0]
    times = measure(case, args)
    compute, rows = cached_compute(case, args)
    threads = torch.get_num_threads()
    med = {name: statistics.median(v) for name, v in times.items()}
    per_thread = compute / threads
    exposed = (med["ours cold"] - med["read cold"]) / per_thread if per_thread > 0 else float("nan")
    print(f"{args.family} {args.dtype} {args.mode} {args.drafts}: B = {args.batch}, k = {args.k}, V = {args.vocab}, "
          f"{threads} threads, {args.rounds} rounds; median ms [min, max]")
    for name, v in times.items():
        print(f"  {name:>11}: {med[name] * 1e3:8.3f} [{min(v) * 1e3:.3f}, {max(v) * 1e3:.3f}]")
    print(f"  compute with the rows cached: {compute / rows * 1e6:.1f} us per row read, {rows} rows, "
          f"{per_thread * 1e3:.3f} ms per thread")
    print(f"  exposed fraction of that compute: {exposed:.2f}")
    return {**med, "compute_per_thread": per_thread, "rows": rows, "exposed": exposed}


if __name__ == "__main__":
    main(sys.argv[1:])
