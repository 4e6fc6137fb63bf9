#!/usr/bin/env bash
# The one command of a GPU device lease (at most about 8.5 minutes on an H100): machine record, builds,
# identity check, the chain sweep against FlashInfer / vLLM / torch, the sampling mask's cost on our CUDA and
# Triton kernels, the peers' audits, rl_loop's GPU rollout figure (AR against speculative rollouts of the
# LLM-shape policy). Everything lands in $OUT as it
# goes (a phase cut by its timeout keeps what it wrote):
#   run.log               this script's whole output (phases, each phase's tail, the sweep's summary)
#   chain_sweep.csv       one row per (case, provider), flushed as measured (benchmarks/gpu/sweep.py)
#   chain_sweep.env.json  the run's provenance: command, commit, GPU / driver / clocks, versions
#   sampling_mask.csv     return_mask off / on / post-pass, per backend (benchmarks/bench_sampling_mask.py)
#   artefacts.tar.gz      $WORK re-packed after every phase: machine.txt, build logs, identity_<backend>.log,
#                         audit/<target>.{md,json}, rl_rollout.log
#   gpu_rollout.json      rl_loop's rollout figure (python -m rl_loop.experiments.gpu_rollout), written at its end
# (six files: a device run brings back at most eight.)
#
# Before the lease, here:   python -m benchmarks.gpu.prepare     (fills the ignored .cache/peers)
# On the device, from the repository root, carrying .cache/peers (the copy there has no .git: pass the commit):
#   SPECDEC_GIT_COMMIT=<git rev-parse --short=12 HEAD here> bash benchmarks/gpu/device_run.sh
# CPU dry run (CI, tests/benchmarks/test_gpu_device_run.py):   BENCH_DEVICE=cpu OUT=/tmp/out bash benchmarks/gpu/device_run.sh
#
# Knobs: OUT (default results/benchmarks/gpu_device_run), WORK (default a fresh mktemp -d: outside $OUT),
# SPECDEC_GIT_COMMIT (the commit the CSV, env.json and audit reports record where git cannot tell),
# PYTHON (default python3), SWEEP_ARGS (extra sweep arguments, e.g. "--max-cases 6"), IDENTITY_N (requests
# per identity case; default 4096 GPU, 8 CPU); timeouts in seconds: BUILD_TIMEOUT (90), IDENTITY_TIMEOUT
# (25 per backend; 60 on CPU), SWEEP_TIMEOUT (130), MASK_TIMEOUT (30), AUDIT_TIMEOUT (40, both audits in
# parallel), ROLLOUT_TIMEOUT (160). The defaults add up to 500 s, about 8.5 minutes with the start-up.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/results/benchmarks/gpu_device_run}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${WORK:-$(mktemp -d)}
PY=${PYTHON:-python3}
DEV=${BENCH_DEVICE:-cuda}
mkdir -p "$WORK/audit"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "$DEV" = cpu ]; then
  export TRITON_INTERPRET=1  # our triton backend and vLLM's Triton kernels run interpreted in the dry run
fi
SECONDS=0
step() { echo "== [${SECONDS}s] $*"; }
pack() { tar -czf "$OUT/artefacts.tar.gz.part" -C "$WORK" . && mv -f "$OUT/artefacts.tar.gz.part" "$OUT/artefacts.tar.gz"; }

step "machine (device $DEV)"
{
  echo "command: BENCH_DEVICE=$DEV bash benchmarks/gpu/device_run.sh"
  git log -1 --format='commit %H %cd' 2>/dev/null || echo "commit: ${SPECDEC_GIT_COMMIT:-unknown} (no git here; SPECDEC_GIT_COMMIT)"
  git status --porcelain --untracked-files=no 2>/dev/null | head -n 20
  if [ "$DEV" = cuda ]; then
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu --format=csv
    nvidia-smi -q -d CLOCK,PERFORMANCE 2>/dev/null | head -n 60
    nvcc --version | tail -n 2
  fi
  "$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  command -v ccache >/dev/null && echo "ccache: $(ccache --version | head -n 1)" || echo "ccache: none"
  cat .cache/peers/manifest.json 2>/dev/null | head -n 12 || true
} > "$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt"
[ -f .cache/peers/manifest.json ] || echo "!! .cache/peers missing: run python -m benchmarks.gpu.prepare here and carry .cache/peers (FlashInfer and vLLM rows will be skipped)"
pack

