"""Every JSON and CSV artefact under results/ records the command that wrote it, the commit it ran at (a
clean tree) and the machine; results/README.md maps every file there to the command that writes it.

The convention (results/README.md, "Provenance"):

- CSV: the columns ``command``, ``git_commit`` and ``device``, filled in every row;
- JSON: ``command``, a commit and a machine, either at the top level or in a top-level ``provenance`` (or,
  for the audit reports, ``environment``) object. The commit is ``git_commit`` (``benchmarks.common``) or
  ``commit`` (``rl_loop.run.provenance``, with ``dirty`` beside it; the audit's ``environment``); the machine
  is ``device`` (``benchmarks.common``), ``cpu`` (``rl_loop.run.provenance``) or ``platform`` (the audit's
  ``environment``, operating system and architecture, with ``torch_threads`` and ``cuda_available``).

A commit ending ``+dirty`` / ``+modified``, or ``dirty: true``, is a run from a tree with uncommitted changes:
it fails unless the artefact (or, in the A/B history, the run's ``pair``) is in :data:`ALLOWED`, with the
reason it stays.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOT = REPO
RESULTS = ROOT / "results"
COMMAND_KEYS = ("command",)
COMMIT_KEYS = ("git_commit", "commit")
MACHINE_KEYS = ("device", "cpu", "platform")
CONTAINERS = ("provenance", "environment")
CSV_COLUMNS = ("command", "git_commit", "device")

# artefact (path under results/, "#pair" for one run of the A/B history) -> why it stays as it is; none today
ALLOWED: dict[str, str] = {}


def _dirty(commit: object) -> bool:
    return isinstance(commit, str) and bool(re.search(r"\+(dirty|modified)$", commit))


def _first(record: dict, keys: tuple[str, ...]) -> object:
    return next((record[k] for k in keys if record.get(k) not in (None, "")), None)


def json_problems(data: object) -> list[str]:
    """What a JSON artefact lacks of its provenance (empty when command, clean commit and machine are there)."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    records = [data] + [data[c] for c in CONTAINERS if isinstance(data.get(c), dict)]
    found = {name: next((v for r in records if (v := _first(r, keys)) is not None), None)
             for name, keys in (("command", COMMAND_KEYS), ("commit", COMMIT_KEYS), ("machine", MACHINE_KEYS))}
    problems = [f"no {name} ({' / '.join(keys)})" for (name, keys), value in
                zip((("command", COMMAND_KEYS), ("commit", COMMIT_KEYS), ("machine", MACHINE_KEYS)),
                    found.values(), strict=True) if value is None]
    if _dirty(found["commit"]) or any(r.get("dirty") is True for r in records):
        problems.append(f"commit {found['commit']} is of a tree with uncommitted changes")
    return problems


def csv_problems(rows: list[dict[str, str]], label: str = "") -> list[str]:
    """What the rows of a CSV artefact lack of their provenance (``label``: the run, for a history table)."""
    if not rows:
        return ["no rows"]
    problems = [f"no column {c}" for c in CSV_COLUMNS if c not in rows[0]]
    if problems:
        return problems
    problems = [f"row {i + 2}{label}: empty {c}" for i, r in enumerate(rows) for c in CSV_COLUMNS if not r[c]]
    dirty = sorted({r["git_commit"] for r in rows if _dirty(r["git_commit"])})
    if dirty:
        problems.append(f"commit {', '.join(dirty)}{label} is of a tree with uncommitted changes")
    return problems[:5]


def all_problems(path: Path) -> dict[str, list[str]]:
    """``{artefact: problems}`` for one file under results/; a history table (a ``pair`` column) is judged
    run by run (``file#pair``)."""
    name = path.relative_to(RESULTS).as_posix()
    if path.suffix == ".json":
        return {name: json_problems(json.loads(path.read_text()))}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "pair" not in rows[0]:
        return {name: csv_problems(rows)}
    runs: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        runs.setdefault(r["pair"], []).append(r)
    return {f"{name}#{pair}": csv_problems(run, f" (run {pair})") for pair, run in runs.items()}


