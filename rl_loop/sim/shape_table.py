"""Rollout speedup and accepted length per policy shape x workload x k, measured beside the ``cpu-here``
simulator's prediction of each.

``python -m rl_loop.sim.shape_table --out results/rl_loop/shapes`` builds, for every policy preset
(``--policies``) and task mix (``--workloads``), rl_loop's policy and EAGLE-3 drafter warm-started as
``python -m rl_loop`` does, and runs :func:`rl_loop.sim.engine_costs.compare_engine` on it: component
micro-measurements (policy forward on the engine's decode path, drafter, verifier), then
autoregressive and chain-speculative rollouts of the same requests for each k, interleaved, the order
rotated every round (one torch thread, thread CPU time), and the simulator's prediction of every
round's speedup from the component costs and the run's own acceptance and lengths.

Each shape's regime is measured, not assumed: the row gives one decode (32 requests x 1 token) and one
verification forward (32 x (k + 1) tokens) of the policy; a ratio near 1 is the memory-bound GPU regime
(the weights stream once whatever the tokens), near k + 1 the compute-bound one.

Writes ``OUT/shapes.json`` (every combination's full record and the provenance) and ``OUT/shapes.md``.
``--states DIR`` caches the warm-started weights per combination (``DIR/<policy>-<workload>.pt``);
``--warm-only`` builds those files and measures nothing, so the warm starts (untimed) can run apart from
the timed measurement.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

from rl_loop.config import POLICY_PRESETS, WORKLOADS, RunConfig, tiny_config
from rl_loop.run.provenance import provenance

from ..run.usage import OneLineParser
from .engine_costs import build_engine, compare_engine

REGIME_BATCH = 32


def _forward_s(components: list[dict], tokens: int, requests: int = REGIME_BATCH) -> float | None:
    for row in components:
        if row["component"].startswith("target forward") and row["requests"] == requests \
                and row.get("tokens_per_request") == tokens:
            return row["measured_s"]
    return None


def last_level_cache_bytes() -> int | None:
    """This machine's largest CPU cache (``/sys``), or None where it cannot be read."""
    sizes = []
    for index in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            break
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else None


def regime(components: list[dict], k: int, weight_bytes: int, llc: int | None) -> dict:
    """One decode and one (k + 1)-row verification forward at the rollout batch, their ratio, and where
    the weights live: a ratio near 1 means verification is nearly free (latency-bound: per-op overhead
    here; weight streaming on a GPU), near k + 1 compute-bound."""
    decode, verify = _forward_s(components, 1), _forward_s(components, k + 1)
    ratio = verify / decode if decode and verify else None
    if ratio is None:
        label = None
    elif ratio < 1.5:
        label = "latency-bound"
    elif ratio < 0.75 * (k + 1):
        label = "partly compute-bound"
    else:
        label = "compute-bound"
    where = None if llc is None else "cache-resident" if weight_bytes <= llc else "streams from memory"
    return {"decode_s": decode, "verify_s": verify, "verify_over_decode": ratio, "regime": label,
            "weight_bytes": weight_bytes, "last_level_cache_bytes": llc, "weights": where}


def measure(policies: list[str], workloads: list[str], ks: tuple[int, ...], rounds: int,
            states: str | None, tiny: bool = False, warm_only: bool = False,
            warm_steps: tuple[int, int] | None = None, log=print) -> list[dict]:
    """Every policy x workload combination's :func:`compare_engine` record, with its regime. ``tiny``: the
    seconds-long configuration and a small request set (tests, smoke runs); ``warm_only``: build (and
    save under ``states``) the warm-started weights only; ``warm_steps``: (policy, drafter) warm-start
    steps instead of the run's defaults."""
    base = tiny_config() if tiny else None
    if warm_steps is not None:
        base = replace(base or RunConfig(), warm_start_steps=warm_steps[0], drafter_warm_steps=warm_steps[1])
    sizes = {"request_sets": 2, "prompts_per_set": 2, "group": 2} if tiny else {}
    out = []
    for policy in policies:
        for workload in workloads:
            state = os.path.join(states, f"{policy}-{workload}.pt") if states else None
            log(f"== policy {policy}, workload {workload}")
            cfg, s = build_engine(state_path=state, policy=policy, workload=workload, base=base,
                                  num_layers=base.model.num_hidden_layers if tiny else None)
            if warm_only:
                continue
            result = compare_engine(cfg, s, ks=ks, rounds=rounds, log=log, **sizes)
            weight_bytes = sum(p.numel() * p.element_size() for p in s.policy.parameters())
            warm = base or RunConfig()  # the steps the (possibly cached) weights were warm-started with
            result.update(policy_preset=policy, warm_start_steps=warm.warm_start_steps,
                          drafter_warm_steps=warm.drafter_warm_steps, parameters=sum(p.numel() for p in s.policy.parameters()),
                          regime=regime(result["components"], 3, weight_bytes, last_level_cache_bytes()))
            out.append(result)
    return out


