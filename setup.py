"""Build script: the Python package plus the native extension ``specdec_kernels._C`` built by CMake.

- The native kernels need torch, pybind11, CMake and a C++17 compiler in the build environment. pip's
  default build isolation hides the installed torch, so ``pip install -e .`` and ``pip install .`` install
  the pure-Python package (build log: one message saying how to get the kernels); install torch first and
  use ``pip install --no-build-isolation -e .`` to build them.
- CUDA kernels (sm_90a, sm_100a) are added when torch is a CUDA build and ``nvcc`` is found.
- ``SPECDEC_SKIP_NATIVE=1`` installs the pure-Python package on purpose. Without the extension
  ``backend="auto"`` falls back and ``backend="cpu"`` raises one clear message (specdec_kernels/native.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str, target: str) -> None:
        super().__init__(name, sources=[])
        self.target = target  # the CMake target that produces it


NO_NATIVE_MESSAGE = (
    "specdec-kernels: installing the pure-Python package without its native kernels ({reason}). "
    "To build them: install torch, then `pip install --no-build-isolation -e .` (needs pybind11, cmake and "
    "a C++17 compiler). Until then backend='auto' uses Triton or the reference."
)


class CMakeBuild(build_ext):
    """Configures and builds CMakeLists.txt, writing _C next to the package (or into build_lib), and the
    CUDA host emulation library (the audit's cuda-emulated target, the tests) into specdec_kernels/exactness/."""

    def run(self) -> None:
        try:
            import pybind11  # noqa: F401
            import torch  # noqa: F401
        except ImportError as exc:
            # No extension to build, copy (editable installs) or package: the pure-Python package.
            print(NO_NATIVE_MESSAGE.format(reason=f"{exc.name} is not importable in the build environment"),
                  file=sys.stderr)
            self.extensions = []
        super().run()

    def build_extension(self, ext: Extension) -> None:
        if ext.target != "_C":
            return  # built by the same CMake build as _C (below), under its extension file name
        self._build_cmake(ext)

    def _build_cmake(self, ext: Extension) -> None:
        import pybind11
        import torch

        out_file = Path(self.get_ext_fullpath(ext.name)).resolve()
        out_dir = out_file.parent
        build_dir = ROOT / "build" / f"cmake-{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
        build_dir.mkdir(parents=True, exist_ok=True)
        with_cuda = (
            torch.version.cuda is not None
            and shutil.which("nvcc") is not None
            and os.environ.get("SPECDEC_SKIP_CUDA") != "1"
        )
        args = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DSPECDEC_OUTPUT_DIR={out_dir}",
            f"-DSPECDEC_WITH_CUDA={'ON' if with_cuda else 'OFF'}",
            f"-DSPECDEC_EXT_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX') or '.so'}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        cache = build_dir / "CMakeCache.txt"
        if cache.exists() and "Ninja" not in cache.read_text() and shutil.which("ninja"):
            shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True)
        subprocess.run(args, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build_dir), "--parallel", jobs], check=True)
        built = next(out_dir.glob("_C*" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")), None)
        if built is not None and built.resolve() != out_file:
            shutil.copy2(built, out_file)


ext_modules = [] if os.environ.get("SPECDEC_SKIP_NATIVE") == "1" else [CMakeExtension("specdec_kernels._C", "_C")]
if ext_modules and sys.platform.startswith("linux"):  # the CUDA host emulation (tests only), see CMakeLists.txt
    ext_modules.append(CMakeExtension("specdec_kernels.exactness._cuda_emulation", "specdec_cuda_emulation"))

setup(ext_modules=ext_modules, cmdclass={"build_ext": CMakeBuild})
