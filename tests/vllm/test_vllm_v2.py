"""The V2 (CUDA model runner) adapter, tested on CPU tensors built to vLLM 0.32's ``_verify`` contract.

Limitation: vLLM's V2 runner only runs on CUDA, so these tests call :func:`v2.verify_v2` and the patched
``_verify`` directly with inputs laid out as ``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`` builds
them (rows per request = drafts + bonus, draft of row r = ``verify_draft_sampled[r + 1]``, per-state
temperature / seeds, pre-temperature ``draft_logits[state, step]``), not through a running V2 engine.
"""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from specdec_kernels.exactness.goodness_of_fit import chi2_gof  # noqa: E402
from specdec_kernels.integrations.vllm import v2  # noqa: E402

pytestmark = pytest.mark.vllm
MAX_REQS, STEPS = 8, 3


def batch(drafts: list[list[int]], states: list[int], first_pos: list[int], last_tokens: list[int]):
    """V2 tensors for requests with the given drafts, request-state indices and first positions."""
    input_ids, positions, state_of_row, local_pos, cu = [], [], [], [], [0]
    for tokens, state, pos, last in zip(drafts, states, first_pos, last_tokens, strict=True):
        row_inputs = [last, *tokens]  # row j's input token; row j verifies row_inputs[j + 1]
        input_ids += row_inputs
        positions += [pos + j for j in range(len(row_inputs))]
        state_of_row += [state] * len(row_inputs)
        local_pos += list(range(len(row_inputs)))
        cu.append(cu[-1] + len(row_inputs))
    return SimpleNamespace(
        verify_draft_sampled=torch.tensor(input_ids, dtype=torch.int64),
        pos=torch.tensor(positions, dtype=torch.int64),
        cu_num_logits=torch.tensor(cu, dtype=torch.int32),
        idx_mapping=torch.tensor(states, dtype=torch.int32),
        expanded_idx_mapping=torch.tensor(state_of_row, dtype=torch.int32),
        expanded_local_pos=torch.tensor(local_pos, dtype=torch.int32),
        num_logits=cu[-1],
    )


def call(b, logits, temperature, seeds, draft_logits=None):
    return v2.verify_v2(
        logits, draft_logits, b.verify_draft_sampled, b.cu_num_logits, b.pos, b.idx_mapping,
        b.expanded_idx_mapping, b.expanded_local_pos, temperature, seeds, STEPS, backend="reference",
    )


def test_greedy_layout_placeholders_and_shapes():
    drafts = [[4, 5, 6], [7], [], [-1, 2]]
    b = batch(drafts, states=[5, 0, 2, 7], first_pos=[10, 20, 5, 3], last_tokens=[1, 1, 1, 1])
    argmax = [4, 5, 9, 3, 7, 8, 11, 12, 2, 0]  # row argmaxes: req0 accepts 2 then emits 9; req1 accepts 7, bonus 8
    logits = torch.full((b.num_logits, 16), -5.0)
    logits[torch.arange(b.num_logits), torch.tensor(argmax)] = 5.0
    temperature = torch.zeros(MAX_REQS)
    sampled, num_sampled = call(b, logits, temperature, torch.arange(MAX_REQS))
    assert sampled.dtype == torch.int64 and sampled.shape == (4, STEPS + 1)
    assert num_sampled.dtype == torch.int32
    assert num_sampled.tolist() == [3, 2, 1, 1]
    assert sampled[0, :3].tolist() == [4, 5, 9]
    assert sampled[1, :2].tolist() == [7, 8]
    assert sampled[2, 0] == 11
    assert sampled[3, 0] == 12  # placeholder draft rejected: the target argmax


def test_seed_and_position_select_the_randomness():
    torch.manual_seed(0)
    drafts = [[3, 1], [2, 2], [0, 1]]
    b = batch(drafts, states=[1, 4, 6], first_pos=[7, 7, 30], last_tokens=[5, 5, 5])
    logits = torch.zeros(b.num_logits, 64)  # uniform: every token is noise
    temperature = torch.ones(MAX_REQS)
    seeds = torch.full((MAX_REQS,), 1234)
    out1, _ = call(b, logits, temperature, seeds)
    out2, _ = call(b, logits, temperature, seeds)
    assert torch.equal(out1, out2)  # stateless: same seed + position, same tokens
    # Requests 0 and 1 share seed and position (and a uniform target), so they draw the same token;
    # request 2 has another position, so another draw.
    assert out1[0, 0] == out1[1, 0]
    b.pos[b.cu_num_logits[2]:] -= 23  # request 2 now starts at position 7 too
    out3, _ = call(b, logits, temperature, seeds)
    assert out3[2, 0] == out1[0, 0]
    seeds[6] = 99
    assert not torch.equal(call(b, logits, temperature, seeds)[0][2], out3[2])


