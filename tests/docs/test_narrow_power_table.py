"""The narrow cases' power table of docs/exactness-and-audit.md is results/audit/narrow_power.json (written by
``python -m specdec_kernels.exactness.narrow_power --out``): trial counts, p-values, chi2 and df exactly as the
tool formats them, the seconds (machine-dependent) as the artefact holds them to the digits shown, and the
prose names the artefact's command, commit and machine."""

from __future__ import annotations

import copy
import json
import re

import pytest

from specdec_kernels.audit.matrix import audit_reports
from specdec_kernels.exactness import narrow_power
from tests.conftest import REPO

PAGE = REPO / "docs" / "exactness-and-audit.md"
ARTEFACT = REPO / "results" / "audit" / "narrow_power.json"
HEADER = "| mutant | case | smallest n rejecting (doubling from 250) |"


def docs_rows(text: str) -> list[list[str]]:
    """The cells of the table's rows (header and rule left out)."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _as_shown(shown: str, value: float) -> bool:
    """``shown`` is ``value`` rounded to the digits written (decimals, or trailing zeros of an integer), with at
    least two significant digits."""
    digits = shown.replace(",", "")
    if "." in digits:
        step = 10.0 ** -len(digits.split(".")[1])
    else:
        step = 10.0 ** (len(digits) - len(digits.rstrip("0")))
    significant = len(digits.replace(".", "").lstrip("0").rstrip("0" if "." not in digits else ""))
    return significant >= 2 and abs(float(digits) - value) <= step / 2 * (1 + 1e-9)


def table_problems(text: str, record: dict) -> list[str]:
    """What the page's table and its prose say that the artefact does not."""
    rows, expected = docs_rows(text), record["rows"]
    if [r[0] for r in rows] != [f"`{e['bug']}`" for e in expected]:
        return [f"the table's mutants {[r[0] for r in rows]} are not the artefact's {[e['bug'] for e in expected]}"]
    problems = []
    for cells, e in zip(rows, expected, strict=True):
        bug = e["bug"]
        exact = {"case": f"`{e['case']}`", "smallest n": f"{e['rejecting_trials']:,} (p = {e['pvalue']:.2g})",
                 "chi2": f"{round(e['design_statistic']):,} (df {e['design_df']})"}
        for (column, want), got in zip(exact.items(), (cells[1], cells[2], cells[4]), strict=True):
            if got != want:
                problems.append(f"{bug} {column}: the page says {got!r}, the artefact {want!r}")
        seconds = re.fullmatch(r"([\d.]+) \(([\d.]+)\)", cells[3])
        if not seconds or not (_as_shown(seconds.group(1), e["cpu_seconds"])
                               and _as_shown(seconds.group(2), e["wall_seconds"])):
            problems.append(f"{bug} seconds: the page says {cells[3]!r}, the artefact "
                            f"{e['cpu_seconds']:.3g} CPU ({e['wall_seconds']:.3g} wall)")
        power = re.fullmatch(r"about ([\d,]+)", cells[5])
        if not power or not _as_shown(power.group(1), e["power_trials"]):
            problems.append(f"{bug} n for power 0.999: the page says {cells[5]!r}, the artefact {e['power_trials']:,}")
    prose = " ".join(text.split())
    env = record["environment"]
    designs = sorted({e["design_trials"] for e in expected})
    stated = [f"`{record['command']}` at commit {env['commit']}", f"({env['device']}, {env['torch_threads']} torch threads)",
              "a machine shared with other jobs", f"({' and '.join(f'{n:,}' for n in designs)} trials)"]
    problems += [f"the page does not say {s!r}" for s in stated if s not in prose]
    return problems


def test_docs_table_is_the_artefact():
    record = json.loads(ARTEFACT.read_text())
    assert record["tool"] == "specdec_kernels.exactness.narrow_power"
    assert [r["bug"] for r in record["rows"]] == list(narrow_power.NARROW_BUGS)
    assert table_problems(PAGE.read_text(), record) == []


def test_artefact_is_not_an_audit_report():
    """The audit matrix and the e2e table read the reports beside it, not it."""
    reports = audit_reports(ARTEFACT.parent)
    assert "narrow_power" not in reports and "cpu" in reports


def test_the_check_rejects_a_planted_table_or_artefact():
    text, record = PAGE.read_text(), json.loads(ARTEFACT.read_text())
    planted = copy.deepcopy(record)
    planted["rows"][0]["rejecting_trials"] *= 2
    planted["rows"][1]["pvalue"] *= 3
    planted["rows"][2]["design_statistic"] += 1
    planted["rows"][2]["cpu_seconds"] *= 1.5
    planted["rows"][0]["power_trials"] += 2000
    planted["environment"]["device"] = "Intel Xeon"
    problems = table_problems(text, planted)
    assert [p.split(":")[0] for p in problems] == [
        "shared_stream smallest n", "shared_stream n for power 0.999", "recovery_reuses_coin smallest n",
        "bonus_on_recovery_stream chi2", "bonus_on_recovery_stream seconds", "the page does not say '(Intel Xeon, 2 torch threads)'"]
    first = docs_rows(text)[0][3]
    assert table_problems(text.replace(first, "4.9 (8.0)", 1), record)  # seconds off by more than the rounding
    assert table_problems(text.replace("| `recovery_reuses_coin` |", "| `coin_reused` |", 1), record)
    assert _as_shown("42,000", 42336) and not _as_shown("40,000", 42336) and not _as_shown("0.4", 0.44)


@pytest.mark.slow
def test_artefact_row_replays():
    """The fastest row rerun at the artefact's grid: the same trial counts and statistics (seeded)."""
    record = json.loads(ARTEFACT.read_text())
    row = next(r for r in record["rows"] if r["bug"] == "bonus_on_recovery_stream")
    again = narrow_power.measure(row["bug"], start=record["grid"]["start"])
    assert (again.rejecting_trials, again.design_trials, again.design_df, again.power_trials) == (
        row["rejecting_trials"], row["design_trials"], row["design_df"], row["power_trials"])
    assert again.pvalue == pytest.approx(row["pvalue"], rel=1e-6)
    assert again.design_statistic == pytest.approx(row["design_statistic"], rel=1e-9)
