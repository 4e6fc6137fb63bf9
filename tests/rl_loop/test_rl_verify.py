"""``--verify token|block|traversal`` in rl_loop: the option reaches the kernels' ``method=``, every method
runs end to end, block / traversal accept at least as many tokens as token level on the same snapshot and
requests (and the comparison can fail), resume refuses another method, and the per-method snapshot
benchmark (``rl_loop.experiments.verify_bench``) writes its report."""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

import rl_loop.train as train_module
import specdec_kernels as sk
from rl_loop.__main__ import parse_args
from rl_loop.config import RunConfig, tiny_config
from rl_loop.experiments import verify_bench
from rl_loop.run.usage import UsageError
from rl_loop.step import strategies
from rl_loop.step.engine import RolloutEngine
from rl_loop.step.rollouts import GenerationConfig, TreeShape
from rl_loop.step.strategies import ChainSpeculation, TreeSpeculation, Verified, strategy_for
from rl_loop.train import run
from specdec_kernels.drafters import DraftModelDrafter
from specdec_kernels.exactness.exact_verify import chain_conditional_accepted
from specdec_kernels.models import ModelConfig
from specdec_kernels.models.tiny_qwen3 import spread_qwen3
from specdec_kernels.reference.sampling import target_probs

pytestmark = [pytest.mark.rl, pytest.mark.usefixtures("one_thread")]

CFG = ModelConfig(num_hidden_layers=3, intermediate_size=96)
EOS = 2


@pytest.fixture(scope="module")
def engine() -> RolloutEngine:
    """A random policy with spread-out next-token distributions and a perturbed copy of it as the draft model:
    stochastic drafts accepted at every depth, rejected often enough for the methods to differ."""
    g = torch.Generator().manual_seed(0)
    policy = spread_qwen3(CFG, g)
    draft = copy.deepcopy(policy)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.03)
    return RolloutEngine(policy.eval(), DraftModelDrafter(draft.eval()), EOS)


def _requests(n: int, seed: int) -> tuple[list[list[int]], list[int]]:
    rng = np.random.default_rng(seed)
    prompts = [[1, *rng.integers(3, 21, size=int(rng.integers(2, 7))).tolist()] for _ in range(n)]
    return prompts, rng.integers(0, 2**62, size=n).tolist()


def test_the_option_reaches_the_kernels_method(engine, monkeypatch):
    cfg = parse_args(["--verify", "block", "--tiny"])
    assert cfg.verify == "block" and cfg.generation().verify == "block"
    assert parse_args([]).verify == "token"
    assert parse_args(["--spec", "tree", "--verify", "traversal"]).generation().verify == "traversal"
    seen: list[tuple[str, str]] = []
    for op in ("verify_chain", "verify_tree"):
        real = getattr(strategies.sk, op)

        def spy(*args, _real=real, _op=op, **kw):
            seen.append((_op, kw.get("method", "token")))
            return _real(*args, **kw)

        monkeypatch.setattr(strategies.sk, op, spy)
    prompts, seeds = _requests(4, 0)
    cases = [("chain", "token", "verify_chain"), ("chain", "block", "verify_chain"),
             ("tree", "token", "verify_tree"), ("tree", "traversal", "verify_tree")]
    for spec, verify, op in cases:
        seen.clear()
        engine.generate(prompts, seeds, GenerationConfig(spec=spec, verify=verify, k=3, max_new_tokens=6))
        assert seen and set(seen) == {(op, verify)}, (spec, verify, seen)
    seen.clear()  # the autoregressive arm of a block run: no drafts, verify_chain's bonus path
    engine.generate(prompts, seeds, GenerationConfig(spec="none", verify="block", max_new_tokens=3))
    assert set(seen) == {("verify_chain", "token")}
    for spec, verify in (("chain", "traversal"), ("tree", "block")):
        with pytest.raises(ValueError, match="verify"):
            GenerationConfig(spec=spec, verify=verify)
        with pytest.raises(ValueError, match="--verify"):
            RunConfig(spec=spec, verify=verify)
    with pytest.raises(ValueError, match="--verify block.*--spec chain, got --spec none"):
        RunConfig(spec="none", verify="block")
    with pytest.raises(ValueError, match="verify"):
        GenerationConfig(verify="optimal")
    with pytest.raises(ValueError, match="method"):
        ChainSpeculation(engine.drafter, 3, 1.0, "traversal")
    with pytest.raises(ValueError, match="method"):
        TreeSpeculation(engine.drafter, TreeShape(3), 1.0, "block")
    assert strategy_for("chain", engine.drafter, 3, TreeShape(3), 1.0, "block").method == "block"
    assert strategy_for("tree", engine.drafter, 3, TreeShape(3), 1.0, "traversal").method == "traversal"


