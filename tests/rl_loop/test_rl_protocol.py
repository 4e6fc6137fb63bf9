"""Issue 21's measurement protocol: the statistics of the figures, the shared policy decode path, the
protocol figures of summary.json, the held-out split, the repeat runner and the equivalence check's power
and planted lossy control."""

from __future__ import annotations

import copy
import json
import math
import sys

import numpy as np
import pytest
import torch

from rl_loop.config import POLICY_PRESETS, default_policy, tiny_config
from rl_loop.experiments.repeat import aggregate, markdown, pooled_ci
from rl_loop.run import equivalence
from rl_loop.run.equivalence import EquivalenceConfig, check_equivalence
from rl_loop.run.intervals import (
    bootstrap_ci,
    clustered_mean,
    paired_change,
    pass_at_k,
    ratio_of_rates,
    two_sample_chi2_power,
    two_sample_size,
)
from rl_loop.run.provenance import provenance
from rl_loop.run.reports import protocol_figures
from rl_loop.run.session import heldout_report, make_test_split
from rl_loop.run.state import Comparison, RunState, WarmStartTimes
from rl_loop.step.engine import PolicyStep, RolloutEngine, resolve_decode_path
from rl_loop.step.rollouts import GenerationConfig, RolloutStats
from rl_loop.task import CharTokenizer, TaskConfig, make_splits
from specdec_kernels import native
from specdec_kernels.drafters import DraftModelDrafter
from specdec_kernels.exactness.goodness_of_fit import chi2_power
from specdec_kernels.models import KVCache, ModelConfig, Qwen3
from tests.conftest import REPO

pytestmark = pytest.mark.rl
torch.set_num_threads(1)
needs_native = pytest.mark.skipif(not native.has_op("decoder_step", "cpu"), reason="native extension not built")


# --- statistics -------------------------------------------------------------------------------------

def test_ratio_of_rates_and_its_bootstrap_interval():
    rows = [[100, 1.0, 100, 2.0], [50, 0.5, 50, 1.0], [80, 0.8, 80, 1.6]]  # every step 2x
    assert ratio_of_rates(np.array(rows, dtype=float)) == pytest.approx(2.0)
    assert bootstrap_ci(rows, ratio_of_rates) == pytest.approx([2.0, 2.0])
    noisy = [[100, 1.0, 100, t] for t in (1.5, 2.0, 2.5, 3.0)]
    lo, hi = bootstrap_ci(noisy, ratio_of_rates)
    assert 1.5 <= lo < ratio_of_rates(np.array(noisy, dtype=float)) < hi <= 3.0
    assert bootstrap_ci(noisy, ratio_of_rates) == [lo, hi]  # seeded: replays
    assert bootstrap_ci(rows[:1], ratio_of_rates) is None
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci(rows, ratio_of_rates, level=1.5)


def test_clustered_standard_error_counts_problems_not_samples():
    # 4 samples per problem, all equal within a problem: the cluster SE is the SE of 8 means, not 32 draws
    per_problem = np.repeat(np.array([[1], [0], [1], [1], [0], [1], [0], [0]]), 4, axis=1)
    c = clustered_mean(per_problem)
    iid_se = per_problem.std(ddof=1) / math.sqrt(per_problem.size)
    assert c["mean"] == 0.5 and c["se"] == pytest.approx(np.std([1, 0, 1, 1, 0, 1, 0, 0], ddof=1) / math.sqrt(8))
    assert c["se"] > 1.9 * iid_se
    assert c["ci95"][0] < 0.5 < c["ci95"][1]
    with pytest.raises(ValueError, match="per_problem"):
        clustered_mean(np.ones((1, 4)))


def test_paired_change_and_pass_at_k():
    start = np.array([[0, 0], [1, 0], [0, 0], [1, 1]])
    end = np.array([[1, 0], [1, 1], [0, 0], [1, 1]])
    ch = paired_change(start, end)
    assert ch["mean"] == pytest.approx(np.mean([0.5, 0.5, 0.0, 0.0]))
    assert ch["ci95"][0] < ch["mean"] < ch["ci95"][1]
    with pytest.raises(ValueError, match="shape"):
        paired_change(start, end[:3])
    x = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert pass_at_k(x, 1) == pytest.approx((0.25 + 0 + 1) / 3)
    assert pass_at_k(x, 4) == pytest.approx(2 / 3)
    assert pass_at_k(x, 2) == pytest.approx((0.5 + 0 + 1) / 3)  # 1 - C(3,2)/C(4,2) = 1/2
    with pytest.raises(ValueError, match="k must"):
        pass_at_k(x, 5)


