"""Exactness checks for block and traversal verification: one verification step against its enumerated law.

A :class:`StepCase` is a toy Markov target (a [V, V] logits table under a :class:`SamplingConfig`), a
Markov drafter (its own table, sampled at temperature 1), a tree topology and a sibling mode. Its exact
one-step behaviour under every method comes from :mod:`exact_verify`. The checks here run a real verifier
(any backend, or a planted-bug sampler) on draft trees sampled from the drafter:

- :func:`check_step_law`: the emitted token sequences (accepted path, then one token) must follow the
  method's exact emission law (goodness of fit at the suite's alpha; sample size from the power rule).
  This pins the method, not only losslessness: a verifier that accepts less (or more) than the method
  prescribes fails too.
- :func:`check_step_acceptance`: the mean accepted length must match the exact expectation (z test).

Whole-sequence laws (generation with repeated verification until L tokens) are checked with the chain and
tree harnesses (:func:`chain_law.check_sequence_law`, :func:`toy_trees.generate_with_trees`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from scipy import stats as scipy_stats

from . import exact_verify as ev
from . import stats
from .toy_models import SamplingConfig
from .toy_trees import transition_matrix

__all__ = ["StepCase", "StepVerifier", "step_verifier", "sample_step", "step_emission_law", "check_step_law",
           "check_step_acceptance", "StepCheck"]

TV = 0.02
POWER = 0.999

StepVerifier = Callable[..., object]
"""(case, tokens [n, N], seed [n], position [n]) -> (num_accepted [n], emitted [n, D + 1] padded with -1)."""


@dataclass(frozen=True)
class StepCase:
    """One verification step of a toy: tables from ``seed``, topology ``parents``, sibling mode."""

    name: str
    parents: tuple[int, ...]
    siblings: str  # exact_verify.SIBLING_MODES
    cfg: SamplingConfig
    seed: int
    vocab_size: int = 4
    root_token: int = 1
    scale: float = 1.5
    draft_noise: float = 1.0

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(target logits table, draft logits table) [V, V] float32."""
        g = torch.Generator().manual_seed(30_000 + self.seed)
        target = torch.randn(self.vocab_size, self.vocab_size, generator=g) * self.scale
        draft = target + torch.randn(self.vocab_size, self.vocab_size, generator=g) * self.draft_noise
        return target, draft

    def draft_law(self) -> torch.Tensor:
        """[V, V] float32 draft law of the token after each token (the drafter samples at temperature 1)."""
        return torch.softmax(self.tables()[1], dim=-1)

    def step(self) -> ev.ToyStep:
        target, _ = self.tables()
        cfg = self.cfg
        transition = transition_matrix(target, cfg.temperature, cfg.top_k, cfg.top_p)
        return ev.ToyStep(transition, self.draft_law().double(), self.parents, self.siblings, self.root_token)


def _sampling(case: StepCase, n: int) -> dict:
    cfg = case.cfg
    return dict(
        temperature=torch.full((n,), float(cfg.temperature)),
        top_k=torch.full((n,), cfg.top_k, dtype=torch.int32) if cfg.top_k else None,
        top_p=torch.full((n,), float(cfg.top_p)) if cfg.top_p < 1 else None,
    )


def step_verifier(method: str, backend: str = "reference", api: str = "tree",
                  device: torch.device | str = "cpu") -> StepVerifier:
    """Run ``verify_tree(method=...)`` (``api="tree"``) or, for chains, ``verify_chain(method=...)``."""
    from .. import verify_chain, verify_tree

    def verify(case: StepCase, tokens: torch.Tensor, seed: torch.Tensor, position: torch.Tensor):
        n, num_nodes = tokens.shape
        table, _ = case.tables()
        q_rows = case.draft_law()[tokens]  # [n, N, V]: the law of each node's children
        sampling = {k: (v.to(device) if v is not None else None) for k, v in _sampling(case, n).items()}
        kw = dict(seed=seed.to(device), position=position.to(device), backend=backend, method=method, **sampling)
        stochastic = case.siblings != "deterministic"
        if api == "chain":
            k = num_nodes - 1
            res = verify_chain(
                table[tokens].reshape(-1, case.vocab_size).to(device), tokens[:, 1:].reshape(-1).to(device),
                (torch.arange(n + 1) * k).to(device),
                q_rows[:, :k].reshape(-1, case.vocab_size).to(device) if stochastic else None, **kw,
            )
        else:
            res = verify_tree(
                table[tokens].reshape(-1, case.vocab_size).to(device), tokens.reshape(-1).to(device),
                torch.tensor(case.parents).repeat(n).to(device), (torch.arange(n + 1) * num_nodes).to(device),
                q_rows.reshape(-1, case.vocab_size).to(device) if stochastic else None,
                sibling_sampling="without_replacement" if case.siblings != "iid" else "iid", **kw,
            )
        return res.num_accepted.cpu().to(torch.int64), res.output_token_ids.cpu().to(torch.int64)

    verify.__name__ = f"verify_{api}_{method}_{backend}"
    return verify


