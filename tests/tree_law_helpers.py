"""Shared exact-law check for the tree tests: chi-square of generated sequences against the enumerated law."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specdec_kernels.testing import toy_trees

VOCAB = 4
LENGTH = 3
NUM_SEQS = 30_000
# Family-wise false-positive budget for every law test in tests/test_tree_law.py (Bonferroni).
FAMILY_ALPHA = 1e-3
NUM_LAW_TESTS = 64
ALPHA = FAMILY_ALPHA / NUM_LAW_TESTS

TARGET, DRAFT = toy_trees.markov_tables(VOCAB, seed=11, scale=1.2, draft_noise=1.0)


def law_p_value(seqs: torch.Tensor, law: torch.Tensor) -> float:
    """p-value of a chi-square test (cells with expected count < 5 pooled); 0.0 if a zero-probability
    sequence was emitted."""
    counts = torch.bincount(toy_trees.sequence_index(seqs, VOCAB), minlength=law.numel()).double()
    expected = law * seqs.shape[0]
    if bool(((expected == 0) & (counts > 0)).any()):
        return 0.0
    big = expected >= 5
    small = (expected > 0) & ~big
    obs = counts[big].tolist()
    exp = expected[big].tolist()
    if bool(small.any()):
        obs.append(float(counts[small].sum()))
        exp.append(float(expected[small].sum()))
    obs_a, exp_a = np.array(obs), np.array(exp)
    exp_a = exp_a * obs_a.sum() / exp_a.sum()
    return float(stats.chisquare(obs_a, exp_a).pvalue)


def sequence_law_p_value(paths, tree_sampling, temperature, top_k=0, top_p=1.0, seed=0, **kwargs) -> float:
    seqs, _ = toy_trees.generate_with_trees(
        TARGET, DRAFT, paths, tree_sampling, temperature, top_k, top_p, first_token=1, length=LENGTH,
        num_seqs=NUM_SEQS, seed=seed, **kwargs,
    )
    law = toy_trees.sequence_law(toy_trees.transition_matrix(TARGET, temperature, top_k, top_p), 1, LENGTH)
    return law_p_value(seqs, law)


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Run the vectorised reference on one intra-op thread: on a shared 2-core machine extra threads
    only contend (measured 20x slower), and the results do not depend on the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
