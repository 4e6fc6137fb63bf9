"""The README's public-API example runs as written (a new user's first contact with the library)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _section_code(heading: str) -> str:
    text = README.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, f"no python example under '## {heading}'"
    return blocks[0]


def test_public_api_example_runs(capsys):
    namespace: dict = {}
    exec(compile(_section_code("Public API"), "README.md", "exec"), namespace)
    res = namespace["res"]
    assert res.output_token_ids.shape == (2, 4)
    assert res.output_token_ids.dtype.is_floating_point is False
    out = capsys.readouterr().out
    assert "reference" in out
