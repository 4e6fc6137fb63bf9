"""Rollouts on N Ray workers (rl_loop/pipelines/ray_rollout.py): the same tokens for any N and assignment, weights
published once per update, a worker killed mid-step replaced with the same rollouts, dumps of whole runs."""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rl_loop.__main__ import parse_args
from rl_loop.config import tiny_config
from rl_loop.pipelines.ray_rollout import RolloutPool, block_assignment
from rl_loop.run.reports import read_dump
from rl_loop.step.drafting import build_drafter
from rl_loop.step.engine import RolloutEngine
from rl_loop.step.rollouts import GenerationConfig
from rl_loop.step.weight_fingerprint import WeightSyncError
from rl_loop.task import CharTokenizer
from rl_loop.train import run
from specdec_kernels.models import ModelConfig, Qwen3

ray = pytest.importorskip("ray")
# The module starts a local Ray (slow: worker processes, tiny runs): one at a time under pytest-xdist
# (--dist loadgroup).
pytestmark = [pytest.mark.rl, pytest.mark.slow, pytest.mark.xdist_group("ray")]
CFG = ModelConfig(num_hidden_layers=3, intermediate_size=96)
GROUP = 3
EOS = CharTokenizer().eos_id


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    policy = Qwen3(CFG).eval()
    return policy, build_drafter("eagle3", policy, 0)


@pytest.fixture(scope="module")
def pool(local_ray, models):
    p = RolloutPool(local_ray, *models, EOS, num_workers=3, unit=GROUP)
    yield p
    p.shutdown()


def _requests(n_groups: int = 4) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(7)
    prompts = [[1] + [rng.randrange(4, 30) for _ in range(rng.randrange(2, 6))] for _ in range(n_groups)]
    return [p for p in prompts for _ in range(GROUP)], [rng.getrandbits(63) for _ in range(n_groups * GROUP)]


def _only(workers: list[int]):
    """An assignment using only ``workers`` (the others idle), units in reverse order, interleaved."""
    def assign(num_units: int, num_workers: int) -> list[list[int]]:
        out = [[] for _ in range(num_workers)]
        for i, u in enumerate(reversed(range(num_units))):
            out[workers[i % len(workers)]].append(u)
        return out
    return assign


@pytest.mark.parametrize("spec, temperature", [("chain", 1.0), ("chain", 0.0), ("none", 1.0), ("tree", 1.0)])
def test_rollouts_identical_for_any_number_of_workers_and_assignment(pool, models, spec, temperature):
    prompts, seeds = _requests()
    gen = GenerationConfig(max_new_tokens=10, spec=spec, k=2, temperature=temperature, max_batch=4)
    expected = RolloutEngine(*models, EOS).generate(prompts, seeds, gen)
    assignments = [_only([0]), block_assignment, _only([2, 0]), _only([1, 2, 0])]
    for assign in assignments:
        pool.assignment = assign
        out = pool.generate(prompts, seeds, gen)
        assert out.response_ids == expected.response_ids and out.finished == expected.finished
        assert out.stats.tokens == expected.stats.tokens and out.stats.rounds == expected.stats.rounds
    pool.assignment = block_assignment
    # the check has teeth: other seeds give other responses
    assert pool.generate(prompts, [s + 1 for s in seeds], gen).response_ids != expected.response_ids or \
        temperature == 0.0


def test_weights_published_once_per_update_and_served_by_every_worker(pool, models):
    policy, drafter = models
    prompts, seeds = _requests(3)
    gen = GenerationConfig(max_new_tokens=8, spec="chain", k=2, temperature=1.0, max_batch=4)
    before = pool.generate(prompts, seeds, gen).response_ids
    saved = {k: v.clone() for k, v in policy.state_dict().items()}
    publishes = pool.publishes
    try:
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        pool.sync(5)
        assert pool.publishes == publishes + 1 and pool.version == 5
        version, out, _ = pool.collect(pool.submit(prompts, seeds, gen))
        expected = RolloutEngine(policy, drafter, EOS).generate(prompts, seeds, gen).response_ids
        assert version == 5 and out.response_ids == expected and expected != before
    finally:
        policy.load_state_dict(saved)
        pool.sync(6)


