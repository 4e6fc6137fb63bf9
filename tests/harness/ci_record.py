"""The record of one ``bash .ci/run``: how long each phase took and what the test runs reported.

``.ci/run`` calls this last, with the phases' seconds and the pytest logs of the fast tier and the whole
suite; the JSON it writes (``results/ci/ci_run.json``) carries the command, commit and machine like every
artefact, and ``tests/docs/test_readme.py`` checks the README's and the design page's durations and test
counts against it. Usage::

    python -m tests.harness.ci_record --out results/ci/ci_run.json --install-s 310 --fast-s 61 \\
        --tests-s 1090 --total-s 1470 --fast-log fast.log --tests-log tests.log
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rl_loop.run.provenance import provenance

COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)\b")


def pytest_counts(log: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``1519 passed, 15 skipped, 60 warnings in 1337.53s``)."""
    lines = [line for line in log.splitlines() if re.search(r"\bin [\d.]+s\b", line) and COUNT.search(line)]
    if not lines:
        raise ValueError("no pytest summary line in the log")
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for number, kind in COUNT.findall(lines[-1]):
        counts["errors" if kind.startswith("error") else kind] = int(number)
    return counts


def _run(counts: dict[str, int]) -> int:
    """How many tests a run collected and ran or skipped (not those it deselected)."""
    return sum(n for kind, n in counts.items() if kind != "deselected")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m tests.harness.ci_record", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    for phase in ("install", "fast", "tests", "total"):
        ap.add_argument(f"--{phase}-s", type=int, required=True, help=f"seconds the {phase} phase took")
    ap.add_argument("--fast-log", type=Path, required=True, help="pytest output of the fast tier")
    ap.add_argument("--tests-log", type=Path, required=True, help="pytest output of the whole suite")
    args = ap.parse_args(argv)
    try:
        fast, tests = (pytest_counts(path.read_text(errors="replace")) for path in (args.fast_log, args.tests_log))
    except (OSError, ValueError) as e:
        ap.error(f"--fast-log / --tests-log: {e}")
    record = {**provenance(command="bash .ci/run"), "install_s": args.install_s, "fast_tier_s": args.fast_s,
              "tests_s": args.tests_s, "total_s": args.total_s,
              "fast_tier": fast, "fast_tier_tests": _run(fast), "suite": tests, "suite_tests": _run(tests)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
