"""Block and traversal verification against token level: cost per call on the CPU and accepted lengths.

Subcommands:

``cost``: native CPU time per call of ``verify_chain(method="block")`` vs token level, and of
``verify_tree(method="traversal")`` vs token level, on the same inputs (bench_chain's inputs: logits
N(0, 2^2) with one boosted token of target probability ``p_top`` at temperature 0.8, stochastic drafts
sampled from q = softmax(logits + N(0, 1)); trees: the same rows, siblings drawn from q). The two methods
are timed interleaved, alternating which goes first, for ``--rounds`` rounds of ``--repeats`` calls; each
round gives one median, and the CSV holds the median over rounds with the lowest and highest round. It also
records what each method reads: the mean accepted length and the mean number of target rows visited
(token level stops at its first rejection, block verification reads on until the weight reaches 0), so
the time per row visited shows the extra arithmetic per row (one residual-mass pass).

``acceptance``: exact expected accepted lengths (by enumeration, ``exactness/exact_verify.py``) of token
level, block and traversal on toy Markov targets and drafters, with Hu et al.'s optimal multi-draft
acceptance (depth 1) and the coupling bound (the same optimal transport over whole trees), as a markdown
table and JSON; plus the measured mean accepted length of token level and block on random logits.

Examples::

    python -m benchmarks.bench_block_traversal cost --quick
    python -m benchmarks.bench_block_traversal cost --batch 1,16,64 --k 3,5 --vocab 151936 --threads 2
    python -m benchmarks.bench_block_traversal acceptance --out results/benchmarks/block_traversal_acceptance
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import specdec_kernels as sk
from specdec_kernels import native
from specdec_kernels.exactness import exact_verify as ev
from specdec_kernels.exactness.block_traversal_law import StepCase
from specdec_kernels.reference.block import ratio_weight
from specdec_kernels.reference.sampling import target_probs

from .bench_chain import BENCH_TEMPERATURE, ChainCase, make_inputs
from .common import CsvWriter, OneLineParser, default_csv_path, parse_int_list, provenance, time_fn

COST_COLUMNS = ("op", "method", "batch", "k", "vocab", "dtype", "threads", "lo_ms", "hi_ms", "rounds",
                "mean_accepted", "rows_visited", "ms_per_row", "command")

TREE_SHAPE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]  # width 2, depth 2: 7 nodes


# ----------------------------------------------------------------------------------------------------
# Cost
# ----------------------------------------------------------------------------------------------------

def block_rows_visited(inputs) -> float:
    """Mean target rows the native block kernel reads: rows 0 .. j where the weight first reaches 0 (or the
    bonus row), plus one when the accepted row's residual is empty (rare; not counted)."""
    case = inputs.case
    b, k = case.batch, case.k
    logits = inputs.target_logits.float().view(b, k + 1, -1)
    temp = inputs.temperature
    w = torch.ones(b)
    rows = torch.ones(b)
    alive = torch.ones(b, dtype=torch.bool)
    drafts = inputs.draft_token_ids.view(b, k)
    q = inputs.draft_probs.view(b, k, -1)
    for j in range(k):
        p = target_probs(logits[:, j], temp)
        num = w * p.gather(1, drafts[:, j:j + 1]).squeeze(1)
        w = torch.where(alive, ratio_weight(num, q[:, j].gather(1, drafts[:, j:j + 1]).squeeze(1)), w)
        alive = alive & (w > 0)
        rows = rows + alive.float()
    return float(rows.mean())


def tree_inputs(batch: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> dict:
    """verify_tree inputs: TREE_SHAPE per request, rows as bench_chain's, siblings drawn from q (i.i.d.)."""
    case = ChainCase(batch, len(TREE_SHAPE) + 1, vocab, "float32", "random", "stochastic")
    chain = make_inputs(case, torch.device("cpu"), seed)
    n = len(TREE_SHAPE) + 1
    parents = torch.tensor(ev.parents_from_paths(TREE_SHAPE))
    logits = chain.target_logits.view(batch, n + 1, vocab)[:, :n].reshape(-1, vocab)
    q = torch.softmax(logits + torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed + 1)), -1)
    tokens = torch.full((batch, n), -1, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed + 2)
    q_rows = q.view(batch, n, vocab)
    for i in range(1, n):
        tokens[:, i] = torch.multinomial(q_rows[:, int(parents[i])], 1, generator=gen).squeeze(1)
    return dict(target_logits=logits.to(dtype), node_token_ids=tokens.reshape(-1), parent=parents.repeat(batch),
                cu_num_nodes=torch.arange(batch + 1) * n, draft_probs=q, temperature=chain.temperature,
                seed=chain.seed, position=chain.position, sibling_sampling="iid", validate=False, max_depth=2)


