"""The GPU device run (benchmarks/gpu/device_run.sh) on CPU: the dry run end to end, the sweep's skips, the
prepare script's header closure, the peers' refusals.

The device run itself needs an H100 / H200 lease; these tests keep the script and its Python pieces from
breaking in between (CI has no GPU).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import types

import pytest
import torch

from benchmarks.bench_chain import ChainCase, Skip
from benchmarks.common import read_csv
from benchmarks.gpu import flashinfer_ext, peers, prepare, sweep
from tests.conftest import REPO

CPU_PROVIDERS = ("cpu", "reference", "torch", "torch_compile", "read")
INTERPRETED = ("triton", "vllm_v2", "vllm_v1")  # on CPU under TRITON_INTERPRET=1 (vLLM: when carried)
GPU_ONLY = ("cuda", "flashinfer", "flashinfer_kernel")


@pytest.mark.slow
def test_cpu_dry_run_writes_every_provider_with_provenance(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "BENCH_DEVICE": "cpu", "OUT": str(out), "WORK": str(work), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "benchmarks/gpu/device_run.sh"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    names = sorted(p.name for p in out.iterdir())  # a device run brings back at most 8 files
    assert names == ["artefacts.tar.gz", "chain_sweep.csv", "chain_sweep.env.json", "gpu_rollout.json", "run.log",
                     "sampling_mask.csv"]
    mask = read_csv([out / "sampling_mask.csv"])
    assert len(mask) == 9 and {r["provider"] for r in mask} == {"cpu"} and all(r["git_commit"] for r in mask)
    rows = read_csv([out / "chain_sweep.csv"])
    assert {r["provider"] for r in rows} == set(sweep.PROVIDERS)
    for row in rows:
        assert all(row[c] for c in ("command", "git_commit", "device")), row
        assert row["status"] == "ok" or row["status"].startswith("skipped: "), row
    by_provider = {p: [r for r in rows if r["provider"] == p] for p in sweep.PROVIDERS}
    for name in CPU_PROVIDERS + ("triton",):
        assert any(r["status"] == "ok" for r in by_provider[name]), name
    for name in GPU_ONLY:
        assert all(r["status"].startswith("skipped: ") and len(r["status"]) > 12 for r in by_provider[name]), name
    carried = (prepare.PEERS / "manifest.json").exists()
    for name in ("vllm_v2", "vllm_v1"):
        ok = [r for r in by_provider[name] if r["status"] == "ok"]
        assert ok if carried else all("not carried" in r["status"] for r in by_provider[name]), name
    with tarfile.open(out / "artefacts.tar.gz") as tar:
        names = {os.path.normpath(n) for n in tar.getnames()}
    assert {"machine.txt", "identity_cpu.log", "audit/flashinfer-ext.json", "audit/vllm-v2-kernel.json",
            "rl_rollout.log"} <= names
    rollout = json.loads((out / "gpu_rollout.json").read_text())
    assert rollout["provenance"]["commit"] and rollout["regime"]["vocab_size"] == 151936
    log = (out / "run.log").read_text()
    assert "cannot run here" in log and "== [" in log and "done:" in log


def test_sweep_records_a_provider_that_cannot_run_as_skipped_or_error(tmp_path, monkeypatch):
    def broken(inputs):
        raise RuntimeError("boom")

    monkeypatch.setitem(sweep.BUILDERS, "torch", broken)
    out = tmp_path / "sweep.csv"
    case = ChainCase(1, 1, 64, "float32", "random", "stochastic")
    sweep.run([("tiny", case)], ["cpu", "cuda", "flashinfer", "torch", "read"], torch.device("cpu"), out,
              warmup=0, rounds=1, inner=1, command="test", log=lambda *a: None)
    status = {r["provider"]: r["status"] for r in read_csv([out])}
    assert status["cpu"] == "ok" and status["read"] == "ok"
    assert status["cuda"].startswith("skipped: ") and status["flashinfer"] == "skipped: FlashInfer's kernels need CUDA"
    assert status["torch"] == "error: RuntimeError: boom"
    assert "tiny" in sweep.summarize(out)


def test_gpu_grid_starts_with_flashinfers_published_points():
    grid = sweep.gpu_grid()
    assert [c for _, c in grid[:2]] == [ChainCase(16, 5, 32000, "float32", "random", "stochastic"),
                                        ChainCase(32, 8, 128256, "float32", "random", "stochastic")]
    main = [c for label, c in grid if label == "main"]
    assert {(c.batch, c.k) for c in main} == {(b, k) for b in (1, 16, 32, 64, 256) for k in (1, 3, 5, 8)}
    assert all(c.vocab == 151936 and c.dtype == "bfloat16" for c in main)


def test_header_closure_follows_quoted_and_angle_includes():
    root = "data/include/"
    members = {root + "flashinfer/sampling.cuh": b'#include "math.cuh"\n#include <cub/cub.cuh>\n',
               root + "flashinfer/math.cuh": b"#include <flashinfer/utils.cuh>\n",
               root + "flashinfer/utils.cuh": b"// leaf\n", root + "flashinfer/unused.cuh": b""}
    found = prepare.header_closure(members, root, "flashinfer/sampling.cuh")
    assert sorted(found) == ["flashinfer/math.cuh", "flashinfer/sampling.cuh", "flashinfer/utils.cuh"]


def test_peers_refuse_with_the_prepare_command(tmp_path):
    with pytest.raises(peers.PeerUnavailable, match="benchmarks.gpu.prepare"):
        peers.load_v2(tmp_path)
    with pytest.raises(Skip, match="vllm v2"):
        sweep._VLLM.pop("v2", None)
        monkey = sweep._VLLM
        monkey["v2"] = peers.PeerUnavailable("not carried")
        try:
            sweep._vllm_fn("v2")
        finally:
            monkey.pop("v2")


def test_flashinfer_extension_targets_the_a_variant_from_hopper_on():
    assert flashinfer_ext.arch_list((9, 0)) == "9.0a" and flashinfer_ext.arch_list((10, 0)) == "10.0a"
    assert flashinfer_ext.arch_list((8, 0)) == "8.0"
    if not torch.cuda.is_available():
        with pytest.raises(flashinfer_ext.ExtensionUnavailable, match="CUDA"):
            flashinfer_ext.load()


def test_commit_comes_from_the_environment_where_git_cannot_tell(monkeypatch):
    """The device's copy of the tree has no .git: the CSV and the audit reports record $SPECDEC_GIT_COMMIT."""
    from benchmarks import common
    from specdec_kernels.audit import runner

    def no_git(*args, **kwargs):
        raise subprocess.CalledProcessError(128, args[0], output="", stderr="fatal: not a git repository")

    monkeypatch.setattr(subprocess, "run", no_git)
    monkeypatch.delenv("SPECDEC_GIT_COMMIT", raising=False)
    assert common.git_commit() == "" and runner._git_commit() is None
    monkeypatch.setenv("SPECDEC_GIT_COMMIT", "0123456789ab")
    assert common.git_commit() == "0123456789ab" and runner._git_commit() == "0123456789ab"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
