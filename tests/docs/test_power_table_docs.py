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


FULL_SIZE_DIR = REPO / "results" / "audit" / "vllm-full-size"
FULL_SIZE = FULL_SIZE_DIR / "power_table.json"
FULL_SIZE_COIN = FULL_SIZE_DIR / "power_table-coin_reused.json"
"""The vLLM design at vLLM's own sizes: four bugs in one run, ``coin_reused`` in its own (``--name``), once the
planted-bug sampler was fast enough at V = 4096."""


def _full_size() -> tuple[dict, dict]:
    return json.loads(FULL_SIZE.read_text()), json.loads(FULL_SIZE_COIN.read_text())


def full_size_table(section: str) -> str:
    lines = section.splitlines()
    header = pt.TABLE_HEADER.splitlines()[0]
    start = [i for i, line in enumerate(lines) if line == header][1]
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_full_size_table_is_its_artefacts():
    """The second table of the section: the vLLM V2 design at vLLM's own sizes on the bugs it missed at the
    reduced ones (results/audit/vllm-full-size/), the rows of both records in the order they ran."""
    records = _full_size()
    assert full_size_table(_section()) == pt.table_markdown({"rows": [r for rec in records for r in rec["rows"]]})
    for path, record in zip((FULL_SIZE, FULL_SIZE_COIN), records, strict=True):
        assert path.with_suffix(".md").read_text() == pt.markdown(record)
        assert record["command"] in _section() and record["command"] in (REPO / "results" / "README.md").read_text()
        assert record["sizes"]["vllm-v2"]["wide_vocab"] == peer_suites.VLLM_V2_SIZES.wide_vocab
        assert record["sizes"]["vllm-v2"]["narrow_trials"] == peer_suites.VLLM_V2_SIZES.narrow_trials
    assert [row["bug"] for row in records[1]["rows"]] == ["coin_reused"]


