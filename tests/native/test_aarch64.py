"""The framework-free host kernels (csrc/include/specdec) on aarch64 and on every x86-64 instruction set.

The C++ checks of tests/cpp are cross-compiled with aarch64-linux-gnu-g++ and run under qemu-aarch64; there the
SIMD layer (simd.h) is its generic path, GCC vector extensions of 4 lanes that become NEON. The kernels promise
the same tokens on every instruction set (simd.h: each lane-wise function performs its scalar twin's operations
in its order), so the aarch64 builds must print what the x86-64 builds print, bit for bit. The aarch64 tests skip
only where the cross compiler or qemu-aarch64 is absent (Debian: g++-aarch64-linux-gnu qemu-user); the CMake
cross build of the whole extension is .ci/aarch64_check.sh.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import REPO, host_cxx
from tests.native.test_native import _ISA_FLAGS, _cpu_has

ROOT = str(REPO)
CROSS_CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"  # the cross toolchain's target libraries (libc, libstdc++, libgomp)
# As tests/native/test_native.py builds the C++ checks; verify_outputs.cpp also drives csrc/cpu/parallel.h (OpenMP).
CXX_FLAGS = ["-O2", "-std=c++17", "-ffp-contract=off", "-fno-math-errno", "-fopenmp",
             "-I", os.path.join(ROOT, "csrc", "include"), "-I", os.path.join(ROOT, "csrc", "cpu")]
# The split executor asks for two threads; a passive wait keeps the idle one off the CPU (qemu is slow enough).
RUN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))} | {
    "OMP_WAIT_POLICY": "passive", "OMP_DYNAMIC": "false"}

# Cross builds and qemu runs: minutes.
pytestmark = pytest.mark.slow


def _cross_tools_or_skip() -> None:
    missing = [tool for tool in (CROSS_CXX, QEMU) if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found (Debian: apt-get install g++-aarch64-linux-gnu qemu-user)")


@functools.cache
def _build_and_run(source: str, target: str, out_dir: str) -> str:
    """Builds tests/cpp/<source> for target (an x86-64 instruction set of tests/native/test_native.py, or aarch64),
    runs it (aarch64: under qemu) and returns its output; built once per session."""
    exe = os.path.join(out_dir, f"{os.path.splitext(source)[0]}-{target}")
    aarch64 = target == "aarch64"
    cxx = CROSS_CXX if aarch64 else host_cxx()
    build = subprocess.run([cxx, *CXX_FLAGS, *([] if aarch64 else _ISA_FLAGS[target]),
                            os.path.join(ROOT, "tests", "cpp", source), "-o", exe],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, (target, build.stderr[-3000:])
    # The guest's loader searches SYSROOT/lib first: with Debian's multiarch arm64 packages installed
    # (libpython3.X-dev:arm64 for .ci/aarch64_check.sh), ld.so.cache lists their libc, of another glibc build
    # than the cross toolchain's loader, and the mix hangs the OpenMP program.
    cmd = [QEMU, "-L", SYSROOT, "-E", f"LD_LIBRARY_PATH={SYSROOT}/lib", exe] if aarch64 else [exe]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=RUN_ENV)
    assert proc.returncode == 0, (target, proc.stderr[-2000:])
    return proc.stdout


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cpp_targets"))


def _outputs(source: str, targets: list[str], out_dir: str) -> dict[str, str]:
    """The outputs of source on each target, two builds at a time."""
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(targets, pool.map(lambda t: _build_and_run(source, t, out_dir), targets), strict=True))


@pytest.mark.parametrize("source", ["bracket_check.cpp", "log_mass_check.cpp", "part_maxima_check.cpp"])
def test_cpp_checks_report_on_aarch64_what_they_report_on_x86(source, out_dir):
    """The C++ checks of tests/native/test_native.py (lane-wise block log-masses, the normalizer bracket, part and unit
    maxima), built for aarch64 and run under qemu, print exactly what the generic x86-64 build prints, which
    tests/native/test_native.py holds to "different 0" / "outside 0" (both builds have 4 lanes)."""
    _cross_tools_or_skip()
    out = _outputs(source, ["generic", "aarch64"], out_dir)
    assert out["generic"].split() and out["aarch64"].split() == out["generic"].split(), out


def _lines(output: str, by_lanes: bool) -> list[str]:
    """verify_outputs' lines: those whose values every build shares, or the by_lanes ones (sums in an order
    that follows the SIMD width), without their "W=..." word."""
    lines = output.splitlines()
    if by_lanes:
        return [" ".join(w for w in line.split() if not w.startswith("W=")) for line in lines
                if line.startswith("by_lanes")]
    return [line for line in lines if not line.startswith("by_lanes")]


def _assert_same(outputs: dict[str, str], base: str) -> None:
    """Every build's shared lines equal base's, its by_lanes lines too where the SIMD width is the same."""
    ref = outputs[base]
    shared, lanes = _lines(ref, False), _lines(ref, True)
    # The program ran to its end and drove every kernel (chain, block, tree, traversal; both executors).
    kinds = {line.split()[0] for line in shared}
    assert {"chain", "chain_block", "tree", "traversal", "softmax_stats", "log_mass"} <= kinds, kinds
    assert sum(" split2 " in line for line in shared) >= 80 and len(lanes) == 16, (len(shared), len(lanes))
    width = {t: out.split("by_lanes W=", 1)[1].split()[0] for t, out in outputs.items()}
    for target, out in outputs.items():
        mine = _lines(out, False)
        assert len(mine) == len(shared), (target, base, len(mine), len(shared))
        diff = [(a, b) for a, b in zip(shared, mine, strict=True) if a != b]
        assert not diff, (target, base, len(diff), diff[:5])
        if width[target] == width[base]:
            assert _lines(out, True) == lanes, (target, base, width[target])


def test_every_x86_instruction_set_build_prints_the_same_tokens_and_sums(out_dir):
    """tests/cpp/verify_outputs.cpp (chain, block, tree and traversal verification of csrc/include/specdec on
    seeded fp32 / bf16 rows, V = 151936 and 4099, greedy and random, deterministic and stochastic drafts, with
    and without top-k / top-p, serial and split across two threads; softmax statistics, block log-masses, row
    sums and hashes of whole rows) prints the same lines, bit for bit, with AVX2 + FMA and AVX-512 as with the
    baseline x86-64 build; the double sums whose order follows the SIMD width only between builds of one
    width."""
    targets = ["generic"] + [isa for isa in ("avx2", "avx512") if _cpu_has(isa)]
    if len(targets) == 1:
        pytest.skip("this CPU has neither AVX2 nor AVX-512: one x86-64 build, nothing to compare")
    _assert_same(_outputs("verify_outputs.cpp", targets, out_dir), "generic")


def test_aarch64_build_prints_the_same_tokens_and_sums_as_x86(out_dir):
    """verify_outputs.cpp built for aarch64 and run under qemu prints exactly the baseline x86-64 build's lines
    (both 4 lanes, the by_lanes sums included) and the wider builds' shared lines. Shown able to fail: built
    with -ffp-contract=fast on aarch64 (multiply-adds fused), 13 of the 16 residual rows' hashes, 4 of the 16
    softmax_stats sums and 13 by_lanes sums differ (the tokens of these inputs do not)."""
    _cross_tools_or_skip()
    targets = ["aarch64", "generic"] + [isa for isa in ("avx2", "avx512") if _cpu_has(isa)]
    _assert_same(_outputs("verify_outputs.cpp", targets, out_dir), "aarch64")
