"""The peers' designs (specdec_kernels/exactness/peer_suites.py): each passes a correct backend and rejects a
known-lossy planted bug at a small seeded size; the DeepSpec design's negative control has its stated power."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from specdec_kernels.exactness import chain_mutants, peer_suites
from specdec_kernels.exactness.chain_law import backend_verifier

SMALL_V2 = peer_suites.VllmV2Sizes(wide_vocab=64, narrow_trials=4_000)
SMALL_DEEPSPEC = peer_suites.DeepSpecSizes(rounds=4_000)


def test_pooled_chi2_pools_small_cells_and_fails_invalid_tokens():
    law = torch.tensor([0.5, 0.3, 0.15, 0.04, 0.01], dtype=torch.float64)
    tokens = torch.tensor([0] * 50 + [1] * 30 + [2] * 15 + [3] * 4 + [4] * 1)
    chi2, df = peer_suites.pooled_chi2(tokens, law)
    assert (chi2, df) == (pytest.approx(0.0), 3)  # cells 3 and 4 (expected 4 and 1) pooled into one of 5
    assert peer_suites.pooled_chi2(torch.tensor([0, 5]), law)[0] == math.inf
    assert peer_suites.pooled_chi2(torch.tensor([0, -1]), law)[0] == math.inf
    assert peer_suites.pooled_chi2(torch.empty(0, dtype=torch.int64), law) == (0.0, 0)


def test_ten_sigma_threshold_is_vllms():
    assert peer_suites.ten_sigma_threshold(15) == pytest.approx(69.77, abs=0.01)  # PR #54282's 69.8


def test_correct_backend_passes_both_designs():
    v2 = peer_suites.vllm_v2_suite(backend_verifier("cpu"), SMALL_V2)
    assert not v2.caught, [t for t in v2.tests if t.rejects]
    assert [t.name for t in v2.tests][-2:] == ["narrow-V16-reversed-pos0", "narrow-V16-reversed-pos1"]
    assert v2.trials == 6 * 640 + 4_000
    deepspec = peer_suites.deepspec_pr48_suite(backend_verifier("cpu"), SMALL_DEEPSPEC)
    assert not deepspec.caught
    assert deepspec.control is not None and deepspec.control.rejects  # the control must fail a lossless verifier
    assert len(deepspec.tests) == SMALL_DEEPSPEC.steps + 1


def test_designs_reject_a_lossy_mutant_and_stop_there():
    bad = chain_mutants.mutant_verifier("ratio_inverted")
    v2 = peer_suites.vllm_v2_suite(bad, peer_suites.VllmV2Sizes(wide_vocab=64, wide_configs=((1, 0.6), (3, 0.6))),
                                   stop_at_first_rejection=True)
    assert v2.caught and v2.rejecting.name.startswith("wide-V64-k1-T0.6")
    assert not any(t.name.startswith("narrow") for t in v2.tests)  # stopped at the first rejection
    deepspec = peer_suites.deepspec_pr48_suite(bad, peer_suites.DeepSpecSizes(rounds=300),
                                               stop_at_first_rejection=True)
    assert deepspec.caught and deepspec.control is None


def test_greedy_test_sees_a_sampled_greedy_request():
    run = peer_suites.vllm_v2_suite(chain_mutants.mutant_verifier("greedy_sampled"),
                                    peer_suites.VllmV2Sizes(wide_vocab=32, wide_configs=(), narrow_trials=100),
                                    stop_at_first_rejection=True)
    assert run.rejecting.name == "greedy-V32-k1" and run.rejecting.statistic > 0


@pytest.mark.slow
def test_narrow_test_sees_the_shared_stream():
    """The shared-stream bug needs the drafts drawn inside the system: the narrow test sees it, the wide test
    (drafts drawn outside) does not."""
    run = peer_suites.vllm_v2_suite(chain_mutants.mutant_verifier("shared_stream"),
                                    peer_suites.VllmV2Sizes(wide_vocab=64, narrow_trials=20_000))
    assert [t.name for t in run.tests if t.rejects] == ["narrow-V16-reversed-pos0"]


def test_deepspec_control_has_the_prs_noncentrality_and_power():
    for sizes in (peer_suites.DEEPSPEC_PR48_SIZES, SMALL_DEEPSPEC):
        weight, noncentrality = peer_suites.deepspec_control(sizes)
        assert 0 < weight < 1 and noncentrality == pytest.approx(peer_suites.DEEPSPEC_CONTROL_NONCENTRALITY)
        critical = stats.chi2.isf(peer_suites.DEEPSPEC_FALSE_ALARM, sizes.vocab - 1)
        assert stats.ncx2.sf(critical, sizes.vocab - 1, noncentrality) > 0.999


def test_wide_design_runs_in_chunks_with_distinct_keys(monkeypatch):
    """Chunking (a full-size wide test does not fit in memory at once) changes no token."""
    whole = peer_suites.vllm_v2_suite(backend_verifier("cpu"), SMALL_V2)
    monkeypatch.setattr(peer_suites, "MAX_CHUNK_ENTRIES", 64 * 4 * 100)
    chunked = peer_suites.vllm_v2_suite(backend_verifier("cpu"), SMALL_V2)
    assert [t.statistic for t in whole.tests] == [t.statistic for t in chunked.tests]
