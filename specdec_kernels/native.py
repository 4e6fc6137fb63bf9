"""Loads the compiled extension ``specdec_kernels._C`` (native CPU / CUDA kernels) when it was built.

A missing extension is not an error at import time: ``available()`` is False, ``backend="auto"`` falls
back to the next backend, and asking for a native backend explicitly raises one clear message.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

_MISSING_MESSAGE = (
    "specdec_kernels was installed without its native extension (specdec_kernels._C): {reason}. "
    "Reinstall with a C++ compiler available (pip install -e . builds it; SPECDEC_SKIP_NATIVE=1 skips it), "
    "or use backend='triton' / 'reference'."
)

_module = None
_error: str | None = None


def _load():
    global _module, _error
    if _module is None and _error is None:
        try:
            _module = importlib.import_module("specdec_kernels._C")
        except ImportError as exc:  # not built, or built against another torch
            _error = str(exc)
    return _module


def available() -> bool:
    """True when the compiled extension imports."""
    return _load() is not None


def has_device(device_type: str) -> bool:
    """True when the extension has kernels for ``device_type`` ("cpu" or "cuda")."""
    module = _load()
    return module is not None and device_type in getattr(module, "DEVICES", ())


def op(name: str, device_type: str) -> Callable:
    """The native implementation of ``name`` for ``device_type``, or a clear RuntimeError."""
    module = _load()
    if module is None:
        raise RuntimeError(_MISSING_MESSAGE.format(reason=_error))
    if device_type not in getattr(module, "DEVICES", ()):
        raise RuntimeError(f"specdec_kernels._C was built without {device_type} kernels")
    return getattr(module, f"{name}_{device_type}")
