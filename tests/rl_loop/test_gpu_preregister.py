"""The GPU rollout figure's prediction (``rl_loop/sim/gpu_preregister.py``): the committed file is what its
command writes, a device run's artefact is compared with it only when it can test it, and every committed
comparison holds the tolerance fixed before the measurement."""

from __future__ import annotations

import copy
import glob
import json
import math
import os
import subprocess

import pytest

from rl_loop.experiments.gpu_rollout import main as gpu_rollout
from rl_loop.run.usage import UsageError
from rl_loop.sim import gpu_preregister as gp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMITTED = os.path.join(ROOT, "results", "sim", "preregistered", gp.PREDICTIONS)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def _close(a, b, path="") -> None:
    """``a`` equals ``b``, floats to 1e-9 relative (numpy's exp and log differ in the last bits by ISA)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9), f"{path}: {a} != {b}"
    else:
        assert a == b, path


def test_committed_predictions_are_what_the_command_writes():
    with open(COMMITTED) as f:
        committed = json.load(f)
    provenance = committed.pop("provenance")
    _close(json.loads(json.dumps(gp.make_predictions())), committed)
    assert provenance["command"] == "python -m rl_loop.sim.gpu_preregister predict --out results/sim/preregistered"
    assert not provenance["dirty"]
    assert committed["tolerance"] == gp.TOLERANCE and set(committed["gpus"]) == set(gp.GPUS)


def test_prediction_inputs_are_the_measured_runs():
    """The workload is the run's (128 requests in one batch, k = 3, T = 1, 48 new tokens) and the acceptance
    is the shape table's default policy at k = 3; more acceptance predicts more speedup on either GPU."""
    p = gp.make_predictions()
    assert p["run"]["requests"] == 128 and p["run"]["max_batch"] == 128 and p["run"]["k"] == 3
    assert p["run"]["temperature"] == 1.0 and p["policy"]["vocab_size"] == 151936
    assert 5e8 < p["policy"]["parameters"] < 7e8  # Qwen3-0.6B's shape
    assert len(p["acceptance"]) == 3 and all(0.5 < a < 1 for a in p["acceptance"])
    for gpu in gp.GPUS:
        speedups = [g["speedup"] for g in p["gpus"][gpu]["grid"]]
        assert speedups == sorted(speedups)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> dict:
    """A real artefact of ``gpu_rollout`` (its CPU dry run), so that the comparison reads the keys the run
    writes."""
    out = tmp_path_factory.mktemp("gpu_rollout")
    assert gpu_rollout(["--device", "cpu", "--tiny", "--out", str(out), "--seeds", "1", "--repeats", "1"]) == 0
    with open(out / "gpu_rollout.json") as f:
        return json.load(f)


def _as_if_on(dry: dict, machine: str, commit: str, predictions: dict) -> dict:
    """``dry`` relabelled as a clean run of the predicted configuration on ``machine`` at ``commit``."""
    art = copy.deepcopy(dry)
    art.update(machine=machine, device="cuda", commit=commit, dirty=False, rollout_speedup=1.1,
               mean_accepted_length=3.0)
    art["regime"].update({k: predictions["run"][k] for k in ("requests", "max_batch", "k", "temperature",
                                                              "max_new_tokens", "drafter")})
    return art


def test_compare_reads_a_device_runs_artefact(dry_run):
    predictions = gp.make_predictions()
    head = _git("rev-parse", "HEAD")
    art = _as_if_on(dry_run, "NVIDIA H200", head, predictions)
    r = gp.compare(predictions, head, art)
    p = predictions["gpus"]["H200"]
    assert r["gpu"] == "H200" and r["measured_speedup"] == 1.1
    assert r["error"] == pytest.approx(p["predicted_speedup"] / 1.1 - 1)
    assert r["within_tolerance"] == (abs(r["error"]) <= gp.TOLERANCE)
    grid = p["grid"]  # 3.0 tokens per round lies between two grid points: linear between them
    lo = max((g for g in grid if g["tokens_per_round"] <= 3.0), key=lambda g: g["tokens_per_round"])
    hi = min((g for g in grid if g["tokens_per_round"] >= 3.0), key=lambda g: g["tokens_per_round"])
    w = (3.0 - lo["tokens_per_round"]) / (hi["tokens_per_round"] - lo["tokens_per_round"])
    assert r["predicted_at_measured_acceptance"] == pytest.approx(lo["speedup"] + w * (hi["speedup"] - lo["speedup"]))
    assert gp.gpu_of("NVIDIA H100 80GB HBM3") == "H100" and gp.gpu_of("NVIDIA B200") is None


def test_compare_refuses_what_cannot_test_the_prediction(dry_run):
    predictions = gp.make_predictions()
    head = _git("rev-parse", "HEAD")
    with pytest.raises(UsageError, match="ran on"):
        gp.compare(predictions, head, dry_run)  # the CPU dry run itself
    good = _as_if_on(dry_run, "NVIDIA H100 80GB HBM3", head, predictions)
    with pytest.raises(UsageError, match="dirty"):
        gp.compare(predictions, head, {**good, "dirty": True})
    root = _git("rev-list", "--max-parents=0", "HEAD").splitlines()[0]
    with pytest.raises(UsageError, match="does not descend"):
        gp.compare(predictions, head, {**good, "commit": root})  # measured before the prediction was written
    other = copy.deepcopy(good)
    other["regime"]["k"] = 2
    with pytest.raises(UsageError, match="k \\(predicted 3, measured 2\\)"):
        gp.compare(predictions, head, other)


def test_cli_mistakes_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gp.main(["compare", "--out", str(tmp_path), "--measured", str(tmp_path / "none.json")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "--measured" in err and len(err.splitlines()) == 1
    assert gp.main(["predict", "--out", str(tmp_path)]) == 0
    (tmp_path / "m.json").write_text("{}")
    with pytest.raises(SystemExit) as e:  # predictions that are not committed cannot be compared
        gp.main(["compare", "--out", str(tmp_path), "--measured", str(tmp_path / "m.json")])
    assert e.value.code == 2 and "not committed" in capsys.readouterr().err


COMPARISONS = sorted(glob.glob(os.path.join(ROOT, "results", "sim", "preregistered", "gpu_rollout_H*.json")))


@pytest.mark.skipif(not COMPARISONS, reason="no device run has measured the GPU rollout figure yet")
@pytest.mark.parametrize("path", COMPARISONS, ids=os.path.basename)
def test_committed_gpu_comparisons_hold_the_tolerance(path):
    """Each committed comparison: predictions committed first, the error within the tolerance fixed then."""
    with open(path) as f:
        r = json.load(f)
    with open(COMMITTED) as f:
        assert r["tolerance"] == json.load(f)["tolerance"]
    assert _git("merge-base", "--is-ancestor", r["predictions_commit"], r["measured_commit"]) == ""
    assert abs(r["error"]) <= r["tolerance"] and abs(r["error_at_measured_acceptance"]) <= r["tolerance"]
