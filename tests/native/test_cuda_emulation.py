"""The CUDA host emulation itself (csrc/cuda_emulation): each primitive against CUDA's documented semantics, the
errors a GPU would hide or hang on, schedules that expose a race, and the launch configurations of the
typed table against the H200 / B200 limits (grid and block from dry runs, registers and shared memory
from nvcc's resource report)."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.exactness import cuda_emulation
from tests.conftest import REPO, host_cxx
from tests.harness import cuda_limits

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not cuda_emulation.available(), reason="CUDA host emulation not built (setup.py build_ext)"),
]


def _run(kernel: str, n: int, **kw) -> list[int]:
    return cuda_emulation.run_selftest(kernel, torch.zeros(n, dtype=torch.int32), **kw).tolist()


# ------------------------------------------------------------------------------------------------------
# Primitives
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [32, 8, 1])
@pytest.mark.parametrize("schedule", cuda_emulation.SCHEDULES)
def test_shuffles_follow_cuda_semantics(width, schedule):
    threads = 64
    out = _run("shuffles", 4 * threads, block=threads, arg=width, schedule=schedule)
    for t in range(threads):
        lane, warp0 = t % 32, t - t % 32
        base = lane - lane % width
        idx = base + (lane + 3) % width
        xor = lane ^ 5
        xor = xor if xor < base + width else lane
        up = lane - 2 if lane - 2 >= base else lane
        down = lane + 2 if lane + 2 < base + width else lane
        expected = [10 * (warp0 + s) for s in (idx, xor, up, down)]
        assert out[4 * t:4 * t + 4] == expected, (t, width)


def test_votes_reductions_and_barrier_reductions():
    threads = 64
    out = _run("votes", 8 * threads, block=threads, schedule="random")
    for t in range(threads):
        lane = t % 32
        match = sum(1 << m for m in range(32) if m % 4 == lane % 4)
        ballot = sum(1 << m for m in range(32) if m % 3 == 0)
        expected = [ballot, 1, 1, match, sum(range(32)), 15, len(range(0, threads, 5)), 1]
        assert [x & 0xFFFFFFFF for x in out[8 * t:8 * t + 8]] == [x & 0xFFFFFFFF for x in expected], t


def test_concurrent_half_warp_groups():
    out = _run("half_warps", 64, block=64, schedule="reverse")
    assert out == [t ^ 1 for t in range(64)]


def test_atomics_are_atomic_across_blocks_and_schedules():
    blocks, threads = 4, 64
    n = blocks * threads
    for schedule in cuda_emulation.SCHEDULES:
        out = _run("atomics", 3 + n + 1, grid=(blocks, 1), block=threads, schedule=schedule, schedule_seed=9)
        assert out[:3] == [n, n - 1, 1]
        assert sorted(out[3:3 + n]) == list(range(n))  # every ticket handed out once


def test_dynamic_shared_memory():
    out = _run("dynamic_smem", 96, block=96, dynamic_smem=96 * 4, schedule="random")
    assert out == [100 + (t + 1) % 96 for t in range(96)]


def test_shared_memory_is_poisoned_per_block():
    """Reads before writes see the schedule's poison, not zeros or a previous block's data."""
    assert set(_run("uninitialised_shared", 32, block=32)) == {-1}  # 0xff bytes
    assert set(_run("uninitialised_shared", 32, block=32, schedule="reverse")) == {0x7F7F7F7F}


def test_a_missing_barrier_is_a_race_the_schedules_expose():
    with_barrier = {s: set(_run("publish", 64, block=64, arg=1, schedule=s)) for s in cuda_emulation.SCHEDULES}
    assert all(v == {42} for v in with_barrier.values())
    without = {s: set(_run("publish", 64, block=64, arg=0, schedule=s)) for s in cuda_emulation.SCHEDULES}
    assert without["forward"] == without["eager"] == {42}  # thread 0 runs first: the race is hidden...
    assert without["reverse"] != {42} and without["random"] != {42}  # ...and shows in the others


# ------------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kernel", "block", "message"), [
    ("divergent_barrier", 32, "divergent barrier"),
    ("exit_before_barrier", 32, "every thread of a block must reach each barrier"),
    ("shuffle_with_exited_lane", 32, "have exited"),
    ("full_mask_in_partial_warp", 48, "do not exist in a block of 48 threads"),
    ("endless_barriers", 32, "rounds of synchronisation"),
])
def test_synchronisation_errors_are_reported(kernel, block, message):
    with pytest.raises(cuda_emulation.EmulationError, match=message):
        _run(kernel, 64, block=block, max_rounds=2000)


@pytest.mark.parametrize(("grid", "block", "message"), [
    ((1, 70000), 32, r"grid \(1, 70000, 1\) exceeds"),
    ((1, 1), 2048, r"block \(2048, 1, 1\) exceeds"),
])
def test_launches_outside_the_device_limits_fail(grid, block, message):
    with pytest.raises(cuda_emulation.EmulationError, match=message):
        _run("shuffles", 4 * 2048, grid=grid, block=block)
    with pytest.raises(cuda_emulation.EmulationError, match="dynamic shared memory"):
        _run("dynamic_smem", 64, block=64, dynamic_smem=64 * 1024)


def test_unknown_selftest_and_bad_options():
    with pytest.raises(ValueError, match="unknown self-test"):
        _run("no_such_kernel", 1)
    with pytest.raises(ValueError, match="arch"):
        cuda_emulation.plan_tree(10, torch.float32, 1, arch=75)
    with pytest.raises(ValueError, match="drop_barrier"):
        cuda_emulation.verify_tree(torch.zeros(1, 4), torch.zeros(1, dtype=torch.int64), torch.tensor([-1]),
                              torch.tensor([0, 1]), drop_barrier="tree.cuh")


# ------------------------------------------------------------------------------------------------------
# Launch configurations against the H200 and B200 limits
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", cuda_limits.DEVICES, ids=lambda d: d.name)
def test_every_table_entry_launches_within_the_device_limits(device):
    """Dry runs for every dtype and vocabulary threshold (up to 2^30) and batches past the grid's y limit:
    the emulation rejects any grid or block beyond the device's limits, so planning them all is the check;
    and every entry of the table for this device is reached."""
    launches = cuda_limits.planned_launches(device)
    assert all(x.threads <= device.max_threads_per_block and x.threads % 32 == 0 for x in launches)
    assert max(x.grid[1] for x in launches) == 65535
    used = {(x.threads, x.kernel) for x in launches if "row_pass" in x.kernel}
    reachable = [e for e in cuda_emulation.config_table() if e.min_arch <= device.arch]
    threads = {t for t, _ in used}
    assert {e.threads for e in reachable} <= threads
    for e in cuda_emulation.config_table():
        assert e.slice % 8 == 0 and e.threads % 32 == 0 and e.threads <= device.max_threads_per_block


def test_launch_table_entries_are_the_ones_chosen():
    """Each entry of the table is the one a launch of its (arch, vocabulary, element size) picks."""
    for entry in cuda_emulation.config_table():
        arch = max(entry.min_arch, 90)
        dtype = torch.float32 if entry.elem_bytes == 4 else torch.bfloat16
        rows = cuda_emulation.plan_chain(max(entry.min_vocab, 1), dtype, 1, 1, stochastic=False, truncated=False, arch=arch)
        row_pass = next(x for x in rows if "row_pass" in x.kernel)
        assert row_pass.threads == entry.threads
        assert row_pass.grid[0] == -(-max(entry.min_vocab, 1) // entry.slice)


_REPORT = """
ptxas info    : Compiling entry function '_ZN7specdec7generic3dev15row_pass_kernelILNS_5DTypeE0EEEvNS_13CudaChainArgsElPKNS_13ChainRowStateEPNS_15ChainRowPartialE' for 'sm_90a'
ptxas info    : Function properties for _ZN7specdec7generic3dev15row_pass_kernelILNS_5DTypeE0EEEvNS_13CudaChainArgsElPKNS_13ChainRowStateEPNS_15ChainRowPartialE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used {regs} registers, used 1 barriers, 512 bytes smem
ptxas info    : Compiling entry function '_ZN7specdec7generic3dev15assemble_kernelENS_13CudaChainArgsEPKNS_13ChainRowStateE' for 'sm_90a'
ptxas info    : Function properties for _ZN7specdec7generic3dev15assemble_kernelENS_13CudaChainArgsEPKNS_13ChainRowStateE
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers
"""


def test_resource_report_parsing_and_register_limits():
    usage = cuda_limits.parse_resource_usage(_REPORT.format(regs=32))
    assert sorted(cuda_limits.kernel_base_name(m) for m, _ in usage) == ["assemble_kernel", "row_pass_kernel"]
    assert {u.registers for u in usage.values()} == {30, 32}
    h200 = cuda_limits.DEVICES[0]
    launches = [cuda_emulation.Launch("dev::row_pass_kernel<D>", (1, 1, 1), (512, 1, 1), 0),
                cuda_emulation.Launch("dev::assemble_kernel", (1, 1, 1), (128, 1, 1), 0)]
    assert cuda_limits.check_resources(launches, usage, h200) == []
    heavy = cuda_limits.parse_resource_usage(_REPORT.format(regs=168))  # 168 x 512 > 65536
    assert any("registers" in p for p in cuda_limits.check_resources(launches, heavy, h200))
    missing = cuda_limits.check_resources(launches[:1], {}, h200)
    assert missing and "no sm_90a resource report" in missing[0]


@pytest.mark.slow
def test_the_emulated_cuda_runtime_header_coexists_with_the_standard_library(tmp_path):
    """csrc/cuda_emulation/cuda_runtime.h defines CUDA's keywords as macros; none may be a name the standard library
    spells in its own attributes (a `__noinline__` macro broke <string> under GCC 13, and <memory> under 12)."""
    import os
    import subprocess

    cxx = host_cxx()
    root = str(REPO)
    headers = ["memory", "string", "vector", "functional", "thread", "mutex", "sstream", "algorithm", "atomic",
               "optional", "variant", "unordered_map", "map", "iostream", "random", "numeric", "cmath"]
    src = tmp_path / "tu.cpp"
    src.write_text("#include <cuda_runtime.h>\n" + "".join(f"#include <{h}>\n" for h in headers)
                   + "int main() { return *std::make_shared<int>(0); }\n")
    build = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-DSPECDEC_CUDA_EMULATION", "-D__CUDA_ARCH__=900",
                            "-I", os.path.join(root, "csrc", "cuda_emulation"), "-I", os.path.join(root, "csrc", "include"),
                            str(src)], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-2000:]
