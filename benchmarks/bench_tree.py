"""Mean accepted length of chain vs static tree vs dynamic (EAGLE-2) tree at equal node budgets.

Two workloads: a toy Markov model (V = 32, peaked logits, drafter = noisy copy of the target) and
random logits (V = 1024 Markov table of N(0, 3^2) logits, same kind of drafter). Every tree is
deterministic (top-k drafts) and verified by ``verify_tree`` (target-only: optimal for a fixed tree) at
temperature 1 (RL rollouts); beside each measured mean stands the exact expectation given the same
contexts and trees (sum over nodes of the target probability of the node's path). A last table compares
stochastic trees: i.i.d. siblings with SpecInfer multi-step verification vs siblings drawn without
replacement with recursive rejection sampling (no closed form here: measured only).

Protocol: ``--sets`` independent request sets per workload (set s: its own uniform contexts, sibling and
verification seeds; the workload's tables are fixed), ``--requests`` requests each. A cell gives the mean
accepted length over all requests of all sets, its 95 % percentile-bootstrap interval over requests
(1000 resamples), the lowest and highest set mean, the exact expectation, and measured - exact with the
bootstrap interval of the per-request difference (the contexts' spread cancels in it). All trees of one set share
contexts and seeds (common random numbers), so differences between columns are less noisy than each value.

Usage (the committed files)::

    python -m benchmarks.bench_tree --out results/benchmarks/tree_acceptance.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import specdec_kernels as sk
from benchmarks.common import CsvWriter, OneLineParser, provenance
from specdec_kernels.drafters.tree_builder import (
    TreeTopology,
    build_dynamic_tree,
    build_static_tree,
    chain_paths,
)
from specdec_kernels.exactness import markov_trees

WORKLOADS = {"toy": ("toy Markov model", 32, 4.0, 1.0), "random": ("random logits", 1024, 3.0, 1.5)}
DETERMINISTIC = ("chain", "static", "dynamic")
STOCHASTIC = ("iid", "without_replacement")
CASE_COLUMNS = ("workload", "vocab", "nodes", "tree", "sibling_sampling", "temperature", "sets", "requests")
RESULT_COLUMNS = ("mean_accepted", "ci95_low", "ci95_high", "set_min", "set_max", "exact", "minus_exact",
                  "minus_exact_ci95_low", "minus_exact_ci95_high", "command")


def rank_acceptance(target: torch.Tensor, draft: torch.Tensor, max_rank: int) -> torch.Tensor:
    """[max_rank] mean target probability of the drafter's rank-r token, over uniform contexts."""
    p = torch.softmax(target.float(), -1)
    order = torch.argsort(draft, dim=-1, descending=True)[:, :max_rank]
    return p.gather(1, order).mean(0)


def static_paths(alpha: torch.Tensor, budget: int) -> list[tuple[int, ...]]:
    """The ``budget`` paths with the largest product of per-rank acceptance (best-first, so a tree)."""
    frontier = [((r,), float(alpha[r])) for r in range(alpha.numel())]
    chosen: list[tuple[int, ...]] = []
    while len(chosen) < budget:
        frontier.sort(key=lambda x: -x[1])
        path, score = frontier.pop(0)
        chosen.append(path)
        frontier.extend((path + (r,), score * float(alpha[r])) for r in range(alpha.numel()))
    return chosen


def accepted_lengths(tree, target, temperature=1.0, sibling_sampling="iid", seed=0) -> torch.Tensor:
    """[B] accepted length per request of one ``verify_tree`` call (reference backend)."""
    num_reqs = tree.num_requests
    g = torch.Generator().manual_seed(seed)
    res = sk.verify_tree(
        target[tree.node_token_ids], tree.node_token_ids, tree.parent, tree.cu_num_nodes, tree.draft_probs,
        torch.full((num_reqs,), temperature), seed=torch.randint(0, 2**62, (num_reqs,), generator=g),
        sibling_sampling=sibling_sampling, backend="reference",
    )
    return res.num_accepted.double()


