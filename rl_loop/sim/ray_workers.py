"""N Ray rollout workers: a cost model of one step's generation and weight publish, checked on this machine.

Model (data-parallel generation over ``RolloutPool``): a step's G groups are split into N shares; worker
w generates its share in ``t_w`` (what one engine takes for those groups alone, on ``threads`` threads);
N workers on C cores run ``max(1, N * threads / C)`` times slower each (they share the cores; C is
calibrated as the cores two concurrent workers actually get, fewer than the machine's when it is shared); the call
costs one actor round trip ``call_s`` on top, and its wall time is the slowest share's (the straggler
tail: groups differ in response length, so equal group counts are not equal work):

    publish(N)    = put_s + N * send_s              (the driver: copy + one put, one small call per worker)
    generation(N) = call_s + load_s + contention(N) * max_w t_w

where ``load_s`` is a worker's fetch + load of the new weights, queued before the step's ``generate`` (the
workers load in parallel, so it is paid once per step, not N times).

``python -m rl_loop.sim.ray_workers`` calibrates ``call_s``, ``send_s``, ``put_s``, ``load_s`` and the per-share
engine times on the tiny configuration, then measures a step's Ray path (publish, then generate) for
N = 1 and 2 (interleaved, order alternated, repeated) and prints prediction against measurement with the
relative error, beside the in-process engine's generation time of the same requests.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from ..run.provenance import provenance
from ..run.usage import OneLineParser


@dataclass(frozen=True)
class RayCosts:
    """Calibrated costs of the Ray path (seconds, bytes per second)."""

    call_s: float  # one actor call's round trip with a small payload (submit + get)
    send_s: float  # submitting one call without waiting (the driver's cost per worker per publish)
    put_s: float  # the driver's copy of the policy + drafter weights and their ray.put
    load_s: float  # a worker's fetch of the published weights from the object store and their load
    cores: float  # cores the workers get (calibrated: fewer than the machine's when it is shared)
    threads: int  # torch threads per worker


def contention(costs: RayCosts, num_workers: int) -> float:
    """Slowdown of each worker when N workers share the cores."""
    return max(1.0, num_workers * costs.threads / costs.cores)


def predict_generation(costs: RayCosts, share_s: list[float]) -> float:
    """Wall time of a step's pool call (after a publish) whose N shares take ``share_s`` seconds alone on one
    engine: round trip, the workers' parallel weight load, then the slowest share under core contention."""
    return costs.call_s + costs.load_s + contention(costs, len(share_s)) * max(share_s)


def predict_publish(costs: RayCosts, num_workers: int) -> float:
    """The driver's cost of one weight publish to N workers."""
    return costs.put_s + num_workers * costs.send_s