def test_two_sample_power_uses_the_effective_size():
    n, tv, df, alpha = 384, 0.15, 20, 1e-3
    assert two_sample_chi2_power(n, n, tv, df, alpha) == pytest.approx(chi2_power(n / 2, tv, df, alpha))
    assert two_sample_chi2_power(n, n, tv, df, alpha) < chi2_power(n, tv, df, alpha)
    m = two_sample_size(0.1, 32, 0.01 / 11, 0.9)
    assert two_sample_chi2_power(m, m, 0.1, 32, 0.01 / 11) >= 0.9 > two_sample_chi2_power(m - 4, m - 4, 0.1, 32,
                                                                                          0.01 / 11)
    # the run's default equivalence sample (16 prompts x 160) reaches it
    assert 16 * 160 >= m
    with pytest.raises(ValueError, match="n1"):
        two_sample_chi2_power(0, 5, 0.1, 3, 0.01)


# --- the shared decode path --------------------------------------------------------------------------

@needs_native
@pytest.mark.parametrize("preset", ["default", "wide"])
def test_native_policy_step_matches_torch(preset):
    torch.manual_seed(0)
    policy = Qwen3(POLICY_PRESETS[preset]()).eval()
    policy.sync_inference_weights()
    step = PolicyStep(policy, "native")
    step.sync()
    capture = (1, 2, -1)
    c1, c2 = KVCache(policy.config, 5, 24), KVCache(policy.config, 5, 24)
    with torch.no_grad():
        ids = torch.randint(0, 32, (5, 9))
        start = torch.zeros(5, dtype=torch.long)
        (l1, h1), (l2, h2) = (f(ids, c, None, start, 9, capture=capture)
                              for f, c in ((policy.step, c1), (step, c2)))
        torch.testing.assert_close(l2, l1, atol=1e-4, rtol=1e-4)
        for a, b in zip(h1, h2, strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(c2.k, c1.k, atol=1e-4, rtol=1e-4)
        rows, start = torch.tensor([4, 0, 2]), torch.tensor([9, 7, 8])  # a subset of slots, ragged, 4 rows each
        ids = torch.randint(0, 32, (3, 4))
        l1, _ = policy.step(ids, c1, rows, start, 13)
        l2, _ = step(ids, c2, rows, start, 13)
        torch.testing.assert_close(l2, l1, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(c2.v, c1.v, atol=1e-4, rtol=1e-4)


def test_decode_path_resolution_and_errors():
    assert resolve_decode_path("torch") == "torch"
    assert resolve_decode_path("auto", qk_norm=False) == "torch"
    with pytest.raises(ValueError, match="decode path"):
        resolve_decode_path("tensorrt")
    if native.has_op("decoder_step", "cpu"):
        assert resolve_decode_path("auto") == "native"
        with pytest.raises(ValueError, match="qk_norm"):
            resolve_decode_path("native", qk_norm=False)
    with pytest.raises(ValueError, match="decode"):
        tiny_config(decode="fast")


@needs_native
def test_engine_on_native_and_torch_paths_emits_the_same_greedy_tokens():
    torch.manual_seed(1)
    policy = Qwen3(ModelConfig(num_hidden_layers=2, intermediate_size=96)).eval()
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.1)
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 10]]
    gen = GenerationConfig(max_new_tokens=10, temperature=0.0, spec="none")
    out = [RolloutEngine(policy, None, 2, decode=d).generate(prompts, [0, 1, 2], gen).response_ids
           for d in ("torch", "native")]
    assert out[0] == out[1]
    assert RolloutEngine(policy, None, 2).summary() == {"decode_path": "native"}


# --- summary.json's protocol figures ------------------------------------------------------------------