class _ShortBlock(ChainSpeculation):
    """Planted lesser verifier: block verification with the last draft of every chain turned into a
    placeholder (always rejected). Lossless still, but it never accepts all k drafts."""

    def verify(self, logits, proposal, temperature, seed, position, backend) -> Verified:
        tokens, cu, probs = proposal.drafts.flat()
        tokens = tokens.clone()
        tokens[cu[1:].long() - 1] = -1
        r, n, v = logits.shape
        res = strategies.sk.verify_chain(logits.reshape(r * n, v), tokens, cu, draft_probs=probs,
                                         temperature=temperature, seed=seed, position=position, backend=backend,
                                         method="block", max_draft_len=self.depth, validate=False)
        return Verified(res.output_token_ids, res.num_accepted, None)


def _paired_gain(engine, cfg_a, cfg_b, calls: int, n: int, strategy_a=None) -> tuple[float, float]:
    """Mean and one-sided 99.9 % margin of (accepted length of a - of b) over ``calls`` paired generate calls
    (same prompts and Philox keys for both arms within a call): a paired t bound from the sample."""
    diffs = []
    for c in range(calls):
        prompts, seeds = _requests(n, 100 + c)
        a = engine.generate(prompts, seeds, cfg_a, strategy=strategy_a).stats
        b = engine.generate(prompts, seeds, cfg_b).stats
        assert a.rounds > 0 and b.rounds > 0
        diffs.append(a.mean_accepted_length - b.mean_accepted_length)
    d = np.asarray(diffs)
    margin = scipy_stats.t.ppf(0.999, calls - 1) * d.std(ddof=1) / math.sqrt(calls)
    return float(d.mean()), float(margin)


@pytest.mark.stat
@pytest.mark.slow
def test_block_and_traversal_accept_at_least_token_level_and_the_comparison_has_power(engine):
    """On the same snapshot, prompts and keys with stochastic drafts, block (chains) and traversal (trees)
    accept at least as much as token level: the paired mean gain is not below minus its one-sided 99.9 %
    margin. The same comparison rejects a planted lesser verifier (``_ShortBlock``)."""
    base = GenerationConfig(k=3, temperature=1.0, max_new_tokens=12, max_batch=48)
    chain_tok, chain_blk = replace(base, spec="chain"), replace(base, spec="chain", verify="block")
    tree_tok = replace(base, spec="tree", tree=TreeShape(3, top_k=2, beam=2))
    tree_trv = replace(tree_tok, verify="traversal")
    gain, margin = _paired_gain(engine, chain_blk, chain_tok, 6, 48)
    assert gain >= -margin, (gain, margin)
    gain_t, margin_t = _paired_gain(engine, tree_trv, tree_tok, 6, 48)
    assert gain_t >= -margin_t, (gain_t, margin_t)
    short = _ShortBlock(engine.drafter, 3, 1.0, "block")
    loss, margin_s = _paired_gain(engine, chain_blk, chain_tok, 6, 48, strategy_a=short)
    assert loss < -margin_s, (loss, margin_s)


