"""The planted-bug samplers emit fixed tokens for fixed seeds: their digests over a mixed batch are literals.

``chain_mutants.mutant_chain`` draws the Gumbel-max samples only for the rows whose own token a request emits
(the first rejected draft row, or the bonus row). Tokens must not depend on that: the digests below were taken
from the version that sampled every row (commit e1488c6), so a change to which rows are drawn that moved any
token, for any bug, fails here.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from specdec_kernels.exactness import chain_mutants

TRIALS = 96  # requests per batch: acceptance varies, so every row position is the emitted one somewhere


def _batch(vocab: int, with_probs: bool, gen_seed: int) -> tuple:
    """A batch of TRIALS requests with 0 to 3 drafts, greedy and sampled temperatures, top-k and top-p on some,
    drafts drawn from q (or uniform where q is not handed over), seeds and positions from ``gen_seed``."""
    g = torch.Generator().manual_seed(gen_seed)
    ks = torch.randint(0, 4, (TRIALS,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(ks, 0)])
    num_rows = int(ks.sum()) + TRIALS
    logits = torch.randn(num_rows, vocab, generator=g) * 2
    num_drafts = int(ks.sum())
    q = torch.softmax(torch.randn(num_drafts, vocab, generator=g) * 2, -1)
    drafts = torch.multinomial(q, 1, generator=g).squeeze(1)
    temperature = torch.tensor([0.0, 0.6, 1.0, 1.7])[torch.randint(0, 4, (TRIALS,), generator=g)]
    top_k = torch.where(torch.rand(TRIALS, generator=g) < 0.3, torch.randint(1, vocab, (TRIALS,), generator=g), 0)
    top_p = torch.where(torch.rand(TRIALS, generator=g) < 0.3, torch.full((TRIALS,), 0.8), 1.0)
    seed = torch.randint(0, 1 << 40, (TRIALS,), generator=g)
    position = torch.randint(0, 1 << 20, (TRIALS,), generator=g)
    return (logits, drafts, cu.to(torch.int32), q if with_probs else None, temperature, top_k.to(torch.int32),
            top_p, seed, position)


def digest(bug: str) -> str:
    """sha256 (first 16 hex digits) of the bug's tokens and accepted counts over four batches: V 16 and 300,
    with and without draft probabilities."""
    h = hashlib.sha256()
    verify = chain_mutants.mutant_verifier(bug)
    for vocab, with_probs, gen_seed in ((16, True, 1), (16, False, 2), (300, True, 3), (300, False, 4)):
        out = verify(*_batch(vocab, with_probs, gen_seed))
        h.update(out.output_token_ids.to(torch.int64).numpy().tobytes())
        h.update(out.num_accepted.to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


DIGESTS = {
    "unnormalised_residual": "6534c927182ece85",
    "coin_reused": "c54c1ebcb4ab2a3a",
    "draft_temperature_missing": "2e791e322808bb22",
    "bonus_wrong_row": "1e613fdbba5528a2",
    "residual_q_minus_p": "26ba4a2b106e68e2",
    "greedy_sampled": "4cb4ceffcdc93355",
    "deterministic_resample_with_draft": "cbad65f0db883e9e",
    "ratio_inverted": "e3a0ab2322790707",
    "block_max_score": "b886cdecc217d23c",
    "block_noise_reused": "2b665664594ca1b6",
    "biased_first_token": "9acf2805c62ddbb8",
    "shared_stream": "4cda921825793c44",
    "recovery_reuses_coin": "46967066bfd81d69",
    "bonus_on_recovery_stream": "ae31419479e633a6",
}
"""Taken at commit e1488c6, where ``mutant_chain`` sampled every row."""


@pytest.mark.parametrize("bug", chain_mutants.MUTANTS)
def test_mutant_tokens_are_those_of_the_version_that_sampled_every_row(bug):
    assert digest(bug) == DIGESTS[bug]
