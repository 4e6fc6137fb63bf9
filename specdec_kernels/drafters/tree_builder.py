"""Draft-tree construction for ``verify_tree``: static trees, EAGLE-2 dynamic trees, stochastic trees.

Every builder is batched over B requests and returns a :class:`DraftTree` in the flat ragged layout
``verify_tree`` takes (request b owns nodes ``cu[b] ... cu[b+1] - 1``, node 0 its root, parents as local
indices pointing backwards, siblings ordered by local index), plus each node's depth for positions and
the tree-attention mask.

Drafters plug in through one callable (:class:`Drafter`)::

    log_probs, state = drafter(tokens, parent_state)

``tokens`` [R, L] int64 holds, for each of R tree nodes being expanded, the request's context followed by
the node's path (so the last column is the node's own token); ``parent_state`` is None for the roots, else
the ``state`` rows the drafter returned for the nodes' parents ([R, ...], gathered by the builder), which
lets EAGLE / MTP heads carry hidden states down the tree. It returns the draft log-probabilities of the
nodes' children [R, V] and the nodes' own state (any tensor with R rows, or None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch

__all__ = [
    "Drafter", "DraftTree", "TreeTopology", "build_static_tree", "build_dynamic_tree",
    "tree_attention_mask", "compact_kv_cache", "chain_paths", "full_tree_paths", "tree_from_proposal",
]


class Drafter(Protocol):
    def __call__(
        self, tokens: torch.Tensor, parent_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class DraftTree(NamedTuple):
    node_token_ids: torch.Tensor  # [B * n] int64, node 0 of each request its root (the context's last token)
    parent: torch.Tensor  # [B * n] int64 local parent index, -1 at roots
    cu_num_nodes: torch.Tensor  # [B + 1] int64
    depth: torch.Tensor  # [B * n] int64 (root 0): a node's position is root position + depth
    draft_probs: torch.Tensor | None  # [B * n, V] float32 q of each node's children (stochastic trees)
    sibling_sampling: str  # "iid" / "without_replacement" for stochastic trees, "" for deterministic ones

    @property
    def num_requests(self) -> int:
        return self.cu_num_nodes.numel() - 1


class TreeTopology(NamedTuple):
    """One tree shape shared by every request: n nodes in parent-before-child order."""

    parent: torch.Tensor  # [n] int64 local parent index, -1 at the root
    depth: torch.Tensor  # [n] int64
    rank: torch.Tensor  # [n] int64 child rank: the rank-th best (or rank-th drawn) token of the parent

    @property
    def num_nodes(self) -> int:
        return self.parent.numel()

    @staticmethod
    def from_paths(paths: Sequence[Sequence[int]]) -> TreeTopology:
        """Topology from EAGLE-style choices: each path lists child ranks from the root, e.g.
        ``[(0,), (1,), (0, 0), (0, 1)]``. Every proper prefix of a path must also be a path.
        """
        norm = []
        for path in paths:
            path = tuple(path)
            if not path or any((not isinstance(r, int)) or r < 0 for r in path):
                raise ValueError(f"paths: every path must be a non-empty sequence of ranks >= 0, got {path!r}")
            norm.append(path)
        known = set(norm)
        if len(known) != len(norm):
            raise ValueError("paths: duplicate path")
        for path in norm:
            if len(path) > 1 and path[:-1] not in known:
                raise ValueError(f"paths: the prefix {path[:-1]} of {path} is missing")
        ordered = sorted(norm, key=lambda p: (len(p), p))
        index = {(): 0}
        parent, depth, rank = [-1], [0], [0]
        for i, path in enumerate(ordered, start=1):
            index[path] = i
            parent.append(index[path[:-1]])
            depth.append(len(path))
            rank.append(path[-1])
        return TreeTopology(torch.tensor(parent), torch.tensor(depth), torch.tensor(rank))


def chain_paths(length: int) -> list[tuple[int, ...]]:
    """A chain of ``length`` drafts as a tree: [(0,), (0, 0), ...]."""
    return [(0,) * d for d in range(1, length + 1)]


def full_tree_paths(widths: Sequence[int]) -> list[tuple[int, ...]]:
    """The full tree with ``widths[d]`` children under every node of depth d."""
    paths: list[tuple[int, ...]] = []
    level: list[tuple[int, ...]] = [()]
    for width in widths:
        level = [p + (r,) for p in level for r in range(width)]
        paths.extend(level)
    return paths


def _gather_state(state: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    return None if state is None else state.index_select(0, index)


def _sample_children(
    log_q: torch.Tensor, count: int, mode: str, generator: torch.Generator | None
) -> torch.Tensor:
    """[R, count] int64 children tokens: top-k (mode "topk"), i.i.d. draws, or draws without replacement
    (Gumbel-top-k, in draw order). Draws of probability 0 (support exhausted) become -1 placeholders."""
    if mode == "topk":
        return torch.topk(log_q, count, dim=-1).indices
    q = log_q.exp()
    if mode == "iid":
        return torch.multinomial(q, count, replacement=True, generator=generator)
    u = torch.rand(q.shape, generator=generator, device=q.device).clamp_min(torch.finfo(torch.float32).tiny)
    keys = log_q - torch.log(-torch.log(u))
    top = torch.topk(keys, count, dim=-1)
    return torch.where(torch.isfinite(top.values), top.indices, -1)


def build_static_tree(
    drafter: Drafter,
    context: torch.Tensor,
    topology: TreeTopology,
    sibling_sampling: str | None = None,
    generator: torch.Generator | None = None,
) -> DraftTree:
    """Fill one static topology for each of B requests.

    Args:
        drafter: see :class:`Drafter`.
        context: [B, P] int64 tokens so far (P >= 1); the last one is every tree's root.
        topology: the shared shape; a node of rank r is the parent's r-th best token (deterministic tree)
            or its parent's r-th draw from q (stochastic tree).
        sibling_sampling: None for a deterministic tree (top-k tokens); "iid" or "without_replacement" for
            a stochastic tree whose ``draft_probs`` rows are the q each node's children were drawn from.
        generator: torch generator for the stochastic draws.
    """
    if sibling_sampling not in (None, "iid", "without_replacement"):
        raise ValueError(f"sibling_sampling must be None, 'iid' or 'without_replacement', got {sibling_sampling!r}")
    if context.dim() != 2 or context.shape[1] < 1:
        raise ValueError(f"context must be [B, P] with P >= 1, got shape {tuple(context.shape)}")
    device = context.device
    num_reqs = context.shape[0]
    parent = topology.parent.to(device)
    depth = topology.depth.to(device)
    rank = topology.rank.to(device)
    n = topology.num_nodes
    mode = "topk" if sibling_sampling is None else sibling_sampling
    tokens = torch.full((num_reqs, n), -1, dtype=torch.int64, device=device)
    tokens[:, 0] = context[:, -1]
    paths = torch.full((num_reqs, n, int(depth.max()) + 1), -1, dtype=torch.int64, device=device)
    paths[:, 0, 0] = context[:, -1]
    q_rows: torch.Tensor | None = None
    states: dict[int, torch.Tensor | None] = {}
    num_kids = torch.bincount(parent[1:], minlength=n) if n > 1 else torch.zeros(n, dtype=torch.int64)
    width = (rank.max() + 1) if n > 1 else 0
    for d in range(int(depth.max())):
        expand = [i for i in range(n) if int(depth[i]) == d and int(num_kids[i]) > 0]
        if not expand:
            continue
        idx = torch.tensor(expand, device=device)
        node_paths = paths[:, idx, : d + 1]  # [B, m, d + 1]
        inputs = torch.cat(
            [context[:, None, :-1].expand(-1, len(expand), -1), node_paths], dim=-1
        ).reshape(num_reqs * len(expand), -1)
        parent_state = None
        if d > 0 and states[int(parent[expand[0]])] is not None:
            parent_state = torch.stack([states[int(parent[i])] for i in expand], 1).flatten(0, 1)
        log_q, state = drafter(inputs, parent_state)
        log_q = torch.log_softmax(log_q.float(), dim=-1)
        if int(width) > log_q.shape[-1]:
            raise ValueError(f"topology: child rank {int(width) - 1} needs more than V = {log_q.shape[-1]} tokens")
        if q_rows is None:
            q_rows = torch.zeros(num_reqs, n, log_q.shape[-1], dtype=torch.float32, device=device)
        q_rows[:, idx] = log_q.view(num_reqs, len(expand), -1).exp()
        kids = _sample_children(log_q, int(width), mode, generator).view(num_reqs, len(expand), -1)
        for j, i in enumerate(expand):
            states[i] = None if state is None else state.view(num_reqs, len(expand), *state.shape[1:])[:, j]
            for c in torch.nonzero(parent == i).flatten().tolist():
                tok = kids[:, j, int(rank[c])]
                tokens[:, c] = tok
                paths[:, c, : d + 1] = paths[:, i, : d + 1]
                paths[:, c, d + 1] = tok
    cu = torch.arange(num_reqs + 1, device=device) * n
    draft_probs = None
    if sibling_sampling is not None:
        draft_probs = (q_rows if q_rows is not None else torch.zeros(num_reqs, n, 1, device=device)).flatten(0, 1)
    return DraftTree(
        tokens.flatten(), parent.repeat(num_reqs), cu, depth.repeat(num_reqs), draft_probs,
        sibling_sampling or "",
    )


def build_dynamic_tree(
    drafter: Drafter,
    context: torch.Tensor,
    depth: int,
    top_k: int,
    beam: int,
    budget: int,
) -> DraftTree:
    """EAGLE-2 style dynamic deterministic tree for B requests, ``budget`` non-root nodes each.

    Level 0 proposes the root's ``top_k`` best children; each further level expands the ``beam`` best
    nodes of the previous level (by cumulative draft log-probability) into their ``top_k`` best children.
    All candidates are then reranked by cumulative log-probability (ties: shallower first) and the best
    ``budget`` kept; a node's score never exceeds its parent's, so the kept set is a tree.
    """
    if depth < 1 or top_k < 1 or beam < 1 or budget < 1:
        raise ValueError("depth, top_k, beam and budget must be >= 1")
    num_cands = top_k + (depth - 1) * beam * top_k
    if budget > num_cands:
        raise ValueError(f"budget={budget} exceeds the {num_cands} candidates that depth/top_k/beam produce")
    if beam > top_k and depth > 1:
        raise ValueError(f"beam ({beam}) must be <= top_k ({top_k}): a level has at most top_k * beam nodes")
    device = context.device
    num_reqs = context.shape[0]
    arange_b = torch.arange(num_reqs, device=device)
    log_q, state = drafter(context, None)
    log_q = torch.log_softmax(log_q.float(), dim=-1)
    top = torch.topk(log_q, top_k, dim=-1)
    cand_token = [top.indices]  # per level [B, c]
    cand_score = [top.values]
    cand_parent = [torch.full((num_reqs, top_k), -1, dtype=torch.int64, device=device)]  # global cand index
    cand_path = [top.indices[:, :, None]]  # [B, c, d + 1] path tokens after the root
    level_state = state  # state of the parents of the current level's candidates, [B * m, ...]
    level_parent_slot = torch.zeros(num_reqs, top_k, dtype=torch.int64, device=device)  # row in level_state
    level_width_prev = 1
    offset = 0
    for _ in range(1, depth):
        scores = cand_score[-1]
        best = torch.topk(scores, beam, dim=-1).indices  # [B, beam] (ties: lowest index)
        path = cand_path[-1].gather(1, best[:, :, None].expand(-1, -1, cand_path[-1].shape[-1]))
        inputs = torch.cat([context[:, None, :].expand(-1, beam, -1), path], -1).flatten(0, 1)
        parent_rows = (arange_b[:, None] * level_width_prev + level_parent_slot.gather(1, best)).flatten()
        log_q, state = drafter(inputs, _gather_state(level_state, parent_rows))
        log_q = torch.log_softmax(log_q.float(), dim=-1).view(num_reqs, beam, -1)
        top = torch.topk(log_q, top_k, dim=-1)
        score = (scores.gather(1, best)[:, :, None] + top.values).flatten(1)
        tokens = top.indices.flatten(1)
        cand_parent.append((offset + best)[:, :, None].expand(-1, -1, top_k).flatten(1))
        offset += scores.shape[1]
        cand_token.append(tokens)
        cand_score.append(score)
        cand_path.append(torch.cat([path.repeat_interleave(top_k, dim=1), tokens[:, :, None]], -1))
        level_state = state
        level_parent_slot = torch.arange(beam, device=device).repeat_interleave(top_k)[None].expand(num_reqs, -1)
        level_width_prev = beam
    token = torch.cat(cand_token, 1)
    score = torch.cat(cand_score, 1)
    par = torch.cat(cand_parent, 1)
    level = torch.cat([torch.full_like(t, d) for d, t in enumerate(cand_token)], 1)
    # Rerank: score descending, ties shallower first, then lower index (two stable sorts).
    order = torch.sort(level, dim=1, stable=True).indices
    order = order.gather(1, torch.sort(score.gather(1, order), dim=1, descending=True, stable=True).indices)
    keep = torch.sort(order[:, :budget], dim=1).values  # kept candidates in index (= level) order
    local_of = torch.full_like(token, -1)
    local_of.scatter_(1, keep, torch.arange(1, budget + 1, device=device).expand(num_reqs, -1))
    kept_par = par.gather(1, keep)
    parent_local = torch.where(kept_par >= 0, local_of.gather(1, kept_par.clamp(min=0)), 0)
    if bool((parent_local < 0).any()):  # cannot happen: scores never increase along a path
        raise RuntimeError("dynamic tree rerank dropped a parent")
    n = budget + 1
    tokens = torch.cat([context[:, -1:], token.gather(1, keep)], 1)
    parent = torch.cat([torch.full((num_reqs, 1), -1, device=device, dtype=torch.int64), parent_local], 1)
    depth_ = torch.cat([torch.zeros(num_reqs, 1, dtype=torch.int64, device=device), level.gather(1, keep) + 1], 1)
    cu = torch.arange(num_reqs + 1, device=device) * n
    return DraftTree(tokens.flatten(), parent.flatten(), cu, depth_.flatten(), None, "")


def tree_from_proposal(proposal) -> DraftTree:
    """The :class:`DraftTree` of a model drafter's ``TreeProposal`` (``drafters/base.py``: EAGLE-3, MTP,
    draft model ``propose_tree``). Their sampled trees draw siblings without replacement (Gumbel-top-k),
    so a proposal with ``draft_probs`` is verified with recursive rejection sampling."""
    num_reqs, n = proposal.node_token_ids.shape
    device = proposal.node_token_ids.device
    probs = proposal.draft_probs
    return DraftTree(
        proposal.node_token_ids.reshape(-1).to(torch.int64), proposal.parent.reshape(-1).to(torch.int64),
        torch.arange(num_reqs + 1, device=device) * n, proposal.depth.reshape(-1).to(torch.int64),
        None if probs is None else probs.reshape(num_reqs * n, -1).float(),
        "" if probs is None else "without_replacement",
    )


def tree_attention_mask(parent: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[B, n, prefix_len + n] bool mask for the target's tree forward pass.

    ``parent`` [B, n] local parent indices (-1 at node 0). Node i attends to the ``prefix_len`` cached
    tokens before the root and to its ancestors and itself among the n tree nodes (fed at positions
    ``prefix_len + depth``).
    """
    num_reqs, n = parent.shape
    device = parent.device
    anc = torch.eye(n, dtype=torch.bool, device=device).expand(num_reqs, n, n).clone()
    has_parent = parent >= 0
    rows = torch.arange(n, device=device)[None, :].expand(num_reqs, -1)
    reqs = torch.arange(num_reqs, device=device)[:, None].expand(-1, n)
    anc[reqs, rows, parent.clamp(min=0)] |= has_parent
    # Transitive closure by repeated squaring: log2(n) boolean matrix products.
    for _ in range(max(n - 1, 1).bit_length()):
        anc = anc | (anc.float() @ anc.float() > 0)
    prefix = torch.ones(num_reqs, n, prefix_len, dtype=torch.bool, device=device)
    return torch.cat([prefix, anc], -1)