@pytest.fixture(scope="module")
def block_run(tmp_path_factory) -> str:
    """A finished one-step tiny run with --verify block (its equivalence check included)."""
    out = str(tmp_path_factory.mktemp("block_run"))
    run(tiny_config(out=out, verify="block", steps=1))
    return out


def _check_run(out: str, spec: str, verify: str) -> dict:
    written = json.load(open(os.path.join(out, "summary.json")))
    assert written["verify"] == verify and written["spec"] == spec and written["config"]["verify"] == verify
    by_pos = written["acceptance_by_position"]
    assert len(by_pos) == written["k"] and by_pos == sorted(by_pos, reverse=True)
    assert written["mean_accepted_length"] == pytest.approx(1 + sum(by_pos))
    return written


@pytest.mark.slow
def test_block_runs_end_to_end(block_run):  # token level: tests/rl_loop/test_rl_cli.py
    _check_run(block_run, "chain", "block")
    eq = json.load(open(os.path.join(block_run, "equivalence.json")))
    assert eq["greedy_identical"] and eq["law_pass"]  # the run's own check: the law is unchanged


@pytest.mark.slow
def test_traversal_runs_end_to_end(tmp_path):  # token-level trees: tests/rl_loop/test_rl_tree.py
    out = str(tmp_path / "traversal")  # traversal's law with a rejecting control: tests/rl_loop/test_rl_equivalence.py
    run(tiny_config(out=out, spec="tree", verify="traversal", steps=1, equivalence=False))
    _check_run(out, "tree", "traversal")


@pytest.mark.slow
def test_resume_refuses_another_method(block_run, monkeypatch):
    def started(cfg):
        raise AssertionError("the run started work")

    monkeypatch.setattr(train_module, "open_run", started)
    with pytest.raises(UsageError, match=r"verify \(checkpoint 'block', asked 'token'\)"):
        run(tiny_config(out=block_run, steps=2, resume=True, equivalence=False))
    with pytest.raises(AssertionError, match="started work"):  # the same method resumes
        run(tiny_config(out=block_run, steps=2, resume=True, equivalence=False, verify="block"))


@pytest.mark.slow
def test_resume_of_a_checkpoint_from_before_the_option_is_token_level(block_run, tmp_path, monkeypatch):
    def started(cfg):
        raise AssertionError("the run started work")

    monkeypatch.setattr(train_module, "open_run", started)
    old = tmp_path / "old"
    old.mkdir()
    ckpt = torch.load(os.path.join(block_run, "checkpoint.pt"), weights_only=False)
    del ckpt["config"]["verify"]
    torch.save(ckpt, old / "checkpoint.pt")
    with pytest.raises(UsageError, match=r"verify \(checkpoint 'token', asked 'block'\)"):
        run(tiny_config(out=str(old), steps=2, resume=True, equivalence=False, verify="block"))
    with pytest.raises(AssertionError, match="started work"):
        run(tiny_config(out=str(old), steps=2, resume=True, equivalence=False))


