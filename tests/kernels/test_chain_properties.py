"""Exact (non-statistical) properties of chain verification, for every backend in the suite.

Greedy output is token-identical to argmax autoregression; a request's output does not depend on the
rest of its batch; hypothesis-drawn inputs (ragged, k = 0, empty batch, placeholders, q(x) = 0, p = q,
one-hot p, V not a power of two, NaN/inf logits) give well-formed outputs; bad arguments raise errors
that name the argument.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec_kernels as sk
from specdec_kernels.exactness.bad_inputs import BAD_ARGUMENTS, valid_call
from specdec_kernels.exactness.chain_law import backend_verifier
from specdec_kernels.exactness.markov_models import Drafter, SamplingConfig, random_markov, run_speculative
from specdec_kernels.reference.sampling import greedy_logits
from tests.conftest import DEVICE, INTERPRETED_TRITON, STAT_BACKENDS
from tests.harness.chain_input_strategies import ChainInputs, chain_inputs

# Fewer examples when the (slow) Triton interpreter is among the backends.
MAX_EXAMPLES = 25 if "triton" in STAT_BACKENDS and INTERPRETED_TRITON else 100
HYPOTHESIS = settings(
    max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def run(backend: str, inputs: ChainInputs) -> sk.ChainResult:
    return backend_verifier(backend, DEVICE)(*inputs.args())


def check_well_formed(inputs: ChainInputs, res: sk.ChainResult) -> None:
    """Shapes, dtypes, accepted prefix = drafts, one emitted token in [0, V), -1 padding after it."""
    ks = inputs.num_drafts
    batch, vocab = len(ks), inputs.vocab_size
    width = max(ks, default=0) + 1
    out, acc = res.output_token_ids, res.num_accepted
    assert out.dtype == torch.int32 and acc.dtype == torch.int32
    assert tuple(out.shape) == (batch, width) and tuple(acc.shape) == (batch,)
    cu = inputs.cu_num_draft_tokens.tolist()
    drafts = inputs.draft_token_ids.to(torch.int64)
    for b in range(batch):
        n = int(acc[b])
        assert 0 <= n <= ks[b]
        assert torch.equal(out[b, :n].to(torch.int64), drafts[cu[b] : cu[b] + n])
        assert (drafts[cu[b] : cu[b] + n] >= 0).all()  # placeholders are never accepted
        assert 0 <= int(out[b, n]) < vocab
        assert (out[b, n + 1 :] == -1).all()


def greedy_reference(inputs: ChainInputs) -> tuple[list[list[int]], list[int]]:
    """Expected (tokens, num_accepted) of all-greedy requests by a plain loop over rows."""
    argmax = torch.argmax(greedy_logits(inputs.target_logits), dim=-1).tolist()
    cu = inputs.cu_num_draft_tokens.tolist()
    drafts = inputs.draft_token_ids.tolist()
    tokens, accepted = [], []
    for b, k in enumerate(inputs.num_drafts):
        seq, n = [], 0
        while n < k and drafts[cu[b] + n] == argmax[cu[b] + b + n]:
            seq.append(drafts[cu[b] + n])
            n += 1
        seq.append(argmax[cu[b] + b + n])
        tokens.append(seq)
        accepted.append(n)
    return tokens, accepted


# ----------------------------------------------------------------------------------------------------
# Hypothesis properties
# ----------------------------------------------------------------------------------------------------

@given(data=st.data())
@HYPOTHESIS
@pytest.mark.slow
def test_properties(backend, data):
    inputs = data.draw(chain_inputs())
    res = run(backend, inputs)
    check_well_formed(inputs, res)
    out, acc = res.output_token_ids, res.num_accepted
    greedy = (inputs.temperature == 0).tolist()
    exp_tokens, exp_acc = greedy_reference(inputs)
    for b, k in enumerate(inputs.num_drafts):
        if greedy[b]:  # greedy requests: exactly argmax verification
            assert int(acc[b]) == exp_acc[b]
            assert out[b, : exp_acc[b] + 1].tolist() == exp_tokens[b]
        elif inputs.q_kind == "equals_p" and inputs.logit_kind != "nonfinite":
            assert int(acc[b]) == k  # p = q: every draft is accepted
        if inputs.logit_kind == "one_hot":  # one-hot p: every emitted token is the hot token of its row
            first_row = int(inputs.cu_num_draft_tokens[b]) + b
            hot = inputs.hot[first_row : first_row + int(acc[b]) + 1]
            assert out[b, : int(acc[b]) + 1].tolist() == hot.tolist()
    assert torch.equal(run(backend, inputs).output_token_ids, out)  # deterministic for fixed seeds


@given(data=st.data())
@HYPOTHESIS
@pytest.mark.slow
def test_batch_invariance(backend, data):
    """Each request's output alone equals its row in the batch (and in the batch reversed)."""
    inputs = data.draw(chain_inputs(max_batch=5))
    res = run(backend, inputs)
    width = res.output_token_ids.shape[1]
    for b in range(len(inputs.num_drafts)):
        alone = run(backend, inputs.request(b))
        n = alone.output_token_ids.shape[1]
        assert torch.equal(alone.output_token_ids[0], res.output_token_ids[b, :n])
        assert (res.output_token_ids[b, n:width] == -1).all()
        assert int(alone.num_accepted[0]) == int(res.num_accepted[b])


