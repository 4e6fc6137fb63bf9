"""Layering of the code base: no import cycles (module-level or deferred imports alike) in ``rl_loop`` and
``specdec_kernels``, and neither ``specdec_kernels`` nor ``benchmarks/bench_*.py`` imports ``rl_loop``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rl_loop", "specdec_kernels", "benchmarks")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of ``mods`` that ``name`` imports anywhere in its body (``from . import x`` of a submodule
    is an edge to the submodule, not to the package being initialised)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in mods}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            subs = {f"{prefix}.{a.name}" for a in node.names} & mods.keys()
            out |= subs or ({prefix} & mods.keys())
    return out - {name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


def test_the_library_and_the_kernel_benchmarks_never_import_rl_loop(graph):
    bad = [(m, t) for m, targets in graph.items() for t in targets
           if (m.startswith("specdec_kernels") or m.startswith("benchmarks.bench_")) and t.startswith("rl_loop")]
    assert bad == []


def test_the_check_sees_a_cycle():
    """Power: a planted two-module cycle and a deferred import back into a package are found."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    mods = _modules()
    assert "rl_loop.sync_pipeline" in _imports("rl_loop.train", mods["rl_loop.train"], mods)  # a deferred import
