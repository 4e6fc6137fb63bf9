"""The README's Python examples run as written and print what the README shows (a new user's first contact
with the library). Each ```python block must be followed by a ```text block holding its exact output."""

from __future__ import annotations

import contextlib
import io
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


def test_readme_states_the_test_command_that_ci_runs():
    """The README's test command is the one .ci/run runs, flags included (workers, --durations)."""
    ci = (ROOT / ".ci" / "run").read_text()
    found = re.search(r'^TRITON_INTERPRET=1 "\$PY" -m pytest (.+)$', ci, flags=re.M)
    assert found, ".ci/run runs no TRITON_INTERPRET=1 pytest command"
    assert f"`TRITON_INTERPRET=1 python -m pytest {found.group(1)}`" in README.read_text()
