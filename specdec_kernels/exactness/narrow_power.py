"""Measured power of the narrow cases (``chain_law.NARROW_CASES``) against the planted bugs they are for.

``python -m specdec_kernels.exactness.narrow_power`` prints, for each planted bug whose suite case is a narrow
one (the shared-stream class of ``chain_mutants``): the smallest trial count on a doubling grid at which the
case rejects the bug at the suite's alpha, the seconds (wall and CPU) of that run, the statistic at the case's
design sample size, and the trial count that gives power 0.999 at the noncentrality measured there
(``lambda / n = (chi2 - df) / n``, the noncentral chi-square approximation of ``goodness_of_fit.chi2_power``).
Every run is seeded, so the grid result is one realisation; the last column is the design figure.
``--out FILE`` also writes the rows as JSON with the command, the commit and the machine (the audit reports'
``environment``, ``audit.runner.machine_environment``): the table of docs/exactness-and-audit.md is checked
against ``results/audit/narrow_power.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from . import chain_mutants
from . import goodness_of_fit as gof
from .chain_law import MUTANT_CASES, NarrowCase, case_by_name, check_narrow_law

__all__ = ["NarrowPower", "NARROW_BUGS", "measure", "record", "trials_for_power"]

NARROW_BUGS = tuple(bug for bug in chain_mutants.MUTANTS if isinstance(case_by_name(MUTANT_CASES[bug]), NarrowCase))
"""The planted bugs whose suite case is a narrow one."""

GRID_STOP = 1_000_000
"""The doubling grid's last trial count: a bug not rejected by then is reported as not rejected."""


@dataclass(frozen=True)
class NarrowPower:
    bug: str
    case: str
    rejecting_trials: int | None  # smallest grid value that rejects (None: none up to the grid's end)
    pvalue: float  # at rejecting_trials (or at the grid's end)
    wall_seconds: float  # of that run
    cpu_seconds: float
    design_trials: int
    design_statistic: float
    design_df: int
    power_trials: int  # trials for power 0.999 at the measured noncentrality

    def line(self) -> str:
        found = (f"rejects at n={self.rejecting_trials:,} (p={self.pvalue:.2g}, {self.wall_seconds:.2f} s wall, "
                 f"{self.cpu_seconds:.2f} s CPU)" if self.rejecting_trials else f"not rejected (p={self.pvalue:.2g})")
        return (f"{self.bug}: case {self.case}: {found}; design n={self.design_trials:,}: chi2={self.design_statistic:.0f} "
                f"df={self.design_df}; power 0.999 at about n={self.power_trials:,}")


def trials_for_power(noncentrality_per_trial: float, df: int, alpha: float, power: float = 0.999) -> int:
    """Smallest n (within 1%) with ``P(ncx2(df, n * noncentrality_per_trial) > chi2.isf(alpha, df)) >= power``."""
    if noncentrality_per_trial <= 0:
        raise ValueError("noncentrality_per_trial must be positive (the bug shows no signal)")
    critical = stats.chi2.isf(alpha, df)
    n = 1
    while stats.ncx2.sf(critical, df, n * noncentrality_per_trial) < power:
        n = int(n * 1.01) + 1
    return n


def measure(bug: str, start: int = 250, stop: int = GRID_STOP, alpha: float = gof.SUITE_BUDGET.per_test_alpha
            ) -> NarrowPower:
    """Power figures of the narrow case of ``bug`` (one of :data:`NARROW_BUGS`) against it; grid start..stop."""
    if bug not in NARROW_BUGS:
        raise ValueError(f"bug must be one of {NARROW_BUGS}, got {bug!r}")
    case = case_by_name(MUTANT_CASES[bug])
    verify = chain_mutants.mutant_verifier(bug)
    n, found = start, None
    while n <= stop:
        wall, cpu = time.perf_counter(), time.process_time()
        check = check_narrow_law(verify, case, alpha, num_samples=n)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if check.result.rejects(alpha):
            found = n
            break
        n *= 2
    design_check = check_narrow_law(verify, case, alpha, looks=False)  # the fixed design size, one look
    design, design_n = design_check.result, design_check.num_samples
    signal = max(design.statistic - design.df, 0.0) / design_n
    power_n = trials_for_power(signal, design.df, alpha) if signal > 0 else 0
    return NarrowPower(bug, case.name, found, check.result.pvalue, wall, cpu, design_n, design.statistic,
                       design.df, power_n)


def record(rows: list[NarrowPower], command: str, env: dict, start: int) -> dict:
    """The JSON artefact of one run: the command, its environment, the grid and one object per bug (the fields
    of :class:`NarrowPower`)."""
    return {"tool": "specdec_kernels.exactness.narrow_power", "command": command, "environment": env,
            "alpha": gof.SUITE_BUDGET.per_test_alpha, "grid": {"start": start, "stop": GRID_STOP, "factor": 2},
            "power": 0.999, "rows": [dataclasses.asdict(r) for r in rows]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_kernels.exactness.narrow_power",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--bugs", default=",".join(NARROW_BUGS), help=f"comma-separated subset of {','.join(NARROW_BUGS)}")
    parser.add_argument("--start", type=int, default=250, help="first trial count of the doubling grid (default 250)")
    parser.add_argument("--out", type=Path, help="also write the rows and their provenance to this JSON file")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    bugs = [b.strip() for b in args.bugs.split(",") if b.strip()]
    unknown = [b for b in bugs if b not in NARROW_BUGS]
    if unknown or not bugs or args.start < 1:
        parser.exit(2, f"narrow_power: error: --bugs from {','.join(NARROW_BUGS)}; --start >= 1\n")
    # The audit reports' provenance fields, taken before the first row (the commit the rows ran at); imported
    # here, not at module level: the audit imports this package, not the reverse.
    from ..audit.runner import machine_environment

    env = machine_environment() if args.out else {}
    rows = []
    for bug in bugs:
        rows.append(measure(bug, args.start))
        print(rows[-1].line(), flush=True)
    if args.out:
        command = " ".join(["python -m specdec_kernels.exactness.narrow_power", *map(shlex.quote, argv)])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record(rows, command, env, args.start), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
