"""min-p in ``verify_chain`` / ``verify_tree``: the law, the backends' tokens, the sampling mask, bad input.

min-p is applied once to the logits before any backend runs (``reference.sampling.min_p_logits``), so every
backend verifies the same rows; these tests check the law it gives against the exact one (the audit's min-p
cases, which before ran only on vLLM's samplers), that a verifier ignoring it is rejected, that the backends
agree token for token, that the mask leaves out what min-p dropped, and that a bad ``min_p`` names itself.
"""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import sampling_mask as sm
from specdec_kernels.audit.cases import GRID_FIRST_TOKEN_CASES, GRID_SEQUENCE_CASES, uses_min_p
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import backend_verifier, check_first_token_law, check_sequence_law
from specdec_kernels.exactness.markov_models import SamplingConfig, step_probs
from specdec_kernels.reference import sampling
from tests.conftest import DEVICE

MIN_P_FIRST = [c for c in GRID_FIRST_TOKEN_CASES if uses_min_p(c)]
MIN_P_SEQUENCE = [c for c in GRID_SEQUENCE_CASES if uses_min_p(c)]


def _without_min_p(verify):
    """A planted bug: the verifier drops ``min_p`` (what vLLM V1's rejection sampler does on draft rows)."""
    return lambda *args, **kwargs: verify(*args)


@pytest.mark.stat
@pytest.mark.slow
@pytest.mark.parametrize("case", MIN_P_FIRST + MIN_P_SEQUENCE, ids=lambda c: c.name)
def test_min_p_law(backend, case):
    """The emitted law with min-p is the exact one (temperature, then min-p, then top-k / top-p)."""
    alpha = gof.SUITE_BUDGET.claim(f"chain:{backend}:{case.name}")
    check = check_first_token_law if case in MIN_P_FIRST else check_sequence_law
    result = check(backend_verifier(backend, DEVICE), case, alpha)
    assert not result.result.rejects(alpha), f"{result.result} with n={result.num_samples}"


@pytest.mark.stat
@pytest.mark.slow
def test_ignoring_min_p_is_rejected():
    """Power: the same checks reject a verifier that ignores min-p, on every first-token case."""
    verify = _without_min_p(backend_verifier("reference"))
    for case in MIN_P_FIRST:
        check = check_first_token_law(verify, case, alpha=1e-6)
        assert check.result.rejects(1e-6), (case.name, check.result)


