"""Tree builders: static / dynamic / stochastic trees, drafter state plumbing, mask, KV compaction."""

from __future__ import annotations

import itertools

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.drafters.tree_builder import (
    TreeTopology,
    build_dynamic_tree,
    build_static_tree,
    chain_paths,
    compact_kv_cache,
    full_tree_paths,
    tree_attention_mask,
)
from specdec_kernels.exactness import markov_trees

VOCAB = 9
TARGET, DRAFT = markov_trees.markov_tables(VOCAB, seed=4)


class FingerprintDrafter(markov_trees.MarkovDrafter):
    """Markov drafter whose state fingerprints the node (token, sequence length); checks that every call
    receives its parent's fingerprint."""

    def __call__(self, tokens, parent_state):
        if parent_state is None:
            assert self.calls == 0
        else:
            assert torch.equal(parent_state, tokens[:, -2] * 1000 + tokens.shape[1] - 1)
        log_probs, _ = super().__call__(tokens, parent_state)
        return log_probs, tokens[:, -1] * 1000 + tokens.shape[1]


def test_topology_from_paths():
    topo = TreeTopology.from_paths([(1,), (0, 0), (0,), (0, 1), (0, 0, 2)])
    assert topo.parent.tolist() == [-1, 0, 0, 1, 1, 3]
    assert topo.depth.tolist() == [0, 1, 1, 2, 2, 3]
    assert topo.rank.tolist() == [0, 0, 1, 0, 1, 2]
    assert TreeTopology.from_paths(chain_paths(3)).parent.tolist() == [-1, 0, 1, 2]
    assert len(full_tree_paths([2, 3])) == 2 + 6
    for bad, match in (([(0, 1)], "prefix"), ([(0,), (0,)], "duplicate"), ([(-1,)], "ranks"), ([()], "non-empty")):
        with pytest.raises(ValueError, match=match):
            TreeTopology.from_paths(bad)


def test_static_deterministic_tree_uses_ranked_draft_tokens():
    context = torch.tensor([[3, 1], [0, 5], [2, 8]])
    paths = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    tree = build_static_tree(FingerprintDrafter(DRAFT), context, TreeTopology.from_paths(paths))
    n = len(paths) + 1
    assert tree.draft_probs is None and tree.cu_num_nodes.tolist() == [0, n, 2 * n, 3 * n]
    tokens = tree.node_token_ids.view(3, n)
    order = torch.argsort(DRAFT, dim=-1, descending=True, stable=True)
    topo = TreeTopology.from_paths(paths)
    for b in range(3):
        assert int(tokens[b, 0]) == int(context[b, -1])
        for i in range(1, n):
            par_tok = int(tokens[b, int(topo.parent[i])])
            assert int(tokens[b, i]) == int(order[par_tok, int(topo.rank[i])])
    res = sk.verify_tree(TARGET[tree.node_token_ids], tree.node_token_ids, tree.parent, tree.cu_num_nodes,
                         backend="reference")  # passes validation (distinct siblings, valid parents)
    assert res.output_token_ids.shape == (3, 4)


@pytest.mark.parametrize("mode", ["iid", "without_replacement"])
def test_static_stochastic_tree_rows_and_draws(mode):
    num_reqs = 2000
    context = torch.randint(0, VOCAB, (num_reqs, 1), generator=torch.Generator().manual_seed(0))
    topo = TreeTopology.from_paths(full_tree_paths([3, 2]))
    tree = build_static_tree(FingerprintDrafter(DRAFT), context, topo, mode, torch.Generator().manual_seed(1))
    n = topo.num_nodes
    q = tree.draft_probs.view(num_reqs, n, VOCAB)
    tokens = tree.node_token_ids.view(num_reqs, n)
    expected_q = torch.softmax(DRAFT, -1)
    has_kids = torch.bincount(topo.parent[1:], minlength=n) > 0
    for i in range(n):
        if has_kids[i]:
            assert torch.allclose(q[:, i], expected_q[tokens[:, i]], atol=1e-6)
        else:
            assert (q[:, i] == 0).all()
    kids = tokens[:, 1:4]
    distinct = (kids[:, 0] != kids[:, 1]) & (kids[:, 0] != kids[:, 2]) & (kids[:, 1] != kids[:, 2])
    if mode == "without_replacement":
        assert distinct.all()
    else:
        assert not distinct.all()  # i.i.d. draws repeat tokens
    # First draws follow q(. | root): mean of the indicator matches within a loose bound.
    first = kids[:, 0]
    freq = torch.bincount(first, minlength=VOCAB).double() / num_reqs
    exp = expected_q[context[:, 0]].double().mean(0)
    assert (freq - exp).abs().max() < 0.05


def _brute_force_dynamic(drafter_log_probs, root, depth, top_k, beam, budget):
    """Plain-Python EAGLE-2: returns the kept token paths."""
    cands = []  # (score, level, index, path)
    level = [(0.0, (root,))]
    for d in range(depth):
        if d > 0:
            ranked = sorted(range(len(level)), key=lambda i: (-level[i][0], i))[:beam]
            frontier = [level[i] for i in ranked]
        else:
            frontier = level
        new_level = []
        for score, path in frontier:
            lp = drafter_log_probs[path[-1]]
            top = torch.topk(lp, top_k)
            for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                new_level.append((score + v, path + (t,)))
        for s, p in new_level:
            cands.append((s, d, len(cands), p))
        level = new_level
    kept = sorted(cands, key=lambda c: (-c[0], c[1], c[2]))[:budget]
    return {c[3][1:] for c in kept}


