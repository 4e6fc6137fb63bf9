"""``python -m rl_loop``: GRPO on math problems with lossless speculative rollouts (see ``rl_loop/train.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from .config import POLICY_PRESETS, REQUIRED_SUMMARY_KEYS, WORKLOADS, RunConfig, tiny_config, with_workload
from .run.checks import check_values
from .run.usage import UsageError
from .step.decode import DECODE_PATHS
from .step.device import DEVICES, check_device
from .step.rollouts import VERIFY_METHODS
from .step.weight_fingerprint import WeightSyncError
from .train import run

PROG = "python -m rl_loop"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage block): ``PROG: error: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> RunConfig:
    d = RunConfig()
    p = OneLineParser(
        prog=PROG,
        description="Train a small Qwen3 policy with GRPO on math problems; rollouts use lossless speculative "
                    "decoding (specdec_kernels.verify_chain / verify_tree). Writes OUT/summary.json, metrics.jsonl, plots and "
                    "a checkpoint.",
    )
    p.add_argument("--pipeline", choices=("sync", "async"), default=d.pipeline,
                   help="sync: generate -> log-probs -> train; async: generation overlapped with training on a Ray "
                        "actor (policy lag <= 1)")
    p.add_argument("--spec", choices=("none", "chain", "tree"), default=d.spec, help="speculation mode for rollouts")
    p.add_argument("--drafter", choices=("eagle3", "mtp", "draft_model"), default=d.drafter,
                   help="specdec_kernels.drafters head: EAGLE-3 (vLLM serves it as its eagle3 speculator), MTP, "
                        "or a one-layer draft model")
    p.add_argument("--verify", choices=VERIFY_METHODS, default=d.verify,
                   help="verification method: token (token level, chains and trees), block (block verification "
                        "of --spec chain) or traversal (traversal verification of --spec tree); all lossless")
    p.add_argument("--k", type=int, default=d.k, help="draft tokens per verification round")
    p.add_argument("--backend", choices=("own", "vllm"), default=d.backend, help="rollout engine")
    p.add_argument("--steps", type=int, default=d.steps, help="GRPO steps")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=d.out, help="output directory (default: runs/latest)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="rollout sampling temperature")
    p.add_argument("--verify-backend", default=d.verify_backend,
                   help="specdec_kernels backend for verification: default (native CPU if built, else reference), "
                        "reference, cpu, triton, cuda")
    p.add_argument("--policy", choices=tuple(POLICY_PRESETS), default=None,
                   help="policy shape preset: default (12 layers x hidden 96), wide (4 x 256), stream (4 x 1024, "
                        "weights beyond the last-level cache), llm (Qwen3-0.6B's shape and 151936-token vocabulary; a GPU policy), "
                        "llm-tiny (that vocabulary at hidden 64 x 3 layers); default: the configuration's own")
    p.add_argument("--workload", choices=tuple(WORKLOADS), default=d.workload,
                   help="task mix: default (add / mul / countdown scratchpads), search (countdown as search "
                        "traces: less templated, lower draft acceptance)")
    p.add_argument("--decode", choices=DECODE_PATHS, default=d.decode,
                   help="the policy's decode path for both arms (auto: native fused layer step when built)")
    p.add_argument("--device", choices=DEVICES, default=d.device,
                   help="where policy, drafter, KV cache and verification run: cpu (float32, native CPU kernels) "
                        "or cuda (bf16 weights, verify_chain backend auto, CUDA graphs for both arms)")
    p.add_argument("--threads", type=int, default=d.num_threads, help="torch intra-op threads (both arms)")
    p.add_argument("--rollout-workers", type=int, default=d.rollout_workers,
                   help="rollout workers as Ray actors, groups split across them (sync: 1 = in-process); "
                        "RAY_ADDRESS attaches to an existing cluster")
    p.add_argument("--dump-rollouts", action="store_true",
                   help="write OUT/rollouts.jsonl: every step's request seeds and response token ids")
    p.add_argument("--record-mask", action="store_true",
                   help="record per rollout token the ids the sampler kept (its sampling mask)")
    p.add_argument("--mask-logprobs", action="store_true",
                   help="GRPO log-probabilities over the recorded kept sets (implies --record-mask)")
    p.add_argument("--top-k", type=int, default=d.top_k,
                   help="keep the k most likely tokens when sampling, in both arms (0: all; the kept sets are "
                        "what --record-mask records)")
    p.add_argument("--top-p", type=float, default=d.top_p,
                   help="keep the smallest set of most likely tokens holding this probability, in both arms "
                        "(1.0: all)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--no-equivalence", action="store_true", help="skip the AR-vs-speculative equivalence check")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--tiny", action="store_true", help="seconds-long configuration (tests, smoke runs)")
    a = p.parse_args(argv)
    try:
        check_values(a.k, a.steps, a.temperature, a.seed)
        check_device(a.device)
    except UsageError as e:
        p.error(str(e))
    if a.rollout_workers < 1:
        p.error(f"--rollout-workers must be >= 1, got {a.rollout_workers}")
    base = tiny_config() if a.tiny else d
    steps = a.steps if a.steps != d.steps or not a.tiny else base.steps
    if a.policy is not None:
        base = replace(base, model=POLICY_PRESETS[a.policy]())
    base = with_workload(base, a.workload)
    return replace(
        base, pipeline=a.pipeline, spec=a.spec, drafter=a.drafter, k=a.k, backend=a.backend, steps=steps,
        verify=a.verify,
        seed=a.seed, out=a.out, temperature=a.temperature, verify_backend=a.verify_backend, resume=a.resume,
        decode=a.decode, device=a.device, num_threads=a.threads, rollout_workers=a.rollout_workers, dump_rollouts=a.dump_rollouts,
        equivalence=not a.no_equivalence, plots=base.plots and not a.no_plots,
        record_mask=a.record_mask or a.mask_logprobs, mask_logprobs=a.mask_logprobs, top_k=a.top_k, top_p=a.top_p,
    )


def _usage_error(e: ValueError) -> int:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
    except ValueError as e:  # RunConfig's own checks (--rollout-workers, ...)
        return _usage_error(e)
    try:
        summary = run(cfg)  # raises UsageError before any work for a user mistake
    except UsageError as e:
        return _usage_error(e)
    except WeightSyncError as e:  # a missed weight sync stops the run: one line naming the tensor
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: summary.get(k) for k in REQUIRED_SUMMARY_KEYS}, indent=1))
    print(f"wrote {cfg.out}/summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
