"""EAGLE-3 drafter head, in the layout vLLM serves as an ``eagle3`` speculator.

Inputs per row t: the target's residual stream at the inputs of three target layers (captured features,
``[3 * Ht]``, see ``features.py``) and the token at t + 1. The head

1. RMSNorms each of the three feature chunks (``fc_norm``, vLLM's ``fc_norm`` option), concatenates and
   projects them with ``fc`` (3 Ht -> H);
2. concatenates ``input_layernorm(embed(token))`` with ``hidden_norm(h)`` (2H) and runs one decoder layer
   (``midlayer``: the Qwen3 layer of ``specdec_kernels.models``, q/k/v 2H wide) whose residual is ``h``,
   attending over its own KV cache;
3. applies the final ``norm`` and ``lm_head`` over a reduced draft vocabulary of Vd tokens; draft id i is
   target id ``i + d2t[i]``; ``t2d`` [V] marks target ids in the draft vocabulary.

Speculative steps after the first feed the head's own pre-norm output back in place of ``fc(features)``.
``qk_norm=True`` (default) is vLLM's ``Eagle3Qwen3ForCausalLM``; ``qk_norm=False`` its
``LlamaForCausalLMEagle3`` (see ``checkpoint.py``). The token embedding is the target's (shared, refreshed
by weight sync). With the compiled extension a float32 Qwen3 head runs each cached causal step as one
``specdec_kernels.native.decoder_step`` call (:meth:`Eagle3Head.native_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models.qwen3 import CachedAttention, DecoderLayer, KVCache, ModelConfig, RMSNorm, Rotary
from ..reference.decoder_step import pack_weights
from .cached import CachedDrafter
from .head_ops import fuse_features
from .native_step import TOKEN_TABLE_LIMIT, NativeHeadStep, native_step_available


def default_feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's capture points (2, L // 2, L - 3): the one definition every part of the project uses.

    Servers capture the features in increasing layer order and once per layer, so the points must be
    distinct: when the default collides (tiny targets, L < 7) three evenly spread layers
    ``round(i * (L - 1) / 2)`` are used instead; targets with fewer than 3 layers cannot host EAGLE-3.
    """
    if num_target_layers < 3:
        raise ValueError(f"num_target_layers must be >= 3 for EAGLE-3, got {num_target_layers}")
    layers = (2, num_target_layers // 2, num_target_layers - 3)
    if not layers[0] < layers[1] < layers[2]:
        layers = tuple(int(round(i * (num_target_layers - 1) / 2)) for i in range(3))
    return layers


@dataclass
class Eagle3Config:
    """Every knob of an EAGLE-3 head. ``feature_layers`` index the target layers whose inputs are captured."""

    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    feature_layers: tuple[int, ...] = (0, 1, 2)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    fc_norm: bool = True
    qk_norm: bool = True
    max_position_embeddings: int = 4096

    def layer_config(self) -> ModelConfig:
        """The midlayer's shape as a one-layer :class:`ModelConfig` (also the head cache's shape)."""
        return ModelConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps, qk_norm=self.qk_norm)


