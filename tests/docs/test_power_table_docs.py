"""The power table in docs/exactness-and-audit.md ("Power against peers' suites") is the committed artefact's
(results/audit/power_table.json, written by ``python -m specdec_kernels.audit.power_table``): a rerun without the
docs, or a docs edit without a rerun, fails here; and the reading's claims hold on the artefact."""

from __future__ import annotations

import json

import pytest

from specdec_kernels.audit import power_table as pt
from specdec_kernels.exactness import peer_suites
from tests.conftest import REPO

ARTEFACT = REPO / "results" / "audit" / "power_table.json"
PAGE = REPO / "docs" / "exactness-and-audit.md"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(ARTEFACT.read_text())


def _section() -> str:
    text = PAGE.read_text()
    start = text.index("## Power against peers' suites")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _docs_table() -> str:
    lines = _section().splitlines()
    start = lines.index(pt.TABLE_HEADER.splitlines()[0])
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_docs_table_is_the_artefacts(record):
    assert _docs_table() == pt.table_markdown(record)
    assert ARTEFACT.with_suffix(".md").read_text() == pt.markdown(record)


def test_artefact_covers_every_row_and_docs_name_its_command_and_machine(record):
    assert [r["label"] for r in record["rows"]] == [r.label for r in pt.ROWS]
    assert record["command"].startswith("python -m specdec_kernels.audit.power_table")
    assert record["command"] in _section()
    assert record["command"] in (REPO / "results" / "README.md").read_text()
    assert record["environment"]["device"] in _section()
    assert f"{record['seconds']:.0f} s" in _section()


def test_totals_in_the_docs_are_the_artefacts(record):
    section = _section()
    for suite, s in pt.summary(record).items():
        assert f"{pt.SUITE_TITLES[suite]}: {s['caught']} of {s['run']} bugs caught" in section, suite


def test_ours_catches_every_bug_a_peer_catches_and_no_suite_alarms_on_a_correct_backend(record):
    for row in record["rows"]:
        cells = row["suites"]
        if row["bug"] is None:
            assert not any(c["applicable"] and c["caught"] for c in cells.values()), row["label"]
            assert cells["deepspec-pr48"]["control"]["rejects"], "the negative control must reject"
        elif any(c["applicable"] and c["caught"] for c in cells.values()):
            assert cells["ours"]["caught"], row["label"]


def test_the_reading_names_every_miss_and_every_bug_a_peer_caught_sooner(record):
    """Each bug a peer design missed, and each bug a peer caught in fewer wall seconds than ours, is named in the
    reading."""
    section = _section().split(pt.TABLE_HEADER.splitlines()[0])[1]
    for row in record["rows"]:
        if row["bug"] is None:
            continue
        cells = row["suites"]
        for suite in pt.SUITES[1:]:
            cell = cells[suite]
            if not cell["applicable"]:
                continue
            if not cell["caught"] or cell["seconds"] < cells["ours"]["seconds"]:
                assert f"`{row['bug']}`" in section.split("Reading.")[1], (suite, row["bug"])


FULL_SIZE = REPO / "results" / "audit" / "vllm-full-size" / "power_table.json"


def test_full_size_table_is_its_artefact():
    """The second table of the section: the vLLM V2 design at vLLM's own sizes on the bugs it missed at the
    reduced ones (results/audit/vllm-full-size/)."""
    record = json.loads(FULL_SIZE.read_text())
    lines = _section().splitlines()
    header = pt.TABLE_HEADER.splitlines()[0]
    start = [i for i, line in enumerate(lines) if line == header][1]
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    assert "\n".join(lines[start:end]) == pt.table_markdown(record)
    assert FULL_SIZE.with_suffix(".md").read_text() == pt.markdown(record)
    assert record["command"] in _section() and record["command"] in (REPO / "results" / "README.md").read_text()
    assert record["sizes"]["vllm-v2"]["wide_vocab"] == peer_suites.VLLM_V2_SIZES.wide_vocab
    assert record["sizes"]["vllm-v2"]["narrow_trials"] == peer_suites.VLLM_V2_SIZES.narrow_trials
