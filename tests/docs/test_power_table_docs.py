"""The power table in docs/exactness-and-audit.md ("Power against peers' suites") is the committed artefact's
(results/audit/power_table.json, written by ``python -m specdec_kernels.audit.power_table``): a rerun without the
docs, or a docs edit without a rerun, fails here; and the reading's claims hold on the artefact."""

from __future__ import annotations

import json

import pytest

from specdec_kernels.audit import power_table as pt
from specdec_kernels.exactness import peer_suites, sequential
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


def test_ours_ran_the_suites_looks_and_the_docs_say_which(record):
    """Every cell of ours records the look that decided it; the looks are the suite's (sequential.LOOK_FRACTIONS),
    the docs name them, a bug decided before the last look drew fewer trials than the design, and a correct row ran
    every case to its last look."""
    fractions = sequential.LOOK_FRACTIONS
    assert record["looks_ours"] == list(fractions)
    assert "at 1/64, 1/8 and all of its design size" in _section() and fractions == (1 / 64, 1 / 8, 1.0)
    for row in record["rows"]:
        ours = row["suites"]["ours"]
        assert ours["looks"] == len(fractions) and 1 <= ours["look"] <= ours["looks"], row["label"]
        for test in ours["tests"]:
            if test["look"] < test["looks"]:
                assert test["rejects"] and test["trials"] * 4 < row_design(test["name"]), (row["label"], test)
        if row["bug"] is None:
            assert all(t["look"] == t["looks"] for t in ours["tests"]), row["label"]


def row_design(case_name: str) -> int:
    """The design size (last look) of one of ours' cases, from its law and the suite's alpha."""
    from specdec_kernels.exactness import block_traversal_law as btl
    from specdec_kernels.exactness import chain_law

    steps = {c.name: c for c in btl.STEP_CASES}
    sequences = {c.name: c for c in (*chain_law.SEQUENCE_CASES, *btl.BLOCK_SEQUENCE_CASES)}
    if case_name in steps:
        law = btl.step_emission_law(steps[case_name], "traversal" if case_name.startswith("w") else "block")
    elif case_name in sequences:
        case = sequences[case_name]
        law = chain_law.sequence_law(chain_law.sequence_case_models(case)[0], case.length, case.cfg)
    else:
        case = chain_law.case_by_name(case_name)
        law = (chain_law.narrow_law if isinstance(case, chain_law.NarrowCase) else chain_law.first_token_law)(case)
    return chain_law.law_plan(law, pt.ALPHA, chain_law.TV, chain_law.POWER).design_size


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

    peer_caught = [b for b in bugs if any(b in caught_by(p) for p in pt.SUITES[1:])]

    def sooner(unit):
        return [b for b in peer_caught if any(b in caught_by(p) and cells[b][p][unit] < cells[b]["ours"][unit]
                                              for p in pt.SUITES[1:])]

    (slower,) = sooner("seconds")
    assert sooner("cpu_seconds") == [slower]
    looks = {j: [b for b in bugs if cells[b]["ours"]["look"] == j] for j in (1, 2, 3)}
    uncaught = [b for b in bugs if b not in peer_caught]
    ours_on = {b: cells[b]["ours"] for b in bugs}
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
        f"Ours is now the faster suite on {len(peer_caught) - 1} of the {len(peer_caught)} bugs a peer design "
        "catches, by wall and by CPU seconds.",
        f"stopped at its first look (1/64 of the design size) on {len(looks[1])} bugs, at its second (1/8) on "
        f"{len(looks[2])} and reached its last on {len(looks[3])} (" + ", ".join(f"`{b}`" for b in looks[3]) + ")",
        f"`coin_reused` ({ours_on['coin_reused']['seconds']:.1f} s against DeepSpec's "
        f"{cells['coin_reused']['deepspec-pr48']['seconds']:.1f} s)",
        f"`recovery_reuses_coin` (at its second look, {ours_on['recovery_reuses_coin']['trials']:,} trials and "
        f"{ours_on['recovery_reuses_coin']['seconds']:.1f} s against DeepSpec's "
        f"{cells['recovery_reuses_coin']['deepspec-pr48']['seconds']:.1f} s)",
        f"The one left is `{slower}`: vLLM {cells[slower]['vllm-v2']['seconds']:.1f} s "
        f"({cells[slower]['vllm-v2']['cpu_seconds']:.1f} s CPU) and DeepSpec "
        f"{cells[slower]['deepspec-pr48']['seconds']:.1f} s ({cells[slower]['deepspec-pr48']['cpu_seconds']:.1f} s "
        f"CPU) against our {ours_on[slower]['seconds']:.1f} s ({ours_on[slower]['cpu_seconds']:.1f} s CPU)",
        f"(p {_p(ours_on[slower]['smallest_p'])} at {ours_on[slower]['trials']:,} trials)",
        f"A green run costs ours {secs('ours')} on the correct rows against vLLM's {secs('vllm-v2')} and "
        f"DeepSpec's {secs('deepspec-pr48')}",
        "(" + " and ".join(f"{c['ours']['trials']:,}" for c in correct) + " trials against",
        f"Over all rows (each suite's applicable ones) ours took {ours['seconds']:.0f} s (216 s at fixed size), the "
        f"vLLM design {v2['seconds']:.0f} s and the DeepSpec design {ds['seconds']:.0f} s",
        f"of ours', {sum(c['ours']['seconds'] for c in correct):.0f} s went to the two green rows and "
        f"{sum(ours_on[b]['seconds'] for b in uncaught):.0f} s to the {len(uncaught)} bugs no peer design catches",
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
