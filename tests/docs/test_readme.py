"""The README's Python examples run as written and print what the README shows (a new user's first contact
with the library). Each ```python block must be followed by a ```text block holding its exact output."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOT = REPO
README = ROOT / "README.md"

# A ```python block, optionally followed (after prose) by the next ```text block: its expected output.
_BLOCK = re.compile(r"```python\n(.*?)```(?:(?:(?!```).)*?```text\n(.*?)```)?", flags=re.S)


def python_examples(path: Path) -> list[tuple[str, str | None]]:
    """(code, expected stdout or None) of every ```python block of a markdown file, in order."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(path.read_text())]


def run_example(code: str, name: str, replace: tuple[str, str] | None = None) -> str:
    """Run one example as written (optionally with one literal replacement) and return what it printed."""
    if replace is not None:
        assert replace[0] in code, f"{name}: {replace[0]!r} not in the example"
        code = code.replace(replace[0], replace[1], 1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), {"__name__": "__readme__"})
    return out.getvalue()


def test_every_readme_python_block_has_its_output_shown():
    blocks = python_examples(README)
    assert blocks, "README has no ```python example"
    for i, (_, expected) in enumerate(blocks):
        assert expected is not None, f"README python block {i} has no ```text output block after it"


@pytest.mark.parametrize("index", range(len(python_examples(README))))
def test_readme_python_block_prints_what_the_readme_shows(index):
    code, expected = python_examples(README)[index]
    assert run_example(code, f"README.md python block {index}") == expected


@pytest.mark.slow
def test_api_example_same_tokens_on_every_cpu_backend():
    """The README says every backend emits the example's tokens: check each backend this install has."""
    import specdec_kernels as sk

    code, expected = python_examples(README)[0]
    for backend in sk.available_backends("cpu"):
        got = run_example(code, f"README API example, backend={backend}",
                          replace=("seed=torch.tensor([1, 2]),", f"seed=torch.tensor([1, 2]), backend={backend!r},"))
        assert got == expected, backend


def test_readme_states_the_test_commands_that_ci_runs():
    """The README's two test commands, the fast tier and the whole suite, are the ones .ci/run runs, flags
    included (workers, markers, --durations)."""
    ci = (ROOT / ".ci" / "run").read_text()
    found = re.findall(r'^\s*TRITON_INTERPRET=1 "\$PY" -m pytest (.+?) 2>&1 \| tee ', ci, flags=re.M)
    assert len(found) == 2, ".ci/run runs no fast tier and whole suite under TRITON_INTERPRET=1"
    fast, whole = found
    assert '-m "not slow"' in fast and "--durations" in whole
    text = README.read_text()
    assert f"`TRITON_INTERPRET=1 .venv/bin/python -m pytest {fast}`" in text
    assert f"`TRITON_INTERPRET=1 python -m pytest {whole}`" in text


def _stated(line: str) -> dict[str, set[int]]:
    """The durations and counts a line states: seconds (``1470 s``), minutes (``about 25 minutes``) and
    test counts (``988 tests``, not a command's ``--durations=30 tests``)."""
    return {unit: {int(n) for n in re.findall(pattern, line)} for unit, pattern in
            (("s", r"\b(\d+) s\b"), ("minutes", r"about (\d+) minutes"), ("tests", r"(?<!=)\b(\d+) tests\b"))}


def test_docs_durations_are_the_recorded_ci_run():
    """The README's and the design page's .ci/run durations and test counts are the ones
    results/ci/ci_run.json recorded (written by .ci/run itself): a new record or an edited figure without
    the other fails here. The record's own phases add up, and its runs passed."""
    record = ROOT / "results" / "ci" / "ci_run.json"
    if not record.exists():  # only before the first record is committed: .ci/run writes it after this test
        pytest.skip("no .ci/run record committed yet")
    ci = json.loads(record.read_text())
    assert ci["command"] == "bash .ci/run" and ci["commit"] and ci["dirty"] is False
    assert ci["install_s"] + ci["fast_tier_s"] + ci["tests_s"] == ci["total_s"]
    assert ci["fast_tier"]["failed"] == ci["suite"]["failed"] == ci["suite"]["errors"] == 0
    assert 0 < ci["fast_tier_tests"] < ci["suite_tests"]
    minutes = round(ci["total_s"] / 60)
    readme = README.read_text().splitlines()
    design = (ROOT / "docs" / "design.md").read_text().splitlines()
    expected = {
        "| `bash .ci/run` |": (readme, {"s": {ci["total_s"], ci["install_s"], ci["fast_tier_s"], ci["tests_s"]},
                                        "minutes": {minutes}, "tests": set()}),
        "While developing, the fast tier": (readme, {"s": {ci["fast_tier_s"]}, "minutes": set(),
                                                      "tests": {ci["fast_tier_tests"]}}),
        "the fast tier, for development": (design, {"s": {ci["fast_tier_s"]}, "minutes": set(),
                                                     "tests": {ci["fast_tier_tests"]}}),
        "as `bash .ci/run` runs it": (design, {"s": {ci["tests_s"]}, "minutes": set(),
                                               "tests": {ci["suite_tests"]}}),
    }
    for marker, (lines, figures) in expected.items():
        line = next(line for line in lines if marker in line)
        assert _stated(line) == figures, marker
