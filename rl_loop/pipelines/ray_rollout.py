"""Rollouts on N Ray actors: a :class:`RolloutPool` of :class:`GeneratorActor` workers behind the engine API.

Each worker holds a policy copy, a drafter copy and the one :class:`~rl_loop.step.engine.RolloutEngine`. A call's
requests are split by GRPO group (``unit`` consecutive requests share a prompt) and every worker generates
its groups with the requests' own Philox keys; the engine is batch invariant (a request's tokens depend only
on its seed and position, DESIGN §4), so the merged rollouts are the same for any number of workers and any
assignment of groups to them.

What is sent where per update (``sync(version)``): the trainer puts the policy state and the drafter's
trainable state into the object store ONCE (two ``ray.put``), then sends each worker a small
``load_weights(version, ref, ref)`` call; every worker fetches the weights from the object store (a node
fetches each object once). Per call: each worker gets its requests' prompts and seeds and returns its
responses; the pool reassembles them in request order.

Faults: a worker that dies (``ray.kill``, a lost node) while it generates raises ``RayActorError`` at
collection; the pool starts a replacement, loads the weights the lost call was submitted under, re-runs the
lost groups with the same seeds (same tokens) and then loads the newest weights, so the run continues.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from specdec_kernels.models import Qwen3

from ..step.engine import RolloutEngine
from ..step.rollouts import GenerationConfig, Rollouts, RolloutStats
from ..step.weight_fingerprint import Prints, WeightSyncError, fingerprint, trainer_prints, verify

Assignment = Callable[[int, int], list[list[int]]]
TIME_FIELDS = ("time_s", "draft_s", "target_s", "verify_s", "prefill_s")


class GeneratorActor:
    """Rollout generation in its own process: a policy copy, a drafter copy and a RolloutEngine.

    Wrapped with ``ray.remote`` by the pipelines; plain methods so it is also usable in-process.
    """

    def __init__(self, models: tuple[Qwen3, object | None], eos_id: int, num_threads: int = 1) -> None:
        torch.set_num_threads(num_threads)
        policy, drafter = models  # one argument: shared submodules stay shared after pickling
        self.policy, self.drafter = policy, drafter
        # the pool compares every copy this worker serves with the trainer's weights (``served_prints``)
        self.engine = RolloutEngine(policy, drafter, eos_id, check_sync=False)
        self.version = 0

    def load_weights(self, version: int, policy_state: dict, drafter_state: dict | None) -> int:
        """Weight sync: load policy (and drafter) weights of ``version``; returns the version now held."""
        self.policy.load_state_dict(policy_state)
        if drafter_state is not None and self.drafter is not None:
            self.drafter.trainable().load_state_dict(drafter_state)
        self.engine.sync(version)
        self.version = version
        return version

    def served_prints(self) -> tuple[int, dict[str, dict[str, Prints]]]:
        """(version held, fingerprints of every copy of the weights served: the loaded policy parameters and
        the engine's copies, ``RolloutEngine.served_prints``), for the pool's weight-sync check."""
        loaded = self.policy.state_dict()  # the engine's copies leave out the loaded tensors, fingerprinted here
        return self.version, {"loaded parameters": {"policy": fingerprint(loaded)},
                              **self.engine.served_prints({"policy": loaded, "drafter": {}})}

    def generate(self, prompts: list[list[int]], seeds: list[int], gen: GenerationConfig,
                 compare: bool) -> tuple[int, Rollouts, RolloutStats | None]:
        """(policy version used, rollouts, stats of the same requests generated autoregressively or None)."""
        rollouts = self.engine.generate(prompts, seeds, gen)
        ar = self.engine.generate(prompts, seeds, replace(gen, spec="none")).stats if compare else None
        return self.version, rollouts, ar

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()


def weights(policy: Qwen3, drafter) -> tuple[dict, dict | None]:
    """CPU copies of the trainer's policy and drafter weights (what a weight push sends)."""
    p = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    d = None if drafter is None else {k: v.detach().clone() for k, v in drafter.trainable().state_dict().items()}
    return p, d


def init_ray(num_cpus: int = 2):
    """Attach to ``RAY_ADDRESS`` or start a local Ray of ``num_cpus`` logical CPUs; returns (ray, whether this
    call started it). An already initialised Ray (the caller's own session) is used and left running."""
    import ray

    if ray.is_initialized():
        return ray, False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray, True


def block_assignment(num_units: int, num_workers: int) -> list[list[int]]:
    """Units (GRPO groups) per worker: contiguous, near-equal blocks in order."""
    return [[u for u in range(num_units) if u * num_workers // num_units == w] for w in range(num_workers)]


@dataclass
class _Share:
    worker: int
    requests: list[int]  # request indices of the call, in the order sent
    ref: object  # ObjectRef of GeneratorActor.generate


@dataclass
class _SyncCheck:
    """One worker's fingerprints after a weight push (``ref``: of ``GeneratorActor.served_prints``), to compare
    with the trainer's ``expected`` of the pushed ``version``."""

    worker: int
    version: int
    expected: dict[str, Prints]
    ref: object
    done: bool = False


@dataclass
class Pending:
    """A submitted call: its shares, the weights it was submitted under and what it asked for, and the
    weight-sync checks of the pushes queued before it (done by the time it is collected)."""

    shares: list[_Share]
    weights: tuple[int, object, object]
    prompts: list[list[int]]
    seeds: list[int]
    gen: GenerationConfig
    compare: bool
    checks: list[_SyncCheck]


class RolloutPool:
    """N rollout workers as Ray actors, usable as the loop's engine (``generate`` / ``sync`` / ``summary``).

    ``policy`` / ``drafter`` are the trainer's models (weights are published from them); ``unit``: requests
    per GRPO group, the granularity of the split; ``assignment(num_units, num_workers)``: units per worker
    (default :func:`block_assignment`; any assignment gives the same rollouts).
    """

    def __init__(self, ray, policy: Qwen3, drafter, eos_id: int, num_workers: int, unit: int,
                 num_threads: int = 1, assignment: Assignment = block_assignment, max_restarts: int = 3,
                 version: int = 0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.ray, self.policy, self.drafter = ray, policy, drafter
        self.unit, self.assignment, self.max_restarts = unit, assignment, max_restarts
        self.restarts = 0
        self._cls = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(GeneratorActor)
        self._models = ray.put((policy, drafter))  # the architecture, put once for every worker
        self._eos, self._threads = eos_id, num_threads
        self.weights: tuple[int, object, object] | None = None
        self.publishes = 0
        self.checks: list[_SyncCheck] = []  # weight-sync checks not yet compared
        self.actors = [self._start() for _ in range(num_workers)]
        self.sync(version)

    def _start(self):
        return self._cls.remote(self._models, self._eos, self._threads)

    @property
    def version(self) -> int:
        """The version of the weights published last."""
        return self.weights[0]

    def sync(self, version: int | None = None) -> dict:
        """Publish the trainer's current weights as ``version`` (default: the next one): one ``ray.put`` of
        the policy and one of the drafter, then every worker loads them (queued behind its pending calls) and
        fingerprints what it serves; the next :meth:`collect` compares the fingerprints with the trainer's
        (``weight_fingerprint``). Returns the policy state published (the async trainer keeps it as a
        behaviour snapshot)."""
        version = self.version + 1 if version is None else version
        p, d = weights(self.policy, self.drafter)
        self.weights = (version, self.ray.put(p), self.ray.put(d))
        self.publishes += 1
        expected = trainer_prints(p, self.drafter)
        for w, a in enumerate(self.actors):
            self._push(a, self.weights)
            self.checks.append(_SyncCheck(w, version, expected, a.served_prints.remote()))
        return p

    def _push(self, actor, weights: tuple[int, object, object]) -> None:
        """One worker's weight load (version, policy ref, drafter ref)."""
        actor.load_weights.remote(*weights)

    def check_syncs(self, checks: list[_SyncCheck] | None = None) -> None:
        """Compare the fingerprints of ``checks`` (default: every push so far; waits for them) with the
        trainer's; raises ``WeightSyncError`` naming the worker, the tensor and the version of a missed sync."""
        from ray.exceptions import RayActorError

        for c in list(self.checks if checks is None else checks):
            if c.done:
                continue
            c.done = True  # compared once: a failure is reported once
            self.checks = [x for x in self.checks if not x.done]
            try:
                version, served = self.ray.get(c.ref)
            except RayActorError:  # the worker died; its replacement loads the weights again
                continue
            if version != c.version:
                raise WeightSyncError(f"weight sync check failed: rollout worker {c.worker} holds weights version "
                                      f"{version}, version {c.version} was pushed")
            for label, prints in served.items():
                verify(c.expected, prints, c.version, f"Ray rollout worker {c.worker} ({label})")

    def submit(self, prompts: list[list[int]], seeds: list[int], gen: GenerationConfig,
               compare: bool = False) -> Pending:
        """Split the requests by group and start every worker's share; collect with :meth:`collect`."""
        if len(prompts) != len(seeds):
            raise ValueError(f"prompts and seeds must have the same length, got {len(prompts)} and {len(seeds)}")
        unit = self.unit if len(prompts) % self.unit == 0 else 1
        units = self.assignment(len(prompts) // unit, len(self.actors))
        shares = []
        for w, us in enumerate(units):
            req = [u * unit + j for u in us for j in range(unit)]
            if req:
                ref = self.actors[w].generate.remote([prompts[i] for i in req], [seeds[i] for i in req], gen, compare)
                shares.append(_Share(w, req, ref))
        return Pending(shares, self.weights, prompts, seeds, gen, compare, list(self.checks))

    def _rerun(self, pending: Pending, share: _Share) -> _Share:
        """Replace the dead worker of ``share`` and re-run its requests under the call's weights."""
        if self.restarts >= self.max_restarts:
            raise RuntimeError(f"rollout worker {share.worker} died; {self.restarts} restarts already")
        self.restarts += 1
        actor = self._start()
        self.actors[share.worker] = actor
        self._push(actor, pending.weights)
        ref = actor.generate.remote([pending.prompts[i] for i in share.requests],
                                    [pending.seeds[i] for i in share.requests], pending.gen, pending.compare)
        if self.weights is not pending.weights:  # newer weights were published since: the worker takes them next
            self._push(actor, self.weights)
        return _Share(share.worker, share.requests, ref)

    def collect(self, pending: Pending) -> tuple[int, Rollouts, RolloutStats | None]:
        """(policy version, rollouts in request order, AR stats or None). Counters are summed over workers;
        timings are the slowest worker's (the critical path of a data-parallel call)."""
        from ray.exceptions import RayActorError

        n = len(pending.prompts)
        responses: list[list[int]] = [[] for _ in range(n)]
        finished = [False] * n
        masks: list | None = [None] * n
        results = []
        for share in pending.shares:
            while True:
                try:
                    results.append(self.ray.get(share.ref))
                    break
                except RayActorError:
                    share = self._rerun(pending, share)
            _, out, _ = results[-1]
            for i, r, f in zip(share.requests, out.response_ids, out.finished, strict=True):
                responses[i], finished[i] = r, f
            if out.masks is None:
                masks = None
            elif masks is not None:
                for i, m in zip(share.requests, out.masks, strict=True):
                    masks[i] = m
        self.check_syncs(pending.checks)  # the weights these rollouts were generated with are the trainer's
        versions = {v for v, _, _ in results}
        if len(versions) != 1:
            raise RuntimeError(f"rollout workers generated one call under different versions {sorted(versions)}")
        stats = _merge([out.stats for _, out, _ in results])
        ar = _merge([a for _, _, a in results]) if pending.compare else None
        return versions.pop(), Rollouts(responses, finished, stats, masks), ar

    def generate(self, prompts: list[list[int]], seeds: list[int], config: GenerationConfig) -> Rollouts:
        """The engine API: one call across the workers."""
        return self.collect(self.submit(prompts, seeds, config))[1]

    def node_ids(self) -> list[str]:
        return self.ray.get([a.node_id.remote() for a in self.actors])

    def summary(self) -> dict:
        return {"rollout_workers": len(self.actors), "rollout_worker_nodes": len(set(self.node_ids())),
                "rollout_worker_restarts": self.restarts, "weight_publishes": self.publishes}

    def shutdown(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []


def _merge(parts: list[RolloutStats]) -> RolloutStats:
    total = RolloutStats()
    for p in parts:
        total.merge(p)
    slowest = max(parts, key=lambda p: p.time_s)
    for name in TIME_FIELDS:
        setattr(total, name, getattr(slowest, name))
    return total


def start_pool(s, num_threads: int = 1) -> tuple[object, RolloutPool, bool]:
    """Ray (local or ``RAY_ADDRESS``) and a pool of ``s.cfg.rollout_workers`` workers serving the session's
    policy and drafter; returns (ray, pool, whether Ray was started here)."""
    ray, owns = init_ray(num_cpus=max(2, s.cfg.rollout_workers))
    try:
        s.policy.eval()
        pool = RolloutPool(ray, s.policy, s.drafter, s.tok.eos_id, s.cfg.rollout_workers, s.cfg.group_size,
                           num_threads, version=s.state.step)
    except BaseException:
        if owns:
            ray.shutdown()
        raise
    return ray, pool, owns


def stop_pool(ray, pool: RolloutPool | None, owns: bool) -> None:
    """Kill the pool's workers; shut Ray down when this run started it."""
    if pool is not None:
        pool.shutdown()
    if owns:
        ray.shutdown()


__all__ = ["GeneratorActor", "Pending", "RolloutPool", "block_assignment", "init_ray", "start_pool", "stop_pool",
           "weights"]
