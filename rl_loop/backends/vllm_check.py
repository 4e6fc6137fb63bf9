"""``python -m rl_loop.backends.vllm_check``: the vLLM backend serves the run's own drafter and follows weight syncs.

For each ``--drafter`` (eagle3, draft_model) it builds a tiny warm-started policy and drafter and compares
vLLM (:class:`rl_loop.backends.vllm_backend.VllmRolloutEngine`) with our engine (:class:`rl_loop.step.engine.RolloutEngine`)
on the same greedy requests, three times:

1. as built: vLLM's speculative tokens equal greedy decoding by our engine, and vLLM's acceptance counters
   (rounds, accepted drafts per position) equal those of our speculative engine run on vLLM's schedule
   (vLLM emits a request's first token from the prefill forward, then drafts): vLLM proposes with our
   drafter;
2. after a drafter-only update pushed with ``sync(version)``: the tokens stay the same (the policy did not
   change), the acceptance changes (``drafter_push_changed_acceptance``) and equals ours with the new drafter;
3. after a policy update pushed with ``sync``: the tokens change (``policy_push_changed_output``) and equal
   ours with the new policy;
4. ``--missed-sync`` (EAGLE-3 only): a planted missed sync, the drafter's then the policy's (that reload
   skipped inside vLLM's worker), stops the sync with ``WeightSyncError`` naming the tensor
   (``missed_sync``: the two error lines), and a correct sync afterwards passes (``resynced``).

Prints one JSON object (per drafter) and writes it to ``--out``. vLLM on CPU spawns its engine process,
so this runs as its own ``python -m`` process (tests start it as a subprocess).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import replace

import torch

from ..run.usage import OneLineParser
from ..step.drafting import build_drafter, problem_batches, warm_start
from ..step.engine import RolloutEngine
from ..step.learn import supervised_warm_start
from ..step.rollouts import GenerationConfig, Rollouts
from ..step.weight_fingerprint import WeightSyncError
from ..task import CharTokenizer, TaskConfig, make_splits
from . import vllm_backend
from .vllm_backend import VllmOptions, VllmRolloutEngine, spec_method


def _counters(r: Rollouts) -> dict:
    return {"rounds": r.stats.rounds, "accepted_at": r.stats.accepted_at}


def _perturb(module: torch.nn.Module, seed: int, scale: float, trainable_only: bool) -> None:
    """A large update of ``module``'s weights (a drafter's: its trainable ones; the shared embedding stays)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad or not trainable_only:
                p.add_(torch.randn(p.shape, generator=generator) * scale * p.abs().mean())


def planted_missed_syncs(served: VllmRolloutEngine, policy: torch.nn.Module, drafter, seed: int) -> dict:
    """Stage 4: an update of the drafter (then the policy) pushed with that reload skipped in vLLM's worker
    must fail the sync's check; returns the error line per role (None: not caught) and whether a correct
    sync afterwards passes."""
    missed = {}
    for role, step in (("drafter", "_reload_drafter"), ("policy", "_reload_policy")):
        if role == "drafter":
            _perturb(drafter.trainable(), seed + 11, 0.5, trainable_only=True)
        else:
            _perturb(policy, seed + 13, 0.3, trainable_only=False)
        original = getattr(vllm_backend, step)
        setattr(vllm_backend, step, lambda worker, path: None)  # the planted fault: this reload never happens
        try:
            served.sync(served.version + 1)
            missed[role] = None
        except WeightSyncError as e:
            missed[role] = str(e)
        finally:
            setattr(vllm_backend, step, original)
    served.sync(served.version + 1)  # raises if the served weights still differ
    return {"missed_sync": missed, "resynced": True}


def check(workdir: str, kind: str, seed: int = 0, num_prompts: int = 6, max_new_tokens: int = 16, k: int = 3,
          missed_sync: bool = False) -> dict:
    """Run the comparisons of the module docstring for drafter ``kind`` (the planted missed syncs with
    ``missed_sync``); returns a JSON-able report."""
    from specdec_kernels.models import ModelConfig, Qwen3

    torch.manual_seed(seed)
    tok = CharTokenizer()
    train_set, val_set = make_splits(TaskConfig(num_train=128, num_val=16, difficulties=(1,), seed=seed))
    policy = Qwen3(ModelConfig(num_hidden_layers=3, intermediate_size=128))
    supervised_warm_start(policy, train_set, tok, 30, 16, 3e-3, seed)
    policy.eval()
    drafter = build_drafter(kind, policy, seed)
    for p in policy.parameters():
        p.requires_grad_(False)
    warm_start(drafter, policy, problem_batches(train_set, tok, 16, seed + 1), 30, 3e-3, unroll=k - 1)
    prompts = [tok.encode(p.prompt, bos=True) for p in random.Random(seed).sample(val_set, num_prompts)]
    seeds = [0] * len(prompts)
    gen = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, spec="chain", k=k, max_batch=8)
    own = RolloutEngine(policy, drafter, tok.eos_id)
    served = VllmRolloutEngine(policy, drafter, tok, VllmOptions(workdir=workdir, k=k, method=spec_method(kind),
                                                                 seed=seed, max_num_seqs=8))
    report: dict = {"method": served.method}
    try:
        stages = {}
        for stage in ("built", "drafter_pushed", "policy_pushed"):
            if stage == "drafter_pushed":
                _perturb(drafter.trainable(), seed + 5, 0.5, trainable_only=True)
            elif stage == "policy_pushed":
                _perturb(policy, seed + 7, 0.3, trainable_only=False)
            if stage != "built":
                own.sync(len(stages))
                served.sync(len(stages))
            theirs = served.generate(prompts, seeds, gen)
            # vLLM emits a request's first token from the prefill, then drafts: our engine drafts from the
            # prompt on. Started from prompt + that token, ours runs vLLM's rounds exactly.
            first = [p + r[:1] for p, r in zip(prompts, theirs.response_ids, strict=True)]
            ours = own.generate(first, seeds, replace(gen, max_new_tokens=max_new_tokens - 1))
            tokens_equal = [r[:1] + o for r, o in zip(theirs.response_ids, ours.response_ids, strict=True)] == \
                theirs.response_ids and theirs.response_ids == own.generate(prompts, seeds, replace(gen, spec="none")).response_ids
            stages[stage] = {"tokens_equal": tokens_equal, "ours": _counters(ours), "vllm": _counters(theirs),
                             "tokens": theirs.response_ids}
            report[stage] = {k_: v for k_, v in stages[stage].items() if k_ != "tokens"}
        report["drafter_push_kept_output"] = stages["built"]["tokens"] == stages["drafter_pushed"]["tokens"]
        report["drafter_push_changed_acceptance"] = stages["built"]["vllm"] != stages["drafter_pushed"]["vllm"]
        report["policy_push_changed_output"] = stages["drafter_pushed"]["tokens"] != stages["policy_pushed"]["tokens"]
        if missed_sync and kind == "eagle3":
            report.update(planted_missed_syncs(served, policy, drafter, seed))
        report["summary"] = served.summary()
    finally:
        served.close()
    return report


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python -m rl_loop.backends.vllm_check", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--drafter", choices=("eagle3", "draft_model"), nargs="+", default=["eagle3"])
    parser.add_argument("--out", default=None, help="write the JSON result here too")
    parser.add_argument("--missed-sync", action="store_true",
                        help="eagle3: also plant a missed drafter sync, then a missed policy sync (stage 4)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = {kind: check(os.path.join(args.workdir, kind), kind, missed_sync=args.missed_sync)
              for kind in args.drafter}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
