"""Exact laws and expected accepted lengths of one verification step on toy Markov targets and drafters.

Everything here is computed by enumeration in float64, with the rules of each method written from the
theory (not from the kernels), so it is an independent check of the reference and the backends:

- :func:`draft_outcomes` enumerates every draft tree a toy drafter can propose for one topology (each
  node's token), with its probability: i.i.d. siblings, siblings without replacement, or the
  deterministic top-w tree.
- :func:`emission_law` gives, for every outcome, the probability that a method accepts the path to node
  n and then emits token y: ``"token"`` (Leviathan / Chen on chains, SpecInfer multi-step or recursive
  rejection sampling on trees, target-only on deterministic trees), ``"block"`` (Sun et al.'s block
  verification, chains only, from its own formula) and ``"traversal"`` (Weng et al.'s traversal
  verification). Given an outcome every method is a finite sequence of independent coin flips, so the
  law is exact.
- :func:`extended_law` appends autoregressive target sampling to the emitted tokens; a method is
  lossless iff this equals :func:`target_law` (:func:`lossless_gap` is the largest difference).
- :func:`expected_accepted_length` and the two bounds: :func:`hu_optimal_acceptance` (Hu et al., ICLR
  2025: the optimal acceptance rate of n drafts in one step, by the min-cut of the coupling) and
  :func:`coupling_bound` (the same optimal-transport problem over whole draft trees and target sequences,
  solved as a linear program: no lossless verifier accepts more in expectation; at depth 1 it is Hu et
  al.'s bound).

A case is a :class:`ToyStep`: target and draft transition matrices over V tokens (the law of the next
token given the last one, after temperature / top-k / top-p), a topology (local parents, siblings ordered
by index, parents before children) and the root token.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

__all__ = [
    "SIBLING_MODES",
    "ToyStep",
    "chain_parents",
    "parents_from_paths",
    "draft_outcomes",
    "emission_law",
    "extended_law",
    "target_law",
    "lossless_gap",
    "expected_accepted_length",
    "accepted_length_law",
    "hu_optimal_acceptance",
    "coupling_bound",
    "gain_condition",
    "chain_conditional_accepted",
]

SIBLING_MODES = ("iid", "without_replacement", "deterministic")
METHODS = ("token", "block", "traversal")


def chain_parents(length: int) -> tuple[int, ...]:
    """Local parents of a chain of ``length`` drafts as a tree (root first)."""
    return tuple(range(-1, length))


def parents_from_paths(paths) -> tuple[int, ...]:
    """Local parents of an EAGLE-style path list (as ``TreeTopology.from_paths``: shortest paths first)."""
    ordered = sorted((tuple(p) for p in paths), key=lambda p: (len(p), p))
    index = {(): 0}
    parent = [-1]
    for i, path in enumerate(ordered, start=1):
        index[path] = i
        parent.append(index[path[:-1]])
    return tuple(parent)


@dataclass(frozen=True)
class ToyStep:
    """One verification step: ``target[t]`` / ``draft[t]`` are the laws of the token after token t."""

    target: torch.Tensor  # [V, V] float64 rows summing to 1
    draft: torch.Tensor  # [V, V] float64 rows summing to 1
    parents: tuple[int, ...]  # local parent of each node, -1 at the root (node 0)
    siblings: str  # one of SIBLING_MODES
    root_token: int = 0

    def __post_init__(self) -> None:
        if self.siblings not in SIBLING_MODES:
            raise ValueError(f"siblings must be one of {SIBLING_MODES}, got {self.siblings!r}")
        if self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError("parents must start with -1 and point backwards")

    @property
    def vocab_size(self) -> int:
        return self.target.shape[0]

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, p in enumerate(self.parents[1:], start=1):
            kids[p].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        depth = [0] * self.num_nodes
        for i in range(1, self.num_nodes):
            depth[i] = depth[self.parents[i]] + 1
        return tuple(depth)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @property
    def is_chain(self) -> bool:
        return all(len(k) <= 1 for k in self.children)


# ----------------------------------------------------------------------------------------------------
# Draft outcomes
# ----------------------------------------------------------------------------------------------------

def _sibling_draws(q: np.ndarray, width: int, mode: str) -> list[tuple[tuple[int, ...], float]]:
    """Every ordered tuple of ``width`` sibling tokens drawn from q, with its probability."""
    vocab = q.shape[0]
    if mode == "deterministic":
        order = np.argsort(-q, kind="stable")  # top-w by q, ties to the lower index (as torch.topk here)
        return [(tuple(int(t) for t in order[:width]), 1.0)]
    draws = []
    for combo in itertools.product(range(vocab), repeat=width):
        if mode == "iid":
            prob = float(np.prod([q[t] for t in combo]))
        else:
            if len(set(combo)) < width:
                continue
            prob, left = 1.0, 1.0
            for t in combo:
                prob *= q[t] / left if left > 0 else 0.0
                left -= q[t]
        if prob > 0:
            draws.append((combo, prob))
    return draws


def draft_outcomes(step: ToyStep) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [O, N] int64, probabilities [O] float64) of every draft tree of positive probability.

    Column 0 holds the root token. Siblings are drawn level by level from the draft law of their
    parent's token: i.i.d., without replacement (in draw order) or the top-w tokens (deterministic).
    """
    q = step.draft.double().numpy()
    partial = [([step.root_token] + [-1] * (step.num_nodes - 1), 1.0)]
    for node in range(step.num_nodes):
        kids = step.children[node]
        if not kids:
            continue
        grown = []
        for tokens, prob in partial:
            for combo, p in _sibling_draws(q[tokens[node]], len(kids), step.siblings):
                new = list(tokens)
                for c, t in zip(kids, combo, strict=True):
                    new[c] = t
                grown.append((new, prob * p))
        partial = grown
    if not partial:
        raise ValueError("draft_outcomes: no draft tree has positive probability (more siblings drawn without "
                         "replacement than tokens with q > 0?)")
    tokens = torch.tensor([t for t, _ in partial], dtype=torch.int64)
    probs = torch.tensor([p for _, p in partial], dtype=torch.float64)
    return tokens, probs


