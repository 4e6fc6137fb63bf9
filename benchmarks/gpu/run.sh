#!/usr/bin/env bash
# One GPU lease: install carried wheels, build the CUDA extension when its sources
# exist, run the GPU tests (every CUDA backend's tokens equal to the reference, the statistical suite on
# cuda and triton), the identity check (each GPU backend's tokens vs the reference's, 65476 requests per
# step-law case and seed), then the chain sweep (vLLM and FlashInfer providers where importable).
# Everything lands in $OUT: run.log, pytest.xml, identity_<backend>.log, chain_cuda.csv, chain_cuda.png.
#
# Usage, from the repository root on the GPU machine:   bash benchmarks/gpu/run.sh
# Environment knobs: OUT (default results/benchmarks/gpu_run), PYTHON (default python3),
# SWEEP_ARGS (bench_chain arguments; default "--k 1,3,7 --dtype bfloat16": batch {1,8,64,256} x vocab
# {32000,151936,262144} x greedy/random x deterministic/stochastic), timeouts in seconds: BUILD_TIMEOUT
# (default 240), TEST_TIMEOUT (300), IDENTITY_TIMEOUT (150 per backend), SWEEP_TIMEOUT (180); BENCH_DEVICE
# (default cuda; "cpu" dry-runs the script on a machine without a GPU). The default timeouts add up to about
# 20 minutes; under a 10-minute limit per command, e.g.
#   BUILD_TIMEOUT=200 TEST_TIMEOUT=200 IDENTITY_TIMEOUT=60 SWEEP_TIMEOUT=60 bash benchmarks/gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/results/benchmarks/gpu_run}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
SECONDS=0
step() { echo "== [${SECONDS}s] $*"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
git log -1 --format='commit %H %cd' 2>/dev/null || true

if compgen -G ".whl/*.whl" > /dev/null; then
  step "installing carried wheels: $(ls .whl | tr '\n' ' ')"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    || echo "!! wheel install failed; continuing without them"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

if [ -d csrc ]; then
  step "building the native extension (CUDA sm_90a)"
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
  timeout "${BUILD_TIMEOUT:-240}" "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
    || echo "!! native build failed or timed out; native providers will be skipped"
  # The H200 image's /opt/gcc/bin/g++ (CXX, CC and CUDAHOSTCXX point at it) links libstdc++ statically, so _C
  # carried its own copy of the streams and crashed on its first error message; CMake now links the shared
  # libstdc++.so.6 in that case (cmake/SharedLibstdcxx.cmake). Report what the build did.
  so=$(ls specdec_kernels/_C*.so 2>/dev/null | head -n 1)
  if [ -n "$so" ]; then
    echo "libstdc++ stream symbols defined by $so: $(nm -D --defined-only "$so" 2>/dev/null | grep -c ' _ZNSo9_M_insert') (0 expected)"
  fi
fi
"$PY" -c "import specdec_kernels as sk; print('backends on cuda:', sk.available_backends('cuda'))"

step "GPU tests: pytest -m 'triton or native or stat'"
# On CUDA the backend tests compare every backend available_backends("cuda") lists (cuda, triton,
# reference) with the reference on the CPU, and the statistical suite runs on cuda and triton
# (tests/conftest.py). The host emulation of the CUDA kernels is for machines without a GPU: skipped here.
# Several workers: most of the test time is Triton compiling one kernel variant per shape and dtype.
XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
# shellcheck disable=SC2086  # XDIST is empty or two arguments
timeout "${TEST_TIMEOUT:-300}" "$PY" -m pytest -q -m "triton or native or stat" tests -p no:cacheprovider $XDIST \
  --ignore=tests/native/test_cuda_emulated_kernels.py --ignore=tests/native/test_cuda_emulation.py \
  --continue-on-collection-errors --junitxml="$OUT/pytest.xml"
echo "pytest exit code: $?"

step "identity: each GPU backend's tokens vs the reference's, every step-law case, 3 seeds x 65476 requests"
# tests.harness.identity: rare faults (a race, a value the compiled kernel loses) that the test
# sizes above miss. One line per job, flushed: a timeout keeps what was checked.
for backend in $("$PY" -c "import specdec_kernels as sk; print(' '.join(b for b in sk.available_backends('cuda') if b != 'reference'))"); do
  timeout "${IDENTITY_TIMEOUT:-150}" "$PY" -m tests.harness.identity --backend "$backend" --device "${BENCH_DEVICE:-cuda}" \
    --workers 4 > "$OUT/identity_$backend.log" 2>&1
  echo "identity $backend exit code: $? ($(grep -c '^!!' "$OUT/identity_$backend.log") jobs differ)"; grep '^!!\|^identity' "$OUT/identity_$backend.log" | head -n 12
done

step "chain sweep"
# shellcheck disable=SC2086  # SWEEP_ARGS is a list of arguments
timeout "${SWEEP_TIMEOUT:-180}" "$PY" -m benchmarks.bench_chain --device "${BENCH_DEVICE:-cuda}" --repeats 20 --warmup 3 \
  --out "$OUT/chain_cuda.csv" ${SWEEP_ARGS:---k 1,3,7 --dtype bfloat16}
echo "sweep exit code: $? (rows are flushed one by one: a timeout keeps what was measured)"

step "plot"
"$PY" -m benchmarks.plot "$OUT/chain_cuda.csv" --out "$OUT/chain_cuda.png" --table --baseline triton \
  > "$OUT/chain_cuda_table.md" || echo "!! plot failed (matplotlib missing?)"
step "done"
