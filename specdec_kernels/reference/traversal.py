"""Traversal verification of stochastic draft trees (Weng et al., "Traversal Verification for Speculative
Tree Decoding", NeurIPS 2025): the readable, batched spec of ``verify_tree(..., method="traversal")``.

The tree is visited depth first in sibling order, and each node is *tested* after its whole subtree
(post-order, leaves to root). Every node alpha carries a mass ``m_alpha``: a sub-probability over the
token after alpha (total ``M_alpha``), stored as a float32 residual row ``r`` and a float32 divisor ``d``
(``m = r / d``) with ``M`` in float64. Rules, for a request with target rows p_alpha (truncated target
after alpha) and draft rows q (``draft_probs[beta]`` = the law beta's children were drawn from):

- the root has ``m = p_root``, M = 1 (it is never tested: it is always accepted when reached);
- entering child c (token x, placeholders skipped) of beta: with q_c the law c was drawn from (q_beta for
  i.i.d. siblings; q_beta with the earlier siblings removed and renormalised, as recursive rejection
  sampling keeps it, without replacement), the weight ``a = min(1, m_beta(x) / q_c(x))`` (``ratio_weight``)
  gives ``m_c = a p_c`` (r = a p_c, d = 1) and ``M_c = a``; if a = 0 the subtree is dead and c is tested
  at once;
- testing node c (depth t >= 1): accept the path root..c iff ``eta_c < M_c``, with the sequence-level
  coin ``eta_c = philox.sequence_coins(seed, position, local(c))`` (keyed by the round's first position
  and the node's local index; on a chain node j is block verification's prefix j);
- deleting a rejected child c of beta: ``r_beta <- max(0, m_beta - q_c)``, ``Z = sum r_beta`` (float64),
  ``D = Z + 1 - M_beta``, ``M_beta <- Z / D`` and ``d_beta <- D`` (0 and 1 when D = 0); without replacement
  also ``q <- norm(q with q(x) = 0)`` for the next sibling;
- emission at the accepted node alpha (depth t, position + t): if none of its children was deleted,
  ``y ~ p_alpha`` by two-level Gumbel-max (``reference/gumbel.py``) on the scaled logits (stream 2 at a
  leaf, stream 1 otherwise); else ``y ~ norm(r_alpha)`` by two-level Gumbel-max on log r_alpha on stream 1
  (p_alpha if r_alpha is empty).

Greedy requests and deterministic trees (no ``draft_probs``) run token-level verification (the
target-only walk): with a point-mass draft law per child traversal verification has exactly its
acceptance, and nothing can beat it (the accepted path is a prefix of a target sample that is in the tree).

Derivation. Claim: processing node beta with mass m (total M <= 1) emits, given the drafts below beta,
"accept beta's path, then token y" with total probability m(y) averaged over those drafts — i.e. the
verifier reaches beta's path with probability M and emits the next token from m / M. At a leaf it is the
test (probability M, then y ~ m / M). For a child c drawn from q_c: by induction, c's subtree accepts
through c with probability a = min(1, m(x)/q_c(x)) given its token x, i.e. mass ``min(q_c, m)(x)`` on
token x overall, and is rejected with probability ``1 - sum min(q_c, m) = Z + 1 - M`` (Z = sum max(0,
m - q_c)). Given the rejection, the rest of beta's processing (later siblings, then beta's test) runs on
``m' = max(0, m - q_c) / (Z + 1 - M)`` and emits m' by induction (for any law of the next sibling, in
particular q_c without x); in total ``min(q_c, m) + max(0, m - q_c) = m``. At the root m = p_root, so
the first emitted token is exactly p_root, and every later token (the next node's m / M = p) too:
the method is lossless. Its updates never lower the weight a node's path gets: on a chain it is exactly
block verification (``reference/block.py``: same weights, ``M = Z / (Z + 1 - w) = h``, same coins and
noise, so the same tokens), and at depth 1 it is recursive rejection sampling (SpecInfer for i.i.d.).
"""

from __future__ import annotations

import torch

from . import gumbel, philox
from .block import ratio_weight, stop_probability
from .sampling import softmax, target_logits, target_logits_with_threshold
from .tree import TreeResult, children_table, node_depth, remove_token, tree_layout, tree_spans
from .tree import verify_tree as verify_tree_token

__all__ = ["coin_index", "entry_weight", "verify_tree_traversal"]

_INDEX_MASK = (1 << 30) - 1