def sample_step(case: StepCase, verify: StepVerifier, num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``num`` draft trees from the drafter (by their enumerated law) and verify them."""
    tokens, probs = ev.draft_outcomes(case.step())
    g = torch.Generator().manual_seed(seed)
    pick = torch.multinomial(probs, num, replacement=True, generator=g)
    keys = seed * (1 << 32) + torch.arange(num, dtype=torch.int64)
    position = torch.randint(0, 1 << 20, (num,), generator=g)
    return verify(case, tokens[pick], keys, position)


def _sequence_cells(emitted: torch.Tensor, accepted: torch.Tensor, vocab: int, depth: int) -> torch.Tensor:
    """Cell of each emitted sequence (length accepted + 1, tokens in [0, V)); invalid ones get the last cell.

    Sequences of length l occupy cells [off_l, off_l + V^l) with off_1 = 0, off_{l+1} = off_l + V^l.
    """
    n = emitted.shape[0]
    length = accepted + 1
    offsets = [0]
    for ell in range(1, depth + 2):
        offsets.append(offsets[-1] + vocab ** ell)
    col = torch.arange(emitted.shape[1])
    inside = col[None, :] < length[:, None]
    valid = ((emitted >= 0) & (emitted < vocab) | ~inside).all(1) & (length <= depth + 1)
    code = torch.zeros(n, dtype=torch.int64)
    for c in range(emitted.shape[1]):
        code = torch.where(col[c] < length, code * vocab + emitted[:, c].clamp(0, vocab - 1), code)
    base = torch.tensor(offsets)[(length - 1).clamp(0, depth)]
    return torch.where(valid, base + code, offsets[-1])


def step_emission_law(case: StepCase, method: str) -> torch.Tensor:
    """[cells + 1] float64 exact law of the emitted sequence (cells as :func:`_sequence_cells`; last = invalid)."""
    step = case.step()
    tokens, probs = outcomes = ev.draft_outcomes(step)
    law = ev.emission_law(step, method, outcomes) * probs[:, None, None]  # [O, N, V]
    vocab, depth = step.vocab_size, step.max_depth
    total = sum(vocab ** ell for ell in range(1, depth + 2))
    out = torch.zeros(total + 1, dtype=torch.float64)
    for node in range(step.num_nodes):
        d = step.depth[node]
        path = [node]
        while path[-1] != 0:
            path.append(step.parents[path[-1]])
        path = path[::-1][1:]  # non-root nodes root -> node
        emitted = torch.cat([tokens[:, path], torch.zeros(tokens.shape[0], 1, dtype=torch.int64)], 1)
        for y in range(vocab):
            emitted[:, -1] = y
            cells = _sequence_cells(emitted, torch.full((tokens.shape[0],), d), vocab, depth)
            out.index_add_(0, cells, law[:, node, y])
    return out


@dataclass(frozen=True)
class StepCheck:
    result: stats.TestResult
    num_samples: int
    mean_accepted: float
    exact_accepted: float


def check_step_law(case: StepCase, method: str, verify: StepVerifier, alpha: float, seed: int = 0) -> StepCheck:
    """Goodness of fit of the emitted sequences to the method's exact emission law."""
    law = step_emission_law(case, method)
    n = stats.sample_size(law, alpha, TV, POWER)
    accepted, emitted = sample_step(case, verify, n, seed)
    depth = case.step().max_depth
    cells = _sequence_cells(emitted, accepted, case.vocab_size, depth)
    observed = torch.bincount(cells, minlength=law.numel())
    exact = ev.expected_accepted_length(case.step(), method)
    return StepCheck(stats.gof_test(observed, law / law.sum()), n, float(accepted.double().mean()), exact)


def check_step_acceptance(case: StepCase, method: str, verify: StepVerifier, alpha: float, num: int,
                          seed: int = 0) -> tuple[float, float, float]:
    """(z score, measured mean, exact mean) of the accepted length over ``num`` sampled draft trees; a
    correct verifier has |z| < ``acceptance_z_critical(alpha)`` with probability 1 - alpha."""
    step = case.step()
    law = ev.accepted_length_law(step, method)
    mean = float((law * torch.arange(law.numel(), dtype=torch.float64)).sum())
    var = float((law * (torch.arange(law.numel(), dtype=torch.float64) - mean) ** 2).sum())
    accepted, _ = sample_step(case, verify, num, seed)
    measured = float(accepted.double().mean())
    z = (measured - mean) / math.sqrt(max(var, 1e-300) / num) if var > 0 else (0.0 if measured == mean else math.inf)
    return z, measured, mean


def acceptance_z_critical(alpha: float) -> float:
    """Two-sided normal critical value at ``alpha``."""
    return float(scipy_stats.norm.isf(alpha / 2))