def test_batch_invariance_shuffled_batches(backend):
    """Requests keep their outputs when re-batched in random subsets and orders."""
    g = torch.Generator().manual_seed(5)
    # A fixed 12-request batch mixing greedy/random, stochastic drafts, top-k/top-p, k = 0..4.
    b, v = 12, 11
    ks = torch.randint(0, 5, (b,), generator=g)
    cu = torch.zeros(b + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(ks, 0)
    t = int(cu[-1])
    full = ChainInputs(
        torch.randn(t + b, v, generator=g) * 2, torch.randint(-1, v, (t,), generator=g), cu,
        torch.softmax(torch.randn(t, v, generator=g), -1),
        torch.where(torch.rand(b, generator=g) < 0.3, 0.0, 0.2 + torch.rand(b, generator=g)),
        torch.randint(0, v, (b,), generator=g, dtype=torch.int32), 0.5 + 0.5 * torch.rand(b, generator=g),
        torch.randint(0, 2**40, (b,), generator=g), torch.randint(0, 1000, (b,), generator=g), "normal", "random", None,
    )
    ref = run(backend, full)
    singles = [full.request(i) for i in range(b)]
    for trial in range(4):
        idx = torch.randperm(b, generator=g)[: 3 + 3 * trial].tolist()
        parts = [singles[i] for i in idx]
        cu_sub = torch.zeros(len(parts) + 1, dtype=torch.int64)
        cu_sub[1:] = torch.cumsum(torch.tensor([p.num_drafts[0] for p in parts]), 0)
        sub = ChainInputs(
            torch.cat([p.target_logits for p in parts]), torch.cat([p.draft_token_ids for p in parts]), cu_sub,
            torch.cat([p.draft_probs for p in parts]), torch.cat([p.temperature for p in parts]),
            torch.cat([p.top_k for p in parts]), torch.cat([p.top_p for p in parts]),
            torch.cat([p.seed for p in parts]), torch.cat([p.position for p in parts]), "normal", "random", None,
        )
        res = run(backend, sub)
        for j, i in enumerate(idx):
            n = int(res.num_accepted[j])
            assert n == int(ref.num_accepted[i])
            assert torch.equal(res.output_token_ids[j, : n + 1], ref.output_token_ids[i, : n + 1])


# ----------------------------------------------------------------------------------------------------
# Greedy = argmax autoregression
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("drafter_kind", ["greedy", "sample", "ngram", "constant"])
@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_greedy_equals_argmax_autoregression(backend, drafter_kind, k):
    g = torch.Generator().manual_seed(100 + k)
    target = random_markov(6, 2, g, prompt=(1, 4))
    other = random_markov(6, 2, g, prompt=(1, 4))
    drafter = Drafter(drafter_kind, other if drafter_kind in ("greedy", "sample") else None, token=2)
    length = 8
    gen = run_speculative(target, drafter, SamplingConfig(0.0), 64, length, k, seed=k, verify=backend_verifier(
        backend, DEVICE))
    seq = list(target.prompt)
    for _ in range(length):
        seq.append(int(torch.argmax(target.table[seq[-2], seq[-1]])))
    expected = torch.tensor(seq[2:]).expand(64, -1)
    assert torch.equal(gen.tokens, expected)


# ----------------------------------------------------------------------------------------------------
# Edge cases stated directly
# ----------------------------------------------------------------------------------------------------

def test_empty_batch_and_all_k_zero(backend):
    verify = backend_verifier(backend, DEVICE)
    empty = verify(torch.empty(0, 7), torch.empty(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                   None, torch.empty(0), None, None, torch.empty(0, dtype=torch.int64),
                   torch.empty(0, dtype=torch.int64))
    assert tuple(empty.output_token_ids.shape) == (0, 1) and empty.num_accepted.numel() == 0
    b = 9
    logits = torch.randn(b, 7)
    res = verify(logits, torch.empty(0, dtype=torch.int64), torch.zeros(b + 1, dtype=torch.int64), None,
                 torch.zeros(b), None, None, torch.arange(b), torch.zeros(b, dtype=torch.int64))
    assert tuple(res.output_token_ids.shape) == (b, 1)
    assert torch.equal(res.output_token_ids[:, 0].long(), torch.argmax(logits, -1))
    assert (res.num_accepted == 0).all()


def test_q_zero_at_drafted_token_is_accepted_when_p_positive(backend):
    """accept iff coin * q(x) < p(x): q(x) = 0 < p(x) always accepts (min(1, p/q) = 1)."""
    b, v = 32, 5
    logits = torch.zeros(2 * b, v)
    q = torch.full((b, v), 0.25)
    q[:, 3] = 0.0
    res = backend_verifier(backend, DEVICE)(
        logits, torch.full((b,), 3), torch.arange(b + 1), q, torch.ones(b), None, None, torch.arange(b),
        torch.zeros(b, dtype=torch.int64))
    assert (res.num_accepted == 1).all()


def test_draft_outside_truncated_support_is_rejected(backend):
    """A draft token removed by top-k has p = 0 and is never accepted, even with q = 0 there."""
    b, v = 32, 6
    logits = torch.arange(v, dtype=torch.float32).expand(2 * b, v).contiguous()
    q = torch.full((b, v), 1 / v)
    res = backend_verifier(backend, DEVICE)(
        logits, torch.zeros(b, dtype=torch.int64), torch.arange(b + 1), q, torch.ones(b),
        torch.full((b,), 2, dtype=torch.int32), None, torch.arange(b), torch.zeros(b, dtype=torch.int64))
    assert (res.num_accepted == 0).all()
    assert (res.output_token_ids[:, 0] >= v - 2).all()


# ----------------------------------------------------------------------------------------------------
# Validation: every argument's error names it
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,mutate", [(row.argument, row.mutate) for row in BAD_ARGUMENTS],
                         ids=[f"{row.argument}-{i}" for i, row in enumerate(BAD_ARGUMENTS)])
def test_validation_names_the_argument(backend, name, mutate):
    kwargs = valid_call(DEVICE)
    kwargs["backend"] = backend
    sk.verify_chain(**kwargs)  # the unmodified call is valid
    mutate(kwargs)
    with pytest.raises((ValueError, TypeError), match=name):
        sk.verify_chain(**kwargs)
