"""The drafter interface a rollout engine drives once per verification round, batched over B sequences.

Every drafter (EAGLE-3 head, MTP head, small draft model) follows one protocol::

    drafter.prefill(input_ids, lengths, next_token_ids, target_features)   # once per prompt batch
    while not done:
        prop = drafter.propose(k, temperature, seed, position)          # chain: [B, k] drafts (+ q rows)
        res = sk.verify_chain(target_logits, prop.token_ids.flatten(), cu, prop.probs_flat(), ...)
        drafter.commit(res.num_accepted, res.output_token_ids, target_features_of_verified_rows)

Sequence bookkeeping. After ``prefill`` a sequence holds its prompt (``lengths[b]`` tokens) plus the
token the target emitted after it (``next_token_ids[b]``), so ``num_tokens[b] = lengths[b] + 1`` and the
first draft token decides absolute position ``num_tokens[b]``. A verification round feeds the target
``[last emitted token, d_1 .. d_k]`` at positions ``num_tokens - 1 .. num_tokens - 1 + k``; its outputs
are ``num_accepted[b] = n`` and ``output_token_ids[b, :n + 1]`` (accepted drafts, then the correction or
bonus token). ``commit`` appends those ``n + 1`` tokens.

Target features (what the target's forward captured, per input position; see ``features.py``):

- EAGLE-3: the residual stream at the inputs of three target layers, concatenated: ``F = 3 * H_target``.
- MTP: the target's final hidden state (after its final norm, ``hidden_states[-1]``): ``F = H_target``.
- draft model: nothing (``target_features=None``; ``feature_size == 0``).

``prefill`` takes features for the prompt positions ``[B, L, F]``; ``commit`` takes the features of the
verified rows ``[B, k + 1, F]`` (row j = the target's input at position ``num_tokens - 1 + j``); only the
first ``n + 1`` rows of each sequence are read.

Continuous batching. ``reset(num_slots, max_len)`` starts empty slots, ``admit(rows, ...)`` prefills new
sequences into some of them, and ``propose`` / ``propose_tree`` / ``commit`` take ``rows`` [R] to work on
the active slots only, in place (None: every slot). ``CachedDrafter`` implements this for every head.

Randomness. Stochastic proposals sample from the draft distribution q with the project's stateless
Philox (``reference/philox.py``) on stream :data:`STREAM_DRAFT` = 3, which docs/design.md §4 leaves unused by
the verifiers: the draft token at absolute position ``pos`` of a sequence with key ``seed`` uses
``u_v = philox.uniform(seed, pos, 3, v)`` for target-vocabulary index v (draw index v), and is
``argmax_v(log q(v) - log(-log u_v))`` (Gumbel-max; tree children: the top-m of the same perturbed scores,
i.e. m draws without replacement). A sequence's drafts therefore depend only on its own tokens, seed and
positions: runs are reproducible and batch invariant (not on the batch, the slot or the slot order).

Vocabularies. A drafter may predict over a reduced draft vocabulary of ``Vd`` tokens; draft id ``i`` maps
to target id ``i + d2t[i]`` (vLLM's convention). Every id a drafter returns is a *target* id and every q
row is a distribution over the *target* vocabulary (zero outside the draft vocabulary).
"""

from __future__ import annotations

import abc
import functools
from typing import NamedTuple

import torch

from ..reference import philox
from ..reference.philox import STREAM_DRAFT


class DraftProposal(NamedTuple):
    """A chain of ``k`` draft tokens per sequence.

    ``token_ids`` [B, k] int64 target ids. ``probs`` [B, k, V_target] float32 or None: row j is the draft
    distribution q that ``token_ids[:, j]`` was drawn from (what a stochastic verifier needs); None when
    every sequence drafted greedily (deterministic drafts).
    """

    token_ids: torch.Tensor
    probs: torch.Tensor | None

    def flat(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(draft_token_ids [B*k], cu_num_draft_tokens [B+1] int32, draft_probs [B*k, V] | None) for verify_chain."""
        b, k = self.token_ids.shape
        cu = torch.arange(b + 1, dtype=torch.int32, device=self.token_ids.device) * k
        probs = None if self.probs is None else self.probs.reshape(b * k, -1)
        return self.token_ids.reshape(-1), cu, probs


class TreeProposal(NamedTuple):
    """A draft tree per sequence, ``N`` nodes each (same N for every sequence; node 0 is the root).

    ``node_token_ids`` [B, N] int64 target ids (root = last emitted token). ``parent`` [B, N] int64 local
    index, -1 at the root, ``parent < child``; siblings are ordered by decreasing draft score.
    ``depth`` [B, N] int64 (root 0). ``log_probs`` [B, N] float32 cumulative draft log-probability of the
    path root -> node (root 0; what tree builders rank and prune by). ``draft_probs`` [B, N, V_target]
    float32 or None: row i is the q from which node i's children were drawn (stochastic trees only; rows of
    nodes that were not expanded are zero and never read by a verifier).
    """

    node_token_ids: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    log_probs: torch.Tensor
    draft_probs: torch.Tensor | None

    def flat(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(node_token_ids [B*N], parent [B*N], cu_num_nodes [B+1] int32, draft_probs [B*N, V] | None)."""
        b, n = self.node_token_ids.shape
        cu = torch.arange(b + 1, dtype=torch.int32, device=self.node_token_ids.device) * n
        probs = None if self.draft_probs is None else self.draft_probs.reshape(b * n, -1)
        return self.node_token_ids.reshape(-1), self.parent.reshape(-1), cu, probs


