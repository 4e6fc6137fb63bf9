"""The GPU rollout figure, predicted by the simulator before any GPU measured it.

``python -m rl_loop.sim.gpu_preregister predict --out results/sim/preregistered`` prices the run of
``python -m rl_loop.experiments.gpu_rollout`` (the LLM-shape policy, Qwen3-0.6B's shape and V = 151936, in
bf16; its EAGLE-3 head; 16 prompts x 8 samples in one batch; T = 1, k = 3) on the simulator's H100 and H200
presets as they stand: datasheet peaks, the assumed efficiencies and host overheads that the 8B and 235B
projections use (``hardware.py``). Nothing is fitted to a GPU. Its inputs come from this repository alone:
- the prompts' and responses' lengths from the task (the run's validation prompts, and a log-normal fitted
  to the reference solutions of its training split, which the warm start teaches the policy to write);
- the acceptance curve that the same warm-start budget (300 policy and 300 drafter steps) gave the default
  policy at k = 3 in the shape table (``results/rl_loop/shapes/shapes.json``), a measured CPU figure.

It writes ``gpu_rollout_predictions.json``: per GPU the predicted rollout speedup (tokens/s, speculative over
AR, as the run reports it), the prediction at every constant acceptance from 0.50 to 0.95 (so that the
measured acceptance can be put in afterwards: the cost model is then checked alone), and the tolerance,
fixed now. The file is a pure function of the code and the committed inputs: a test recomputes it.

``python -m rl_loop.sim.gpu_preregister compare --measured DIR/gpu_rollout.json --out results/sim/preregistered``
reads a device run's artefact and the committed predictions, and writes ``gpu_rollout_<GPU>.json``: the
measured figure, both predictions (the committed one, and the one at the measured tokens per round, read off
the committed grid), their errors and whether each is within the tolerance. It refuses an artefact measured at
a commit that does not descend from the predictions' commit, one with a dirty tree, one from another GPU or
another configuration than the one predicted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np

from ..run.provenance import provenance
from ..run.usage import OneLineParser, UsageError, check_out_dir
from .generation import (
    GenerationResult,
    Parallelism,
    Speculation,
    Workload,
    simulate_generation,
)
from .hardware import get_hardware
from .model_spec import ModelSpec, eagle3_head

PROG = "python -m rl_loop.sim.gpu_preregister"
PREDICTIONS = "gpu_rollout_predictions.json"
GPUS = ("H100", "H200")
# The largest error either prediction may have, fixed before any measurement. The engine simulator erred by
# -8 % to +13 % on the CPU shape table, where every cost was measured; here the GPU's efficiencies and the
# engine's host overheads are assumptions, hence a wider margin.
TOLERANCE = 0.25
GRID = tuple(round(0.50 + 0.05 * i, 2) for i in range(10))  # constant acceptance rates 0.50 .. 0.95
SHAPES = "results/rl_loop/shapes/shapes.json"  # the acceptance input (a committed CPU measurement)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def policy_spec() -> ModelSpec:
    """The LLM-shape policy (``config.llm_policy``) as the simulator's model, in bf16 as on the GPU."""
    from rl_loop.config import llm_policy

    c = llm_policy()
    return ModelSpec(name="rl_loop llm policy (Qwen3-0.6B shape)", num_layers=c.num_hidden_layers,
                     hidden_size=c.hidden_size, num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                     head_dim=c.head_dim, vocab_size=c.vocab_size, intermediate_size=c.intermediate_size,
                     tie_embeddings=c.tie_word_embeddings, dtype="bf16")


def drafter_spec(policy: ModelSpec) -> ModelSpec:
    """rl_loop's EAGLE-3 head for that policy: the full vocabulary, MLP width ``DRAFTER_INTERMEDIATE``."""
    from rl_loop.step.drafting import DRAFTER_INTERMEDIATE

    return eagle3_head(policy, draft_vocab=policy.vocab_size, intermediate_size=DRAFTER_INTERMEDIATE)


