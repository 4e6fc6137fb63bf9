"""Hypothesis strategies for ``verify_chain`` inputs, edge cases included.

:func:`chain_inputs` draws a whole call: ragged batches (B = 0 included, k_b = 0 included), vocabularies
that are rarely powers of two, logits that are normal, one-hot, tied or sprinkled with NaN/+inf/-inf,
fp32/fp16/bf16, deterministic drafts with placeholders (-1) or stochastic drafts whose q is random, has
zeros (also at the drafted token), or equals the target law p exactly; greedy, random and mixed
requests; top-k and top-p. Hypothesis draws the structure; the bulk values come from a seeded torch
generator, so examples are cheap and shrink well. :class:`ChainInputs` records what was drawn so that
tests can state exact properties (e.g. "p = q accepts every draft").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from specdec_kernels.reference import sampling

__all__ = ["ChainInputs", "chain_inputs", "VOCAB_SIZES", "LOGIT_KINDS", "Q_KINDS"]

VOCAB_SIZES = (1, 2, 3, 5, 6, 7, 13, 31, 32, 33, 100)
LOGIT_KINDS = ("normal", "one_hot", "ties", "nonfinite")
Q_KINDS = ("random", "zeros", "equals_p")
ONE_HOT_GAP = 1.0e4  # logit gap of one-hot rows: exp(-gap / 3) is 0 in float32


@dataclass
class ChainInputs:
    """One drawn ``verify_chain`` call plus what the draw chose (for stating properties)."""

    target_logits: torch.Tensor
    draft_token_ids: torch.Tensor
    cu_num_draft_tokens: torch.Tensor
    draft_probs: torch.Tensor | None
    temperature: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    seed: torch.Tensor
    position: torch.Tensor
    logit_kind: str
    q_kind: str | None  # None for deterministic drafts
    hot: torch.Tensor | None  # [T + B] hot token of each row when logit_kind == "one_hot"

    @property
    def num_drafts(self) -> list[int]:
        cu = self.cu_num_draft_tokens
        return (cu[1:] - cu[:-1]).tolist()

    @property
    def vocab_size(self) -> int:
        return self.target_logits.shape[1]

    def args(self) -> tuple:
        """Positional arguments of ``verify_chain`` (backend excluded)."""
        return (self.target_logits, self.draft_token_ids, self.cu_num_draft_tokens, self.draft_probs,
                self.temperature, self.top_k, self.top_p, self.seed, self.position)

    def to(self, device: torch.device | str) -> ChainInputs:
        """A copy with every tensor on ``device``."""
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return ChainInputs(**moved)

    def request(self, b: int) -> ChainInputs:
        """Request ``b`` alone, as a batch of one (for batch-invariance checks)."""
        cu = self.cu_num_draft_tokens
        lo, hi = int(cu[b]), int(cu[b + 1])
        rows = slice(lo + b, hi + b + 1)

        def one(x):
            return None if x is None else x[b : b + 1]

        return ChainInputs(
            self.target_logits[rows], self.draft_token_ids[lo:hi], torch.tensor([0, hi - lo], dtype=cu.dtype),
            None if self.draft_probs is None else self.draft_probs[lo:hi],
            one(self.temperature), one(self.top_k), one(self.top_p), one(self.seed), one(self.position),
            self.logit_kind, self.q_kind, None if self.hot is None else self.hot[rows],
        )


def _logits(kind: str, rows: int, vocab: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    if kind == "one_hot":
        hot = torch.randint(0, vocab, (rows,), generator=g)
        logits = torch.full((rows, vocab), -ONE_HOT_GAP)
        logits[torch.arange(rows), hot] = 0.0
        return logits, hot
    if kind == "ties":
        return torch.randint(0, 3, (rows, vocab), generator=g).float(), None
    logits = torch.randn(rows, vocab, generator=g) * 2.0
    if kind == "nonfinite":
        u = torch.rand(rows, vocab, generator=g)
        logits = torch.where(u < 0.15, float("nan"), logits)
        logits = torch.where((u >= 0.15) & (u < 0.25), float("inf"), logits)
        logits = torch.where((u >= 0.25) & (u < 0.4), float("-inf"), logits)
        if rows:
            logits[0] = float("-inf")  # an all -inf row (samples token 0)
    return logits, None


@st.composite
def chain_inputs(
    draw,
    max_batch: int = 6,
    max_k: int = 5,
    vocab_sizes: tuple[int, ...] = VOCAB_SIZES,
    logit_kinds: tuple[str, ...] = LOGIT_KINDS,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16),
) -> ChainInputs:
    """A random valid ``verify_chain`` call (see the module docstring for what varies)."""
    vocab = draw(st.sampled_from(vocab_sizes))
    batch = draw(st.integers(0, max_batch))
    ks = draw(st.lists(st.integers(0, max_k), min_size=batch, max_size=batch))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    logit_kind = draw(st.sampled_from(logit_kinds))
    dtype = draw(st.sampled_from(dtypes))
    cu = torch.zeros(batch + 1, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    cu[1:] = torch.cumsum(torch.tensor(ks, dtype=torch.int64), 0)
    num_drafts = int(cu[-1])
    rows = num_drafts + batch
    logits, hot = _logits(logit_kind, rows, vocab, g)
    logits = logits.to(dtype)

    mode = draw(st.sampled_from(["greedy", "random", "mixed"]))
    temperature = 0.1 + 2.9 * torch.rand(batch, generator=g)
    if mode == "greedy":
        temperature = torch.zeros(batch)
    elif mode == "mixed":
        temperature = torch.where(torch.rand(batch, generator=g) < 0.5, 0.0, temperature)
    top_k = None
    if draw(st.booleans()):
        top_k = torch.randint(0, vocab + 2, (batch,), generator=g, dtype=torch.int32)
    top_p = None
    if draw(st.booleans()):
        top_p = torch.where(torch.rand(batch, generator=g) < 0.3, 1.0, 0.05 + 0.95 * torch.rand(batch, generator=g))

    # Row layout: the draft rows of request b are rows cu[b] + b ... cu[b+1] + b - 1.
    request = torch.repeat_interleave(torch.arange(batch), torch.tensor(ks, dtype=torch.int64))
    draft_rows = (torch.arange(num_drafts) + request) if num_drafts else torch.empty(0, dtype=torch.int64)
    q_kind = draw(st.sampled_from((None,) + Q_KINDS))
    draft_probs = None
    if q_kind is None:
        drafts = torch.randint(-1, vocab, (num_drafts,), generator=g)
        if hot is not None and num_drafts:  # make acceptance likely in places
            drafts = torch.where(torch.rand(num_drafts, generator=g) < 0.5, hot[draft_rows], drafts)
    else:
        if q_kind == "equals_p":
            temp = torch.where(temperature == 0, 1.0, temperature)[request]
            q = sampling.target_probs(
                logits[draft_rows], temp,
                None if top_k is None else top_k[request],
                None if top_p is None else top_p[request],
            )
        else:
            q = torch.softmax(torch.randn(num_drafts, vocab, generator=g) * 2.0, dim=-1)
            if q_kind == "zeros":
                q = torch.where(torch.rand(num_drafts, vocab, generator=g) < 0.4, 0.0, q)
                q[:, 0] = torch.where(q.sum(-1) == 0, 1.0, q[:, 0])
                q = q / q.sum(-1, keepdim=True)
        if num_drafts:
            drafts = torch.multinomial(q, 1, generator=g).squeeze(1)
            if q_kind == "zeros":  # also draft tokens the drafter gave probability 0
                drafts = torch.where(torch.rand(num_drafts, generator=g) < 0.3,
                                     torch.randint(0, vocab, (num_drafts,), generator=g), drafts)
        else:
            drafts = torch.empty(0, dtype=torch.int64)
        draft_probs = q.float()
    drafts = drafts.to(draw(st.sampled_from([torch.int32, torch.int64])))
    seed = torch.randint(-(2**62), 2**62, (batch,), generator=g)
    position = torch.randint(0, 2**31 - 1 - max_k, (batch,), generator=g)
    return ChainInputs(logits, drafts, cu, draft_probs, temperature, top_k, top_p, seed, position,
                       logit_kind, q_kind, hot)