class Drafter(abc.ABC):
    """Batched drafter with its own KV cache. Subclasses implement the three ``_``-prefixed primitives.

    Attributes every drafter has: ``vocab_size`` (target vocabulary V), ``draft_vocab_size`` (Vd),
    ``feature_size`` (F, 0 when no target features are used), ``d2t`` [Vd] int64 offsets.
    """

    vocab_size: int
    draft_vocab_size: int
    feature_size: int

    # ---------------------------------------------------------------- protocol driven by the engine
    @abc.abstractmethod
    def prefill(
        self,
        input_ids: torch.Tensor,
        lengths: torch.Tensor,
        next_token_ids: torch.Tensor,
        target_features: torch.Tensor | None,
    ) -> None:
        """Start B new sequences (drops any previous state).

        ``input_ids`` [B, L] int64 right-padded prompts, ``lengths`` [B] (1 <= lengths <= L),
        ``next_token_ids`` [B] the token the target emitted after each prompt, ``target_features``
        [B, L, F] the target's captured features at the prompt positions (None for a draft model).
        """

    @abc.abstractmethod
    def commit(
        self,
        num_accepted: torch.Tensor,
        output_token_ids: torch.Tensor,
        target_features: torch.Tensor | None,
        rows: torch.Tensor | None = None,
    ) -> None:
        """Append each sequence's verified tokens and refresh the KV cache from the target's features.

        ``num_accepted`` [B] (n_b), ``output_token_ids`` [B, >= n_b + 1] (verify_chain / verify_tree output:
        accepted drafts then the correction or bonus token, -1 padded), ``target_features`` [B, >= n_b + 1, F]
        the target's features at the verified rows (row j = position num_tokens - 1 + j), None for a draft
        model. Speculative state from ``propose`` is discarded. ``rows``: the slots the B sequences are in.
        """

    def propose(
        self,
        k: int,
        temperature: torch.Tensor | None = None,
        seed: torch.Tensor | None = None,
        position: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> DraftProposal:
        """Draft a chain of ``k`` tokens per sequence.

        ``temperature`` [B] float32 or None. None: every sequence drafts greedily (argmax of the draft
        logits) and ``probs`` is None. Otherwise rows with temperature > 0 sample from
        q = softmax(draft logits / temperature) with Philox stream 3 keyed by ``seed`` [B] int64 at absolute
        positions ``position + j`` (``position`` [B] int64 defaults to :attr:`num_tokens`), rows with 0 draft
        greedily, and ``probs`` [B, k, V] holds q (for greedy rows the temperature-1 draft softmax, which
        verifiers ignore for greedy requests). ``rows``: the slots to draft for (None: every slot).
        """
        tree = self.propose_tree(k, 1, 1, temperature, seed, position, rows)
        # With top_k = beam_width = 1 the tree is a chain: node j + 1 is the child of node j.
        probs = None if tree.draft_probs is None else tree.draft_probs[:, :k]
        return DraftProposal(tree.node_token_ids[:, 1:], probs)

    @abc.abstractmethod
    def propose_tree(
        self,
        depth: int,
        top_k: int,
        beam_width: int,
        temperature: torch.Tensor | None = None,
        seed: torch.Tensor | None = None,
        position: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> TreeProposal:
        """Draft a tree of ``depth`` levels: at each level the ``beam_width`` frontier nodes with the highest
        cumulative draft log-probability each get ``top_k`` children (the top-k draft tokens; or, with a
        temperature > 0, ``top_k`` draws without replacement from q via Gumbel-top-k on stream 3).

        Level 1 has ``top_k`` nodes; level d > 1 expands ``min(beam_width, size of level d - 1)`` nodes, so
        N = 1 + sum of the level sizes, the same for every sequence. Greedy rows rank by
        log-softmax(draft logits); sampled rows by the Gumbel-perturbed log q. Arguments as in :meth:`propose`.
        """

    @property
    @abc.abstractmethod
    def num_tokens(self) -> torch.Tensor:
        """[B] int64 tokens held per sequence (prompt + emitted); the next draft decides this position."""

    @abc.abstractmethod
    def select(self, batch_index: torch.Tensor) -> None:
        """Keep only the sequences ``batch_index`` [B'] (e.g. drop finished rollouts), in that order."""


# ---------------------------------------------------------------------------------------------------
# Draft-stream uniforms (the spec of the drafter head's sampling: reference/drafter.py)
# ---------------------------------------------------------------------------------------------------

def draft_uniforms(seed: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, V] Philox uniforms on :data:`STREAM_DRAFT` for rows with ``seed`` [R] and ``position`` [R]
    (``reference/philox.py``; on CPU one native call when the extension is built, bit-identical)."""
    if seed.device.type == "cpu" and _native_uniforms():
        from .. import native

        return native.uniform_rows(seed.to(torch.int64), position.to(torch.int64), STREAM_DRAFT, vocab_size)
    return philox.uniform_rows(seed, position, STREAM_DRAFT, vocab_size)


@functools.cache
def _native_uniforms() -> bool:
    from .. import native

    return native.has_op("philox_uniform_rows", "cpu")
