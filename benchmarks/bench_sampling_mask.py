"""The cost of the sampling mask: ``verify_chain`` with ``return_mask`` off and on, side by side.

    python -m benchmarks.bench_sampling_mask --rounds 15 [--out results/benchmarks/sampling_mask_cpu.csv]
    python -m benchmarks.bench_sampling_mask --device cuda --backend cuda,triton --rounds 5 --out FILE

One seeded batch (default B = 64 requests, k = 3 drafts, V = 151936, temperature 1, zipf logits as in
``bench_native_cpu``, drafts the argmax of their rows so that most are accepted and most rows emit) is
verified by each ``--backend`` (default the native CPU one; on ``--device cuda`` the inputs live on the GPU
and every timed call ends with a device synchronisation) under three truncations, ``top_k=512, top_p=0.97``,
``top_p=0.97`` and none, each in three modes: ``off`` (``return_mask=False``), ``on`` (``return_mask=True``: the
mask from the kernels' own thresholds, on every backend) and ``post_pass`` (the plain call, then
``sampling_mask.chain_sampling_mask`` without thresholds: the post-pass that re-derives the kept sets from
the arguments, the path ``on`` replaced). Every round times the nine calls
(``--reps`` calls each, median), in one order on even rounds and reversed on odd ones; printed per call: the
median over rounds of those medians, the min and max over rounds, the emitted tokens and the mask's kept ids.
``--out`` writes the same as CSV rows (one per backend and call, each backend's rows as soon as it is
measured) with the run's provenance (command, commit, machine, ``--note``: say there whether the machine was
shared).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

import specdec_kernels as sk
from benchmarks.bench_native_cpu import family_logits
from benchmarks.common import CsvWriter, OneLineParser, provenance
from specdec_kernels import api, sampling_mask

TRUNCATIONS = ("top_k512_top_p0.97", "top_p0.97", "untruncated")
MODES = ("off", "on", "post_pass")
CSV_COLUMNS = ("command", "note", "batch", "k", "vocab", "family", "dtype", "torch_threads", "rounds", "reps",
               "truncation", "mode", "max_ms", "over_off", "emitted_tokens", "kept_ids")


def _post_pass(kw: dict, backend: str) -> object:
    """The plain call, then the post-pass over its result (``sampling_mask.kept_ids``; no backend's path)."""
    args = api.checked_chain_args(**kw)
    result = api._resolve(backend, args[0].device, "chain")(*args)
    return result, sampling_mask.chain_sampling_mask(args, result)


def calls(batch: int, k: int, vocab: int, family: str, dtype: torch.dtype, backend: str,
          device: torch.device = torch.device("cpu")) -> dict[tuple[str, str], Callable[[], object]]:
    """The timed calls, (truncation, mode) -> call, on one seeded batch (built on the CPU, then moved to
    ``device``: the same inputs on every device)."""
    gen = torch.Generator().manual_seed(0)
    logits = family_logits(family, batch * (k + 1), vocab, gen).to(dtype)
    draft_rows = (torch.arange(batch)[:, None] * (k + 1) + torch.arange(k)[None, :]).flatten()
    drafts = logits[draft_rows].float().argmax(-1)
    cu = torch.arange(batch + 1) * k
    common = dict(temperature=torch.ones(batch), seed=torch.randint(0, 2**62, (batch,), generator=gen),
                  position=torch.randint(0, 4096, (batch,), generator=gen))
    truncation = {
        "top_k512_top_p0.97": dict(top_k=torch.full((batch,), 512, dtype=torch.int32),
                                   top_p=torch.full((batch,), 0.97)),
        "top_p0.97": dict(top_p=torch.full((batch,), 0.97)),
        "untruncated": {},
    }
    fns = {}
    for name, kw in truncation.items():
        kw = dict(target_logits=logits, draft_token_ids=drafts, cu_num_draft_tokens=cu, **common, **kw)
        kw = {key: value.to(device) for key, value in kw.items()}
        kw["max_draft_len"] = k
        fns[name, "off"] = lambda kw=kw: sk.verify_chain(**kw, backend=backend)
        fns[name, "on"] = lambda kw=kw: sk.verify_chain(**kw, backend=backend, return_mask=True)
        fns[name, "post_pass"] = lambda kw=kw: _post_pass(kw, backend)
    return fns


def measure(fns: dict[tuple[str, str], Callable[[], object]], rounds: int, reps: int,
            device: torch.device = torch.device("cpu")) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(median, min, max) over ``rounds`` interleaved rounds of each call's median seconds over ``reps``
    (on a GPU from a synchronised start to the synchronised end of the call)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    per_round: dict[tuple[str, str], list[float]] = {key: [] for key in fns}
    for fn in fns.values():
        fn()  # first calls (imports, lazy initialisation, kernel compilation) are not timed
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for key in order:
            times = []
            for _ in range(reps):
                sync()
                t0 = time.perf_counter()
                fns[key]()
                sync()
                times.append(time.perf_counter() - t0)
            per_round[key].append(statistics.median(times))
    return {key: (statistics.median(v), min(v), max(v)) for key, v in per_round.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m benchmarks.bench_sampling_mask",
                      description=__doc__.split("\n\n")[1].strip())
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    p.add_argument("--reps", type=int, default=3, help="calls per round and call (their median)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--family", default="zipf", choices=("flat", "peaked", "zipf"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--backend", default="cpu",
                   help="verify_chain backends, comma-separated, measured one after the other (default: native CPU)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the inputs live")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the shared VMs are oversubscribed)")
    p.add_argument("--out", default=None, help="CSV to write (one row per call, with provenance)")
    p.add_argument("--note", default="", help="a line on the machine for the CSV (e.g. cores shared with others)")
    args = p.parse_args(argv)
    for name in ("rounds", "reps", "batch", "k", "vocab", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    args.backend = [b for b in args.backend.split(",") if b]
    unknown = [b for b in args.backend if b not in sk.available_backends(args.device)]
    if unknown or not args.backend:
        p.error(f"--backend {','.join(unknown) or '(none)'}: not available on {args.device} "
                f"(available: {', '.join(sk.available_backends(args.device))})")
    return args


def main(argv: list[str] | None = None) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """Times every backend in turn; returns (backend, truncation, mode) -> (median, min, max) seconds."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    machine = provenance(device) if args.out else None  # the commit the run starts at
    command = "python -m benchmarks.bench_sampling_mask " + " ".join(argv if argv is not None else sys.argv[1:])
    common = {**(machine or {}), "command": command, "note": args.note, "batch": args.batch, "k": args.k,
              "vocab": args.vocab, "family": args.family, "dtype": args.dtype, "torch_threads": args.threads,
              "rounds": args.rounds, "reps": args.reps}
    out = CsvWriter(args.out, CSV_COLUMNS) if args.out else None
    results = {}
    try:
        for backend in args.backend:
            fns = calls(args.batch, args.k, args.vocab, args.family, getattr(torch, args.dtype), backend, device)
            result = measure(fns, args.rounds, args.reps, device)
            print(f"B = {args.batch}, k = {args.k}, V = {args.vocab}, {args.family} {args.dtype} logits, T = 1, "
                  f"backend {backend} on {args.device}, {args.rounds} rounds x {args.reps} calls, torch threads "
                  f"{args.threads}: ms, median over rounds [min, max]; x off: the median over the off median")
            for name in TRUNCATIONS:
                _, mask = fns[name, "on"]()
                emitted, kept = mask.indptr.numel() - 1, mask.indices.numel()
                off = result[name, "off"][0]
                cells = []
                for mode in MODES:
                    med, lo, hi = results[backend, name, mode] = result[name, mode]
                    cells.append(f"{mode} {med * 1e3:8.2f} [{lo * 1e3:.2f}, {hi * 1e3:.2f}] x{med / off:.2f}")
                    if out is not None:
                        out.write({**common, "provider": backend, "median_ms": f"{med * 1e3:.3f}",
                                   "min_ms": f"{lo * 1e3:.3f}", "max_ms": f"{hi * 1e3:.3f}", "repeats": args.rounds,
                                   "status": "ok", "truncation": name, "mode": mode, "over_off": f"{med / off:.3f}",
                                   "emitted_tokens": emitted, "kept_ids": kept})
                print(f"{name:>20}: " + "   ".join(cells) + f"   {emitted} emitted tokens, {kept} kept ids")
    finally:
        if out is not None:
            out.close()
    return results


if __name__ == "__main__":
    main()
