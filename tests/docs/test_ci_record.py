"""The .ci/run record reads pytest's summary lines and adds up what it is given."""

from __future__ import annotations

import json

import pytest

from tests.harness import ci_record


def test_counts_come_from_the_last_summary_line():
    log = ("....\n2 failed, 3 passed in 1.00s\nrerun\n"
           "1519 passed, 15 skipped, 60 warnings in 1337.53s (0:22:17)\n")
    assert ci_record.pytest_counts(log) == {"passed": 1519, "failed": 0, "skipped": 15, "errors": 0}
    fast = ci_record.pytest_counts("987 passed, 1 skipped, 560 deselected, 3 errors in 54.10s\n")
    assert ci_record._run(fast) == 991 and fast["deselected"] == 560
    with pytest.raises(ValueError, match="no pytest summary"):
        ci_record.pytest_counts("collected 0 items\n")


def test_record_holds_phases_counts_and_provenance(tmp_path, capsys):
    (tmp_path / "fast.log").write_text("10 passed, 5 deselected in 2.0s\n")
    (tmp_path / "tests.log").write_text("14 passed, 1 skipped in 9.0s\n")
    argv = ["--out", str(tmp_path / "ci" / "ci_run.json"), "--install-s", "3", "--fast-s", "2", "--tests-s", "9",
            "--total-s", "14", "--fast-log", str(tmp_path / "fast.log"), "--tests-log", str(tmp_path / "tests.log")]
    ci_record.main(argv)
    record = json.loads((tmp_path / "ci" / "ci_run.json").read_text())
    assert (record["fast_tier_tests"], record["suite_tests"], record["command"]) == (10, 15, "bash .ci/run")
    assert record["commit"] and record["cpu"] and record["total_s"] == 14
    with pytest.raises(SystemExit):
        ci_record.main([*argv[:-1], str(tmp_path / "missing.log")])
    assert "--fast-log / --tests-log" in capsys.readouterr().err
