"""Tree-speculative rollouts (``--spec tree``): draft trees from the EAGLE-3 head verified with ``verify_tree``.

:class:`TreeRolloutEngine` extends :class:`rl_loop.engine.RolloutEngine` (same slots, continuous batching,
prefill, per-request seeds, :class:`Rollouts` / :class:`RolloutStats` contract); ``spec="none"`` and
``spec="chain"`` go to the parent engine unchanged. Every round, for the active slots:

1. the drafter runs its pending rows (the policy features of the tokens verified last round) once, then
   a tree of ``budget`` non-root nodes (``budget = k`` by default: the same node budget, hence the same
   policy rows, as a chain of k drafts) grows from the drafter's log-probabilities: greedy requests get an
   EAGLE-2 dynamic tree (``tree_builder.build_dynamic_tree``: top-k children of the best nodes, reranked
   by cumulative log-probability); sampled requests get a stochastic tree (``build_static_tree`` on
   :func:`sampled_paths`, siblings drawn without replacement from the tempered q, verified with recursive
   rejection sampling), since a deterministic tree only accepts when the target's sample happens to be
   among the top-k drafts. Drafting a node recomputes its path's head rows against a scratch copy of the
   head's committed cache, so sibling paths never see each other;
2. the policy runs the ``budget + 1`` nodes ``[last emitted token (root), nodes...]`` in ONE forward against
   its KV cache, node i at slot ``length + i`` and RoPE position ``length + depth(i)``, attending to the
   cached prefix and to its ancestors (``tree_attention_mask``);
3. ``verify_tree`` picks the accepted path (greedy: argmax child; sampled: recursive rejection sampling
   over the drawn siblings, or target-only sampling on a deterministic tree; see the RNG spec); the accepted nodes' keys/values move to contiguous slots
   (``KVCache.gather_positions``) and the drafter commits the policy features along the accepted path.

Randomness (DESIGN.md §4): the root of request b's tree decides absolute position ``length + 1`` (the
index of the next token), a depth-d node position ``length + 1 + d``; each position is decided by exactly
one node, with Philox noise keyed by the request's seed, and the tree (drafted with a separate torch
generator) depends only on tokens already emitted and on that generator. So the output has the autoregressive law whatever the drafter does, and at temperature 0
it is the argmax chain, token-identical to autoregressive decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

import specdec_kernels as sk
from specdec_kernels.drafters.tree_builder import (
    TreeTopology,
    build_dynamic_tree,
    build_static_tree,
    tree_attention_mask,
)

from .drafters import Eagle3Drafter
from .engine import GenerationConfig, RolloutEngine, Rollouts, RolloutStats, _Requests, resolve_verify_backend
from .model import KVCache, Qwen3

__all__ = ["TreeShape", "TreeRolloutEngine", "check_tree_config", "sampled_paths", "tree_shape_for"]


@dataclass(frozen=True)
class TreeShape:
    """EAGLE-2 dynamic tree knobs: expand ``beam`` best nodes per level into ``top_k`` children each, for
    ``depth`` levels, then keep the ``budget`` best nodes by cumulative draft log-probability."""

    depth: int
    top_k: int
    beam: int
    budget: int
    # Sampled requests (temperature > 0): draw siblings from the tempered draft distribution q without
    # replacement on the static topology :func:`sampled_paths` and verify with recursive rejection
    # sampling (with one child per node this is exactly chain speculative sampling). False: use the
    # deterministic EAGLE-2 tree at every temperature (target-only verification).
    stochastic_when_sampling: bool = True

    def __post_init__(self) -> None:
        if min(self.depth, self.top_k, self.beam, self.budget) < 1:
            raise ValueError(f"depth, top_k, beam and budget must be >= 1, got {self}")
        if self.beam > self.top_k and self.depth > 1:
            raise ValueError(f"beam ({self.beam}) must be <= top_k ({self.top_k})")
        cands = self.top_k + (self.depth - 1) * self.beam * self.top_k
        if self.budget > cands:
            raise ValueError(f"budget={self.budget} exceeds the {cands} candidates of depth/top_k/beam")


def sampled_paths(depth: int, budget: int) -> list[tuple[int, ...]]:
    """Static topology for stochastic trees: the first-draw chain of ``min(depth, budget)`` nodes, then
    second draws under its nodes from the root down, then third draws, ... until ``budget`` nodes."""
    chain = [(0,) * d for d in range(1, min(depth, budget) + 1)]
    paths = list(chain)
    rank = 1
    while len(paths) < budget:
        for node in [()] + chain[:-1]:
            if len(paths) == budget:
                break
            paths.append(node + (rank,))
        rank += 1
    return paths


def tree_shape_for(k: int, budget: int | None = None, top_k: int = 2) -> TreeShape:
    """The default tree for ``--k k``: depth k, top-2 children of the best 2 nodes per level, ``budget``
    (default k: equal node budget with a chain of k drafts) nodes kept."""
    top_k = max(1, top_k)
    return TreeShape(depth=k, top_k=top_k, beam=top_k, budget=k if budget is None else budget)


class _HeadTreeDrafter:
    """The ``tree_builder`` drafter callable over an :class:`Eagle3Drafter`'s head for one round.

    ``tokens`` [R, 1 + d] (a dummy context column, then the node's path below the root: d tokens);
    rows are request-major (``R = B * m``). ``parent_state`` [R, d, H] holds the head outputs g along the
    parent's path (g at the root first); row j of the path's head forward is ``inputs(x_{j+1}, g_j)``,
    at head-cache slot ``base + j`` and position ``base + j + 1``, attending to the committed head cache
    (a scratch copy per node) and to the earlier rows of the same path. Returns tempered draft log-probs
    and the extended g path [R, d + 1, H].
    """

    def __init__(self, drafter: Eagle3Drafter, slots: list[int], root_logits: torch.Tensor,
                 root_g: torch.Tensor, base: torch.Tensor, inv_t: torch.Tensor) -> None:
        self.d, self.slots, self.base, self.inv_t = drafter, torch.tensor(slots), base, inv_t
        self.root_logits, self.root_g = root_logits, root_g

    def __call__(self, tokens: torch.Tensor, parent_state: torch.Tensor | None):
        b = self.slots.numel()
        if parent_state is None:  # the roots: logits already computed from the pending rows
            return self.root_logits * self.inv_t, self.root_g[:, None]
        r, d = tokens.shape[0], tokens.shape[1] - 1
        req = torch.arange(r) // (r // b)
        base = self.base[req]
        path = tokens[:, 1:].clamp(min=0)  # -1: placeholder of an exhausted draw (never accepted)
        head = self.d.head
        dec = head.decoder
        kv = int(base.max()) + d
        scratch = KVCache(dec.config, r, kv)
        m = int(base.max())
        src = self.d.cache
        scratch.k[:, :, :, :m] = src.k[:, self.slots[req], :, :m]
        scratch.v[:, :, :, :m] = src.v[:, self.slots[req], :, :m]
        x = head.inputs(path, parent_state)
        depth = (torch.arange(d) + 1).expand(r, d)
        logits, (g,) = dec.step(path, scratch, None, base, kv, depth=depth, hidden_layers=(0,), inputs_embeds=x)
        return logits[:, -1] * self.inv_t[req], torch.cat([parent_state, g[:, -1:]], 1)


def _eagle_pending(drafter: Eagle3Drafter, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run each slot's pending rows through the head into its cache (they are verified: committed).

    Returns the draft logits of the first tree level [R, V], the head output g there [R, H] and the new
    committed head length [R].
    """
    rows = torch.tensor(slots)
    n = drafter.n_pend[rows]
    r, width = n.numel(), int(n.max())
    toks = drafter.pend_tok[rows, :width]  # rows past n_b are stale and ignored (as in Eagle3Drafter.propose)
    feats = drafter.pend_feat[rows, :width]
    start = drafter.length[rows]
    depth = torch.arange(width).expand(r, width) + 1
    logits, (g,) = drafter.head.decoder.step(toks, drafter.cache, rows, start, int(start.max()) + width, depth=depth,
                                             hidden_layers=(0,), inputs_embeds=drafter.head.inputs(toks, feats))
    ar = torch.arange(r)
    base = start + n
    drafter.length[rows] = base
    return logits[ar, n - 1], g[ar, n - 1], base


class TreeRolloutEngine(RolloutEngine):
    """:class:`RolloutEngine` plus ``spec="tree"`` (see the module docstring); needs an EAGLE-3 / MTP drafter."""

    def __init__(self, policy: Qwen3, drafter, eos_id: int, shape: TreeShape | None = None) -> None:
        super().__init__(policy, drafter, eos_id)
        self.shape = shape

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], seeds: list[int], config: GenerationConfig) -> Rollouts:
        """As :meth:`RolloutEngine.generate`; ``config.spec == "tree"`` drafts trees of
        ``self.shape`` (default :func:`tree_shape_for(config.k)`)."""
        if config.spec != "tree":
            return super().generate(prompts, seeds, config)
        req = _Requests(prompts, seeds, min(config.max_batch, len(prompts)))
        if not isinstance(self.drafter, Eagle3Drafter):
            raise ValueError("spec='tree' needs an EAGLE-3 or MTP drafter (drafter='eagle3' or 'mtp'), got "
                             f"{type(self.drafter).__name__}")
        shape = self.shape or tree_shape_for(config.k)
        n = shape.budget + 1
        self.policy.eval()
        t_start = time.perf_counter()
        num_slots = len(req.slot_req)
        max_len = max(map(len, prompts)) + config.max_new_tokens + n + 1
        if max_len > self.policy.config.max_position_embeddings:
            raise ValueError(f"prompt + max_new_tokens + tree nodes = {max_len} exceeds max_position_embeddings")
        cache = KVCache(self.policy.config, num_slots, max_len)
        drafter: Eagle3Drafter = self.drafter
        drafter.reset(num_slots, max_len)
        stats = RolloutStats(k=shape.depth, accepted_at=[0] * shape.depth)
        seed_t, length, last = req.seed_t, req.length, req.last  # last emitted token: the next root
        temp = torch.full((num_slots,), float(config.temperature))
        vocab = self.policy.config.vocab_size
        hidden_layers = drafter.hidden_layers
        backend = resolve_verify_backend(config.backend)
        if backend == "cpu":  # the native CPU extension verifies chains; trees use the reference
            backend = "reference"
        topology = None
        max_depth = shape.depth
        if config.temperature > 0 and shape.stochastic_when_sampling:
            topology = TreeTopology.from_paths(sampled_paths(shape.depth, shape.budget))
            max_depth = int(topology.depth.max())
        generator = torch.Generator().manual_seed(int(sum(seeds)) & 0x7FFFFFFF)
        while True:
            active = self._admit(req, cache, hidden_layers, drafter, stats)
            if not active:
                break
            r = len(active)
            rows = torch.tensor(active)
            start = length[rows]
            t0 = time.perf_counter()
            root_logits, root_g, base = _eagle_pending(drafter, active)
            t_r = temp[rows]
            inv_t = torch.where(t_r > 0, 1.0 / t_r.clamp(min=1e-6), torch.ones_like(t_r))[:, None]
            head_drafter = _HeadTreeDrafter(drafter, active, root_logits, root_g, base, inv_t)
            if topology is not None:
                tree = build_static_tree(head_drafter, last[rows][:, None], topology, "without_replacement",
                                         generator)
            else:
                tree = build_dynamic_tree(head_drafter, last[rows][:, None], shape.depth, shape.top_k, shape.beam,
                                          shape.budget)
            ids = tree.node_token_ids.view(r, n).clamp(min=0)  # placeholders: any token, never accepted
            parent = tree.parent.view(r, n)
            depth = tree.depth.view(r, n)
            mask = tree_attention_mask(parent, 0)
            t1 = time.perf_counter()
            logits, hidden = self.policy.step(ids, cache, rows, start, int(start.max()) + n, depth=depth,
                                              tree_mask=mask, hidden_layers=hidden_layers)
            t2 = time.perf_counter()
            res = sk.verify_tree(
                logits.reshape(r * n, vocab), tree.node_token_ids, tree.parent, tree.cu_num_nodes,
                draft_probs=tree.draft_probs, temperature=t_r, seed=seed_t[rows], position=start + 1,
                sibling_sampling=tree.sibling_sampling or "iid", backend=backend, max_depth=max_depth,
            )
            num_acc_t = res.num_accepted.long()
            acc_nodes = res.accepted_nodes.long()  # [R, depth + 1]: 0, path nodes..., -1 padded
            # KV compaction: accepted node i (slot start + i) -> slot start + j along the path.
            width = acc_nodes.shape[1]
            j = torch.arange(width)
            valid = j[None, :] <= num_acc_t[:, None]
            src = start[:, None] + torch.where(valid, acc_nodes, j[None, :])
            cache.gather_positions(rows, src, start[:, None] + j[None, :])
            length[rows] += 1 + num_acc_t
            path_idx = acc_nodes.clamp(min=0)
            ar = torch.arange(r)[:, None]
            path_hidden = [h[ar, path_idx] for h in hidden]  # policy features along the accepted path
            out = res.output_token_ids.tolist()
            num_acc = res.num_accepted.tolist()
            t3 = time.perf_counter()
            outputs = self._record_round(stats, (t0, t1, t2, t3), active, out, num_acc, req, config.max_new_tokens)
            drafter.commit(rows, num_acc, outputs, path_hidden)
        return req.rollouts(stats, t_start)


def check_tree_config(drafter: str, pipeline: str) -> None:
    """Reject run configurations ``--spec tree`` does not support, with the flag named."""
    if drafter not in ("eagle3", "mtp"):
        raise ValueError(f"--spec tree needs --drafter eagle3 or mtp (its trees grow from the head), got {drafter!r}")
    if pipeline != "sync":
        raise ValueError(f"--spec tree runs with --pipeline sync, got {pipeline!r}")