@pytest.mark.parametrize("depth,top_k,beam,budget", [(3, 3, 2, 8), (4, 2, 2, 7), (1, 4, 1, 3)])
def test_dynamic_tree_keeps_the_best_paths(depth, top_k, beam, budget):
    context = torch.tensor([[0, 1], [4, 4], [7, 8]])
    drafter = FingerprintDrafter(DRAFT)
    tree = build_dynamic_tree(drafter, context, depth, top_k, beam, budget)
    n = budget + 1
    tokens = tree.node_token_ids.view(3, n)
    parent = tree.parent.view(3, n)
    depths = tree.depth.view(3, n)
    for b in range(3):
        paths = set()
        for i in range(1, n):
            path, j = [], i
            while j > 0:
                path.append(int(tokens[b, j]))
                j = int(parent[b, j])
            assert len(path) == int(depths[b, i])
            paths.add(tuple(reversed(path)))
        assert paths == _brute_force_dynamic(drafter.log_probs, int(context[b, -1]), depth, top_k, beam, budget)
    sk.verify_tree(TARGET[tree.node_token_ids], tree.node_token_ids, tree.parent, tree.cu_num_nodes,
                   backend="reference")  # structurally valid
    with pytest.raises(ValueError, match="budget"):
        build_dynamic_tree(drafter, context, depth, top_k, beam, 10_000)


def test_tree_attention_mask_matches_ancestors():
    parent = torch.tensor([[-1, 0, 0, 1, 3, 2], [-1, 0, 1, 2, 3, 4]])
    mask = tree_attention_mask(parent, prefix_len=3)
    assert mask.shape == (2, 6, 9) and mask[:, :, :3].all()
    for b, i, j in itertools.product(range(2), range(6), range(6)):
        anc, k = set(), i
        while k >= 0:
            anc.add(k)
            k = int(parent[b, k])
        assert bool(mask[b, i, 3 + j]) == (j in anc)


def test_compact_kv_cache_moves_the_accepted_path():
    num_reqs, seq, heads = 3, 20, 2
    cache = torch.arange(seq, dtype=torch.float32)[None, :, None].repeat(num_reqs, 1, heads)
    root_slot = torch.tensor([4, 0, 10])
    accepted = torch.tensor([[0, 2, 5, -1], [0, -1, -1, -1], [0, 1, 3, 7]])
    num_acc = torch.tensor([2, 0, 3])
    new_len = compact_kv_cache(cache, root_slot, accepted, num_acc)
    assert new_len.tolist() == [7, 1, 14]
    assert cache[0, 4:7, 0].tolist() == [4, 6, 9]
    assert cache[1, 0:1, 0].tolist() == [0]
    assert cache[2, 10:14, 1].tolist() == [10, 11, 13, 17]
    assert cache[0, :4, 0].tolist() == [0, 1, 2, 3] and cache[0, 7:, 0].tolist() == list(range(7, 20))
    # Sequence on another dimension.
    cache_t = torch.arange(seq, dtype=torch.float32)[None, None, :].repeat(num_reqs, heads, 1)
    compact_kv_cache(cache_t, root_slot, accepted, num_acc, seq_dim=2)
    assert cache_t[2, 0, 10:14].tolist() == [10, 11, 13, 17]


def test_dynamic_tree_verify_and_compact_end_to_end():
    num_reqs = 64
    context = torch.randint(0, VOCAB, (num_reqs, 3), generator=torch.Generator().manual_seed(2))
    tree = build_dynamic_tree(markov_trees.MarkovDrafter(DRAFT), context, depth=3, top_k=3, beam=2, budget=8)
    res = sk.verify_tree(TARGET[tree.node_token_ids], tree.node_token_ids, tree.parent, tree.cu_num_nodes,
                         temperature=torch.ones(num_reqs), seed=torch.arange(num_reqs), backend="reference")
    n = 9
    # A fake cache whose entry for node i of request b is its token: after compaction the accepted slots
    # hold the root followed by the accepted tokens.
    cache = torch.zeros(num_reqs, 2 + n, dtype=torch.long)
    cache[:, 2:] = tree.node_token_ids.view(num_reqs, n)
    compact_kv_cache(cache, torch.full((num_reqs,), 2), res.accepted_nodes, res.num_accepted)
    for b in range(num_reqs):
        k = int(res.num_accepted[b])
        assert cache[b, 3:3 + k].tolist() == res.output_token_ids[b, :k].tolist()
    assert float(res.num_accepted.float().mean()) > 0.3


def test_tree_from_model_drafter_proposal():
    from specdec_kernels.drafters import TreeProposal
    from specdec_kernels.drafters.tree_builder import tree_from_proposal

    tokens = torch.tensor([[3, 1, 2, 5], [4, 0, 6, 7]])
    parent = torch.tensor([[-1, 0, 0, 1], [-1, 0, 0, 2]])
    depth = torch.tensor([[0, 1, 1, 2], [0, 1, 1, 2]])
    q = torch.softmax(torch.randn(2, 4, VOCAB), -1)
    for probs in (None, q):
        tree = tree_from_proposal(TreeProposal(tokens, parent, depth, torch.zeros(2, 4), probs))
        assert tree.cu_num_nodes.tolist() == [0, 4, 8] and tree.parent.tolist() == parent.flatten().tolist()
        assert tree.sibling_sampling == ("" if probs is None else "without_replacement")
        res = sk.verify_tree(TARGET[tree.node_token_ids], tree.node_token_ids, tree.parent, tree.cu_num_nodes,
                             tree.draft_probs, torch.ones(2), seed=torch.arange(2),
                             sibling_sampling=tree.sibling_sampling or "iid", backend="reference")
        assert res.output_token_ids.shape == (2, 3)