def run_workload() -> tuple[Workload, dict]:
    """The measured run's requests (``gpu_rollout.rollout_config``) as a simulator workload, and its inputs."""
    from rl_loop.experiments.gpu_rollout import rollout_config
    from rl_loop.task import CharTokenizer, make_splits

    cfg = rollout_config("cuda", False, "unused")
    tok = CharTokenizer()
    train, val = make_splits(replace(cfg.task, seed=cfg.seed))
    prompts = [len(tok.encode(p.prompt, bos=True)) for p in val[: cfg.prompts_per_step]]
    lengths = np.array([min(len(tok.encode(p.solution)) + 1, cfg.max_new_tokens) for p in train])  # + EOS
    logs = np.log(lengths)
    workload = Workload(num_prompts=cfg.prompts_per_step, samples_per_prompt=cfg.group_size,
                        prompt_len=int(round(np.mean(prompts))), response_median=float(np.exp(np.median(logs))),
                        response_sigma=float(np.std(logs)), max_response_len=cfg.max_new_tokens,
                        max_num_seqs=cfg.max_batch)
    inputs = {"requests": cfg.prompts_per_step * cfg.group_size, "max_batch": cfg.max_batch, "k": cfg.k,
              "temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens, "drafter": cfg.drafter,
              "prompt_len_mean": float(np.mean(prompts)), "reference_lengths_median": float(np.median(lengths)),
              "reference_lengths_mean": float(np.mean(lengths))}
    return workload, inputs


def shape_table_acceptance(path: str = SHAPES, k: int = 3) -> list[float]:
    """The acceptance curve at ``k`` of the shape table's default policy on the default workload (``path``
    relative to the repository)."""
    with open(os.path.join(REPO, path)) as f:
        results = json.load(f)["results"]
    for r in results:
        if r["policy_preset"] == "default" and r["workload"] == "default":
            for row in r["speedups"]:
                if row["k"] == k:
                    return [float(a) for a in row["acceptance"]]
    raise ValueError(f"{path} has no default-policy, default-workload row at k = {k}")


def _seconds(r: GenerationResult) -> dict:
    """A simulated generation: its seconds, steps, and seconds by part (host overhead, target, drafter, ...)."""
    return {"seconds": r.time, "steps": r.steps, "breakdown_s": r.breakdown}


def make_predictions() -> dict:
    """Every figure of ``gpu_rollout_predictions.json`` (the module docstring); deterministic."""
    policy = policy_spec()
    drafter = drafter_spec(policy)
    workload, inputs = run_workload()
    curve = shape_table_acceptance(k=inputs["k"])

    def spec(acceptance) -> Speculation:
        return Speculation(k=inputs["k"], acceptance=tuple(acceptance), drafter=drafter, draft_probs=True)

    gpus = {}
    for name in GPUS:
        hw = get_hardware(name)
        s = spec(curve)
        ar, sp = (simulate_generation(hw, policy, Parallelism(), workload, x) for x in (None, s))
        grid = [{"acceptance": a, "tokens_per_round": spec((a,)).expected_tokens(),
                 "speedup": ar.time / simulate_generation(hw, policy, Parallelism(), workload, spec((a,))).time}
                for a in GRID]
        gpus[name] = {"predicted_speedup": ar.time / sp.time, "tokens_per_round": s.expected_tokens(),
                      "ar": _seconds(ar), "speculative": _seconds(sp), "grid": grid,
                      "assumptions": {"mem_efficiency": hw.mem_efficiency, "flop_efficiency": hw.flop_efficiency,
                                      "forward_overhead_s": hw.forward_overhead, "step_overhead_s": hw.step_overhead,
                                      "spec_step_overhead_s": hw.spec_step_overhead,
                                      "draft_token_overhead_s": hw.draft_token_overhead,
                                      "host_overlap": hw.host_overlap}}
    return {"what": "rollout speedup (tokens/s, speculative over autoregressive) of python -m "
                    "rl_loop.experiments.gpu_rollout, predicted by the simulator's GPU presets before any GPU ran it",
            "tolerance": TOLERANCE, "acceptance": curve, "acceptance_source": SHAPES,
            "policy": {"name": policy.name, "parameters": policy.total_params, "vocab_size": policy.vocab_size},
            "drafter_parameters": drafter.total_params, "workload": vars(workload), "run": inputs,
            "gpus": gpus}


def conditional(grid: list[dict], tokens_per_round: float) -> float:
    """The committed grid's speedup at ``tokens_per_round`` (linear between grid points; clamped at its ends)."""
    xs = [g["tokens_per_round"] for g in grid]
    return float(np.interp(tokens_per_round, xs, [g["speedup"] for g in grid]))


