"""rl_loop's own rollout engine, priced component by component, and its measured speedups.

(a) Micro-measurements on the real policy and drafter, each called alone exactly as the engine calls it:
    the policy forward (on the engine's decode path, ``rl_loop/step/engine.py``: the fused native layer step
    when built) against the number of requests and tokens per request, the
    drafter's ``propose`` (k drafts) and ``commit``, and ``verify_chain`` (``validate=False``, as the
    engine calls it). Linear fits of these give a
    :class:`MeasuredCosts` that the simulator uses in place of the roofline.
(b) A short run of ``RolloutEngine.generate``: the same requests autoregressively and with chain
    speculation for each k, interleaved, timed with the thread's CPU clock. The measured acceptance
    curve and response lengths of each run are the simulator's workload inputs; the simulator predicts the
    throughput ratio (tokens/s, as ``rl_loop`` reports ``rollout_speedup``), and the two are compared.

The engine's bookkeeping between components (each round's list updates per request and emitted token, the
drafter's commit) is no component call. :func:`fit_bookkeeping` prices what of it the commit's fit leaves out,
per round and per verified slot, from whole runs of a *fitting* request set (the engine's own timers give each
run's time outside the components); :mod:`rl_loop.sim.preregister` fits it so, and its held-out sets check it.
Without that fit (the shape table, :func:`compare_engine`) it is not priced.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .generation import Speculation, Workload, simulate_replica


def cpu_time(fn: Callable[[], object], repeats: int = 7, warmup: int = 1) -> float:
    """Minimum thread CPU seconds of ``fn()`` over ``repeats`` calls (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def _fit(features: list[list[float]], times: list[float]) -> np.ndarray:
    """Non-negative-ish least squares: ordinary least squares with negative coefficients clipped to 0."""
    coef, *_ = np.linalg.lstsq(np.asarray(features, dtype=np.float64), np.asarray(times), rcond=None)
    return np.maximum(coef, 0.0)


@dataclass
class MeasuredCosts:
    """Step costs fitted from component micro-measurements (seconds; ``r`` = active requests):

    target(r, 1) = a0 + a1 r (autoregressive, no policy features);
    target(r, n) = t0 + t1 r + t2 r n (verification, returning the drafter's policy features);
    drafter(r, k) = d0 + d1 r + k (d2 + d3 r) + m (p0 + p1 r), m = ``pending - 1`` extra rows per request
    that the first draft forward re-runs (the tokens emitted last step: ``pending`` = tokens per step);
    sampler(r, k) = s0 + s1 r (k + 1);  overhead(r, k) = c0 + c1 r (the drafter's commit, speculative only);
    prefill(r, P) = target(p, P - 1) + drafter admission (r), p the distinct prompts (the engine prefills each
    once; ``distinct_prompts``, else r); bookkeeping per round, both arms: b0 + b1 r (k + 1)
    (``round_coef``, :func:`fit_bookkeeping`; zero when not fitted).
    """

    ar_coef: np.ndarray
    target_coef: np.ndarray
    drafter_coef: np.ndarray
    sampler_coef: np.ndarray
    commit_coef: np.ndarray
    admit_coef: np.ndarray
    pending_coef: np.ndarray
    pending: float = 1.0
    round_coef: np.ndarray = field(default_factory=lambda: np.zeros(2))
    distinct_prompts: int | None = None

    def target(self, count, tokens_per_seq, context):
        if tokens_per_seq == 1:
            a = self.ar_coef
            return np.where(count > 0, a[0] + a[1] * count, 0.0)
        c = self.target_coef
        return np.where(count > 0, c[0] + c[1] * count + c[2] * count * tokens_per_seq, 0.0)

    def drafter(self, count, k, context):
        c, p = self.drafter_coef, self.pending_coef
        extra = max(self.pending - 1.0, 0.0) * (p[0] + p[1] * count)
        return np.where(count > 0, c[0] + c[1] * count + k * (c[2] + c[3] * count) + extra, 0.0)

    def sampler(self, count, k):
        c = self.sampler_coef
        return np.where(count > 0, c[0] + c[1] * count * (k + 1), 0.0)

    def overhead(self, count, k):
        c, b = self.commit_coef, np.asarray(self.round_coef)
        commit = np.where(k > 0, c[0] + c[1] * count, 0.0)
        return np.where(count > 0, commit + b[0] + b[1] * count * (k + 1), 0.0)

    def prefill(self, num_seqs, prompt_len):
        a = self.admit_coef
        prompts = float(self.distinct_prompts or num_seqs)
        return float(self.target(np.asarray(prompts), max(prompt_len - 1, 1), 0.0) + a[0] + a[1] * num_seqs)


def build_engine(drafter: str = "eagle3", seed: int = 0, state_path: str | None = None, policy: str = "default",
                 workload: str = "default", warm_threads: int = 2, base=None, num_layers: int | None = None
                 ) -> tuple[object, dict]:
    """rl_loop's policy (preset ``policy``) and drafter on the task mix ``workload``, warm-started as
    ``python -m rl_loop`` does (its defaults, or the ``base`` RunConfig's) with ``warm_threads`` torch
    threads; ``num_layers`` shortens the preset (tests). With ``state_path``, weights saved by an earlier
    call are loaded instead (and saved there if absent)."""
    import os

    from rl_loop.config import POLICY_PRESETS, RunConfig, with_workload
    from rl_loop.run.session import setup

    if policy not in POLICY_PRESETS:
        raise ValueError(f"policy must be one of {tuple(POLICY_PRESETS)}, got {policy!r}")
    cached = state_path is not None and os.path.exists(state_path)
    model = POLICY_PRESETS[policy]()
    if num_layers is not None:
        model = replace(model, num_hidden_layers=num_layers)
    cfg = replace(base or RunConfig(), out=tempfile.mkdtemp(prefix="sim-engine-"), seed=seed, drafter=drafter,
                  progress=False, plots=False, num_threads=warm_threads, model=model)
    cfg = with_workload(cfg, workload)
    if cached:
        cfg = replace(cfg, warm_start_steps=0, drafter_warm_steps=0)
    s = setup(cfg, lambda row: None)
    if cached:
        state = torch.load(state_path, weights_only=False)
        s.policy.load_state_dict(state["policy"])
        s.drafter.trainable().load_state_dict(state["drafter"])
        s.engine.sync()
    elif state_path is not None:
        torch.save({"policy": s.policy.state_dict(), "drafter": s.drafter.trainable().state_dict()}, state_path)
    return cfg, s


def requests(cfg, s: dict, num_prompts: int, group: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``num_prompts x group`` prompts (token ids) from the training split and their Philox seeds."""
    import random

    from rl_loop.step.rollouts import request_seeds

    rng = random.Random(f"sim/{seed}")
    problems = [p for p in rng.sample(s.train, num_prompts) for _ in range(group)]
    prompts = [s.tok.encode(p.prompt, bos=True) for p in problems]
    return prompts, request_seeds(seed, 0, len(prompts))


@torch.no_grad()  # as inside RolloutEngine.generate: no autograd bookkeeping
def measure_components(cfg, s: dict, prompts: list[list[int]], batches=(2, 8, 16, 32), ks=(1, 3, 5),
                       repeats: int = 7) -> tuple[MeasuredCosts, list[dict]]:
    """(a): time each engine component alone over ``batches`` x tokens / k; returns the fits and rows."""
    import specdec_kernels as sk
    from rl_loop.step.rollouts import resolve_verify_backend
    from rl_loop.step.strategies import ChainSpeculation
    from specdec_kernels.models import KVCache

    torch.set_num_threads(1)
    policy, drafter = s.policy, s.drafter
    step = s.engine.policy_step  # the engine's decode path for both arms (``rl_loop/step/engine.py``)
    layers = drafter.feature_layers
    V = policy.config.vocab_size
    backend = resolve_verify_backend(cfg.verify_backend)
    rows, feats = [], {name: ([], []) for name in ("ar", "target", "drafter", "sampler", "commit", "admit",
                                                      "pending")}
    width = max(map(len, prompts))
    for r in batches:
        batch = [prompts[i % len(prompts)] for i in range(r)]
        max_len = width + 192
        cache = KVCache(policy.config, r, max_len)
        start = torch.full((r,), width, dtype=torch.long)
        ids = torch.zeros(r, 1, dtype=torch.long)
        t = cpu_time(lambda ids=ids, cache=cache, start=start: step(ids, cache, None, start, width + 1), repeats)
        feats["ar"][0].append([1.0, r])
        feats["ar"][1].append(t)
        rows.append({"component": "target forward (AR)", "requests": r, "tokens_per_request": 1, "measured_s": t})
        for n in (2, 4, 6):
            ids = torch.zeros(r, n, dtype=torch.long)
            t = cpu_time(lambda ids=ids, n=n, cache=cache, start=start: step(ids, cache, None, start, width + n, capture=layers),
                     repeats)
            feats["target"][0].append([1.0, r, r * n])
            feats["target"][1].append(t)
            rows.append({"component": "target forward (verify)", "requests": r, "tokens_per_request": n, "measured_s": t})
        # drafter admission and proposals, from a real prefill
        pre = torch.zeros(r, width - 1, dtype=torch.long)
        for i, p in enumerate(batch):
            pre[i, : len(p) - 1] = torch.tensor(p[:-1])
        _, hidden = step(pre, cache, None, torch.zeros(r, dtype=torch.long), width - 1, capture=layers)
        chain = ChainSpeculation(drafter, max(ks), cfg.temperature)

        def admit(batch=batch, hidden=hidden, r=r, max_len=max_len, chain=chain):
            chain.reset(r, max_len)
            chain.admit(list(range(r)), batch, hidden)

        t = cpu_time(admit, repeats)
        feats["admit"][0].append([1.0, r])
        feats["admit"][1].append(t)
        temp, seed = torch.ones(r), torch.arange(r, dtype=torch.int64)
        feat_size = sum(h.shape[-1] for h in hidden)
        for k in ks:
            admit()
            t = cpu_time(lambda k=k, temp=temp, seed=seed: drafter.propose(k, temp, seed), min(repeats, 3))
            feats["drafter"][0].append([1.0, r, k, k * r])
            feats["drafter"][1].append(t)
            rows.append({"component": "drafter propose", "requests": r, "k": k, "pending": 1, "measured_s": t})
            # after a step that accepted all k drafts (the commit ran the k + 1 verified rows)
            admit()
            drafter.propose(k, temp, seed)
            drafter.commit(torch.full((r,), k), torch.ones(r, k + 1, dtype=torch.long), torch.randn(r, k + 1, feat_size))
            t_full = cpu_time(lambda k=k, temp=temp, seed=seed: drafter.propose(k, temp, seed), min(repeats, 3))
            feats["pending"][0].append([k, k * r])
            feats["pending"][1].append(max(t_full - t, 0.0))
            rows.append({"component": "drafter propose", "requests": r, "k": k, "pending": k + 1, "measured_s": t_full})
            logits = torch.randn(r * (k + 1), V)
            drafts = torch.randint(0, V, (r * k,))
            q = torch.softmax(torch.randn(r * k, V), -1)
            cu = torch.arange(r + 1) * k
            seeds = torch.arange(r, dtype=torch.int64)
            t = cpu_time(lambda logits=logits, drafts=drafts, q=q, cu=cu, seeds=seeds, temp=temp, k=k, start=start: sk.verify_chain(
                logits, drafts, cu, draft_probs=q, temperature=temp, seed=seeds, position=start,
                backend=backend, max_draft_len=k, validate=False), repeats)
            feats["sampler"][0].append([1.0, r * (k + 1)])
            feats["sampler"][1].append(t)
            rows.append({"component": "verify_chain", "requests": r, "k": k, "measured_s": t})
            hid = torch.randn(r, k + 1, feat_size)
            outs = torch.ones(r, k + 1, dtype=torch.long)
            t = cpu_time(lambda hid=hid, outs=outs, k=k, r=r: drafter.commit(torch.full((r,), k), outs, hid), repeats)
            feats["commit"][0].append([1.0, r])
            feats["commit"][1].append(t)
        # AR sampling: verify_chain with no drafts
        logits = torch.randn(r, V)
        t = cpu_time(lambda logits=logits, r=r, start=start: sk.verify_chain(
            logits, torch.empty(0, dtype=torch.long), torch.zeros(r + 1, dtype=torch.long), temperature=torch.ones(r),
            seed=torch.arange(r, dtype=torch.int64), position=start, backend=backend, max_draft_len=0,
            validate=False), repeats)
        feats["sampler"][0].append([1.0, r])
        feats["sampler"][1].append(t)
    costs = MeasuredCosts(*(_fit(*feats[name]) for name in ("ar", "target", "drafter", "sampler", "commit", "admit",
                                                            "pending")))
    return costs, rows


@dataclass
class EngineRun:
    k: int
    cpu_s: float
    tokens: int
    lengths: list[int]
    acceptance: tuple[float, ...]
    tokens_per_step: float
    forwards: int = 0  # batched target forwards (rounds of the whole batch)
    rounds: int = 0  # request rounds (a request's share of a forward), summed
    other_s: float = 0.0  # the engine's time outside drafting, target forwards, sampling and admission
    distinct_prompts: int = 0


def run_engine(cfg, s: dict, prompts, seeds, k: int, max_new_tokens: int, max_batch: int) -> EngineRun:
    """(b): one ``RolloutEngine.generate`` call (k = 0: autoregressive), timed with the thread CPU clock."""
    gen = replace(cfg.generation(spec="none" if k == 0 else "chain"), k=max(k, 1), max_new_tokens=max_new_tokens,
                  max_batch=max_batch)
    t = time.thread_time()
    out = s.engine.generate(prompts, seeds, gen)
    cpu = time.thread_time() - t
    st = out.stats
    lengths = [len(r) + int(f) for r, f in zip(out.response_ids, out.finished, strict=True)]
    reached = [st.rounds] + st.accepted_at[:-1] if k else []
    acc = tuple(a / max(b, 1) for a, b in zip(st.accepted_at, reached, strict=True)) if k else ()
    other = st.time_s - st.draft_s - st.target_s - st.verify_s - st.prefill_s
    return EngineRun(k, cpu, st.tokens, lengths, acc, st.mean_accepted_length, st.forwards, st.rounds, other,
                     len({tuple(p) for p in prompts}))


def fit_bookkeeping(costs: MeasuredCosts, runs: list[EngineRun]) -> np.ndarray:
    """``round_coef`` (b0, b1) of :class:`MeasuredCosts`: each run's time outside the components, less its
    drafter commits as ``commit_coef`` prices them, against b0 x forwards + b1 x request rounds x (k + 1)."""
    c = costs.commit_coef
    feats, times = [], []
    for run in runs:
        commit = (c[0] * run.forwards + c[1] * run.rounds) if run.k else 0.0
        feats.append([run.forwards, run.rounds * (run.k + 1)])
        times.append(run.other_s - commit)
    return _fit(feats, times)


def interleaved_rounds(cfg, s: dict, sets, ks, rounds: int, max_new_tokens: int, max_batch: int,
                       log: Callable[[str], None] = print) -> list[dict[int, list[EngineRun]]]:
    """(b)'s timing protocol: after one untimed call per arm on the first set (first calls allocate),
    ``rounds`` rounds, each running every request set of ``sets`` autoregressively (k = 0) and with each k
    of ``ks`` back to back, the order rotated per round and set; returns per round, per k, the runs."""
    order = (0, *ks)
    for k in order:
        run_engine(cfg, s, *sets[0], k, max_new_tokens, max_batch)
    per_round: list[dict[int, list[EngineRun]]] = []
    for r in range(rounds):
        runs: dict[int, list[EngineRun]] = {k: [] for k in order}
        for i, (prompts, seeds) in enumerate(sets):
            rot = (r + i) % len(order)
            for k in order[rot:] + order[:rot]:
                runs[k].append(run_engine(cfg, s, prompts, seeds, k, max_new_tokens, max_batch))
        per_round.append(runs)
        log(f"  round {r}: " + ", ".join(f"k={k} {sum(x.cpu_s for x in runs[k]):.3f} s" for k in order))
    return per_round


def compare_engine(cfg, s: dict, ks=(1, 3, 5), rounds: int = 5, request_sets: int = 4, group: int = 8,
                   prompts_per_set: int = 4, max_new_tokens: int | None = None,
                   log: Callable[[str], None] = print) -> dict:
    """(a) + (b): component costs, then AR and speculative runs and the simulator's prediction of each
    rollout speedup.

    A round runs every request set autoregressively and with each k back to back (AR, k1, k3, ... per set,
    the order rotated each round), so slow phases of a shared machine hit all of them alike; a round's
    speedup is its AR CPU time over its speculative CPU time (tokens/s ratio). Over ``rounds`` rounds we
    report the median speedup and its spread (min, max). The prediction decodes each run's own lengths
    and acceptance with the measured component costs; its median over rounds is compared with the
    measured median. ``max_new_tokens`` defaults to rl_loop's ``RunConfig``.
    """
    torch.set_num_threads(1)
    max_new_tokens = max_new_tokens or cfg.max_new_tokens
    sets = [requests(cfg, s, prompts_per_set, group, seed=i) for i in range(request_sets)]
    max_batch = min(prompts_per_set * group, cfg.max_batch)
    costs, components = measure_components(cfg, s, sets[0][0], ks=ks)
    log(f"fitted component costs: {costs}")
    prompt_len = max(len(p) for prompts, _ in sets for p in prompts)
    per_round = interleaved_rounds(cfg, s, sets, ks, rounds, max_new_tokens, max_batch, log)

    def rate(runs: list[EngineRun], pred: bool) -> float:
        t = sum(predict(costs, x, prompt_len, max_batch) if pred else x.cpu_s for x in runs)
        return sum(x.tokens for x in runs) / t

    rows = []
    for k in ks:
        measured = np.array([rate(rr[k], False) / rate(rr[0], False) for rr in per_round])
        predicted = np.array([rate(rr[k], True) / rate(rr[0], True) for rr in per_round])
        every = [x for rr in per_round for x in rr[k]]
        med_m, med_p = float(np.median(measured)), float(np.median(predicted))
        rows.append({"k": k, "acceptance": [float(np.mean([x.acceptance[j] for x in every])) for j in range(k)],
                     "tokens_per_step": float(np.mean([x.tokens_per_step for x in every])),
                     "measured_speedup": med_m, "measured_min": float(measured.min()),
                     "measured_max": float(measured.max()), "measured_by_round": measured.tolist(),
                     "predicted_speedup": med_p, "predicted_by_round": predicted.tolist(),
                     "error": med_p / med_m - 1,
                     "worst_round_error": float(np.max(np.abs(predicted / measured - 1)))})
    from dataclasses import asdict

    import specdec_kernels as sk
    from rl_loop.step.rollouts import resolve_verify_backend

    ar_meas = float(np.median([sum(x.cpu_s for x in rr[0]) for rr in per_round]))
    ar_pred = sum(predict(costs, x, prompt_len, max_batch) for x in per_round[0][0])
    return {"engine": "rl_loop.step.engine.RolloutEngine", "policy": asdict(s.policy.config),
            "decode_path": s.engine.policy_step.path, "workload": cfg.workload,
            "drafter": type(s.drafter).__name__, "temperature": cfg.temperature,
            "max_new_tokens": max_new_tokens, "verify_backend": resolve_verify_backend(cfg.verify_backend),
            "backends": sk.available_backends("cpu"), "requests_per_set": prompts_per_set * group,
            "request_sets": len(sets), "rounds": rounds,
            "components": components, "fits": {k: np.asarray(v).tolist() for k, v in vars(costs).items()},
            "autoregressive": {"measured_s": ar_meas, "predicted_s": ar_pred}, "speedups": rows}


def predict(costs: MeasuredCosts, run: EngineRun, prompt_len: int, max_batch: int) -> float:
    """Simulated seconds for ``run``'s responses (its lengths and acceptance) with the measured costs."""
    lengths = np.asarray(run.lengths, dtype=np.float64)
    spec = Speculation(k=run.k, acceptance=run.acceptance, draft_probs=True) if run.k else None
    costs = replace(costs, pending=spec.expected_tokens() if spec else 1.0, distinct_prompts=run.distinct_prompts or None)
    wl = Workload(1, len(lengths), prompt_len, float(np.median(lengths)), 0.0, int(lengths.max()), max_batch)
    return simulate_replica(None, None, None, wl, lengths, spec, max_batch, costs=costs, prefill_emits=False).time
