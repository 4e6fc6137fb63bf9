"""rl_loop as a user meets it: mistakes fail in one line before any work; resume refuses what it cannot
continue exactly, cuts metrics.jsonl back to the checkpoint, and stays bit-exact after a SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace

import pytest
import torch

import rl_loop.train as train_module
from rl_loop.__main__ import main
from rl_loop.config import tiny_config
from rl_loop.run import checks
from rl_loop.run.session import setup
from rl_loop.run.usage import UsageError
from rl_loop.sim.sweep import main as sweep_main
from rl_loop.train import run
from tests.conftest import REPO

pytestmark = pytest.mark.rl
ROOT = str(REPO)


@pytest.fixture
def no_work(monkeypatch):
    """Any run that gets past the checks fails the test at once instead of training."""
    def started(cfg):
        raise AssertionError("the run started work")

    monkeypatch.setattr(train_module, "open_run", started)


def _one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        rc = main(argv)
        raise SystemExit(rc)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("python -m rl_loop: error: ")
    return err


@pytest.mark.parametrize("argv, named", [
    (["--k", "0"], "--k"), (["--k", "-1"], "--k"), (["--steps", "-1"], "--steps"),
    (["--temperature", "0"], "--temperature"), (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"), (["--temperature", "inf"], "--temperature"),
    (["--seed", str(2**70)], "--seed"), (["--seed", "-1"], "--seed"),
    (["--verify-backend", "nosuch"], "--verify-backend"), (["--k", "100000"], "--k"),
    (["--tiny", "--spec", "tree", "--k", "25"], "--k"), (["--rollout-workers", "0"], "--rollout-workers"),
    (["--verify", "optimal"], "--verify"), (["--verify", "traversal"], "--verify traversal"),
    (["--spec", "tree", "--verify", "block"], "--verify block"), (["--spec", "none", "--verify", "block"], "--spec chain"),
])
def test_flag_mistakes_fail_in_one_line_before_any_work(capsys, no_work, tmp_path, argv, named):
    err = _one_line_error(capsys, [*argv, "--out", str(tmp_path / "run")])
    assert named in err


def test_out_that_is_a_file_under_a_file_or_read_only(capsys, no_work, tmp_path, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    assert "is a file" in _one_line_error(capsys, ["--tiny", "--out", str(f)])
    assert "lies under" in _one_line_error(capsys, ["--tiny", "--out", str(f / "run")])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:  # root writes through mode bits: make the probe meet what a read-only mount gives
        def refuse(*a, **kw):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    try:
        assert "not writable (Permission denied)" in _one_line_error(capsys, ["--tiny", "--out", str(ro)])
    finally:
        ro.chmod(0o755)


def test_unavailable_backends_fail_in_one_line(capsys, no_work, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    err = _one_line_error(capsys, ["--tiny", "--verify-backend", "triton", "--out", str(tmp_path)])
    assert "TRITON_INTERPRET=1" in err
    monkeypatch.setattr(checks, "find_spec", lambda name: None if name == "vllm" else object())
    assert "needs vLLM" in _one_line_error(capsys, ["--tiny", "--backend", "vllm", "--out", str(tmp_path)])


def test_context_overflow_is_refused_up_front(no_work, tmp_path):
    cfg = tiny_config(out=str(tmp_path), spec="tree", k=100, max_new_tokens=120)
    with pytest.raises(UsageError, match="max_position_embeddings"):
        run(cfg)


@pytest.mark.slow
def test_cli_is_one_line_in_a_fresh_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "rl_loop", "--k", "100000", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--k 100000" in out.stderr


def test_sim_sweep_out_that_is_a_file(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SystemExit) as e:
        sweep_main(["--out", str(f), "--no-plots"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "is a file" in err, err


# ---- resume -------------------------------------------------------------------------------------------

def test_resume_without_checkpoint_is_an_error_and_leaves_the_log(no_work, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(UsageError, match="no checkpoint"):
        run(tiny_config(out=str(tmp_path), resume=True))
    (tmp_path / "checkpoint.pt.tmp").write_bytes(b"cut off")
    with pytest.raises(UsageError, match=r"only checkpoint\.pt\.tmp"):
        run(tiny_config(out=str(tmp_path), resume=True))
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\n'
    with pytest.raises(UsageError, match="no checkpoint"):
        run(tiny_config(out=str(tmp_path / "missing"), resume=True))
    assert not (tmp_path / "missing").exists()  # a mistyped --out is not created


def _steps(out) -> list[int]:
    return [r["step"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "event" not in r]


_KILL_AT = """
import os, signal, sys
import rl_loop.train as sp
from rl_loop.config import tiny_config
from rl_loop.run.session import setup
from rl_loop.train import run
save = sp.save_checkpoint
def save_or_die(s):  # SIGKILL once step 2's row is logged, before its checkpoint: the one of step 2 stays
    if s.state.step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    save(s)
