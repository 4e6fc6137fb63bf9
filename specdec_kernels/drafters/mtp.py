"""MTP (multi-token prediction) drafter head, DeepSeek-V3 style.

Row t pairs the target's final hidden state at position t (``features.py``) with the token at t + 1:
``x = eh_proj([enorm(embed(token)), hnorm(h)])`` (2H -> H), one Llama-style decoder layer over the head's
own KV cache, then the *shared head*: the final ``norm`` and the target's ``lm_head`` (full vocabulary,
``d2t`` = 0). Later speculative steps feed the head's own pre-norm output back as ``h``.
The embedding and ``lm_head`` are the target's (shared; refreshed by weight sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .cached import CachedDrafter
from .layers import DecoderLayer, KVCache, LayerConfig, RMSNorm


@dataclass
class MtpConfig:
    """Shape of an MTP head (``hidden_size`` equals the target's)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


class MtpHead(nn.Module):
    """MTP head parameters and its one-step cached forward (see module docstring)."""

    uses_features = True
    num_layers = 1

    def __init__(self, cfg: MtpConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.feature_size = h
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.enorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        lc = LayerConfig(h, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.rms_norm_eps, cfg.rope_theta)
        self.layer = DecoderLayer(lc, input_size=h)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)
        self.register_buffer("d2t", torch.zeros(cfg.vocab_size, dtype=torch.int64))

    @classmethod
    def from_target(cls, target: nn.Module, intermediate_size: int | None = None) -> MtpHead:
        """A fresh head shaped like a transformers Qwen3/Llama ``target``, sharing its embedding and lm_head."""
        c = target.config
        head = cls(MtpConfig(c.vocab_size, c.hidden_size, intermediate_size or c.intermediate_size,
                             c.num_attention_heads, c.num_key_value_heads,
                             getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
                             c.rms_norm_eps, getattr(c, "rope_theta", 10000.0)))
        head.sync_shared(target)
        return head

    @torch.no_grad()
    def sync_shared(self, target: nn.Module) -> None:
        """Copy the target's token embedding and lm_head (after each policy update)."""
        self.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        self.lm_head.weight.copy_(target.get_output_embeddings().weight)

    def project_features(self, features: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        """MTP consumes the target's hidden state as is."""
        return features.to(self.eh_proj.weight.dtype)

    def _layer_input(self, token_ids: torch.Tensor, hidden_in: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(token_ids).to(hidden_in.dtype)
        return self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden_in)], dim=-1))

    def step(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, positions: torch.Tensor,
             slots: torch.Tensor, mask: torch.Tensor, kv: KVCache, backend: str = "torch"
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One cached step over rows [B, M]: (pre-norm output, normed output), each [B, M, H]."""
        x = self._layer_input(token_ids, hidden_in)
        h = self.layer(self.layer.input_layernorm(x), x, positions, slots, mask, kv, 0)
        return h, self.norm(h)

    def forward_train(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]
                      ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Differentiable step (no cache): (pre-norm output, logits [B, M, V] float32, new K/V)."""
        x = self._layer_input(token_ids, hidden_in)
        h, kv = self.layer.forward_train(self.layer.input_layernorm(x), x, positions, mask, past)
        return h, self.lm_head(self.norm(h)).float(), kv


class MtpDrafter(CachedDrafter):
    """An :class:`MtpHead` driven through the batched drafter protocol (``base.Drafter``)."""

    def __init__(self, head: MtpHead, backend: str = "torch") -> None:
        super().__init__(head, backend)
