"""The fixed cost of one CPU verification call, from evicted caches and warm, beside the read probes' own.

    python -m benchmarks.call_overhead --calls 40

A call on a tiny batch (B = 64 requests, k = 3 drafts, a 64-entry vocabulary, greedy) does almost no row
work, so its time is the call's fixed cost: ``specdec_kernels.verify_chain`` (the Python checks, the
dispatcher, the output allocation, the OpenMP region), the native op alone (``native.op``, on arguments
checked once beforehand), and, for scale, ``torch.sum`` and ``native.stream_sum`` of 16 floats (the
bandwidth probes of ``bench_native_cpu``). Every call is timed twice per round, right after the same
cache eviction as ``bench_native_cpu`` (a write of twice the last-level cache, >= 256 MiB: code and data of
the whole stack are cold, as in a verification step after a forward pass that streamed the weights) and
warm, in an order alternated between rounds; the medians over ``--calls`` rounds are printed, one line per
call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

import specdec_kernels as sk
from benchmarks.bench_native_cpu import _evict_caches
from benchmarks.common import OneLineParser
from specdec_kernels import api, native


def calls(batch: int, k: int, vocab: int) -> dict[str, Callable[[], object]]:
    """The timed calls, on one seeded tiny batch."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch * (k + 1), vocab, generator=gen).to(torch.bfloat16)
    drafts = torch.randint(0, vocab, (batch * k,), generator=gen)
    cu = torch.arange(batch + 1) * k
    seed = torch.randint(0, 2**62, (batch,), generator=gen)
    position = torch.randint(0, 4096, (batch,), generator=gen)
    temperature = torch.zeros(batch)
    checked = api.checked_chain_args(logits, drafts, cu, None, temperature, None, None, seed, position,
                                     max_draft_len=k, validate=False)
    op = native.op("verify_chain", "cpu")
    x = torch.randn(16, generator=gen)
    return {
        "verify_chain": lambda: sk.verify_chain(logits, drafts, cu, temperature=temperature, seed=seed,
                                                position=position, backend="cpu", max_draft_len=k,
                                                validate=False),
        "native_op": lambda: op(*checked),
        "torch.sum(16)": lambda: torch.sum(x),
        "stream_sum(16)": lambda: native.stream_sum(x),
    }


def measure(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float]]:
    """Median seconds of each call (cold, warm) over ``rounds`` alternated rounds."""
    cold: dict[str, list[float]] = {name: [] for name in fns}
    warm: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # first calls (imports, lazy initialisation) are not timed
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            _evict_caches()
            t0 = time.perf_counter()
            fns[name]()
            t1 = time.perf_counter()
            fns[name]()
            cold[name].append(t1 - t0)
            warm[name].append(time.perf_counter() - t1)
    return {name: (statistics.median(cold[name]), statistics.median(warm[name])) for name in fns}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m benchmarks.call_overhead",
                      description=__doc__.split("\n\n")[1].strip())
    p.add_argument("--calls", type=int, default=40, help="rounds (each call timed once cold, once warm)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--vocab", type=int, default=64)
    args = p.parse_args(argv)
    for name in ("calls", "batch", "k", "vocab"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float]]:
    args = parse_args(argv)
    result = measure(calls(args.batch, args.k, args.vocab), args.calls)
    print(f"B = {args.batch}, k = {args.k}, V = {args.vocab}, {args.calls} rounds, torch threads "
          f"{torch.get_num_threads()}: median us, from evicted caches / warm")
    for name, (cold, warm) in result.items():
        print(f"{name:>16}: {cold * 1e6:8.1f} / {warm * 1e6:6.1f}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
