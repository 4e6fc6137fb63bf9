"""The Philox layout keeps every random draw apart (reference/philox.py, docs/design.md §4).

A draw is keyed by (request key, position, role, index): the coin of sibling slot s, the recovery / bonus
noise of vocabulary entry v or block b (index BLOCK_DRAWS + b), the drafter's noise of entry v, and the
block / traversal verifiers' sequence-level coins (keyed by the round's first position). The layout maps it to
one 32-bit word: (key, offset = (position << 32) | (stream << 30) | (index >> 2), word = index & 3). Two
distinct draws on one word are one uniform serving two decisions: the shared-stream bias of vLLM PR #54282.

The tests enumerate every draw a batch makes (ragged chains, trees with sibling slots, rounds that reuse a
key, vocabularies of several blocks, the largest positions and vocabulary indices), check that the
reference verifiers and the drafter draw nothing outside the enumeration, and assert that no two distinct
draws share a word; planted layouts that overlap (recovery on the coin's stream, block draws inside the
vocabulary range, sequence coins without their flag) must fail the same assertion.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.reference import drafter, gumbel, philox

ROLE_STREAMS = {"coin": philox.STREAM_COIN, "recovery": philox.STREAM_RECOVERY, "bonus": philox.STREAM_BONUS,
                "draft": philox.STREAM_DRAFT}


@dataclass(frozen=True)
class Layout:
    """Where a draw's word lives: each role's stream, the draw index of block 0, the sequence-coin flag."""

    streams: dict[str, int] = field(default_factory=lambda: dict(ROLE_STREAMS))
    block_draws: int = philox.BLOCK_DRAWS
    sequence_flag: int = philox.SEQUENCE_COIN_FLAG

    def word(self, key: int, position: int, role: str, index: int) -> tuple[int, int, int]:
        if role == "sequence-coin":
            position, stream = position | self.sequence_flag, self.streams["coin"]
        else:
            stream = self.streams[role]
        return key, (position << 32) | (stream << 30) | (index >> 2), index & 3


OURS = Layout()


def test_layout_is_the_documented_one():
    assert (philox.STREAM_COIN, philox.STREAM_RECOVERY, philox.STREAM_BONUS, philox.STREAM_DRAFT) == (0, 1, 2, 3)
    assert philox.BLOCK_DRAWS == 1 << 30 and philox.SEQUENCE_COIN_FLAG == 1 << 31
    position, index = torch.tensor([5, philox.MAX_POSITION]), torch.tensor([7, philox.BLOCK_DRAWS + 3])
    expected = [OURS.word(0, int(p), "bonus", int(i))[1] for p, i in zip(position, index, strict=True)]
    assert philox.draw_offset(position, philox.STREAM_BONUS, index).tolist() == expected


@dataclass(frozen=True)
class Span:
    """One verification round of a request: ``depth + 1`` positions from ``position``, ``slots`` sibling coins
    per position, vocabulary indices ``vocab`` and blocks ``blocks``, ``sequence_coins`` sequence-level coins."""

    key: int
    position: int
    depth: int
    slots: int
    vocab: tuple[int, ...]
    blocks: tuple[int, ...]
    sequence_coins: int


def draws(spans: list[Span], layout: Layout) -> dict[tuple[int, int, int], set[tuple]]:
    """Every draw of ``spans`` by its word: {(key, offset, word): {(key, position, role, what), ...}}.

    A per-position draw is the same draw in every round that reaches its position (a later round draws it
    again only where the earlier one was not used); a sequence coin belongs to its round's first position.
    """
    out: dict[tuple[int, int, int], set[tuple]] = defaultdict(set)
    for s in spans:
        for position in range(s.position, s.position + s.depth + 1):
            named = [("coin", f"slot {i}", i) for i in range(s.slots)] + [("draft", f"entry {v}", v) for v in s.vocab]
            for role in ("recovery", "bonus"):
                named += [(role, f"entry {v}", v) for v in s.vocab]
                named += [(role, f"block {b}", layout.block_draws + b) for b in s.blocks]
            for role, what, index in named:
                out[layout.word(s.key, position, role, index)].add((s.key, position, role, what))
        for j in range(s.sequence_coins):
            out[layout.word(s.key, s.position, "sequence-coin", j)].add((s.key, s.position, "sequence-coin", j))
    return out


def shared_words(spans: list[Span], layout: Layout) -> list[tuple]:
    """The words that two or more distinct draws land on."""
    return [(word, sorted(names)) for word, names in draws(spans, layout).items() if len(names) > 1]


def batch_spans() -> list[Span]:
    """Ragged chains and trees on V = 40 (three blocks, the last partial), a key reused by consecutive
    rounds (the second starts inside the first's positions), and a request at the largest position and
    vocabulary indices the layout admits."""
    full = tuple(range(40)), tuple(range(gumbel.num_blocks(40)))
    spans = [Span(key, 100 + 7 * key, depth, slots, *full, n) for key, depth, slots, n in
             ((1, 0, 1, 1), (2, 3, 1, 4), (3, 5, 1, 6), (4, 2, 3, 9), (5, 3, 4, 13))]
    spans += [Span(9, 500, 4, 2, *full, 7), Span(9, 503, 4, 2, *full, 7), Span(9, 505, 1, 1, *full, 2)]
    top_blocks = philox.MAX_VOCAB // gumbel.BLOCK
    big_vocab = (0, 1, 2, 3, 4, philox.MAX_VOCAB - 5, philox.MAX_VOCAB - 4, philox.MAX_VOCAB - 1)
    spans.append(Span(11, philox.MAX_POSITION - 3, 3, 4, big_vocab, (0, 1, top_blocks - 1), 5))
    spans.append(Span(11, 0, 2, 4, big_vocab, (0, 1, top_blocks - 1), 5))
    return spans


def test_no_two_draws_share_a_word():
    spans = batch_spans()
    assert sum(len(names) for names in draws(spans, OURS).values()) > 3000
    assert shared_words(spans, OURS) == []


@pytest.mark.parametrize("planted", [
    Layout(streams={**ROLE_STREAMS, "recovery": philox.STREAM_COIN}),  # vLLM #54282: recovery on the coin's stream
    Layout(streams={**ROLE_STREAMS, "bonus": philox.STREAM_RECOVERY}),
    Layout(streams={**ROLE_STREAMS, "draft": philox.STREAM_COIN}),  # drafts on the verifier's stream
    Layout(block_draws=32),  # block noise inside the vocabulary range of V = 40
    Layout(sequence_flag=0),  # sequence coins on the per-position coins
], ids=["recovery-on-coin", "bonus-on-recovery", "draft-on-coin", "blocks-in-vocab", "sequence-coin-unflagged"])
def test_a_planted_overlap_is_found(planted):
    """The assertion above can fail: each planted layout puts two distinct draws on one word."""
    assert shared_words(batch_spans(), planted)


# ----------------------------------------------------------------------------------------------------
# The enumeration covers what the code draws
# ----------------------------------------------------------------------------------------------------

class Recorder:
    """Records the (key, offset, word) of every uniform drawn through ``philox.uniform`` / ``uniform_rows``."""

    def __init__(self, monkeypatch):
        self.words: set[tuple[int, int, int]] = set()
        uniform, uniform_rows = philox.uniform, philox.uniform_rows

        def recording_uniform(seed, position, stream, index):
            index = torch.as_tensor(index, dtype=torch.int64, device=position.device)
            key, offset, word = torch.broadcast_tensors(
                torch.as_tensor(seed), philox.draw_offset(position, stream, index), index & 3)
            unsigned = [o % (1 << 64) for o in offset.flatten().tolist()]  # int64 holds the counter's 64 bits
            self.words.update(zip(key.flatten().tolist(), unsigned, word.flatten().tolist(), strict=True))
            return uniform(seed, position, stream, index)

        def recording_rows(seed, position, stream, vocab_size):
            for key, pos in zip(seed.tolist(), position.tolist(), strict=True):
                self.words.update((key, (pos << 32) | (stream << 30) | (v >> 2), v & 3) for v in range(vocab_size))
            return uniform_rows(seed, position, stream, vocab_size)

        monkeypatch.setattr(philox, "uniform", recording_uniform)
        monkeypatch.setattr(philox, "uniform_rows", recording_rows)


def _chain_batch(g, vocab: int):
    k = torch.tensor([0, 3, 5, 2])
    cu = torch.zeros(5, dtype=torch.int64)
    cu[1:] = torch.cumsum(k, 0)
    logits = torch.randn(int(cu[-1]) + 4, vocab, generator=g) * 3
    q = torch.softmax(torch.randn(int(cu[-1]), vocab, generator=g) * 3, -1)
    drafts = torch.multinomial(q, 1, generator=g).squeeze(1)
    return k, cu, logits, drafts, q


def _tree_batch(g, vocab: int):
    # Request 0: root with 3 children, the first with 2 children; request 1: a chain of 3 under the root.
    parent = torch.tensor([-1, 0, 0, 0, 1, 1, -1, 0, 1, 2])
    cu = torch.tensor([0, 6, 10])
    logits = torch.randn(10, vocab, generator=g) * 3
    q = torch.softmax(torch.randn(10, vocab, generator=g) * 3, -1)
    tokens = torch.randint(0, vocab, (10,), generator=g)
    return parent, cu, logits, tokens, q


def test_reference_verifiers_and_drafter_draw_only_enumerated_words(monkeypatch):
    """Every word the reference chain (token, block), tree (token, traversal) verifiers and the drafter's
    sampling draw for a batch is one of the enumerated draws, so the no-sharing check covers them."""
    g = torch.Generator().manual_seed(48)
    vocab = 40
    full = tuple(range(vocab)), tuple(range(gumbel.num_blocks(vocab)))
    recorder = Recorder(monkeypatch)
    seed, position = torch.tensor([21, 22, 23, 24]), torch.tensor([0, 40, 1000, philox.MAX_POSITION - 5])
    k, cu, logits, drafts, q = _chain_batch(g, vocab)
    for draft_probs in (q, None):
        for method in ("token", "block"):
            sk.verify_chain(logits, drafts, cu, draft_probs, torch.ones(4), seed=seed, position=position,
                            backend="reference", method=method)
    rows = torch.repeat_interleave(torch.arange(4), k)
    draft_pos = position[rows] + torch.cat([torch.arange(int(n)) for n in k])
    drafter.logits_sample(torch.randn(rows.numel(), vocab, generator=g), torch.zeros(vocab, dtype=torch.int64),
                          vocab, torch.ones(rows.numel()), seed[rows], draft_pos, 1)
    parent, tcu, tlogits, tokens, tq = _tree_batch(g, vocab)
    tseed, tposition = torch.tensor([31, 32]), torch.tensor([7, 9000])
    for method, sibling in (("token", "iid"), ("token", "without_replacement"), ("traversal", "iid")):
        sk.verify_tree(tlogits, tokens, parent, tcu, tq, torch.ones(2), seed=tseed, position=tposition,
                       sibling_sampling=sibling, backend="reference", method=method)
    sk.verify_tree(tlogits, tokens, parent, tcu, None, torch.ones(2), seed=tseed, position=tposition,
                   backend="reference")
    # The block verifier draws the sequence coins of every prefix length up to the batch's longest chain.
    spans = [Span(int(s), int(p), int(n), 1, *full, int(k.max()) + 1) for s, p, n in zip(seed, position, k, strict=True)]
    spans += [Span(int(s), int(p), 3, 3, *full, 6) for s, p in zip(tseed, tposition, strict=True)]
    enumerated = set(draws(spans, OURS))
    assert recorder.words, "nothing was recorded: the reference no longer draws through philox.uniform"
    missing = sorted(recorder.words - enumerated)
    assert not missing, f"{len(missing)} drawn words outside the enumeration, e.g. {missing[:3]}"


def test_a_verifier_drawing_off_the_layout_is_flagged(monkeypatch):
    """The coverage check can fail: the shared-stream mutant resamples on the coin's stream, words that the
    enumeration gives to no draw of that role."""
    from specdec_kernels.exactness import chain_mutants

    g = torch.Generator().manual_seed(48)
    vocab = 40
    recorder = Recorder(monkeypatch)
    seed, position = torch.tensor([21, 22, 23, 24]), torch.tensor([0, 40, 1000, 77])
    k, cu, logits, drafts, q = _chain_batch(g, vocab)
    chain_mutants.mutant_verifier("shared_stream")(logits, drafts, cu, q, torch.ones(4), seed=seed, position=position)
    full = tuple(range(vocab)), tuple(range(gumbel.num_blocks(vocab)))
    spans = [Span(int(s), int(p), int(n), 1, *full, 0) for s, p, n in zip(seed, position, k, strict=True)]
    assert recorder.words - set(draws(spans, OURS))
