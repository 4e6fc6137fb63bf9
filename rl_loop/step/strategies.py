"""How a round of the one rollout engine (``engine.py``) speculates: autoregressive, chain and tree are
strategies of one loop, ``propose -> one policy forward -> verify -> commit``.

- :class:`Autoregressive`: the policy runs one token per request; ``verify_chain`` with zero drafts samples
  the next token (its bonus path, Philox stream 2): the same kernel and randomness spec as speculation.
  Every strategy calls the kernels with ``validate=False``: the engine builds their inputs itself, so the
  per-call argument checks (host syncs) would be paid on every autoregressive token for nothing.
- :class:`ChainSpeculation`: the drafter (``specdec_kernels.drafters``) proposes ``k`` tokens; the policy
  runs ``[last emitted token, d_1 .. d_k]`` in one forward; ``verify_chain`` accepts a prefix and emits one
  correction or bonus token. Compaction is a length update: rejected drafts' keys/values sit beyond the
  valid prefix and are overwritten by the next forward.
- :class:`TreeSpeculation`: the drafter proposes a tree (``Drafter.propose_tree``); the policy runs every
  node in one forward (node i at slot ``length + i``, RoPE position ``length + depth(i)``, attending to the
  cached prefix and its ancestors); ``verify_tree`` picks the path (greedy: target-only walk; sampled:
  recursive rejection sampling over siblings drawn without replacement); the accepted nodes' keys/values
  move to contiguous slots.
- ``--verify block`` / ``--verify traversal`` (``GenerationConfig.verify``): chains verify with
  ``method="block"``, trees with ``method="traversal"`` (sequence-level, optimal for one draft block / a
  fixed tree, lossless too). Rollouts sample (T > 0), so every drafter passes its q and the drafts are
  stochastic; the greedy requests of evaluation and of the equivalence check carry deterministic drafts, for
  which both kernels run token level (no verifier beats it there).

Randomness (docs/design.md §4): every draw is keyed by the request's seed and an absolute position. The
drafter samples drafts / siblings on Philox stream 3 at the positions they decide; verification row j of
a request decides position ``position + j``. So a request's tokens depend on its own prompt and seed only:
not on the batch, ``max_batch`` or its slot (batch invariance), and the emitted sequence has the
autoregressive law whatever the drafter does (lossless); at temperature 0 it is the argmax chain.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import specdec_kernels as sk
from specdec_kernels.api import CHAIN_METHODS, TREE_METHODS
from specdec_kernels.drafters import CachedDrafter
from specdec_kernels.drafters.tree_builder import tree_attention_mask
from specdec_kernels.models import KVCache

from .rollouts import TreeShape


class Proposal(NamedTuple):
    """The policy's input rows of one round and what verification needs of the drafts."""

    tokens: torch.Tensor  # [R, n] policy input (last emitted token first)
    depth: torch.Tensor | None  # [R, n] RoPE offset from the cache length (None: 0..n-1)
    tree_mask: torch.Tensor | None  # [R, n, n] ancestor mask (None: causal)
    drafts: object  # DraftProposal / TreeProposal / None


class Verified(NamedTuple):
    output_token_ids: torch.Tensor  # [R, w] accepted drafts then the correction / bonus token, -1 padded
    num_accepted: torch.Tensor  # [R]
    path: torch.Tensor | None  # [R, w] policy rows along the accepted path (tree), -1 padded; None: 0..w-1
    mask: sk.SamplingMask | None = None  # per emitted token the ids its row kept (``record_mask`` strategies)


def _truncation(strategy, num_requests: int, device: torch.device) -> dict:
    """``verify_*``'s top_k / top_p for ``num_requests`` requests of ``strategy`` on ``device`` (None where off)."""
    top_k = (torch.full((num_requests,), strategy.top_k, dtype=torch.int32, device=device) if strategy.top_k > 0
             else None)
    top_p = torch.full((num_requests,), strategy.top_p, device=device) if strategy.top_p < 1.0 else None
    return {"top_k": top_k, "top_p": top_p}


def _result(out, record_mask: bool):
    """(result, mask) of a ``verify_*(..., return_mask=record_mask)`` call; mask None when not recorded."""
    return out if record_mask else (out, None)