@pytest.mark.parametrize("with_draft_logits", [True, False])
@pytest.mark.slow
def test_first_token_follows_the_processed_target(with_draft_logits):
    """With the target at temperature 0.8 (vLLM hands over processed logits = logits / 0.8) and drafts from
    q = softmax(draft_logits / 0.8), the first emitted token of i.i.d. requests follows the target."""
    gen = torch.Generator().manual_seed(1)
    vocab, num, temp = 8, 4000, 0.8
    raw = torch.randn(vocab, generator=gen) * 2
    draft_raw = torch.randn(vocab, generator=gen) * 2
    p = torch.softmax(raw / temp, -1)
    q = torch.softmax(draft_raw / temp, -1)
    drafts = torch.multinomial(q, num * 2, replacement=True, generator=gen).view(num, 2).tolist()
    states = [i % MAX_REQS for i in range(num)]
    b = batch(drafts, states=states, first_pos=list(range(num)), last_tokens=[0] * num)
    temperature = torch.full((MAX_REQS,), temp)
    draft_logits = draft_raw.repeat(MAX_REQS, STEPS, 1) if with_draft_logits else None
    seeds = torch.arange(MAX_REQS) * 7919
    sampled, num_sampled = call(b, (raw / temp).repeat(b.num_logits, 1), temperature, seeds, draft_logits)
    counts = np.bincount(sampled[:, 0].numpy(), minlength=vocab)
    assert chi2_gof(counts, p.numpy()).pvalue > 1e-3
    assert chi2_gof(counts, q.numpy()).pvalue < 1e-6
    assert (num_sampled >= 1).all() and (num_sampled <= 3).all()


def _fake_rejection_sampler(temperature, seeds, **flags):
    states = SimpleNamespace(temperature=SimpleNamespace(gpu=temperature), seeds=SimpleNamespace(gpu=seeds))

    def apply_sampling_params(logits, *args):
        return logits * 2.0  # stands for vLLM's processing; the patch must verify what it returns

    sampler = SimpleNamespace(apply_sampling_params=apply_sampling_params, sampling_states=states)
    defaults = dict(synthetic_conditional_rates=None, use_block_verification=False, watermark_key=None)
    defaults.update(flags)
    return SimpleNamespace(sampler=sampler, num_speculative_steps=STEPS, **defaults)


def test_patched_verify_uses_vllms_processed_logits():
    torch.manual_seed(2)
    b = batch([[1, 2], [3]], states=[3, 1], first_pos=[4, 9], last_tokens=[0, 0])
    logits = torch.randn(b.num_logits, 16)
    temperature, seeds = torch.ones(MAX_REQS), torch.arange(MAX_REQS)
    fake = _fake_rejection_sampler(temperature, seeds)
    processed, sampled, num_sampled = v2._verify(
        fake, logits, None, b.verify_draft_sampled, b.pos, b.cu_num_logits, b.idx_mapping,
        b.idx_mapping.numpy(), b.expanded_idx_mapping, b.expanded_local_pos, np.zeros(2), b.verify_draft_sampled,
    )
    assert torch.equal(processed, logits * 2.0)
    expected = v2.verify_v2(logits * 2.0, None, b.verify_draft_sampled, b.cu_num_logits, b.pos, b.idx_mapping,
                            b.expanded_idx_mapping, b.expanded_local_pos, temperature, seeds, STEPS)
    assert torch.equal(sampled, expected[0]) and torch.equal(num_sampled, expected[1])


@pytest.mark.parametrize("flag", [dict(use_block_verification=True), dict(watermark_key=7),
                                  dict(synthetic_conditional_rates=torch.ones(STEPS)),
                                  dict(fly_window_size=4)])  # vLLM 0.33's lossy FLy acceptance
def test_other_methods_run_vllms_original(monkeypatch, flag):
    fake = _fake_rejection_sampler(torch.ones(MAX_REQS), torch.zeros(MAX_REQS), **flag)
    monkeypatch.setattr(v2, "ORIGINAL", [lambda *args: ("original", len(args))])
    assert v2._verify(fake, *range(11)) == ("original", 12)


