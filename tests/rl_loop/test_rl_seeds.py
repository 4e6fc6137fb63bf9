"""rl_loop.experiments.seeds: AR vs speculative training from one warm start per seed, paired tests, outputs."""

from __future__ import annotations

import json

import pytest

from rl_loop.experiments.seeds import main, paired_p

pytestmark = pytest.mark.rl


def _wilcoxon_p(a: list[float], b: list[float]) -> float:
    """scipy's two-sided Wilcoxon signed-rank p-value of the pairs; 1.0 for equal curves (nothing to rank)."""
    from scipy.stats import wilcoxon

    return 1.0 if a == b else float(wilcoxon(a, b).pvalue)


def test_paired_p_detects_a_shift_and_accepts_equal_curves():
    a = [0.1 * i for i in range(20)]
    assert paired_p(a, list(a)) == 1.0
    assert paired_p(a, [x + 0.05 + 0.001 * i for i, x in enumerate(a)]) < 1e-3
    noisy = [x + (0.01 if i % 2 else -0.01) for i, x in enumerate(a)]
    assert paired_p(a, noisy) > 0.5


@pytest.mark.slow
def test_tiny_seed_comparison_writes_curves_and_pvalues(tmp_path):
    out = tmp_path / "seeds"
    assert main(["--tiny", "--seeds", "0", "--steps", "2", "--out", str(out)]) == 0
    summary = json.load(open(out / "seeds.json"))
    (seed,) = summary["seeds"]
    assert seed["seed"] == 0 and len(seed["ar"]["reward"]) == len(seed["spec"]["reward"]) == 2
    # the p-values are scipy's Wilcoxon signed-rank test of the curves written beside them
    assert seed["wilcoxon_p"] == pytest.approx(_wilcoxon_p(seed["ar"]["reward"], seed["spec"]["reward"]))
    assert summary["pooled_wilcoxon_p"] == pytest.approx(seed["wilcoxon_p"])  # one seed: its pairs are the pool
    assert (out / "seeds.png").exists()


def test_seed_comparison_rejects_too_few_steps(tmp_path):
    with pytest.raises(ValueError, match="--steps"):
        main(["--tiny", "--seeds", "0", "--steps", "1", "--out", str(tmp_path)])
