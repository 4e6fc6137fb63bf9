"""The end-to-end law test (``tests.harness.vllm_e2e.law_test``) keeps its level and has power.

It is what decides the end-to-end exactness claims, so it is checked here on synthetic completions whose
laws are known: equal laws pass, a law at total variation 0.15 in one position is rejected.
"""

from __future__ import annotations

import numpy as np

from tests.harness.vllm_e2e import law_test


def _completions(rng: np.random.Generator, num: int, length: int, probs: np.ndarray, skewed_position: int = -1,
                 skewed: np.ndarray | None = None) -> list[list[int]]:
    out = rng.choice(len(probs), size=(num, length), p=probs)
    if skewed is not None:
        out[:, skewed_position] = rng.choice(len(skewed), size=num, p=skewed)
    return out.tolist()


def test_equal_laws_pass_and_a_shifted_position_is_rejected():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(30) * 0.5)
    base = _completions(rng, 2000, 10, probs)
    same = _completions(rng, 2000, 10, probs)
    assert law_test(base, same)["passed"]

    # Move 0.15 of mass from the likely half of the tokens to the unlikely half, at position 4 only.
    order = np.argsort(-probs)
    top = order[: len(order) // 2]
    skewed = probs.copy()
    skewed[top] *= 1 - 0.15 / probs[top].sum()
    rest = order[len(order) // 2:]
    skewed[rest] += 0.15 * probs[rest] / probs[rest].sum()
    shifted = _completions(rng, 2000, 10, probs, skewed_position=4, skewed=skewed)
    result = law_test(base, shifted)
    assert not result["passed"]
    assert result["tests"]["pos4"]["pvalue"] < result["alpha_per_test"]
    assert result["num_tokens"] == (20000, 20000)