def bootstrap_ci(values: torch.Tensor, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of ``values``."""
    g = torch.Generator().manual_seed(seed)
    means = torch.stack([values[torch.randint(0, values.numel(), (values.numel(),), generator=g)].mean()
                         for _ in range(resamples)])
    return float(torch.quantile(means, 0.025)), float(torch.quantile(means, 0.975))


def run_workload(key: str, sets: int, requests: int, budgets: list[int]) -> tuple[list[dict], str]:
    """Rows (one per budget x tree) and the per-rank acceptance line of one workload."""
    _, vocab, scale, noise = WORKLOADS[key]
    target, draft = markov_trees.markov_tables(vocab, seed=0, scale=scale, draft_noise=noise)
    transition = markov_trees.transition_matrix(target, 1.0)
    drafter = markov_trees.MarkovDrafter(draft)
    alpha = rank_acceptance(target, draft, 4)
    measured: dict[tuple[int, str], list[torch.Tensor]] = {}
    exact: dict[tuple[int, str], list[torch.Tensor]] = {}
    for s in range(sets):
        context = torch.randint(0, vocab, (requests, 1), generator=torch.Generator().manual_seed(1 + s))
        for budget in budgets:
            static = TreeTopology.from_paths(static_paths(alpha, budget))
            trees = {
                "chain": build_static_tree(drafter, context, TreeTopology.from_paths(chain_paths(budget))),
                "static": build_static_tree(drafter, context, static),
                "dynamic": build_dynamic_tree(drafter, context, depth=min(budget, 6), top_k=4, beam=min(4, budget),
                                              budget=budget),
            }
            for name, tree in trees.items():
                measured.setdefault((budget, name), []).append(accepted_lengths(tree, target, seed=1000 * s))
                exact.setdefault((budget, name), []).append(markov_trees.expected_accepted_length(tree, transition))
            for i, mode in enumerate(STOCHASTIC):
                tree = build_static_tree(drafter, context, static, mode, torch.Generator().manual_seed(5 + i + 10 * s))
                measured.setdefault((budget, mode), []).append(
                    accepted_lengths(tree, target, sibling_sampling=mode, seed=7 + i + 1000 * s))
    rows = []
    for (budget, name), per_set in measured.items():
        pooled = torch.cat(per_set)
        lo, hi = bootstrap_ci(pooled)
        set_means = [float(x.mean()) for x in per_set]
        rows.append({"workload": key, "vocab": vocab, "nodes": budget,
                     "tree": "static" if name in STOCHASTIC else name,
                     "sibling_sampling": name if name in STOCHASTIC else "top-k", "temperature": 1, "sets": sets,
                     "requests": requests, "mean_accepted": f"{float(pooled.mean()):.4f}", "ci95_low": f"{lo:.4f}",
                     "ci95_high": f"{hi:.4f}", "set_min": f"{min(set_means):.4f}", "set_max": f"{max(set_means):.4f}",
                     **(_minus_exact(pooled, torch.cat(exact[budget, name])) if (budget, name) in exact else {})})
    return rows, str([round(float(a), 3) for a in alpha])


def _minus_exact(measured: torch.Tensor, exact: torch.Tensor) -> dict:
    """The exact mean and the measured - exact difference with its 95 % bootstrap interval over requests (paired
    per request: the contexts' spread cancels, only the verification's own randomness is left)."""
    diff = measured - exact
    lo, hi = bootstrap_ci(diff, seed=1)
    return {"exact": f"{float(exact.mean()):.4f}", "minus_exact": f"{float(diff.mean()):+.4f}",
            "minus_exact_ci95_low": f"{lo:+.4f}", "minus_exact_ci95_high": f"{hi:+.4f}"}


def _cell(row: dict) -> str:
    text = f"{float(row['mean_accepted']):.3f} [{float(row['ci95_low']):.3f}, {float(row['ci95_high']):.3f}]"
    if not row.get("exact"):
        return text
    return text + (f" / {float(row['exact']):.3f} ({float(row['minus_exact']):+.3f} "
                   f"[{float(row['minus_exact_ci95_low']):+.3f}, {float(row['minus_exact_ci95_high']):+.3f}])")


def markdown(rows: list[dict], alphas: dict[str, str], info: dict, sets: int, requests: int) -> str:
    lines = [f"# Tree acceptance: `{info['command']}`", "",
             f"Written by that command: {info['device']}, torch {info['torch']}, commit {info['git_commit']}, "
             f"{info['date_utc']}. Mean accepted length per verification step (bonus token excluded), temperature 1, "
             f"reference backend; {sets} independent request sets x {requests} requests per workload. A cell: mean "
             "over all requests [95 % bootstrap interval over requests] / exact expectation given the same contexts and "
             "trees (measured - exact [95 % bootstrap interval of the per-request difference]); the lowest and "
             "highest set mean are in the CSV beside this file.", ""]
    for key, (title, vocab, _, _) in WORKLOADS.items():
        mine = [r for r in rows if r["workload"] == key]
        if not mine:
            continue
        budgets = sorted({int(r["nodes"]) for r in mine})
        cell = {(int(r["nodes"]), r["sibling_sampling"] if r["sibling_sampling"] != "top-k" else r["tree"]): r
                for r in mine}
        lines += [f"## {title}: V = {vocab}; per-rank acceptance {alphas[key]}", "",
                  "| nodes | chain: measured [95 % CI] / exact (measured - exact [95 % CI]) | static tree | dynamic tree (EAGLE-2) |",
                  "|---|---|---|---|"]
        lines += [f"| {b} | " + " | ".join(_cell(cell[b, t]) for t in DETERMINISTIC) + " |" for b in budgets]
        lines += ["", "Stochastic trees (static shape above, siblings drawn from q), mean accepted length [95 % CI]:",
                  "", "| nodes | i.i.d. + multi-step | without replacement + RRS |", "|---|---|---|"]
        lines += [f"| {b} | " + " | ".join(_cell(cell[b, t]) for t in STOCHASTIC) + " |" for b in budgets]
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m benchmarks.bench_tree", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per set")
    parser.add_argument("--sets", type=int, default=5, help="independent request sets (contexts and seeds)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--out", required=True, help="CSV path; the markdown tables go beside it (.md)")
    args = parser.parse_args(argv)
    if args.requests < 2 or args.sets < 1 or min(args.budgets) < 1:
        parser.error("--requests must be >= 2, --sets >= 1 and every budget >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    command = "python -m benchmarks.bench_tree " + " ".join(sys.argv[1:] if argv is None else argv)
    info = {**provenance(torch.device("cpu")), "command": command.strip()}
    rows, alphas = [], {}
    for key in args.workloads:
        found, alphas[key] = run_workload(key, args.sets, args.requests, args.budgets)
        rows += found
    out = Path(args.out)
    with CsvWriter(out, CASE_COLUMNS + RESULT_COLUMNS) as w:
        for row in rows:
            w.write({**info, **row, "provider": "reference", "status": "ok"})
    text = markdown(rows, alphas, info, args.sets, args.requests)
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