def test_worker_killed_mid_step_is_replaced_with_the_same_rollouts(local_ray, models):
    prompts, seeds = _requests()
    gen = GenerationConfig(max_new_tokens=16, spec="chain", k=2, temperature=1.0, max_batch=4)
    expected = RolloutEngine(*models, EOS).generate(prompts, seeds, gen)
    p = RolloutPool(local_ray, *models, EOS, num_workers=2, unit=GROUP)
    try:
        ray.get([a.node_id.remote() for a in p.actors])  # both workers up
        pending = p.submit(prompts, seeds, gen, compare=True)
        ray.kill(p.actors[1])  # mid-step: its share was submitted and is being generated
        version, out, ar = p.collect(pending)
        assert p.restarts == 1 and version == 0 and ar is not None
        assert out.response_ids == expected.response_ids and out.finished == expected.finished
        p.sync(1)  # the run continues: the replacement takes the next update
        assert p.collect(p.submit(prompts, seeds, gen))[0] == 1
    finally:
        p.shutdown()


def test_cli_maps_the_flags_and_rejects_zero_workers():
    cfg = parse_args(["--tiny", "--rollout-workers", "3", "--dump-rollouts"])
    assert cfg.rollout_workers == 3 and cfg.dump_rollouts
    assert parse_args(["--tiny"]).rollout_workers == 1 and not parse_args(["--tiny"]).dump_rollouts
    with pytest.raises(ValueError, match="--rollout-workers must be >= 1, got 0"):  # main prints it in one line
        parse_args(["--rollout-workers", "0"])
    with pytest.raises(ValueError, match="rollout-workers"):
        tiny_config(rollout_workers=0)


BASE = tiny_config(steps=2, equivalence=False, dump_rollouts=True, temperature=1.0)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory) -> tuple[dict, list[dict]]:
    """The in-process sync run every Ray run below must reproduce: (summary, dump)."""
    out = tmp_path_factory.mktemp("one")
    summary = run(replace(BASE, out=str(out)))
    return summary, read_dump(str(out / "rollouts.jsonl"))


def test_sync_run_dump_identical_with_two_workers(local_ray, one_worker, tmp_path):
    two = run(replace(BASE, out=str(tmp_path), rollout_workers=2))
    one, dump = one_worker
    assert [r["step"] for r in dump] == [0, 1] and read_dump(str(tmp_path / "rollouts.jsonl")) == dump
    assert two["rollout_workers"] == 2 and two["weight_publishes"] == 1 + 2  # start + one per update
    assert one["val_accuracy_end"] == two["val_accuracy_end"]


def test_sync_resume_with_two_workers_continues_the_same_rollouts(local_ray, one_worker, tmp_path):
    cfg = replace(BASE, out=str(tmp_path), rollout_workers=2, checkpoint_every=1)
    run(replace(cfg, steps=1))
    run(replace(cfg, resume=True))
    assert read_dump(str(tmp_path / "rollouts.jsonl")) == one_worker[1]


def test_async_run_same_rollouts_for_one_and_two_workers(local_ray, tmp_path):
    cfg = replace(BASE, pipeline="async")
    runs = [run(replace(cfg, out=str(tmp_path / str(n)), rollout_workers=n)) for n in (1, 2)]
    dumps = [read_dump(str(tmp_path / str(n) / "rollouts.jsonl")) for n in (1, 2)]
    assert [r["step"] for r in dumps[0]] == [0, 1] and dumps[0] == dumps[1]
    for summary in runs:
        assert summary["policy_lags"] == [0, 1] and summary["max_policy_lag"] == 1
    assert runs[1]["rollout_workers"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"Ray head did not listen on {port}")


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM, then SIGKILL, every ``ray start --block`` process group (its Ray services share the group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=15)


