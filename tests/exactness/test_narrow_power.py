"""The narrow cases' power measurement (specdec_kernels/exactness/narrow_power.py)."""

from __future__ import annotations

import json

import pytest

from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness import narrow_power


def test_narrow_bugs_are_the_shared_stream_class():
    assert narrow_power.NARROW_BUGS == ("shared_stream", "recovery_reuses_coin", "bonus_on_recovery_stream")


def test_trials_for_power_inverts_the_power_bound():
    """At TV 0.02 the least favourable noncentrality per trial is 4 * 0.02^2: the suite's own sample size."""
    alpha = gof.SUITE_BUDGET.per_test_alpha
    n = narrow_power.trials_for_power(4 * 0.02**2, 15, alpha)
    assert n == pytest.approx(gof.sample_size_for_tv(0.02, 15, alpha), rel=0.011)
    with pytest.raises(ValueError, match="noncentrality"):
        narrow_power.trials_for_power(0.0, 15, alpha)


@pytest.mark.slow
def test_measure_finds_the_rejecting_trial_count(capsys, tmp_path):
    result = narrow_power.measure("bonus_on_recovery_stream", start=1000)
    assert result.rejecting_trials in (1000, 2000, 4000) and result.pvalue < gof.SUITE_BUDGET.per_test_alpha
    assert result.design_trials == 74153 and 0 < result.power_trials < result.design_trials
    out = tmp_path / "sub" / "narrow_power.json"
    assert narrow_power.main(["--bugs", "bonus_on_recovery_stream", "--start", "2000", "--out", str(out)]) == 0
    assert "bonus_on_recovery_stream: case narrow-deter-V16-reversed: rejects at n=" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["command"] == ("python -m specdec_kernels.exactness.narrow_power --bugs bonus_on_recovery_stream "
                                  f"--start 2000 --out {out}")
    assert written["environment"]["commit"] and written["environment"]["device"] and written["grid"]["start"] == 2000
    (row,) = written["rows"]
    assert row["bug"] == "bonus_on_recovery_stream" and row["design_trials"] == 74153
    assert (row["design_statistic"], row["power_trials"]) == (result.design_statistic, result.power_trials)
    with pytest.raises(SystemExit) as exc:
        narrow_power.main(["--bugs", "coin_reused"])
    assert exc.value.code == 2
