"""``python -m rl_loop``: GRPO on math problems with lossless speculative rollouts (see ``rl_loop/train.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields, replace

from .config import POLICY_PRESETS, REQUIRED_SUMMARY_KEYS, RunConfig, flag_of, tiny_config, with_workload
from .run.usage import OneLineParser, UsageError
from .step.weight_fingerprint import WeightSyncError
from .train import run

PROG = "python -m rl_loop"


_TYPES = {"int": int, "float": float, "str": str}


def build_parser() -> OneLineParser:
    """The CLI, generated from :class:`RunConfig`'s option fields (flag, type, choices, help, default), plus
    ``--policy`` and ``--tiny``, which pick the configuration the flags then change. A flag that is not
    given leaves the configuration's own value."""
    p = OneLineParser(
        prog=PROG, argument_default=argparse.SUPPRESS,
        description="Train a small Qwen3 policy with GRPO on math problems; rollouts use lossless speculative "
                    "decoding (specdec_kernels.verify_chain / verify_tree). Writes OUT/summary.json, metrics.jsonl, "
                    "plots and a checkpoint.",
    )
    for f in fields(RunConfig):
        if "help" not in f.metadata:
            continue
        text, choices = f.metadata["help"], f.metadata["choices"]
        if f.type == "bool":
            p.add_argument(flag_of(f), dest=f.name, action="store_false" if f.default else "store_true",
                           help=text + (" (on by default; this flag turns it off)" if f.default else ""))
        else:
            p.add_argument(flag_of(f), dest=f.name, type=_TYPES[f.type], choices=choices,
                           metavar=None if choices else f.name.upper(), help=f"{text} (default: {f.default})")
    p.add_argument("--policy", choices=tuple(POLICY_PRESETS),
                   help="policy shape preset: default (12 layers x hidden 96), wide (4 x 256), stream (4 x 1024, "
                        "weights beyond the last-level cache), llm (Qwen3-0.6B's shape and 151936-token "
                        "vocabulary; a GPU policy), llm-tiny (that vocabulary at hidden 64 x 3 layers); default: "
                        "the configuration's own")
    p.add_argument("--tiny", action="store_true", help="seconds-long configuration (tests, smoke runs)")
    return p


def parse_args(argv: list[str] | None = None) -> RunConfig:
    """The run the command line asks for: ``--tiny``'s configuration or the default one, ``--policy``'s preset,
    ``--workload``'s task mix, then every given flag. A bad value raises ValueError naming its flag."""
    given = vars(build_parser().parse_args(argv))
    cfg = tiny_config() if given.pop("tiny", False) else RunConfig()
    policy = given.pop("policy", None)
    if policy is not None:
        cfg = replace(cfg, model=POLICY_PRESETS[policy]())
    cfg = with_workload(cfg, given.pop("workload", cfg.workload))
    return replace(cfg, **given)


def _usage_error(e: ValueError) -> int:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
    except ValueError as e:  # RunConfig's own checks: a flag's value
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
