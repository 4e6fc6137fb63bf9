"""The extension's build against a toolchain that links libstdc++ statically (cmake/SharedLibstdcxx.cmake).

One H200 image shipped a relocated GCC (/opt/gcc/bin/g++: the system compiler run with ``-B`` its own lib
directory) whose libstdc++.so there is a dangling link, so every shared library it linked took libstdc++.a.
The extension built with it crashed on the first error message that formatted a number. The test recreates
that toolchain from the host's GCC and builds one small CMake project with it, with and without the module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, host_cxx
from tests.native.test_native import _own_libstdcxx_symbols

ROOT = REPO


def _static_toolchain(tmp: Path) -> Path:
    """A g++ wrapper like the image's: ``-B`` a directory whose libstdc++.so dangles beside libstdc++.a."""
    cxx = host_cxx()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    archive = subprocess.run([cxx, "-print-file-name=libstdc++.a"], capture_output=True, text=True).stdout.strip()
    if "Free Software Foundation" not in version or not os.path.isabs(archive):
        pytest.skip(f"{cxx} is not a GCC with libstdc++.a")
    lib = tmp / "toolchain" / "lib" / "gcc" / "x86_64-linux-gnu" / "13"
    lib.mkdir(parents=True)
    (lib / "libstdc++.so").symlink_to("../../../x86_64-linux-gnu/libstdc++.so.6")  # dangling, as on the image
    (lib / "libstdc++.a").symlink_to(archive)
    wrapper = tmp / "toolchain" / "bin" / "g++"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec "{cxx}" -B{lib}/ "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _build(tmp: Path, cxx: Path, use_module: bool) -> Path:
    project = tmp / f"project-{use_module}"
    project.mkdir()
    (project / "lib.cpp").write_text(
        "#include <cstring>\n#include <sstream>\n#include <string>\n"
        "extern \"C\" void describe(long x, char *out, int size) {\n"
        "  std::ostringstream o; o << \"got \" << x; std::strncpy(out, o.str().c_str(), size);\n}\n")
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(probe LANGUAGES CXX)\n"
        f'include("{ROOT / "cmake" / "SharedLibstdcxx.cmake"}")\n'
        "add_library(probe SHARED lib.cpp)\n"
        + ("specdec_use_shared_libstdcxx(probe)\n" if use_module else ""))
    env = {**os.environ, "CXX": str(cxx)}
    build = project / "build"
    for cmd in (["cmake", "-S", str(project), "-B", str(build)], ["cmake", "--build", str(build)]):
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return build / "libprobe.so"


def _describe(lib: Path) -> str:
    """What the library's ``describe(42)`` writes in a process that has loaded torch (and so libstdc++.so.6)."""
    code = ("import ctypes, torch\n"
            f"lib = ctypes.CDLL({str(lib)!r}); out = ctypes.create_string_buffer(64)\n"
            "lib.describe(42, out, 64); print(out.value.decode())\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return run.stdout.strip() if run.returncode == 0 else f"exit code {run.returncode}"


@pytest.mark.slow
def test_shared_libstdcxx_module_mends_a_static_toolchain(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("no cmake")
    cxx = _static_toolchain(tmp_path)
    plain = _build(tmp_path, cxx, use_module=False)
    mended = _build(tmp_path, cxx, use_module=True)
    # Without the module the toolchain reproduces the fault: a second copy of the streams, which loses the
    # number here (the image's process crashed instead).
    assert _own_libstdcxx_symbols(str(plain)), "the recreated toolchain should link libstdc++ statically"
    assert _describe(plain) != "got 42"
    assert _own_libstdcxx_symbols(str(mended)) == []
    assert _describe(mended) == "got 42"
