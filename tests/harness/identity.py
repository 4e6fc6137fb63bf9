"""Token identity of a backend with the reference, request by request, over every step-law case at scale.

The statistical suite (``tests/exactness/test_block_traversal_law.py``, ``tests/exactness/test_tree_law.py``) asks whether a backend's
outputs follow the exact law; ``tests/native/test_native.py`` compares backends with the reference on a few hundred
random requests. This check asks the stricter, cheaper question at a scale those cannot afford: for each
step-law case (:data:`block_traversal_law.STEP_CASES`: chains and trees of widths 1-4 and depths 1-4, every sibling
mode, temperature / top-k / top-p / greedy), each method and entry point, and each seed, ``n`` drafted
requests are verified by the backend on ``device`` and by the reference on the CPU, and every request whose
accepted count or emitted tokens differ is counted. Rare faults show up here: a race that touches 3 requests
in 65476, or a compiled kernel that loses a loop-carried value for 117 of them (both seen on an H200).

    python -m tests.harness.identity --backend triton --device cuda        # 86 jobs x 3 seeds
    python -m tests.harness.identity --backend cpu --n 4096 --seeds 11

Exit status 1 when any request differs or a job raises. ``tests/kernels/test_identity.py`` runs it on the CPU backend
and shows that a planted bug (:mod:`block_traversal_mutants`) is counted.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

from specdec_kernels.api import CHAIN_METHODS, TREE_METHODS
from specdec_kernels.exactness import block_traversal_law as btl
from specdec_kernels.exactness.block_traversal_mutants import planted

__all__ = ["Job", "jobs", "differences", "main"]

# (method, entry point) pairs: chains through both entry points, trees through verify_tree.
TREE_APIS = tuple((m, "tree") for m in TREE_METHODS)
CHAIN_APIS = tuple((m, "chain") for m in CHAIN_METHODS) + TREE_APIS
METHODS = tuple(dict.fromkeys(m for m, _ in CHAIN_APIS))


@dataclass(frozen=True)
class Job:
    case: int  # index into block_traversal_law.STEP_CASES
    method: str
    api: str

    @property
    def name(self) -> str:
        return f"{btl.STEP_CASES[self.case].name} {self.method} {self.api}"


def jobs(methods: tuple[str, ...] = METHODS) -> list[Job]:
    """Every (step case, method, entry point): chains through verify_chain and verify_tree, trees through
    verify_tree."""
    out = []
    for i, case in enumerate(btl.STEP_CASES):
        pairs = CHAIN_APIS if case.step().is_chain else TREE_APIS
        out += [Job(i, m, api) for m, api in pairs if m in methods]
    return out


def differences(job: Job, backend: str, device: str, n: int, seed: int, bug: str | None = None) -> int:
    """Requests (of ``n`` drawn with ``seed``) whose accepted count or tokens differ from the reference's.

    ``bug`` plants one of :data:`block_traversal_mutants.MUTANTS` in the reference while the backend runs (with
    ``backend="reference"``: a planted bug the check must count)."""
    case = btl.STEP_CASES[job.case]
    acc_ref, out_ref = btl.sample_step(case, btl.step_verifier(job.method, "reference", job.api, "cpu"), n, seed)
    with planted(bug) if bug else contextlib.nullcontext():
        acc, out = btl.sample_step(case, btl.step_verifier(job.method, backend, job.api, device), n, seed)
    width = max(out_ref.shape[1], out.shape[1])
    out_ref = torch.nn.functional.pad(out_ref, (0, width - out_ref.shape[1]), value=-1)
    out = torch.nn.functional.pad(out, (0, width - out.shape[1]), value=-1)
    return int(((acc_ref != acc) | (out_ref != out).any(1)).sum())


def _run(job: Job, backend: str, device: str, n: int, seeds: tuple[int, ...], threads: int) -> tuple[Job, list]:
    # One worker per process, each with a share of the cores: the reference is many small torch ops, which
    # slow to a crawl when every worker's OpenMP pool spins on all cores.
    torch.set_num_threads(threads)
    counts = []
    for seed in seeds:
        try:
            counts.append(differences(job, backend, device, n, seed))
        except Exception as exc:  # noqa: BLE001  (reported per job; the run goes on)
            counts.append(f"{type(exc).__name__}: {str(exc)[:160]}")
    return job, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.identity", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="triton", help="backend to compare with the reference (default triton)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n", type=int, default=65476, help="requests per case and seed (default 65476)")
    parser.add_argument("--seeds", default="11,12,13", help="comma list (default 11,12,13)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma list (default all)")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    args = parser.parse_args(argv)
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        parser.error(f"--seeds must be a comma list of integers, got {args.seeds!r}")
    methods = tuple(args.methods.split(","))
    if not set(methods) <= set(METHODS):
        parser.error(f"--methods must name {', '.join(METHODS)}, got {args.methods!r}")
    if args.n < 1 or args.workers < 1:
        parser.error("--n and --workers must be >= 1")
    from specdec_kernels import available_backends

    try:
        offered = available_backends(args.device)
    except (RuntimeError, ValueError) as exc:
        parser.error(f"--device: {exc}")
    if args.backend not in offered:
        parser.error(f"--backend {args.backend!r} is not available on {args.device} here "
                     f"(available: {', '.join(offered)})")
    todo = jobs(methods)
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    print(f"identity: {args.backend} on {args.device} vs the reference on cpu, {len(todo)} jobs x seeds {seeds}, "
          f"n = {args.n}, {args.workers} worker(s) x {threads} thread(s)", flush=True)
    start, bad = time.time(), 0
    if args.workers == 1:
        results = (_run(j, args.backend, args.device, args.n, seeds, threads) for j in todo)
        pool = contextlib.nullcontext()
    else:
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_run, todo, *([x] * len(todo) for x in (args.backend, args.device, args.n, seeds, threads)))
    with pool:
        for job, counts in results:
            ok = all(c == 0 for c in counts)
            bad += not ok
            print(f"{'  ' if ok else '!!'} {job.name:48s} differing per seed: {counts}", flush=True)
    print(f"identity: {len(todo)} jobs, {bad} with differences or errors, {time.time() - start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