def test_two_node_loopback_cluster_reproduces_the_one_worker_run(one_worker, tmp_path):
    """``ray start --head`` + ``ray start --address`` (one CPU each) on loopback; ``python -m rl_loop
    --rollout-workers 2`` attached through RAY_ADDRESS places one worker on each node and dumps the
    one-worker run's rollouts. Only this test's processes are stopped (``ray stop`` would stop every Ray
    on the machine), by process group; none may be left (checked by the cluster's own temp dir)."""
    ray_cli = str(Path(sys.executable).with_name("ray"))
    temp = tempfile.mkdtemp(prefix="r19", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = _free_port()
    # `ray start --head` enables token authentication: every node and the driver share this run's token
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
    procs = []
    try:
        procs.append(subprocess.Popen(
            [ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
             f"--temp-dir={temp}", *common], env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_port(port, time.monotonic() + 90)
        procs.append(subprocess.Popen(
            [ray_cli, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1",
             '--resources={"second_node": 1}', *common], env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        out = tmp_path / "ray_cluster"
        cmd = [sys.executable, "-m", "rl_loop", "--tiny", "--steps", "2", "--temperature", "1.0", "--no-equivalence",
               "--dump-rollouts", "--rollout-workers", "2", "--out", str(out)]
        res = subprocess.run(cmd, env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}, timeout=240,
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        summary = json.load(open(out / "summary.json"))
        assert summary["rollout_workers"] == 2 and summary["rollout_worker_nodes"] == 2
        assert read_dump(str(out / "rollouts.jsonl")) == one_worker[1]
    finally:
        _stop(procs)
        left = subprocess.run(["pgrep", "-f", temp], capture_output=True, text=True).stdout.split()
        shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"leaked Ray processes {left}"


def test_planted_missed_syncs_on_a_worker_stop_the_next_collect(local_ray):
    """Worker 1 misses the drafter's weights, later the policy's (the trainer publishes both; the push to that
    worker carries no drafter state, then the previous policy): the next collect raises ``WeightSyncError``
    naming the worker, the role, the tensor and the version; correct syncs around them pass."""
    torch.manual_seed(0)
    policy = Qwen3(CFG).eval()
    drafter = build_drafter("eagle3", policy, 0)
    prompts, seeds = _requests(2)
    gen = GenerationConfig(max_new_tokens=4, spec="chain", k=2, temperature=1.0, max_batch=4)
    p = RolloutPool(local_ray, policy, drafter, EOS, num_workers=2, unit=GROUP)
    push, planted = p._push, {}

    def push_missing(actor, weights):
        if actor is p.actors[1] and planted:
            version, policy_ref, drafter_ref = weights
            weights = (version, planted.get("policy", policy_ref), drafter_ref if "policy" in planted else None)
        push(actor, weights)

    p._push = push_missing
    try:
        assert p.collect(p.submit(prompts, seeds, gen))[0] == 0  # the initial push checks out
        for version, role, module in ((1, None, None), (2, "drafter", drafter.trainable()), (3, None, None),
                                      (4, "policy", policy), (5, None, None)):
            _nudge(policy if module is None else module, version)
            planted.clear()
            if role == "drafter":
                planted["drafter"] = True
            elif role == "policy":
                planted["policy"] = p.weights[1]  # the previous version's policy
            p.sync(version)
            if role is None:
                assert p.collect(p.submit(prompts, seeds, gen))[0] == version and not p.checks
                continue
            pattern = (rf"weights version {version} \(after step {version - 1}\): {role} tensor "
                       rf"{'fc_norm.0.weight' if role == 'drafter' else 'model.embed_tokens.weight'} served by Ray "
                       rf"rollout worker 1 \((drafter head|loaded parameters)\) differs from the trainer's")
            with pytest.raises(WeightSyncError, match=pattern):
                p.generate(prompts, seeds, gen)
    finally:
        p.shutdown()


def _nudge(module: torch.nn.Module, seed: int) -> None:
    """An update of every parameter of ``module`` (a drafter's frozen shared ones included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for q in module.parameters():
            q.add_(torch.randn(q.shape, generator=g) * 1e-2)


def test_workers_carry_the_sampling_masks(pool, models):
    """``record_mask`` rollouts: each request's mask comes back from its worker, in request order."""
    prompts, seeds = _requests()
    gen = GenerationConfig(max_new_tokens=10, spec="chain", k=2, temperature=0.0, max_batch=4, record_mask=True)
    expected = RolloutEngine(*models, EOS).generate(prompts, seeds, gen)
    pool.assignment = _only([2, 0])
    try:
        out = pool.generate(prompts, seeds, gen)
    finally:
        pool.assignment = block_assignment
    assert out.masks is not None and len(out.masks) == len(prompts)
    for got, want in zip(out.masks, expected.masks, strict=True):
        assert torch.equal(got.indptr, want.indptr) and torch.equal(got.indices, want.indices)
