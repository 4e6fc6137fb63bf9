"""Exactness checks for block and traversal verification: one verification step against its enumerated law.

A :class:`StepCase` is a toy Markov target (a [V, V] logits table under a :class:`SamplingConfig`), a
Markov drafter (its own table, sampled at temperature 1), a tree topology and a sibling mode. Its exact
one-step behaviour under every method comes from :mod:`exact_verify`. The checks here run a real verifier
(any backend, or a planted-bug sampler) on draft trees sampled from the drafter:

- :func:`check_step_law`: the emitted token sequences (accepted path, then one token) must follow the
  method's exact emission law (goodness of fit at the suite's alpha; sample size from the power rule).
  This pins the method, not only losslessness: a verifier that accepts less (or more) than the method
  prescribes fails too.
  The same samples give the mean accepted length, which must match the exact expectation (z test).

Whole-sequence laws (generation with repeated verification until L tokens) are checked with the chain and
tree harnesses (:func:`chain_law.check_sequence_law`, :func:`markov_trees.generate_with_trees`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from scipy import stats as scipy_stats

from . import exact_verify as ev
from . import goodness_of_fit as gof
from . import sequential
from .chain_law import SequenceCase, law_plan
from .markov_models import SamplingConfig
from .markov_trees import transition_matrix

__all__ = ["SHAPES", "SETTINGS", "STEP_CASES", "StepCase", "StepVerifier", "step_verifier", "sample_step",
           "step_emission_law", "check_step_law",
           "acceptance_z_critical", "StepCheck", "BLOCK_SEQUENCE_CASES", "TRAVERSAL_SEQUENCE_CASES",
           "STEP_LAW_CASES", "MUTANT_CASES"]

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
        """The exact step: both laws renormalised in float64 (the kernels see their float32 roundings)."""
        target, draft = self.tables()
        cfg = self.cfg
        transition = transition_matrix(target, cfg.temperature, cfg.top_k, cfg.top_p)
        transition = transition / transition.sum(-1, keepdim=True)
        return ev.ToyStep(transition, torch.softmax(draft.double(), dim=-1), self.parents, self.siblings,
                          self.root_token)


SHAPES: dict[str, tuple[int, ...]] = {  # widths 1-4, depths 1-4
    "chain1": ev.chain_parents(1),
    "chain2": ev.chain_parents(2),
    "chain3": ev.chain_parents(3),
    "chain4": ev.chain_parents(4),
    "w2d1": ev.parents_from_paths([(0,), (1,)]),
    "w3d1": ev.parents_from_paths([(0,), (1,), (2,)]),
    "w4d1": ev.parents_from_paths([(0,), (1,), (2,), (3,)]),
    "w2d2": ev.parents_from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]),
    "w3d2": ev.parents_from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]),
    "w4d2": ev.parents_from_paths([(0,), (1,), (2,), (3,), (0, 0), (1, 0)]),
    "w2d3": ev.parents_from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1)]),
    "w2d4": ev.parents_from_paths([(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (1, 0)]),
}
SETTINGS: dict[str, SamplingConfig] = {
    "t1": SamplingConfig(1.0),
    "t0.7-k2": SamplingConfig(0.7, top_k=2),
    "t1.3-p0.8": SamplingConfig(1.3, top_p=0.8),
    "t0.8-k3-p0.9": SamplingConfig(0.8, top_k=3, top_p=0.9),
}


def _step_cases() -> tuple[StepCase, ...]:
    """Every (shape, sibling mode) once, settings rotating (a covering design), plus greedy chains/trees."""
    cases = []
    seed = 1
    for s_i, shape in enumerate(SHAPES):
        modes = ("iid", "deterministic") if shape.startswith("chain") else ev.SIBLING_MODES
        for m_i, mode in enumerate(modes):
            setting = list(SETTINGS)[(s_i + m_i) % len(SETTINGS)]
            vocab = 5 if shape.startswith("w4") else 4
            cases.append(StepCase(f"{shape}-{mode}-{setting}", SHAPES[shape], mode, SETTINGS[setting], seed,
                                  vocab_size=vocab))
            seed += 1
    for shape in ("chain3", "w2d2"):
        cases.append(StepCase(f"{shape}-iid-greedy", SHAPES[shape], "iid", SamplingConfig(0.0), seed))
        seed += 1
    return tuple(cases)


STEP_CASES: tuple[StepCase, ...] = _step_cases()
"""The exact-theory grid (tests/exactness/test_block_traversal_theory.py): every (shape, sibling mode), settings rotating."""


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


def sample_step(case: StepCase, verify: StepVerifier, num: int, seed: int, start: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``num`` draft trees from the drafter (by their enumerated law) and verify them: trials ``start`` on of a
    run seeded ``seed`` (:func:`sequential.chunk_seed`)."""
    tokens, probs = ev.draft_outcomes(case.step())
    g = torch.Generator().manual_seed(sequential.chunk_seed(seed, start))
    pick = torch.multinomial(probs, num, replacement=True, generator=g)
    keys = sequential.chunk_keys(seed, start, num)
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
    """A finished step check: the deciding look's law test (p-value adjusted for the looks, as
    :class:`chain_law.LawCheck`), the trials drawn until it, and their accepted-length mean against the exact one
    (``z``: standardised difference with the exact variance); ``look`` of ``looks``."""

    result: gof.TestResult
    num_samples: int
    mean_accepted: float
    exact_accepted: float
    z: float
    look: int = 1
    looks: int = 1


