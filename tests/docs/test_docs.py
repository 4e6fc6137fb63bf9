"""The manual: README at most 250 lines, the docs site builds strictly, every relative link resolves, the
README's headline figures equal their artefact, and the docs' Python examples and tables are what their
sources produce. Each test here was shown to fail on a planted break (a broken link or anchor, an
edited figure or output, a page left out of the nav, a README over the limit)."""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

from .test_readme import python_examples, run_example

ROOT = REPO
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
CHAIN_CSV = "results/benchmarks/chain_cpu_b64_k3_v151936.csv"
# Folders the artefacts lived in before the one results root (issue 50): a recorded command that wrote to
# one of them is quoted in the manual with today's folder.
# Renames since some artefacts were written (their recorded command and commit reproduce them as they are):
# the results folders, and the block / traversal benchmark and its outputs, once named "optimal".
RENAMED = {"benchmarks/results/": "results/benchmarks/", "rl_loop/sim/results/": "results/sim/",
           "benchmarks.bench_optimal": "benchmarks.bench_block_traversal",
           "/optimal_acceptance": "/block_traversal_acceptance", "/optimal_cost_cpu": "/block_traversal_cost_cpu"}


def as_run_today(command: str) -> str:
    """A recorded command with today's names: its module and output where the artefact now lives."""
    for old, new in RENAMED.items():
        command = command.replace(old, new)
    return command


def _markdown_files() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md", *sorted(DOCS.glob("**/*.md"))]


def _strip_code(text: str) -> str:
    """The text without fenced blocks and inline code (links there are examples, not links)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """The anchor mkdocs (toc) and GitHub give a heading without markup: lower case, punctuation dropped,
    spaces to hyphens."""
    heading = re.sub(r"[`*_]", "", heading).strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return re.sub(r" +", "-", heading)


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)}


def relative_links(path: Path) -> list[str]:
    """Targets of the markdown links and images of a file that are not URLs."""
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", _strip_code(path.read_text()))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading with anchor #{anchor} in {dest.name})")
    return broken


# (a) -------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_docs_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (pip install mkdocs-material, or the docs extra)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "design" / "index.html").exists()


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("**/*.md")}
    missing = sorted(p for p in pages if re.search(rf":\s*{re.escape(p)}\s*$", nav, flags=re.M) is None)
    assert not missing, f"docs pages not in mkdocs.yml's nav: {missing}"


# (b) -------------------------------------------------------------------------------------------------

def test_readme_is_a_manual_not_a_notebook():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


# (c) -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert not broken_links(path), f"{path.relative_to(ROOT)}: broken links {broken_links(path)}"


def test_design_sections_the_code_cites_exist():
    """The source cites "docs/design.md §N"; that page must keep sections 1-5 under those numbers."""
    anchors = _anchors(DOCS / "design.md")
    for n, title in [(1, "architecture"), (2, "verification-rules"), (3, "api-contract"), (4, "randomness"),
                     (5, "testing-strategy")]:
        assert f"{n}-{title}" in anchors, f"docs/design.md has no section '## {n}. ...' ({title})"


# (d) -------------------------------------------------------------------------------------------------

def _chain_cases(path: Path) -> dict[tuple[str, str, str, str], dict[str, dict[str, str]]]:
    cases: dict = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            cases.setdefault((row["dtype"], row["family"], row["mode"], row["drafts"]), {})[row["provider"]] = row
    return cases


def _ms(row: dict[str, str]) -> str:
    return f"{float(row['median_ms']):.3g} [{float(row['min_ms']):.3g}, {float(row['max_ms']):.3g}]"


def _pct(row: dict[str, str]) -> str:
    return (f"{100 * float(row['read_fraction']):.0f} [{100 * float(row['read_fraction_min']):.0f}, "
            f"{100 * float(row['read_fraction_max']):.0f}]")


def _ratio(by: dict[str, dict[str, str]], names: tuple[str, ...]) -> str:
    t = float(by["ours"]["median_ms"])
    return f"{min(float(by[n]['median_ms']) for n in names if by[n]['status'] == 'ok') / t:.1f}x"


