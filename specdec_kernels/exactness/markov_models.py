"""Tiny Markov targets and drafters whose sequence law is enumerable, and a batched speculative loop.

A :class:`MarkovModel` is a table of next-token logits indexed by the last ``order`` tokens (order 1 or
2, vocabulary V <= 8), stored as a tensor. Under a :class:`SamplingConfig` (temperature, top-k, top-p,
applied with the reference transforms of :mod:`specdec_kernels.reference.sampling`, exactly as every
verifier applies them) the law of the first ``L`` generated tokens is computable by enumerating all
``V ** L`` sequences (:func:`sequence_law`).

:func:`run_speculative` runs the full speculative loop for many independent sequences at once: a
:class:`Drafter` proposes k tokens per sequence, the target's logits rows are built from the table,
``verify_chain`` accepts a prefix and emits one more token, and each sequence continues from its new
length (``position`` advanced) until it holds ``L`` tokens. A lossless verifier makes the law of the
result equal :func:`sequence_law`, whatever the drafter.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..reference import sampling
from .sequential import chunk_keys, chunk_seed

__all__ = [
    "SamplingConfig",
    "MarkovModel",
    "Drafter",
    "random_markov",
    "step_probs",
    "sequence_law",
    "all_sequences",
    "encode_sequences",
    "sequence_histogram",
    "run_speculative",
    "SpeculativeRun",
    "Verifier",
]

Verifier = Callable[..., object]  # verify_chain's signature (positional tensors, then backend=...)


@dataclass(frozen=True)
class SamplingConfig:
    """Per-request sampling parameters: temperature (0 = greedy), top_k (0 = off), top_p (1 = off).

    ``min_p`` (0 = off) keeps the tokens whose tempered probability is at least ``min_p`` times the
    largest one, applied after temperature and before top-k / top-p (vLLM's order,
    ``reference.sampling.min_p_logits``). Verifiers are passed ``min_p`` only when it is set (our
    ``verify_chain`` / ``verify_tree`` and the audit's vLLM adapters take it).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def label(self) -> str:
        parts = [f"T{self.temperature:g}"]
        if self.top_k:
            parts.append(f"k{self.top_k}")
        if self.top_p < 1:
            parts.append(f"p{self.top_p:g}")
        if self.min_p > 0:
            parts.append(f"minp{self.min_p:g}")
        return "-".join(parts)

    def extra_kwargs(self, num_reqs: int) -> dict:
        """Keyword arguments beyond verify_chain's: ``min_p`` [B] float32 when it is set, else none."""
        return {"min_p": torch.full((num_reqs,), float(self.min_p))} if self.min_p > 0 else {}


@dataclass(frozen=True)
class MarkovModel:
    """Next-token logits ``table[c_1, ..., c_order, :]`` given the last ``order`` tokens (float32).

    ``prompt`` holds the ``order`` tokens that precede generation (the initial context).
    """

    table: torch.Tensor
    prompt: tuple[int, ...]

    def __post_init__(self) -> None:
        order = self.table.dim() - 1
        vocab = self.table.shape[-1]
        if order not in (1, 2) or any(s != vocab for s in self.table.shape):
            raise ValueError(f"table must have shape [V] * (order + 1) with order 1 or 2, got {self.table.shape}")
        if len(self.prompt) != order or not all(0 <= t < vocab for t in self.prompt):
            raise ValueError(f"prompt must hold {order} tokens in [0, {vocab})")

    @property
    def vocab_size(self) -> int:
        return self.table.shape[-1]

    @property
    def order(self) -> int:
        return self.table.dim() - 1

    def logits_at(self, tokens: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """[N, V] logits of the token after ``tokens[n, :end[n]]`` (tokens [N, S] int64, end [N] >= order).

        Negative tokens (placeholders) index as token 0; the rows they produce are never used.
        """
        ctx = [tokens.gather(1, (end - self.order + i)[:, None]).squeeze(1).clamp(min=0) for i in range(self.order)]
        flat = ctx[0]
        for c in ctx[1:]:
            flat = flat * self.vocab_size + c
        return self.table.reshape(-1, self.vocab_size)[flat]


def random_markov(
    vocab_size: int, order: int, generator: torch.Generator, scale: float = 1.5, prompt: tuple[int, ...] | None = None
) -> MarkovModel:
    """A Markov model with i.i.d. normal(0, scale) logits (larger scale = peakier rows)."""
    shape = (vocab_size,) * (order + 1)
    table = torch.randn(shape, generator=generator) * scale
    return MarkovModel(table.float(), prompt if prompt is not None else (0,) * order)


def step_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """[N, V] float32 target law of one step: reference transforms, or one-hot argmax when greedy."""
    n = logits.shape[0]
    if cfg.greedy:
        idx = torch.argmax(sampling.greedy_logits(logits), dim=-1)
        return torch.nn.functional.one_hot(idx, logits.shape[-1]).float()
    if cfg.min_p > 0:
        logits = sampling.min_p_logits(logits.float(), torch.full((n,), cfg.temperature), torch.full((n,), cfg.min_p))
    return sampling.target_probs(
        logits,
        torch.full((n,), cfg.temperature),
        torch.full((n,), cfg.top_k, dtype=torch.int32) if cfg.top_k else None,
        torch.full((n,), cfg.top_p) if cfg.top_p < 1 else None,
    )


def all_sequences(vocab_size: int, length: int) -> torch.Tensor:
    """[V ** L, L] int64 every sequence, in the order of :func:`encode_sequences` (first token major)."""
    return torch.tensor(list(itertools.product(range(vocab_size), repeat=length)), dtype=torch.int64).reshape(
        -1, length
    )


def encode_sequences(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N] int64 index of each row of ``tokens`` [N, L] in base V (first token most significant)."""
    weights = vocab_size ** torch.arange(tokens.shape[1] - 1, -1, -1, dtype=torch.int64)
    return (tokens.to(torch.int64) * weights).sum(-1)


def sequence_histogram(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V ** L] int64 counts of the rows of ``tokens`` [N, L] (every token must be in [0, V))."""
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError("tokens must be in [0, vocab_size)")
    return torch.bincount(encode_sequences(tokens, vocab_size), minlength=vocab_size ** tokens.shape[1])


def sequence_law(model: MarkovModel, length: int, cfg: SamplingConfig) -> torch.Tensor:
    """[V ** L] float64 exact probability of each generated sequence of length L under autoregression."""
    seqs = all_sequences(model.vocab_size, length)
    prompt = torch.tensor(model.prompt, dtype=torch.int64).expand(seqs.shape[0], -1)
    full = torch.cat([prompt, seqs], dim=1)
    law = torch.ones(seqs.shape[0], dtype=torch.float64)
    for t in range(length):
        end = torch.full((seqs.shape[0],), model.order + t, dtype=torch.int64)
        p = step_probs(model.logits_at(full, end), cfg).double()
        law = law * p.gather(1, seqs[:, t : t + 1]).squeeze(1)
    return law


@dataclass(frozen=True)
class Drafter:
    """A drafter over the same vocabulary as the target.

    ``kind``:
      - "greedy": deterministic, proposes argmax of ``model`` autoregressively (no draft probs);
      - "sample": stochastic, samples each draft from q = step law of ``model`` under ``cfg`` and returns
        the q rows (draft_probs);
      - "constant": deterministic, always proposes ``token``;
      - "ngram": deterministic, proposes the token that followed the most recent earlier occurrence of
        the last token in the sequence, or a placeholder (-1) when there is none (then -1 to the end).
    """

    kind: str
    model: MarkovModel | None = None
    cfg: SamplingConfig = SamplingConfig()
    token: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("greedy", "sample", "constant", "ngram"):
            raise ValueError(f"unknown drafter kind {self.kind!r}")
        if self.kind in ("greedy", "sample") and self.model is None:
            raise ValueError(f"a {self.kind!r} drafter needs a model")

    @property
    def stochastic(self) -> bool:
        return self.kind == "sample"

    def propose(
        self, tokens: torch.Tensor, length: torch.Tensor, k: int, vocab_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft k tokens after ``tokens[n, :length[n]]`` (tokens [N, S] int64 with S >= max(length) + k).

        Returns ``(drafts [N, k] int64, q [N, k, V] float32 or None)``. ``tokens`` is not modified.
        """
        n = tokens.shape[0]
        work = tokens.clone()
        drafts = torch.empty((n, k), dtype=torch.int64)
        qs = torch.empty((n, k, vocab_size), dtype=torch.float32) if self.stochastic else None
        rows = torch.arange(n)
        for i in range(k):
            end = length + i
            if self.kind == "constant":
                x = torch.full((n,), self.token, dtype=torch.int64)
            elif self.kind == "ngram":
                x = self._ngram(work, end)
            else:
                logits = self.model.logits_at(work, end)
                if self.kind == "greedy":
                    x = torch.argmax(sampling.greedy_logits(logits), dim=-1)
                else:
                    q = step_probs(logits, self.cfg)
                    x = torch.multinomial(q, 1, generator=generator).squeeze(1)
                    qs[:, i] = q
            drafts[:, i] = x
            work[rows, end] = x
        return drafts, qs

    @staticmethod
    def _ngram(work: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        n, s = work.shape
        pos = torch.arange(s)
        last = work.gather(1, (end - 1)[:, None])
        match = (work == last) & (pos[None, :] < (end - 1)[:, None]) & (last >= 0)
        # Most recent earlier occurrence; its follower (which is < end, so already known).
        idx = torch.where(match, pos[None, :], torch.full_like(work, -1)).max(dim=1).values
        follower = work.gather(1, (idx + 1).clamp(max=s - 1)[:, None]).squeeze(1)
        return torch.where(idx >= 0, follower, torch.full_like(follower, -1))


@dataclass
class SpeculativeRun:
    """Result of :func:`run_speculative`: generated tokens and acceptance statistics."""

    tokens: torch.Tensor  # [N, L] int64 generated tokens (prompt excluded)
    num_verify_calls: int  # loop iterations (one batched verify_chain call each)
    drafted: int  # draft tokens submitted (placeholders included)
    accepted: int  # draft tokens accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.drafted, 1)


def _default_verifier(backend: str) -> Verifier:
    from .. import verify_chain

    def verify(*args):
        return verify_chain(*args, backend=backend)

    return verify


def run_speculative(
    target: MarkovModel,
    drafter: Drafter,
    cfg: SamplingConfig,
    num_sequences: int,
    length: int,
    k: int,
    seed: int = 0,
    backend: str = "reference",
    verify: Verifier | None = None,
    cap_drafts: bool = True,
    start: int = 0,
) -> SpeculativeRun:
    """Generate ``num_sequences`` independent sequences of ``length`` tokens by speculative decoding.

    Each iteration batches every unfinished sequence into one ``verify_chain`` call: request n drafts
    ``k_n`` tokens (``min(k, tokens still needed - 1)`` when ``cap_drafts``, which makes the batch
    ragged; else k), its ``k_n + 1`` target rows are the table rows after each draft prefix, its Philox key
    is ``seed * 2**32 + start + n`` and its ``position`` is the absolute position of its first draft token. The
    drafter's own randomness comes from a torch generator seeded with ``chunk_seed(seed, start)`` (``seed`` when
    ``start`` is 0): sequences ``start`` on of one seeded run, drawn in chunks (:mod:`sequential`). ``verify`` replaces the
    public ``verify_chain`` (same positional signature; used to run planted-bug samplers); otherwise
    ``verify_chain(..., backend=backend)`` is called. Outputs past ``length`` are discarded.
    """
    if verify is None:
        verify = _default_verifier(backend)
    vocab, order = target.vocab_size, target.order
    generator = torch.Generator().manual_seed(chunk_seed(seed, start))
    width = order + length + k + 1
    buf = torch.full((num_sequences, width), -1, dtype=torch.int64)
    buf[:, :order] = torch.tensor(target.prompt, dtype=torch.int64)
    cur = torch.full((num_sequences,), order, dtype=torch.int64)
    keys = chunk_keys(seed, start, num_sequences)
    temperature_value = float(cfg.temperature)
    calls = drafted = accepted = 0
    while True:
        active = torch.nonzero(cur < order + length).squeeze(1)
        n = active.numel()
        if n == 0:
            break
        tokens, end = buf[active], cur[active]
        remaining = order + length - end
        k_req = torch.clamp(remaining - 1, max=k) if cap_drafts else torch.full_like(end, k)
        k_max = int(k_req.max())
        drafts, q = drafter.propose(tokens, end, k_max, vocab, generator)
        # Target rows: after draft prefixes of length j = 0..k_max.
        rows = torch.arange(n)
        ext = tokens.clone()
        for j in range(k_max):
            ext[rows, end + j] = drafts[:, j]
        logits = torch.stack([target.logits_at(ext, end + j) for j in range(k_max + 1)], dim=1)  # [n, k+1, V]
        j = torch.arange(k_max + 1)
        row_mask = j[None, :] <= k_req[:, None]
        draft_mask = j[None, :k_max] < k_req[:, None]
        cu = torch.zeros(n + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(k_req, 0)
        result = verify(
            logits[row_mask],
            drafts[draft_mask],
            cu,
            None if q is None else q[draft_mask],
            torch.full((n,), temperature_value),
            torch.full((n,), cfg.top_k, dtype=torch.int32) if cfg.top_k else None,
            torch.full((n,), cfg.top_p) if cfg.top_p < 1 else None,
            keys[active],
            end,
            **cfg.extra_kwargs(n),
        )
        out = result.output_token_ids.to(torch.int64)
        num_acc = result.num_accepted.to(torch.int64)
        emitted = num_acc + 1
        col = torch.arange(out.shape[1])
        pos = end[:, None] + col[None, :]
        write = (col[None, :] < emitted[:, None]) & (pos < order + length)
        r_idx, c_idx = torch.nonzero(write, as_tuple=True)
        buf[active[r_idx], pos[r_idx, c_idx]] = out[r_idx, c_idx]
        cur[active] = torch.clamp(end + emitted, max=order + length)
        calls += 1
        drafted += int(k_req.sum())
        accepted += int(num_acc.sum())
    return SpeculativeRun(buf[:, order : order + length].clone(), calls, drafted, accepted)