def table(results: list[dict]) -> str:
    lines = ["| policy | weights | workload | decode ms | verify (4 rows) ms | ratio | regime | k | accepted "
             "length | acceptance by position | measured speedup (median, min-max) | predicted | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        g = res["regime"]
        for row in res["speedups"]:
            acc = ", ".join(f"{a:.2f}" for a in row["acceptance"])
            lines.append(
                f"| {res['policy_preset']} | {g['weight_bytes'] / 1e6:.1f} MB, {g['weights']} | {res['workload']} | "
                f"{g['decode_s'] * 1e3:.2f} | {g['verify_s'] * 1e3:.2f} | {g['verify_over_decode']:.2f} | "
                f"{g['regime']} | {row['k']} | {row['tokens_per_step']:.2f} | {acc} | "
                f"{row['measured_speedup']:.2f}x ({row['measured_min']:.2f}-{row['measured_max']:.2f}) | "
                f"{row['predicted_speedup']:.2f}x | {row['error'] * 100:+.1f} % |")
    return "\n".join(lines)


def _names(text: str, allowed, flag: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise SystemExit(f"python -m rl_loop.sim.shape_table: error: {flag} takes names from {tuple(allowed)}, "
                         f"got {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m rl_loop.sim.shape_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="default,wide", help="comma-separated policy presets")
    p.add_argument("--workloads", default="default,search", help="comma-separated task mixes")
    p.add_argument("--ks", default="1,3,5", help="comma-separated draft lengths")
    p.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds")
    p.add_argument("--states", default=None, help="cache warm-started weights in this directory")
    p.add_argument("--out", default="runs/shapes")
    p.add_argument("--tiny", action="store_true", help="seconds-long configuration (tests, smoke runs)")
    p.add_argument("--warm-only", action="store_true", help="only build the --states files (untimed warm starts)")
    p.add_argument("--warm-steps", default=None, metavar="POLICY,DRAFTER",
                   help="warm-start steps of the policy and the drafter (default: python -m rl_loop's)")
    a = p.parse_args(argv)
    policies = _names(a.policies, POLICY_PRESETS, "--policies")
    workloads = _names(a.workloads, WORKLOADS, "--workloads")
    try:
        ks = tuple(int(k) for k in a.ks.split(","))
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1:
        p.exit(2, f"{p.prog}: error: --ks takes positive integers, got {a.ks!r}\n")
    if a.rounds < 1:
        p.exit(2, f"{p.prog}: error: --rounds must be >= 1, got {a.rounds}\n")
    warm_steps = None
    if a.warm_steps is not None:
        try:
            warm_steps = tuple(int(x) for x in a.warm_steps.split(","))
        except ValueError:
            warm_steps = ()
        if len(warm_steps) != 2 or min(warm_steps) < 0:
            p.exit(2, f"{p.prog}: error: --warm-steps takes POLICY,DRAFTER step counts, got {a.warm_steps!r}\n")
    if a.warm_only and not a.states:
        p.exit(2, f"{p.prog}: error: --warm-only needs --states DIR (where the weights go)\n")
    os.makedirs(a.out, exist_ok=True)
    if a.states:
        os.makedirs(a.states, exist_ok=True)
    command = "python -m rl_loop.sim.shape_table " + " ".join(sys.argv[1:] if argv is None else argv)
    results = measure(policies, workloads, ks, a.rounds, a.states, tiny=a.tiny, warm_only=a.warm_only,
                      warm_steps=warm_steps)
    if a.warm_only:
        print(f"warm-started weights in {a.states}")
        return 0
    with open(os.path.join(a.out, "shapes.json"), "w") as f:
        json.dump({"provenance": provenance(command), "results": results}, f, indent=1, default=float)
    text = table(results)
    with open(os.path.join(a.out, "shapes.md"), "w") as f:
        f.write(f"`{command}`\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
