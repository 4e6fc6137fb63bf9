"""Readable, batched PyTorch reference for lossless tree verification (docs/design.md §2-§4).

Layout: request b owns nodes ``cu[b] ... cu[b + 1] - 1``; its node 0 is the root (the last emitted token,
``parent = -1``), every other node has a ``parent`` (local index) smaller than its own index, and the
children of a node are ordered by local index ("sibling slot" s = 0, 1, ...). Row i of ``target_logits``
is the target distribution of the token after node i; row i of ``draft_probs`` is the draft distribution
q from which node i's *children* were drawn. A node at depth d decides the token at absolute position
``position[b] + d``.

The walk starts at the root; at each node (depth d, children c_0 .. c_{m-1} with tokens x_s):

- greedy request (temperature 0): ``y = argmax(logits)`` (ties to the lowest index); descend into the
  first child with token y, else emit y and stop.
- random request, deterministic tree (no ``draft_probs``), or any leaf: ``y = gumbel.sample(z)``
  (two-level Gumbel-max, ``reference/gumbel.py``) on stream 2 (bonus) at a leaf and stream 1 (recovery)
  otherwise; descend into the first child with token y, else emit y and stop ("target-only"
  verification: optimal for a fixed tree).
- random request, stochastic tree: p = softmax(z), q = draft_probs[node]. For s = 0 .. m-1: the coin
  ``u_s = uniform(seed, pos, stream 0, s)`` accepts c_s iff ``u_s * q(x_s) < p(x_s)``. On a
  rejection ``p <- norm(max(0, p - q))`` (p unchanged if that residual is numerically empty), and with
  ``sibling_sampling="without_replacement"`` also ``q <- norm(q with q(x_s) = 0)`` (all zeros if nothing is
  left): recursive rejection sampling (RRS). With ``"iid"`` q is unchanged: SpecInfer multi-step
  sampling. If every child is rejected, emit ``gumbel.sample(log p)`` on stream 1.

Children with a placeholder token (-1) or any id outside [0, V) are skipped (never accepted, no update of
p or q, but they keep their slot index s). Nodes deeper than ``max_depth`` are ignored: a node at depth
``max_depth`` acts as a leaf.

Outputs: the accepted path's tokens followed by the emitted token, the local indices of the accepted
path ``[0, path...]`` (for KV-cache compaction) and the number of accepted nodes.

The walk loops over depths and sibling slots in Python but is vectorised over requests and never loops
over the vocabulary; it evaluates only the rows on each request's path, for the requests still walking.
Host syncs: one sizes the sibling loop (the widest sibling group), one per depth drops finished requests.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import gumbel, philox
from .sampling import greedy_logits, kept_threshold, softmax, target_logits_with_threshold

SIBLING_SAMPLING = ("iid", "without_replacement")


class TreeResult(NamedTuple):
    output_token_ids: torch.Tensor  # [B, D_max + 1] int32, -1 padded
    accepted_nodes: torch.Tensor  # [B, D_max + 1] int32 local node indices [0, path...], -1 padded
    num_accepted: torch.Tensor  # [B] int32 accepted nodes (root and emitted token excluded)


class TreeLayout(NamedTuple):
    request: torch.Tensor  # [N] int64 request of each node
    local: torch.Tensor  # [N] int64 index of the node within its request
    parent: torch.Tensor  # [N] int64 global index of the parent, -1 at roots
    first_child: torch.Tensor  # [N] int64 global index of the first child (lowest index), -1 at leaves
    next_sibling: torch.Tensor  # [N] int64 global index of the next sibling, -1 for the last one
    sibling_slot: torch.Tensor  # [N] int64 rank among its siblings (0 for roots)
    num_children: torch.Tensor  # [N] int64


def tree_spans(cu_num_nodes: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's (first node, node count) [B] int64: ``cu`` clamped into [0, N], counts at 0 from below.

    The identity on a valid ``cu``; with validation off every backend clamps the same way, and a request
    left with no node verifies nothing (no tokens, no path, 0 accepted).
    """
    cu = cu_num_nodes.to(torch.int64)
    start = cu[:-1].clamp(0, num_nodes)
    end = torch.maximum(cu[1:].clamp(0, num_nodes), start)
    return start, end - start


