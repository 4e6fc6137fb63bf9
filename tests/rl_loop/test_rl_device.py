"""``--device``: the CPU path keeps its tokens, cuda without a GPU is a one-line usage error, and the CUDA-graph
plumbing of the round forward (``engine.GraphedStep``, with an eager stand-in for the capture) keeps the tokens."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
import torch

from rl_loop.__main__ import main, parse_args
from rl_loop.run.checks import check_device_run
from rl_loop.run.session import setup
from rl_loop.run.usage import UsageError
from rl_loop.step.drafting import build_drafter
from rl_loop.step.engine import EagerGraph, RolloutEngine, check_device, resolve_decode_path, weight_dtype
from rl_loop.step.rollouts import GenerationConfig, resolve_verify_backend
from specdec_kernels.models import ModelConfig
from specdec_kernels.models.tiny_qwen3 import spread_qwen3

pytestmark = [pytest.mark.rl, pytest.mark.usefixtures("one_thread")]

# sha256 of the tiny run's rollouts below (AR then chain arm), written by commit 6033216, before --device
# existed, on the 2-core x86 machine: the CPU path must keep every token.
TOKENS_BEFORE_DEVICE = "58e4d2243f534d1be41e418ef660574b54482e078c6c6b60f533aab04a5c61a1"


@pytest.mark.slow
def test_device_cpu_gives_the_tokens_of_before(tmp_path):
    cfg = replace(parse_args(["--device", "cpu", "--tiny", "--out", str(tmp_path)]), progress=False)
    assert cfg.device == "cpu"
    s = setup(cfg, lambda row: None)
    assert next(s.policy.parameters()).dtype == torch.float32
    prompts = [s.tok.encode(p.prompt, bos=True) for p in s.val[:4] for _ in range(2)]
    seeds = list(range(11, 11 + len(prompts)))
    out = {spec: s.engine.generate(prompts, seeds, cfg.generation(spec=spec)).response_ids
           for spec in ("none", "chain")}
    assert hashlib.sha256(json.dumps(out).encode()).hexdigest() == TOKENS_BEFORE_DEVICE, out


def test_device_cuda_without_a_gpu_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--device", "cuda", "--tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda" in err and "torch.cuda is not available" in err
    with pytest.raises(UsageError, match="--device must be one of"):
        check_device("tpu")
    check_device("cuda", cuda_available=True)


def test_cuda_runs_refuse_what_places_its_own_models(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for flags in (["--pipeline", "async"], ["--rollout-workers", "2"], ["--decode", "native"]):
        with pytest.raises(UsageError, match="--device cuda|CPU kernel"):
            check_device_run(parse_args(["--device", "cuda", "--tiny", *flags]))
    check_device_run(parse_args(["--device", "cuda", "--tiny"]))


def test_device_specific_choices():
    assert resolve_verify_backend("default", "cuda") == "auto"  # the library's Triton / CUDA kernels
    assert resolve_verify_backend("reference", "cuda") == "reference"
    assert resolve_decode_path("auto", device="cuda") == "torch"
    with pytest.raises(ValueError, match="CPU kernel"):
        resolve_decode_path("native", device="cuda")
    assert weight_dtype("cuda") == torch.bfloat16 and weight_dtype("cpu") == torch.float32


class CountingGraph(EagerGraph):
    replays = 0

    def replay(self) -> None:
        CountingGraph.replays += 1
        super().replay()


@pytest.mark.parametrize("context", [96, 21])  # 21: prompt 4 + 12 new + 4 rows + 1, no room for overshoot
@pytest.mark.parametrize("spec", ["none", "chain"])
def test_graphed_round_forward_gives_the_eager_tokens(spec, context):
    """Every round replays the captured forward over the whole cache (kv_len = max_len, static shapes), the
    tail of the call too, when idle slots ride along; weight sync drops the graphs. Tokens match the eager
    engine's."""
    policy = spread_qwen3(ModelConfig(num_hidden_layers=3, intermediate_size=96, max_position_embeddings=context))
    drafter = build_drafter("eagle3", policy, seed=1) if spec == "chain" else None
    eager = RolloutEngine(policy, drafter, eos_id=2, check_sync=False)
    graphed = RolloutEngine(policy, drafter, eos_id=2, check_sync=False, graphs=True, graph_capture=CountingGraph)
    CountingGraph.replays = 0
    prompts = [[1, 5 + i % 3, 7, 9 + i % 2] for i in range(6)]
    seeds = list(range(100, 106))
    gen = GenerationConfig(max_new_tokens=12, spec=spec, k=3, max_batch=4)
    want = eager.generate(prompts, seeds, gen)
    got = graphed.generate(prompts, seeds, gen)
    assert got.response_ids == want.response_ids and got.finished == want.finished
    assert CountingGraph.replays == got.stats.forwards  # every round, the partial batches of the tail too
    shapes = {key[0] for key in graphed.graphed.graphs}
    assert shapes == {(4, 1 if spec == "none" else 4)}  # one graph per batch shape, reused every round
    cache = graphed.caches[4]
    assert cache.max_len == policy.config.max_position_embeddings
    assert graphed.generate(prompts, seeds, gen).response_ids == want.response_ids  # same cache, same graph
    assert graphed.caches[4] is cache
    graphed.sync(1)
    assert not graphed.graphed.graphs
