"""The ``search`` task family, ``--workload`` and the shape x workload x k table (``rl_loop.sim.shape_table``)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rl_loop.__main__ import parse_args
from rl_loop.config import WORKLOADS, RunConfig, tiny_config, with_workload
from rl_loop.sim import shape_table
from rl_loop.task import (
    CORRECT_REWARD,
    DEFAULT_FAMILIES,
    FORMAT_REWARD,
    Problem,
    TaskConfig,
    make_problem,
    reward,
)

pytestmark = pytest.mark.rl
torch.set_num_threads(1)

P = Problem("search", "3,5,7>22?", "7-3=4,4*5=20>5*3=15,15+7=22;22", 22, (3, 5, 7))


def test_search_traces_are_checked_try_by_try():
    assert reward(P, P.solution) == CORRECT_REWARD
    assert reward(P, "5*3=15,15+7=22;22") == CORRECT_REWARD  # straight to a solution
    assert reward(P, "3+5=8,8*7=56>3*5=15,7+15=22;22") == CORRECT_REWARD  # another failed try, another order
    assert reward(P, "7-3=4,4*5=21>5*3=15,15+7=22;22") == FORMAT_REWARD  # an arithmetic slip in a failed try
    assert reward(P, "7-3=4,4*5=20>7-3=4,4*5=20;20") == FORMAT_REWARD  # the last try misses the target
    assert reward(P, "7-3=4>5*3=15,15+7=22;22") == FORMAT_REWARD  # an abandoned try leaves numbers unused
    assert reward(P, "5*3=15,15+7=22>;22") == FORMAT_REWARD  # an empty last try reaches nothing
    countdown = Problem("countdown", P.prompt, "5*3=15,15+7=22;22", 22, (3, 5, 7))
    assert reward(countdown, P.solution) == 0.0  # tries belong to search traces only, as before


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_search_responses_vary_and_fit_the_budget(difficulty):
    rng = random.Random(difficulty)
    problems = [make_problem(rng, "search", difficulty) for _ in range(300)]
    assert all(reward(p, p.solution) == CORRECT_REWARD for p in problems)
    assert max(len(p.solution) + 1 for p in problems) <= WORKLOADS["search"][1]  # + EOS
    assert sum(">" in p.solution for p in problems) > 100  # most traces abandon a try
    # the same prompt gets different traces from different draws: the response is a free choice
    again = {make_problem(random.Random(i), "search", difficulty).solution for i in range(40)}
    assert len(again) > 30


def test_workloads_set_the_task_mix_and_keep_the_default_run():
    assert TaskConfig().families == DEFAULT_FAMILIES and "search" not in DEFAULT_FAMILIES
    d = RunConfig()
    assert with_workload(d, "default") == d
    # the CLI applies --workload to --tiny too: the default mix must keep the tiny task (difficulty 1 only)
    assert with_workload(tiny_config(), "default") == tiny_config()
    assert parse_args(["--tiny"]).task == tiny_config().task
    s = with_workload(tiny_config(), "search")
    assert s.workload == "search" and s.task.families == ("search",) and s.max_new_tokens == WORKLOADS["search"][1]
    assert s.task.num_train == tiny_config().task.num_train  # split sizes kept
    assert parse_args(["--workload", "search", "--tiny"]).task.families == ("search",)
    with pytest.raises(ValueError, match="workload"):
        with_workload(d, "poetry")
    with pytest.raises(ValueError, match="workload"):
        RunConfig(workload="poetry")


def test_cli_rejects_an_unknown_workload_in_one_line(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--workload", "poetry"])
    err = capsys.readouterr().err.strip()
    assert "--workload" in err and "\n" not in err


@pytest.mark.slow
def test_shape_table_measures_and_predicts_each_combination(tmp_path, capsys):
    out = tmp_path / "shapes"
    assert shape_table.main(["--tiny", "--policies", "default", "--workloads", "search", "--ks", "1,2",
                             "--rounds", "1", "--out", str(out)]) == 0
    data = json.loads((out / "shapes.json").read_text())
    assert data["provenance"]["command"].startswith("python -m rl_loop.sim.shape_table --tiny")
    (res,) = data["results"]
    assert res["workload"] == "search" and res["policy_preset"] == "default"
    assert res["decode_path"] in ("native", "torch")
    g = res["regime"]
    assert g["decode_s"] > 0 and g["verify_s"] > 0 and g["regime"] is not None
    assert [r["k"] for r in res["speedups"]] == [1, 2]
    for row in res["speedups"]:
        assert 1.0 <= row["tokens_per_step"] <= row["k"] + 1
        assert row["measured_speedup"] > 0 and row["predicted_speedup"] > 0
    table = (out / "shapes.md").read_text()
    assert table.count("| default |") == 2


@pytest.mark.parametrize("argv, flag", [(["--policies", "huge"], "--policies"), (["--workloads", ""], "--workloads"),
                                        (["--ks", "0"], "--ks"), (["--ks", "a"], "--ks"), (["--rounds", "0"], "--rounds")])
def test_shape_table_rejects_bad_arguments_in_one_line(argv, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        shape_table.main([*argv, "--out", str(tmp_path)])
    message = str(e.value.code) if isinstance(e.value.code, str) else capsys.readouterr().err
    assert flag in message and "\n" not in message.strip()
