"""Whole-sequence exactness of tree verification on toy Markov targets and drafters.

Each case generates sequences by repeated draft-tree building + ``verify_tree`` and compares their law
with the exactly enumerated autoregressive law (chi-square, Bonferroni-corrected family-wise false-positive
rate of the suite's ``gof.SUITE_BUDGET``, where each case claims a slot). The same check is shown to
reject planted bugs.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats as scipy_stats

import specdec_kernels.reference.tree as ref_tree
from specdec_kernels.drafters.tree_builder import (
    TreeTopology,
    build_dynamic_tree,
    build_static_tree,
    full_tree_paths,
)
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness import markov_trees
from specdec_kernels.reference import philox
from tests.exactness.tree_law_helpers import (
    ALPHA,
    DRAFT,
    TARGET,
    sequence_law_p_value,
    single_thread,  # noqa: F401  (autouse fixture)
)

# Laws sampled to power 0.999 at total variation 0.02: the full suite runs them, the fast tier does not.
pytestmark = [pytest.mark.stat, pytest.mark.slow]

# Trees covering widths 1-4 and depths 1-4.
TREES = {
    "w3d2": full_tree_paths([3, 2]),
    "chain4": full_tree_paths([1, 1, 1, 1]),
    "w4d1": full_tree_paths([4]),
    "w2d3": [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)],
}
SETTINGS = {  # temperature, top_k, top_p
    "t1": (1.0, 0, 1.0),
    "t0.7-k2": (0.7, 2, 1.0),
    "t1.3-p0.8": (1.3, 0, 0.8),
    "t0.8-k3-p0.9": (0.8, 3, 0.9),
}
ALGORITHMS = {"deterministic": None, "iid": "iid", "without_replacement": "without_replacement"}

# Covering design: every (algorithm, tree) and (algorithm, setting) pair twice, 24 cases.
CASES = []
for a_i, alg in enumerate(ALGORITHMS):
    for t_i, tree in enumerate(TREES):
        for shift in (0, 1):
            setting = list(SETTINGS)[(t_i + a_i + shift) % len(SETTINGS)]
            CASES.append((alg, tree, setting))


@pytest.mark.parametrize("alg,tree,setting", CASES, ids=["-".join(c) for c in CASES])
def test_sequence_law(alg, tree, setting):
    temperature, top_k, top_p = SETTINGS[setting]
    seed = CASES.index((alg, tree, setting))
    alpha = gof.SUITE_BUDGET.claim(f"tree-law-{alg}-{tree}-{setting}")
    p = sequence_law_p_value(TREES[tree], ALGORITHMS[alg], temperature, top_k, top_p, seed=seed)
    assert p >= alpha, f"sequence law rejected: p = {p:.3g} < {alpha:.3g}"


@pytest.mark.parametrize("alg", list(ALGORITHMS))
def test_greedy_emits_the_argmax_sequence(alg):
    seqs, _ = markov_trees.generate_with_trees(
        TARGET, DRAFT, TREES["w2d3"], ALGORITHMS[alg], 0.0, 0, 1.0, first_token=2, length=6,
        num_seqs=64, seed=3,
    )
    expected = [2]
    for _ in range(6):
        expected.append(int(TARGET[expected[-1]].argmax()))
    assert (seqs == torch.tensor(expected[1:])).all()


# ----------------------------------------------------------------------------------------------------
# Power: the same check rejects planted bugs.
# ----------------------------------------------------------------------------------------------------

def _no_residual_update(p, q):
    return p


def _unnormalised_residual(p, q):
    residual = torch.clamp(p - q, min=0.0)
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)


def _reversed_siblings(layout):
    table = _ORIGINAL_CHILDREN_TABLE(layout)
    count = (table >= 0).sum(-1, keepdim=True)
    idx = torch.arange(table.shape[1])[None, :]
    rev = torch.where(idx < count, count - 1 - idx, idx)
    return table.gather(1, rev)


_ORIGINAL_CHILDREN_TABLE = ref_tree.children_table
_ORIGINAL_COINS = philox.coins


def _shared_sibling_coin(seed, position, slot=0):
    return _ORIGINAL_COINS(seed, position, 0)


MUTANTS = {
    # name: (patches, algorithm, verifier sibling_sampling override, extra kwargs)
    "residual-not-updated": ([("residual_distribution", _no_residual_update)], "iid", None, {}),
    "unnormalised-residual": ([("residual_distribution", _unnormalised_residual)], "iid", None, {}),
    "wrong-sibling-order": ([("children_table", _reversed_siblings)], "without_replacement", None, {}),
    "iid-draws-verified-as-without-replacement": ([], "iid", "without_replacement", {"validate": False}),
    "without-replacement-draws-verified-as-iid": ([], "without_replacement", "iid", {}),
    "coin-reused-across-siblings": ([("philox.coins", _shared_sibling_coin)], "iid", None, {}),
    "position-not-advanced": ([], None, None, {"advance_position": False}),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_bug_is_rejected(name, monkeypatch):
    patches, alg, verify_as, kwargs = MUTANTS[name]
    for attr, fn in patches:
        if attr.startswith("philox."):
            monkeypatch.setattr(philox, attr.split(".")[1], fn)
        else:
            monkeypatch.setattr(ref_tree, attr, fn)
    p = sequence_law_p_value(
        full_tree_paths([3, 2]), alg, 1.0, seed=5, verify_sampling=verify_as, **kwargs
    )
    print(f"{name}: p = {p:.3g}")
    assert p < ALPHA, f"planted bug {name!r} not detected: p = {p:.3g}"


# ----------------------------------------------------------------------------------------------------
# Optimality and acceptance
# ----------------------------------------------------------------------------------------------------

def _mean_accepted(tree, temperature, top_k=0, top_p=1.0, sibling_sampling="iid", seed=0):
    import specdec_kernels as sk

    num_reqs = tree.num_requests
    g = torch.Generator().manual_seed(seed)
    res = sk.verify_tree(
        TARGET[tree.node_token_ids], tree.node_token_ids, tree.parent, tree.cu_num_nodes, tree.draft_probs,
        torch.full((num_reqs,), temperature), torch.full((num_reqs,), top_k, dtype=torch.int32),
        torch.full((num_reqs,), top_p), torch.randint(0, 2**62, (num_reqs,), generator=g),
        sibling_sampling=sibling_sampling or "iid", backend="reference",
    )
    return res.num_accepted.double()


@pytest.mark.parametrize("kind", ["static", "dynamic"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9)])
def test_deterministic_tree_accepts_the_exact_bound(kind, temperature, top_k, top_p):
    """Target-only verification accepts, in expectation, sum over nodes of p(path to the node)."""
    num_reqs = 20_000
    context = torch.randint(0, TARGET.shape[0], (num_reqs, 1), generator=torch.Generator().manual_seed(1))
    drafter = markov_trees.MarkovDrafter(DRAFT)
    if kind == "static":
        tree = build_static_tree(drafter, context, TreeTopology.from_paths(TREES["w2d3"]))
    else:
        tree = build_dynamic_tree(drafter, context, depth=3, top_k=2, beam=2, budget=6)
    accepted = _mean_accepted(tree, temperature, top_k, top_p)
    exact = markov_trees.expected_accepted_length(tree, markov_trees.transition_matrix(TARGET, temperature, top_k, top_p))
    se = float(accepted.std()) / math.sqrt(num_reqs)
    z = (float(accepted.mean()) - float(exact.mean())) / se
    alpha = gof.SUITE_BUDGET.claim(f"tree-acceptance-bound-{kind}-T{temperature}-p{top_p}")
    z_crit = float(scipy_stats.norm.isf(alpha / 2))
    assert abs(z) < z_crit, f"mean accepted {float(accepted.mean()):.4f} vs exact {float(exact.mean()):.4f} (z = {z:.2f})"


def test_rrs_accepts_at_least_as_much_as_multistep():
    num_reqs = 40_000
    context = torch.randint(0, TARGET.shape[0], (num_reqs, 1), generator=torch.Generator().manual_seed(2))
    drafter = markov_trees.MarkovDrafter(DRAFT)
    topology = TreeTopology.from_paths(full_tree_paths([3, 2]))
    means = {}
    for i, mode in enumerate(("iid", "without_replacement")):
        tree = build_static_tree(drafter, context, topology, mode, torch.Generator().manual_seed(10 + i))
        means[mode] = _mean_accepted(tree, 1.0, sibling_sampling=mode, seed=20 + i)
    iid, rrs = means["iid"], means["without_replacement"]
    se = math.sqrt(float(iid.var()) / num_reqs + float(rrs.var()) / num_reqs)
    print(f"mean accepted: multi-step (iid) {float(iid.mean()):.4f}, RRS (without replacement) {float(rrs.mean()):.4f}")
    alpha = gof.SUITE_BUDGET.claim("tree-rrs-vs-multistep")
    assert float(rrs.mean()) >= float(iid.mean()) - float(scipy_stats.norm.isf(alpha)) * se
