"""MTP (multi-token prediction) drafter head, DeepSeek-V3 style.

Row t pairs the target's final hidden state at position t (``features.py``) with the token at t + 1:
``x = eh_proj([enorm(embed(token)), hnorm(h)])`` (2H -> H), one Qwen3 decoder layer (``specdec_kernels.models``)
over the head's own KV cache, then the *shared head*: the final ``norm`` and the target's ``lm_head``
(full vocabulary, ``d2t`` = 0). Later speculative steps feed the head's own pre-norm output back as ``h``.
The embedding and ``lm_head`` are the target's (shared; refreshed by weight sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models.qwen3 import CachedAttention, DecoderLayer, KVCache, ModelConfig, RMSNorm, Rotary
from ..reference.decoder_step import pack_weights
from .cached import CachedDrafter
from .native_step import TOKEN_TABLE_LIMIT, NativeHeadStep, native_step_available


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
    qk_norm: bool = True
    max_position_embeddings: int = 4096

    def layer_config(self) -> ModelConfig:
        return ModelConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps, qk_norm=self.qk_norm)


class MtpHead(nn.Module):
    """MTP head parameters and its cached forward (see module docstring)."""

    uses_features = True
    feature_layers = (-1,)  # the target's final (normed) hidden state

    def __init__(self, cfg: MtpConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_config = cfg.layer_config()
        h = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.feature_size = h
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.enorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = DecoderLayer(self.layer_config)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)
        self.rotary = Rotary(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        self.register_buffer("d2t", torch.zeros(cfg.vocab_size, dtype=torch.int64))

    @classmethod
    def from_target(cls, target: nn.Module, intermediate_size: int | None = None) -> MtpHead:
        """A fresh head shaped like a Qwen3 ``target`` (ours or transformers'), sharing its embedding and lm_head."""
        c = target.config if isinstance(target.config, ModelConfig) else ModelConfig.from_hf(target.config)
        head = cls(MtpConfig(c.vocab_size, c.hidden_size, intermediate_size or c.intermediate_size,
                             c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps,
                             c.rope_theta, c.qk_norm, c.max_position_embeddings))
        head = head.to(target.get_input_embeddings().weight.dtype)
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

    def decode(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, cache: KVCache, rows: torch.Tensor | None,
               start: torch.Tensor, kv_len: int, depth: torch.Tensor | None = None,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Cached step over rows [R, n] (as ``Eagle3Head.decode``): the pre-norm output [R, n, H]."""
        r, n = token_ids.shape
        if depth is None:
            depth = torch.arange(n, device=start.device).expand(r, n)
        rope = self.rotary.tables(start[:, None] + depth, self.layer.inference)
        attend = CachedAttention(cache, rows, start, n, kv_len, self.cfg.num_heads, attn_mask)
        return self.layer(self._layer_input(token_ids, hidden_in), rope, attend)

    def forward_train(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, positions: torch.Tensor, attend
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Differentiable step (no cache) under ``attend``: (pre-norm output, logits [B, M, V] float32)."""
        rope = self.rotary.tables(positions, self.layer.inference)
        h = self.layer(self._layer_input(token_ids, hidden_in), rope, attend)
        return h, self.lm_head(self.norm(h)).float()

    def pack_inference(self) -> None:
        self.layer.pack_inference()

    @torch.no_grad()
    def native_step(self) -> NativeHeadStep | None:
        """The cached causal step as one native call (None without the extension or for non-float32 heads)."""
        if not (native_step_available() and self.cfg.qk_norm and self.eh_proj.weight.dtype == torch.float32):
            return None
        layer, a, m = self.layer, self.layer.self_attn, self.layer.mlp
        h, eps = self.cfg.hidden_size, self.cfg.rms_norm_eps
        weights = pack_weights(
            layer.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.q_norm.weight,
            a.k_norm.weight, a.o_proj.weight, layer.post_attention_layernorm.weight, m.gate_proj.weight,
            m.up_proj.weight, m.down_proj.weight, self.norm.weight, self.lm_head.weight, self.cfg.head_dim)
        w_e, w_h = self.eh_proj.weight[:, :h].contiguous(), self.eh_proj.weight[:, h:].contiguous()
        embed, enorm, hnorm = self.embed_tokens.weight, self.enorm.weight.clone(), self.hnorm.weight.clone()
        if embed.numel() <= TOKEN_TABLE_LIMIT:
            table = F.linear(F.rms_norm(embed, (h,), enorm, eps), w_e).contiguous()
            token_x = lambda tok: table[tok]
        else:
            token_x = lambda tok: F.linear(F.rms_norm(embed[tok], (h,), enorm, eps), w_e)
        inputs = lambda tok, hid: (token_x(tok) + F.linear(F.rms_norm(hid, (h,), hnorm, eps), w_h), None)
        return NativeHeadStep(weights, self.rotary.native(), self.cfg.num_heads, eps, inputs)


class MtpDrafter(CachedDrafter):
    """An :class:`MtpHead` driven through the batched drafter protocol (``base.Drafter``)."""

    def __init__(self, head: MtpHead, backend: str = "torch", native: bool | None = None) -> None:
        super().__init__(head, backend, native)