if [ "$DEV" = cuda ]; then
  step "building ours (CUDA, this GPU's arch only) and the FlashInfer extension, in parallel"
  read -r torch_arch cmake_arch < <("$PY" -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}.{b}a {a}{b}a')")
  echo "target: TORCH_CUDA_ARCH_LIST=$torch_arch CUDAARCHS=$cmake_arch"
  ( export TORCH_CUDA_ARCH_LIST="$torch_arch" CUDAARCHS="$cmake_arch" CMAKE_BUILD_PARALLEL_LEVEL=12
    timeout "${BUILD_TIMEOUT:-90}" "$PY" setup.py -q build_ext --inplace > "$WORK/build_ours.log" 2>&1
    echo "ours: exit $? after ${SECONDS}s" >> "$WORK/build_ours.log" ) &
  pids=($!)
  ( timeout "${BUILD_TIMEOUT:-90}" "$PY" -m benchmarks.gpu.flashinfer_ext > "$WORK/build_flashinfer.log" 2>&1
    echo "flashinfer: exit $? after ${SECONDS}s" >> "$WORK/build_flashinfer.log" ) &
  pids+=($!)
  wait "${pids[@]}"  # not a bare wait: that would also wait for the tee of run.log
  tail -n 4 "$WORK/build_ours.log" "$WORK/build_flashinfer.log"
  pack
fi
"$PY" -c "import specdec_kernels as sk; print('backends on $DEV:', sk.available_backends('$DEV'))"

step "identity: our GPU backends' tokens vs the reference's, request by request (tests.harness.identity)"
if [ "$DEV" = cuda ]; then backends="cuda triton"; args="--n ${IDENTITY_N:-4096} --workers 4"; limit=${IDENTITY_TIMEOUT:-25}
else backends="cpu"; args="--n ${IDENTITY_N:-8} --workers 1 --methods token"; limit=${IDENTITY_TIMEOUT:-60}; fi
for backend in $backends; do
  # shellcheck disable=SC2086  # args is a list of arguments
  timeout "$limit" "$PY" -m tests.harness.identity --backend "$backend" --device "$DEV" --seeds 11 $args \
    > "$WORK/identity_$backend.log" 2>&1
  echo "identity $backend exit code: $? ($(grep -c '^!!' "$WORK/identity_$backend.log") jobs differ; 124 = timed out)"
  grep '^!!\|^identity' "$WORK/identity_$backend.log" | head -n 8
done
pack

step "chain sweep -> $OUT/chain_sweep.csv"
# shellcheck disable=SC2086  # SWEEP_ARGS is a list of arguments
timeout "${SWEEP_TIMEOUT:-130}" "$PY" -m benchmarks.gpu.sweep --device "$DEV" --out "$OUT/chain_sweep.csv" ${SWEEP_ARGS:-}
echo "sweep exit code: $? (124 = timed out; rows are flushed one by one)"
pack

step "sampling mask: return_mask off / on / post-pass -> $OUT/sampling_mask.csv"
if [ "$DEV" = cuda ]; then mask_args="--backend cuda,triton --rounds 5 --reps 3"
else mask_args="--backend cpu --batch 4 --vocab 4096 --rounds 2 --reps 1"; fi
# shellcheck disable=SC2086  # mask_args is a list of arguments
timeout "${MASK_TIMEOUT:-30}" "$PY" -m benchmarks.bench_sampling_mask --device "$DEV" $mask_args \
  --note "device run, alone on the machine" --out "$OUT/sampling_mask.csv"
echo "sampling mask exit code: $? (124 = timed out; each backend's rows are written when it is measured)"
pack

step "audits of FlashInfer's kernel and vLLM V2's kernels (short budget, in parallel)"
budget=${AUDIT_TIMEOUT:-40}
pids=()
for target in flashinfer vllm_v2; do
  timeout "$budget" "$PY" -m specdec_kernels.audit "benchmarks.gpu.audit_targets:$target" --out "$WORK/audit" \
    --families first-token,greedy,mutants --tv 0.05 --max-seconds $((budget / 2)) \
    > "$WORK/audit/$target.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
for target in flashinfer vllm_v2; do tail -n 2 "$WORK/audit/$target.log"; done
pack

step "rl_loop GPU rollout figure -> $OUT/gpu_rollout.json"
if [ "$DEV" = cuda ]; then rollout_args="--device cuda"; else rollout_args="--device cpu --tiny --seeds 3 --repeats 2"; fi
# shellcheck disable=SC2086  # rollout_args is a list of arguments
timeout "${ROLLOUT_TIMEOUT:-160}" "$PY" -m rl_loop.experiments.gpu_rollout $rollout_args --out "$WORK/rl_rollout" \
  > "$WORK/rl_rollout.log" 2>&1
echo "rollout exit code: $? (124 = timed out)"
tail -n 3 "$WORK/rl_rollout.log"
cp "$WORK/rl_rollout/gpu_rollout.json" "$OUT/" 2>/dev/null || echo "no gpu_rollout.json written"
pack

step "summary"
"$PY" -m benchmarks.gpu.sweep --summary "$OUT/chain_sweep.csv" || true
step "done: $OUT (run.log, chain_sweep.csv, chain_sweep.env.json, artefacts.tar.gz)"
