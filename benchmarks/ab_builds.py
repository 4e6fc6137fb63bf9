"""Two checkouts' native CPU chain kernels timed against each other: before / after figures on one machine.

    python -m benchmarks.ab_builds --before ../old-checkout --rounds 5

Each round runs one process per checkout (``--before`` and ``--after``, default this one), in alternating
order. A process imports that checkout's ``specdec_kernels`` (its own compiled ``_C``), builds the inputs of
``benchmarks/bench_native_cpu.py`` from *this* checkout (same seeds, so both builds see identical inputs)
and times ``verify_chain(..., backend="cpu")`` on every case, ``--reps`` calls from evicted caches, median.
Rows are appended to one history table, ``results/benchmarks/ab_history.csv`` by default (``--out``), so
every comparison ever committed is one file; a run's rows share its ``pair`` label
(``ab_cpu_<before>_vs_<after>``, or ``--pair``) and its ``command``, and name both checkouts' commits
(``+dirty`` for a tree with uncommitted changes). A row per case: both builds' median / min / max over
rounds, the after / before ratio of medians, and
each build's fraction of read bandwidth on the bytes an exact verifier must read (``bench_native_cpu``'s
``must_read_bytes`` and reference: the fastest of ``torch.sum``, ``native.stream_sum`` and
``native.stream_minmax16``, where that build has them, over the case's dtype's logits, measured in the same
process; median over rounds: a build without the native probes is judged against torch.sum alone, which
reads slower, so its fractions, if anything, come out high). The read
bandwidth rows (``read_gbs/<family>/<dtype>``) hold GB/s, not milliseconds. Only our calls and the read
probes are timed (the other providers are ``bench_native_cpu``'s). ``SPECDEC_CPU_ISA`` caps both builds alike:
the command records it, and the device column the instruction set the builds picked (``isa=...``).
``--before-isa`` / ``--after-isa`` cap one side only: with one checkout given twice, its AVX2 and AVX-512
builds side by side on one machine (``isa before=avx512 after=avx2``)::

    python -m benchmarks.ab_builds --before . --before-isa avx512 --after-isa avx2 --pair avx2_vs_avx512 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from .common import CsvWriter, OneLineParser, choice_list, git_commit, provenance, require_positive

REPO = Path(__file__).resolve().parent.parent
HISTORY = "results/benchmarks/ab_history.csv"
COLUMNS = ("pair", "case", "before_commit", "after_commit", "rounds", "before_median_ms", "before_min_ms",
           "before_max_ms", "after_median_ms", "after_min_ms", "after_max_ms", "after_over_before",
           "must_read_bytes", "before_read_fraction", "after_read_fraction", "command")
# bench_native_cpu's modes and families; not imported from it here, because it imports specdec_kernels,
# which a worker must take from its --package checkout.
MODES = ("greedy", "random_det", "random_stoch")
FAMILIES = ("flat", "peaked", "zipf", "qwen3")


def worker(args) -> None:
    """One process: the ``--package`` checkout's kernels on this checkout's inputs; prints JSON."""
    sys.path.insert(0, args.package)
    import specdec_kernels as sk  # the checkout under test

    sys.path.remove(args.package)
    sys.path.insert(0, str(REPO))
    import torch

    from benchmarks import bench_native_cpu as bench  # its `import specdec_kernels` is the one above

    torch.set_num_threads(args.threads)
    ns = argparse.Namespace(batch=args.batch, k=args.k, vocab=args.vocab, dtypes=args.dtypes,
                            modes=args.modes, drafts=["accept", "model"])
    from specdec_kernels import native  # the checkout's own: older ones have no stream_sum

    out = {"package": sk.__file__, "isa": getattr(native._load(), "CPU_ISA", "unknown")}  # older builds lack it
    for family in args.families:
        gen = torch.Generator().manual_seed(0)
        logits32 = bench.family_logits(family, args.batch * (args.k + 1), args.vocab, gen)
        cases = bench.build_cases(logits32, family, ns, gen)
        for dtype, x in {c.dtype: c.logits for c in cases}.items():
            probes = [lambda x=x: torch.sum(x)]
            if hasattr(native, "stream_sum"):
                probes.append(lambda x=x: native.stream_sum(bench._as_words(x)))
            if hasattr(native, "stream_minmax16"):
                probes.append(lambda x=x: native.stream_minmax16(x))
            seconds = min(bench._median_time(probe, 5) for probe in probes)
            out[f"read_gbs/{family}/{dtype}"] = x.numel() * x.element_size() / seconds / 1e9
        for case in cases:
            fn = bench.ours(case, ns)
            need = bench.must_read_bytes(case, fn().num_accepted)
            key = f"{case.family}/{case.dtype}/{case.mode}/{case.drafts_kind}"
            out[key] = bench._median_time(fn, args.reps) * 1e3
            out[f"need/{key}"] = need
    print(json.dumps(out))


def _commit_of(checkout: str) -> str:
    """The checkout's short commit, ``+dirty`` when its tracked files have uncommitted changes."""
    proc = subprocess.run(["git", "-C", checkout, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    commit = proc.stdout.strip()
    if not commit:
        return "unknown"
    status = subprocess.run(["git", "-C", checkout, "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True)
    return commit + ("+dirty" if status.stdout.strip() else "")


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="python -m benchmarks.ab_builds", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="checkout of the old kernels (built in place: pip install -e there)")
    ap.add_argument("--after", default=str(REPO), help="checkout of the new kernels (default: this one)")
    ap.add_argument("--before-isa", choices=("generic", "avx2", "avx512"),
                    help="SPECDEC_CPU_ISA of the before processes only (one checkout's two builds side by side)")
    ap.add_argument("--after-isa", choices=("generic", "avx2", "avx512"),
                    help="SPECDEC_CPU_ISA of the after processes only")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", type=choice_list(("bfloat16", "float32")), default=["bfloat16", "float32"])
    ap.add_argument("--modes", type=choice_list(MODES), default=list(MODES))
    ap.add_argument("--families", type=choice_list(FAMILIES), default=["flat", "zipf"])
    ap.add_argument("--out", default=str(REPO / HISTORY), help=f"history CSV to append to (default {HISTORY})")
    ap.add_argument("--pair", help="label of this run's rows (default ab_cpu_<before>_vs_<after>, 7 digits)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--package", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if not args.before:
        ap.error("--before is required")
    require_positive(ap, args, ("rounds", "reps", "batch", "k", "vocab", "threads"))
    try:
        CsvWriter.check_appendable(args.out, COLUMNS)  # before the rounds, not after
    except ValueError as e:
        ap.error(str(e))
    builds = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    for label, path in builds.items():
        if not (Path(path) / "specdec_kernels" / "__init__.py").exists():
            ap.error(f"--{label} {path} holds no specdec_kernels checkout")
    common = ["--batch", str(args.batch), "--k", str(args.k), "--vocab", str(args.vocab), "--threads",
              str(args.threads), "--dtypes", ",".join(args.dtypes), "--modes", ",".join(args.modes),
              "--families", ",".join(args.families),
              "--reps", str(args.reps)]
    times: dict[str, dict[str, list[float]]] = {}  # key -> build -> one value per round
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    envs = {label: {**env, **({"SPECDEC_CPU_ISA": isa} if isa else {})}
            for label, isa in (("before", args.before_isa), ("after", args.after_isa))}
    isas: dict[str, set[str]] = {"before": set(), "after": set()}  # each build's picks (SPECDEC_CPU_ISA caps them)
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for label in order:
            cmd = [sys.executable, "-m", "benchmarks.ab_builds", "--worker", "--package", builds[label], *common]
            proc = subprocess.run(cmd, cwd=REPO, env=envs[label], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"ab_builds: the {label} build failed: {proc.stderr.strip().splitlines()[-1:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            isas[label].add(result["isa"])
            for key, value in result.items():
                if key not in ("package", "isa"):
                    times.setdefault(key, {"before": [], "after": []})[label].append(value)
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    import torch

    info = {**provenance(torch.device("cpu")), "git_commit": git_commit()}
    isa = os.environ.get("SPECDEC_CPU_ISA")  # part of the command and the device: it picks the build both run
    command = (f"SPECDEC_CPU_ISA={isa} " if isa else "") + "python -m benchmarks.ab_builds " + \
        " ".join(sys.argv[1:] if argv is None else argv)
    picked = {label: "/".join(sorted(v)) for label, v in isas.items()}  # the builds' picks on this CPU
    info["device"] += (f" isa={picked['after']}" if picked["before"] == picked["after"]
                       else f" isa before={picked['before']} after={picked['after']}")
    commits = {label: _commit_of(path) for label, path in builds.items()}
    pair = args.pair or f"ab_cpu_{commits['before'][:7]}_vs_{commits['after'][:7]}"
    with CsvWriter(args.out, COLUMNS, append=True) as writer:
        for key, by in times.items():
            if key.startswith("need/"):
                continue
            (b_med, b_min, b_max), (a_med, a_min, a_max) = (
                (statistics.median(by[label]), min(by[label]), max(by[label])) for label in ("before", "after"))
            row = {**info, "provider": "read" if key.startswith("read_gbs") else "ours",
                   "status": "ok", "pair": pair, "case": key, "before_commit": commits["before"],
                   "after_commit": commits["after"], "rounds": args.rounds, "repeats": args.reps,
                   "median_ms": f"{a_med:.4g}", "min_ms": f"{a_min:.4g}",
                   "before_median_ms": f"{b_med:.4g}", "before_min_ms": f"{b_min:.4g}",
                   "before_max_ms": f"{b_max:.4g}", "after_median_ms": f"{a_med:.4g}",
                   "after_min_ms": f"{a_min:.4g}", "after_max_ms": f"{a_max:.4g}",
                   "after_over_before": f"{a_med / b_med:.4g}", "command": command}
            if not key.startswith("read_gbs"):
                family, dtype = key.split("/")[:2]
                read = times[f"read_gbs/{family}/{dtype}"]
                need = times[f"need/{key}"]
                row["must_read_bytes"] = int(need["after"][0])
                for label in ("before", "after"):  # per round: that process's time and read bandwidth
                    fractions = [n / (t / 1e3) / (gbs * 1e9) for n, t, gbs in zip(need[label], by[label], read[label],
                                                                                  strict=True)]
                    row[f"{label}_read_fraction"] = f"{statistics.median(fractions):.4g}"
            writer.write(row)
    print(f"appended {pair} to {args.out}")


if __name__ == "__main__":
    main()
