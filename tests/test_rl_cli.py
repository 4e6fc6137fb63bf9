"""rl_loop CLI, end-to-end tiny run, checkpoint/resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from rl_loop.__main__ import parse_args
from rl_loop.train import REQUIRED_SUMMARY_KEYS, RunConfig, run, tiny_config

pytestmark = pytest.mark.rl
torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_lists_the_documented_flags():
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "rl_loop", "--help"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--pipeline", "--spec", "--drafter", "--k", "--backend", "--steps", "--seed", "--out"):
        assert flag in out.stdout
    assert "runs/latest" in out.stdout


def test_cli_defaults_match_the_issue():
    cfg = parse_args([])
    assert (cfg.pipeline, cfg.spec, cfg.drafter, cfg.k, cfg.backend, cfg.out) == (
        "sync", "chain", "eagle3", 3, "own", "runs/latest")
    cfg = parse_args(["--spec", "none", "--k", "5", "--steps", "3", "--seed", "7", "--out", "x", "--tiny"])
    assert (cfg.spec, cfg.k, cfg.steps, cfg.seed, cfg.out) == ("none", 5, 3, 7, "x")
    with pytest.raises(SystemExit):
        parse_args(["--spec", "beam"])
    with pytest.raises(ValueError, match="drafter"):
        RunConfig(drafter="ngram")


def test_tiny_run_writes_summary_and_resume_continues_exactly(tmp_path):
    straight = run(tiny_config(out=str(tmp_path / "a"), steps=2))
    for key in REQUIRED_SUMMARY_KEYS:
        assert key in straight, key
    assert straight["k"] == 3 and straight["equivalence_pass"] is True
    assert straight["rollout_speedup"] > 0 and 1.0 <= straight["mean_accepted_length"] <= 4.0
    assert len(straight["acceptance_by_position"]) == 3
    assert os.path.exists(tmp_path / "a" / "policy" / "model.safetensors")
    rows = [json.loads(x) for x in open(tmp_path / "a" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "event" not in r] == [0, 1]

    run(tiny_config(out=str(tmp_path / "b"), steps=1, equivalence=False))
    resumed = run(tiny_config(out=str(tmp_path / "b"), steps=2, resume=True, equivalence=False))
    rows_b = [json.loads(x) for x in open(tmp_path / "b" / "metrics.jsonl")]
    assert [r["step"] for r in rows_b if "event" not in r] == [0, 1]
    a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert a["step"] == b["step"] == 2
    for name, tensor in a["policy"].items():  # resuming reproduces the uninterrupted run
        assert torch.equal(tensor, b["policy"][name]), name
    assert resumed["val_accuracy_end"] == straight["val_accuracy_end"]


def test_not_implemented_modes_say_so(tmp_path):
    with pytest.raises(ValueError, match="backend vllm"):  # vLLM verifies chains only
        run(replace(tiny_config(out=str(tmp_path)), backend="vllm", spec="tree"))
