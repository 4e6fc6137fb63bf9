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
from rl_loop.config import REQUIRED_SUMMARY_KEYS, RunConfig, tiny_config
from rl_loop.evaluation import evaluate, validate
from rl_loop.session import setup
from rl_loop.train import run
from tests.conftest import REPO

pytestmark = pytest.mark.rl
torch.set_num_threads(1)
ROOT = str(REPO)


@pytest.mark.slow
def test_help_lists_the_documented_flags():
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "rl_loop", "--help"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--pipeline", "--spec", "--drafter", "--k", "--backend", "--steps", "--seed", "--out", "--verify"):
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


@pytest.mark.slow
def test_tiny_run_writes_summary_and_resume_continues_exactly(tmp_path):
    straight = run(tiny_config(out=str(tmp_path / "a"), steps=2))
    for key in REQUIRED_SUMMARY_KEYS:
        assert key in straight, key
    eq = json.load(open(tmp_path / "a" / "equivalence.json"))
    assert straight["k"] == 3 and eq["greedy_identical"] and eq["law_pass"]
    # a tiny run is too small to reject the planted lossy control: underpowered, not failed
    assert straight["equivalence"] == eq["equivalence"] == ("pass" if eq["control_rejected"] else "underpowered")
    assert straight["equivalence_pass"] is (True if eq["control_rejected"] else None)
    assert eq["provenance"]["commit"] == straight["provenance"]["commit"] and eq["provenance"]["cpu"]
    # the figures agree with the counters they come from: tokens/s of the two arms, drafts accepted by position
    assert straight["rollout_speedup"] == pytest.approx(straight["spec_tokens_per_s"] / straight["ar_tokens_per_s"])
    by_pos = straight["acceptance_by_position"]
    assert len(by_pos) == 3 and by_pos == sorted(by_pos, reverse=True)  # accepted implies every earlier one was
    assert straight["mean_accepted_length"] == pytest.approx(1 + sum(by_pos))
    assert os.path.exists(tmp_path / "a" / "policy" / "model.safetensors")
    rows = [json.loads(x) for x in open(tmp_path / "a" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "event" not in r] == [0, 1]

    run(tiny_config(out=str(tmp_path / "b"), steps=1, equivalence=False))
    resumed = run(tiny_config(out=str(tmp_path / "b"), steps=2, resume=True, equivalence=False))
    rows_b = [json.loads(x) for x in open(tmp_path / "b" / "metrics.jsonl")]
    assert [r["step"] for r in rows_b if "event" not in r] == [0, 1]
    a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert a["state"]["step"] == b["state"]["step"] == 2
    for name, tensor in a["policy"].items():  # resuming reproduces the uninterrupted run
        assert torch.equal(tensor, b["policy"][name]), name
    assert resumed["val_accuracy_end"] == straight["val_accuracy_end"]
    assert resumed["val_greedy_accuracy_start"] == straight["val_greedy_accuracy_start"]


@pytest.mark.slow
def test_sampled_validation_reuses_its_keys_and_counts_every_sample(tmp_path):
    cfg = tiny_config(out=str(tmp_path), spec="none", eval_samples=3)
    s = setup(cfg, lambda row: None)
    engine, val, tok, gen = s.engine, s.val, s.tok, cfg.generation()
    first = evaluate(engine, val, tok, gen, samples=3, seed=5)
    assert first == evaluate(engine, val, tok, gen, samples=3, seed=5)  # fixed Philox keys: same draw
    assert first * 3 * len(val) == pytest.approx(round(first * 3 * len(val)))  # a mean over 3 x |val| samples
    v = validate(s)
    assert v["val_greedy_accuracy"] == evaluate(engine, val, tok, gen)
    assert validate(replace(s, cfg=replace(cfg, eval_samples=0)))["val_accuracy"] == v["val_greedy_accuracy"]


def test_not_implemented_modes_say_so(tmp_path):
    with pytest.raises(ValueError, match="backend vllm"):  # vLLM verifies chains only
        run(replace(tiny_config(out=str(tmp_path)), backend="vllm", spec="tree"))