def gpu_of(machine: str) -> str | None:
    """``H100`` or ``H200`` when ``machine`` (``torch.cuda.get_device_name``) names one, else None."""
    return next((g for g in GPUS if g in machine.upper()), None)


def _descends(commit: str, ancestor: str) -> bool:
    """Whether ``commit`` is ``ancestor`` or a descendant of it in this repository's history."""
    r = subprocess.run(["git", "merge-base", "--is-ancestor", ancestor, commit], capture_output=True)
    return r.returncode == 0


def compare(predictions: dict, predictions_commit: str, measured: dict) -> dict:
    """The measured figure against both predictions (module docstring); a :class:`UsageError` for an artefact
    that cannot test them."""
    gpu = gpu_of(measured.get("machine", ""))
    if measured.get("device") != "cuda" or gpu is None:
        raise UsageError(f"--measured ran on {measured.get('machine')!r} ({measured.get('device')}); the "
                         f"predictions are for {' and '.join(GPUS)}")
    if measured.get("dirty"):
        raise UsageError("--measured was written from a dirty tree: its commit does not say what ran")
    commit = measured.get("commit") or ""
    if not commit or not _descends(commit, predictions_commit):
        raise UsageError(f"--measured ran at {commit or 'no commit'}, which does not descend from the predictions' "
                         f"commit {predictions_commit[:12]}: the prediction was not written first")
    run = predictions["run"]
    regime = measured["regime"]
    asked = {"requests": regime["requests"], "max_batch": regime["max_batch"], "k": regime["k"],
             "temperature": regime["temperature"], "max_new_tokens": regime["max_new_tokens"],
             "drafter": regime["drafter"]}
    differ = [f"{k} (predicted {run[k]!r}, measured {v!r})" for k, v in asked.items() if run[k] != v]
    if regime["vocab_size"] != predictions["policy"]["vocab_size"] or differ:
        raise UsageError(f"--measured ran another configuration than the predicted one: {'; '.join(differ) or 'vocab'}")
    p = predictions["gpus"][gpu]
    got = float(measured["rollout_speedup"])
    tau = float(measured["mean_accepted_length"])
    at_tau = conditional(p["grid"], tau)
    tol = predictions["tolerance"]
    error, error_at_tau = p["predicted_speedup"] / got - 1, at_tau / got - 1
    return {"gpu": gpu, "machine": measured["machine"], "measured_commit": commit,
            "predictions_commit": predictions_commit, "tolerance": tol,
            "measured_speedup": got, "measured_speedup_ci": measured.get("rollout_speedup_ci"),
            "measured_tokens_per_round": tau,
            "predicted_speedup": p["predicted_speedup"], "predicted_tokens_per_round": p["tokens_per_round"],
            "error": error, "within_tolerance": abs(error) <= tol,
            "predicted_at_measured_acceptance": at_tau, "error_at_measured_acceptance": error_at_tau,
            "within_tolerance_at_measured_acceptance": abs(error_at_tau) <= tol,
            "measured_command": measured.get("command")}


def main(argv: list[str] | None = None) -> int:
    from .preregister import _committed_at

    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=("predict", "compare"))
    p.add_argument("--out", default="runs/sim/preregistered", help="directory of the predictions and comparisons")
    p.add_argument("--measured", help="compare: a device run's gpu_rollout.json")
    a = p.parse_args(argv)
    path = os.path.join(a.out, PREDICTIONS)
    try:
        check_out_dir(a.out)
        if a.phase == "predict":
            command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
            record = {**make_predictions(), "provenance": provenance(command)}
        else:
            if not a.measured or not os.path.isfile(a.measured):
                raise UsageError(f"--measured must name a device run's gpu_rollout.json, got {a.measured!r}")
            if not os.path.exists(path):
                raise UsageError(f"there is no {path}: run the predict phase first and commit its file")
            commit = _committed_at(path)
            if commit is None:
                raise UsageError(f"{path} is not committed, or changed since: commit the predictions first")
            with open(path) as f, open(a.measured) as g:
                predictions, measured = json.load(f), json.load(g)
            record = compare(predictions, commit, measured)
            path = os.path.join(a.out, f"gpu_rollout_{record['gpu']}.json")
    except UsageError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