def test_protocol_figures_end_to_end_and_break_even():
    # 2 compared steps: spec 100 tokens in 1 s, AR 100 tokens in 2 s; step times 3 vs 4 s
    rows = [[100, 1.0, 100, 2.0, 3.0, 4.0, 0.0], [100, 1.0, 100, 2.0, 3.0, 4.0, 1.0]]
    c = Comparison(spec_tokens=200, spec_s=2.0, ar_tokens=200, ar_s=4.0, spec_step_s=6.0, ar_step_s=8.0,
                   adapt_s=0.4, steps=4, compared=2, per_step=rows)
    stats = RolloutStats(time_s=5.0)
    state = RunState(spec_stats=stats, comparison=c, times=WarmStartTimes(warm_start_s=10.0, drafter_warm_s=9.0))
    f = protocol_figures(state, wall_s=60.0, equivalence_s=6.0)
    assert f["rollout_speedup_ci"] == pytest.approx([2.0, 2.0])
    assert f["step_speedup_ci"] == pytest.approx([4.0 / 3.1, 4.0 / 3.1])  # adaptation amortised: 0.1 s a step
    spec_run = 60.0 - 4.0 - 6.0  # side-by-side AR rollouts and equivalence are measurement, not training
    ar_run = spec_run - 9.0 - 0.4 - 5.0 + 5.0 * 2.0
    assert f["end_to_end_speedup"] == pytest.approx(ar_run / spec_run)
    assert f["break_even_steps"] == pytest.approx(9.0 / 0.9)  # 1 s saved a step minus 0.1 s of adaptation
    assert f["ar_first_steps"] == 1 and f["compared_steps"] == 2
    slower = RunState(spec_stats=stats, comparison=Comparison(spec_tokens=1, spec_s=2.0, ar_tokens=1, ar_s=1.0,
                      spec_step_s=5.0, ar_step_s=4.0, steps=1, compared=1, per_step=[[1, 2.0, 1, 1.0, 5.0, 4.0, 0]]),
                      times=WarmStartTimes(drafter_warm_s=3.0))
    assert protocol_figures(slower, 30.0, 0.0)["break_even_steps"] is None  # never pays back


@pytest.mark.slow
def test_tiny_run_alternates_arm_order_and_writes_the_protocol_fields(tmp_path):
    from rl_loop.train import run

    summary = run(tiny_config(out=str(tmp_path), steps=2, equivalence=False))
    rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert [r["ar_first"] for r in rows if "event" not in r] == [False, True]
    assert summary["rollout_temperature"] == 1.0 and "validate=False" in summary["ar_baseline"]
    modelled = summary["end_to_end_s"]
    assert len(summary["rollout_speedup_ci"]) == 2
    assert summary["end_to_end_speedup"] == pytest.approx(modelled["ar_run_modelled"] / modelled["spec_run_modelled"])
    assert summary["compared_steps"] == 2 and len(summary["comparison_rows"]) == 2
    for key in ("test_accuracy_start", "test_accuracy_end", "test_accuracy_change", "test_greedy_accuracy_end",
                "test_pass_at_4_end", "provenance"):
        assert key in summary, key
    assert summary["provenance"]["commit"]


# --- held-out split, repeat runner ---------------------------------------------------------------------

def test_test_split_is_disjoint_from_train_and_validation_and_reproducible():
    task = TaskConfig(num_train=300, num_val=50, seed=3)
    train, val = make_splits(task)
    test = make_test_split(task, 100, train + val)
    assert len({p.prompt for p in test}) == 100
    assert not {p.prompt for p in test} & {p.prompt for p in train + val}
    assert [p.prompt for p in make_test_split(task, 100, train + val)] == [p.prompt for p in test]
    with pytest.raises(ValueError, match="num_test"):
        make_test_split(task, -1, [])
    start = {"sampled": [[0, 0], [1, 0], [0, 0]], "greedy": [[0], [1], [0]]}
    end = {"sampled": [[1, 0], [1, 1], [0, 0]], "greedy": [[1], [1], [0]]}
    r = heldout_report(start, end)
    assert r["test_accuracy_start"] == pytest.approx(1 / 6) and r["test_accuracy_end"] == pytest.approx(0.5)
    assert r["test_accuracy_change"]["mean"] == pytest.approx(1 / 3)
    assert r["test_pass_at_2_end"] == pytest.approx(2 / 3) and r["test_greedy_accuracy_end"] == pytest.approx(2 / 3)


