"""Toy Markov targets and drafters for tree verification, with their exactly enumerated laws.

A toy Markov model over a vocabulary of V tokens is a [V, V] logits table: the next token's logits
given the last token t are ``table[t]`` (the first-order ``markov_models.MarkovModel``, whose exact
sequence law ``markov_models.sequence_law`` the tree tests compare against). This module adds what trees
need: a drafter with the tree-builder interface, speculative generation with draft trees, and the exact
expected accepted length of target-only verification on a deterministic tree.
"""

from __future__ import annotations

import torch

from ..drafters.tree_builder import DraftTree
from ..reference.sampling import target_probs


class MarkovDrafter:
    """A :class:`~specdec_kernels.drafters.tree_builder.Drafter` whose log-probs depend on the last token."""

    def __init__(self, table: torch.Tensor, temperature: float = 1.0):
        self.log_probs = torch.log_softmax(table.float() / temperature, dim=-1)
        self.calls = 0

    def __call__(self, tokens: torch.Tensor, parent_state: torch.Tensor | None):
        self.calls += 1
        return self.log_probs[tokens[:, -1]], None


def markov_tables(vocab_size: int, seed: int, scale: float = 1.5, draft_noise: float = 0.8
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(target table, draft table) [V, V]: random logits and a noisy copy for the drafter."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(vocab_size, vocab_size, generator=g) * scale
    draft = target + torch.randn(vocab_size, vocab_size, generator=g) * draft_noise
    return target, draft


def transition_matrix(table: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """[V, V] float64 target transition probabilities after temperature / top-k / top-p (greedy: one-hot
    on the argmax when temperature is 0)."""
    vocab_size = table.shape[0]
    if temperature == 0:
        return torch.nn.functional.one_hot(table.float().argmax(-1), vocab_size).double()
    rows = vocab_size
    probs = target_probs(
        table, torch.full((rows,), temperature), torch.full((rows,), top_k, dtype=torch.int32),
        torch.full((rows,), top_p),
    )
    return probs.double()


def expected_accepted_length(tree: DraftTree, transition: torch.Tensor) -> torch.Tensor:
    """[B] exact mean accepted length of target-only verification of a deterministic tree: the sum over
    non-root nodes of the target probability of the node's path."""
    num_reqs = tree.num_requests
    n = tree.node_token_ids.numel() // num_reqs
    tokens = tree.node_token_ids.view(num_reqs, n)
    parent = tree.parent.view(num_reqs, n)
    prob = torch.ones(num_reqs, n, dtype=torch.float64)
    for i in range(1, n):
        par = parent[:, i]
        par_tok = tokens.gather(1, par[:, None]).squeeze(1)
        tok = tokens[:, i]
        step = torch.where(tok >= 0, transition[par_tok, tok.clamp(min=0)], 0.0)
        prob[:, i] = prob.gather(1, par[:, None]).squeeze(1) * step
    return prob[:, 1:].sum(-1)


def generate_with_trees(
    target_table: torch.Tensor,
    draft_table: torch.Tensor,
    paths: list[tuple[int, ...]],
    tree_sampling: str | None,
    temperature: float,
    top_k: int,
    top_p: float,
    first_token: int,
    length: int,
    num_seqs: int,
    seed: int,
    verify_sampling: str | None = None,
    validate: bool = True,
    backend: str = "reference",
    advance_position: bool = True,
    method: str = "token",
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative generation of ``num_seqs`` sequences of ``length`` tokens with tree drafting.

    Every round builds one static tree (``paths``) per sequence from its last token with the Markov
    drafter (top-k tokens when ``tree_sampling`` is None, else siblings drawn "iid" or
    "without_replacement"), verifies it with ``verify_tree`` against the Markov target and appends the
    emitted tokens. ``verify_sampling`` overrides the sibling_sampling told to the verifier (to plant a
    mismatch); ``advance_position=False`` plants reused randomness; ``method`` is verify_tree's; ``device``
    is where verification runs (drafting and bookkeeping stay on the CPU). Returns ([num_seqs, length]
    tokens, [rounds] mean accepted length per round).
    """
    from ..api import verify_tree
    from ..drafters.tree_builder import TreeTopology, build_static_tree

    gen = torch.Generator().manual_seed(seed)
    drafter = MarkovDrafter(draft_table)
    topology = TreeTopology.from_paths(paths)
    seqs = torch.full((num_seqs, length), -1, dtype=torch.int64)
    filled = torch.zeros(num_seqs, dtype=torch.int64)
    last = torch.full((num_seqs, 1), first_token, dtype=torch.int64)
    req_seed = torch.randint(0, 2**62, (num_seqs,), generator=gen)
    temp = torch.full((num_seqs,), float(temperature))
    tk = torch.full((num_seqs,), top_k, dtype=torch.int32) if top_k else None
    tp = torch.full((num_seqs,), float(top_p)) if top_p < 1 else None
    accepted = []
    while bool((filled < length).any()):
        tree = build_static_tree(drafter, last, topology, tree_sampling, gen)
        logits = target_table[tree.node_token_ids]
        pos = filled if advance_position else torch.zeros_like(filled)
        args = (logits, tree.node_token_ids, tree.parent, tree.cu_num_nodes, tree.draft_probs, temp, tk, tp,
                req_seed, pos)
        res = verify_tree(
            *(None if a is None else a.to(device) for a in args),
            sibling_sampling=verify_sampling or tree.sibling_sampling or "iid",
            backend=backend, validate=validate, method=method,
        )
        out = res.output_token_ids.to("cpu", torch.int64)
        num_accepted = res.num_accepted.to("cpu", torch.int64)
        count = num_accepted + 1
        accepted.append(num_accepted.double().mean())
        cols = filled[:, None] + torch.arange(out.shape[1])
        ok = (torch.arange(out.shape[1])[None, :] < count[:, None]) & (cols < length)
        rows = torch.arange(num_seqs)[:, None].expand_as(cols)
        seqs[rows[ok], cols[ok]] = out[ok]
        last = out.gather(1, (count - 1)[:, None])
        filled = filled + count
    return seqs, torch.stack(accepted)
