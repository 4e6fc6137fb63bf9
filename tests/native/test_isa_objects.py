"""No per-instruction-set object runs code at load time (cmake/CheckIsaObjects.cmake).

The loader runs every object's initialisers when the extension is loaded, on any CPU, before the dispatcher
(csrc/cpu/dispatch.cpp) has looked at the CPU: a load-time constructor in the AVX-512 build of the row ops
faulted on every x86-64 CPU without AVX-512. The check runs before _C links (CMakeLists.txt); here it is run
on the objects of this checkout's build, and on small objects with and without a planted initialiser.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, host_cxx

ROOT = REPO
SCRIPT = ROOT / "cmake" / "CheckIsaObjects.cmake"
READELF = shutil.which("readelf")
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(READELF is None or CMAKE is None, reason="readelf or cmake is not installed")

# One table each way: what gumbel_search.h does now, and what it did before (a constructor at load time).
PLANTED = {
    "constexpr table": ("constexpr int f(int k) { return k * k; }\n"
                        "struct T { int at[64]; };\n"
                        "constexpr T make() { T t{}; for (int k = 0; k < 64; ++k) t.at[k] = f(k); return t; }\n"
                        "inline constexpr T kTable = make();\n"
                        "int get(int k) { return kTable.at[k]; }\n", []),
    "inline variable with a constructor": ("#include <cmath>\n"
                                           "struct T { unsigned at[64]; T() { for (int k = 0; k < 64; ++k)\n"
                                           "  at[k] = static_cast<unsigned>(std::exp(k * 0.1)); } };\n"
                                           "inline const T kTable;\n"
                                           "unsigned get(int k) { return kTable.at[k]; }\n",
                                           [".init_array", "_ZGV", "_GLOBAL__sub_I_"]),
    "function-local static": ("#include <cmath>\n"
                              "double get(double x) { static const double c = std::exp(x); return c; }\n",
                              ["_ZGV"]),
}


def _check(objects: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run([CMAKE, f"-DREADELF={READELF}", f"-DOBJECTS={';'.join(map(str, objects))}", "-P",
                           str(SCRIPT)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", list(PLANTED))
def test_check_names_each_planted_initialiser(case, tmp_path):
    """A clean object passes; one with a load-time constructor or a guarded static fails, naming the object
    and what it found."""
    source, expected = PLANTED[case]
    (tmp_path / "t.cpp").write_text(source)
    obj = tmp_path / "t.o"
    build = subprocess.run([host_cxx(), "-std=c++17", "-O2", "-fPIC", "-c", str(tmp_path / "t.cpp"), "-o", str(obj)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    proc = _check([obj])
    if not expected:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode != 0
    assert "dynamic initialisation in a per-instruction-set object" in proc.stderr and str(obj) in proc.stderr
    for name in expected:
        assert name in proc.stderr, (name, proc.stderr)


def test_built_per_isa_objects_have_no_initialisers():
    """The row-ops objects of this checkout's CMake build (generic, avx2, avx512 on x86-64) pass the check."""
    objects = sorted(ROOT.glob("build/cmake-*/CMakeFiles/specdec_row_ops_*.dir/**/row_ops.cpp.o"))
    if not objects:
        pytest.skip("no CMake build of the extension in this checkout (installed from a wheel)")
    proc = _check(objects)
    assert proc.returncode == 0, proc.stderr