def interleaved(fns: dict[str, object], device: torch.device, rounds: int, repeats: int) -> dict[str, list[float]]:
    """Per-round medians of each callable, the order of the callables alternating between rounds."""
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(time_fn(fns[name], device, warmup=1, repeats=repeats).median_ms)
    return out


def run_cost(args: argparse.Namespace) -> Path:
    device = torch.device("cpu")
    if not native.has_op("verify_chain_block", "cpu"):
        raise SystemExit("bench_block_traversal cost: the native extension (specdec_kernels._C) is not built")
    torch.set_num_threads(args.threads)
    out = args.out or default_csv_path("block_traversal_cost", device)
    prov = {**provenance(device), "command": args.command_line}
    with CsvWriter(out, COST_COLUMNS) as writer:
        for vocab in args.vocab:
            for batch in args.batch:
                for k in args.k:
                    case = ChainCase(batch, k, vocab, args.dtype, "random", "stochastic")
                    inputs = make_inputs(case, device)
                    kwargs = inputs.api_kwargs()
                    results = {m: sk.verify_chain(**kwargs, backend="cpu", method=m) for m in ("token", "block")}
                    rows = {"token": float(results["token"].num_accepted.float().mean()) + 1,
                            "block": block_rows_visited(inputs)}
                    fns = {m: (lambda m=m, kw=kwargs: sk.verify_chain(**kw, backend="cpu", method=m)) for m in rows}
                    times = interleaved(fns, device, args.rounds, args.repeats)
                    for m in ("token", "block"):
                        _write(writer, prov, "chain", m, case, args.threads, times[m], results[m].num_accepted,
                               rows[m])
                    print(_summary("chain", case, times, results, rows), flush=True)
            for batch in args.batch:
                kw = tree_inputs(batch, vocab, getattr(torch, args.dtype))
                results = {m: sk.verify_tree(**kw, backend="cpu", method=m) for m in ("token", "traversal")}
                fns = {m: (lambda m=m, kw=kw: sk.verify_tree(**kw, backend="cpu", method=m)) for m in results}
                times = interleaved(fns, device, args.rounds, args.repeats)
                case = ChainCase(batch, len(TREE_SHAPE), vocab, args.dtype, "random", "stochastic")
                for m in results:
                    _write(writer, prov, "tree-w2d2", m, case, args.threads, times[m], results[m].num_accepted, "")
                print(_summary("tree-w2d2", case, times, results, None), flush=True)
    print(f"wrote {out}")
    return out


def _write(writer, prov, op, method, case, threads, times, accepted, rows) -> None:
    med = statistics.median(times)
    writer.write({
        **prov, "provider": "cpu", "median_ms": f"{med:.4f}", "min_ms": f"{min(times):.4f}",
        "repeats": len(times), "status": "ok", "op": op, "method": method, "batch": case.batch, "k": case.k,
        "vocab": case.vocab, "dtype": case.dtype, "threads": threads, "lo_ms": f"{min(times):.4f}",
        "hi_ms": f"{max(times):.4f}", "rounds": len(times), "mean_accepted": f"{float(accepted.float().mean()):.4f}",
        "rows_visited": f"{rows:.3f}" if rows != "" else "",
        "ms_per_row": f"{med / (rows * case.batch):.5f}" if rows != "" else "",
    })


def _summary(op, case, times, results, rows) -> str:
    names = list(times)
    med = {n: statistics.median(times[n]) for n in names}
    acc = {n: float(results[n].num_accepted.float().mean()) for n in names}
    parts = [f"{op} B={case.batch} k={case.k} V={case.vocab}:"]
    for n in names:
        extra = f", {rows[n]:.2f} rows" if rows else ""
        parts.append(f"{n} {med[n]:.3f} ms [{min(times[n]):.3f}, {max(times[n]):.3f}] acc {acc[n]:.3f}{extra}")
    parts.append(f"ratio {med[names[1]] / med[names[0]]:.3f}")
    return " | ".join(parts)


