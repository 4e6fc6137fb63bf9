"""The manual: README at most 250 lines, the docs site builds strictly, every relative link resolves, the
README's headline figures equal their artefact, and the docs' Python examples and tables are what their
sources produce. Each test here was shown to fail on a planted break (a broken link or anchor, an
edited figure or output, a page left out of the nav, a README over the limit)."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_readme import python_examples, run_example

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
CHAIN_CSV = "benchmarks/results/chain_cpu_b64_k3_v151936.csv"


def _markdown_files() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted(DOCS.glob("**/*.md"))]


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
    assert len(commands) == 1 and f"`{commands.pop()}`" in section, "the README must quote the CSV's command"
    rows = readme_headline_rows()
    assert rows, "no headline figures"
    for cells in rows:
        key = tuple(cells[:4])
        assert key in cases, f"headline case {key} is not in {CHAIN_CSV}"
        by = cases[key]
        want = [_ms(by["ours"]), _pct(by["ours"]), _ratio(by, ("vllm",)), _ratio(by, ("torch", "torch_compile"))]
        assert cells[4:] == want, f"README headline {key}: {cells[4:]} but {CHAIN_CSV} gives {want}"


@pytest.mark.parametrize("artefact", [CHAIN_CSV, "benchmarks/results/chain_cpu_b64_k3_v151936_zen2_avx2.csv"])
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
    assert f"`{rows[0]['command']}`" in page, f"docs/performance.md lacks {artefact}'s command"


def test_rl_loop_page_figures_match_their_artefacts():
    import json

    page = (DOCS / "rl_loop.md").read_text()
    repeat = json.loads((ROOT / "results/rl_loop/default/repeat.json").read_text())["figures"]
    verify = json.loads((ROOT / "results/rl_loop/verify_methods.json").read_text())["conditional_chain"]
    for shown in (f"**{repeat['rollout_speedup']['median']:.2f}x**",
                  f"**{repeat['mean_accepted_length']['median']:.2f}**",
                  f"**{verify['block_minus_token']:+.4f}**"):
        assert shown in page, f"docs/rl_loop.md should show {shown} from its artefact"


# (e) -------------------------------------------------------------------------------------------------

DOC_EXAMPLES = [(p, i) for p in sorted(DOCS.glob("**/*.md")) for i in range(len(python_examples(p)))]


@pytest.mark.parametrize("path,index", DOC_EXAMPLES, ids=[f"{p.name}:{i}" for p, i in DOC_EXAMPLES])
def test_docs_python_examples_print_what_they_show(path, index):
    code, expected = python_examples(path)[index]
    assert expected is not None, f"{path.name} python block {index} has no ```text output after it"
    assert run_example(code, f"{path.name} python block {index}") == expected
