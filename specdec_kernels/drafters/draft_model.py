"""A small external causal LM as drafter: the weights of a transformers ``Qwen3ForCausalLM`` (or a
Llama-family model) run by this package's cached decoder layers, so that the drafter shares the KV-cache,
ragged-batch and tree-attention machinery of the heads (``cached.py``).

Each cached row is one token; no target features are used (``target_features=None``).
"""

from __future__ import annotations

import torch
from torch import nn

from .cached import CachedDrafter
from .layers import DecoderLayer, KVCache, LayerConfig, RMSNorm


class DraftModelHead(nn.Module):
    """A decoder-only LM (embedding, N decoder layers, final norm, lm_head) with a cached step."""

    uses_features = False
    feature_size = 0

    def __init__(self, vocab_size: int, num_layers: int, cfg: LayerConfig) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.embed_tokens = nn.Embedding(vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, cfg.hidden_size) for _ in range(num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(vocab_size, dtype=torch.int64))

    @classmethod
    @torch.no_grad()
    def from_transformers(cls, model: nn.Module) -> DraftModelHead:
        """Copy the weights of a transformers Qwen3ForCausalLM / LlamaForCausalLM (Qwen3: q/k norms)."""
        c = model.config
        is_qwen3 = hasattr(model.model.layers[0].self_attn, "q_norm")
        lc = LayerConfig(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                         getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                         c.rms_norm_eps, float(getattr(c, "rope_theta", 10000.0)), qk_norm=is_qwen3)
        head = cls(c.vocab_size, c.num_hidden_layers, lc).to(model.dtype)
        src = model.state_dict()
        dst = {}
        for name in head.state_dict():
            if name == "d2t":
                dst[name] = head.d2t
            elif name == "lm_head.weight":
                dst[name] = model.get_output_embeddings().weight
            else:
                dst[name] = src["model." + name]
        head.load_state_dict(dst)
        head.eval()
        return head

    def project_features(self, features: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        raise TypeError("a draft model takes no target features")

    def step(self, token_ids: torch.Tensor, hidden_in: torch.Tensor | None, positions: torch.Tensor,
             slots: torch.Tensor, mask: torch.Tensor, kv: KVCache, backend: str = "torch"
             ) -> tuple[None, torch.Tensor]:
        """One cached step over rows [B, M]: (None, final-normed hidden [B, M, H])."""
        h = self.embed_tokens(token_ids)
        for i, layer in enumerate(self.layers):
            h = layer(layer.input_layernorm(h), h, positions, slots, mask, kv, i)
        return None, self.norm(h)


class DraftModelDrafter(CachedDrafter):
    """A :class:`DraftModelHead` driven through the batched drafter protocol (``base.Drafter``)."""

    def __init__(self, head: DraftModelHead | nn.Module, backend: str = "torch") -> None:
        if not isinstance(head, DraftModelHead):
            head = DraftModelHead.from_transformers(head)
        super().__init__(head, backend)