# ----------------------------------------------------------------------------------------------------
# Acceptance
# ----------------------------------------------------------------------------------------------------

ACCEPTANCE_SHAPES = {  # (parents, sibling modes): small enough for the coupling LP
    "chain k=2": (ev.chain_parents(2), ("iid",)),
    "chain k=3": (ev.chain_parents(3), ("iid",)),
    "chain k=4": (ev.chain_parents(4), ("iid",)),
    "width 2, depth 1": (ev.parents_from_paths([(0,), (1,)]), ("iid", "without_replacement")),
    "width 3, depth 1": (ev.parents_from_paths([(0,), (1,), (2,)]), ("iid", "without_replacement")),
    "width 4, depth 1": (ev.parents_from_paths([(0,), (1,), (2,), (3,)]), ("iid", "without_replacement")),
    "2-1 (3 nodes)": (ev.parents_from_paths([(0,), (1,), (0, 0)]), ("iid", "without_replacement")),
    "width 2, depth 2": (ev.parents_from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]),
                         ("iid", "without_replacement")),
    "3-2 (5 nodes)": (ev.parents_from_paths([(0,), (1,), (2,), (0, 0), (0, 1)]), ("iid", "without_replacement")),
}


def acceptance_rows(vocab: int, toys: int, seed: int) -> list[dict]:
    """Mean over ``toys`` random toys (V tokens, T = 1) of each method's exact expected accepted length."""
    rows = []
    for name, (parents, modes) in ACCEPTANCE_SHAPES.items():
        for mode in modes:
            acc = {m: [] for m in ("token", "block", "traversal", "hu", "coupling")}
            for t in range(toys):
                case = StepCase(name, parents, mode, sk_cfg(), seed + t, vocab_size=vocab, root_token=t % vocab)
                step = case.step()
                acc["token"].append(ev.expected_accepted_length(step, "token"))
                acc["traversal"].append(ev.expected_accepted_length(step, "traversal"))
                if step.is_chain:
                    acc["block"].append(ev.expected_accepted_length(step, "block"))
                if step.max_depth == 1:
                    acc["hu"].append(ev.hu_optimal_acceptance(step))
                acc["coupling"].append(ev.coupling_bound(step))
            row = {"tree": name, "siblings": mode, "vocab": vocab, "toys": toys}
            row.update({m: statistics.fmean(v) for m, v in acc.items() if v})
            rows.append(row)
            print(row, flush=True)
    return rows


def sk_cfg():
    from specdec_kernels.exactness.markov_models import SamplingConfig

    return SamplingConfig(1.0)


def conditional_accepted(inputs) -> dict[str, torch.Tensor]:
    """[B] float64 expected accepted length of each request given its drafts, exactly (the coins integrated
    out): ``exact_verify.chain_conditional_accepted`` on bench_chain's inputs."""
    case = inputs.case
    b, k = case.batch, case.k
    p = target_probs(inputs.target_logits.float(), inputs.temperature.repeat_interleave(k + 1)).view(b, k + 1, -1)
    return ev.chain_conditional_accepted(p, inputs.draft_probs.view(b, k, -1), inputs.draft_token_ids.view(b, k))


def random_logit_rows(batch: int, vocab: int, ks: list[int]) -> list[dict]:
    """Mean accepted length of token level and block on bench_chain's random inputs (T = 0.8): measured by
    the kernels, and the exact expectation given the drafts (coins integrated out: far less noise)."""
    rows = []
    for k in ks:
        inputs = make_inputs(ChainCase(batch, k, vocab, "float32", "random", "stochastic"), torch.device("cpu"))
        kw = inputs.api_kwargs()
        backend = "cpu" if native.has_op("verify_chain_block", "cpu") else "reference"
        acc = {m: sk.verify_chain(**kw, backend=backend, method=m).num_accepted.double() for m in ("token", "block")}
        exact = conditional_accepted(inputs)
        gain = exact["block"] - exact["token"]
        rows.append({"k": k, "vocab": vocab, "batch": batch, "temperature": BENCH_TEMPERATURE,
                     "token": float(acc["token"].mean()), "block": float(acc["block"].mean()),
                     "token_exact": float(exact["token"].mean()), "block_exact": float(exact["block"].mean()),
                     "gain_exact": float(gain.mean()), "gain_se": float(gain.std() / batch ** 0.5)})
        print(rows[-1], flush=True)
    return rows


