"""The LLM-shape policy (``config.llm_policy``: Qwen3-0.6B's vocabulary) at CPU width: GRPO verifies at
V = 151936 and runs the equivalence check there; ``python -m rl_loop.experiments.gpu_rollout`` runs end to end as a
dry run and writes its artefact."""

from __future__ import annotations

import json

import pytest
import torch

import specdec_kernels as sk
from rl_loop.config import QWEN3_VOCAB_SIZE, llm_policy, llm_tiny_policy, tiny_config
from rl_loop.experiments.gpu_rollout import ARTEFACT
from rl_loop.experiments.gpu_rollout import main as gpu_rollout
from rl_loop.train import run
from specdec_kernels.models import Qwen3, num_parameters

pytestmark = [pytest.mark.rl, pytest.mark.usefixtures("one_thread")]


def test_llm_preset_has_qwen3_0_6b_proportions():
    c = llm_policy()
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (151936, 1024, 3072, 28)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.tie_word_embeddings) == (16, 8, 128, True)
    with torch.device("meta"):
        assert 590e6 < num_parameters(Qwen3(c)) < 600e6  # Qwen3-0.6B: 596M with tied embeddings
    assert llm_tiny_policy().vocab_size == QWEN3_VOCAB_SIZE


@pytest.mark.slow
def test_grpo_step_verifies_at_the_llm_vocabulary(tmp_path, monkeypatch):
    widths = []
    verify_chain = sk.verify_chain

    def spy(logits, *args, **kwargs):
        widths.append(logits.shape[-1])
        return verify_chain(logits, *args, **kwargs)

    monkeypatch.setattr(sk, "verify_chain", spy)
    cfg = tiny_config(out=str(tmp_path), model=llm_tiny_policy(), steps=1, warm_start_steps=2, warm_start_batch=4,
                      drafter_warm_steps=1, num_val=2, num_test=2, eval_samples=1, test_samples=1,
                      prompts_per_step=1, group_size=2, max_new_tokens=8, equivalence_prompts=1,
                      equivalence_samples=4)
    summary = run(cfg)
    assert widths and set(widths) == {QWEN3_VOCAB_SIZE}  # every verification (both arms) at V = 151936
    assert summary["mean_accepted_length"] > 1
    eq = json.load(open(tmp_path / "equivalence.json"))
    assert eq["greedy_identical"]
    # a one-prompt check cannot reject the planted lossy control: underpowered, not failed
    assert summary["equivalence"] == ("pass" if eq["control_rejected"] else "underpowered")


@pytest.mark.slow
def test_gpu_rollout_dry_run_writes_the_artefact(tmp_path, capsys):
    out = tmp_path / "rl_rollout"
    assert gpu_rollout(["--device", "cpu", "--tiny", "--out", str(out), "--seeds", "3", "--repeats", "2"]) == 0
    art = json.load(open(out / ARTEFACT))
    assert art["regime"]["vocab_size"] == QWEN3_VOCAB_SIZE and art["regime"]["k"] == 3
    assert art["regime"]["temperature"] == 1.0 and art["device"] == "cpu" and art["machine"]
    assert art["command"].startswith("python -m rl_loop.experiments.gpu_rollout") and art["commit"]
    pairs = art["pairs"]
    assert len(pairs) == 6 and {p["seed"] for p in pairs} == {0, 1, 2}
    assert [p["first"] for p in pairs] == ["ar", "spec", "spec", "ar", "ar", "spec"]  # order alternated
    assert all(p["ar"]["tokens"] > 0 and p["spec"]["tokens"] > 0 for p in pairs)
    assert art["rollout_speedup"] > 0 and len(art["rollout_speedup_ci"]) == 2 and len(art["rollout_speedup_by_seed"]) == 3
    assert "rollout speedup" in capsys.readouterr().out


def test_gpu_rollout_cuda_without_a_gpu_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_rollout(["--device", "cuda", "--out", "unused"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