def test_min_p_logits_keeps_what_the_law_keeps():
    """min_p_logits drops exactly the tokens below min_p times the largest tempered probability, never the
    most likely one; min_p = 0 and greedy rows are untouched; bf16 rows keep their dtype."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 2
    temperature = torch.tensor([0.7, 1.0, 1.0, 0.0, 2.0, 1.0])
    min_p = torch.tensor([0.2, 0.5, 0.0, 0.9, 1.0, 0.05])
    out = sampling.min_p_logits(logits, temperature, min_p)
    probs = torch.softmax(logits / torch.where(temperature > 0, temperature, 1.0)[:, None], -1)
    for r in range(6):
        if temperature[r] == 0 or min_p[r] == 0:
            assert torch.equal(out[r], logits[r])
            continue
        dropped = torch.isinf(out[r])
        assert not dropped[probs[r].argmax()]
        assert torch.equal(dropped, probs[r] < min_p[r] * probs[r].max())
    assert sampling.min_p_logits(logits.bfloat16(), temperature, min_p).dtype == torch.bfloat16


def _chain_inputs(batch=6, k=3, vocab=300, seed=1):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch * (k + 1), vocab, generator=g) * 2
    draft_rows = (torch.arange(batch)[:, None] * (k + 1) + torch.arange(k)[None, :]).flatten()
    q = torch.softmax(logits[draft_rows] + torch.randn(batch * k, vocab, generator=g), -1)
    return dict(target_logits=logits, draft_token_ids=torch.multinomial(q, 1, generator=g).squeeze(1),
                cu_num_draft_tokens=torch.arange(batch + 1) * k, draft_probs=q,
                temperature=torch.tensor([1.0, 0.7, 0.0, 1.0, 1.3, 1.0]),
                top_p=torch.tensor([1.0, 0.9, 1.0, 0.95, 1.0, 1.0]),
                seed=torch.arange(batch) + 7, position=torch.arange(batch) * 11,
                min_p=torch.tensor([0.1, 0.3, 0.5, 0.0, 0.05, 0.2]))


@pytest.mark.parametrize("backend", [b for b in sk.available_backends("cpu") if b != "reference"])
def test_backends_emit_the_references_tokens_and_masks_with_min_p(backend):
    """Every backend's tokens equal the reference's with min-p, the mask of each emitted token is the kept
    set of its row's exact law (temperature, min-p, top-p; the argmax set when greedy), the emitted token is
    in it, and min_p = 0 changes nothing."""
    inputs = _chain_inputs()
    ref, _ = sk.verify_chain(**inputs, backend="reference", return_mask=True)
    res, mask = sk.verify_chain(**inputs, backend=backend, return_mask=True)
    assert torch.equal(res.output_token_ids, ref.output_token_ids) and torch.equal(res.num_accepted, ref.num_accepted)
    logits, k, kept_sets = inputs["target_logits"], 3, mask.tolist()
    for b in range(6):
        cfg = SamplingConfig(float(inputs["temperature"][b]), top_p=float(inputs["top_p"][b]),
                             min_p=float(inputs["min_p"][b]))
        assert len(kept_sets[b]) == int(res.num_accepted[b]) + 1
        for j, kept in enumerate(kept_sets[b]):
            law = step_probs(logits[b * (k + 1) + j][None], cfg)[0]  # the row that decided output token j
            assert kept == law.nonzero().flatten().tolist(), (backend, b, j)
            assert int(res.output_token_ids[b, j]) in kept
    no_min_p = {**inputs, "min_p": torch.zeros(6)}
    plain = {key: v for key, v in inputs.items() if key != "min_p"}
    assert torch.equal(sk.verify_chain(**no_min_p, backend=backend).output_token_ids,
                       sk.verify_chain(**plain, backend=backend).output_token_ids)


def test_min_p_masks_the_tree_rows_of_each_request():
    """verify_tree applies each request's min_p to its own nodes' rows: a tree whose root row min-p reduces to
    one token always emits it, on every backend, and the mask is that one token."""
    vocab = 64
    logits = torch.full((5, vocab), -4.0)
    logits[:, 9] = 4.0  # token 9 holds e^8 / (e^8 + 63) of the mass: min_p 0.5 keeps it alone
    tree = dict(target_logits=logits, node_token_ids=torch.tensor([0, 3, 0, 5, 6]),
                parent=torch.tensor([-1, 0, -1, 0, 0]), cu_num_nodes=torch.tensor([0, 2, 5]),
                temperature=torch.ones(2), seed=torch.tensor([1, 2]), min_p=torch.tensor([0.5, 0.0]))
    for backend in sk.available_backends("cpu"):
        for s in range(20):
            res, mask = sk.verify_tree(**{**tree, "seed": torch.tensor([s, s + 100])}, backend=backend,
                                       return_mask=True)
            assert int(res.output_token_ids[0, 0]) == 9, backend
            assert mask.indices[mask.indptr[0]:mask.indptr[1]].tolist() == [9]
            assert mask.indptr[mask.indptr.numel() - 1] - mask.indptr[1] == vocab  # request 1: untruncated


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([0.1, 1.5]), "min_p must be in \\[0, 1\\]"),
    (torch.tensor([-0.1, 0.2]), "min_p must be in \\[0, 1\\]"),
    (torch.tensor([float("nan"), 0.2]), "min_p must be in \\[0, 1\\]"),
    (torch.tensor([0.1]), "min_p"),
    (torch.tensor([1, 0]), "min_p"),
])
def test_bad_min_p_names_the_argument(bad, message):
    inputs = dict(target_logits=torch.randn(4, 20), draft_token_ids=torch.tensor([1, 2]),
                  cu_num_draft_tokens=torch.tensor([0, 1, 2]), temperature=torch.ones(2))
    with pytest.raises((ValueError, TypeError), match=message):
        sk.verify_chain(**inputs, min_p=bad, backend="reference")


def test_sampling_mask_module_sees_the_min_p_rows():
    """The post-pass and the kernels' thresholds give the same mask with min-p (both read the rows min-p left)."""
    from specdec_kernels import api

    inputs = _chain_inputs(seed=3)
    res, mask = sk.verify_chain(**inputs, backend="reference", return_mask=True)
    post = sm.chain_sampling_mask(api.checked_chain_args(**inputs), res)
    assert torch.equal(post.indptr, mask.indptr) and torch.equal(post.indices, mask.indices)
