"""The audit matrix in docs/exactness-and-audit.md is what ``python -m specdec_kernels.audit.matrix`` makes of the
committed reports: a report rerun, added or removed without the table (or a table edit without its report)
fails here."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

from specdec_kernels.audit.matrix import HEADER, matrix_rows, matrix_table
from tests.conftest import REPO

PAGE = REPO / "docs" / "exactness-and-audit.md"
REPORTS = REPO / "results" / "audit"


def _docs_table() -> str:
    lines = PAGE.read_text().splitlines()
    start = lines.index(HEADER.splitlines()[0])
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_docs_matrix_is_the_reports_matrix():
    assert _docs_table() == matrix_table(REPORTS)


def test_matrix_row_names_the_smallest_law_p_value_and_counts_rejections():
    report = json.loads((REPORTS / "cpu.json").read_text())
    planted = copy.deepcopy(report)
    law = next(o for o in planted["outcomes"] if o["family"] == "first-token" and o.get("pvalue") is not None)
    law.update(pvalue=1e-9, verdict="FAIL")
    mutant = next(o for o in planted["outcomes"] if o["family"] == "mutants")
    mutant["pvalue"] = 0.0  # a planted bug's rejection is not a law case of the target
    (row,) = matrix_rows({"cpu": planted})
    assert row["p"] == "1.00e-09" and law["name"] in row["case"]
    assert row["rejected"].startswith("1 of ")
    (clean,) = matrix_rows({"cpu": report})
    assert clean["rejected"].startswith("0 of ") and clean["p"] != "1.00e-09"


def test_matrix_cli_refuses_a_missing_folder_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdec_kernels.audit.matrix", str(tmp_path / "absent")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "folder" in r.stderr