def _draw_laws(step: ToyStep, tokens: torch.Tensor, siblings: str | None = None) -> torch.Tensor:
    """[O, N, V] the law each non-root node was drawn from, given its earlier siblings (row 0 unused).

    i.i.d.: the parent's q; without replacement: q with the earlier siblings removed, renormalised;
    deterministic: a point mass on the node's own token. ``siblings`` overrides the step's mode (the
    laws a verifier assumes).
    """
    siblings = siblings or step.siblings
    num_out, n = tokens.shape
    vocab = step.vocab_size
    laws = torch.zeros(num_out, n, vocab, dtype=torch.float64)
    rows = torch.arange(num_out)
    for node in range(n):
        q = step.draft.double()[tokens[:, node]]
        for c in step.children[node]:
            if siblings == "deterministic":
                laws[rows, c, tokens[:, c]] = 1.0
                continue
            laws[:, c] = q
            if siblings == "without_replacement":
                q = q.clone()
                q[rows, tokens[:, c]] = 0.0
                total = q.sum(-1, keepdim=True)
                q = torch.where(total > 0, q / torch.where(total > 0, total, 1.0), q)
    return laws


# ----------------------------------------------------------------------------------------------------
# Emission laws of the methods
# ----------------------------------------------------------------------------------------------------