def node_requests(cu_num_nodes: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N] int64 (request, local index, request's node count) of every node, in bounds on any ``cu``.

    A node maps to the last request whose span (:func:`tree_spans`) starts at or before it; with an
    inconsistent ``cu`` its local index may fall outside [0, count), which callers treat as detached.
    """
    device = cu_num_nodes.device
    start, count = tree_spans(cu_num_nodes, num_nodes)
    if start.numel() == 0:  # no request: every node is detached
        start = count = torch.zeros(1, dtype=torch.int64, device=device)
    index = torch.arange(num_nodes, device=device)
    request = (torch.searchsorted(start.cummax(0).values, index, right=True) - 1).clamp(min=0)
    return request, index - start[request], count[request]


def tree_layout(cu_num_nodes: torch.Tensor, parent: torch.Tensor) -> TreeLayout:
    """Sibling structure of a ragged batch of trees, without host syncs.

    ``parent`` [N] holds local indices, -1 at roots. Any input stays in bounds: requests own the nodes of
    their :func:`tree_spans`, a node maps to the last request starting at or before it, and nodes whose
    parent is not in [0, local index), or that lie outside their request's span (only with an
    inconsistent ``cu``), are treated as detached roots.
    """
    num_nodes = parent.numel()
    device = parent.device
    index = torch.arange(num_nodes, device=device)
    request, local, count = node_requests(cu_num_nodes, num_nodes)
    # A parent outside [0, local) (only possible with validation off) detaches the node: it is unreachable.
    is_root = (parent < 0) | (parent >= local) | (local >= count)
    parent_global = torch.where(is_root, -1, index - local + parent.to(torch.int64))
    # Group nodes by parent (roots in a trailing group N), keeping local order inside each group.
    key = torch.where(is_root, num_nodes, parent_global)
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    same_next = torch.zeros(num_nodes, dtype=torch.bool, device=device)
    same_next[:-1] = sorted_key[1:] == sorted_key[:-1]
    next_in_order = torch.full((num_nodes,), -1, dtype=torch.int64, device=device)
    next_in_order[:-1] = order[1:]
    next_sibling = torch.full((num_nodes,), -1, dtype=torch.int64, device=device)
    next_sibling[order] = torch.where(same_next & (sorted_key < num_nodes), next_in_order, -1)
    counts = torch.bincount(key, minlength=num_nodes + 1)
    group_start = torch.cumsum(counts, 0) - counts
    sibling_slot = torch.empty(num_nodes, dtype=torch.int64, device=device)
    sibling_slot[order] = index - group_start[sorted_key]
    sibling_slot = torch.where(is_root, 0, sibling_slot)
    first_child = torch.full((num_nodes + 1,), num_nodes, dtype=torch.int64, device=device)
    first_child = first_child.scatter_reduce(0, key, index, reduce="amin")[:num_nodes]
    first_child = torch.where(first_child == num_nodes, -1, first_child)
    return TreeLayout(request, local, parent_global, first_child, next_sibling, sibling_slot,
                      counts[:num_nodes])


def children_table(layout: TreeLayout) -> torch.Tensor:
    """[N, W] int64 global indices of each node's children in sibling order, -1 padded (W >= 1)."""
    num_nodes = layout.parent.numel()
    device = layout.parent.device
    width = max(int(layout.num_children.max()) if num_nodes else 0, 1)  # the one host sync
    table = torch.full((num_nodes + 1, width), -1, dtype=torch.int64, device=device)
    is_child = layout.parent >= 0
    row = torch.where(is_child, layout.parent, num_nodes)
    table[row, torch.where(is_child, layout.sibling_slot, 0)] = torch.where(
        is_child, torch.arange(num_nodes, device=device), -1
    )
    return table[:num_nodes]


def node_depth(layout: TreeLayout) -> torch.Tensor:
    """[N] int64 depth of every node (root 0) by pointer jumping: ceil(log2 N) + 1 rounds, no host sync."""
    num_nodes = layout.parent.numel()
    index = torch.arange(num_nodes, device=layout.parent.device)
    is_root = layout.parent < 0
    ancestor = torch.where(is_root, index, layout.parent)  # roots point to themselves
    depth = (~is_root).to(torch.int64)  # hops from each node to ``ancestor``
    for _ in range(max(num_nodes, 1).bit_length() + 1):
        depth = depth + depth[ancestor]
        ancestor = ancestor[ancestor]
    return depth


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[R, V] ``norm(max(0, p - q))``; rows whose residual is numerically empty keep p."""
    diff = p - q
    residual = torch.where(diff > 0, diff, 0.0)  # max(0, p - q); a NaN q entry counts as 0, as in the kernels
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / torch.where(total > 0, total, 1.0), p)


def remove_token(q: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """[R, V] ``norm(q with q(token) = 0)`` (all zeros when nothing is left): q after drawing ``token``."""
    q = q.scatter(-1, token[:, None], 0.0)
    total = q.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, q / torch.where(total > 0, total, 1.0), torch.zeros_like(q))


def recursive_rejection(
    z: torch.Tensor,
    q: torch.Tensor,
    child_token: torch.Tensor,
    child_valid: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    sibling_sampling: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One stochastic-tree step for R nodes: which sibling slot is accepted, and the fallback token.

    ``z`` [R, V] target scaled logits, ``q`` [R, V] float32 draft distribution of the children,
    ``child_token`` / ``child_valid`` [R, W] in sibling order, ``seed`` / ``pos`` [R]. Returns (accepted slot [R] int64, -1 if every child was rejected, and the token
    emitted in that case [R] int64).
    """
    p = softmax(z)
    accepted = torch.full(z.shape[:1], -1, dtype=torch.int64, device=z.device)
    for s in range(child_token.shape[1]):
        x = torch.where(child_valid[:, s], child_token[:, s], 0)
        live = (accepted < 0) & child_valid[:, s]
        coin = philox.coins(seed, pos, s)
        p_x = p.gather(-1, x[:, None]).squeeze(-1)
        q_x = q.gather(-1, x[:, None]).squeeze(-1)
        accept = live & (coin * q_x < p_x)
        accepted = torch.where(accept, s, accepted)
        rejected = (live & ~accept)[:, None]
        p_next = residual_distribution(p, q)
        if sibling_sampling == "without_replacement":
            q = torch.where(rejected, remove_token(q, x), q)
        p = torch.where(rejected, p_next, p)
    return accepted, gumbel.sample(torch.log(p), seed, pos, philox.STREAM_RECOVERY)


