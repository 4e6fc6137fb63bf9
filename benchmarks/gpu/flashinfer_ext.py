"""Build and load our FlashInfer benchmark extension (``flashinfer_chain.cu`` + ``flashinfer_chain.cpp``).

``torch.utils.cpp_extension.load`` compiles the two sources in parallel (ninja) against FlashInfer's headers
in ``.cache/peers/flashinfer/include`` (``python -m benchmarks.gpu.prepare``), for the GPU in use only
(``sm_90a`` on an H100 / H200), through ``ccache`` when the machine has it. About 25 s of compiler time
for the kernels (nvcc 13, one core), the binding in parallel.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch

from .prepare import PEERS

HERE = Path(__file__).resolve().parent
INCLUDE = PEERS / "flashinfer" / "include"
SOURCES = (HERE / "flashinfer_chain.cu", HERE / "flashinfer_chain.cpp")


class ExtensionUnavailable(RuntimeError):
    """The extension cannot be built or loaded here (the reason in the message)."""


def arch_list(capability: tuple[int, int]) -> str:
    """``TORCH_CUDA_ARCH_LIST`` for one GPU: the ``a`` variant from Hopper on (``9.0a``: torch then passes
    ``-gencode=arch=compute_90a,code=sm_90a`` alone), plain below."""
    major, minor = capability
    return f"{major}.{minor}{'a' if major >= 9 else ''}"


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
    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr"]
    t0 = time.perf_counter()
    try:
        module = cpp_extension.load(
            name="specdec_flashinfer_chain", sources=[str(s) for s in SOURCES], build_directory=str(build_dir),
            extra_include_paths=[str(INCLUDE), str(HERE)], extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=flags, verbose=verbose)
    except Exception as exc:  # a compiler error: the provider is recorded as unavailable, with the reason
        raise ExtensionUnavailable(f"build failed: {type(exc).__name__}: {str(exc)[-400:]}") from None
    module.build_seconds = time.perf_counter() - t0
    return module
