"""``python -m specdec_kernels.audit TARGET``: audit a verifier, write a Markdown + JSON report.

TARGET is a built-in name (``reference``, ``cpu``, ``triton``, ``cuda``, ``cuda-emulated`` (our CUDA kernels
through the CUDA host emulation, on CPU), ``vllm-v1-cpu``, ``vllm-v1-triton``,
``vllm-v1-cpu-expand-fixed``, ``vllm-v1-cpu-fixed`` (diagnostics), ``vllm-v1-plugin``, ``vllm-v2-triton``
(``-block``, ``-synthetic``: V2's other rejection methods), ``flashinfer``, ``sglang``, ``transformers``,
``transformers-assisted`` (assisted generation end to end: its own law cases, greedy and negative controls) or
``package.module:function`` naming a verifier with ``specdec_kernels.verify_chain``'s positional signature (or an
``AuditTarget``).

``--vllm-src DIR`` audits ``vllm-v1-triton`` or a V2 target against the vLLM Python sources unpacked in DIR (a
release's wheel without its ``.so`` files) instead of the installed vLLM: the audit reruns itself in a subprocess with DIR first on
PYTHONPATH and ``VLLM_TARGET_DEVICE=cpu`` (as ``tests/vllm/test_vllm_033.py`` imports 0.33), and names its report
``<target>-<version>``.

Exit status: 0 every check passed (and every planted bug was caught), 1 a check failed or a planted bug
was missed, 2 bad arguments or a target that cannot run here (one line on stderr; the report then records
the refusal), 3 stopped by ``--max-seconds`` (rerun the same command with ``--resume`` to go on; the report
records the command without those two options: every case is seeded, so a resumed audit equals one run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

FAMILY_NAMES = ("first-token", "sequence", "greedy", "batch", "bad-input", "mutants", "narrow")
VLLM_V2 = ("vllm-v2-triton", "vllm-v2-triton-block", "vllm-v2-triton-synthetic")  # targets.VLLM_V2
INTERPRETED = ("triton", "vllm-v1-triton", *VLLM_V2)
VLLM_SRC = ("vllm-v1-triton", *VLLM_V2)  # the targets --vllm-src applies to
VLLM_SRC_ENV = "SPECDEC_AUDIT_VLLM_SRC"  # set in the subprocess that --vllm-src starts: the sources it imports
SOURCE_RELEASES = {"vllm-v1-triton": "0.32.x or 0.33.x", **dict.fromkeys(VLLM_V2, "0.28.0 to 0.33.x")}
"""The vLLM releases each --vllm-src target was read against (vllm_targets, vllm_v2), for the refusal line."""
MAX_NARROW_TRIALS = 10_000_000  # 2 x 10^7 target rows of V = 16: about 1.3 GB of float32 logits


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        self.exit(2, f"audit: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m specdec_kernels.audit",
        description="Audit a speculative-decoding verifier for losslessness: first-token and whole-sequence "
        "law cases at a fixed false-positive budget and stated power, greedy identity, batch invariance, the "
        "bad-input table, and the suite's planted bugs run through the same adapter path. Writes "
        "<out>/<target>.md and <out>/<target>.json.",
    )
    p.add_argument("target", help="built-in target name or package.module:function")
    p.add_argument("--out", default="audit-report", help="output folder (default: audit-report)")
    p.add_argument("--families", default=",".join(FAMILY_NAMES),
                   help=f"comma-separated subset of {','.join(FAMILY_NAMES)} (default: all)")
    p.add_argument("--cases", default=None, help="comma-separated substrings: run only cases whose name holds one")
    p.add_argument("--tv", type=float, default=0.02,
                   help="smallest total-variation error to detect (sets the sample sizes; default 0.02)")
    p.add_argument("--power", type=float, default=0.999, help="probability of detecting it (default 0.999)")
    p.add_argument("--mutant-tv", type=float, default=0.02,
                   help="total-variation error the planted-bug runs are sized for (default 0.02, the suite's)")
    p.add_argument("--narrow-trials", type=int, default=None, metavar="N",
                   help="trials of each narrow (V = 16) case, e.g. 200000 as vLLM's test (default: from --tv and "
                   "--power)")
    p.add_argument("--method", default="token", choices=("token", "block", "traversal"),
                   help="verification method passed to our own backends (default token)")
    p.add_argument("--vllm-src", default=None, metavar="DIR",
                   help=f"audit {', '.join(VLLM_SRC)} against the vLLM Python sources in DIR (an unpacked "
                   "release wheel, e.g. .cache/vllm-0.33.0) instead of the installed vLLM; the report is named "
                   "<target>-<version>")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no new case after this many seconds; the report is then INCOMPLETE (exit 3)")
    p.add_argument("--resume", action="store_true",
                   help="keep the cases an INCOMPLETE report of this same audit in --out already holds")
    return p


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    unknown = [f for f in families if f not in FAMILY_NAMES]
    if unknown or not families:
        parser.error(f"--families: unknown {unknown or 'empty'}; choose from {','.join(FAMILY_NAMES)}")
    if not 0 < args.tv < 1:
        parser.error(f"--tv must be in (0, 1), got {args.tv}")
    if not 0 < args.mutant_tv < 1:
        parser.error(f"--mutant-tv must be in (0, 1), got {args.mutant_tv}")
    if not 0 < args.power < 1:
        parser.error(f"--power must be in (0, 1), got {args.power}")
    if args.narrow_trials is not None and not 1 <= args.narrow_trials <= MAX_NARROW_TRIALS:
        parser.error(f"--narrow-trials must be in [1, {MAX_NARROW_TRIALS:,}], got {args.narrow_trials}")
    if args.vllm_src is not None:
        if args.target not in VLLM_SRC:
            parser.error(f"--vllm-src applies to {', '.join(VLLM_SRC)}, not {args.target}")
        if not (Path(args.vllm_src) / "vllm" / "__init__.py").is_file():
            parser.error(f"--vllm-src: no vllm package in {args.vllm_src} (unpack a wheel of a vLLM release "
                         f"{args.target} reads there: {SOURCE_RELEASES[args.target]})")
    args.families = families
    args.cases = tuple(c.strip() for c in args.cases.split(",") if c.strip()) if args.cases else None
    return args


def _progress(outcome) -> None:
    parts = [f"[{outcome.family}] {outcome.name}: {outcome.verdict}"]
    if outcome.pvalue is not None:
        parts.append(f"p={outcome.pvalue:.3g} n={outcome.num_samples:,}")
    elif outcome.verdict not in ("pass",):
        parts.append(outcome.detail[:160])
    parts.append(f"({outcome.seconds:.1f} s)")
    print(" ".join(parts), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.vllm_src is not None and os.environ.get(VLLM_SRC_ENV) != os.path.abspath(args.vllm_src):
        return _rerun_on_vllm_sources(argv, os.path.abspath(args.vllm_src))
    if args.target in INTERPRETED:
        import torch

        if not torch.cuda.is_available():  # Triton on CPU tensors runs only in its interpreter
            os.environ.setdefault("TRITON_INTERPRET", "1")
    from .families import AuditOptions
    from .report import write_report
    from .runner import run_audit
    from .targets import TargetError, resolve_target

    try:
        target = resolve_target(args.target, args.method)
    except TargetError as exc:
        print(f"audit: error: {exc}", file=sys.stderr)
        return 2
    if target.system is not None and not set(args.families) & set(target.system.families):
        print(f"audit: error: --families: {target.name} has cases in {','.join(target.system.families)} only",
              file=sys.stderr)
        return 2
    if args.vllm_src is not None:
        source = Path(args.vllm_src).resolve()
        imported = Path(sys.modules["vllm"].__file__).resolve() if "vllm" in sys.modules else None
        if imported is not None and not imported.is_relative_to(source):
            print(f"audit: error: --vllm-src: this process imported vLLM from {imported.parent}, not {source}",
                  file=sys.stderr)
            return 2
        if "vllm" in target.versions:
            target = dataclasses.replace(target, name=f"{target.name}-{target.versions['vllm']}")
    command = "python -m specdec_kernels.audit " + shlex.join(_canonical(argv))
    options = AuditOptions(tv=args.tv, power=args.power, cases=args.cases, mutant_tv=args.mutant_tv,
                           narrow_trials=args.narrow_trials)
    previous = None
    if args.resume:
        from .report import load_previous

        try:
            previous = load_previous(args.out, target, command)
        except ValueError as exc:
            print(f"audit: error: --resume: {exc}", file=sys.stderr)
            return 2
    report = run_audit(target, args.families, options, command, progress=None if args.quiet else _progress,
                       previous=previous, max_seconds=args.max_seconds)
    md, js = write_report(report, args.out)
    if report.refused:
        print(f"audit: {target.name} cannot run here: {target.refusal} (report: {md})", file=sys.stderr)
        return 2
    print(f"audit: {target.name}: {report.verdict()}; report {md} and {js}", file=sys.stderr)
    if not report.complete:
        return 3
    return 0 if report.verdict() == "PASS" and not report.missed_mutants else 1


def _rerun_on_vllm_sources(argv: list[str], source: str) -> int:
    """This audit in a subprocess that imports vLLM from ``source`` (and this specdec_kernels); its exit status."""
    repo = Path(__file__).resolve().parents[2]
    path = [source, str(repo), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), VLLM_TARGET_DEVICE="cpu")
    env[VLLM_SRC_ENV] = source
    return subprocess.run([sys.executable, "-m", "specdec_kernels.audit", *argv], env=env).returncode


def _canonical(argv: list[str]) -> list[str]:
    """``argv`` without the options that only split a run (``--resume``, ``--max-seconds``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume" or arg.startswith("--max-seconds="):
            continue
        elif arg == "--max-seconds":
            skip = True
        else:
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main())