class Autoregressive:
    """One token per request per round (``spec="none"``)."""

    depth = 0
    width = 1
    capture: tuple[int, ...] = ()
    record_mask = False  # also return each emitted token's sampling mask (the engine sets it per call)
    top_k, top_p = 0, 1.0  # the target's truncation (GenerationConfig's; the engine sets them per call)

    def reset(self, num_slots: int, max_len: int) -> None:
        pass

    def admit(self, slots: list[int], prompts: list[list[int]], features: list[torch.Tensor]) -> None:
        pass

    def propose(self, rows: torch.Tensor, last: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor,
                position: torch.Tensor) -> Proposal:
        return Proposal(last[:, None], None, None, None)

    def verify(self, logits: torch.Tensor, proposal: Proposal, temperature: torch.Tensor, seed: torch.Tensor,
               position: torch.Tensor, backend: str) -> Verified:
        r = logits.shape[0]
        dev = logits.device
        res = sk.verify_chain(logits.reshape(r, -1), torch.zeros(0, dtype=torch.long, device=dev),
                              torch.zeros(r + 1, dtype=torch.long, device=dev), temperature=temperature, seed=seed,
                              position=position, backend=backend, max_draft_len=0, validate=False,
                              return_mask=self.record_mask, **_truncation(self, r, logits.device))
        res, mask = _result(res, self.record_mask)
        return Verified(res.output_token_ids, res.num_accepted, None, mask)

    def compact(self, cache: KVCache, rows: torch.Tensor, start: torch.Tensor, verified: Verified) -> None:
        pass

    def commit(self, rows: torch.Tensor, verified: Verified, features: list[torch.Tensor]) -> None:
        pass