def compact_kv_cache(
    cache: torch.Tensor,
    root_slot: torch.Tensor,
    accepted_nodes: torch.Tensor,
    num_accepted: torch.Tensor,
    seq_dim: int = 1,
) -> torch.Tensor:
    """Move the accepted path's cache entries next to each other, in place; returns the new lengths.

    ``cache`` [B, S, ...] (sequence along ``seq_dim``) holds tree node i of request b at slot
    ``root_slot[b] + i``; after the call slots ``root_slot[b] + j`` for j = 0..num_accepted[b] hold the
    accepted path (root first), and the returned [B] int64 ``root_slot + num_accepted + 1`` is the new
    length. Slots beyond it are left as they were.
    """
    cache_ = cache.movedim(seq_dim, 1)
    num_reqs, seq_len = cache_.shape[:2]
    width = accepted_nodes.shape[1]
    j = torch.arange(width, device=cache.device)
    valid = j[None, :] <= num_accepted[:, None].to(torch.int64)
    root = root_slot.to(torch.int64)[:, None]
    src = torch.where(valid, root + accepted_nodes.to(torch.int64), root + j).clamp(0, seq_len - 1)
    dst = (root + j).clamp(0, seq_len - 1)
    trailing = cache_.shape[2:]
    expand = lambda idx: idx.view(num_reqs, width, *([1] * len(trailing))).expand(-1, -1, *trailing)
    moved = cache_.gather(1, expand(src))
    cache_.scatter_(1, expand(dst), torch.where(valid.view(num_reqs, width, *([1] * len(trailing))),
                                                 moved, cache_.gather(1, expand(dst))))
    return root_slot.to(torch.int64) + num_accepted.to(torch.int64) + 1