def _p(value: float) -> str:
    """A small p-value as the reading writes it: two significant digits, ``2.6e-9``."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def reading_figures(record: dict, full: tuple[dict, dict]) -> list[str]:
    """The figures of the section's reading (under both tables), each as the page writes it, from the two
    artefacts."""
    cells = {row["bug"]: row["suites"] for row in record["rows"]}
    correct = [row["suites"] for row in record["rows"] if row["bug"] is None]
    s = pt.summary(record)
    ours, v2, ds = s["ours"], s["vllm-v2"], s["deepspec-pr48"]
    bugs = [b for b in cells if b is not None]

    def caught_by(suite):
        return [b for b in bugs if cells[b][suite]["applicable"] and cells[b][suite]["caught"]]

    sooner = [b for b in bugs if any(b in caught_by(p) and cells[b][p]["seconds"] < cells[b]["ours"]["seconds"]
                                     for p in pt.SUITES[1:])]
    later = [b for b in bugs if any(b in caught_by(p) for p in pt.SUITES[1:]) and b not in sooner]
    assert all(50_000 <= cells[b]["ours"]["trials"] <= 100_000 for b in sooner), "ours' sizes on the gross bugs"
    first_wide = [b for b in sooner if b in caught_by("vllm-v2")
                  and cells[b]["vllm-v2"]["seconds"] < cells[b]["ours"]["seconds"]]
    wide = record["sizes"]["vllm-v2"]["trials_per_token"] * record["sizes"]["vllm-v2"]["wide_vocab"]
    (second,) = [b for b in first_wide if cells[b]["vllm-v2"]["trials"] != wide]
    assert cells[second]["vllm-v2"]["trials"] == 2 * wide
    controls = [f"{c['deepspec-pr48']['control']['statistic']:.0f}" for c in correct]
    threshold = {f"{c['deepspec-pr48']['control']['threshold']:.1f}" for c in correct}.pop()

    def secs(suite):
        return " and ".join(f"{c[suite]['seconds']:.1f} s" for c in correct)

    full, coin = full
    full_rows = full["rows"] + coin["rows"]
    full_cells = {row["bug"]: row["suites"]["vllm-v2"] for row in full_rows}
    full_ours = [row["suites"]["ours"]["seconds"] for row in full_rows]
    full_caught = [c["seconds"] for c in full_cells.values() if c["caught"]]
    full_missed = [c for c in full_cells.values() if not c["caught"]]
    (missed,) = full_missed
    coin_cell = full_cells["coin_reused"]
    coin_tests = {t["name"]: t for t in coin_cell["tests"]}
    coin_rejecting = [t for t in coin_cell["tests"] if t["rejects"]]
    return [
        f"Ours catches all {ours['caught']} planted bugs",
        f"(chi2 {' and '.join(controls)} against {threshold})",
        f"The vLLM V2 design misses {v2['run'] - v2['caught']} of {v2['run']}** at these sizes",
        f"leave no trace (p {cells['coin_reused']['vllm-v2']['smallest_p']:.2f}, "
        f"{cells['block_boundary_token_residual']['vllm-v2']['smallest_p']:.2f})",
        f"`draft_temperature_missing` (p {_p(cells['draft_temperature_missing']['vllm-v2']['smallest_p'])})",
        f"`block_max_score` (p {_p(cells['block_max_score']['vllm-v2']['smallest_p'])})",
        f"`block_first_failure` (p {_p(cells['block_first_failure']['vllm-v2']['smallest_p'])})",
        f"The DeepSpec PR #48 design misses {ds['run'] - ds['caught']} of {ds['run']}**",
        f"`biased_first_token` (p {_p(cells['biased_first_token']['deepspec-pr48']['smallest_p'])}:",
        f"On {len(sooner)} bugs a peer design reached its verdict in fewer seconds",
        ", ".join(f"`{b}`" for b in first_wide if b != second) + f" (vLLM's first wide test, {wide:,} trials) and "
        f"`{second}` (its second, after {2 * wide:,} trials)",
        f"`coin_reused` (DeepSpec {cells['coin_reused']['deepspec-pr48']['seconds']:.1f} s against our "
        f"whole-sequence case's {cells['coin_reused']['ours']['seconds']:.1f} s)",
        "Ours is faster on " + ", ".join(f"`{b}`" for b in later[:-1]) + f" and `{later[-1]}`,",
        f"A green run costs ours {secs('ours')} on the correct rows against vLLM's {secs('vllm-v2')} and "
        f"DeepSpec's {secs('deepspec-pr48')}",
        f"over all rows ours took {ours['seconds']:.0f} s, the vLLM design {v2['seconds']:.0f} s and the DeepSpec "
        f"design {ds['seconds']:.0f} s",
        f"(`results/audit/vllm-full-size/power_table.md`, {full['seconds']:.0f} s on the same VM, at commit "
        f"{full['environment']['commit'][:7]})",
        f"(`power_table-coin_reused.md`, {coin['seconds']:.0f} s, at commit {coin['environment']['commit'][:7]},",
        f"in {min(full_caught):.0f} to {max(full_caught):.0f} s against our {min(full_ours):.1f} to "
        f"{max(full_ours):.0f} s",
        f"(p {_p(missed['smallest_p'])} after {missed['trials']:,} trials and {missed['seconds']:.0f} s)",
        f"`{coin_rejecting[0]['name']}` (p {_p(coin_rejecting[0]['pvalue'])}; "
        f"`{coin_rejecting[1]['name']}` p {_p(coin_rejecting[1]['pvalue'])}), after {coin_cell['trials']:,} trials "
        f"and {coin_cell['seconds']:.0f} s ({coin_cell['cpu_seconds']:.0f} s CPU)",
        "every position-0 test passes (smallest p "
        f"{min(t['pvalue'] for n, t in coin_tests.items() if n.endswith('-pos0')):.2f})",
        f"Counted at vLLM's sizes, the design catches {v2['caught'] + len(full_caught)} of {v2['run']}",
    ]


def test_the_reading_figures_are_the_artefacts(record):
    """Every figure of the reading under the two tables: counts of bugs caught and missed, p-values, trials and
    seconds, from power_table.json and the two records of vllm-full-size/."""
    text = " ".join(_section().split())
    missing = [figure for figure in reading_figures(record, _full_size()) if figure not in text]
    assert not missing, f"docs/exactness-and-audit.md should say, from its power tables: {missing}"
