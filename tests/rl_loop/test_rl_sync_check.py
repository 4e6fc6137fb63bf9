"""Weight-sync check (rl_loop/step/weight_fingerprint.py) on the in-process engine, and the acceptance-collapse
warning (rl_loop/run/reports.py). Ray workers: test_rl_ray.py; vLLM: test_rl_vllm.py.

- the fingerprint is exact for one dtype (one ulp, a swap of two elements, a shape all differ) and keeps
  the stated tolerance across a dtype conversion (bf16 of the same weights passes, a 1 % change fails);
- the in-process engine passes a correct sync for every drafter and decode path, and a planted missed
  sync (the drafter's shared weights, the policy's fused copy, the native decode copy) raises
  ``WeightSyncError`` naming the role, the tensor, the copy and the version;
- ``python -m rl_loop`` stops on a planted missed sync with one line naming the tensor (no traceback);
- the collapse warning fires on a planted collapse (the drafter's LM head negated mid-run) naming the step
  and the weights version, and not on the normal steps before it.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
import torch

from rl_loop.__main__ import main
from rl_loop.config import tiny_config
from rl_loop.run.reports import AcceptanceCollapseWarning, check_acceptance
from rl_loop.run.state import RunState
from rl_loop.step import engine as engine_module
from rl_loop.step import learn as learn_module
from rl_loop.step import weight_fingerprint
from rl_loop.step.drafting import build_drafter
from rl_loop.step.engine import RolloutEngine, resolve_decode_path
from rl_loop.step.weight_fingerprint import (
    WeightSyncError,
    deinterleave_heads,
    differs,
    fingerprint,
    require_all,
    tensor_print,
    trainer_prints,
    verify,
)
from rl_loop.train import run
from specdec_kernels.drafters import training as drafter_training
from specdec_kernels.models import ModelConfig, Qwen3
from specdec_kernels.reference.decoder_step import interleave_heads

pytestmark = [pytest.mark.rl]
CFG = ModelConfig(num_hidden_layers=3, intermediate_size=64)
EOS = 2
DECODE_PATHS = ["torch"] + (["native"] if resolve_decode_path("auto", True) == "native" else [])


def _weights(seed: int = 0) -> torch.Tensor:
    return torch.randn(64, 48, generator=torch.Generator().manual_seed(seed)) * 0.05


def _update(module: torch.nn.Module, seed: int) -> None:
    """An optimizer step's worth of change to every parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)


def test_fingerprint_is_exact_for_one_dtype():
    w = _weights()
    assert differs(tensor_print(w), tensor_print(w.clone())) is None
    assert differs(tensor_print(w), tensor_print(w.t().contiguous().t())) is None  # layout does not matter
    one_ulp = w.clone()
    one_ulp[3, 5] = torch.nextafter(one_ulp[3, 5], torch.tensor(1.0))
    assert "bits differ" in differs(tensor_print(w), tensor_print(one_ulp))
    swapped = w.clone()
    swapped[[0, 1]] = w[[1, 0]]  # the same values, two rows exchanged: only the index-weighted sums see it
    assert tensor_print(swapped).word_sums[0] == tensor_print(w).word_sums[0]
    assert differs(tensor_print(w), tensor_print(swapped)) is not None
    assert "shape" in differs(tensor_print(w), tensor_print(w.reshape(48, 64)))
    # integer buffers (a drafter's d2t) are not fingerprinted; float tensors keep their names
    assert set(fingerprint({"a": w, "d2t": torch.zeros(4, dtype=torch.long)})) == {"a"}


def test_fingerprint_tolerance_only_across_a_dtype_conversion():
    w = _weights()
    assert differs(tensor_print(w), tensor_print(w.bfloat16())) is None  # bf16 rounding of the same weights
    assert differs(tensor_print(w), tensor_print(w.half())) is None
    moved = (w * 1.01).bfloat16()
    assert "beyond bfloat16 rounding of float32" in differs(tensor_print(w), tensor_print(moved))
    assert differs(tensor_print(w), tensor_print(w.bfloat16().float())) is not None  # float32 both: exact


def test_sums_are_exact_integers_across_chunks():
    """A tensor longer than one chunk of the cached patterns: the word sums equal int64 arithmetic."""
    n = weight_fingerprint._CHUNK + 1001
    t = torch.randn(n, generator=torch.Generator().manual_seed(3))
    words = t.view(torch.int16).long()
    pattern = torch.arange(words.numel()) % weight_fingerprint.WORD_PERIOD + 1
    printed = tensor_print(t)
    assert printed.word_sums == (int(words.sum()), int((words * pattern).sum()))
    x, w = t.double(), (torch.arange(n) % weight_fingerprint.FLOAT_PERIOD + 1).double()
    assert printed.sums[1] == pytest.approx(float((x * w).sum()), rel=1e-9, abs=1e-9)


