"""Render an :class:`AuditReport` as JSON (every field) and Markdown (what a bug report needs)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .families import FAIL, FAMILIES, MISSED, AuditOptions, Outcome
from .runner import STATISTICAL_FAMILIES, AuditReport

__all__ = ["to_json", "to_markdown", "write_report", "report_stem"]

VERDICTS = ("pass", "FAIL", "n/a", "error", "caught", "MISSED", "inert")
TITLES = {
    "first-token": "First-token law",
    "sequence": "Whole-sequence law (full speculative loop)",
    "greedy": "Greedy identity",
    "batch": "Replay and batch invariance",
    "bad-input": "Bad input",
    "mutants": "Power on this adapter path: the suite's planted bugs",
    "narrow": "Narrow shared-stream design (V = 16, draft ranking reversed)",
}


def report_stem(name: str) -> str:
    """File name stem for a target name (``module:function`` -> ``module_function``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "target"


def to_json(report: AuditReport) -> dict:
    t = report.target
    return {
        "tool": "specdec_kernels.audit",
        "command": report.command,
        "target": {"name": t.name, "description": t.description, "supports": sorted(t.supports),
                   "refusal": t.refusal, "versions": t.versions},
        "verdict": report.verdict(),
        "level": {"alpha_per_test": report.options.alpha, "num_statistical_tests": report.num_statistical_tests,
                  "family_wise_bound": report.family_wise_bound, "tv": report.options.tv,
                  "power": report.options.power, "mutant_tv": report.options.mutant_tv,
                  "narrow_trials": report.options.narrow_trials},
        "families": list(report.families),
        "cases_filter": list(report.options.cases) if report.options.cases else None,
        "environment": report.environment,
        "seconds": round(report.seconds, 1),
        "complete": report.complete,
        "sessions": report.sessions,
        "outcomes": [o.as_dict() for o in report.outcomes],
    }


def _fmt_p(p: float | None) -> str:
    if p is None:
        return ""
    if p == 0:
        return "0"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def _fmt_stat(x: float | None) -> str:
    if x is None:
        return ""
    return "inf" if not math.isfinite(x) else f"{x:.1f}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _law_table(outcomes: list[Outcome]) -> list[str]:
    lines = ["| case | configuration | verdict | n | test | statistic | df | p-value | power |",
             "|---|---|---|---:|---|---:|---:|---:|---:|"]
    for o in outcomes:
        verdict = f"**{o.verdict}**" if o.verdict in (FAIL, MISSED, "error") else o.verdict
        power = f"{o.power:.4f}" if o.power is not None else ""
        n = f"{o.num_samples:,}" if o.num_samples else ""
        lines.append(f"| {o.name} | {_escape(o.detail)} | {verdict} | {n} | {o.test or ''} | {_fmt_stat(o.statistic)} | "
                     f"{o.df if o.df is not None else ''} | {_fmt_p(o.pvalue)} | {power} |")
    return lines


def _plain_table(outcomes: list[Outcome]) -> list[str]:
    lines = ["| case | verdict | detail |", "|---|---|---|"]
    for o in outcomes:
        verdict = f"**{o.verdict}**" if o.verdict in (FAIL, "error") else o.verdict
        lines.append(f"| {_escape(o.name)} | {verdict} | {_escape(o.detail)} |")
    return lines


def _cells(o: Outcome) -> list[str]:
    lines = [f"**{o.name}** ({_escape(o.detail)}): p = {_fmt_p(o.pvalue)}, n = {o.num_samples:,}, "
             f"{o.test} statistic {_fmt_stat(o.statistic)}, df {o.df}. Largest gaps:", "",
             "| cell | observed | expected |", "|---|---:|---:|"]
    lines += [f"| {c['cell']} | {c['observed']:,} | {c['expected']:,.1f} |" for c in o.cells or []]
    return lines + [""]


def to_markdown(report: AuditReport) -> str:
    t = report.target
    verdict = report.verdict()
    out = [f"# Audit of `{t.name}`: {verdict}", "", t.description, ""]
    out += [f"Reproduce: `{report.command}`", ""]
    if not report.complete:
        out += ["**Incomplete:** a time budget stopped this run; rerun the command with `--resume`.", ""]
    env = report.environment
    versions = ", ".join(f"{k} {v}" for k, v in env.items() if v is not None and k not in ("cuda_available",))
    out += [f"Environment: {versions}.", ""]
    if report.refused:
        out += [f"**Refused:** {t.refusal}", ""]
        return "\n".join(out)
    opts = report.options
    m = report.num_statistical_tests
    out += [
        f"Level: every law test runs at alpha = {opts.alpha:.1e} (the suite's budget, 1e-4 over at most 250 tests); "
        f"this report holds {m} law tests, so a lossless verifier fails any of them with probability at most "
        f"{report.family_wise_bound:.1e}. Sample sizes detect any total-variation error >= {opts.tv:g} in the "
        f"tested law with probability >= {opts.power:g} (the power column: chi-square noncentrality bound; "
        f"exact for one-outcome laws); the planted-bug runs are sized for {opts.mutant_tv:g}. A rejected case "
        "is evidence of a lossy verifier, not a flaky test: inputs and seeds are fixed."
        + (f" The narrow cases run at {opts.narrow_trials:,} trials each (`--narrow-trials`; their power column "
           "is at that n)." if opts.narrow_trials is not None else ""), "",
        f"Run time {report.seconds:.0f} s" + (f" over {report.sessions} sessions." if report.sessions > 1 else "."),
        "",
        "| family | " + " | ".join(VERDICTS) + " |",
        "|---|" + "---:|" * len(VERDICTS),
    ]
    for family in report.families:
        c = report.counts(family)
        out.append(f"| {family} | " + " | ".join(str(c.get(v, 0)) for v in VERDICTS) + " |")
    out.append("")
    rejected = [o for o in report.outcomes if o.family in STATISTICAL_FAMILIES and o.verdict == FAIL]
    if rejected:
        out += ["## Rejected law cases", ""]
        for o in rejected:
            out += _cells(o)
    others = [o for o in report.failures if o not in rejected]
    if others:
        out += ["## Other failures", ""] + _plain_table(others) + [""]
    for family in FAMILIES:
        if family not in report.families or not report.of(family):
            continue
        out += [f"## {TITLES[family]}", ""]
        if family in STATISTICAL_FAMILIES or family == "mutants":
            out += _law_table(report.of(family))
        else:
            out += _plain_table(report.of(family))
        out.append("")
    return "\n".join(out)


def load_previous(out_dir: str | Path, target, command: str) -> AuditReport | None:
    """The incomplete report of the same audit (same target and canonical command) in ``out_dir``, or None
    when there is none; ValueError when the report there is of another audit or already complete."""
    path = Path(out_dir) / f"{report_stem(target.name)}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("command") != command:
        raise ValueError(f"{path} holds another audit ({data.get('command')!r}); use another --out")
    if data.get("complete", True):
        raise ValueError(f"{path} is already complete; nothing to resume")
    report = AuditReport(target, command, AuditOptions(), tuple(data["families"]))
    for d in data["outcomes"]:
        stat = d.get("statistic")
        d["statistic"] = float(stat) if isinstance(stat, str) else stat
        report.outcomes.append(Outcome(**d))
    report.seconds, report.sessions = float(data.get("seconds", 0.0)), int(data.get("sessions", 1))
    return report


def write_report(report: AuditReport, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``<stem>.md`` and ``<stem>.json`` into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = report_stem(report.target.name)
    md, js = out_dir / f"{stem}.md", out_dir / f"{stem}.json"
    md.write_text(to_markdown(report) + "\n")
    js.write_text(json.dumps(to_json(report), indent=1) + "\n")
    return md, js
