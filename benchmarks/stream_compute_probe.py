"""How much in-loop work a streaming read hides on this machine: ``native.stream_work`` (the read probe with
``rounds`` multiply-adds on every loaded vector) from evicted caches, against the same calls on data in the
cache.

    python -m benchmarks.stream_compute_probe

For each number of rounds r of ``--rounds-list`` (0, always included, is ``native.stream_sum``, the read
probe of ``bench_native_cpu``), each of ``--repeats`` repeats times ``stream_work(x, r)`` over ``--mib`` MiB
right after the benchmark's cache eviction (cold: from memory), the values of r in an order alternated between
repeats. Then the same calls in the cache: ``stream_work`` over a slice of ``--cache-kib`` KiB per thread
(it stays in each core's L2), ``--cache-calls`` calls in a row (median), scaled to the full size. Printed per
r: the cold median [min, max]; the work the rounds add in the cache, ``cached(r) - cached(0)``, and in the
stream, ``cold(r) - cold(0)`` (the calls' fixed costs cancel in both differences); and the exposed fraction
``(cold(r) - cold(0)) / (cached(r) - cached(0))``: 0 when the stream hides the work, 1 when the work adds
to the read, above 1 when it also slows the read. This is the machine's answer for a trivial loop, beside
``overlap_probe``'s for a verification case.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchmarks.bench_native_cpu import _evict_caches
from benchmarks.common import OneLineParser, parse_int_list, require_positive, time_fn
from specdec_kernels import native

MAX_ROUNDS = 1024  # native.stream_work's limit


def measure(args) -> dict[int, dict[str, float]]:
    """Per number of rounds: the cold medians (and spread) and the cached time at the full size."""
    threads = torch.get_num_threads()
    try:
        x = torch.ones(args.mib * 2**20 // 4)
    except RuntimeError as e:  # out of memory: one line, not a traceback
        sys.exit(f"stream_compute_probe: --mib {args.mib} cannot be allocated ({str(e).splitlines()[0]})")
    cached_x = x[: min(x.numel(), threads * args.cache_kib * 1024 // 4)]
    cold: dict[int, list[float]] = {r: [] for r in args.rounds_list}
    for r in args.rounds_list:
        native.stream_work(x, r)  # first calls are not timed
    for rep in range(args.repeats):
        for r in (args.rounds_list if rep % 2 == 0 else list(reversed(args.rounds_list))):
            _evict_caches()
            t0 = time.perf_counter()
            native.stream_work(x, r)
            cold[r].append(time.perf_counter() - t0)
    scale = x.numel() / cached_x.numel()
    out = {}
    for r in args.rounds_list:
        cached = time_fn(lambda r=r: native.stream_work(cached_x, r), torch.device("cpu"), warmup=2,
                         repeats=args.cache_calls).median_ms / 1e3 * scale
        out[r] = {"cold": statistics.median(cold[r]), "cold_min": min(cold[r]), "cold_max": max(cold[r]),
                  "cached": cached}
    base = out[0]
    for r, row in out.items():
        added = row["cached"] - base["cached"]
        row["added_cached"] = added
        row["added_cold"] = row["cold"] - base["cold"]
        row["exposed"] = row["added_cold"] / added if r > 0 and added > 0 else float("nan")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m benchmarks.stream_compute_probe",
                      description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--rounds-list", default="1,2,4,8,16",
                   help=f"comma-separated multiply-add rounds per loaded vector, each in [0, {MAX_ROUNDS}] (0 is "
                        "always added)")
    p.add_argument("--mib", type=int, default=74, help="MiB read per cold call (74: bench_native_cpu's bf16 logits)")
    p.add_argument("--repeats", type=int, default=9, help="cold calls per number of rounds (alternated order)")
    p.add_argument("--cache-kib", type=int, default=512, help="KiB per thread of the cached calls (fits in L2)")
    p.add_argument("--cache-calls", type=int, default=200, help="cached calls per number of rounds (median)")
    args = p.parse_args(argv)
    require_positive(p, args, ("mib", "repeats", "cache_kib", "cache_calls"))
    try:
        rounds = parse_int_list(args.rounds_list)
    except ValueError:
        p.error(f"--rounds-list must be comma-separated integers, got {args.rounds_list!r}")
    bad = [r for r in rounds if not 0 <= r <= MAX_ROUNDS]
    if bad:
        p.error(f"--rounds-list entries must be in [0, {MAX_ROUNDS}], got {bad[0]}")
    args.rounds_list = sorted({0, *rounds})
    return args


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    args = parse_args(argv)
    result = measure(args)
    print(f"stream_work over {args.mib} MiB, {torch.get_num_threads()} threads, {args.repeats} cold calls per "
          f"row (alternated), cached on {args.cache_kib} KiB per thread; ms")
    print(f"{'rounds':>6}  {'cold median [min, max]':>26}  {'cached':>7}  {'work in cache':>13}  "
          f"{'added cold':>10}  exposed")
    for r, row in result.items():
        spread = f"{row['cold'] * 1e3:.3f} [{row['cold_min'] * 1e3:.3f}, {row['cold_max'] * 1e3:.3f}]"
        exposed = "" if r == 0 else f"{row['exposed']:.2f}"
        print(f"{r:>6}  {spread:>26}  {row['cached'] * 1e3:7.3f}  {row['added_cached'] * 1e3:13.3f}  "
              f"{row['added_cold'] * 1e3:10.3f}  {exposed}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
