"""Run an audit: every selected family's cases against one target, into an :class:`AuditReport`."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..exactness import goodness_of_fit as gof
from .audit_target import AuditTarget
from .families import ERROR, FAIL, FAMILIES, MISSED, AuditOptions, Outcome, case_names, run_family

__all__ = ["AuditReport", "run_audit", "STATISTICAL_FAMILIES"]

STATISTICAL_FAMILIES = ("first-token", "sequence", "narrow")


@dataclass
class AuditReport:
    """Everything a report shows: the target, how it was run, and every case's outcome."""

    target: AuditTarget
    command: str
    options: AuditOptions
    families: tuple[str, ...]
    outcomes: list[Outcome] = field(default_factory=list)
    environment: dict = field(default_factory=dict)
    seconds: float = 0.0
    complete: bool = True  # False when a time budget stopped the run (resume it with the same command)
    sessions: int = 1  # runs (resumptions) that produced the outcomes

    @property
    def refused(self) -> bool:
        return self.target.verify is None

    def of(self, family: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.family == family]

    @property
    def num_statistical_tests(self) -> int:
        """Law tests run on the target itself (mutant tests are expected to reject and claim no slot)."""
        return sum(1 for o in self.outcomes if o.family in STATISTICAL_FAMILIES and o.pvalue is not None)

    @property
    def family_wise_bound(self) -> float:
        """Union bound on the probability that any law test of a lossless verifier rejects."""
        return self.num_statistical_tests * self.options.alpha

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.verdict in (FAIL, ERROR) and o.family != "mutants"]

    @property
    def missed_mutants(self) -> list[Outcome]:
        return [o for o in self.of("mutants") if o.verdict in (MISSED, ERROR)]

    def verdict(self) -> str:
        """One word: REFUSED, LOSSY (a law case rejects), FAIL (another check fails), or PASS."""
        if self.refused:
            return "REFUSED"
        if not self.complete:
            return "INCOMPLETE"
        if any(o.verdict == FAIL for o in self.outcomes if o.family in STATISTICAL_FAMILIES + ("greedy",)):
            return "LOSSY"
        if self.failures:
            return "FAIL"
        return "PASS"

    def counts(self, family: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.of(family):
            out[o.verdict] = out.get(o.verdict, 0) + 1
        return out


def _git_commit() -> str | None:
    """The source tree's commit, with "+modified" when tracked files differ from it; outside git (a copy of
    the tree, as on a lent GPU machine) ``$SPECDEC_GIT_COMMIT``, else None."""
    try:
        root = str(Path(__file__).resolve().parent)  # git finds the checkout from any folder inside it
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if head:
            return head + ("+modified" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("SPECDEC_GIT_COMMIT") or None


def run_audit(
    target: AuditTarget,
    families: tuple[str, ...] = FAMILIES,
    options: AuditOptions | None = None,
    command: str = "",
    progress: Callable[[Outcome], None] | None = None,
    previous: AuditReport | None = None,
    max_seconds: float | None = None,
) -> AuditReport:
    """Run ``families`` of the audit against ``target``; ``progress`` sees each outcome as it finishes.

    Each law test claims a slot of a fresh copy of the suite's false-positive budget
    (:data:`gof.SUITE_BUDGET`: 1e-4 over at most 250 tests, alpha = 4e-7 each), so a report can never hold
    more tests than the bound covers. ``previous``: an incomplete report of the same audit whose outcomes are
    kept (their cases are not rerun: every case is seeded, so a rerun would repeat them). ``max_seconds``:
    start no new case after this long; the report is then incomplete.
    """
    options = options or AuditOptions()
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"families must be among {FAMILIES}, got {unknown}")
    if target.system is not None:  # an end-to-end system has cases in its own families only
        families = tuple(f for f in families if f in target.system.families)
    report = AuditReport(target, command, options, tuple(families), environment=_environment(target))
    if report.refused:
        return report
    budget = gof.FalsePositiveBudget(gof.SUITE_BUDGET.total_alpha, gof.SUITE_BUDGET.capacity)
    kept = {f"{o.family}:{o.name}": o for o in previous.outcomes} if previous is not None else {}
    if previous is not None:
        report.seconds, report.sessions = previous.seconds, previous.sessions + 1
    options = dataclasses.replace(options, done=frozenset(kept))
    start = time.perf_counter()
    for family in families:
        fresh = iter(run_family(target, family, options))
        for outcome in _in_case_order(case_names(family, target), family, kept, fresh):
            if family in STATISTICAL_FAMILIES and outcome.pvalue is not None:
                budget.claim(f"{family}:{outcome.name}")
            report.outcomes.append(outcome)
            if f"{family}:{outcome.name}" in kept:
                continue
            if progress is not None:
                progress(outcome)
            if max_seconds is not None and time.perf_counter() - start > max_seconds:
                report.complete = False  # every session runs at least one new case
                break
        if not report.complete:
            break
    report.seconds += time.perf_counter() - start
    return report


def _in_case_order(names: list[str], family: str, kept: dict[str, Outcome], fresh):
    """Kept outcomes and freshly run ones, merged in the family's case order ``names``."""
    ran = {}
    for name in names:
        key = f"{family}:{name}"
        if key in kept:
            yield kept[key]
            continue
        while name not in ran:
            outcome = next(fresh, None)
            if outcome is None:
                break
            ran[outcome.name] = outcome
        if name in ran:
            yield ran.pop(name)


def _device() -> str:
    """The machine: the CPU model (from /proc/cpuinfo where there is one) and, with CUDA, the GPU's name."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {torch.cuda.get_device_name()}" if torch.cuda.is_available() else cpu


def machine_environment() -> dict:
    """Our version, the commit (``+modified`` for a tree with uncommitted changes), Python, torch and the
    machine: the provenance every report under results/audit records."""
    from importlib import metadata

    try:
        ours = metadata.version("specdec-kernels")
    except metadata.PackageNotFoundError:
        ours = "source tree"
    env = {
        "specdec_kernels": ours,
        "commit": _git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": f"{platform.system()} {platform.machine()}",
        "device": _device(),
        "cuda_available": torch.cuda.is_available(),
        "torch_threads": torch.get_num_threads(),
    }
    return env


def _environment(target: AuditTarget) -> dict:
    env = machine_environment()
    env.update(target.versions)
    return env
