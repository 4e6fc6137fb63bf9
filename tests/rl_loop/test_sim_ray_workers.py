"""The N-rollout-worker cost model (rl_loop/sim/ray_workers.py): straggler tail, core contention, publish."""

from __future__ import annotations

import pytest

from rl_loop.sim.ray_workers import RayCosts, contention, predict_generation, predict_publish

COSTS = RayCosts(call_s=0.002, send_s=0.0001, put_s=0.01, load_s=0.005, cores=2, threads=1)


def test_generation_is_the_slowest_share_plus_one_round_trip():
    assert predict_generation(COSTS, [0.5]) == pytest.approx(0.507)
    assert predict_generation(COSTS, [0.2, 0.3]) == pytest.approx(0.307)  # straggler, not the mean 0.25
    # three workers on two cores: each runs 1.5x slower
    assert contention(COSTS, 3) == pytest.approx(1.5)
    assert predict_generation(COSTS, [0.1, 0.2, 0.1]) == pytest.approx(0.007 + 1.5 * 0.2)


def test_publish_is_one_put_plus_one_call_per_worker():
    assert predict_publish(COSTS, 1) == pytest.approx(0.01 + 0.0001)
    assert predict_publish(COSTS, 4) - predict_publish(COSTS, 1) == pytest.approx(3 * 0.0001)
