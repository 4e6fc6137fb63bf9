"""The audit's law cases: the suite's own (``chain_law.FIRST_TOKEN_CASES`` / ``SEQUENCE_CASES``) plus a grid
that the peers' samplers are usually run at (temperature 0.7, min-p).

Together they cover temperature {0, 0.3, 0.7, 1, 2}, top-k, top-p and min-p, deterministic drafts
(ngram-style, with placeholders) and stochastic drafts (draft-model q, with zeros), first tokens and whole
sequences. Cases that set min-p run only on verifiers that take ``min_p`` (vLLM's samplers); the others
report them as not applicable.
"""

from __future__ import annotations

from ..exactness.chain_law import FIRST_TOKEN_CASES, SEQUENCE_CASES, FirstTokenCase, SequenceCase
from ..exactness.markov_models import SamplingConfig

__all__ = ["GRID_FIRST_TOKEN_CASES", "GRID_SEQUENCE_CASES", "LAW_CASES", "uses_min_p"]

MIN_P = 0.2


def _grid_first_token_cases() -> tuple[FirstTokenCase, ...]:
    cases = []
    seed = 101  # disjoint from the suite's case seeds
    grid = [
        ("T0.7", SamplingConfig(0.7)),
        ("T0.7-topk3", SamplingConfig(0.7, top_k=3)),
        ("T0.7-topp0.8", SamplingConfig(0.7, top_p=0.8)),
        (f"T0.7-minp{MIN_P:g}", SamplingConfig(0.7, min_p=MIN_P)),
        (f"T1-minp{MIN_P:g}", SamplingConfig(1.0, min_p=MIN_P)),
    ]
    for drafts in ("deterministic", "stochastic"):
        for label, cfg in grid:
            cases.append(FirstTokenCase(f"first-{drafts[:5]}-{label}", 6 + seed % 2, cfg, drafts, seed,
                                        q_zero=seed % 2 == 0))
            seed += 1
    return tuple(cases)


def _grid_sequence_cases() -> tuple[SequenceCase, ...]:
    cfgs = [SamplingConfig(0.7), SamplingConfig(1.0, min_p=0.3)]
    cases = []
    seed = 101
    for drafter in ("ngram", "close"):
        for cfg in cfgs:
            cases.append(SequenceCase(f"seq-{drafter}-k3-{cfg.label()}-o1", drafter, 3, cfg, seed))
            seed += 1
    return tuple(cases)


GRID_FIRST_TOKEN_CASES: tuple[FirstTokenCase, ...] = _grid_first_token_cases()
GRID_SEQUENCE_CASES: tuple[SequenceCase, ...] = _grid_sequence_cases()
LAW_CASES: tuple[FirstTokenCase | SequenceCase, ...] = (
    FIRST_TOKEN_CASES + GRID_FIRST_TOKEN_CASES + SEQUENCE_CASES + GRID_SEQUENCE_CASES
)
"""Every law case the audit runs, first tokens then sequences (names are unique)."""


def uses_min_p(case: FirstTokenCase | SequenceCase) -> bool:
    """True when the case's sampling configuration sets min-p."""
    return case.cfg.min_p > 0
