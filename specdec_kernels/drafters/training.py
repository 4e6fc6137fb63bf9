"""Training drafters (EAGLE-3 and MTP heads, draft models) against a target: offline initialisation and
online adaptation inside RL.

Data a step consumes (all from one target forward, see ``features.py``): ``token_ids`` [B, T], the
drafter features ``features`` [B, T, F] and the target's ``logits`` [B, T, V], plus ``lengths`` [B].
Everything is ``detach()``-ed on entry, so drafter training can never send a gradient into the target.

Loss (forward KL to the target, test-time-training unroll). Row t pairs features_t with token_{t+1} and
predicts token_{t+2}, whose target distribution is ``softmax(logits[t + 1])``. Unroll step s >= 1 feeds
the head's own output of step s - 1 at row t together with token_{t+1+s} and predicts token_{t+2+s};
its query attends to the step-0 rows <= t and to its own earlier unroll rows at t, exactly what a
speculative node of depth s sees at inference. The loss is

    sum_s decay**s * mean_{valid rows} KL(p_restricted || q)

with p the target distribution restricted (renormalised) to the draft vocabulary and q the head's draft
distribution; rows whose target argmax lies outside the draft vocabulary are masked out. A draft model
is one step: row t against the target's distribution at t (same KL, no features).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models.qwen3 import Qwen3
from .features import capture_target_features


def build_draft_vocab(token_ids: Iterable[torch.Tensor] | torch.Tensor, draft_vocab_size: int,
                      vocab_size: int) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent target ids in ``token_ids`` (ties to the lower id), sorted.

    Ids never seen fill the remaining slots in increasing order. Returns [Vd] int64.
    """
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab_size}], got {draft_vocab_size}")
    chunks = [token_ids] if isinstance(token_ids, torch.Tensor) else list(token_ids)
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for c in chunks:
        c = c.reshape(-1).to(torch.int64).cpu()
        c = c[(c >= 0) & (c < vocab_size)]
        counts += torch.bincount(c, minlength=vocab_size)
    # Stable sort on descending count keeps lower ids first among ties.
    order = torch.sort(-counts, stable=True).indices
    return torch.sort(order[:draft_vocab_size]).values


def _unroll_mask(t: int, step: int, device: torch.device) -> torch.Tensor:
    """[T, (step + 1) * T] bool: step-``step`` row t sees step-0 rows <= t and rows t of steps 1..step."""
    rows = torch.arange(t, device=device)
    key = torch.arange((step + 1) * t, device=device)
    blk, col = key // t, key % t
    first = (blk == 0)[None, :] & (col[None, :] <= rows[:, None])
    later = (blk >= 1)[None, :] & (col[None, :] == rows[:, None])
    return first | later


class _UnrollAttention:
    """``attend`` of one unroll step: the new rows attend to every earlier step's keys/values and their
    own under ``mask`` [T, S] (differentiable; the keys/values are kept for the later steps)."""

    def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        self.past, self.mask = past, mask

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.past.append((k, v))
        keys = torch.cat([p[0] for p in self.past], dim=2)
        vals = torch.cat([p[1] for p in self.past], dim=2)
        return F.scaled_dot_product_attention(q, keys, vals, attn_mask=self.mask, enable_gqa=True)


def unroll_logits(head: nn.Module, token_ids: torch.Tensor, features: torch.Tensor, ttt_steps: int
                  ) -> list[torch.Tensor]:
    """Draft logits of every unroll step: entry s is [B, T, Vd], row t predicting token_{t+2+s}."""
    _, t = token_ids.shape
    dev = token_ids.device
    rows = torch.arange(t, device=dev)
    hidden = head.project_features(features)
    past: list[tuple[torch.Tensor, torch.Tensor]] = []
    out = []
    for s in range(ttt_steps):
        tok = token_ids[:, (rows + 1 + s).clamp(max=t - 1)]
        attend = _UnrollAttention(past, _unroll_mask(t, s, dev))
        hidden, logits = head.forward_train(tok, hidden, (rows + s)[None, :], attend)
        out.append(logits)
    return out