def readme_headline_rows() -> list[list[str]]:
    section = README.read_text().split("## Headline figures\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    assert rows[0][:4] == ["dtype", "logits", "mode", "drafts"], rows[0]
    return rows[2:]


def test_readme_headline_figures_match_their_artefact():
    section = README.read_text().split("## Headline figures\n", 1)[1].split("\n## ", 1)[0]
    assert f"({CHAIN_CSV})" in section, "the headline figures must link their artefact"
    cases = _chain_cases(ROOT / CHAIN_CSV)
    commands = {by["ours"]["command"] for by in cases.values() if "ours" in by}
    assert len(commands) == 1 and f"`{as_run_today(commands.pop())}`" in section, \
        "the README must quote the CSV's command"
    rows = readme_headline_rows()
    assert rows, "no headline figures"
    for cells in rows:
        key = tuple(cells[:4])
        assert key in cases, f"headline case {key} is not in {CHAIN_CSV}"
        by = cases[key]
        want = [_ms(by["ours"]), _pct(by["ours"]), _ratio(by, ("vllm",)), _ratio(by, ("torch", "torch_compile"))]
        assert cells[4:] == want, f"README headline {key}: {cells[4:]} but {CHAIN_CSV} gives {want}"
    ours = {key: float(by["ours"]["read_fraction"]) for key, by in cases.items() if "ours" in by}
    assert min(ours, key=ours.get) == tuple(rows[-1][:4]), "the last headline row is not the lowest fraction"
    text = " ".join(README.read_text().split())
    assert f"(the last row is the lowest fraction of the {len(ours)} cases)" in text
    assert f"All {len(ours)} cases, and how to compare" in text


def test_readme_rl_loop_row_is_the_default_run():
    """The README's line on `python -m rl_loop`: policy size, k, steps and the minutes a run takes, from the
    committed default run (three seeds) and the decode benchmark's default policy."""
    import json

    row = next(line for line in README.read_text().splitlines() if line.startswith("| `.venv/bin/python -m rl_loop` |"))
    repeat = json.loads((ROOT / "results/rl_loop/default/repeat.json").read_text())
    shapes = json.loads((ROOT / "results/rl_loop/decode/decode_paths.json").read_text())["shapes"]
    params = next(s for s in shapes if s["preset"] == "default")["parameters"]
    assert f"a {params / 1e6:.1f}M-parameter Qwen3 policy" in row
    assert f"k = {repeat['k']} chain speculation, {repeat['steps']} steps" in row
    lo, hi = map(int, re.search(r"\| (\d+)-(\d+) minutes \|$", row).groups())
    walls = [json.loads((ROOT / f"results/rl_loop/default/seed{i}/summary.json").read_text())["wall_s"]
             for i in range(3)]
    assert all(lo * 60 <= w <= hi * 60 for w in walls), (walls, lo, hi)


@pytest.mark.parametrize("artefact", [CHAIN_CSV, "results/benchmarks/chain_cpu_b64_k3_v151936_zen2_avx2.csv",
                                      "results/benchmarks/chain_cpu_b64_k3_v151936_avx2_capped.csv"])
def test_performance_page_table_is_the_artefacts(artefact):
    """docs/performance.md holds native_cpu_table's output for each committed sweep (the AVX-512 Xeon one and
    the AVX2 Zen 2 one), verbatim, beside the command recorded in the CSV."""
    from benchmarks.native_cpu_table import table, targets

    with (ROOT / artefact).open() as f:
        rows = list(csv.DictReader(f))
    page = (DOCS / "performance.md").read_text()
    assert table(rows) in page, f"docs/performance.md's table differs from {artefact}'s"
    for line in targets(rows):
        assert line in page, f"docs/performance.md lacks the target line {line!r}"
    assert f"`{as_run_today(rows[0]['command'])}`" in page, f"docs/performance.md lacks {artefact}'s command"
    if artefact == CHAIN_CSV:  # the protocol figures of the page are the reference sweep's
        protocol = " ".join(page.split("## Protocol", 1)[1].split("\n## ", 1)[0].split())
        (rounds,), (evict,) = {r["rounds"] for r in rows}, {r["evict_mib"] for r in rows}
        (ours,), (baseline,) = ({r["repeats"] for r in rows if r["provider"] in names}
                                for names in (("ours", "stream", "sum", "int16"), ("vllm", "vllm_step", "torch")))
        shown = f"{rounds} rounds with the providers interleaved and their order alternated; ours and the read " \
                f"probes {ours} calls per round, the baselines {baseline}; every call from caches evicted by a " \
                f"{evict} MiB write"
        assert shown in protocol, f"docs/performance.md's protocol should say: {shown}"


PERFORMANCE = DOCS / "performance.md"


def test_performance_page_ab_reading_is_the_artefacts():
    """The AVX2 section's before / after figures: the pair's rounds and its time changes, from ab_history.csv."""
    pair = "ab_cpu_3c5ba63_vs_5433065"
    rows, _ = _ab_pair(pair)
    saved = {mode: [1 - float(r["after_over_before"]) for r in rows if r["case"].split("/")[2] == mode]
             for mode in ("random_stoch", "random_det")}
    (rounds,) = {r["rounds"] for r in rows}
    text = " ".join(PERFORMANCE.read_text().split())
    shown = [f"took {100 * min(saved['random_stoch']):.0f}-{100 * max(saved['random_stoch']):.0f} % off every "
             "family's bf16 stochastic rows",
             f"moved the deterministic-draft rows by at most {math.ceil(100 * max(map(abs, saved['random_det'])))} % "
             "either way",
             f"pair `{pair}`: {rounds} rounds, interleaved"]
    missing = [x for x in shown if x not in text]
    assert not missing, f"docs/performance.md should say, from ab_history.csv: {missing}"


def _ab_pair(pair: str) -> tuple[list[dict], list[dict]]:
    """A pair's case rows and its read-bandwidth rows, from ab_history.csv."""
    rows = [r for r in _csv_rows("ab_history.csv") if r["pair"] == pair]
    return ([r for r in rows if not r["case"].startswith("read_gbs/")],
            [r for r in rows if r["case"].startswith("read_gbs/")])


def test_performance_page_avx2_shortcuts_and_side_by_side_are_the_artefacts():
    """The AVX2 section's later readings: the shortcuts' before / after changes, and the AVX2 build beside the
    AVX-512 build (time ratios, each build's lowest fraction per mode, the run's read bandwidth), from
    ab_history.csv; the capped table's per-family bandwidths from its CSV."""
    text = " ".join(PERFORMANCE.read_text().split())
    cases, _ = _ab_pair("ab_cpu_86c4065_vs_4cf1f63")
    ratio = {r["case"]: float(r["after_over_before"]) for r in cases}
    stoch = [1 - v for c, v in ratio.items() if "/random_stoch/model" in c]
    accepted = [1 - v for c, v in ratio.items() if "/random_stoch/accept" in c]
    det = [v - 1 for c, v in ratio.items() if "/random_det/" in c]
    (rounds,) = {r["rounds"] for r in cases}
    shown = [f"took {100 * min(stoch):.1f}-{100 * max(stoch):.1f} % off every family's bf16 stochastic-draft rows "
             f"with model drafts", f"accepted, from {-100 * min(accepted):.1f} % slower to {100 * max(accepted):.1f} % "
             "faster", f"changed the deterministic-draft rows' time by {100 * min(det):.1f} % to +{100 * max(det):.1f} %",
             f"pair `ab_cpu_86c4065_vs_4cf1f63`: {rounds} rounds, interleaved"]
    cases, reads = _ab_pair("avx2_vs_avx512_f8d5f29")
    ratios = [float(r["after_over_before"]) for r in cases]
    gbs = [float(r[f"{side}_median_ms"]) for r in reads for side in ("before", "after")]  # GB/s in these rows
    shown += [f"takes {min(ratios):.2f}x to {max(ratios):.2f}x the AVX-512 build's time",
              f"reads {math.floor(min(gbs))}-{math.floor(max(gbs))} GB/s on 2 threads in that run"]
    lows = {}
    for mode in ("greedy", "random_det", "random_stoch"):
        of_mode = [r for r in cases if r["case"].split("/")[2] == mode]
        lows[mode] = [round(100 * min(float(r[f"{side}_read_fraction"]) for r in of_mode))
                      for side in ("after", "before")]
    shown += [f"{lows['greedy'][0]} % greedy", f"the AVX-512 build's lowest is {lows['greedy'][1]} %",
              f"{lows['random_det'][0]} % with deterministic drafts (AVX-512: {lows['random_det'][1]} %)",
              f"{lows['random_stoch'][0]} % with stochastic drafts (bf16 flat; AVX-512: {lows['random_stoch'][1]} %)"]
    with (ROOT / "results/benchmarks/chain_cpu_b64_k3_v151936_avx2_capped.csv").open() as f:
        read = {}  # family -> the read GB/s bench_native_cpu recorded for its dtypes (native_cpu_table.bandwidth)
        for r in csv.DictReader(f):
            if r["provider"] == "sum":
                read.setdefault(r["family"], set()).add(float(r["read_gbs"]))
    others = [g for family, v in read.items() if family != "qwen3" for g in v]
    shown.append(f"probes read {math.floor(min(read['qwen3']))}-{math.ceil(max(read['qwen3']))} GB/s where the others "
                 f"read {math.floor(min(others))}-{math.ceil(max(others))}")
    missing = [x for x in shown if x not in text]
    assert not missing, f"docs/performance.md should say, from ab_history.csv: {missing}"


def _table_after(text: str, marker: str) -> list[list[str]]:
    """The cells of the first markdown table after ``marker`` (header and rule left out)."""
    lines = text.split(marker, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[2:]


def _span(row: dict[str, str], key: str, fmt: str) -> str:
    """``median [min, max]`` of a benchmark row: ``key`` = ``median`` (ms) or a ratio column."""
    lo, mid, hi = (("min_ms", "median_ms", "max_ms") if key == "median" else (f"{key}_min", key, f"{key}_max"))
    return f"{float(row[mid]):{fmt}} [{float(row[lo]):{fmt}}, {float(row[hi]):{fmt}}]"


def _csv_rows(name: str) -> list[dict[str, str]]:
    with (ROOT / "results" / "benchmarks" / name).open(newline="") as f:
        return list(csv.DictReader(f))


def test_performance_page_decoder_step_table_is_the_artefacts():
    """docs/performance.md's drafter-head step table: every cell from decoder_step_cpu.csv, and the command
    and commit it names are the CSV's."""
    rows = _csv_rows("decoder_step_cpu.csv")
    text = PERFORMANCE.read_text()
    assert f"commit {rows[0]['git_commit']}" in text
    assert f"`{as_run_today(rows[0]['command'])}` alone on the machine" in " ".join(text.split())
    by = {(r["head"], f"{r['requests']} x {r['new_tokens']}", r["provider"]): r for r in rows}
    marker = "`results/benchmarks/decoder_step_cpu.csv`, written by"
    (rounds,) = {r["rounds"] for r in rows}
    assert f"over {rounds} rounds:" in " ".join(text.split(marker, 1)[1].split("|", 1)[0].split())
    shown = _table_after(text, marker)
    assert len(shown) == len(by) // 3
    for head, rn, *cells in shown:
        t, c, n = (by[(head, rn, p)] for p in ("torch", "torch_compile", "native"))
        want = [_span(t, "median", ".3g"), _span(c, "median", ".3g"), _span(n, "median", ".3g"),
                f"{float(n['vs_torch']):.2f}x [{float(n['vs_torch_min']):.2f}, {float(n['vs_torch_max']):.2f}]",
                f"{float(n['vs_best_torch']):.2f}x [{float(n['vs_best_torch_min']):.2f}, "
                f"{float(n['vs_best_torch_max']):.2f}]"]
        assert cells == want, f"docs/performance.md decoder step {head} {rn}: {cells} but the CSV gives {want}"


def test_performance_page_drafter_table_is_the_artefacts():
    """docs/performance.md's drafter ops table: every cell from drafter_cpu.csv, and its command and commit."""
    rows = _csv_rows("drafter_cpu.csv")
    text = PERFORMANCE.read_text()
    assert f"commit {rows[0]['git_commit']}" in " ".join(text.split())
    assert f"`{as_run_today(rows[0]['command'])}` alone on the machine" in " ".join(text.split())
    by = {(r["head"], r["op"], r["provider"]): r for r in rows if r["status"] == "ok"}
    marker = "`results/benchmarks/drafter_cpu.csv`, written by"
    (rounds,) = {r["rounds"] for r in rows}
    assert f"over {rounds} rounds:" in " ".join(text.split(marker, 1)[1].split("|", 1)[0].split())
    shown = _table_after(text, marker)
    assert len(shown) == len({(h, o) for h, o, _ in by})
    for head, op, torch_ms, alternative, its_ms, ratio, same in shown:
        name = "eagle3_propose_k3" if op == "propose, k = 3, T = 1" else op.strip("`")
        provider = {"torch.compile": "torch_compile", "native": "native"}[alternative]
        t, a = by[(head, name, "torch")], by[(head, name, provider)]
        result = f"diff {float(a['max_abs_diff']):.1e}" if a["max_abs_diff"] else a["matches_torch"]
        want = [_span(t, "median", ".3g"), _span(a, "median", ".3g"),
                f"{float(a['vs_torch']):.2f}x [{float(a['vs_torch_min']):.2f}, {float(a['vs_torch_max']):.2f}]",
                result]
        assert [torch_ms, its_ms, ratio, same] == want, f"docs/performance.md drafter {head} {op}: the CSV gives {want}"


def test_performance_page_drafter_readings_are_the_artefacts():
    """The figures in the prose under those two tables: ranges over the CSVs' rows."""
    text = " ".join(PERFORMANCE.read_text().split())
    step = _csv_rows("decoder_step_cpu.csv")

    def span(values, fmt):
        return f"{min(values):{fmt}}-{max(values):{fmt}}x"

    def native(head, key, new_tokens=None):
        return [float(r[key]) for r in step if r["provider"] == "native" and r["head"] == head
                and new_tokens in (None, r["new_tokens"])]

    by = {(r["head"], r["requests"], r["new_tokens"], r["provider"]): float(r["median_ms"]) for r in step}
    compile_gain = {head: [by[(h, rq, n, "torch")] / by[(h, rq, n, "torch_compile")]
                           for (h, rq, n, p) in by if h == head and p == "torch"] for head in ("rl_loop", "wide")}
    diff = max(float(r["max_abs_diff"]) for r in step if r["max_abs_diff"])
    drafter = {(r["head"], r["op"], r["provider"]): float(r["vs_torch"]) for r in _csv_rows("drafter_cpu.csv")
               if r["status"] == "ok"}
    selections = [v for (h, op, p), v in drafter.items() if p == "torch_compile" and op.startswith("lm_head")
                  and (h, op) != ("rl_loop", "lm_head_sample_q")]
    shown = [f"all <= {math.ceil(diff * 1e8) / 1e8:.1e} in the committed file",
             f"rl_loop's head at one new token: {span(native('rl_loop', 'vs_best_torch', '1'), '.1f')} over",
             f"torch, {span(native('rl_loop', 'vs_torch', '1'), '.1f')} over eager torch",
             f"(rl_loop's head {span(native('rl_loop', 'vs_best_torch', '4'), '.2f')} over the best torch)",
             f"(native / best torch {span(native('wide', 'vs_best_torch'), '.2f')})",
             f"speeds eager torch up {span(compile_gain['rl_loop'], '.2f')} on the small head",
             f"at most {max(compile_gain['wide']):.2f}x on the wide one",
             f"helps only `norm_fc` ({drafter[('rl_loop', 'norm_fc', 'torch_compile')]:.2f}x on the small head, "
             f"{drafter[('wide', 'norm_fc', 'torch_compile')]:.2f}x on the wide one)",
             f"gains nothing or loses ({span(selections, '.2f')})",
             f"`lm_head_sample_q` most ({drafter[('rl_loop', 'lm_head_sample_q', 'torch_compile')]:.2f}x",
             f"propose round {drafter[('rl_loop', 'eagle3_propose_k3', 'native')]:.1f}x faster on rl_loop's head "
             f"and {drafter[('wide', 'eagle3_propose_k3', 'native')]:.1f}x on the wide one"]
    missing = [x for x in shown if x not in text]
    assert not missing, f"docs/performance.md should say, from its CSVs: {missing}"


def test_performance_page_tolerance_reading_is_the_artefacts(capsys):
    """The spread between the two committed Xeon sweeps that --tolerance's default rests on, as
    native_cpu_table --against prints it."""
    from benchmarks import native_cpu_table

    native_cpu_table.main([str(ROOT / "results/benchmarks/chain_cpu_b64_k3_v151936_repro.csv"),
                           "--against", str(ROOT / CHAIN_CSV)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    within, total, tol, lo, hi = re.match(
        r"(\d+) of (\d+) cases within the reference's \[min, max\] ±(\d+) points; moves from (\S+) .* to (\S+) ",
        last).groups()
    text = " ".join(PERFORMANCE.read_text().split())
    assert f"(default {tol}, from the spread between this table and its committed reproduction" in text
    assert f"finds {within} of {total} cases within {tol} points of its [lowest, highest] round; medians moved " \
           f"from {lo} to {hi} points" in text


def test_tree_page_acceptance_reading_is_the_artefacts():
    """Which measured - exact intervals cover 0, and the range of those that do not, as tree_acceptance.csv
    has them."""
    rows = [r for r in _csv_rows("tree_acceptance.csv") if r["minus_exact"]]
    text = " ".join((DOCS / "tree.md").read_text().split())
    assert f"commit {rows[0]['git_commit']}; seeded)" in text

    def covers(r):
        return float(r["minus_exact_ci95_low"]) <= 0 <= float(r["minus_exact_ci95_high"])

    assert all(covers(r) for r in rows if r["workload"] == "random")
    off = [float(r["minus_exact"]) for r in rows if r["workload"] == "toy" and r["tree"] in ("chain", "static")]
    assert all(not covers(r) for r in rows if r["workload"] == "toy" and r["tree"] in ("chain", "static"))
    assert f"the static tree's do not ({min(off):+.2f} to {max(off):+.2f})" in text


def test_api_page_sampling_mask_costs_are_the_artefacts():
    """docs/api.md's sampling-mask costs: off / on / post-pass medians, tokens and kept ids per truncation, the
    rounds, and the range of on's extra time over the post-pass's, from sampling_mask_cpu_b64_k3_v151936.csv."""
    rows = _csv_rows("sampling_mask_cpu_b64_k3_v151936.csv")
    by = {(r["truncation"], r["mode"]): r for r in rows}
    text = " ".join((DOCS / "api.md").read_text().split())

    def ms(truncation):
        return " / ".join(f"{float(by[truncation, m]['median_ms']):.0f}" for m in ("off", "on", "post_pass"))

    def extra(truncation):
        off, on, post = (float(by[truncation, m]["median_ms"]) for m in ("off", "on", "post_pass"))
        return (on - off) / (post - off)

    truncations = list(dict.fromkeys(r["truncation"] for r in rows))
    assert truncations == ["top_k512_top_p0.97", "top_p0.97", "untruncated"], truncations
    mega = {tr: f"{int(by[tr, 'off']['kept_ids']) / 1e6:.1f} M kept ids" for tr in truncations}
    (rounds,) = {r["rounds"] for r in rows}
    first = by["top_k512_top_p0.97", "off"]
    shown = [f"medians over {rounds} rounds",
             f"{ms('top_k512_top_p0.97')} ms with top-k 512 and top-p 0.97 ({first['emitted_tokens']} emitted tokens, "
             f"{int(first['kept_ids']):,} kept ids)",
             f"{ms('top_p0.97')} ms with top-p 0.97 ({mega['top_p0.97']})",
             f"{ms('untruncated')} ms untruncated ({mega['untruncated']},",
             f"its extra time over off is {min(map(extra, truncations)):.1f} to {max(map(extra, truncations)):.1f} of "
             "the post-pass's"]
    missing = [x for x in shown if x not in text]
    assert not missing, f"docs/api.md should say, from its CSV: {missing}"


def test_audit_findings_counts_are_the_reports():
    """The case counts of docs/exactness-and-audit.md's findings, from the committed reports' outcomes."""
    import json
    from collections import Counter

    from specdec_kernels.audit.report import _fmt_p

    def counts(target):
        data = json.loads((ROOT / "results" / "audit" / f"{target}.json").read_text())
        return data, Counter((o["family"], o["verdict"]) for o in data["outcomes"])

    text = " ".join((DOCS / "exactness-and-audit.md").read_text().split())
    lossy, c = counts("vllm-v1-cpu")
    assert not lossy["complete"] and "INCOMPLETE" in text
    first, seq = (sum(n for (f, _), n in c.items() if f == fam) for fam in ("first-token", "sequence"))
    shown = [f"Of {first} first-token cases {c['first-token', 'FAIL']} are rejected, {c['first-token', 'error']} raise "
             f"an error and {c['first-token', 'pass']} pass; of {seq} sequence cases {c['sequence', 'FAIL']} are "
             f"rejected, {c['sequence', 'error']} raise an error and {c['sequence', 'pass']} pass. The "
             f"{c['first-token', 'pass'] + c['sequence', 'pass']} that pass",
             f"the {c['first-token', 'error'] + c['sequence', 'error']} errors are the top-k cases",
             f"({c['greedy', 'FAIL']} of {c['greedy', 'FAIL'] + c['greedy', 'pass']} greedy cases fail)"]
    _, c = counts("vllm-v1-cpu-fixed")
    shown += [f"({c['first-token', 'pass']} first-token, {c['sequence', 'pass']} sequence, {c['greedy', 'pass']} "
              f"greedy, {c['batch', 'pass']} batch); only the {c['first-token', 'FAIL'] + c['sequence', 'FAIL']} "
              "min-p cases fail"]
    _, c = counts("vllm-v1-triton")
    shown += [f"{c['first-token', 'pass']} first-token and {c['sequence', 'pass']} sequence cases, "
              f"{c['greedy', 'pass']} greedy and {c['batch', 'pass']} batch cases pass; the only rejected law cases "
              f"are the {c['first-token', 'FAIL'] + c['sequence', 'FAIL']} with min-p",
              f"all {c['mutants', 'caught']} planted bugs are caught"]
    v033, c = counts("vllm-v1-triton-0.33.0")
    assert v033["complete"] and v033["target"]["versions"]["vllm"] == "0.33.0"
    rejected = [o["name"] for o in v033["outcomes"] if o["family"] in ("first-token", "sequence", "narrow")
                and o["verdict"] != "pass"]
    assert rejected and all("minp" in name for name in rejected), rejected
    assert not c["mutants", "MISSED"] and not c["mutants", "inert"], c
    shown += [f"{c['first-token', 'pass']} first-token, {c['sequence', 'pass']} sequence, {c['greedy', 'pass']} "
              f"greedy, {c['batch', 'pass']} batch and {c['narrow', 'pass']} narrow cases pass; the only rejected "
              f"law cases are again the {len(rejected)} with min-p",
              f"all {c['mutants', 'caught']} of its planted bugs are caught",
              f"`--tv {v033['level']['tv']:g}`, {v033['seconds']:.0f} s"]
    old, _ = counts("vllm-v2-triton-0.28.0")
    narrow = {o["name"]: o for o in old["outcomes"] if o["family"] == "narrow"}
    deter, stoch = narrow["narrow-deter-V16-reversed"], narrow["narrow-stoch-V16-reversed"]
    assert old["verdict"] == "LOSSY" and deter["verdict"] == "FAIL" and stoch["verdict"] == "pass"
    shown += [f"rejects at chi2 {deter['statistic']:.0f} (df {deter['df']}, {deter['num_samples']:,} trials)",
              f"reaches p = {stoch['pvalue']:.1e} on 0.28.0"]
    for fixed in ("0.29.0", "0.32.0", "0.33.0", "block-0.33.0"):
        assert counts(f"vllm-v2-triton-{fixed}")[0]["verdict"] == "PASS", fixed
    synthetic, c = counts("vllm-v2-triton-synthetic-0.33.0")
    assert synthetic["verdict"] == "LOSSY" and set(c) <= {(f, "FAIL") for f in synthetic["families"]}, c
    hf, c = counts("transformers")
    assert hf["complete"] and "mutants" not in hf["families"]
    shown += [f"{c['first-token', 'pass']} first-token, {c['sequence', 'pass']} sequence, {c['greedy', 'pass']} greedy, "
              f"{c['batch', 'pass']} batch and {c['narrow', 'pass']} narrow cases pass; the "
              f"{c['first-token', 'n/a'] + c['sequence', 'n/a']} min-p cases are not applicable",
              f"so are the {c['bad-input', 'n/a']} bad-input rows"]
    _, c = counts("vllm-v1-cpu")
    shown.append(f"error naming the argument ({c['bad-input', 'FAIL']} in `vllm-v1-cpu.md`)")
    (ours,) = {tuple(sorted(counts(target)[1].items())) for target in ("reference", "cpu")}
    c = dict(ours)
    assert set(c) == {(f, "pass") for f in ("first-token", "sequence", "greedy", "batch", "bad-input")} | {
        ("mutants", "caught"), ("first-token", "n/a"), ("sequence", "n/a")}, c
    shown.append(f"{c['first-token', 'pass']} first-token, {c['sequence', 'pass']} sequence, {c['greedy', 'pass']} "
                 f"greedy, {c['batch', 'pass']} batch and {c['bad-input', 'pass']} bad-input cases pass and all "
                 f"{c['mutants', 'caught']} planted bugs are caught; the "
                 f"{c['first-token', 'n/a'] + c['sequence', 'n/a']} min-p cases are not applicable")
    hfa, c = counts("transformers-assisted")
    assert hfa["verdict"] == "PASS" and hfa["complete"], hfa["verdict"]
    assert set(c) == {("sequence", "pass"), ("greedy", "pass"), ("mutants", "caught")}, c
    law = [o for o in hfa["outcomes"] if o["family"] == "sequence"]
    named = {o["name"]: o for o in hfa["outcomes"]}

    def accepted(name):
        return named[name]["detail"].split("calls, ")[1].split(" candidates")[0]

    shown += [f"passes {len(law)} whole-sequence law cases", f"{accepted('hf-assisted-close-T1')} candidates accepted at "
              f"T = 1 with the close assistant, {accepted('hf-assisted-far-T1')} with the far one), smallest p = "
              f"{_fmt_p(min(o['pvalue'] for o in law))}; {c['greedy', 'pass']} greedy cases",
              f"All {c['mutants', 'caught']} negative controls are rejected"]
    shown += [f"returns the raw logits as q (the transformers #47932 class) at p = "
              f"{_fmt_p(named['candidates-raw-logits']['pvalue'])}",
              f"passed off as sampled at p = {_fmt_p(named['candidates-argmax']['pvalue'])},"]
    shown.append(f"at p = {_fmt_p(named['ratio_inverted']['pvalue'])} and {_fmt_p(named['bonus_wrong_row']['pvalue'])}")
    for target, level in (("cuda-emulated", "`--tv 0.2`"), ("triton", "interpreted, `--tv 0.3`")):
        report, c = counts(target)
        assert report["verdict"] == "PASS" and not any(v in ("FAIL", "error") for _, v in c), (target, c)
        law = sum(n for (f, v), n in c.items() if f in ("first-token", "sequence") and v != "n/a")
        shown.append(f"`{target}.md` ({level}, a selection of {law} law cases")
    missing = [x for x in shown if x not in text]
    assert not missing, f"docs/exactness-and-audit.md should say, from results/audit: {missing}"


def test_performance_page_commands_are_results_readme_commands():
    """docs/performance.md's table of other committed measurements names each file with the command
    results/README.md gives it."""
    def table(path: Path) -> dict[str, str]:
        out = {}
        for line in path.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| `") and len(cells) >= 2 and "python -m " in cells[1]:
                command = re.findall(r"`([^`]+)`", cells[1])[0]
                for name in re.findall(r"`([^`]+)`", cells[0]):
                    out[name.removeprefix("results/")] = command
        return out

    mapped = table(ROOT / "results" / "README.md")
    shown = table(DOCS / "performance.md")
    assert shown
    for name, command in shown.items():
        if "/" in name:
            assert mapped.get(name) == command, f"docs/performance.md gives {name} {command!r}, results/README.md {mapped.get(name)!r}"


def test_rl_loop_page_figures_match_their_artefacts():
    import json

    page = (DOCS / "rl_loop.md").read_text()
    repeat = json.loads((ROOT / "results/rl_loop/default/repeat.json").read_text())["figures"]
    verify = json.loads((ROOT / "results/rl_loop/verify_methods.json").read_text())["conditional_chain"]
    shapes = json.loads((ROOT / "results/rl_loop/decode/decode_paths.json").read_text())["shapes"]
    default = next(s for s in shapes if s["preset"] == "default")
    from rl_loop.config import RunConfig, tiny_config

    text = " ".join(page.split())
    run, tiny = RunConfig(), tiny_config()
    checks = [json.loads((ROOT / f"results/rl_loop/default/seed{i}/equivalence.json").read_text()) for i in range(3)]
    n = run.equivalence_prompts * run.equivalence_samples
    assert {c["samples_per_arm"] for c in checks} == {n} and all(c["control_rejected"] for c in checks)
    power = min(c["power"]["two_sample_power"] for c in checks)
    (tv,) = {c["power"]["tv"] for c in checks}
    assert (f"the default sample is {run.equivalence_prompts} prompts x {run.equivalence_samples} = {n:,} per arm, "
            f"power >= {math.floor(power * 10) / 10:g} at total variation {tv:g} per test") in text
    assert f"sample ({tiny.equivalence_prompts * tiny.equivalence_samples} per arm) is underpowered" in text
    ray = json.loads((ROOT / "results/rl_loop/ray_workers.json").read_text())
    assert f"under-predicts a step's generation by up to {100 * ray['max_relative_error']:.0f} %" in text
    gaps = [1000 * (s[n]["measured_s"] - s[n]["predicted_s"]) for s in ray["steps"] for n in s if n != "step"]
    assert f"a fixed {min(gaps):.0f}-{max(gaps):.0f} ms per step that no calibrated cost accounts for" in text
    for shown in (f"**{default['verify_over_decode']:.2f}** one-token decodes",
                  f"**{repeat['rollout_speedup']['median']:.2f}x**",
                  f"**{repeat['mean_accepted_length']['median']:.2f}**",
                  f"**{verify['block_minus_token']:+.4f}**"):
        assert shown in page, f"docs/rl_loop.md should show {shown} from its artefact"
    rollout, order = repeat["rollout_speedup"], repeat["rollout_speedup"]["by_order"]
    for shown in ("seeds " + ", ".join(f"{v:.2f}x" for v in rollout["per_seed"]),
                  "pooled 95 % interval [{:.3f}, {:.3f}]".format(*rollout["pooled_ci95"]),
                  f"step speedup **{repeat['step_speedup']['median']:.2f}x**",
                  f"end to end **{repeat['end_to_end_speedup']['median']:.2f}x**",
                  f"ran first give **{order['ar_first']['pooled']:.3f}x** ({order['ar_first']['steps']} steps)",
                  f"speculation did **{order['spec_first']['pooled']:.3f}x** ({order['spec_first']['steps']} steps)",
                  f"the default policy ({default['parameters'] / 1e6:.1f}M parameters, a "
                  f"{run.model.vocab_size}-token vocabulary)"):
        assert shown in text, f"docs/rl_loop.md should show {shown} from its artefact"


def test_vllm_page_end_to_end_table_is_the_artefacts():
    """docs/vllm.md shows results/benchmarks/vllm_e2e_cpu.md's table verbatim, beside the command recorded in
    its CSV, and every row of that table is its CSV row (tokens/s median [min, max], tokens per step)."""
    page = (DOCS / "vllm.md").read_text()
    table = [line for line in (ROOT / "results/benchmarks/vllm_e2e_cpu.md").read_text().splitlines()
             if line.startswith("|")]
    assert "\n".join(table) in page, "docs/vllm.md's end-to-end table differs from results/benchmarks/vllm_e2e_cpu.md"
    rows = _csv_rows("vllm_e2e_cpu.csv")
    (command,) = {r["command"] for r in rows}
    assert f"`{command}`" in page
    shown = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): line for line in table[2:]}
    assert len(shown) == len(rows)
    for r in rows:  # the table rounds the run's values to 0.1 / 0.01, the CSV to 0.01 / 0.001
        cells = [c.strip() for c in shown[(r["batch"], r["spec"], r["verifier"] or "—")].strip("|").split("|")]
        rate = [float(x) for x in re.fullmatch(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", cells[3]).groups()]
        csv_rate = [float(r[c]) for c in ("tok_s_median", "tok_s_min", "tok_s_max")]
        assert all(abs(a - b) <= 0.051 for a, b in zip(rate, csv_rate, strict=True)), (cells, csv_rate)
        if r["tokens_per_step"] == "—":
            assert cells[5] == "—", cells
        else:
            assert abs(float(cells[5]) - float(r["tokens_per_step"])) <= 0.0051, (cells, r["tokens_per_step"])
    # the reading under the table
    text = " ".join(page.split())
    arms = {(r["batch"], r["spec"], r["plugin"]): r for r in rows}
    draft = {plugin: [r for (_, spec, p), r in arms.items() if spec == "draft" and p == plugin] for plugin in "01"}
    steps = {plugin: [float(r["tokens_per_step"]) for r in draft[plugin]] for plugin in "01"}
    ratios = [float(arms[b, "draft", "1"]["tok_s_median"]) / float(arms[b, "draft", "0"]["tok_s_median"])
              for b in {r["batch"] for r in rows}]
    assert all(float(r["speedup_vs_ar"]) < 1 for r in draft["0"] + draft["1"]), "a draft-model arm beats no speculation"
    assert {f"{float(r['tokens_per_step']):.1f}" for r in rows if r["spec"] == "eagle3"} == {"1.0"}
    shown = f"vLLM's CPU path keeps {min(steps['0']):.2f}-{max(steps['0']):.2f} tokens per step, the plugin " \
            f"{min(steps['1']):.1f}-{max(steps['1']):.1f} on the same models, and the plugin runs " \
            f"{min(ratios):.1f}-{max(ratios):.1f}x vLLM's tokens/s"
    assert shown in text, f"docs/vllm.md should say, from its CSV: {shown}"


# (e) -------------------------------------------------------------------------------------------------

DOC_EXAMPLES = [(p, i) for p in sorted(DOCS.glob("**/*.md")) for i in range(len(python_examples(p)))]


@pytest.mark.parametrize("path,index", DOC_EXAMPLES, ids=[f"{p.name}:{i}" for p, i in DOC_EXAMPLES])
def test_docs_python_examples_print_what_they_show(path, index):
    code, expected = python_examples(path)[index]
    assert expected is not None, f"{path.name} python block {index} has no ```text output after it"
    assert run_example(code, f"{path.name} python block {index}") == expected


def marked_block(text: str, name: str, source: str) -> str:
    """The lines a page holds between ``<!-- name: source -->`` and ``<!-- /name -->`` (a table written from
    ``source``)."""
    start = text.index(f"<!-- {name}: {source} -->\n")
    end = text.index(f"\n<!-- /{name} -->")
    return text[start:end].split("\n", 1)[1]


def sensitivity_table(rows: list[dict[str, str]]) -> str:
    """The simulator page's 235B sensitivity table from ``speedup_sensitivity.csv``: end-to-end speedup per
    acceptance (rows) x EP width and policy lag (columns), the preset's own point starred."""
    eps = sorted({int(r["ep"]) for r in rows})
    lags = sorted({int(r["policy_lag"]) for r in rows})
    cell = {(r["acceptance"], int(r["ep"]), int(r["policy_lag"])): r for r in rows}
    head = ["acceptance", *(f"EP{ep}, lag {lag}" for ep in eps for lag in lags)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in dict.fromkeys(r["acceptance"] for r in rows):
        cells = []
        for ep in eps:
            for lag in lags:
                r = cell[(a, ep, lag)]
                cells.append(f"{float(r['end_to_end_speedup']):.2f}x" + ("*" if r["preset_point"] == "True" else ""))
        lines.append(f"| {float(a):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_simulator_sensitivity_table_is_the_artefact():
    with open(REPO / "results/sim/sweep/speedup_sensitivity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    text = (REPO / "docs/simulator.md").read_text()
    assert marked_block(text, "sensitivity", "results/sim/sweep/speedup_sensitivity.csv") == sensitivity_table(rows)
    assert sum(r["preset_point"] == "True" for r in rows) == 1
    # the reading under the table: the range, the layout at lag 2, the lag and the acceptance at EP16
    (point,) = [r for r in rows if r["preset_point"] == "True"]
    at = {(r["acceptance"], int(r["ep"]), int(r["policy_lag"])): float(r["end_to_end_speedup"]) for r in rows}
    a, ep = point["acceptance"], int(point["ep"])
    eps = sorted({e for _, e, _ in at})
    assert all(at[x, e, 1] > at[x, e, 2] for x, e, _ in at), "lag 1 no longer projects more in every cell"

    def over_acceptance(lag):
        return f"{min(v for (_, e, g), v in at.items() if e == ep and g == lag):.2f}x to " \
               f"{max(v for (_, e, g), v in at.items() if e == ep and g == lag):.2f}x"

    shown = [f"Across the {len(rows)} cells the projection runs from {min(at.values()):.2f}x to {max(at.values()):.2f}x",
             f"EP{eps[0]} gives {at[a, eps[0], 2]:.2f}x and EP{eps[-1]} {at[a, eps[-1], 2]:.2f}x at the calibrated acceptance",
             f"({at[a, ep, 1]:.2f}x against {at[a, ep, 2]:.2f}x at EP{ep})",
             f"least at lag 2 ({over_acceptance(2)} at EP{ep}) and most at lag 1 ({over_acceptance(1)})"]
    end = text.index("\n<!-- /sensitivity -->")
    prose = " ".join(text[end:].split("\n## ", 1)[0].split())
    missing = [x for x in shown if x not in prose]
    assert not missing, f"docs/simulator.md should say, from speedup_sensitivity.csv: {missing}"


def preregistered_table(measured: dict) -> str:
    """The simulator page's table of the predictions committed before their measurement (or of a replication)."""
    lines = [f"| k | predicted (committed first) | measured, median [min, max] of {measured['rounds']} rounds | error | "
             "within 20 % |", "|---|---|---|---|---|"]
    for r in measured["results"]:
        lines.append(f"| {r['k']} | {r['predicted_speedup']:.2f}x | {r['measured_speedup']:.2f}x "
                     f"[{r['measured_min']:.2f}, {r['measured_max']:.2f}] | {100 * r['error']:+.1f} % | "
                     f"{'yes' if r['within_tolerance'] else 'no'} |")
    return "\n".join(lines)


def test_simulator_preregistered_table_is_the_artefact():
    import json

    measured = json.loads((REPO / "results/sim/preregistered/measured.json").read_text())
    assert measured["tolerance"] == 0.20 and measured["rounds"] == 5  # as the table's header states
    text = (REPO / "docs/simulator.md").read_text()
    assert marked_block(text, "preregistered", "results/sim/preregistered/measured.json") == preregistered_table(measured)
    # the prose around the table: the shape table's errors the tolerance rests on, and the reading
    predictions = json.loads((REPO / "results/sim/preregistered/predictions.json").read_text())
    shapes = json.loads((REPO / "results/rl_loop/shapes/shapes.json").read_text())["results"]
    shape_errors = [x["predicted_speedup"] / x["measured_speedup"] - 1 for r in shapes for x in r["speedups"]]
    by_k = {r["k"]: r for r in measured["results"]}
    last = max(by_k)
    fit = next(p["fit_tokens_per_step"] for p in predictions["predictions"] if p["k"] == last)
    close = [abs(r["error"]) for k, r in by_k.items() if k != last]
    assert by_k[last]["error"] > 0
    assert all(r["measured_speedup"] < 1 and r["predicted_speedup"] < 1 for r in by_k.values()), \
        "the page says speculation loses at every k, and that the simulator predicted it"
    shown = [f"had erred by {100 * min(shape_errors):.0f} % to {100 * max(shape_errors):+.0f} %",
             f"The prediction at k = {' and '.join(str(k) for k in by_k if k != last)} is within "
             f"{math.ceil(1000 * max(close)) / 10:.1f} %",
             f"At k = {last} it runs {100 * by_k[last]['error']:.0f} % high",
             f"At k = {last} the held-out sets also made {by_k[last]['held_out_tokens_per_step']:.2f} tokens per round "
             f"against the fitting set's {fit:.2f}"]
    prose = " ".join(text.split())
    missing = [x for x in shown if x not in prose]
    assert not missing, f"docs/simulator.md should say, from results/sim/preregistered and the shape table: {missing}"


def test_simulator_replication_table_is_the_artefact():
    """The quiet replication of the pre-registered measurement: its table and the reading's figures."""
    import json

    replication = json.loads((REPO / "results/sim/preregistered/measured-quiet.json").read_text())
    text = (REPO / "docs/simulator.md").read_text()
    assert marked_block(text, "replicated", "results/sim/preregistered/measured-quiet.json") == preregistered_table(replication)
    by_k = {r["k"]: r for r in replication["results"]}
    last = max(by_k)
    close = max(abs(r["error"]) for k, r in by_k.items() if k != last)
    shown = [f"with {replication['rounds']} rounds instead of 5", replication["provenance"]["command"],
             f"k = {' and '.join(str(k) for k in by_k if k != last)} within {100 * close:.1f} %",
             f"k = {last} again runs {100 * by_k[last]['error']:.0f} % high",
             f"({by_k[last]['measured_min']:.2f}x to {by_k[last]['measured_max']:.2f}x at k = {last})"]
    prose = " ".join(text.split())
    missing = [x for x in shown if x not in prose]
    assert not missing, f"docs/simulator.md should say, from measured-quiet.json: {missing}"


SHAPE_REGISTRATIONS = ("default-quiet", "wide", "search", "wide-search")  # results/sim/preregistered/<name>/


def shapes_preregistered_table(names: tuple[str, ...] = SHAPE_REGISTRATIONS) -> str:
    """The simulator page's table of pre-registrations ``names`` (``results/sim/preregistered/<name>/``): each k's
    prediction, the pre-registered 5-round measurement and the 25-round replication."""
    import json

    lines = ["| policy | task mix | k | predicted (committed first) | measured, median [min, max] of 5 rounds | error "
             "| measured, 25 rounds | error | within 20 % (5 / 25 rounds) |", "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        where = REPO / "results/sim/preregistered" / name
        p = json.loads((where / "predictions.json").read_text())
        first = json.loads((where / "measured.json").read_text())
        again = json.loads((where / "measured-25.json").read_text())
        assert first["rounds"] == 5 and again["rounds"] == 25 and p["tolerance"] == 0.20
        for a, b in zip(first["results"], again["results"], strict=True):
            lines.append(f"| {p['policy']['preset']} | {p['workload']} | {a['k']} | {a['predicted_speedup']:.2f}x | "
                         f"{a['measured_speedup']:.2f}x [{a['measured_min']:.2f}, {a['measured_max']:.2f}] | "
                         f"{100 * a['error']:+.1f} % | {b['measured_speedup']:.2f}x | {100 * b['error']:+.1f} % | "
                         f"{'yes' if a['within_tolerance'] else 'no'} / {'yes' if b['within_tolerance'] else 'no'} |")
    return "\n".join(lines)


def test_simulator_shapes_preregistered_table_is_the_artefact():
    """The shape table's other shapes, pre-registered: the table and the reading's figures."""
    import json

    text = (REPO / "docs/simulator.md").read_text()
    assert marked_block(text, "shapes-preregistered", "results/sim/preregistered/{default-quiet,wide,search,wide-search}") == shapes_preregistered_table()
    rows = []
    for name in SHAPE_REGISTRATIONS:
        where = REPO / "results/sim/preregistered" / name
        p = json.loads((where / "predictions.json").read_text())
        fit = {x["k"]: x["fit_tokens_per_step"] for x in p["predictions"]}
        for a, b in zip(json.loads((where / "measured.json").read_text())["results"],
                        json.loads((where / "measured-25.json").read_text())["results"], strict=True):
            rows.append((name, a["k"], a["error"], b["error"], fit[a["k"]], a["held_out_tokens_per_step"]))
    by = {(r[0], r[1]): r for r in rows}
    quiet, shapes = [r for r in rows if r[0] == "default-quiet"], [r for r in rows if r[0] != "default-quiet"]
    low = sum(r[2] < 0 for r in shapes)
    shown = [f"at k = 5 it runs {100 * by['default-quiet', 5][2]:.1f} % high over 5 rounds",
             f"and {100 * by['default-quiet', 5][3]:.1f} % over 25",
             f"k = 1 and 3 within {100 * max(abs(r[2]) for r in quiet if r[1] != 5):.1f} %",
             f"{low} of the {len(shapes)} pre-registered errors are negative",
             f"from {100 * min(r[2] for r in shapes):+.1f} % to {100 * max(r[2] for r in shapes):+.1f} %",
             f"the replication's from {100 * min(r[3] for r in shapes):+.1f} % to "
             f"{100 * max(r[3] for r in shapes):+.1f} %",
             f"{by['wide', 3][5]:.2f} tokens per round against the fitting set's {by['wide', 3][4]:.2f}",
             f"({by['search', 3][5]:.2f} against {by['search', 3][4]:.2f}) and the prediction still runs "
             f"{-100 * by['search', 3][2]:.0f} % low"]
    prose = " ".join(text.split())
    missing = [x for x in shown if x not in prose]
    assert not missing, f"docs/simulator.md should say, from results/sim/preregistered: {missing}"


BOOKKEEPING_REGISTRATIONS = ("default-bookkeeping", "wide-bookkeeping")


def test_simulator_bookkeeping_preregistered_table_is_the_artefact():
    """The registrations with the engine's bookkeeping priced: the table and the reading's figures."""
    import json

    text = (REPO / "docs/simulator.md").read_text()
    assert marked_block(text, "bookkeeping-preregistered", "results/sim/preregistered/{default,wide}-bookkeeping") == shapes_preregistered_table(BOOKKEEPING_REGISTRATIONS)
    where = REPO / "results/sim/preregistered"
    load = lambda name, f: json.loads((where / name / f).read_text())  # noqa: E731
    first = {n: {r["k"]: r for r in load(n, "measured.json")["results"]} for n in BOOKKEEPING_REGISTRATIONS}
    again = {n: {r["k"]: r for r in load(n, "measured-25.json")["results"]} for n in BOOKKEEPING_REGISTRATIONS}
    quiet = {r["k"]: r for r in load("default-quiet", "measured.json")["results"]}
    per_slot = [1e6 * load(n, "predictions.json")["fits"]["round_coef"][1] for n in BOOKKEEPING_REGISTRATIONS]
    assert all(load(n, "predictions.json")["held_out_seeds"] == [4, 5, 6] for n in BOOKKEEPING_REGISTRATIONS)
    shown = [f"from {100 * quiet[5]['error']:+.1f} % to {100 * first['default-bookkeeping'][5]['error']:+.1f} %",
             f"({100 * again['default-bookkeeping'][5]['error']:+.1f} % over 25 rounds)",
             f"{per_slot[0]:.1f} and {per_slot[1]:.1f} µs",
             f"within {100 * max(abs(r['error']) for d in first.values() for r in d.values()):.1f} % over the "
             f"pre-registered 5 rounds and {100 * max(abs(r['error']) for d in again.values() for r in d.values()):.1f} %"]
    prose = " ".join(text.split())
    missing = [x for x in shown if x not in prose]
    assert not missing, f"docs/simulator.md should say, from results/sim/preregistered/*-bookkeeping: {missing}"


def gpu_predicted_table(predictions: dict) -> str:
    """The simulator page's table of the GPU rollout figure's prediction (``gpu_rollout_predictions.json``)."""
    lines = ["| GPU | predicted speedup | tokens per round | AR: ms (host overhead ms) | speculative: ms (host "
             "overhead ms) | at acceptance 0.70 / 0.80 / 0.90 |", "|---|---|---|---|---|---|"]
    for gpu, p in predictions["gpus"].items():
        ar, sp = p["ar"], p["speculative"]
        grid = {g["acceptance"]: g["speedup"] for g in p["grid"]}
        lines.append(f"| {gpu} | {p['predicted_speedup']:.2f}x | {p['tokens_per_round']:.2f} | "
                     f"{1e3 * ar['seconds']:.1f} ({1e3 * ar['breakdown_s']['overhead']:.1f}) | "
                     f"{1e3 * sp['seconds']:.1f} ({1e3 * sp['breakdown_s']['overhead']:.1f}) | "
                     f"{' / '.join(f'{grid[a]:.2f}x' for a in (0.7, 0.8, 0.9))} |")
    return "\n".join(lines)


def test_simulator_gpu_prediction_table_is_the_artefact():
    """The GPU rollout figure's prediction: the table, the tolerance and the reading's figures (H100)."""
    import json

    predictions = json.loads((REPO / "results/sim/preregistered/gpu_rollout_predictions.json").read_text())
    text = (REPO / "docs/simulator.md").read_text()
    assert marked_block(text, "gpu-predicted", "results/sim/preregistered/gpu_rollout_predictions.json") == gpu_predicted_table(predictions)
    h100 = predictions["gpus"]["H100"]
    ar, sp = h100["ar"]["breakdown_s"], h100["speculative"]["breakdown_s"]
    a = h100["assumptions"]
    ar_device = sum(v for k, v in ar.items() if k != "overhead")
    sp_device = sum(v for k, v in sp.items() if k != "overhead")
    ms = lambda x: f"{1e3 * x:.1f}"  # noqa: E731
    shown = [f"The tolerance is {100 * predictions['tolerance']:.0f} %",
             f"{ms(a['step_overhead_s'])[:-2]} ms a step, plus {ms(a['spec_step_overhead_s'])[:-2]} ms a round and "
             f"{1e3 * a['draft_token_overhead_s']:.2f} ms a draft",
             f"{ms(ar['overhead'])} of the {ms(h100['ar']['seconds'])} ms",
             f"{ms(sp['overhead'])} of the {ms(h100['speculative']['seconds'])} ms",
             f"({ms(ar_device)} against {ms(sp_device)} ms, {ar_device / sp_device:.2f}x)",
             f"Verification saves {ms(ar['target'] - sp['target'])} ms of policy forwards",
             f"the drafter ({ms(sp['drafter'])} ms"]
    prose = " ".join(text.split())
    missing = [x for x in shown if x not in prose]
    assert not missing, f"docs/simulator.md should say, from gpu_rollout_predictions.json: {missing}"
    g = predictions["gpus"]
    said = (f"({g['H100']['predicted_speedup']:.2f}x on an H100, {g['H200']['predicted_speedup']:.2f}x on an H200, "
            f"tolerance {100 * predictions['tolerance']:.0f} %")
    assert said in " ".join((REPO / "docs/rl_loop.md").read_text().split()), f"docs/rl_loop.md should say {said}"