def verify_tree(
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
    """Reference tree verification on validated, normalised inputs (see ``specdec_kernels.verify_tree``).

    Shapes: logits [N, V]; node ids, parent [N]; cu [B + 1]; draft_probs [N, V] or None; temperature,
    top_k, top_p, seed, position [B] (top_k / top_p may be None). Returns int32 tokens and accepted local
    node indices [B, max_depth + 1] and int32 accepted counts [B]. ``row_threshold`` [N] float32 or None:
    when given, each row the walk decides at receives its kept-set threshold (as ``reference.chain``).
    """
    num_nodes, vocab_size = target_logits_.shape
    num_reqs = cu_num_nodes.numel() - 1
    device = target_logits_.device
    width = max_depth + 1
    out = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
    path = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
    num_accepted = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    if num_reqs == 0:
        return TreeResult(out.to(torch.int32), path.to(torch.int32), num_accepted.to(torch.int32))
    start, count = tree_spans(cu_num_nodes, num_nodes)
    path[:, 0] = torch.where(count > 0, 0, -1)

    layout = tree_layout(cu_num_nodes, parent)
    table = children_table(layout)
    tokens = node_token_ids.to(torch.int64)
    token_valid = (tokens >= 0) & (tokens < vocab_size)
    is_greedy = temperature == 0
    # Greedy requests use temperature 1 for the (ignored) random path so that nothing divides by zero.
    temp = torch.where(is_greedy, torch.ones_like(temperature), temperature)
    slots = torch.arange(table.shape[1], device=device)

    # ``live`` holds the requests still walking and ``cur`` their current node (global index).
    live = torch.nonzero(count > 0).flatten()  # a request without nodes (only with an inconsistent cu) is done
    cur = start[live]
    for d in range(width):
        if live.numel() == 0:
            break
        logits = target_logits_[cur]
        greedy = is_greedy[live]
        z, threshold = target_logits_with_threshold(
            logits, temp[live], None if top_k is None else top_k[live], None if top_p is None else top_p[live]
        )
        greedy_z = greedy_logits(logits)
        greedy_token = torch.argmax(greedy_z, dim=-1)
        if row_threshold is not None:
            row_threshold[cur] = kept_threshold(threshold, greedy, greedy_z)
        kids = table[cur] if d < max_depth else torch.full_like(table[cur], -1)
        is_leaf = kids[:, 0] < 0
        kid_valid = (kids >= 0) & token_valid[kids.clamp(min=0)]
        kid_token = torch.where(kid_valid, tokens[kids.clamp(min=0)], -1)

        req_seed = seed[live]
        pos = position[live] + d
        stream = torch.where(is_leaf, philox.STREAM_BONUS, philox.STREAM_RECOVERY)
        sampled = gumbel.sample(z, req_seed, pos, stream)  # y ~ p with this node's noise

        # Deterministic walk (greedy requests, deterministic trees, leaves): first child with token y.
        y = torch.where(greedy, greedy_token, sampled)
        match = kid_valid & (kid_token == y[:, None])
        slot = torch.where(match, slots, slots.numel()).min(dim=-1).values
        slot = torch.where(slot < slots.numel(), slot, -1)
        if draft_probs is not None:
            q = draft_probs[cur].float()
            sto_slot, sto_token = recursive_rejection(
                z, q, kid_token, kid_valid, req_seed, pos, sibling_sampling
            )
            stochastic = ~greedy & ~is_leaf
            slot = torch.where(stochastic, sto_slot, slot)
            y = torch.where(stochastic, sto_token, y)

        child = torch.where(slot >= 0, kids.gather(-1, slot.clamp(min=0)[:, None]).squeeze(-1), -1)
        accept = child >= 0
        out[live, d] = torch.where(accept, tokens[child.clamp(min=0)], y)
        if d + 1 < width:
            path[live, d + 1] = torch.where(accept, layout.local[child.clamp(min=0)], -1)
        num_accepted[live] = torch.where(accept, num_accepted[live], d)
        keep = torch.nonzero(accept).flatten()  # one host sync per depth: only live requests go on
        if keep.numel() == 0:
            break
        live = live[keep]
        cur = child[keep]
    return TreeResult(out.to(torch.int32), path.to(torch.int32), num_accepted.to(torch.int32))