def test_repeat_aggregate_median_range_and_pooled_interval():
    rows = [[[100, 1.0, 100, 2.0]] * 3, [[100, 1.0, 100, 3.0]] * 3, [[100, 1.0, 100, 2.5]] * 3]
    summaries = [{"rollout_speedup": v, "equivalence_pass": True, "equivalence": "pass", "wall_s": 10.0}
                 for v in (2.0, 3.0, 2.5)]
    summaries[1].update(equivalence_pass=None, equivalence="underpowered")
    agg = aggregate(summaries, rows)
    assert agg["equivalence"] == ["pass", "underpowered", "pass"]
    assert agg["equivalence_pass"] == [True, None, True]
    assert agg["rollout_speedup"]["median"] == 2.5 and agg["rollout_speedup"]["range"] == [2.0, 3.0]
    lo, hi = agg["rollout_speedup"]["pooled_ci95"]
    assert lo == pytest.approx(2.5) and hi == pytest.approx(2.5)  # every resample keeps each seed's steps
    assert agg["step_speedup"]["median"] is None
    assert "rollout_speedup | 2.5" in markdown(agg, [0, 1, 2])
    assert pooled_ci([[[1, 1, 1, 1]]], slice(0, 4)) is None


def test_repeat_splits_the_rollout_speedup_by_which_arm_ran_first():
    """Steps where the AR arm ran first give 2x here, those where speculation ran first 4x: the split reports
    each order apart (pooled, per seed, counts), so an order effect cannot hide in the pooled figure."""
    ar, spec = [100, 1.0, 100, 2.0, 0, 0, 1.0], [100, 1.0, 100, 4.0, 0, 0, 0.0]
    rows = [[ar, spec, ar, spec], [ar, ar], [spec, spec]]
    summaries = [{"rollout_speedup": 3.0, "equivalence_pass": True, "equivalence": "pass"} for _ in rows]
    split = aggregate(summaries, rows)["rollout_speedup"]["by_order"]
    assert split["ar_first"]["pooled"] == pytest.approx(2.0) and split["spec_first"]["pooled"] == pytest.approx(4.0)
    assert split["ar_first"]["steps"] == 4 and split["spec_first"]["steps"] == 4
    assert split["ar_first"]["per_seed"] == [pytest.approx(2.0), pytest.approx(2.0), None]
    assert split["spec_first"]["per_seed"] == [pytest.approx(4.0), None, pytest.approx(4.0)]
    assert split["ar_first"]["pooled_ci95"] == [pytest.approx(2.0), pytest.approx(2.0)]
    table = markdown(aggregate(summaries, rows), [0, 1, 2])
    assert "ar_first steps (4): pooled 2.000, 95 % [2.000, 2.000]; per seed 2.000, 2.000, n/a" in table
    assert "spec_first steps (4): pooled 4.000" in table


def test_provenance_names_commit_and_command_without_paths():
    p = provenance("python -m rl_loop.experiments.repeat --seeds 0")
    assert p["command"] == "python -m rl_loop.experiments.repeat --seeds 0"
    assert p["threads"] == torch.get_num_threads() and p["cores"] >= 1 and p["date"]


# --- equivalence: power and the planted lossy control ---------------------------------------------------

def _engine(noise: float) -> tuple[RolloutEngine, list, CharTokenizer]:
    torch.manual_seed(0)
    tok = CharTokenizer()
    policy = Qwen3(ModelConfig(num_hidden_layers=2, intermediate_size=96)).eval()
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.12)
    draft = copy.deepcopy(policy)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * torch.randn_like(p))
    _, val = make_splits(TaskConfig(num_train=10, num_val=4))
    return RolloutEngine(policy, DraftModelDrafter(draft), tok.eos_id), val, tok


