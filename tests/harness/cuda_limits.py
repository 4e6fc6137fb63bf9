"""Launch configurations of the CUDA kernels checked against the H200 and B200 limits.

Two sources: the launches themselves (grid, block, dynamic shared memory), planned by the CUDA host
emulation for shapes that reach every entry of the typed launch-config table (``cuda_emulation.plan_chain`` /
``plan_tree``, which also reject a grid or block outside the device limits), and the per-kernel
resources nvcc reports (``--resource-usage``: registers per thread, static shared memory, spills). A
kernel launched with T threads fits when T x registers (allocated per warp in units of 256) fits the
register file a block may use, registers <= 255, and static + dynamic shared memory <= 48 KiB.

    python -m tests.harness.cuda_limits --ptxas report_sm90a.txt --ptxas report_sm100a.txt

prints one line per (device, kernel, threads) and exits 1 on any violation (CI runs it on the reports of
its nvcc compile step).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

import torch

__all__ = [
    "DEVICES",
    "DeviceLimits",
    "KernelUsage",
    "check_resources",
    "kernel_base_name",
    "main",
    "parse_resource_usage",
    "planned_launches",
]


@dataclass(frozen=True)
class DeviceLimits:
    """Per-block limits of one device (CUDA programming guide, compute capabilities 9.0 and 10.0)."""

    name: str
    arch: int  # compute capability x 10: the launch-config table's key
    sm: str  # nvcc target whose resource report applies
    max_threads_per_block: int = 1024
    max_registers_per_thread: int = 255
    registers_per_block: int = 65536
    register_unit: int = 256  # registers are allocated per warp in units of 256
    static_smem_per_block: int = 48 * 1024


DEVICES = (DeviceLimits("H200", 90, "sm_90a"), DeviceLimits("B200", 100, "sm_100a"))


@dataclass(frozen=True)
class KernelUsage:
    """nvcc's resource report for one compiled kernel."""

    registers: int
    smem: int
    stack: int
    spill_stores: int
    spill_loads: int


_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_resource_usage(text: str) -> dict[tuple[str, str], KernelUsage]:
    """{(mangled kernel, sm): usage} from ptxas output (``nvcc --resource-usage`` / ``-Xptxas -v``)."""
    out: dict[tuple[str, str], KernelUsage] = {}
    current: tuple[str, str] | None = None
    stack = spill_stores = spill_loads = 0
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = (m.group(1), m.group(2))
            stack = spill_stores = spill_loads = 0
        elif (m := _PROPS.search(line)) and current is not None:
            stack, spill_stores, spill_loads = (int(g) for g in m.groups())
        elif (m := _USED.search(line)) and current is not None:
            out[current] = KernelUsage(int(m.group(1)), int(m.group(2) or 0), stack, spill_stores, spill_loads)
            current = None
    return out


def kernel_base_name(name: str) -> str:
    """``row_pass_kernel`` from a mangled name or from a launch's ``dev::row_pass_kernel<D>``."""
    if name.startswith("_Z"):
        m = re.search(r"3dev(\d+)", name)
        if m:
            start = m.end()
            return name[start:start + int(m.group(1))]
    return re.sub(r"<.*", "", name).rsplit("::", 1)[-1]


def planned_launches(device: DeviceLimits) -> list:
    """Every launch verify_chain / verify_tree (token level, block, traversal) makes on ``device`` for shapes
    that reach each entry of the launch-config table (each dtype, vocabularies at and around every threshold, up to 2^30 = the API's
    largest; batches past the grid's y limit), with and without stochastic drafts / truncation."""
    from specdec_kernels.exactness import cuda_emulation

    launches = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for vocab in (1, 8191, 8192, 65535, 65536, 151936, 262144, 1 << 30):
            for num_rows, num_reqs in ((1, 1), (200_000, 70_000)):
                for stochastic in (False, True):
                    launches += cuda_emulation.plan_chain(vocab, dtype, num_rows, num_reqs, stochastic=stochastic,
                                                     truncated=stochastic, arch=device.arch)
                launches += cuda_emulation.plan_chain(vocab, dtype, num_rows, num_reqs, stochastic=True, truncated=True,
                                                 arch=device.arch, method="block")
            for method in ("token", "traversal"):
                launches += cuda_emulation.plan_tree(vocab, dtype, 70_000, arch=device.arch, method=method)
    return launches


def check_resources(launches, usage: dict[tuple[str, str], KernelUsage], device: DeviceLimits) -> list[str]:
    """Violations of ``device``'s per-block limits by these launches given nvcc's report (empty: fits)."""
    by_name: dict[str, list[KernelUsage]] = {}
    for (mangled, sm), u in usage.items():
        if sm == device.sm:
            by_name.setdefault(kernel_base_name(mangled), []).append(u)
    problems = []
    for launch in {(kernel_base_name(x.kernel), x.threads, x.dynamic_smem) for x in launches}:
        name, threads, dyn = launch
        reports = by_name.get(name)
        if not reports:
            problems.append(f"{device.name}: no {device.sm} resource report for kernel {name}")
            continue
        for u in reports:
            per_warp = -(-u.registers * 32 // device.register_unit) * device.register_unit
            regs = per_warp * -(-threads // 32)
            if threads > device.max_threads_per_block:
                problems.append(f"{device.name}: {name} launched with {threads} threads")
            if u.registers > device.max_registers_per_thread or regs > device.registers_per_block:
                problems.append(f"{device.name}: {name} needs {u.registers} registers x {threads} threads "
                                f"({regs} > {device.registers_per_block} per block)")
            if u.smem + dyn > device.static_smem_per_block:
                problems.append(f"{device.name}: {name} uses {u.smem + dyn} bytes of shared memory "
                                f"(> {device.static_smem_per_block})")
    return list(dict.fromkeys(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ptxas", action="append", required=True,
                        help="nvcc --resource-usage output (repeat for several files / architectures)")
    args = parser.parse_args(argv)
    usage: dict[tuple[str, str], KernelUsage] = {}
    for path in args.ptxas:
        try:
            with open(path) as f:
                usage.update(parse_resource_usage(f.read()))
        except OSError as exc:
            print(f"error: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return 2
    problems = []
    for device in DEVICES:
        launches = planned_launches(device)
        shapes = sorted({(kernel_base_name(x.kernel), x.threads) for x in launches})
        for name, threads in shapes:
            regs = max((u.registers for (m, sm), u in usage.items()
                        if sm == device.sm and kernel_base_name(m) == name), default=-1)
            smem = max((u.smem for (m, sm), u in usage.items()
                        if sm == device.sm and kernel_base_name(m) == name), default=-1)
            print(f"{device.name} {name:24s} threads {threads:4d}  registers {regs:3d}  static smem {smem} B")
        problems += check_resources(launches, usage, device)
    for p in problems:
        print("error:", p, file=sys.stderr)
    print("launch configurations: ok" if not problems else f"launch configurations: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