class _Drafting:
    """The drafter side shared by the chain and tree strategies: slots, admission, commit."""

    record_mask = False  # as Autoregressive.record_mask
    top_k, top_p = 0, 1.0

    def __init__(self, drafter: CachedDrafter, temperature: float) -> None:
        self.drafter = drafter
        self.capture = tuple(drafter.feature_layers)
        self.sampled = temperature > 0

    def features(self, hidden: list[torch.Tensor]) -> torch.Tensor | None:
        """The drafter's features from the policy's captured hidden states (EAGLE-3: concatenated)."""
        if not self.capture:
            return None
        return hidden[0] if len(hidden) == 1 else torch.cat(hidden, -1)

    def reset(self, num_slots: int, max_len: int) -> None:
        self.drafter.reset(num_slots, max_len + self.width + 2)

    def admit(self, slots: list[int], prompts: list[list[int]], features: list[torch.Tensor]) -> None:
        """Prefill the drafter: each prompt but its last token (cached by the policy, with ``features``
        [A, W, F] there), then the last token (the first input of the next policy forward)."""
        if any(len(p) < 2 for p in prompts):
            raise ValueError("speculative rollouts need prompts of at least 2 tokens")
        width = max(map(len, prompts)) - 1
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p) - 1] = torch.tensor(p[:-1])
        dev = self.drafter.head.lm_head.weight.device
        self.drafter.admit(torch.tensor(slots, device=dev), ids.to(dev),
                           torch.tensor([len(p) - 1 for p in prompts], device=dev),
                           torch.tensor([p[-1] for p in prompts], device=dev), self.features(features))

    def draft_args(self, temperature: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> tuple:
        """(temperature, seed, position) for the drafter: None for greedy requests (deterministic drafts)."""
        return (temperature, seed, position) if self.sampled else (None, None, None)

    def commit(self, rows: torch.Tensor, verified: Verified, features: list[torch.Tensor]) -> None:
        feats = self.features(features)
        if feats is not None and verified.path is not None:  # the policy features along the accepted path
            feats = feats[torch.arange(feats.shape[0], device=feats.device)[:, None], verified.path.clamp(min=0)]
        self.drafter.commit(verified.num_accepted, verified.output_token_ids, feats, rows=rows)


class ChainSpeculation(_Drafting):
    """``k`` drafts per request per round, verified with ``verify_chain(method=method)``: "token" (token
    level) or "block" (block verification: at least as many accepted drafts, same law)."""

    def __init__(self, drafter: CachedDrafter, k: int, temperature: float, method: str = "token") -> None:
        super().__init__(drafter, temperature)
        if method not in CHAIN_METHODS:
            raise ValueError(f"chain verification method must be one of {CHAIN_METHODS}, got {method!r}")
        self.depth = k
        self.width = k + 1
        self.method = method

    def propose(self, rows: torch.Tensor, last: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor,
                position: torch.Tensor) -> Proposal:
        drafts = self.drafter.propose(self.depth, *self.draft_args(temperature, seed, position), rows=rows)
        return Proposal(torch.cat([last[:, None], drafts.token_ids], 1), None, None, drafts)

    def verify(self, logits: torch.Tensor, proposal: Proposal, temperature: torch.Tensor, seed: torch.Tensor,
               position: torch.Tensor, backend: str) -> Verified:
        tokens, cu, probs = proposal.drafts.flat()
        r, n, v = logits.shape
        res = sk.verify_chain(logits.reshape(r * n, v), tokens, cu, draft_probs=probs, temperature=temperature,
                              seed=seed, position=position, backend=backend, method=self.method,
                              max_draft_len=self.depth, validate=False, return_mask=self.record_mask,
                              **_truncation(self, r, logits.device))
        res, mask = _result(res, self.record_mask)
        return Verified(res.output_token_ids, res.num_accepted, None, mask)

    def compact(self, cache: KVCache, rows: torch.Tensor, start: torch.Tensor, verified: Verified) -> None:
        pass  # the engine's length update drops the rejected tail


class TreeSpeculation(_Drafting):
    """A draft tree of :class:`TreeShape` per request per round, verified with ``verify_tree(method=method)``:
    "token" (root-to-leaf walks) or "traversal" (traversal verification, leaf to root: at least as many
    accepted nodes, same law)."""

    def __init__(self, drafter: CachedDrafter, shape: TreeShape, temperature: float, method: str = "token") -> None:
        super().__init__(drafter, temperature)
        if method not in TREE_METHODS:
            raise ValueError(f"tree verification method must be one of {TREE_METHODS}, got {method!r}")
        self.shape = shape
        self.method = method
        self.depth = shape.depth
        self.width = shape.num_nodes

    def propose(self, rows: torch.Tensor, last: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor,
                position: torch.Tensor) -> Proposal:
        s = self.shape
        tree = self.drafter.propose_tree(s.depth, s.top_k, s.beam, *self.draft_args(temperature, seed, position),
                                         rows=rows)
        return Proposal(tree.node_token_ids, tree.depth, tree_attention_mask(tree.parent, 0), tree)

    def verify(self, logits: torch.Tensor, proposal: Proposal, temperature: torch.Tensor, seed: torch.Tensor,
               position: torch.Tensor, backend: str) -> Verified:
        nodes, parent, cu, probs = proposal.drafts.flat()
        r, n, v = logits.shape
        res = sk.verify_tree(logits.reshape(r * n, v), nodes, parent, cu, draft_probs=probs,
                             temperature=temperature, seed=seed, position=position,
                             sibling_sampling="iid" if probs is None else "without_replacement", backend=backend,
                             method=self.method, max_depth=self.depth, validate=False, return_mask=self.record_mask,
                             **_truncation(self, r, logits.device))
        res, mask = _result(res, self.record_mask)
        return Verified(res.output_token_ids, res.num_accepted, res.accepted_nodes.long(), mask)

    def compact(self, cache: KVCache, rows: torch.Tensor, start: torch.Tensor, verified: Verified) -> None:
        """Move the accepted path's keys/values to contiguous slots after the prefix."""
        width = verified.path.shape[1]
        j = torch.arange(width)
        valid = j[None, :] <= verified.num_accepted.long()[:, None]
        src = start[:, None] + torch.where(valid, verified.path, j[None, :])
        cache.gather_positions(rows, src, start[:, None] + j[None, :])


def strategy_for(spec: str, drafter: CachedDrafter | None, k: int, tree: TreeShape, temperature: float,
                 verify: str = "token") -> Autoregressive | ChainSpeculation | TreeSpeculation:
    """The strategy of ``spec`` ("none" | "chain" | "tree") with ``drafter``, verifying with ``verify``
    ("token"; "block" for chains, "traversal" for trees; ignored without drafts)."""
    if spec == "none":
        return Autoregressive()
    if drafter is None:
        raise ValueError(f"spec={spec!r} needs a drafter")
    if spec == "chain":
        return ChainSpeculation(drafter, k, temperature, verify)
    if spec == "tree":
        return TreeSpeculation(drafter, tree, temperature, verify)
    raise ValueError(f"spec must be 'none', 'chain' or 'tree', got {spec!r}")
