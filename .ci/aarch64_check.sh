#!/usr/bin/env bash
# aarch64 build check of CI (run by .ci/run; usage: bash .ci/aarch64_check.sh PYTHON): the whole CPU extension
# (csrc/bindings.cpp, csrc/cpu/*.cpp and the generic row_ops object of CMakeLists.txt's non-x86 branch)
# configures, compiles and links for aarch64 with g++-aarch64-linux-gnu (cmake/aarch64-linux-gnu.cmake) against
# the aarch64 build of the torch that PYTHON has. Installs nothing: it needs the Debian packages
# g++-aarch64-linux-gnu and libpython3.X-dev:arm64 (dpkg --add-architecture arm64), X being PYTHON's minor version.
# The kernels themselves run on aarch64 (under qemu) in tests/native/test_aarch64.py.
#
# The aarch64 torch wheel (PyPI, by name and version) is downloaded once into the cache and only its headers,
# CMake files and the libraries _C links against are kept. That wheel is a CUDA build, whose TorchConfig.cmake
# looks for an aarch64 CUDA toolkit; the extension needs none of it, so the build finds torch through a
# three-line config of the CPU libraries written here. Skipped, with a message, only when the wheel cannot be
# downloaded. Cache: $SPECDEC_CI_CACHE (default ~/.cache/specdec-ci); ccache from .ci/cuda_check.sh's tools
# if present.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
CACHE=${SPECDEC_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec-ci}
OUT=build/aarch64-check
mkdir -p "$OUT" "$CACHE"
start=$(date +%s)

for tool in aarch64-linux-gnu-g++ aarch64-linux-gnu-readelf cmake ninja; do
  if ! command -v "$tool" > /dev/null 2>&1; then
    echo "aarch64 extension build: $tool not found (Debian: g++-aarch64-linux-gnu; cmake, ninja)" >&2
    exit 1
  fi
done
py_ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
pyconfig=/usr/include/aarch64-linux-gnu/python$py_ver/pyconfig.h
if [ ! -f "$pyconfig" ] || [ ! -f "/usr/include/python$py_ver/Python.h" ]; then
  echo "aarch64 extension build: no $pyconfig (Debian: dpkg --add-architecture arm64; apt-get install libpython$py_ver-dev:arm64)" >&2
  exit 1
fi

# 1. The aarch64 torch: headers, CMake files, the libraries _C links against.
torch_ver=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
torch_dir="$CACHE/torch-aarch64-$torch_ver"
if [ ! -f "$torch_dir/torch/lib/libtorch_cpu.so" ]; then
  rm -rf "$torch_dir"
  wheels=$(mktemp -d)
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
      --python-version "$py_ver" -d "$wheels" "torch==$torch_ver" > "$OUT/pip.log" 2>&1; then
    tail -n 5 "$OUT/pip.log" >&2
    echo "aarch64 extension build SKIPPED: the aarch64 wheel of torch==$torch_ver cannot be downloaded here" >&2
    rm -rf "$wheels"
    exit 0
  fi
  "$PY" - "$wheels"/torch-*.whl "$torch_dir" <<'EOF'
import sys, zipfile
keep = ("torch/include/", "torch/share/cmake/", "torch/lib/libc10.so", "torch/lib/libtorch.so",
        "torch/lib/libtorch_cpu.so", "torch/lib/libtorch_python.so")
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(keep)])
EOF
  rm -rf "$wheels"
fi
echo "aarch64 torch==$torch_ver headers and libraries: ok ($torch_dir, $(( $(date +%s) - start )) s)"

# 2. Torch's CPU libraries as a CMake package, and the aarch64 pyconfig.h where Debian's multiarch
#    /usr/include/python3.X/pyconfig.h looks for it (<aarch64-linux-gnu/python3.X/pyconfig.h>).
mkdir -p "$OUT/torch-config" "$OUT/python-include/aarch64-linux-gnu"
cat > "$OUT/torch-config/TorchConfig.cmake" <<EOF
set(TORCH_INSTALL_PREFIX "$torch_dir/torch")
set(TORCH_INCLUDE_DIRS "\${TORCH_INSTALL_PREFIX}/include" "\${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include")
set(TORCH_LIBRARIES "\${TORCH_INSTALL_PREFIX}/lib/libtorch.so" "\${TORCH_INSTALL_PREFIX}/lib/libtorch_cpu.so" "\${TORCH_INSTALL_PREFIX}/lib/libc10.so")
EOF
cat > "$OUT/torch-config/TorchConfigVersion.cmake" <<EOF
set(PACKAGE_VERSION "$torch_ver")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
set(PACKAGE_VERSION_EXACT TRUE)
EOF
ln -sfn "$(dirname "$pyconfig")" "$OUT/python-include/aarch64-linux-gnu/python$py_ver"
ext_suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' | sed 's/x86_64/aarch64/')

# 3. Configure and build _C for aarch64.
launcher=()
if [ -x "$CACHE/tools/bin/ccache" ]; then
  export CCACHE_DIR="$CACHE/ccache" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=2G
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CACHE/tools/bin/ccache")
fi
rm -rf "$OUT/cmake" "$OUT/lib"
if ! cmake -S . -B "$OUT/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" \
    -DCMAKE_PREFIX_PATH="$PWD/$OUT/torch-config" \
    -Dpybind11_DIR="$("$PY" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DPython_EXECUTABLE="$PY" -DPython_INCLUDE_DIR="/usr/include/python$py_ver" \
    -DPYTHON_MODULE_EXTENSION="$ext_suffix" -DCMAKE_CXX_FLAGS="-isystem $PWD/$OUT/python-include" \
    -DSPECDEC_OUTPUT_DIR="$PWD/$OUT/lib" -DSPECDEC_WITH_CUDA_HOST=OFF "${launcher[@]}" \
    > "$OUT/configure.log" 2>&1; then
  tail -n 40 "$OUT/configure.log" >&2
  echo "aarch64 extension: CMake configure failed" >&2
  exit 1
fi
if ! cmake --build "$OUT/cmake" --parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" > "$OUT/build.log" 2>&1; then
  grep -B 2 -A 12 -m 5 "error\|FAILED" "$OUT/build.log" >&2 || tail -n 60 "$OUT/build.log" >&2
  echo "aarch64 extension: build failed" >&2
  exit 1
fi
so="$OUT/lib/_C$ext_suffix"
if ! aarch64-linux-gnu-readelf -h "$so" | grep -q "Machine:.*AArch64"; then
  echo "aarch64 extension: $so is not an aarch64 object" >&2
  exit 1
fi
# A shared object links with undefined symbols; none of ours may be left undefined.
if aarch64-linux-gnu-nm -DC --undefined-only "$so" | grep -q "specdec::"; then
  aarch64-linux-gnu-nm -DC --undefined-only "$so" | grep "specdec::" >&2
  echo "aarch64 extension: undefined specdec symbols" >&2
  exit 1
fi
echo "aarch64 extension build (generic row ops) against torch==$torch_ver: ok ($so, $(( $(date +%s) - start )) s)"