def _median_time(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _measure_call(engine, pool, costs: RayCosts, prompts: list[list[int]], seeds: list[int], gen, group: int,
                  repeats: int) -> dict:
    """One step's pool call against its prediction from the shares' in-process engine times."""
    from ..pipelines.ray_rollout import block_assignment

    pool.generate(prompts, seeds, gen)  # warm
    share_s = []
    for us in block_assignment(len(prompts) // group, len(pool.actors)):
        idx = [u * group + j for u in us for j in range(group)]
        sp, ss = [prompts[i] for i in idx], [seeds[i] for i in idx]
        share_s.append(_median_time(lambda sp=sp, ss=ss: engine.generate(sp, ss, gen), repeats))
    def step() -> None:
        pool.sync()
        pool.generate(prompts, seeds, gen)

    return {"measured_s": _median_time(step, repeats),
            "predicted_s": predict_generation(costs, share_s), "share_s": share_s,
            "in_process_s": _median_time(lambda: engine.generate(prompts, seeds, gen), repeats)}


def _effective_cores(ray, pool, prompts: list[list[int]], seeds: list[int], gen, repeats: int) -> float:
    """Cores the workers actually get (a shared machine gives fewer than it has): the same requests on one
    worker alone, then on two workers at once; two free cores take as long for both as for one."""
    a, b = pool.actors[:2]
    ray.get(a.generate.remote(prompts, seeds, gen, False))
    alone = _median_time(lambda: ray.get(a.generate.remote(prompts, seeds, gen, False)), repeats)
    both = _median_time(lambda: ray.get([w.generate.remote(prompts, seeds, gen, False) for w in (a, b)]), repeats)
    return min(float(len(os.sched_getaffinity(0))), 2.0 * alone / both)


def calibrate_and_measure(repeats: int = 5, steps: int = 2) -> dict:
    """Calibrate :class:`RayCosts` and the share times, then measure N = 1, 2 pool calls (see module doc)."""
    from dataclasses import replace

    import ray

    from ..config import tiny_config
    from ..pipelines.ray_rollout import RolloutPool, weights
    from ..run.session import setup
    from ..step.engine import RolloutEngine
    from ..step.rollouts import step_requests

    torch.set_num_threads(1)
    cfg = replace(tiny_config(prompts_per_step=4), num_threads=1)
    s = setup(cfg, lambda row: None)
    gen = cfg.generation()
    engine = RolloutEngine(s.policy, s.drafter, s.tok.eos_id)
    requests = [step_requests(cfg.seed, cfg.prompts_per_step, cfg.group_size, s.train, s.tok, step)[1:] for step in range(steps)]
    p, d = weights(s.policy, s.drafter)
    weight_bytes = sum(t.numel() * t.element_size() for t in [*p.values(), *(d or {}).values()])
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)  # pools of 1 and 2 workers, 1 CPU each
    try:
        pools = {n: RolloutPool(ray, s.policy, s.drafter, s.tok.eos_id, n, cfg.group_size) for n in (1, 2)}
        probe = pools[1].actors[0]
        ray.get(probe.node_id.remote())
        call_s = _median_time(lambda: ray.get(probe.node_id.remote()), 20)
        send_s = _median_time(lambda: probe.node_id.remote(), 20)
        put_s = _median_time(lambda: [ray.put(w) for w in weights(s.policy, s.drafter)], repeats)
        refs = [ray.put(p), ray.put(d)]
        load_s = _median_time(lambda: ray.get(probe.load_weights.remote(0, *refs)), repeats) - call_s
        cores = _effective_cores(ray, pools[2], *requests[0], gen, repeats)
        costs = RayCosts(call_s=call_s, send_s=send_s, put_s=put_s, load_s=max(load_s, 0.0), cores=cores, threads=1)
        rows = []
        for step, (prompts, seeds) in enumerate(requests):
            engine.generate(prompts, seeds, gen)  # warm
            row = {"step": step}
            for n in (2, 1) if step % 2 else (1, 2):  # order alternated
                row[f"n{n}"] = _measure_call(engine, pools[n], costs, prompts, seeds, gen, cfg.group_size, repeats)
            rows.append(row)
        publish = {n: {"measured_s": _median_time(lambda n=n: pools[n].sync(), repeats),
                       "predicted_s": predict_publish(costs, n)} for n in (1, 2)}
    finally:
        ray.shutdown()
    errors = [abs(r[f"n{n}"]["predicted_s"] / r[f"n{n}"]["measured_s"] - 1) for r in rows for n in (1, 2)]
    return {"costs": costs.__dict__, "weight_bytes": weight_bytes, "steps": rows, "publish": publish,
            "max_relative_error": max(errors), "repeats": repeats}


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m rl_loop.sim.ray_workers", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    a = ap.parse_args(argv)
    command = " ".join(["python -m rl_loop.sim.ray_workers", *(sys.argv[1:] if argv is None else argv)])
    res = {**calibrate_and_measure(a.repeats, a.steps), "provenance": provenance(command)}
    for r in res["steps"]:
        for n in (1, 2):
            x = r[f"n{n}"]
            print(f"step {r['step']} N={n}: measured {x['measured_s'] * 1e3:.1f} ms, predicted "
                  f"{x['predicted_s'] * 1e3:.1f} ms, in-process engine {x['in_process_s'] * 1e3:.1f} ms")
    for n, x in res["publish"].items():
        print(f"publish N={n}: measured {x['measured_s'] * 1e3:.2f} ms, predicted {x['predicted_s'] * 1e3:.2f} ms")
    print(f"max relative error (generation) {res['max_relative_error']:.1%}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
