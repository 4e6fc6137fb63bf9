"""Planted bugs in the block and traversal references, to prove that their exactness checks can fail.

Each bug is one line of the method that an implementer could get wrong; :func:`planted` swaps the
corresponding helper of ``reference/block.py`` or ``reference/traversal.py`` for the buggy one while the
context is open (the reference backend then runs the mutant), and restores it afterwards.

- ``block_weights_token_residual``: the stop probabilities h_j use the token-level residual mass
  sum max(0, p - q) instead of the block residual sum max(0, w_j p - q).
- ``block_boundary_token_residual``: the token after the accepted prefix is drawn from the token-level
  residual norm(max(0, p - q)) instead of norm(max(0, w_tau p - q)).
- ``block_first_failure``: tau = the last row of the first run of successful tests (a forward scan that
  stops at the first failed test) instead of the largest row whose test succeeds.
- ``block_coin_per_position``: the test of prefix j uses the token-level coin of its position
  (stream 0 at ``position + j - 1``). Exact within one verification, but block verification tests rows
  it then does not accept, and the next round starts right after the accepted tokens and draws those
  coins again, conditioned: only the whole-sequence law sees it.
- ``traversal_no_path_probability``: a child's weight is min(1, p(x) / q(x)) with p the parent's
  normalised mass, dropping the path probability M of the parent (token-level weights in a traversal).
- ``traversal_reversed_siblings``: siblings are visited last first, while the draws (without replacement)
  and their laws are in the original order.
- ``traversal_coin_per_depth``: every node at one depth tests with the same coin (indexed by the depth,
  which is the chain's index), so sibling subtrees' tests are not independent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..reference import block as ref_block
from ..reference import philox
from ..reference import traversal as ref_traversal

__all__ = ["MUTANTS", "planted"]


def _token_level_mass(w, p, q):
    return torch.clamp(p - q, min=0.0).double().sum(-1)


def _token_level_residual(w, p, q):
    return torch.clamp(p - q, min=0.0)


def _first_failure(tau, j, stop):
    return torch.where(stop & (tau == j - 1), j, tau)


def _coin_per_position(seed, position, j):
    return philox.coins(seed, position + j - 1)


def _no_path_probability(m_parent, q_parent, x):
    total = m_parent.sum(-1, keepdim=True)
    p = torch.where(total > 0, m_parent / torch.where(total > 0, total, 1.0), m_parent)
    return ref_block.ratio_weight(p.gather(-1, x[:, None])[:, 0], q_parent.gather(-1, x[:, None])[:, 0])


_CHILDREN_TABLE = ref_traversal.children_table


def _reversed_children(layout):
    table = _CHILDREN_TABLE(layout)
    count = (table >= 0).sum(-1, keepdim=True)
    idx = torch.arange(table.shape[1])[None, :]
    return table.gather(1, torch.where(idx < count, count - 1 - idx, idx))


def _coin_per_depth(local, depth):
    return depth


MUTANTS: dict[str, tuple[object, str, object]] = {
    "block_weights_token_residual": (ref_block, "stop_mass", _token_level_mass),
    "block_boundary_token_residual": (ref_block, "residual_row", _token_level_residual),
    "block_first_failure": (ref_block, "last_stop", _first_failure),
    "block_coin_per_position": (ref_block, "prefix_coin", _coin_per_position),
    "traversal_no_path_probability": (ref_traversal, "entry_weight", _no_path_probability),
    "traversal_reversed_siblings": (ref_traversal, "children_table", _reversed_children),
    "traversal_coin_per_depth": (ref_traversal, "coin_index", _coin_per_depth),
}


@contextlib.contextmanager
def planted(bug: str) -> Iterator[None]:
    """While open, ``backend="reference"`` runs the reference with ``bug`` (see MUTANTS)."""
    if bug not in MUTANTS:
        raise ValueError(f"bug must be one of {tuple(MUTANTS)}, got {bug!r}")
    module, name, fn = MUTANTS[bug]
    original = getattr(module, name)
    setattr(module, name, fn)
    try:
        yield
    finally:
        setattr(module, name, original)
