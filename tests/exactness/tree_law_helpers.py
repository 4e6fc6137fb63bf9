"""Shared exact-law check for the tree tests: generated sequences against the enumerated law.

Alphas come from the suite-wide false-positive budget (``gof.SUITE_BUDGET``); the expected law from
``markov_models.sequence_law``; the test from ``gof.gof_test`` (pooled chi-square at these sizes).
"""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness import markov_models, markov_trees

VOCAB = 4
LENGTH = 3
ALPHA = gof.SUITE_BUDGET.per_test_alpha

TARGET, DRAFT = markov_trees.markov_tables(VOCAB, seed=11, scale=1.2, draft_noise=1.0)
FIRST_TOKEN = 1


def exact_law(temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """[V ** LENGTH] exact autoregressive law of the next LENGTH tokens after FIRST_TOKEN."""
    return markov_models.sequence_law(
        markov_models.MarkovModel(TARGET, (FIRST_TOKEN,)), LENGTH, markov_models.SamplingConfig(temperature, top_k, top_p)
    )


def sequence_law_p_value(paths, tree_sampling, temperature, top_k=0, top_p=1.0, seed=0, **kwargs) -> float:
    """Generate sequences by tree speculation and test them against the exact law. The sample size is
    the suite's standard: the smallest that detects any total-variation error of 0.02 with power 0.999
    at the per-test alpha (53k-91k sequences here)."""
    law = exact_law(temperature, top_k, top_p)
    seqs, _ = markov_trees.generate_with_trees(
        TARGET, DRAFT, paths, tree_sampling, temperature, top_k, top_p, first_token=FIRST_TOKEN, length=LENGTH,
        num_seqs=gof.sample_size(law, ALPHA), seed=seed, **kwargs,
    )
    return gof.gof_test(markov_models.sequence_histogram(seqs, VOCAB), law).pvalue


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Run the vectorised reference on one intra-op thread: on a shared 2-core machine extra threads
    only contend (measured 20x slower), and the results do not depend on the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