def artefact_problems(path: Path) -> dict[str, list[str]]:
    """:func:`all_problems` without the allowed exceptions."""
    return {k: v for k, v in all_problems(path).items() if v and k not in ALLOWED}


def artefacts() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.suffix in (".json", ".csv") and p.is_file())


@pytest.mark.parametrize("path", artefacts(), ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_artefact_records_command_commit_and_machine(path):
    assert not artefact_problems(path), artefact_problems(path)


def test_every_allowed_exception_is_still_needed():
    """An allow-list entry whose artefact was regenerated (or removed) goes; each names its reason."""
    needed = {k for path in artefacts() for k, v in all_problems(path).items() if v}
    assert set(ALLOWED) <= needed, sorted(set(ALLOWED) - needed)
    assert all(reason.strip() for reason in ALLOWED.values())


def test_no_artefact_outside_results():
    """The one results root: no committed file in a results folder elsewhere, no committed JSON / CSV
    outside results/."""
    import subprocess

    try:
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                                 check=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    outside = [f for f in tracked if not f.startswith("results/")
               and ("results" in Path(f).parts or Path(f).suffix in (".csv", ".json", ".jsonl", ".log"))]
    assert not outside, outside


def test_results_readme_maps_every_file_to_its_command():
    """results/README.md names every file under results/ (or its folder's pattern) beside a command."""
    readme = (RESULTS / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    patterns = {}
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) >= 2 and ("python -m " in cells[1] or "bash .ci/run" in cells[1]), f"no command in {line!r}"
        for name in re.findall(r"`([^`]+)`", cells[0]):
            patterns[name] = cells[1]
    files = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*")
                   if p.is_file() and p.name != "README.md" and p.suffix != ".jsonl")
    unmapped = [f for f in files if not any(Path(f).match(pat) or f == pat for pat in patterns)]
    assert not unmapped, f"results/README.md does not map {unmapped}"


# planted artefacts: the check must reject each -----------------------------------------------------------

def test_the_check_rejects_a_planted_json_without_provenance(tmp_path):
    good = {"provenance": {"command": "python -m x --out y", "git_commit": "0123456789ab", "device": "CPU"}}
    assert json_problems(good) == []
    assert json_problems({"command": "c", "environment": {"commit": "0123", "platform": "Linux x86_64"}}) == []
    planted = tmp_path / "figures.json"
    planted.write_text(json.dumps({"speedup": 2.0}))
    assert json_problems(json.loads(planted.read_text())) == [
        "no command (command)", "no commit (git_commit / commit)", "no machine (device / cpu / platform)"]
    no_machine = {"provenance": {"command": "c", "commit": "0123", "dirty": False}}
    assert json_problems(no_machine) == ["no machine (device / cpu / platform)"]
    dirty = {"provenance": {"command": "c", "commit": "0123", "dirty": True, "cpu": "x"}}
    assert json_problems(dirty) == ["commit 0123 is of a tree with uncommitted changes"]
    assert json_problems({**good, "provenance": {**good["provenance"], "git_commit": "0123+dirty"}})


def test_the_check_rejects_a_planted_csv_without_provenance(tmp_path):
    planted = tmp_path / "figures.csv"
    planted.write_text("case,median_ms\na,1.0\n")
    with planted.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert csv_problems(rows) == ["no column command", "no column git_commit", "no column device"]
    rows = [{"case": "a", "command": "python -m x", "git_commit": "0123", "device": "CPU"},
            {"case": "b", "command": "python -m x", "git_commit": "", "device": "CPU"}]
    assert csv_problems(rows) == ["row 3: empty git_commit"]
    rows[1]["git_commit"] = "0123+dirty"
    assert csv_problems(rows) == ["commit 0123+dirty is of a tree with uncommitted changes"]