def test_require_all_names_a_tensor_not_served():
    expected = {"policy": fingerprint({"a.weight": _weights(0)}), "drafter": fingerprint({"fc.weight": _weights(1)})}
    with pytest.raises(WeightSyncError, match=r"weights version 0 \(initial\): drafter tensor fc\.weight is not "
                                              r"served by vLLM"):
        require_all(expected, {"policy": expected["policy"]}, 0, "vLLM")
    require_all(expected, expected, 0, "vLLM")


def test_deinterleave_inverts_interleave():
    w = _weights()
    assert torch.equal(deinterleave_heads(interleave_heads(w, 16), 16), w)
    v = torch.arange(16.0)
    assert torch.equal(deinterleave_heads(interleave_heads(v, 16), 16), v)


def test_verify_names_role_tensor_copy_and_version():
    w = {"x.weight": _weights(0), "y.weight": _weights(1)}
    expected = {"policy": fingerprint(w), "drafter": {}}
    verify(expected, {"policy": fingerprint({k: v.clone() for k, v in w.items()})}, 3, "here")
    stale = {"x.weight": w["x.weight"], "y.weight": _weights(2)}
    with pytest.raises(WeightSyncError, match=r"weights version 3 \(after step 2\): policy tensor y\.weight "
                                              r"served by here differs"):
        verify(expected, {"policy": fingerprint(stale)}, 3, "here")


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "draft_model"])
@pytest.mark.parametrize("decode", DECODE_PATHS)
def test_engine_passes_a_correct_sync(kind, decode):
    torch.manual_seed(0)
    policy = Qwen3(CFG).eval()
    drafter = build_drafter(kind, policy, 0)
    engine = RolloutEngine(policy, drafter, EOS, decode)
    for version in (1, 2):
        _update(policy, version)
        _update(drafter.trainable(), 10 + version)
        engine.sync(version)  # no error: every served copy is the trainer's
    assert engine.version == 2


def test_engine_planted_missed_drafter_sync(monkeypatch):
    torch.manual_seed(0)
    policy = Qwen3(CFG).eval()
    engine = RolloutEngine(policy, build_drafter("eagle3", policy, 0), EOS)
    _update(policy, 1)
    monkeypatch.setattr(engine_module, "sync_shared_weights", lambda head, policy: None)  # the shared embedding
    with pytest.raises(WeightSyncError, match=r"weights version 1 \(after step 0\): drafter tensor "
                                              r"embed_tokens\.weight served by the in-process engine \(drafter "
                                              r"head\) differs from the trainer's"):
        engine.sync(1)


@pytest.mark.parametrize("decode", DECODE_PATHS)
def test_engine_planted_missed_policy_sync(decode, monkeypatch):
    torch.manual_seed(0)
    policy = Qwen3(CFG).eval()
    engine = RolloutEngine(policy, build_drafter("eagle3", policy, 0), EOS, decode)
    _update(policy, 1)
    if decode == "native":  # the fused copy is refreshed; the native decode path's packed copy is not
        monkeypatch.setattr(engine.policy_step, "sync", lambda: None)
        copy = "native decode weights"
    else:
        monkeypatch.setattr(policy, "sync_inference_weights", lambda: None)
        copy = "fused inference weights"
    with pytest.raises(WeightSyncError, match=rf"weights version 5 \(after step 4\): policy tensor "
                                              rf"model\.layers\.0\.self_attn\.q_proj\.weight served by the "
                                              rf"in-process engine \({copy}\)"):
        engine.sync(5)


def test_expected_drafter_takes_the_shared_weights_from_the_policy():
    policy = Qwen3(CFG)
    drafter = build_drafter("mtp", policy, 0)
    with torch.no_grad():
        drafter.head.embed_tokens.weight.zero_()  # stale in the trainer's head: the policy's is what must serve
    prints = trainer_prints(policy.state_dict(), drafter)
    emb = tensor_print(policy.get_input_embeddings().weight)
    assert prints["drafter"]["embed_tokens.weight"] == emb and prints["drafter"]["lm_head.weight"] == emb


