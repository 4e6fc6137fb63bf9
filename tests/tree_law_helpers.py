"""Shared exact-law check for the tree tests: generated sequences against the enumerated law.

Alphas come from the suite-wide false-positive budget (``stats.SUITE_BUDGET``); the expected law from
``toy_models.sequence_law``; the test from ``stats.gof_test`` (pooled chi-square at these sizes).
"""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.testing import stats, toy_models, toy_trees

VOCAB = 4
LENGTH = 3
NUM_SEQS = 30_000
ALPHA = stats.SUITE_BUDGET.per_test_alpha

TARGET, DRAFT = toy_trees.markov_tables(VOCAB, seed=11, scale=1.2, draft_noise=1.0)
FIRST_TOKEN = 1


def law_p_value(seqs: torch.Tensor, temperature: float, top_k: int, top_p: float) -> float:
    """p-value of the generated sequences [R, LENGTH] against the exact autoregressive law."""
    law = toy_models.sequence_law(
        toy_models.MarkovModel(TARGET, (FIRST_TOKEN,)), LENGTH, toy_models.SamplingConfig(temperature, top_k, top_p)
    )
    counts = toy_models.sequence_histogram(seqs, VOCAB)
    return stats.gof_test(counts, law).pvalue


def sequence_law_p_value(paths, tree_sampling, temperature, top_k=0, top_p=1.0, seed=0, **kwargs) -> float:
    seqs, _ = toy_trees.generate_with_trees(
        TARGET, DRAFT, paths, tree_sampling, temperature, top_k, top_p, first_token=FIRST_TOKEN, length=LENGTH,
        num_seqs=NUM_SEQS, seed=seed, **kwargs,
    )
    return law_p_value(seqs, temperature, top_k, top_p)


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Run the vectorised reference on one intra-op thread: on a shared 2-core machine extra threads
    only contend (measured 20x slower), and the results do not depend on the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
