"""Layering of the code base: no import cycles (module-level, deferred or through ``importlib.import_module``
of a literal name alike) in ``rl_loop``, ``specdec_kernels`` and ``benchmarks``; neither ``specdec_kernels``
nor any ``benchmarks/*.py`` imports ``rl_loop``; nothing of them imports the test-only ``tests`` package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOT = REPO
PACKAGES = ("rl_loop", "specdec_kernels", "benchmarks")


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    mods = {}
    for pkg in packages:
        for f in (root / pkg).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _import_module_literal(node: ast.Call, package: str) -> str | None:
    """The module that ``importlib.import_module("name")`` / ``import_module(".name", __package__)`` names,
    when the name is a literal (relative names resolve against this module's package); else None."""
    func = node.func
    is_import_module = (isinstance(func, ast.Attribute) and func.attr == "import_module"
                        and isinstance(func.value, ast.Name) and func.value.id == "importlib") or (
        isinstance(func, ast.Name) and func.id == "import_module")
    if not is_import_module or not node.args:
        return None
    arg = node.args[0]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    name = arg.value
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([name.lstrip(".")] if name.lstrip(".") else []))


def _raw_imports(name: str, path: Path) -> set[str]:
    """Every absolute module name ``name`` imports anywhere in its body (``from x import y`` gives both
    ``x`` and ``x.y``: y may be a submodule)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            out.add(prefix)
            out |= {f"{prefix}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call):
            target = _import_module_literal(node, package)
            if target is not None:
                out.add(target)
    return out


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
        elif isinstance(node, ast.Call):
            target = _import_module_literal(node, package)
            if target in mods:
                out.add(target)
    return out - {name}


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    return {name: _imports(name, path, mods) for name, path in mods.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return _graph(_modules())


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


def test_the_library_and_the_benchmarks_never_import_rl_loop(graph):
    bad = [(m, t) for m, targets in graph.items() for t in targets
           if m.startswith(("specdec_kernels", "benchmarks")) and t.startswith("rl_loop")]
    assert bad == []


def test_nothing_imports_the_test_harnesses():
    """``tests/`` (its harnesses included) is test-only: the library, the loop and the benchmarks never need it."""
    bad = [(m, t) for m, path in _modules().items() for t in _raw_imports(m, path)
           if t == "tests" or t.startswith("tests.")]
    assert bad == []


def test_every_benchmark_is_scanned():
    mods = _modules()
    assert {f"benchmarks.{p.stem}" for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__"} <= mods.keys()


def test_the_check_sees_a_cycle():
    """Power: a planted two-module cycle and a deferred import back into a package are found."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    mods = _modules()
    assert "rl_loop.pipelines.async_pipeline" in _imports("rl_loop.train", mods["rl_loop.train"], mods)  # a deferred import


@pytest.mark.parametrize("call", ['importlib.import_module("pkg.b")', 'importlib.import_module(".b", __package__)',
                                  'import_module("pkg.b")'])
def test_the_check_sees_a_cycle_through_importlib(tmp_path, call):
    """Power: a planted pair of modules whose cycle closes only through ``importlib.import_module`` of a
    literal name (absolute or relative), as the audit's target registry once did."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import importlib\nfrom importlib import import_module\n\n\n"
                              f"def build():\n    return {call}.target()\n")
    (pkg / "b.py").write_text("from .a import build\n")
    (pkg / "c.py").write_text("import importlib\n\n\ndef load(name):\n    return importlib.import_module(name)\n")
    graph = _graph(_modules(tmp_path, ("pkg",)))
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.c"] == set()
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]