def test_collapse_warning_on_a_planted_collapse_only():
    state = RunState()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning on a normal step fails the test
        for step, rates in enumerate([[0.8, 0.6, 0.4], [0.5, 0.2, 0.0], [0.9, 0.7, 0.5], [0.1, 0.0, 0.0]]):
            assert not check_acceptance(state, step, step, rates)  # 0.1 is not below a tenth of 0.9
    with pytest.warns(AcceptanceCollapseWarning, match=r"collapsed at step 4 \(weights version 4\): per "
                                                       r"position \[0\.000, 0\.000, 0\.000\], \[0\.100"):
        assert check_acceptance(state, 4, 4, [0.0, 0.0, 0.0])
    assert state.last_acceptance == [0.0, 0.0, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not check_acceptance(state, 5, 5, [0.0, 0.0, 0.0])  # no rate to collapse from


def _plant_missed_sync(role: str | None, monkeypatch) -> None:
    """drafter: the shared embedding never reaches the drafter (neither the engine's sync nor the drafter
    trainer's); policy: every refresh of the fused inference weights after the engine's first is skipped.
    Every step also moves the policy (``--tiny``'s first groups are all-equal and GRPO keeps none of them,
    so without it there would be no update to miss)."""
    adapt = learn_module.adapt_drafter

    def moved(s, step, prompts, rollouts):
        _update(s.policy, 100 + step)
        return adapt(s, step, prompts, rollouts)

    monkeypatch.setattr(learn_module, "adapt_drafter", moved)
    if role is None:  # the update alone: every sync is made
        return
    if role == "drafter":
        monkeypatch.setattr(engine_module, "sync_shared_weights", lambda head, policy: None)
        monkeypatch.setattr(drafter_training, "sync_shared_weights", lambda head, policy: None)
        return
    original = Qwen3.sync_inference_weights

    def first_only(self):
        if not getattr(self, "planted_synced", False):
            self.planted_synced = True
            original(self)

    monkeypatch.setattr(Qwen3, "sync_inference_weights", first_only)


@pytest.mark.slow
@pytest.mark.parametrize("role, tensor", [("drafter", "embed_tokens.weight"),
                                          ("policy", "model.layers.0.self_attn.q_proj.weight")])
def test_cli_stops_on_a_missed_sync_with_one_line(role, tensor, tmp_path, monkeypatch, capsys):
    _plant_missed_sync(role, monkeypatch)
    out = tmp_path / "run"
    code = main(["--tiny", "--steps", "2", "--no-plots", "--no-equivalence", "--threads", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"python -m rl_loop: error: weight sync check failed at weights version 1 (after "
                             f"step 0): {role} tensor {tensor} served by the in-process engine"), err[0]
    assert not (out / "summary.json").exists()  # stopped: the run did not go on with stale weights


@pytest.mark.slow
def test_cli_run_with_every_sync_made_passes_the_check(tmp_path, monkeypatch, capsys):
    _plant_missed_sync(None, monkeypatch)  # the same moving policy, nothing missed
    out = tmp_path / "run"
    assert main(["--tiny", "--steps", "2", "--no-plots", "--no-equivalence", "--threads", "1", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_run_warns_on_a_planted_acceptance_collapse_not_before(tmp_path, monkeypatch):
    """The drafter's LM head negated before step 2's rollouts (trainer and server alike, so the weight check
    passes): it proposes what it thinks least likely and the acceptance collapses."""
    generate = RolloutEngine.generate

    def planted(self, prompts, seeds, config, strategy=None):
        if config.spec != "none" and self.version == 2 and not getattr(self, "planted", False):
            self.planted = True
            with torch.no_grad():
                self.drafter.head.lm_head.weight.mul_(-50.0)
        return generate(self, prompts, seeds, config, strategy)

    monkeypatch.setattr(RolloutEngine, "generate", planted)
    cfg = replace(tiny_config(out=str(tmp_path / "run")), steps=3, equivalence=False, plots=False, num_threads=1,
                  drafter_adapt_steps=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(cfg)
    collapses = [w for w in caught if issubclass(w.category, AcceptanceCollapseWarning)]
    assert len(collapses) == 1 and "at step 2 (weights version 2)" in str(collapses[0].message)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "event" not in r]
    assert [r["weights_version"] for r in steps] == [0, 1, 2]
    assert [r.get("acceptance_collapse", False) for r in steps] == [False, False, True]
    assert all(len(r["acceptance_by_position"]) == cfg.k for r in steps)