def _ratio_weight(num: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, num / q_x), with 1 when q_x = 0 < num and 0 when both are 0."""
    return torch.where(num >= q_x, (num > 0).double(), num / torch.where(q_x > 0, q_x, 1.0))


def _normalised(w: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), fallback)


def _token_level(step, target, laws, tokens, law) -> None:
    """Token-level verification from the root: at each node, the children in sibling order; child s is
    accepted w.p. min(1, p(x_s) / q_s(x_s)), else p <- norm(max(0, p - q_s)); all rejected: emit y ~ p."""
    rows = torch.arange(tokens.shape[0])

    def visit(node: int, reach: torch.Tensor) -> None:
        p = target[:, node]
        for c in step.children[node]:
            x = tokens[:, c]
            q = laws[:, c]
            a = _ratio_weight(p[rows, x], q[rows, x])
            visit(c, reach * a)
            reach = reach * (1 - a)
            p = _normalised(torch.clamp(p - q, min=0.0), p)
        law[:, node] += reach[:, None] * p

    visit(0, torch.ones(tokens.shape[0], dtype=torch.float64))


def _traversal(step, target, laws, tokens, law) -> None:
    """Traversal verification (leaf to root, post-order): node alpha carries a mass m_alpha (a
    sub-probability over the next token, total M_alpha); entering child c of beta gives it the weight
    a = min(1, m_beta(x_c) / q_c(x_c)) and the mass a * p_c; testing a node accepts it w.p. M; deleting
    child c updates m_beta <- max(0, m_beta - q_c) / (Z + 1 - M_beta), Z = sum max(0, m_beta - q_c)."""
    rows = torch.arange(tokens.shape[0])

    def visit(node: int, weight: torch.Tensor, reach: torch.Tensor) -> torch.Tensor:
        m = weight[:, None] * target[:, node]
        mass = weight
        for c in step.children[node]:
            x = tokens[:, c]
            q = laws[:, c]
            reach = visit(c, _ratio_weight(m[rows, x], q[rows, x]), reach)
            r = torch.clamp(m - q, min=0.0)
            z = r.sum(-1)
            denom = z + (1 - mass)
            mass = torch.where(denom > 0, z / torch.where(denom > 0, denom, 1.0), 0.0)
            m = torch.where(denom[:, None] > 0, r / torch.where(denom > 0, denom, 1.0)[:, None], r)
        accept = reach * mass
        law[:, node] += accept[:, None] * _normalised(m, target[:, node])
        return reach - accept

    visit(0, torch.ones(tokens.shape[0], dtype=torch.float64), torch.ones(tokens.shape[0], dtype=torch.float64))


def _block(step, target, laws, tokens, law) -> None:
    """Block verification of a chain (Sun et al.): w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i));
    Z_i = sum max(0, w_i p_{i+1} - q_{i+1}), h_i = Z_i / (Z_i + 1 - w_i) (h_K = w_K); tau = the largest i
    with eta_i < h_i (0 if none); emit x_1..x_tau and then y ~ norm(max(0, w_tau p - q)) (p at tau = K)."""
    rows = torch.arange(tokens.shape[0])
    k = step.num_nodes - 1
    w = [torch.ones(tokens.shape[0], dtype=torch.float64)]
    for i in range(1, k + 1):
        x = tokens[:, i]
        w.append(_ratio_weight(w[-1] * target[rows, i - 1, x], laws[rows, i, x]))
    h = [torch.ones_like(w[0])]
    for i in range(1, k + 1):
        if i == k:
            h.append(w[k])
            continue
        z = torch.clamp(w[i][:, None] * target[:, i] - laws[:, i + 1], min=0.0).sum(-1)
        denom = z + (1 - w[i])
        h.append(torch.where(denom > 0, z / torch.where(denom > 0, denom, 1.0), 0.0))
    later_rejected = torch.ones_like(w[0])
    for i in range(k, -1, -1):
        prob = later_rejected * h[i]
        later_rejected = later_rejected * (1 - h[i])
        if i == k:
            emit = target[:, k]
        else:
            emit = _normalised(torch.clamp(w[i][:, None] * target[:, i] - laws[:, i + 1], min=0.0), target[:, i])
        law[:, i] += prob[:, None] * emit


_METHODS = {"token": _token_level, "traversal": _traversal, "block": _block}


def emission_law(step: ToyStep, method: str, outcomes=None, verify_siblings: str | None = None) -> torch.Tensor:
    """[O, N, V] float64: P(accept the path to node n, then emit token y | draft outcome o).

    ``outcomes`` defaults to :func:`draft_outcomes`; ``method`` is "token", "block" (chains only) or
    "traversal"; ``verify_siblings`` is the sibling mode the verifier assumes (default: the step's).
    Each row sums to 1 over (n, y).
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "block" and not step.is_chain:
        raise ValueError("block verification is defined on chains")
    tokens, _ = outcomes if outcomes is not None else draft_outcomes(step)
    target = step.target.double()[tokens]  # [O, N, V]: the target law after each node
    law = torch.zeros(tokens.shape[0], step.num_nodes, step.vocab_size, dtype=torch.float64)
    _METHODS[method](step, target, _draw_laws(step, tokens, verify_siblings), tokens, law)
    return law


# ----------------------------------------------------------------------------------------------------
# Losslessness and acceptance
# ----------------------------------------------------------------------------------------------------

def target_law(step: ToyStep) -> torch.Tensor:
    """[V ** (D + 1)] the target law of the next D + 1 tokens after the root (first token most significant)."""
    vocab = step.vocab_size
    law = step.target.double()[step.root_token]
    for _ in range(step.max_depth):
        last = torch.arange(law.numel()) % vocab
        law = (law[:, None] * step.target.double()[last]).flatten()
    return law


def extended_law(step: ToyStep, method: str, verify_siblings: str | None = None) -> torch.Tensor:
    """[V ** (D + 1)] law of the emitted tokens followed by autoregressive target sampling up to D + 1."""
    tokens, probs = outcomes = draft_outcomes(step)
    law = emission_law(step, method, outcomes, verify_siblings) * probs[:, None, None]
    vocab = step.vocab_size
    ext = torch.zeros(1, dtype=torch.float64)  # mass of emitted prefixes shorter than the current length
    for length in range(1, step.max_depth + 2):
        last = torch.arange(ext.numel()) % vocab if length > 1 else torch.full((1,), step.root_token)
        ext = (ext[:, None] * step.target.double()[last]).flatten()
        for node in range(step.num_nodes):
            if step.depth[node] != length - 1:
                continue
            path = _path_tokens(step, tokens, node)  # [O, depth]
            index = torch.zeros(tokens.shape[0], dtype=torch.int64)
            for col in range(path.shape[1]):
                index = index * vocab + path[:, col]
            index = index[:, None] * vocab + torch.arange(vocab)[None, :]
            ext.index_add_(0, index.flatten(), law[:, node].flatten())
    return ext


def _path_tokens(step: ToyStep, tokens: torch.Tensor, node: int) -> torch.Tensor:
    path = []
    while node != 0:
        path.append(node)
        node = step.parents[node]
    return tokens[:, path[::-1]] if path else tokens[:, :0]


def lossless_gap(step: ToyStep, method: str, verify_siblings: str | None = None) -> float:
    """Largest |extended law - target law| over sequences: 0 (to rounding) iff the method is lossless."""
    return float((extended_law(step, method, verify_siblings) - target_law(step)).abs().max())


def accepted_length_law(step: ToyStep, method: str) -> torch.Tensor:
    """[D + 1] float64 law of the number of accepted drafts."""
    tokens, probs = outcomes = draft_outcomes(step)
    per_node = (emission_law(step, method, outcomes).sum(-1) * probs[:, None]).sum(0)
    out = torch.zeros(step.max_depth + 1, dtype=torch.float64)
    out.index_add_(0, torch.tensor(step.depth), per_node)
    return out


def expected_accepted_length(step: ToyStep, method: str) -> float:
    """Exact mean number of accepted drafts of one verification step."""
    law = accepted_length_law(step, method)
    return float((law * torch.arange(law.numel(), dtype=torch.float64)).sum())


def gain_condition(step: ToyStep) -> bool:
    """True when sequence-level verification can accept strictly more than token level on this step.

    The block-verification inequality w_i >= prod_{j <= i} min(1, p_j / q_j) (``reference/block.py``) is
    strict exactly when, on a draft of positive probability, a node whose path weight
    ``min(1, p(x) / q(x))`` is in (0, 1) (drafted more often than the target takes it) has a child with
    p(x_c) > q_c(x_c) (the surplus a sequence-level test can spend). Here it is evaluated for every
    parent-child pair below the root's children, with the laws the nodes were drawn from.
    """
    tokens, probs = draft_outcomes(step)
    laws = _draw_laws(step, tokens)
    target = step.target.double()[tokens]
    rows = torch.arange(tokens.shape[0])
    for c in range(1, step.num_nodes):
        b = step.parents[c]
        if b == 0:
            continue
        a = step.parents[b]
        weight = _ratio_weight(target[rows, a, tokens[:, b]], laws[rows, b, tokens[:, b]])
        surplus = target[rows, b, tokens[:, c]] > laws[rows, c, tokens[:, c]] * (1 + 1e-12)
        if bool(((weight > 0) & (weight < 1 - 1e-12) & surplus & (probs > 0)).any()):
            return True
    return False


# ----------------------------------------------------------------------------------------------------
# Optimal acceptance bounds
# ----------------------------------------------------------------------------------------------------

def hu_optimal_acceptance(step: ToyStep) -> float:
    """Hu et al.'s optimal acceptance rate of the root's drafts: the largest P(emitted token is a draft)
    over all couplings of the target token Y ~ p with the drafted tuple X ~ Q, for a depth-1 tree.

    Max-flow / min-cut of the bipartite coupling: ``1 - max_H [Q(every draft in H) - p(H)]`` over token
    sets H (enumerated: V <= 12). With one draft this is 1 - TV(p, q).
    """
    if step.max_depth != 1:
        raise ValueError("hu_optimal_acceptance is the one-step bound: use a depth-1 tree (coupling_bound otherwise)")
    tokens, probs = draft_outcomes(step)
    drafts = tokens[:, 1:]
    p = step.target.double()[step.root_token]
    vocab = step.vocab_size
    if vocab > 12:
        raise ValueError("hu_optimal_acceptance enumerates token sets: V <= 12")
    best = 0.0
    for mask in range(1 << vocab):
        inside = torch.tensor([(mask >> t) & 1 for t in range(vocab)], dtype=torch.bool)
        all_in = inside[drafts].all(dim=1)
        best = max(best, float(probs[all_in].sum()) - float(p[inside].sum()))
    return 1.0 - best


def coupling_bound(step: ToyStep) -> float:
    """Largest expected accepted length of any lossless verifier of this step: the optimal transport
    between draft trees (law of :func:`draft_outcomes`) and target sequences of length D (law of
    :func:`target_law` marginalised), maximising the length of the longest tree path that prefixes the
    sequence. A linear program (scipy HiGHS); its size is O x V^D variables.

    Any lossless verifier, followed by autoregressive sampling, is such a coupling whose accepted path is
    a prefix of the sequence, so it accepts at most this much. At depth 1 it equals
    :func:`hu_optimal_acceptance`.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    tokens, probs = draft_outcomes(step)
    vocab, depth = step.vocab_size, step.max_depth
    seq_law = target_law(step).view(-1, vocab).sum(-1) if depth >= 1 else torch.ones(1)
    num_out, num_seq = tokens.shape[0], seq_law.numel()
    if num_out * num_seq > 3_000_000:
        raise ValueError(f"coupling_bound: {num_out} x {num_seq} variables is too large")
    # gain[o, s]: longest prefix of s (length D) that is a path of outcome o's tree.
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=depth)), dtype=torch.int64).view(-1, depth)
    gain = torch.zeros(num_out, num_seq, dtype=torch.float64)
    frontier = {0: torch.ones(num_out, num_seq, dtype=torch.bool)}  # node -> (o, s) whose prefix reaches it
    for node in range(1, step.num_nodes):
        d = step.depth[node]
        reach = frontier[step.parents[node]] & (tokens[:, node][:, None] == seqs[:, d - 1][None, :])
        frontier[node] = reach
        gain = torch.where(reach, torch.maximum(gain, torch.tensor(float(d), dtype=torch.float64)), gain)
    # Marginal constraints; the last sequence's row is implied by the others (both laws sum to 1) and is
    # dropped, so that rounding in the two sums cannot make the program infeasible.
    o_idx = torch.arange(num_out).repeat_interleave(num_seq)
    s_idx = torch.arange(num_seq).repeat(num_out)
    cols = torch.arange(num_out * num_seq)
    keep = s_idx < num_seq - 1
    rows = torch.cat([o_idx, num_out + s_idx[keep]])
    a_eq = coo_matrix((np.ones(rows.numel()), (rows.numpy(), torch.cat([cols, cols[keep]]).numpy())),
                      shape=(num_out + num_seq - 1, num_out * num_seq))
    # Scaled by 1e6: HiGHS works to absolute tolerances (1e-7), far above the smallest outcome probabilities.
    scale = 1e6
    b_eq = (scale * torch.cat([probs / probs.sum(), seq_law[:-1] / seq_law.sum()])).numpy()
    res = linprog(-gain.flatten().numpy(), A_eq=a_eq.tocsr(), b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"coupling_bound: the linear program failed: {res.message}")
    return float(-res.fun) / scale


def chain_conditional_accepted(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Expected number of accepted drafts of each chain given its drafts, exactly (the coins integrated out).

    ``p`` [B, k + 1, V]: the target distribution of each row (after temperature / truncation; row k is the
    bonus row), ``q`` [B, k, V] the draft distributions and ``drafts`` [B, k] the drafted ids (a negative id
    is a placeholder, never accepted). Token level: sum_i prod_{j <= i} min(1, p_j(x_j) / q_j(x_j)). Block
    (Sun et al.): with weights w_0 = 1, w_{j+1} = min(1, w_j p_j(x_j) / q_j(x_j)) and stop probabilities
    h_j = m_j / (m_j + 1 - w_j), m_j = sum_v max(0, w_j p_j - q_j) (h_k = w_k), block accepts i drafts with
    probability h_i prod_{j > i} (1 - h_j). Both in float64, [B] each: the same draft-conditional estimate of
    the accepted length that a run's measured mean estimates with the coins' noise on top.
    """
    p, q = p.double(), q.double()
    b, k = drafts.shape
    x = drafts.clamp(min=0)[..., None]
    p_x = p[:, :k].gather(2, x).squeeze(2)
    q_x = q.gather(2, x).squeeze(2)
    ratio = torch.where((drafts >= 0) & (q_x > 0), p_x / torch.where(q_x > 0, q_x, 1.0), 0.0)
    token = torch.cumprod(ratio.clamp(max=1.0), dim=1).sum(1)
    w = torch.ones(b, k + 1, dtype=torch.float64, device=p.device)
    for j in range(k):
        w[:, j + 1] = torch.clamp(w[:, j] * ratio[:, j], max=1.0)
    h = torch.zeros(b, k + 1, dtype=torch.float64, device=p.device)
    for j in range(1, k):
        mass = torch.clamp(w[:, j, None] * p[:, j] - q[:, j], min=0.0).sum(-1)
        denom = mass + 1 - w[:, j]
        h[:, j] = torch.where(denom > 0, mass / torch.where(denom > 0, denom, 1.0), 0.0)
    h[:, k] = w[:, k]
    block = torch.zeros(b, dtype=torch.float64, device=p.device)
    later = torch.ones(b, dtype=torch.float64, device=p.device)
    for j in range(k, 0, -1):
        block = block + j * h[:, j] * later
        later = later * (1 - h[:, j])
    return {"token": token, "block": block}