class Eagle3Head(nn.Module):
    """The EAGLE-3 head's parameters and its cached forward (see module docstring)."""

    uses_features = True

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        if cfg.draft_vocab_size > cfg.vocab_size:
            raise ValueError("draft_vocab_size must be <= vocab_size")
        fl = tuple(cfg.feature_layers)
        if any(b <= a for a, b in zip(fl, fl[1:], strict=False)) or (fl and fl[0] < 0):
            raise ValueError(f"feature_layers must be non-negative and strictly increasing, got {fl}")
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.cfg = cfg
        self.layer_config = cfg.layer_config()
        self.vocab_size = cfg.vocab_size
        self.feature_layers = fl
        self.feature_size = len(fl) * cfg.target_hidden_size
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # shared with the target
        self.fc_norm = nn.ModuleList(
            [RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in fl]) if cfg.fc_norm else None
        self.fc = nn.Linear(self.feature_size, h, bias=False)
        self.midlayer = DecoderLayer(self.layer_config, input_size=2 * h)
        self.midlayer.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        self.set_draft_vocab(torch.arange(cfg.draft_vocab_size))

    @classmethod
    def for_target(cls, target: nn.Module, draft_vocab_size: int | None = None,
                   intermediate_size: int | None = None, feature_layers: tuple[int, ...] | None = None,
                   **overrides) -> Eagle3Head:
        """A fresh head shaped like a Qwen3 ``target`` (ours or transformers'), sharing its embedding; its
        ``lm_head`` starts as a copy of the target's output embedding rows of the draft vocabulary."""
        c = ModelConfig.from_hf(target.config) if not isinstance(target.config, ModelConfig) else target.config
        cfg = Eagle3Config(
            vocab_size=c.vocab_size, draft_vocab_size=draft_vocab_size or c.vocab_size,
            hidden_size=c.hidden_size, target_hidden_size=c.hidden_size,
            intermediate_size=intermediate_size or c.intermediate_size, num_heads=c.num_attention_heads,
            num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
            feature_layers=feature_layers or default_feature_layers(c.num_hidden_layers),
            rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, qk_norm=c.qk_norm,
            max_position_embeddings=c.max_position_embeddings, **overrides)
        head = cls(cfg).to(target.get_input_embeddings().weight.dtype)
        with torch.no_grad():
            head.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[head.draft_to_target()])
        return head

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Use the sorted, distinct ``target_ids`` [Vd] as the draft vocabulary (fills d2t and t2d)."""
        ids = torch.as_tensor(target_ids, dtype=torch.int64, device=self.d2t.device)
        if ids.shape != (self.cfg.draft_vocab_size,):
            raise ValueError(f"target_ids must have shape [{self.cfg.draft_vocab_size}], got {list(ids.shape)}")
        ids = torch.sort(ids).values
        if bool((ids[1:] == ids[:-1]).any()) or bool((ids < 0).any()) or bool((ids >= self.vocab_size).any()):
            raise ValueError(f"target_ids must be distinct ids in [0, {self.vocab_size})")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_to_target(self) -> torch.Tensor:
        """[Vd] int64 target id of every draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def project_features(self, features: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        """[..., 3 Ht] captured features -> [..., H] (per-chunk RMSNorm + fc)."""
        lead = features.shape[:-1]
        norms = None
        if self.fc_norm is not None:
            norms = torch.stack([n.weight for n in self.fc_norm])
        out = fuse_features(features.reshape(-1, features.shape[-1]), norms, self.fc.weight,
                            self.cfg.rms_norm_eps, backend)
        return out.view(*lead, -1)

    def _attn_in(self, token_ids: torch.Tensor, hidden_in: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(token_ids).to(hidden_in.dtype)
        layer = self.midlayer
        return torch.cat([layer.input_layernorm(e), layer.hidden_norm(hidden_in)], dim=-1)

    def decode(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, cache: KVCache, rows: torch.Tensor | None,
               start: torch.Tensor, kv_len: int, depth: torch.Tensor | None = None,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Cached step over rows [R, n] written at slots ``start + i`` (positions ``start + depth``):
        returns the pre-norm output [R, n, H] (what the next speculative step feeds back)."""
        r, n = token_ids.shape
        if depth is None:
            depth = torch.arange(n, device=start.device).expand(r, n)
        rope = self.rotary.tables(start[:, None] + depth, self.midlayer.inference)
        attend = CachedAttention(cache, rows, start, n, kv_len, self.cfg.num_heads, attn_mask)
        return self.midlayer(hidden_in, rope, attend, attn_in=self._attn_in(token_ids, hidden_in))

    def forward_train(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, positions: torch.Tensor, attend
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Differentiable step (no cache) under ``attend``: (pre-norm output, draft logits [B, M, Vd] float32)."""
        rope = self.rotary.tables(positions, self.midlayer.inference)
        h = self.midlayer(hidden_in, rope, attend, attn_in=self._attn_in(token_ids, hidden_in))
        return h, self.lm_head(self.norm(h)).float()

    def pack_inference(self) -> None:
        self.midlayer.pack_inference()

    @torch.no_grad()
    def native_step(self) -> NativeHeadStep | None:
        """The cached causal step as one native call (None without the extension, for a Llama-style or
        non-float32 head). Snapshots the weights: rebuild after every weight change."""
        if not (native_step_available() and self.cfg.qk_norm and self.fc.weight.dtype == torch.float32):
            return None
        layer, a, m = self.midlayer, self.midlayer.self_attn, self.midlayer.mlp
        h = self.cfg.hidden_size
        weights = pack_weights(
            layer.hidden_norm.weight, a.q_proj.weight[:, h:], a.k_proj.weight[:, h:], a.v_proj.weight[:, h:],
            a.q_norm.weight, a.k_norm.weight, a.o_proj.weight, layer.post_attention_layernorm.weight,
            m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight, self.norm.weight, self.lm_head.weight,
            self.cfg.head_dim)
        # The token half of the q/k/v projection, in the packed (interleaved) row order.
        token_w = pack_weights(layer.input_layernorm.weight, a.q_proj.weight[:, :h], a.k_proj.weight[:, :h],
                               a.v_proj.weight[:, :h], a.q_norm.weight, a.k_norm.weight, a.o_proj.weight,
                               layer.post_attention_layernorm.weight, m.gate_proj.weight, m.up_proj.weight,
                               m.down_proj.weight, self.norm.weight, self.lm_head.weight, self.cfg.head_dim)[1]
        embed, norm_w, eps = self.embed_tokens.weight, layer.input_layernorm.weight, self.cfg.rms_norm_eps
        if embed.shape[0] * token_w.shape[0] <= TOKEN_TABLE_LIMIT:
            table = F.linear(F.rms_norm(embed, (h,), norm_w, eps), token_w).contiguous()
            qkv_add = lambda tok: table[tok]
        else:
            qkv_add = lambda tok: F.linear(F.rms_norm(embed[tok], (h,), norm_w, eps), token_w)
        return NativeHeadStep(weights, self.rotary.native(), self.cfg.num_heads, eps,
                              inputs=lambda tok, hid: (hid, qkv_add(tok)))


class Eagle3Drafter(CachedDrafter):
    """An :class:`Eagle3Head` driven through the batched drafter protocol (``base.Drafter``)."""

    def __init__(self, head: Eagle3Head, backend: str = "torch", native: bool | None = None) -> None:
        super().__init__(head, backend, native)