def distill_loss(head: nn.Module, token_ids: torch.Tensor, features: torch.Tensor | None, logits: torch.Tensor,
                 lengths: torch.Tensor, ttt_steps: int = 3, decay: float = 0.8,
                 target_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Decay-weighted forward-KL loss of ``head`` over a ``ttt_steps`` unroll (see module doc).

    EAGLE-3 / MTP heads take ``features`` [B, T, F]; a draft model (``DraftModelHead``, ``features=None``)
    is scored once, row t against the target's distribution at t. ``target_mask`` [B, T] bool (optional)
    keeps only the target distributions at the marked positions (e.g. the response tokens of rollouts).
    """
    if ttt_steps < 1:
        raise ValueError(f"ttt_steps must be >= 1, got {ttt_steps}")
    token_ids = token_ids.detach().to(torch.int64)
    logits = logits.detach()
    _, t = token_ids.shape
    dev = token_ids.device
    draft_ids = _draft_ids(head, logits.shape[-1], dev)
    in_draft = torch.zeros(logits.shape[-1], dtype=torch.bool, device=dev)
    in_draft[draft_ids] = True
    rows = torch.arange(t, device=dev)
    lengths = lengths.to(dev)
    if head.uses_features:
        steps = enumerate(unroll_logits(head, token_ids, features.detach(), ttt_steps))
    else:  # a draft model: one step, row t predicts token t + 1 from the target's distribution at t
        steps = [(-1, head.lm(token_ids)[0])]
    total = torch.zeros((), dtype=torch.float32, device=dev)
    for s, draft_logits in steps:
        # Row r is scored against the target's distribution at position r + 1 + s.
        at = (rows + 1 + s).clamp(max=t - 1)
        tgt = logits[:, at].float()
        valid = (rows[None, :] + 1 + s) < lengths[:, None]
        if target_mask is not None:
            valid &= target_mask.to(dev)[:, at]
        valid &= in_draft[tgt.argmax(-1)]
        p = torch.softmax(tgt[..., draft_ids], dim=-1)
        logq = torch.log_softmax(draft_logits.float(), dim=-1)
        kl = (p * (torch.log(p.clamp_min(1e-30)) - logq)).sum(-1)
        total = total + (decay ** max(s, 0)) * (kl * valid).sum() / valid.sum().clamp_min(1)
    return total


def _draft_ids(head: nn.Module, vocab_size: int, device: torch.device) -> torch.Tensor:
    """[Vd] target ids of the head's draft vocabulary."""
    return torch.arange(head.d2t.numel(), device=device) + head.d2t.to(device)


def head_features(head: nn.Module, captured) -> torch.Tensor | None:
    """The slice of a :class:`features.TargetForward` that ``head`` consumes (None for a draft model)."""
    if not head.uses_features:
        return None
    if hasattr(head, "fc"):
        return captured.eagle3_features
    return captured.last_hidden


@dataclass
class TrainConfig:
    """Optimiser and unroll knobs shared by offline and online training."""

    lr: float = 3e-3
    ttt_steps: int = 3
    decay: float = 0.8
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.999)


class DrafterTrainer:
    """Owns a head's optimiser; ``step`` trains on one detached batch, ``sync`` refreshes shared weights.

    Offline initialisation: :meth:`fit_offline` runs the target on domain batches (no grad) and trains.
    Online adaptation inside RL: the engine passes the tensors it already cached during the policy's
    forward to :meth:`step` (they are detached here; the policy's graph is never touched). After each
    policy update :meth:`sync` copies the policy's embedding (and, for heads that share it, lm_head) and
    records ``policy_version``; ``version`` counts drafter updates.
    """

    def __init__(self, head: nn.Module, cfg: TrainConfig | None = None) -> None:
        self.head = head
        self.cfg = cfg or TrainConfig()
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, betas=self.cfg.betas)
        self.version = 0
        self.policy_version = -1

    def step(self, token_ids: torch.Tensor, features: torch.Tensor | None, logits: torch.Tensor,
             lengths: torch.Tensor, target_mask: torch.Tensor | None = None) -> float:
        """One optimiser step on detached target tensors (see :func:`distill_loss`); returns the loss
        before the step."""
        self.head.train()
        loss = distill_loss(self.head, token_ids.detach(), None if features is None else features.detach(),
                            logits.detach(), lengths.detach(), self.cfg.ttt_steps, self.cfg.decay, target_mask)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in self.head.parameters() if p.requires_grad]
        torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        self.opt.step()
        self.head.eval()
        self.version += 1
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self, token_ids: torch.Tensor, features: torch.Tensor | None, logits: torch.Tensor,
                 lengths: torch.Tensor, target_mask: torch.Tensor | None = None) -> float:
        """The loss on a batch without updating."""
        return float(distill_loss(self.head, token_ids, features, logits, lengths, self.cfg.ttt_steps,
                                  self.cfg.decay, target_mask))

    def fit_offline(self, target: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                    feature_layers: tuple[int, ...] | None = None) -> list[float]:
        """Train on ``(token_ids [B, T], lengths [B])`` batches run through ``target``; returns the losses."""
        layers = feature_layers if feature_layers is not None else self.head.feature_layers
        losses = []
        for ids, lengths in batches:
            mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
            with torch.no_grad():
                cap = capture_target_features(target, ids, layers if hasattr(self.head, "fc") else None,
                                              **({} if isinstance(target, Qwen3) else {"attention_mask": mask}))
            losses.append(self.step(ids, head_features(self.head, cap), cap.logits, lengths))
        return losses

    @torch.no_grad()
    def sync(self, policy: nn.Module, policy_version: int) -> None:
        """Copy the policy's shared weights into the head (drafter weights versioned with the policy)."""
        sync_shared_weights(self.head, policy)
        self.policy_version = int(policy_version)


@torch.no_grad()
def sync_shared_weights(head: nn.Module, policy: nn.Module) -> None:
    """Copy the policy's token embedding into ``head`` (and its lm_head where the head shares it: MTP);
    a draft model shares nothing."""
    if not head.uses_features:
        return
    head.embed_tokens.weight.copy_(policy.get_input_embeddings().weight)
    if not hasattr(head, "fc"):  # MTP: the shared head is the policy's lm_head
        head.lm_head.weight.copy_(policy.get_output_embeddings().weight)