def check_step_law(case: StepCase, method: str, verify: StepVerifier, alpha: float, seed: int = 0,
                   looks: bool = True) -> StepCheck:
    """Goodness of fit of the emitted sequences to the method's exact emission law, in the looks of
    :func:`chain_law.law_plan`."""
    law = step_emission_law(case, method)
    depth = case.step().max_depth
    accepted_total = []

    def draw(start: int, count: int) -> torch.Tensor:
        accepted, emitted = sample_step(case, verify, count, seed, start)
        accepted_total.append(float(accepted.double().sum()))
        return torch.bincount(_sequence_cells(emitted, accepted, case.vocab_size, depth), minlength=law.numel())

    run = sequential.run_looks(draw, law / law.sum(), law_plan(law, alpha, TV, POWER, looks))
    n = run.num_samples
    length_law = ev.accepted_length_law(case.step(), method)
    lengths = torch.arange(length_law.numel(), dtype=torch.float64)
    exact = float((length_law * lengths).sum())
    sd = float((length_law * (lengths - exact) ** 2).sum()) ** 0.5
    mean = sum(accepted_total) / n
    z = (mean - exact) / (sd / math.sqrt(n)) if sd > 0 else (0.0 if abs(mean - exact) < 1e-12 else math.inf)
    return StepCheck(run.result, n, mean, exact, z, run.look, run.looks)


def acceptance_z_critical(alpha: float) -> float:
    """Two-sided normal critical value at ``alpha``."""
    return float(scipy_stats.norm.isf(alpha / 2))



def _block_sequence_cases() -> tuple[SequenceCase, ...]:
    """Whole-sequence cases for method="block": stochastic drafters, chains of k = 1-4 drafts."""
    specs = [  # drafter, k, cfg, order, cap_drafts
        ("close", 2, SamplingConfig(1.0), 1, True),
        ("far", 3, SamplingConfig(0.7, top_k=2), 2, True),
        ("zeros", 4, SamplingConfig(2.0, top_p=0.8), 1, False),
        ("self", 3, SamplingConfig(1.3), 2, True),
        ("close", 4, SamplingConfig(0.8, top_k=3, top_p=0.9), 2, False),
        ("close", 1, SamplingConfig(1.0), 1, True),
        ("close", 3, SamplingConfig(0.0), 1, True),
    ]
    cases = []
    for i, (drafter, k, cfg, order, cap) in enumerate(specs):
        cases.append(SequenceCase(f"block-{drafter}-k{k}-{cfg.label()}-o{order}", drafter, k, cfg, 100 + i,
                                  order=order, cap_drafts=cap))
    return tuple(cases)


TREE_PATHS: dict[str, list[tuple[int, ...]]] = {  # widths 1-4, depths 1-4 (drafted by markov_trees)
    "w3d2": [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)],
    "chain4": [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)],
    "w4d1": [(0,), (1,), (2,), (3,)],
    "w2d3": [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)],
    "w2d4": [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)],
}


def _traversal_sequence_cases() -> tuple[tuple[str, str, str], ...]:
    """(sibling mode, tree, setting) for whole-sequence traversal tests: every (mode, tree) once."""
    settings = list(SETTINGS)
    cases = []
    for m_i, mode in enumerate(("iid", "without_replacement", "deterministic")):
        for t_i, tree in enumerate(TREE_PATHS):
            if mode == "deterministic" and tree in ("chain4", "w2d4"):
                continue  # deterministic trees run token level: two shapes suffice
            cases.append((mode, tree, settings[(m_i + t_i) % len(settings)]))
    return tuple(cases)


BLOCK_SEQUENCE_CASES = _block_sequence_cases()
TRAVERSAL_SEQUENCE_CASES = _traversal_sequence_cases()
STEP_LAW_CASES: tuple[StepCase, ...] = tuple(
    c for c in STEP_CASES
    if c.name in ("chain2-iid-t0.7-k2", "chain3-iid-t1.3-p0.8", "chain4-iid-t0.8-k3-p0.9", "chain3-iid-greedy",
                  "chain4-deterministic-t1", "w2d2-without_replacement-t1", "w3d2-iid-t1",
                  "w4d2-without_replacement-t1.3-p0.8", "w2d3-iid-t1.3-p0.8", "w2d4-iid-t0.8-k3-p0.9",
                  "w2d3-deterministic-t1", "w2d2-iid-greedy")
)
"""The step-law cases run on every backend: chains for both methods, trees for traversal."""

MUTANT_CASES: dict[str, str] = {
    "block_weights_token_residual": "chain4-iid-t0.8-k3-p0.9",
    "block_boundary_token_residual": "chain4-iid-t0.8-k3-p0.9",
    "block_first_failure": "chain4-iid-t0.8-k3-p0.9",
    "block_coin_per_position": "block-zeros-k4-T2-p0.8-o1",
    "traversal_no_path_probability": "w3d2-iid-t1",
    "traversal_reversed_siblings": "w2d2-without_replacement-t1",
    "traversal_coin_per_depth": "w3d2-iid-t1",
}
"""For each planted bug of :mod:`block_traversal_mutants`, the step-law case (:data:`STEP_CASES`) or the
whole-sequence case (:data:`BLOCK_SEQUENCE_CASES`) whose check must reject it."""