def _mask_rejection_sampler(temperature, seeds, top_k, cut, **flags):
    """A V2 rejection sampler asking for the sampling mask (``return_sampling_mask``); its processing keeps the
    tokens whose logit is at least ``cut`` (the rest -inf), as top-k / top-p would."""
    from vllm.config.model import PROCESSED_LOGPROBS_MODES

    states = SimpleNamespace(temperature=SimpleNamespace(gpu=temperature), seeds=SimpleNamespace(gpu=seeds),
                             top_k=SimpleNamespace(np=top_k))

    def apply_sampling_params(logits, *args):
        return torch.where(logits >= cut, logits, float("-inf"))

    sampler = SimpleNamespace(apply_sampling_params=apply_sampling_params, sampling_states=states,
                              return_sampling_mask=True, logprobs_mode=next(iter(PROCESSED_LOGPROBS_MODES)))
    fake = _fake_rejection_sampler(temperature, seeds, **flags)
    fake.sampler, fake.enable_adaptive_verification = sampler, False
    fake._get_logprobs_tensors = lambda *args: None
    fake._verify = MethodType(v2._verify, fake)
    return fake


def _input_batch(b):
    cu = b.cu_num_logits
    return SimpleNamespace(cu_num_logits=cu, cu_num_logits_np=cu.numpy().astype(np.int64), num_reqs=cu.numel() - 1,
                           idx_mapping=b.idx_mapping, idx_mapping_np=b.idx_mapping.numpy(),
                           expanded_idx_mapping=b.expanded_idx_mapping, expanded_local_pos=b.expanded_local_pos,
                           seq_lens_cpu_upper_bound=torch.zeros(cu.numel() - 1, dtype=torch.int64))


@pytest.mark.parametrize("max_chunk_logits", [100, 4])  # one chunk; chunks of whole requests (SamplingMaskTensors.cat)
def test_sampling_mask_is_the_verifiers_in_vllms_layout(monkeypatch, max_chunk_logits):
    """With ``return_sampling_mask`` on, vLLM's ``_verify_in_chunks`` (its own code) around the patched
    ``_verify`` returns ``sampling_mask_tensors`` whose ``tolists`` holds, per committed token, exactly the ids
    the processed row kept (what vLLM's ``from_logits`` would hold), the committed token among them; wider
    rows than top_k fall back to the bitmask as in vLLM."""
    rs = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.rejection_sampler")
    monkeypatch.setattr(v2, "ORIGINAL_IN_CHUNKS", [rs.RejectionSampler._verify_in_chunks])
    gen = torch.Generator().manual_seed(3)
    b = batch([[1, 2, 3], [3], [0, 5]], states=[2, 5, 0], first_pos=[4, 9, 1], last_tokens=[0, 0, 0])
    logits = torch.randn(b.num_logits, 40, generator=gen)
    top_k = np.full(MAX_REQS, 12, dtype=np.int32)
    fake = _mask_rejection_sampler(torch.ones(MAX_REQS), torch.arange(MAX_REQS), top_k, cut=0.0)
    sampled, num_sampled, logprobs, tensors = v2._verify_in_chunks(
        fake, logits, _input_batch(b), None, b.verify_draft_sampled, b.pos, max_chunk_logits, -1,
        b.verify_draft_sampled,
    )
    assert fake.sampler.return_sampling_mask and not hasattr(fake, v2._MASKS)  # restored
    assert logprobs is None and tensors.rows_per_request == STEPS + 1 and tensors.token_ids.shape[1] == 12
    lists = tensors.tolists(num_sampled.numpy())
    cu = b.cu_num_logits.tolist()
    assert lists.cu_num_generated_tokens == [0, *np.cumsum(num_sampled.numpy()).tolist()]
    kept = (logits >= 0.0)
    widest = 0
    for r in range(3):
        for j in range(int(num_sampled[r])):
            e = lists.cu_num_generated_tokens[r] + j
            ids = lists.token_ids[lists.offsets[e]:lists.offsets[e + 1]].tolist()
            assert ids == kept[cu[r] + j].nonzero().flatten().tolist()
            assert int(sampled[r, j]) in ids
            widest = max(widest, len(ids))
    assert widest > 12  # some row went through the bitmask path


def test_sampling_mask_refused_with_lossy_acceptance(monkeypatch):
    fake = _mask_rejection_sampler(torch.ones(MAX_REQS), torch.zeros(MAX_REQS), np.ones(MAX_REQS), cut=0.0,
                                   synthetic_conditional_rates=torch.ones(STEPS))
    monkeypatch.setattr(v2, "ORIGINAL_IN_CHUNKS", [lambda *args: "original"])
    with pytest.raises(ValueError, match="return_sampling_mask.*synthetic"):
        v2._verify_in_chunks(fake, *range(8))
    fake.sampler.return_sampling_mask = False
    assert v2._verify_in_chunks(fake, *range(8)) == "original"
