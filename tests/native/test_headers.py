"""The framework-free headers (csrc/include/specdec, one folder per concern: core, host, cpu, cuda) each
compile on their own: a header that leans on what another file included before it breaks the first user
who includes it alone. Every ``.h`` by the host compiler for the baseline x86-64 build and the AVX2 one;
every ``.cuh`` by nvcc where it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, host_cxx

ROOT = REPO
INCLUDE = ROOT / "csrc" / "include"
HEADERS = sorted(p.relative_to(INCLUDE).as_posix() for p in (INCLUDE / "specdec").rglob("*.h"))
CUDA_HEADERS = sorted(p.relative_to(INCLUDE).as_posix() for p in (INCLUDE / "specdec").rglob("*.cuh"))


def test_headers_are_split_by_concern():
    """Every header lies in one of the four folders, none at the top of specdec/."""
    top = [p.name for p in (INCLUDE / "specdec").iterdir() if p.is_file()]
    assert top == [], top
    assert {Path(h).parts[1] for h in HEADERS + CUDA_HEADERS} == {"core", "host", "cpu", "cuda"}


def _compile_alone(compiler: list[str], header: str, suffix: str, tmp_path: Path) -> subprocess.CompletedProcess:
    src = tmp_path / f"one{suffix}"
    src.write_text(f'#include "{header}"\n')
    return subprocess.run([*compiler, "-I", str(INCLUDE), "-c", str(src), "-o", str(tmp_path / "one.o")],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags", [[], ["-mavx2", "-mfma"]], ids=["baseline", "avx2"])
def test_each_host_header_compiles_alone(flags, tmp_path):
    cxx = host_cxx()
    failed = {}
    for header in HEADERS:
        out = _compile_alone([cxx, "-std=c++17", "-fsyntax-only", *flags], header, ".cpp", tmp_path)
        if out.returncode != 0:
            failed[header] = out.stderr.strip().splitlines()[:3]
    assert not failed, failed


def test_each_cuda_header_compiles_alone(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    failed = {}
    for header in CUDA_HEADERS:
        out = _compile_alone([nvcc, "-std=c++17", "-arch=sm_90a"], header, ".cu", tmp_path)
        if out.returncode != 0:
            failed[header] = out.stderr.strip().splitlines()[:3]
    assert not failed, failed
