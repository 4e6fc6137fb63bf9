"""``python -m rl_loop.sim``: project the speedup of speculative rollouts on RL step time.

    python -m rl_loop.sim --preset paper-8b-think|paper-8b-zero|paper-235b|paper-235b-512|cpu-here [--k K] [--json]
    python -m rl_loop.sim sweep [--preset ...] [--out DIR]     (tables and plots; see ``sweep --help``)
"""

from __future__ import annotations

import json
import sys

from ..run.usage import OneLineParser
from .presets import PRESETS, evaluate, get_preset

PRESET_NAMES = (*PRESETS, "cpu-here")


def _round(x):
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def report(name: str, k: int | None) -> dict:
    """Everything the CLI prints for one preset: the evaluation, the paper's figures, the assumptions."""
    scn = get_preset(name)
    result = evaluate(scn, k)
    result["description"] = scn.description
    result["hardware"] = scn.hardware.name
    result["model"] = scn.model.name
    result["gpus"] = scn.setup.gpus
    result["acceptance"] = list(scn.spec.acceptance)
    result["paper"] = dict(scn.paper)
    result["assumptions"] = list(scn.assumptions)
    return _round(result)


def format_report(r: dict) -> str:
    paper = r["paper"]

    def line(label: str, key: str, paper_key: str | None = None) -> str:
        p = paper.get(paper_key or key)
        ours = r[key]
        ours_s = f"{ours:.2f}x" if isinstance(ours, float) else str(ours)
        return f"  {label:<34s} {ours_s:>8s}   paper: {p if p is not None else '-'}"

    out = [f"{r['preset']}: {r['description']}",
           f"  {r['model']} on {r['gpus']} x {r['hardware']}, k = {r['k']}, "
           f"{r['tokens_per_step']:.2f} tokens per verification step, async policy lag {r['policy_lag']}",
           line("generation speedup (sync)", "generation_speedup"),
           line("step speedup (sync)", "step_speedup"),
           line("async speedup (same pools)", "async_speedup"),
           line("async rollout speedup (AR pool)", "async_rollout_speedup"),
           line("end-to-end (async, each balanced)", "end_to_end_speedup"),
           line("sync AR -> async spec", "sync_to_async_speedup"),
           line("best k (generation)", "best_k"),
           "  generation speedup by k: " + ", ".join(f"{k}: {v:.2f}x" for k, v in r["generation_speedup_by_k"].items()),
           f"  generation share of the AR step: {r['generation_fraction_ar'] * 100:.0f}%",
           *([f"  async operating point: AR step {op['ar_step']:.1f} s ({op['ar_exposed']:.1f} s exposed "
              f"generation), spec step {op['spec_step']:.1f} s ({op['spec_exposed']:.1f} s exposed), between "
              f"{op['splits'][0]} and {op['splits'][1]} generation replicas"]
             if (op := r.get("async_operating_point")) else []),
           "  sync AR phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in r["phases_sync_ar"].items()),
           "  sync spec phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in r["phases_sync_spec"].items()),
           "  assumptions:"]
    out += [f"    - {a}" for a in r["assumptions"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sweep":
        from .sweep import main as sweep_main

        return sweep_main(argv[1:])
    parser = OneLineParser(prog="python -m rl_loop.sim", description=__doc__.split("\n\n")[0],
                           epilog="subcommand: sweep (python -m rl_loop.sim sweep --help)")
    parser.add_argument("--preset", required=True, choices=PRESET_NAMES)
    parser.add_argument("--k", type=int, default=None, help="draft length (default: the preset's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.k is not None and not 1 <= args.k <= 16:
        parser.error("--k must be in [1, 16]")
    result = report(args.preset, args.k)
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
