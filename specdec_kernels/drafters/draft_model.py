"""A small external causal LM as drafter: a :class:`specdec_kernels.models.Qwen3` (or the weights of a
transformers ``Qwen3ForCausalLM`` / ``LlamaForCausalLM``) driven by the same cached-drafter machinery as
the heads (``cached.py``): KV cache, ragged batches, tree attention.

Each cached row is one token; no target features are used (``target_features=None``). A one-layer float32
Qwen3 runs its cached causal steps as one ``native.decoder_step`` call when the extension is built.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.qwen3 import CachedAttention, KVCache, Qwen3
from .cached import CachedDrafter
from .native_step import NativeHeadStep, native_step_available


class DraftModelHead(nn.Module):
    """The head protocol of ``cached.py`` over a draft language model ``lm`` (its parameters live in ``lm``)."""

    uses_features = False
    feature_size = 0
    feature_layers: tuple[int, ...] = ()

    def __init__(self, lm: Qwen3) -> None:
        super().__init__()
        self.lm = lm
        self.layer_config = lm.config
        self.vocab_size = lm.config.vocab_size
        self.register_buffer("d2t", torch.zeros(lm.config.vocab_size, dtype=torch.int64))

    @property
    def lm_head(self) -> nn.Linear:
        return self.lm.lm_head

    @property
    def norm(self) -> nn.Module:
        return self.lm.model.norm

    def project_features(self, features: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        raise TypeError("a draft model takes no target features")

    def decode(self, token_ids: torch.Tensor, hidden_in: None, cache: KVCache, rows: torch.Tensor | None,
               start: torch.Tensor, kv_len: int, depth: torch.Tensor | None = None,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Cached step over tokens [R, n]: the last layer's output before the final norm [R, n, H]."""
        r, n = token_ids.shape
        if depth is None:
            depth = torch.arange(n, device=start.device).expand(r, n)
        lm = self.lm
        rope = lm.rotary.tables(start[:, None] + depth, lm.inference)
        attend = CachedAttention(cache, rows, start, n, kv_len, lm.config.num_attention_heads, attn_mask)
        x = lm.model.embed_tokens(token_ids)
        for i, layer in enumerate(lm.model.layers):
            x = layer(x, rope, attend.at(i))
        return x

    def pack_inference(self) -> None:
        self.lm.sync_inference_weights()

    def native_step(self) -> NativeHeadStep | None:
        """One native call per cached causal step for a one-layer float32 Qwen3 (else None)."""
        c = self.lm.config
        if not (native_step_available() and c.num_hidden_layers == 1 and c.qk_norm
                and self.lm.lm_head.weight.dtype == torch.float32):
            return None
        weights, rope = self.lm.native_step_args(0)
        embed = self.lm.model.embed_tokens.weight.detach()
        return NativeHeadStep(weights, rope, c.num_attention_heads, c.rms_norm_eps,
                              inputs=lambda tok, hid: (embed[tok], None))


class DraftModelDrafter(CachedDrafter):
    """A draft LM driven through the batched drafter protocol (``base.Drafter``): a :class:`Qwen3`, a
    :class:`DraftModelHead`, or a transformers Qwen3 / Llama causal LM (its weights are copied)."""

    def __init__(self, model: nn.Module, backend: str = "torch", native: bool | None = None) -> None:
        if isinstance(model, DraftModelHead):
            head = model
        elif isinstance(model, Qwen3):
            head = DraftModelHead(model)
        else:
            head = DraftModelHead(Qwen3.from_transformers(model))
        super().__init__(head, backend, native)

    @property
    def model(self) -> Qwen3:
        return self.head.lm