def coin_index(local: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Index field of a node's traversal coin: its local index (kept below 2**30)."""
    return local & _INDEX_MASK


def entry_weight(m_parent: torch.Tensor, q_parent: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[B] float32 weight ``min(1, m(x) / q(x))`` of a child with token x under its parent's mass m [B, V]
    and the law q [B, V] it was drawn from."""
    return ratio_weight(m_parent.gather(-1, x[:, None])[:, 0], q_parent.gather(-1, x[:, None])[:, 0])


def _walk_links(layout, depth, token_valid, max_depth):
    """(first real child [N], next real sibling [N], leaf [N]): skipping placeholder children and nodes
    deeper than max_depth; ``leaf`` = no children at all (placeholders count) within max_depth."""
    device = depth.device
    table = children_table(layout)  # [N, W] global indices, -1 padded
    width = table.shape[1]
    slots = torch.arange(width, device=device)
    kid_valid = (table >= 0) & token_valid[table.clamp(min=0)]
    inside = depth < max_depth
    first = torch.where(kid_valid, slots, width).min(dim=-1).values
    first_child = torch.where(inside & (first < width), table.gather(-1, first.clamp(max=width - 1)[:, None])[:, 0], -1)
    parent = layout.parent
    siblings = table[parent.clamp(min=0)]  # [N, W]
    own_slot = (siblings == torch.arange(depth.numel(), device=device)[:, None]).to(torch.int64).argmax(-1)
    later = kid_valid[parent.clamp(min=0)] & (slots[None, :] > own_slot[:, None])
    nxt = torch.where(later, slots, width).min(dim=-1).values
    next_sibling = torch.where((parent >= 0) & (nxt < width), siblings.gather(-1, nxt.clamp(max=width - 1)[:, None])[:, 0],
                               -1)
    leaf = (table[:, 0] < 0) | ~inside
    return first_child, next_sibling, leaf


def verify_tree_traversal(
    target_logits_: torch.Tensor,
    node_token_ids: torch.Tensor,
    parent: torch.Tensor,
    cu_num_nodes: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seed: torch.Tensor,
    position: torch.Tensor,
    sibling_sampling: str,
    max_depth: int,
    row_threshold: torch.Tensor | None = None,
) -> TreeResult:
    """Reference traversal verification on validated, normalised inputs (``verify_tree``'s signature).

    Vectorised over requests: each loop step moves every request still walking one event (enter or test
    a node) along its own depth-first traversal; the per-depth masses live in [B, D + 1, V] buffers. Host
    syncs: the children table's width, whether any request is greedy, and one per step (the requests that
    accepted leave the loop). ``row_threshold``: as ``reference.tree.verify_tree``'s (every node the
    traversal enters, the accepted path included).
    """
    num_reqs = cu_num_nodes.numel() - 1
    # Greedy requests, and requests left without nodes by an inconsistent cu (validate=False), take the
    # token-level walk (which verifies nothing for the latter).
    start, count = tree_spans(cu_num_nodes, node_token_ids.numel())
    is_greedy = temperature == 0
    token_level = is_greedy | (count == 0)
    if draft_probs is None or num_reqs == 0 or bool(token_level.all()):
        return verify_tree_token(target_logits_, node_token_ids, parent, cu_num_nodes, None, temperature, top_k,
                                 top_p, seed, position, sibling_sampling, max_depth, row_threshold)
    vocab_size = target_logits_.shape[1]
    device = target_logits_.device
    width = max_depth + 1
    cu = cu_num_nodes.to(torch.int64)
    layout = tree_layout(cu, parent)
    depth = node_depth(layout)
    tokens = node_token_ids.to(torch.int64)
    token_valid = (tokens >= 0) & (tokens < vocab_size)
    first_child, next_sibling, leaf = _walk_links(layout, depth, token_valid, max_depth)
    temp = torch.where(is_greedy, torch.ones_like(temperature), temperature)
    without_replacement = sibling_sampling == "without_replacement"
    q_all = draft_probs.float()
    # Every node's test coin (each node is tested at most once).
    node_coin = philox.sequence_coins(seed[layout.request], position[layout.request],
                                      coin_index(layout.local, depth)).double()

    r = torch.zeros(num_reqs, width, vocab_size, dtype=torch.float32, device=device)
    divisor = torch.ones(num_reqs, width, dtype=torch.float32, device=device)
    mass = torch.zeros(num_reqs, width, dtype=torch.float64, device=device)
    q = torch.zeros(num_reqs, width, vocab_size, dtype=torch.float32, device=device)
    deleted = torch.zeros(num_reqs, width, dtype=torch.bool, device=device)
    node = torch.where(count == 0, 0, start)
    entering = torch.ones(num_reqs, dtype=torch.bool, device=device)
    accepted = node.clone()
    live = torch.nonzero(~token_level).flatten()
    while live.numel():
        nd = node[live]
        d = depth[nd]
        up = (d - 1).clamp(min=0)
        x = torch.where(token_valid[nd], tokens[nd], 0)
        enter = entering[live]
        test = ~enter

        # Enter: the node's weight from its parent's mass, its own mass a * p.
        z_nd, threshold = target_logits_with_threshold(target_logits_[nd], temp[live],
                                                       None if top_k is None else top_k[live],
                                                       None if top_p is None else top_p[live])
        p = softmax(z_nd)
        if row_threshold is not None:
            row_threshold[nd] = torch.where(enter, threshold, row_threshold[nd])
        m_up = r[live, up] / divisor[live, up][:, None]
        q_up = q[live, up]
        a = entry_weight(m_up, q_up, x)
        a = torch.where(d == 0, torch.ones_like(a), a)
        r[live, d] = torch.where(enter[:, None], a[:, None] * p, r[live, d])
        divisor[live, d] = torch.where(enter, 1.0, divisor[live, d])
        mass[live, d] = torch.where(enter, a.double(), mass[live, d])
        q[live, d] = torch.where(enter[:, None], q_all[nd], q[live, d])
        deleted[live, d] = deleted[live, d] & ~enter
        down = enter & (a > 0) & (first_child[nd] >= 0)

        # Test: accept the node's path, or delete it from its parent's mass.
        accept = test & ((d == 0) | (node_coin[nd] < mass[live, d]))
        reject = test & ~accept
        residual = torch.clamp(m_up - q_up, min=0.0)
        total = residual.double().sum(-1)
        denom = total + (1.0 - mass[live, up])
        r[live, up] = torch.where(reject[:, None], residual, r[live, up])
        divisor[live, up] = torch.where(reject, torch.where(denom > 0, denom.float(), 1.0), divisor[live, up])
        mass[live, up] = torch.where(reject, stop_probability(total, mass[live, up]), mass[live, up])
        deleted[live, up] = deleted[live, up] | reject
        if without_replacement:
            q[live, up] = torch.where(reject[:, None], remove_token(q_up, x), q[live, up])  # the root enters at up = 0
        sibling = next_sibling[nd]

        accepted[live] = torch.where(accept, nd, accepted[live])
        nxt = torch.where(down, first_child[nd], nd)
        node[live] = torch.where(reject, torch.where(sibling >= 0, sibling, layout.parent[nd]), nxt)
        entering[live] = torch.where(enter, down, sibling >= 0)
        live = live[~accept]

    # Emission at the accepted node.
    reqs = torch.arange(num_reqs, device=device)
    d = depth[accepted]
    z = target_logits(target_logits_[accepted], temp, top_k, top_p)
    row = r[reqs, d]
    use_residual = deleted[reqs, d] & (row.max(dim=-1).values > 0)
    stream = torch.where(leaf[accepted], philox.STREAM_BONUS, philox.STREAM_RECOVERY)
    token = gumbel.sample(torch.where(use_residual[:, None], torch.log(row), z), seed, position + d, stream)

    out = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
    path = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
    out[reqs, d] = token
    anc = accepted
    for level in range(max_depth, 0, -1):
        at = depth[anc] == level
        out[:, level - 1] = torch.where(at, tokens[anc], out[:, level - 1])
        path[:, level] = torch.where(at, layout.local[anc], path[:, level])
        anc = torch.where(at, layout.parent[anc], anc)
    path[:, 0] = 0
    traversal = TreeResult(out.to(torch.int32), path.to(torch.int32), d.to(torch.int32))
    if not bool(token_level.any()):
        return traversal
    token_res = verify_tree_token(target_logits_, node_token_ids, parent, cu_num_nodes, None, temperature, top_k,
                                  top_p, seed, position, sibling_sampling, max_depth, row_threshold)
    return TreeResult(*(torch.where(token_level.view(-1, *[1] * (t.dim() - 1)), t_tok, t)
                        for t, t_tok in zip(traversal, token_res, strict=True)))
