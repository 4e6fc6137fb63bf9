"""Toy Markov models and drafters: exact laws and the speculative loop's bookkeeping."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.exactness.markov_models import (
    Drafter,
    MarkovModel,
    SamplingConfig,
    all_sequences,
    encode_sequences,
    random_markov,
    run_speculative,
    sequence_histogram,
    sequence_law,
    step_probs,
)


def test_sequence_law_is_the_product_of_step_laws():
    g = torch.Generator().manual_seed(1)
    model = random_markov(3, 2, g, prompt=(2, 0))
    cfg = SamplingConfig(0.7, top_k=2)
    law = sequence_law(model, 3, cfg)
    assert law.sum().item() == pytest.approx(1.0)
    seqs = all_sequences(3, 3)
    for i in (0, 5, 13, 26):
        x = seqs[i].tolist()
        ctx = [2, 0] + x
        expected = 1.0
        for t in range(3):
            expected *= step_probs(model.table[ctx[t], ctx[t + 1]][None], cfg)[0, x[t]].item()
        assert law[i].item() == pytest.approx(expected, rel=1e-6)
    assert ((law > 0).sum()) <= 2**3  # top-k 2 leaves at most 2 choices per step


def test_greedy_law_is_a_point_mass():
    model = random_markov(4, 1, torch.Generator().manual_seed(2))
    law = sequence_law(model, 4, SamplingConfig(0.0))
    assert (law > 0).sum() == 1 and law.max() == 1.0


def test_encoding_and_histogram():
    seqs = all_sequences(3, 2)
    assert torch.equal(encode_sequences(seqs, 3), torch.arange(9))
    assert torch.equal(sequence_histogram(seqs[[0, 4, 4]], 3), torch.tensor([1, 0, 0, 0, 2, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="tokens"):
        sequence_histogram(torch.tensor([[0, 3]]), 3)
    with pytest.raises(ValueError, match="table"):
        MarkovModel(torch.zeros(3, 4), (0,))


def test_drafters():
    g = torch.Generator().manual_seed(3)
    model = random_markov(5, 1, g)
    tokens = torch.tensor([[1, 2, 1, 3, 1, -1, -1, -1, -1]])
    length = torch.tensor([5])
    ngram, _ = Drafter("ngram").propose(tokens, length, 3, 5, g)
    assert ngram.tolist() == [[3, 1, 3]]  # 1 was last followed by 3; then 3 -> 1; then 1 -> 3
    none, _ = Drafter("ngram").propose(torch.tensor([[4, -1, -1]]), torch.tensor([1]), 2, 5, g)
    assert none.tolist() == [[-1, -1]]
    const, q = Drafter("constant", token=4).propose(tokens, length, 2, 5, g)
    assert const.tolist() == [[4, 4]] and q is None
    greedy, _ = Drafter("greedy", model).propose(tokens, length, 2, 5, g)
    assert greedy[0, 0] == torch.argmax(model.table[1]) and greedy[0, 1] == torch.argmax(model.table[greedy[0, 0]])
    sampled, q = Drafter("sample", model, SamplingConfig(1.0, top_k=2)).propose(tokens, length, 3, 5, g)
    assert q.shape == (1, 3, 5) and torch.allclose(q.sum(-1), torch.ones(1, 3))
    assert (q.gather(-1, sampled[..., None]) > 0).all()


@pytest.mark.parametrize("cap", [True, False])
def test_run_speculative_bookkeeping(cap):
    g = torch.Generator().manual_seed(4)
    model = random_markov(4, 1, g)
    run = run_speculative(model, Drafter("sample", model), SamplingConfig(1.0), 50, 5, 3, seed=1, cap_drafts=cap)
    assert run.tokens.shape == (50, 5) and ((run.tokens >= 0) & (run.tokens < 4)).all()
    assert run.acceptance_rate == 1.0  # q = p: every draft accepted
    again = run_speculative(model, Drafter("sample", model), SamplingConfig(1.0), 50, 5, 3, seed=1, cap_drafts=cap)
    assert torch.equal(run.tokens, again.tokens)  # seeded
    bad = run_speculative(model, Drafter("constant", token=0), SamplingConfig(1.0), 50, 5, 2, seed=1)
    assert bad.num_verify_calls >= 2 and bad.accepted <= bad.drafted