@pytest.mark.skipif(not (flashinfer_ext.INCLUDE / "flashinfer" / "sampling.cuh").exists(),
                    reason="FlashInfer's headers not prepared (python -m benchmarks.gpu.prepare)")
def test_flashinfer_kernels_compile_for_hopper(tmp_path):
    """The kernel-calling half of the extension compiles against the carried headers (about 25 s of nvcc)."""
    obj = flashinfer_ext.compile_only(tmp_path / "fi.o", "90a")
    assert obj.stat().st_size > 100_000


def test_load_modules_runs_files_under_a_root_without_package_inits(tmp_path):
    """The audit's loader as the device run uses it: a module file under ``source_root``, its parent packages
    bare (their ``__init__`` never runs), a stub for what it imports, ``sys.modules`` left as it was."""
    pytest.importorskip("triton")
    from specdec_kernels.audit.interpret import load_modules, triton_utils_shim

    (tmp_path / "vllm" / "v1").mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('a package __init__ ran')\n")
    (tmp_path / "vllm" / "v1" / "kernels.py").write_text(
        "from vllm.triton_utils import HAS_TRITON, tl\nfrom vllm.heavy import helper\n"
        "VALUE = helper() if HAS_TRITON and tl is not None else None\n")
    heavy = types.ModuleType("vllm.heavy")
    heavy.helper = lambda: 42
    before = {name: module for name, module in sys.modules.items() if name.startswith("vllm")}
    modules = load_modules(("vllm.v1.kernels",), triton_utils_shim(), source_root=tmp_path,
                           stubs={"vllm.heavy": heavy})
    assert modules["vllm.v1.kernels"].VALUE == 42
    assert {name: module for name, module in sys.modules.items() if name.startswith("vllm")} == before
