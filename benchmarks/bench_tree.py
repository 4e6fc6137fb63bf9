"""Mean accepted length of chain vs static tree vs dynamic (EAGLE-2) tree at equal node budgets.

Two workloads: a toy Markov model (V = 32, peaked logits, drafter = noisy copy of the target) and
random logits (V = 1024 Markov table of N(0, 3^2) logits, same kind of drafter). Every tree is deterministic (top-k
drafts) and verified by ``verify_tree`` (target-only: optimal for a fixed tree) at temperature 1; the
exact expectation (sum over nodes of the target probability of the node's path) is printed next to
the measured mean. A last table compares stochastic trees: i.i.d. siblings with SpecInfer multi-step
verification vs siblings drawn without replacement with recursive rejection sampling.
All columns of a table share contexts and seeds (common random numbers), so differences between
columns are less noisy than each value; the exact column is noise-free.

Usage: python -m benchmarks.bench_tree [--requests 2000] [--budgets 4 8 16]
"""

from __future__ import annotations

import argparse

import torch

import specdec_kernels as sk
from specdec_kernels.drafters.tree_builder import (
    TreeTopology,
    build_dynamic_tree,
    build_static_tree,
    chain_paths,
)
from specdec_kernels.testing import toy_trees


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


def mean_accepted(tree, target, temperature=1.0, sibling_sampling="iid", seed=0):
    num_reqs = tree.num_requests
    g = torch.Generator().manual_seed(seed)
    res = sk.verify_tree(
        target[tree.node_token_ids], tree.node_token_ids, tree.parent, tree.cu_num_nodes, tree.draft_probs,
        torch.full((num_reqs,), temperature), seed=torch.randint(0, 2**62, (num_reqs,), generator=g),
        sibling_sampling=sibling_sampling, backend="reference",
    )
    return float(res.num_accepted.double().mean())


def run(name: str, vocab: int, scale: float, noise: float, requests: int, budgets: list[int]) -> None:
    target, draft = toy_trees.markov_tables(vocab, seed=0, scale=scale, draft_noise=noise)
    transition = toy_trees.transition_matrix(target, 1.0)
    drafter = toy_trees.MarkovDrafter(draft)
    context = torch.randint(0, vocab, (requests, 1), generator=torch.Generator().manual_seed(1))
    alpha = rank_acceptance(target, draft, 4)
    print(f"\n## {name}: V = {vocab}, {requests} requests, temperature 1; per-rank acceptance "
          f"{[round(float(a), 3) for a in alpha]}")
    print("| nodes | chain (measured / exact) | static tree | dynamic tree (EAGLE-2) |")
    print("|---|---|---|---|")
    for budget in budgets:
        cells = []
        trees = [
            build_static_tree(drafter, context, TreeTopology.from_paths(chain_paths(budget))),
            build_static_tree(drafter, context, TreeTopology.from_paths(static_paths(alpha, budget))),
            build_dynamic_tree(drafter, context, depth=min(budget, 6), top_k=4, beam=min(4, budget),
                               budget=budget),
        ]
        for tree in trees:
            measured = mean_accepted(tree, target)
            exact = float(toy_trees.expected_accepted_length(tree, transition).mean())
            cells.append(f"{measured:.3f} / {exact:.3f}")
        print(f"| {budget} | " + " | ".join(cells) + " |")
    print("\nStochastic trees (static shape above, siblings drawn from q), mean accepted length:")
    print("| nodes | i.i.d. + multi-step | without replacement + RRS |")
    print("|---|---|---|")
    for budget in budgets:
        topo = TreeTopology.from_paths(static_paths(alpha, budget))
        cells = []
        for i, mode in enumerate(("iid", "without_replacement")):
            tree = build_static_tree(drafter, context, topo, mode, torch.Generator().manual_seed(5 + i))
            cells.append(f"{mean_accepted(tree, target, sibling_sampling=mode, seed=7 + i):.3f}")
        print(f"| {budget} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16])
    args = parser.parse_args()
    torch.set_num_threads(1)
    run("toy Markov model", 32, 4.0, 1.0, args.requests, args.budgets)
    run("random logits", 1024, 3.0, 1.5, args.requests, args.budgets)


if __name__ == "__main__":
    main()
