"""The power table (specdec_kernels/audit/power_table.py): every planted bug has a row, every 'not applicable'
is true (the bug changes no token on the design's inputs), the CLI refuses bad arguments in one line; the
committed table against the docs is tests/docs/test_power_table_docs.py."""

from __future__ import annotations

import json

import pytest

from specdec_kernels.audit import power_table as pt
from specdec_kernels.audit.matrix import audit_reports
from specdec_kernels.exactness import block_traversal_mutants, chain_mutants, peer_suites
from specdec_kernels.exactness.chain_law import backend_verifier
from tests.conftest import REPO


def test_every_planted_bug_has_a_row_and_correct_rows_come_first():
    bugs = [r.bug for r in pt.ROWS if r.bug]
    assert sorted(bugs) == sorted([*chain_mutants.MUTANTS, *block_traversal_mutants.MUTANTS])
    assert [r.bug for r in pt.ROWS[:2]] == [None, None]


def _twin(mutant, reference, differences: list):
    """A verifier returning the mutant's result and counting requests whose tokens differ from the reference's."""
    def verify(*args):
        a, b = mutant(*args), reference(*args)
        differences.append(int(((a.output_token_ids != b.output_token_ids).any(1)
                                | (a.num_accepted != b.num_accepted)).sum()))
        return a

    for attr in ("draft_stream", "draft_sampler"):
        if hasattr(mutant, attr):
            setattr(verify, attr, getattr(mutant, attr))
    return verify


def _differences(suite: str, bug: str) -> int:
    """Requests whose tokens the chain bug ``bug`` changes on the inputs of ``suite`` (small sizes)."""
    differences: list[int] = []
    verify = _twin(chain_mutants.mutant_verifier(bug), backend_verifier("reference"), differences)
    if suite == "vllm-v2":
        peer_suites.vllm_v2_suite(verify, peer_suites.VllmV2Sizes(wide_vocab=32, narrow_trials=500))
    else:
        peer_suites.deepspec_pr48_suite(verify, peer_suites.DeepSpecSizes(rounds=500))
    assert differences
    return sum(differences)


@pytest.mark.parametrize("suite,bug", sorted(pt.INERT))
def test_not_applicable_bugs_change_no_token_of_the_design(suite, bug):
    assert _differences(suite, bug) == 0


@pytest.mark.slow
@pytest.mark.parametrize("suite", pt.SUITES[1:])
def test_every_other_chain_bug_changes_tokens_of_the_design(suite):
    """The not-applicable list is complete: a chain bug it does not name changes tokens on the design's inputs
    (a measured pass there is a miss, not an artefact of the inputs)."""
    for bug in chain_mutants.MUTANTS:
        if (suite, bug) not in pt.INERT:
            assert _differences(suite, bug) > 0, bug


@pytest.mark.slow
def test_a_row_runs_every_suite_and_marks_traversal_not_applicable():
    sizes = pt.default_sizes(wide_vocab=32, narrow_trials=500, rounds=500)
    row = pt.run_row(pt.Row("`traversal_coin_per_depth`", "traversal", "traversal_coin_per_depth"), sizes)
    assert row["suites"]["vllm-v2"] == {"applicable": False, "reason": pt.TRAVERSAL_NA}
    assert row["suites"]["deepspec-pr48"]["applicable"] is False
    assert row["suites"]["ours"]["caught"] and row["suites"]["ours"]["rejecting_test"] == "w3d2-iid-t1"


def test_cli_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    for args in (["--bugs", "nope"], ["--narrow-trials", "1"], ["--name", "../elsewhere"], ["--name", ""]):
        with pytest.raises(SystemExit) as exit_:
            pt.main(["--out", str(tmp_path), *args])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and "power_table: error" in err
    assert not list(tmp_path.iterdir())


def test_the_audit_matrix_reads_reports_only():
    assert "power_table" not in audit_reports(REPO / "results" / "audit")


def test_power_table_record_renders_and_counts():
    """A one-row record (a cheap bug, small peer sizes): provenance, the table's line, the totals."""
    sizes = pt.default_sizes(wide_vocab=32, narrow_trials=500, rounds=500)
    row = next(r for r in pt.ROWS if r.bug == "greedy_sampled")
    record = pt.power_table((row,), sizes, "python -m specdec_kernels.audit.power_table --bugs greedy_sampled")
    assert record["environment"]["commit"] and record["environment"]["device"]
    cells = record["rows"][0]["suites"]
    assert cells["ours"]["caught"] and cells["vllm-v2"]["rejecting_test"] == "greedy-V32-k1"
    assert cells["deepspec-pr48"] == {"applicable": False, "reason": pt.INERT["deepspec-pr48", "greedy_sampled"]}
    table = pt.table_markdown(record)
    assert table.splitlines()[2].startswith("| `greedy_sampled` | **caught** by `first-deter-greedy`")
    assert pt.summary(record)["deepspec-pr48"] == {"caught": 0, "run": 0, "false_alarms": 0, "seconds": 0}
    assert table in pt.markdown(record) and record["command"] in pt.markdown(record)


def test_name_writes_beside_the_rows_a_folder_holds(tmp_path):
    """``--name`` writes ``<name>.json`` / ``.md`` and leaves ``power_table.*`` as they are."""
    kept = tmp_path / "power_table.json"
    kept.write_text("{}")
    args = ["--out", str(tmp_path), "--wide-vocab", "16", "--narrow-trials", "200", "--rounds", "200", "--bugs",
            "greedy_sampled", "--name", "power_table-greedy_sampled"]
    assert pt.main(args) == 0
    record = json.loads((tmp_path / "power_table-greedy_sampled.json").read_text())
    assert record["command"].endswith("--name power_table-greedy_sampled") and kept.read_text() == "{}"
    assert (tmp_path / "power_table-greedy_sampled.md").read_text() == pt.markdown(record)
