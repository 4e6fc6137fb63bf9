"""verify_tree: argument validation, chain-as-tree equivalence, edge cases and batch invariance."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.reference import tree as ref_tree


def _tree_batch(num_reqs=3, vocab=11, seed=0, stochastic=False):
    """Ragged batch: request b has a small tree of distinct sibling tokens."""
    g = torch.Generator().manual_seed(seed)
    parents = [[-1, 0, 0, 1], [-1, 0, 1, 2, 0, 4], [-1]][:num_reqs]
    tokens, parent, cu = [], [], [0]
    for par in parents:
        n = len(par)
        tokens.extend([-1] + torch.randperm(vocab, generator=g)[: n - 1].tolist())
        parent.extend(par)
        cu.append(cu[-1] + n)
    n_total = cu[-1]
    args = dict(
        target_logits=torch.randn(n_total, vocab, generator=g),
        node_token_ids=torch.tensor(tokens),
        parent=torch.tensor(parent),
        cu_num_nodes=torch.tensor(cu),
    )
    if stochastic:
        args["draft_probs"] = torch.softmax(torch.randn(n_total, vocab, generator=g), -1)
    return args


def test_result_shapes_and_path():
    args = _tree_batch()
    res = sk.verify_tree(**args, temperature=torch.tensor([1.0, 0.0, 0.5]), seed=torch.arange(3), backend="reference")
    assert isinstance(res, sk.TreeResult)
    assert res.output_token_ids.shape == (3, 4) and res.output_token_ids.dtype == torch.int32
    assert res.accepted_nodes.shape == (3, 4) and res.num_accepted.dtype == torch.int32
    tokens, parent, cu = args["node_token_ids"], args["parent"], args["cu_num_nodes"]
    for b in range(3):
        k = int(res.num_accepted[b])
        path = res.accepted_nodes[b, : k + 1].tolist()
        assert path[0] == 0 and (res.accepted_nodes[b, k + 1:] == -1).all()
        for j in range(1, k + 1):  # a parent-child chain whose tokens are the output
            assert int(parent[cu[b] + path[j]]) == path[j - 1]
            assert int(tokens[cu[b] + path[j]]) == int(res.output_token_ids[b, j - 1])
        assert 0 <= int(res.output_token_ids[b, k]) < 11 and (res.output_token_ids[b, k + 1:] == -1).all()


def _chain_case(num_reqs, k, vocab, seed, stochastic):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_reqs * (k + 1), vocab, generator=g) * 2
    drafts = torch.randint(0, vocab, (num_reqs * k,), generator=g)
    q = torch.softmax(torch.randn(num_reqs * k, vocab, generator=g), -1) if stochastic else None
    # Make drafts likely under the target so that long prefixes get accepted.
    logits.view(num_reqs, k + 1, vocab)[:, :k].scatter_add_(
        -1, drafts.view(num_reqs, k, 1), torch.full((num_reqs, k, 1), 3.0)
    )
    tree_tokens = torch.full((num_reqs, k + 1), -1)
    tree_tokens[:, 1:] = drafts.view(num_reqs, k)
    tree_q = None
    if stochastic:
        tree_q = torch.zeros(num_reqs, k + 1, vocab)
        tree_q[:, :k] = q.view(num_reqs, k, vocab)
        tree_q = tree_q.view(-1, vocab)
    sampling = dict(
        temperature=torch.rand(num_reqs, generator=g) + 0.2,
        top_k=torch.randint(0, vocab, (num_reqs,), generator=g, dtype=torch.int32),
        top_p=torch.rand(num_reqs, generator=g) * 0.5 + 0.5,
        seed=torch.randint(0, 2**62, (num_reqs,), generator=g),
        position=torch.randint(0, 1000, (num_reqs,), generator=g),
    )
    sampling["temperature"][::4] = 0
    chain = (logits, drafts, torch.arange(num_reqs + 1) * k, q)
    tree = (logits, tree_tokens.flatten(), torch.arange(-1, k).repeat(num_reqs), torch.arange(num_reqs + 1) * (k + 1), tree_q)
    return chain, tree, sampling


@pytest.mark.parametrize("stochastic", [False, True])
def test_chain_as_tree_matches_verify_chain_token_for_token(stochastic):
    chain, tree, sampling = _chain_case(256, 4, 13, 1, stochastic)
    rc = sk.verify_chain(*chain, **sampling, backend="reference")
    rt = sk.verify_tree(*tree, **sampling, backend="reference")
    assert torch.equal(rc.num_accepted, rt.num_accepted)
    assert torch.equal(rc.output_token_ids, rt.output_token_ids)
    assert float(rt.num_accepted.float().mean()) > 0.5  # the comparison covers accepted prefixes
    expected_path = torch.where(
        torch.arange(5)[None] <= rt.num_accepted[:, None], torch.arange(5)[None], -1
    ).to(torch.int32)
    assert torch.equal(rt.accepted_nodes, expected_path)


def test_batch_invariance_and_determinism():
    args = _tree_batch(stochastic=True)
    kw = dict(temperature=torch.tensor([0.9, 1.2, 0.7]), seed=torch.tensor([5, 6, 7]),
              position=torch.tensor([3, 4, 5]), backend="reference")
    full = sk.verify_tree(**args, **kw)
    again = sk.verify_tree(**args, **kw)
    assert all(torch.equal(a, b) for a, b in zip(full, again, strict=True))
    # Request 1 alone gives the same result.
    lo, hi = 4, 10
    single = sk.verify_tree(
        args["target_logits"][lo:hi], args["node_token_ids"][lo:hi], args["parent"][lo:hi],
        torch.tensor([0, hi - lo]), args["draft_probs"][lo:hi], kw["temperature"][1:2], seed=kw["seed"][1:2],
        position=kw["position"][1:2], backend="reference", max_depth=3,
    )
    assert torch.equal(single.output_token_ids[0], full.output_token_ids[1])
    assert torch.equal(single.accepted_nodes[0], full.accepted_nodes[1])


def test_greedy_follows_the_argmax_path():
    vocab = 6
    logits = torch.full((5, vocab), -1.0)
    # root -> nodes 1 (token 2), 2 (token 4); node 2 -> nodes 3 (token 1), 4 (token 3).
    parent = torch.tensor([-1, 0, 0, 2, 2])
    tokens = torch.tensor([-1, 2, 4, 1, 3])
    logits[0, 4] = 5  # root: argmax 4 -> node 2
    logits[2, 3] = 5  # node 2: argmax 3 -> node 4
    logits[4, 0] = 5  # node 4 (leaf): emits 0
    res = sk.verify_tree(logits, tokens, parent, torch.tensor([0, 5]), backend="reference")
    assert res.output_token_ids.tolist() == [[4, 3, 0]]
    assert res.accepted_nodes.tolist() == [[0, 2, 4]]
    assert res.num_accepted.tolist() == [2]


def test_nan_inf_logits_and_placeholders_stay_in_vocabulary():
    args = _tree_batch(stochastic=True)
    logits = args["target_logits"]
    logits[0] = float("nan")
    logits[1, :3] = float("inf")
    logits[5] = float("-inf")
    args["node_token_ids"][2] = -1  # placeholder child
    for dp in (None, args["draft_probs"]):
        for mode in ("iid", "without_replacement"):
            res = sk.verify_tree(
                logits, args["node_token_ids"], args["parent"], args["cu_num_nodes"], dp,
                temperature=torch.tensor([1.0, 0.0, 0.5]), top_k=torch.tensor([2, 0, 3]),
                top_p=torch.tensor([0.9, 1.0, 0.5]), seed=torch.arange(3), sibling_sampling=mode,
                backend="reference",
            )
            out = res.output_token_ids
            emitted = out.gather(1, res.num_accepted.long()[:, None])
            assert ((emitted >= 0) & (emitted < 11)).all()
            assert not (res.accepted_nodes[0] == 2).any()  # the placeholder is never accepted


def test_validate_false_with_broken_parents_stays_in_bounds():
    args = _tree_batch()
    args["parent"] = torch.tensor([-1, 3, 7, 1, -1, 0, 9, 1, 0, 4, -1])  # forward, out of request, ...
    res = sk.verify_tree(**args, temperature=torch.ones(3), seed=torch.arange(3), backend="reference",
                         validate=False, max_depth=2)
    assert ((res.output_token_ids >= -1) & (res.output_token_ids < 11)).all()
    assert res.output_token_ids.shape == (3, 3)


# ----------------------------------------------------------------------------------------------------
# Validation: each bad input names the argument.
# ----------------------------------------------------------------------------------------------------

def _bad(**changes):
    args = _tree_batch()
    args.update(changes)
    return args


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        (_bad(target_logits=torch.randn(10, 11)), {}, ValueError, "target_logits"),
        (_bad(target_logits=torch.randn(11, 11).double()), {}, TypeError, "target_logits"),
        (_bad(node_token_ids=torch.zeros(11)), {}, TypeError, "node_token_ids"),
        (_bad(parent=torch.zeros(10, dtype=torch.long)), {}, ValueError, "parent"),
        (_bad(cu_num_nodes=torch.tensor([0, 4, 10, 11.0])), {}, TypeError, "cu_num_nodes"),
        (_bad(cu_num_nodes=torch.tensor([1, 4, 10, 11])), {}, ValueError, "cu_num_nodes"),
        (_bad(cu_num_nodes=torch.tensor([0, 4, 4, 11])), {}, ValueError, "cu_num_nodes"),
        (_bad(cu_num_nodes=torch.tensor([0, 4, 10, 12])), {}, ValueError, "cu_num_nodes"),
        (_bad(parent=torch.tensor([-1, 0, 0, 1, 0, 0, 1, 1, 0, 4, -1])), {}, ValueError, "root"),
        (_bad(parent=torch.tensor([-1, 0, 0, 1, -1, 0, 1, -1, 0, 4, -1])), {}, ValueError, "only node 0"),
        (_bad(parent=torch.tensor([-1, 0, 0, 3, -1, 0, 1, 1, 0, 4, -1])), {}, ValueError, "cycle"),
        (_bad(parent=torch.tensor([-1, 0, 3, 1, -1, 0, 1, 1, 0, 4, -1])), {}, ValueError, "backwards"),
        (_bad(parent=torch.tensor([-1, 0, 0, 1, -1, 0, 1, 1, 0, 9, -1])), {}, ValueError, "out of its request"),
        (_bad(node_token_ids=torch.tensor([-1, 1, 2, 11, -1, 1, 2, 3, 4, 5, -1])), {}, ValueError, "node_token_ids"),
        (_bad(node_token_ids=torch.tensor([-1, 1, 2, -2, -1, 1, 2, 3, 4, 5, -1])), {}, ValueError, "node_token_ids"),
        (_bad(node_token_ids=torch.tensor([-1, 1, 1, 3, -1, 1, 2, 3, 4, 5, -1])), {}, ValueError, "siblings"),
        (_bad(draft_probs=torch.rand(11, 10)), {}, ValueError, "draft_probs"),
        (_bad(draft_probs=-torch.rand(11, 11)), {}, ValueError, "draft_probs"),
        (_bad(draft_probs=torch.rand(11, 11), node_token_ids=torch.tensor([-1, 1, 1, 3, -1, 1, 2, 3, 4, 5, -1])),
         {"sibling_sampling": "without_replacement"}, ValueError, "siblings"),
        (_bad(), {"sibling_sampling": "beam"}, ValueError, "sibling_sampling"),
        (_bad(), {"sibling_sampling": 1}, TypeError, "sibling_sampling"),
        (_bad(), {"max_depth": 1}, ValueError, "max_depth"),
        (_bad(), {"max_depth": -1}, ValueError, "max_depth"),
        (_bad(), {"temperature": torch.ones(2)}, ValueError, "temperature"),
        (_bad(), {"temperature": -torch.ones(3)}, ValueError, "temperature"),
        (_bad(), {"top_p": torch.zeros(3)}, ValueError, "top_p"),
        (_bad(), {"seed": torch.zeros(3)}, TypeError, "seed"),
        (_bad(), {"position": torch.full((3,), 2**31 - 2)}, ValueError, "position"),
        (_bad(), {"backend": "tpu"}, ValueError, "backend"),
    ],
)
def test_bad_input_names_the_argument(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sk.verify_tree(**args, **kwargs)


def test_duplicate_siblings_allowed_for_iid_stochastic_trees():
    args = _bad(draft_probs=torch.rand(11, 11), node_token_ids=torch.tensor([-1, 1, 1, 3, -1, 1, 2, 3, 4, 5, -1]))
    res = sk.verify_tree(**args, temperature=torch.ones(3), seed=torch.arange(3), backend="reference")
    assert res.output_token_ids.shape == (3, 4)


def test_node_depth_and_layout():
    parent = torch.tensor([-1, 0, 0, 1, 3, 2, -1, 0])
    layout = ref_tree.tree_layout(torch.tensor([0, 6, 8]), parent)
    assert ref_tree.node_depth(layout).tolist() == [0, 1, 1, 2, 3, 2, 0, 1]
    assert layout.first_child.tolist() == [1, 3, 5, 4, -1, -1, 7, -1]
    assert layout.next_sibling.tolist() == [-1, 2, -1, -1, -1, -1, -1, -1]
    assert layout.sibling_slot.tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
    assert ref_tree.children_table(layout)[0].tolist() == [1, 2]


def test_empty_batch():
    res = sk.verify_tree(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                         torch.zeros(1, dtype=torch.long), backend="reference")
    assert res.output_token_ids.shape == (0, 1)