@pytest.mark.slow
def test_verify_bench_reports_every_method_on_one_snapshot(block_run, tmp_path, capsys):
    log = open(os.path.join(block_run, "metrics.jsonl")).read()
    out = str(tmp_path / "verify.json")
    assert verify_bench.main(["--run", block_run, "--rounds", "3", "--out", out]) == 0
    report = json.load(open(out))
    assert list(report["arms"]) == [name for name, _, _ in verify_bench.ARMS]
    ar = report["arms"]["autoregressive"]
    assert ar["rollout_speedup"] == pytest.approx(1.0) and ar["mean_accepted_length"] == 1.0
    for name, arm in report["arms"].items():
        assert len(arm["rollout_speedup_per_round"]) == 3 and arm["tokens_per_s"] > 0
        if name != "autoregressive":
            lo, hi = arm["mean_accepted_length_ci"]
            assert 1.0 <= lo <= arm["mean_accepted_length"] <= hi <= 4.0
            lo, hi = arm["rollout_speedup_ci"]
            assert 0 < lo <= hi
    assert set(report["gains"]) == {"block_minus_token", "traversal_minus_token"}
    cond = report["conditional_chain"]
    assert cond["chains_scored"] > 0 and len(cond["per_round"]) == 3
    for key in ("token", "block"):
        lo, hi = cond[f"{key}_ci"]
        assert 0.0 <= lo <= cond[f"{key}_expected_accepted_drafts"] <= hi <= 3.0
    assert cond["block_minus_token"] == pytest.approx(
        cond["block_expected_accepted_drafts"] - cond["token_expected_accepted_drafts"])
    settings = report["settings"]
    assert (settings["rounds"], settings["k"], settings["temperature"]) == (3, 3, 1.0)
    assert settings["requests_per_round"] == 8 and settings["run_verify"] == "block"
    assert settings["tree"] == {"depth": 3, "top_k": 2, "beam": 1, "draft_nodes": 6}
    assert {"commit", "date", "cpu", "threads", "command"} <= set(report["provenance"])
    assert "| chain_block |" in capsys.readouterr().out
    assert open(os.path.join(block_run, "metrics.jsonl")).read() == log  # the run is left as it was


@pytest.mark.parametrize("argv, named", [
    (["--rounds", "2"], "--rounds"), (["--threads", "0"], "--threads"),
    (["--verify-backend", "nosuch"], "--verify-backend"),
])
@pytest.mark.slow
def test_verify_bench_mistakes_fail_in_one_line(block_run, capsys, argv, named):
    assert verify_bench.main(["--run", block_run, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m rl_loop.experiments.verify_bench: error: ") and named in err


@pytest.mark.slow
def test_verify_bench_needs_a_speculative_checkpoint(block_run, tmp_path, capsys):
    assert verify_bench.main(["--run", str(tmp_path)]) == 2
    assert "no checkpoint.pt" in capsys.readouterr().err
    ckpt = torch.load(os.path.join(block_run, "checkpoint.pt"), weights_only=False)
    ckpt["config"].update(spec="none", verify="token")  # what a --spec none run writes
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    assert verify_bench.main(["--run", str(tmp_path)]) == 2
    assert "no drafter" in capsys.readouterr().err


def test_conditional_recorder_scores_each_stochastic_call_and_returns_the_real_result():
    """The recorder adds the exact draft-conditional expectations of every sampled chain it sees (greedy requests
    are skipped) and hands back the real verifier's result unchanged; rl_loop's chains have one length per call."""
    g = torch.Generator().manual_seed(2)
    b, k, v = 5, 3, 11
    logits = torch.randn(b * (k + 1), v, generator=g)
    q = torch.softmax(torch.randn(b * k, v, generator=g), -1)
    drafts = torch.multinomial(q, 1, generator=g).squeeze(1)
    cu = torch.arange(b + 1) * k
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0])
    recorder = verify_bench.ConditionalRecorder(sk.verify_chain)
    got = recorder(logits, drafts, cu, q, temperature, seed=torch.arange(b), backend="reference")
    want = sk.verify_chain(logits, drafts, cu, q, temperature, seed=torch.arange(b), backend="reference")
    assert torch.equal(got.output_token_ids, want.output_token_ids)
    keep = temperature > 0
    p = target_probs(logits.view(b, k + 1, v)[keep].reshape(-1, v), temperature[keep].repeat_interleave(k + 1))
    exp = chain_conditional_accepted(p.view(-1, k + 1, v), q.view(b, k, v)[keep], drafts.view(b, k)[keep])
    assert recorder.sums == pytest.approx([float(exp["token"].sum()), float(exp["block"].sum()), 4])
    with pytest.raises(ValueError, match="one length per call"):
        recorder(logits[:-1], drafts[:-1], torch.tensor([0, 3, 5, 8, 11, 14]), q[:-1], temperature)
