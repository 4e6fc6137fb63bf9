"""Shared test configuration: Triton tests need the interpreter on CPU-only machines."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from specdec_kernels import available_backends

REPO = Path(__file__).resolve().parents[1]  # the repository root, above tests/
HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON_RUNNABLE = HAS_TRITON and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

def host_cxx() -> str:
    """The host C++ compiler the C++ checks build with ($CXX, else g++, else c++); skips the test without one."""
    import shutil

    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    return cxx


requires_triton = pytest.mark.skipif(
    not TRITON_RUNNABLE, reason="needs triton and a GPU, or TRITON_INTERPRET=1 on CPU"
)

# ----------------------------------------------------------------------------------------------------
# Statistical exactness suite (tests/exactness/test_chain_law.py, test_chain_mutants.py, test_chain_properties.py).
# A backend joins the suite by adding its name to STAT_READY_BACKENDS (one-line change); it then runs
# wherever available_backends(DEVICE) offers it (inputs move to DEVICE). Under the Triton interpreter
# only the cases marked cheap run.
# ----------------------------------------------------------------------------------------------------
# On a CUDA machine the CUDA kernels and Triton join: available_backends("cuda") = triton, cuda, reference.
STAT_READY_BACKENDS = ("reference", "cpu") + (("cuda", "triton") if torch.cuda.is_available() else ())
STAT_BACKENDS = [b for b in available_backends(DEVICE) if b in STAT_READY_BACKENDS]
INTERPRETED_TRITON = HAS_TRITON and not torch.cuda.is_available()


def slow_when_interpreted(cases: list) -> list:
    """The ``cases`` of a parametrization whose first value is the backend, the Triton backend's marked slow
    when Triton is interpreted (seconds per kernel call on a CPU): the fast tier, -m "not slow", runs the rest."""
    def mark(case):
        values = case if isinstance(case, tuple) else (case,)
        return pytest.param(*values, marks=pytest.mark.slow) if values[0] == "triton" and INTERPRETED_TRITON else case

    return [mark(c) for c in cases]


@pytest.fixture
def one_thread():
    """One torch thread for the test (tiny shapes: more threads only add synchronisation), then restore."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="session", params=STAT_BACKENDS)
def backend(request) -> str:
    """Backend under test in the statistical exactness suite."""
    return request.param


def skip_if_interpreter_expensive(backend: str, cheap: bool) -> None:
    """Skip a case too slow for the Triton interpreter (it runs on GPU machines)."""
    if backend == "triton" and INTERPRETED_TRITON and not cheap:
        pytest.skip("too slow under TRITON_INTERPRET=1; runs where CUDA is available")