@pytest.mark.stat
@pytest.mark.slow
def test_equivalence_requires_the_planted_lossy_control_to_be_rejected(monkeypatch):
    engine, val, tok = _engine(0.3)
    cfg = EquivalenceConfig(num_prompts=4, samples_per_prompt=100, positions=4,
                            generation=GenerationConfig(max_new_tokens=6, k=3, max_batch=128))
    res = check_equivalence(engine, val, tok, cfg)
    assert res["law_pass"] and res["greedy_identical"]
    assert res["control_rejected"] is True and res["pass"] is True and res["equivalence"] == "pass"
    assert res["negative_control"]["mean_accepted_length"] > 3.9  # the lossy verifier accepts every draft
    assert res["power"]["two_sample_power"] == pytest.approx(
        two_sample_chi2_power(400, 400, 0.1, res["power"]["df_bound"], res["alpha_per_test"]))
    # a "control" that is in fact lossless is not rejected, and then the check must not pass: the sample
    # showed no power to see a loss
    monkeypatch.setattr(equivalence, "LossyChain", equivalence.ChainSpeculation)
    res = check_equivalence(engine, val, tok, cfg)
    assert res["law_pass"] and res["control_rejected"] is False
    assert res["equivalence"] == "underpowered" and res["pass"] is None


def test_default_policy_is_the_documented_shape():
    assert (default_policy().num_hidden_layers, default_policy().hidden_size) == (12, 96)
    assert (POLICY_PRESETS["wide"]().num_hidden_layers, POLICY_PRESETS["wide"]().hidden_size) == (4, 256)
    stream = Qwen3(POLICY_PRESETS["stream"]())
    assert sum(p.numel() for p in stream.parameters()) * 4 > 4 * 32 * 2**20  # far beyond a 32 MB last-level cache


def test_provenance_takes_the_passed_commit_where_git_cannot_tell(monkeypatch):
    """A copy of the tree without .git (a lent GPU machine): the commit is $SPECDEC_GIT_COMMIT, never made up."""
    from rl_loop.run import provenance

    monkeypatch.setattr(provenance, "_git", lambda *args: None)
    monkeypatch.delenv("SPECDEC_GIT_COMMIT", raising=False)
    assert provenance.provenance("x")["commit"] is None
    monkeypatch.setenv("SPECDEC_GIT_COMMIT", "abc123def456")
    record = provenance.provenance("x")
    assert record["commit"] == "abc123def456" and record["dirty"] is None


def test_provenance_dirty_means_code_changed_not_results(monkeypatch, tmp_path):
    """A rerun into committed results (the default run's seed1 after seed0 was rewritten) records a clean tree;
    a change outside ``results/`` (code, docs) still reads dirty, staged or not."""
    import subprocess

    from rl_loop.run import provenance

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "results" / "run").mkdir(parents=True)
    (tmp_path / "code").mkdir()
    (tmp_path / "results" / "run" / "summary.json").write_text("{}")
    (tmp_path / "code" / "train.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "start")
    monkeypatch.setattr(provenance, "HERE", str(tmp_path / "code"))
    assert provenance.provenance("x")["dirty"] is False
    (tmp_path / "results" / "run" / "summary.json").write_text('{"rewritten": 1}')
    assert provenance.provenance("x")["dirty"] is False
    (tmp_path / "code" / "train.py").write_text("x = 2\n")
    assert provenance.provenance("x")["dirty"] is True
    git("add", "code/train.py")
    assert provenance.provenance("x")["dirty"] is True


@pytest.mark.parametrize("path, module", [
    ("rl_loop/__main__.py", "rl_loop"),
    ("rl_loop/experiments/verify_bench.py", "rl_loop.experiments.verify_bench"),
    ("rl_loop/sim/__main__.py", "rl_loop.sim"),
])
def test_provenance_names_the_module_python_m_ran(monkeypatch, path, module):
    """The recorded command is the dotted module of the file ``python -m`` ran, packages in folders included
    (an experiment that records no command of its own relies on it)."""
    from rl_loop.run import provenance

    monkeypatch.setattr(sys, "argv", [str(REPO / path), "--out", "x"])
    assert provenance.command_line() == f"python -m {module} --out x"
    monkeypatch.setattr(sys, "argv", [str(REPO / "setup.py")])  # a file outside any package
    assert provenance.command_line() is None
