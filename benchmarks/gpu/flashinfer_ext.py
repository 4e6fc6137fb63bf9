"""Build and load our FlashInfer benchmark extension (``flashinfer_chain.cu`` + ``flashinfer_chain.cpp``).

    python -m benchmarks.gpu.flashinfer_ext --compile-only     # here, without a GPU: nvcc -c the .cu for sm_90a

``torch.utils.cpp_extension.load`` compiles the two sources in parallel (ninja) against FlashInfer's headers
in ``.cache/peers/flashinfer/include`` (``python -m benchmarks.gpu.prepare``), for the GPU in use only
(``sm_90a`` on an H100 / H200), through ``ccache`` when the machine has it. About 25 s of compiler time
for the kernels (nvcc 13, one core), the binding in parallel.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import OneLineParser

from .prepare import PEERS

HERE = Path(__file__).resolve().parent
INCLUDE = PEERS / "flashinfer" / "include"
SOURCES = (HERE / "flashinfer_chain.cu", HERE / "flashinfer_chain.cpp")


# torch's extension builds define these (COMMON_NVCC_FLAGS); FlashInfer's headers use the half / bfloat16
# operators and conversions they hide, so they are undefined again (as FlashInfer's and SGLang's builds do).
# compile_only() compiles without them, as nvcc does by default.
NVCC_UNDEFINES = ("-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                  "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__")


class ExtensionUnavailable(RuntimeError):
    """The extension cannot be built or loaded here (the reason in the message)."""


def arch_list(capability: tuple[int, int]) -> str:
    """``TORCH_CUDA_ARCH_LIST`` for one GPU: the ``a`` variant from Hopper on (``9.0a``: torch then passes
    ``-gencode=arch=compute_90a,code=sm_90a`` alone), plain below."""
    major, minor = capability
    return f"{major}.{minor}{'a' if major >= 9 else ''}"


def curand_include(cuda_home: str | None = None) -> list[str]:
    """The carried cuRAND headers when the CUDA toolkit has none (``sampling.cuh`` includes them), else []."""
    if cuda_home is None:
        from torch.utils.cpp_extension import CUDA_HOME as cuda_home
    home = Path(cuda_home or "/usr/local/cuda")
    if any((d / "curand_kernel.h").exists() for d in (home / "include", home / "targets" / "x86_64-linux" / "include")):
        return []
    carried = PEERS / "curand" / "include"
    return [str(carried)] if (carried / "curand_kernel.h").exists() else []


def load(build_dir: Path | None = None, verbose: bool = False):
    """The built module (``softmax``, ``chain_speculative_sampling``); ExtensionUnavailable with the reason."""
    if not torch.cuda.is_available():
        raise ExtensionUnavailable("FlashInfer's kernels need a CUDA GPU")
    if not (INCLUDE / "flashinfer" / "sampling.cuh").exists():
        raise ExtensionUnavailable(f"FlashInfer headers not carried ({INCLUDE} missing): run "
                                   "`python -m benchmarks.gpu.prepare` and carry .cache/peers")
    from torch.utils import cpp_extension

    if shutil.which("ccache"):
        os.environ.setdefault("PYTORCH_NVCC", "ccache nvcc")
        os.environ.setdefault("CXX", "ccache c++")
    build_dir = Path(build_dir or os.environ.get("SPECDEC_FLASHINFER_BUILD", "/tmp/specdec_flashinfer_build"))
    build_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", "4")
    # Without it torch adds its own targets for this GPU (sm_90 beside our sm_90a: twice the nvcc time).
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch_list(torch.cuda.get_device_capability()))
    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", *NVCC_UNDEFINES]
    t0 = time.perf_counter()
    try:
        module = cpp_extension.load(
            name="specdec_flashinfer_chain", sources=[str(s) for s in SOURCES], build_directory=str(build_dir),
            extra_include_paths=[str(INCLUDE), str(HERE), *curand_include()], extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=flags, verbose=verbose)
    except Exception as exc:  # a compiler error: the provider is recorded as unavailable, with the reason
        raise ExtensionUnavailable(f"build failed: {type(exc).__name__}: {str(exc)[-400:]}") from None
    module.build_seconds = time.perf_counter() - t0
    return module


def compile_only(out: Path, arch: str = "90a", nvcc: str = "nvcc") -> Path:
    """``nvcc -c`` the kernel-calling half (``flashinfer_chain.cu``: FlashInfer's headers, no torch) for
    ``sm_<arch>`` into ``out``: the check that runs without a GPU or a CUDA build of torch. Raises
    ExtensionUnavailable (with the compiler's tail) when it does not compile."""
    if not (INCLUDE / "flashinfer" / "sampling.cuh").exists():
        raise ExtensionUnavailable(f"FlashInfer headers not carried ({INCLUDE} missing): run "
                                   "`python -m benchmarks.gpu.prepare`")
    home = Path(shutil.which(nvcc) or "/usr/local/cuda/bin/nvcc").resolve().parent.parent
    includes = [f"-I{p}" for p in (INCLUDE, HERE, *curand_include(str(home)))]
    cmd = [nvcc, "-c", str(SOURCES[0]), "-o", str(out), "-std=c++17", "-O3", "--expt-relaxed-constexpr",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xcompiler", "-fPIC", *includes]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExtensionUnavailable(f"nvcc failed: {(proc.stdout + proc.stderr)[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m benchmarks.gpu.flashinfer_ext", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true", help="nvcc -c the .cu here (no GPU needed)")
    ap.add_argument("--arch", default="90a", help="with --compile-only: the sm_ target (default 90a)")
    args = ap.parse_args(argv)
    try:
        if args.compile_only:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                obj = compile_only(Path(tmp) / "flashinfer_chain.o", args.arch)
                print(f"flashinfer_chain.cu compiles for sm_{args.arch}: {obj.stat().st_size} bytes of object "
                      f"in {time.perf_counter() - t0:.0f} s")
        else:
            module = load(verbose=True)
            print(f"built and loaded {module.__name__} in {module.build_seconds:.1f} s")
    except ExtensionUnavailable as exc:
        print(f"flashinfer_ext: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
