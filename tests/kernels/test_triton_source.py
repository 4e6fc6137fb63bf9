"""Rules of compiled Triton that the CPU interpreter (TRITON_INTERPRET=1, where CI runs the kernels) does not
enforce, checked on the kernels' source. Each rule broke a kernel on an H200 while every interpreted test passed:

- a kernel may read a module global only when it is a ``tl.constexpr`` (the compiler refuses a plain int:
  the drafter head's ``STREAM_DRAFT``);
- a name that starts a loop as an alias of another name (``w_tau = w``) and is assigned that same name
  inside the loop is not carried out of the loop: the compiler finds loop-carried names by comparing each
  name's value before and after one pass over the body, and the alias leaves the value unchanged (block
  verification emitted from w = 1 instead of w_tau in 117 of 65476 requests).
- a float32 division of a verification kernel (not the drafter head's, judged by a tolerance) is
  ``tl.math.div_rn``, never ``/``: on NVIDIA GPUs Triton lowers a float32 ``/`` to
  ``div.full.f32``, up to 2 ulp off the correctly rounded quotient the reference (torch) and the interpreter
  compute (triton-lang/triton#10661), so a kernel's tokens would match the reference's on the CPU alone
  (``triton/tree.py`` scaled its logits with ``/``). ``/`` stays only where both operands are float64
  (``FLOAT64_DIVISIONS``), which is correctly rounded.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import specdec_kernels.triton as kernels_pkg  # noqa: E402

pytestmark = pytest.mark.triton


def _jit_functions() -> list[tuple[str, object]]:
    """Every @triton.jit function of the kernel modules: JITFunction, or InterpretedFunction when the modules
    were imported under TRITON_INTERPRET=1 (as CI runs them)."""
    from triton.runtime.interpreter import InterpretedFunction

    out = []
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        module = importlib.import_module(f"{kernels_pkg.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if (isinstance(obj, (triton.runtime.JITFunction, InterpretedFunction))
                    and obj.fn.__module__ == module.__name__):
                out.append((f"{info.name}.{name}", obj))
    return out


JIT_FUNCTIONS = _jit_functions()


def test_the_kernels_are_found():
    names = {name for name, _ in JIT_FUNCTIONS}
    assert {"block._verify_chain_block_kernel", "chain._verify_chain_kernel", "traversal._traversal_kernel",
            "tree._tree_kernel", "drafter._head_tile_kernel"} <= names


# The jit functions whose ``/`` divide float64 values (the stop probability Z / (Z + 1 - w) of block and
# traversal verification), each with its number of them.
FLOAT64_DIVISIONS = {"block._stop_probability": 1, "traversal._traversal_kernel": 1}


def true_divisions(src: str) -> int:
    """The number of ``/`` (not ``//``) in a jit function's source."""
    return sum(isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, ast.Div)
               for n in ast.walk(ast.parse(textwrap.dedent(src))))


def non_constexpr_globals(src: str, namespace: dict) -> list[str]:
    """Names a jit function's source reads from ``namespace`` that hold a plain number or bool."""
    tree = ast.parse(textwrap.dedent(src))
    local = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    local |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
            value = namespace.get(n.id)
            if isinstance(value, (bool, int, float)) and not isinstance(value, tl.constexpr):
                found.append(n.id)
    return sorted(set(found))


def aliased_loop_assignments(src: str) -> list[str]:
    """``X = Y`` inside a loop where X and Y hold the same value on entry (the last assignment of X before the
    loop, in the same or an enclosing block, is ``X = Y`` and Y is not reassigned after it)."""
    tree = ast.parse(textwrap.dedent(src))
    found = []

    def assigned_names(stmt: ast.stmt) -> set[str]:
        return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    def walk(body: list[ast.stmt], aliases: dict[str, str]) -> None:
        aliases = dict(aliases)
        for stmt in body:
            if isinstance(stmt, (ast.For, ast.While)):
                pairs = {frozenset((x, y)) for x, y in aliases.items()}
                for inner in ast.walk(stmt):
                    if (isinstance(inner, ast.Assign) and len(inner.targets) == 1
                            and isinstance(inner.targets[0], ast.Name) and isinstance(inner.value, ast.Name)
                            and frozenset((inner.targets[0].id, inner.value.id)) in pairs):
                        found.append(f"line {inner.lineno}: {inner.targets[0].id} = {inner.value.id}")
            for name in assigned_names(stmt):  # a reassignment ends every alias of the name
                aliases = {x: y for x, y in aliases.items() if name not in (x, y)}
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Name)):
                aliases[stmt.targets[0].id] = stmt.value.id
            for field in ("body", "orelse"):
                inner_body = getattr(stmt, field, None)
                if isinstance(inner_body, list) and not isinstance(stmt, (ast.For, ast.While)):
                    walk(inner_body, aliases)
                elif isinstance(inner_body, list):
                    walk(inner_body, {})

    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            walk(fn.body, {})
    return found


@pytest.mark.parametrize("name,fn", JIT_FUNCTIONS, ids=[n for n, _ in JIT_FUNCTIONS])
def test_kernels_read_only_constexpr_globals(name, fn):
    assert non_constexpr_globals(inspect.getsource(fn.fn), fn.fn.__globals__) == [], name


@pytest.mark.parametrize("name,fn", JIT_FUNCTIONS, ids=[n for n, _ in JIT_FUNCTIONS])
def test_no_loop_carried_name_starts_as_an_alias(name, fn):
    assert aliased_loop_assignments(inspect.getsource(fn.fn)) == [], name


VERIFICATION_FUNCTIONS = [(n, f) for n, f in JIT_FUNCTIONS if not n.startswith("drafter.")]


@pytest.mark.parametrize("name,fn", VERIFICATION_FUNCTIONS, ids=[n for n, _ in VERIFICATION_FUNCTIONS])
def test_float32_divisions_are_correctly_rounded(name, fn):
    assert true_divisions(inspect.getsource(fn.fn)) == FLOAT64_DIVISIONS.get(name, 0), name


def test_the_checks_find_the_patterns_that_broke_kernels():
    """The two kernels as they were (abridged), and their fixes."""
    plain, wrapped = 3, tl.constexpr(3)
    reads_plain = "def k(p):\n    x = p << STREAM\n"
    assert non_constexpr_globals(reads_plain, {"STREAM": plain}) == ["STREAM"]
    assert non_constexpr_globals(reads_plain, {"STREAM": wrapped}) == []
    broken = """
    def k(n):
        w = tl.full((), 1.0, tl.float32)
        w_tau = w
        for j in range(0, n):
            if j > 0:
                if coin(j) < w:
                    w_tau = w
            w = ratio(w)
        return w_tau
    """
    assert aliased_loop_assignments(broken) == ["line 8: w_tau = w"]
    fixed = broken.replace("w_tau = w\n        for", "w_tau = tl.full((), 1.0, tl.float32)\n        for")
    assert aliased_loop_assignments(fixed) == []
    reassigned = broken.replace("w_tau = w\n        for", "w_tau = w\n        w = w * 0.5\n        for")
    assert aliased_loop_assignments(reassigned) == []
    assert true_divisions("def f(x, t):\n    return x / t\n") == 1  # triton/tree.py's _scaled as it was
    assert true_divisions("def f(x, t, n):\n    x /= t\n    return tl.math.div_rn(x, t) + n // 2\n") == 1