sp.save_checkpoint = save_or_die
run(tiny_config(out=sys.argv[1], steps=3, equivalence=False, dump_rollouts=True))
"""

_TIMES = ("_s", "seconds", "per_s", "speedup")


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(t in k for t in _TIMES)}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> str:
    """A finished three-step tiny run."""
    out = str(tmp_path_factory.mktemp("straight"))
    run(tiny_config(out=out, steps=3, equivalence=False, dump_rollouts=True))
    return out


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_exact_and_logs_each_step_once(straight, tmp_path):
    killed = str(tmp_path / "killed")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", _KILL_AT, killed], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == -9, p.stderr
    assert _steps(killed) == [0, 1, 2]  # step 2 was logged after the last checkpoint (step 2)
    old = str(tmp_path / "format1")  # the same kill under checkpoint format 1 (issue 14's): cut by step
    shutil.copytree(killed, old)
    ckpt = torch.load(os.path.join(old, "checkpoint.pt"), weights_only=False)
    assert ckpt["format"] == 2 and ckpt["state"]["step"] == 2 and not ckpt["finished"]
    for key in ("format", "metrics_bytes", "finished"):
        del ckpt[key]
    torch.save(ckpt, os.path.join(old, "checkpoint.pt"))
    a = torch.load(os.path.join(straight, "checkpoint.pt"), weights_only=False)
    rows_a = [_deterministic(r) for r in map(json.loads, open(os.path.join(straight, "metrics.jsonl")))]
    for out in (killed, old):
        run(tiny_config(out=out, steps=3, equivalence=False, resume=True, dump_rollouts=True))
        assert _steps(out) == [0, 1, 2], out
        b = torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)
        assert b["state"]["step"] == 3 and b["finished"]
        for name, tensor in a["policy"].items():
            assert torch.equal(tensor, b["policy"][name]), (out, name)
        for name, tensor in a["drafter"].items():
            assert torch.equal(tensor, b["drafter"][name]), (out, name)
        rows_b = [_deterministic(r) for r in map(json.loads, open(os.path.join(out, "metrics.jsonl")))]
        assert rows_b == rows_a, out
        dump = open(os.path.join(out, "rollouts.jsonl")).read()  # --dump-rollouts: cut back by step too
        assert dump == open(os.path.join(straight, "rollouts.jsonl")).read(), out


@pytest.mark.slow
def test_resume_refuses_a_different_run_naming_the_fields(straight, no_work):
    cfg = tiny_config(out=straight, steps=5, resume=True)
    with pytest.raises(UsageError) as e:
        run(replace(cfg, seed=1, k=2, temperature=0.5, spec="none"))
    for field in ("seed (checkpoint 0, asked 1)", "k (checkpoint 3, asked 2)", "temperature", "spec"):
        assert field in str(e.value)
    with pytest.raises(UsageError, match=r"model\.num_hidden_layers"):
        run(replace(cfg, model=replace(cfg.model, num_hidden_layers=4)))


@pytest.mark.slow
def test_resume_of_a_finished_run_says_so(straight, no_work):
    with pytest.raises(UsageError, match=r"finished run of 3 steps; pass --steps > 3"):
        run(tiny_config(out=straight, steps=3, resume=True))
    with pytest.raises(UsageError, match="finished run of 3 steps"):
        run(tiny_config(out=straight, steps=2, resume=True))


@pytest.mark.slow
def test_damaged_or_earlier_checkpoints_give_one_line(straight, tmp_path, capsys, no_work):
    out = tmp_path / "run"
    out.mkdir()
    data = open(os.path.join(straight, "checkpoint.pt"), "rb").read()
    for damaged in (data[: len(data) // 2], b"not a checkpoint"):
        (out / "checkpoint.pt").write_bytes(damaged)
        err = _one_line_error(capsys, ["--tiny", "--resume", "--steps", "5", "--out", str(out)])
        assert "cannot be read" in err
    torch.save(torch.zeros(2), out / "checkpoint.pt")
    assert "not an rl_loop checkpoint" in _one_line_error(capsys, ["--tiny", "--resume", "--out", str(out)])
    torch.save({"step": 1, "policy": {}, "config": {}}, out / "checkpoint.pt")  # the flat pre-issue-14 layout
    assert "earlier rl_loop" in _one_line_error(capsys, ["--tiny", "--resume", "--steps", "5", "--out", str(out)])
    ckpt = torch.load(os.path.join(straight, "checkpoint.pt"), weights_only=False)
    torch.save({**ckpt, "format": 99}, out / "checkpoint.pt")
    assert "format 99" in _one_line_error(capsys, ["--tiny", "--resume", "--steps", "5", "--out", str(out)])


@pytest.mark.slow
def test_benchmarks_load_a_finished_run_and_change_nothing(straight):
    """``rl_loop.experiments.bench`` / ``tree_bench`` load a run's weights through ``setup`` with ``resume=True`` (and
    tree_bench another spec): neither the continuation checks nor the log cut apply there."""
    log = os.path.join(straight, "metrics.jsonl")
    before = open(log).read()
    s = setup(tiny_config(out=straight, steps=3, equivalence=False, resume=True, spec="none"), lambda row: None)
    assert s.state.step == 3
    assert open(log).read() == before