def markdown(toy_rows: list[dict], logit_rows: list[dict]) -> str:
    lines = [
        "| tree | siblings | token | block | traversal | Hu et al. optimum | coupling bound | gap traversal -> bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in toy_rows:
        best = r["coupling"]
        lines.append(
            f"| {r['tree']} | {r['siblings']} | {r['token']:.4f} | "
            + (f"{r['block']:.4f}" if "block" in r else "-") + f" | {r['traversal']:.4f} | "
            + (f"{r['hu']:.4f}" if "hu" in r else "-") + f" | {best:.4f} | {max(best - r['traversal'], 0.0):.4f} |"
        )
    lines += ["", "| k | V | requests | token: measured / given drafts | block: measured / given drafts | "
              "gain given drafts (se) |", "|---|---|---|---|---|---|"]
    for r in logit_rows:
        lines.append(f"| {r['k']} | {r['vocab']} | {r['batch']} | {r['token']:.4f} / {r['token_exact']:.4f} | "
                     f"{r['block']:.4f} / {r['block_exact']:.4f} | {r['gain_exact']:+.4f} ({r['gain_se']:.4f}) |")
    return "\n".join(lines) + "\n"


def run_acceptance(args: argparse.Namespace) -> Path:
    torch.set_num_threads(args.threads)
    toy_rows = acceptance_rows(args.toy_vocab, args.toys, args.seed)
    logit_rows = random_logit_rows(args.requests, args.vocab[0], args.k)
    out = args.out or Path("results/benchmarks/block_traversal_acceptance")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.bench_block_traversal acceptance " + " ".join(sys.argv[2:])
    meta = {**provenance(torch.device("cpu")), "command": command}
    out.with_suffix(".json").write_text(json.dumps({"provenance": meta, "toys": toy_rows, "random_logits": logit_rows},
                                                   indent=1) + "\n")
    out.with_suffix(".md").write_text(f"<!-- {command} ({meta['git_commit']}, {meta['date_utc']}) -->\n"
                                      + markdown(toy_rows, logit_rows))
    print(f"wrote {out.with_suffix('.md')} and .json")
    return out.with_suffix(".md")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m benchmarks.bench_block_traversal", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cost = sub.add_parser("cost", help="CPU time per call, block / traversal vs token level")
    cost.add_argument("--quick", action="store_true", help="B = 1, 16; k = 3; V = 32000; 3 rounds")
    cost.add_argument("--batch", type=parse_int_list, default=[1, 16, 64])
    cost.add_argument("--k", type=parse_int_list, default=[3, 5])
    cost.add_argument("--vocab", type=parse_int_list, default=[151936])
    cost.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    cost.add_argument("--threads", type=int, default=1)
    cost.add_argument("--rounds", type=int, default=7)
    cost.add_argument("--repeats", type=int, default=5)
    cost.add_argument("--out", type=Path, default=None)
    acc = sub.add_parser("acceptance", help="exact accepted lengths on toys, measured on random logits")
    acc.add_argument("--toy-vocab", type=int, default=4)
    acc.add_argument("--toys", type=int, default=8, help="random toys averaged per row")
    acc.add_argument("--seed", type=int, default=0)
    acc.add_argument("--requests", type=int, default=4096)
    acc.add_argument("--vocab", type=parse_int_list, default=[32000])
    acc.add_argument("--k", type=parse_int_list, default=[2, 3, 5])
    acc.add_argument("--threads", type=int, default=1)
    acc.add_argument("--out", type=Path, default=None, help="path stem: writes .md and .json")
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    args.command_line = "python -m benchmarks.bench_block_traversal " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.command == "cost":
        if args.quick:
            args.batch, args.k, args.vocab, args.rounds, args.repeats = [1, 16], [3], [32000], 3, 3
        return run_cost(args)
    return run_acceptance(args)


if __name__ == "__main__":
    main()
