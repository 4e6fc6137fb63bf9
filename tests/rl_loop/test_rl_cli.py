"""rl_loop CLI, end-to-end tiny run, checkpoint/resume."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from dataclasses import fields, replace

import pytest
import torch

import rl_loop
from rl_loop.__main__ import build_parser, parse_args
from rl_loop.config import REQUIRED_SUMMARY_KEYS, RunConfig, flag_of, tiny_config
from rl_loop.run.session import evaluate, setup, validate
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


def _option_fields():
    return [f for f in fields(RunConfig) if "help" in f.metadata]


def _other_value(f):
    """A valid value of option field ``f`` other than its default, as a command-line string."""
    if f.metadata["choices"]:
        return next(c for c in f.metadata["choices"] if c != f.default)
    if f.name == "top_p":
        return "0.5"
    if f.name in ("out", "verify_backend"):
        return {"out": "elsewhere", "verify_backend": "reference"}[f.name]
    return str(f.default + 1)


def test_the_cli_is_generated_from_the_config():
    """Every option field of RunConfig is one flag and sets exactly that field; the CLI declares nothing
    that the config does not (beyond --policy and --tiny, which pick the configuration)."""
    parser = build_parser()
    flags = {a.dest: a for a in parser._actions if a.dest not in ("help", "policy", "tiny")}
    assert set(flags) == {f.name for f in _option_fields()}
    default = parse_args([])
    for f in _option_fields():
        if f.type == "bool":
            cfg = parse_args([flag_of(f)])
            changed = {g.name for g in fields(RunConfig) if getattr(cfg, g.name) != getattr(default, g.name)}
            assert getattr(cfg, f.name) is (not f.default), f.name
        else:
            value = _other_value(f)
            argv = [flag_of(f), value] + (["--spec", "tree"] if f.name == "verify" and value == "traversal" else [])
            cfg = parse_args(argv)
            changed = {g.name for g in fields(RunConfig) if getattr(cfg, g.name) != getattr(default, g.name)}
            assert str(getattr(cfg, f.name)) == value, f.name
        # the field itself, and what it is defined to carry along (a task mix, the mask it needs, a spec)
        assert changed - ({"task", "max_new_tokens", "record_mask", "spec"} - {f.name}) == {f.name}, (f.name, changed)


def test_every_value_check_names_its_flag():
    """Each checked field rejects a bad value with its flag in the message (the one place values are checked)."""
    checked = [f for f in _option_fields() if f.metadata["check"]]
    assert {f.name for f in checked} >= {"k", "steps", "seed", "temperature", "top_k", "top_p", "rollout_workers"}
    for f in checked:
        rejected = []
        for bad in ("-1", "0", "nan", str(2**70)):
            try:
                parse_args([flag_of(f), bad])
            except ValueError as e:
                rejected.append(str(e))
            except SystemExit:  # not of the flag's type: argparse's own one-line error
                continue
        assert rejected and all(m.startswith(flag_of(f) + " ") for m in rejected), (f.name, rejected)


def test_given_flags_override_the_tiny_configuration():
    tiny = tiny_config()
    cfg = parse_args(["--tiny", "--steps", str(tiny.steps + 2), "--compare-every", "0", "--no-equivalence"])
    assert (cfg.steps, cfg.compare_every, cfg.equivalence) == (tiny.steps + 2, 0, False)
    assert cfg.model == tiny.model and cfg.warm_start_steps == tiny.warm_start_steps
    assert parse_args(["--tiny", "--policy", "llm-tiny"]).model.vocab_size == 151936


def test_every_rl_loop_module_imports():
    """A module that imports what does not exist fails here, not when someone runs it."""
    for m in pkgutil.walk_packages(rl_loop.__path__, "rl_loop."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)


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
    # the resumed step is generated by the weights of the checkpoint's last update, version 1, as straight
    assert [r["weights_version"] for r in rows_b if "event" not in r] == [0, 1]
    assert [r["weights_version"] for r in rows if "event" not in r] == [0, 1]
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
