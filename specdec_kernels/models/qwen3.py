"""One Qwen3 stack for every role: the policy (target), a draft model, and the decoder layer of the EAGLE-3
and MTP drafter heads (``specdec_kernels.drafters``).

Parameter names are exactly those of ``transformers.Qwen3ForCausalLM``, so :func:`save_pretrained` writes
a ``config.json`` + ``model.safetensors`` directory that transformers and vLLM load unchanged (vLLM's CPU
attention wants ``head_dim`` 64), and :meth:`Qwen3.from_transformers` takes a transformers model's weights.
``ModelConfig.qk_norm = False`` gives the Llama-family layer (no q/k norms) of the same code.

The forward pass is our own because rollouts are overhead-bound on CPU: one fused path handles prefill,
decode, chain verification (k + 1 rows per request in one forward) and tree verification (ancestor
masks), all against a :class:`KVCache` with per-request lengths:

- :meth:`Qwen3.forward` runs whole sequences (training, log-probs; SDPA, causal or an explicit mask);
- :meth:`Qwen3.step` runs new tokens against the cache (explicit attention with an additive bias: for a
  few rows against a few hundred keys it is several times faster on CPU than masked SDPA).

In eval mode after :meth:`Qwen3.sync_inference_weights` (``DecoderLayer.pack_inference``) each layer uses
fused q/k/v and gate/up matrices with q/k head dims interleaved so RoPE is one complex multiply; the cache
then holds keys in that layout (attention scores are unchanged). Training never uses the fused copies, and
``train()`` drops them (call ``sync_inference_weights`` again after the update).

Math follows Qwen3: RMSNorm (float32 statistics), q/k per-head RMSNorm before RoPE (half rotation),
grouped-query attention, SwiGLU MLP, tied embeddings by default.

Feature capture (``capture``) uses transformers' ``output_hidden_states`` indexing: ``i < L`` is the
residual stream at the *input* of layer i (0 = the embeddings; what vLLM hands an EAGLE-3 head), ``L`` the
final normed hidden state (negative indices count from the end, as in the ``hidden_states`` tuple).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..reference.decoder_step import interleave_heads, pack_weights, rope_table


class Tokenizer(Protocol):
    """What :func:`save_pretrained` needs of a tokenizer: special ids and a ``save(directory)``."""

    bos_id: int
    eos_id: int
    pad_id: int

    def save(self, directory: str) -> None: ...


@dataclass(frozen=True)
class ModelConfig:
    """Architecture knobs (a subset of ``Qwen3Config``; ``qk_norm=False``: a Llama-family layer)."""

    vocab_size: int = 32
    hidden_size: int = 96
    intermediate_size: int = 192
    num_hidden_layers: int = 12
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    qk_norm: bool = True

    def __post_init__(self) -> None:
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads, got "
                             f"{self.num_attention_heads} and {self.num_key_value_heads}")

    def to_hf_dict(self, tokenizer: Tokenizer | None = None) -> dict:
        """``config.json`` contents for ``Qwen3ForCausalLM`` (``LlamaForCausalLM`` without q/k norms)."""
        d = asdict(self)
        d.pop("qk_norm")
        arch, model_type = ("Qwen3ForCausalLM", "qwen3") if self.qk_norm else ("LlamaForCausalLM", "llama")
        d.update(
            architectures=[arch], model_type=model_type, hidden_act="silu", attention_bias=False,
            attention_dropout=0.0, initializer_range=0.02, use_cache=True, use_sliding_window=False,
            sliding_window=None, max_window_layers=self.num_hidden_layers, torch_dtype="float32",
            rope_scaling=None, mlp_bias=False,
        )
        if tokenizer is not None:
            d.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
        return d

    @classmethod
    def from_hf(cls, hf: object) -> ModelConfig:
        """The config of a transformers ``Qwen3Config`` / ``LlamaConfig`` (object or dict)."""
        get = hf.get if isinstance(hf, dict) else lambda k, default=None: getattr(hf, k, default)
        heads = get("num_attention_heads")
        rope = get("rope_theta") or (get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), intermediate_size=get("intermediate_size"),
            num_hidden_layers=get("num_hidden_layers"), num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            max_position_embeddings=get("max_position_embeddings", 4096), rope_theta=float(rope),
            rms_norm_eps=get("rms_norm_eps", 1e-6), tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qk_norm=get("model_type", "qwen3") != "llama",
        )


class RMSNorm(nn.Module):
    """RMSNorm with float32 statistics and a learned scale (initialised to ones)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)  # one fused op
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class Rotary:
    """RoPE tables for positions ``[0, max_positions)``, float32 whatever the model's dtype (built per device
    on first use, not buffers: ``Module.to(dtype)`` must not touch them): (cos, sin) in the half-rotation
    layout and the complex ``cis`` of the interleaved (fused inference) layout."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        self.head_dim, self.max_positions, self.theta = head_dim, max_positions, theta
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if device not in self._tables:
            table = rope_table(self.max_positions, self.head_dim, self.theta).to(device)  # [P, D/2, 2]
            cos, sin = table[..., 0], table[..., 1]
            self._tables[device] = (torch.cat([cos, cos], -1), torch.cat([sin, sin], -1), torch.complex(cos, sin))
        return self._tables[device]

    def tables(self, positions: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, ...]:
        """RoPE for ``positions`` [R, n] (R may be 1 to broadcast over a batch) in the layout the layers
        expect: ``(cis [R, n, 1, D/2],)`` when ``interleaved``, else ``(cos, sin)`` [R, 1, n, D]."""
        cos, sin, cis = self._on(positions.device)
        if interleaved:
            return (cis[positions][:, :, None, :],)
        return cos[positions][:, None], sin[positions][:, None]

    def native(self) -> torch.Tensor:
        """[P, D/2, 2] (cos, sin) on the CPU, as ``native.decoder_step`` takes it."""
        return torch.view_as_real(self._on(torch.device("cpu"))[2]).contiguous()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, input_size: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(input_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(input_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(input_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One pre-norm Qwen3 decoder layer; ``input_size`` is the width of the attention input (2H for the
    EAGLE-3 midlayer, which projects ``[embedding; hidden]``), the residual stream is always H wide.

    ``forward(x, rope, attend, attn_in=None)``: ``x`` [B, n, H] is the residual stream; the attention
    input is ``input_layernorm(x)`` unless ``attn_in`` [B, n, input_size] is given (already normed).
    ``attend(q, k, v)`` takes q [B, heads, n, D], k and v [B, kv_heads, n, D] after norms and RoPE and
    returns [B, heads, n, D] (a cache writer, SDPA, ...). Returns ``x + attn + mlp``.
    """

    def __init__(self, c: ModelConfig, input_size: int | None = None) -> None:
        super().__init__()
        self.config = c
        self.self_attn = Attention(c, input_size or c.hidden_size)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.fused: tuple[torch.Tensor, ...] | None = None  # inference copies (pack_inference)

    @property
    def inference(self) -> bool:
        """Whether forward uses the fused inference weights (eval mode after :meth:`pack_inference`)."""
        return self.fused is not None and not self.training

    def train(self, mode: bool = True) -> DecoderLayer:
        """Entering training mode drops the fused copies: the weights are about to change, and a forward in
        eval mode before the next :meth:`pack_inference` must not see stale ones."""
        if mode:
            self.fused = None
        return super().train(mode)

    @torch.no_grad()
    def pack_inference(self) -> None:
        """Snapshot fused q/k/v (q/k heads interleaved) and gate/up matrices for eval-mode forwards."""
        c, a = self.config, self.self_attn
        d = c.head_dim
        ones = torch.ones(d, dtype=a.q_proj.weight.dtype, device=a.q_proj.weight.device)
        self.fused = (
            torch.cat([interleave_heads(a.q_proj.weight, d), interleave_heads(a.k_proj.weight, d), a.v_proj.weight]),
            torch.cat([self.mlp.gate_proj.weight, self.mlp.up_proj.weight]),
            interleave_heads(a.q_norm.weight, d).clone() if c.qk_norm else ones,
            interleave_heads(a.k_norm.weight, d).clone() if c.qk_norm else ones,
        )

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], attend, attn_in: torch.Tensor | None = None
                ) -> torch.Tensor:
        c = self.config
        b, n, _ = x.shape
        a = self.self_attn
        h = self.input_layernorm(x) if attn_in is None else attn_in
        fused = self.fused if self.inference else None
        if fused is not None:
            wqkv, wgu, qn, kn = fused
            qkv = F.linear(h, wqkv)
            nq, nk = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
            half = c.head_dim // 2
            q = qkv[..., :nq].reshape(b, n, -1, c.head_dim)
            k = qkv[..., nq : nq + nk].reshape(b, n, -1, c.head_dim)
            if c.qk_norm:
                q = F.rms_norm(q, (c.head_dim,), qn, c.rms_norm_eps)
                k = F.rms_norm(k, (c.head_dim,), kn, c.rms_norm_eps)
            (cis,) = rope
            q = torch.view_as_real(torch.view_as_complex(q.reshape(b, n, -1, half, 2)) * cis).view(b, n, -1, c.head_dim)
            k = torch.view_as_real(torch.view_as_complex(k.reshape(b, n, -1, half, 2)) * cis).view(b, n, -1, c.head_dim)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = qkv[..., nq + nk :].reshape(b, n, -1, c.head_dim).transpose(1, 2)
        else:
            q = a.q_proj(h).view(b, n, c.num_attention_heads, c.head_dim)
            k = a.k_proj(h).view(b, n, c.num_key_value_heads, c.head_dim)
            if c.qk_norm:
                q, k = a.q_norm(q), a.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = a.v_proj(h).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)
            cos, sin = (t.to(q.dtype) for t in rope)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        o = attend(q, k, v)
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, n, -1))
        h = self.post_attention_layernorm(x)
        if fused is not None:
            gate, up = F.linear(h, fused[1]).chunk(2, dim=-1)
            return x + self.mlp.down_proj(F.silu(gate) * up)
        return x + self.mlp(h)


class KVCache:
    """Per-request key/value buffers ``[L, B, H_kv, S, D]``; request b's valid prefix length lives with the
    caller (an engine or a drafter), which knows it on the host: the cache only stores tensors.

    Compaction after verification is a length update (chain: the rejected tail is simply overwritten by
    the next forward) or :meth:`gather_positions` (tree: accepted nodes move to contiguous slots).
    """

    def __init__(self, c: ModelConfig, batch: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        shape = (c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def gather_positions(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` [R, m] to ``dst`` [R, m] of the requests ``rows`` [R] in every layer."""
        r = rows[:, None].expand_as(src)
        for buf in (self.k, self.v):
            buf[:, r, :, dst] = buf[:, r, :, src]

    def grow(self, max_len: int) -> None:
        """Make slots ``[0, max_len)`` exist (at least doubling), keeping the contents."""
        if max_len <= self.max_len:
            return
        new = max(max_len, 2 * self.max_len)
        for name in ("k", "v"):
            old = getattr(self, name)
            buf = old.new_zeros(*old.shape[:3], new, old.shape[4])
            buf[:, :, :, : old.shape[3]] = old
            setattr(self, name, buf)

    def select(self, index: torch.Tensor) -> None:
        """Keep the batch rows ``index`` only, in that order."""
        self.k, self.v = self.k[:, index], self.v[:, index]


class CachedAttention:
    """``attend`` for :class:`DecoderLayer` against a :class:`KVCache` (see :meth:`Qwen3.step`).

    New token i of request r is written to slot ``start[r] + i`` of cache row ``rows[r]`` in layer
    ``layer`` (:meth:`at`) and attends to the slots where the mask is true: by default the causal mask
    ``slot <= start + i``; ``attn_mask`` [R, n, kv_len] bool replaces it.
    """

    def __init__(self, cache: KVCache, rows: torch.Tensor | None, start: torch.Tensor, n: int, kv_len: int,
                 num_heads: int, attn_mask: torch.Tensor | None = None) -> None:
        if kv_len > cache.max_len:
            raise ValueError(f"kv_len={kv_len} exceeds the cache length {cache.max_len}")
        r = start.shape[0]
        self.cache, self.rows, self.n, self.kv_len = cache, rows, n, kv_len
        self.slot = start[:, None] + torch.arange(n, device=start.device)[None, :]  # [R, n]
        if attn_mask is None:
            mask = (torch.arange(kv_len, device=start.device)[None, None, :] <= self.slot[:, :, None])[:, None]
        else:
            mask = attn_mask[:, None]
        self.rr = (torch.arange(r, device=start.device) if rows is None else rows)[:, None].expand(r, n)
        # One additive bias; grouped-query heads of a group are stacked along the query rows.
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=start.device).masked_fill_(~mask, float("-inf"))
        group = num_heads // cache.k.shape[2]
        self.bias = bias.repeat(1, 1, group, 1) if group > 1 else bias
        self.layer = 0

    def at(self, layer: int) -> CachedAttention:
        self.layer = layer
        return self

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.cache.k[self.layer], self.cache.v[self.layer]
        kc[self.rr, :, self.slot] = k.transpose(1, 2).to(kc.dtype)
        vc[self.rr, :, self.slot] = v.transpose(1, 2).to(vc.dtype)
        if self.rows is None:  # views, no gather
            kc, vc = kc[:, :, : self.kv_len], vc[:, :, : self.kv_len]
        else:
            kc, vc = kc[self.rows, :, : self.kv_len], vc[self.rows, :, : self.kv_len]
        r, hq, n, d = q.shape
        hk = kc.shape[1]
        if hq != hk:  # grouped-query attention: query heads of one group share a key/value head
            q = q.reshape(r, hk, (hq // hk) * n, d)
        scores = torch.matmul(q, kc.transpose(-1, -2).to(q.dtype)) * d**-0.5 + self.bias
        o = torch.matmul(torch.softmax(scores, dim=-1), vc.to(q.dtype))
        return o.reshape(r, hq, n, d) if hq != hk else o


class FullAttention:
    """``attend`` over whole sequences (no cache): causal SDPA, or SDPA under ``mask`` [T, T] / [B, T, T]."""

    def __init__(self, mask: torch.Tensor | None = None) -> None:
        self.mask = mask if mask is None or mask.dim() == 2 else mask[:, None]

    def at(self, layer: int) -> FullAttention:
        return self

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=True)


def step_mask(start: torch.Tensor, tree_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[R, n, kv_len] attention mask of ``n`` new tokens at slots ``start + i``: every cached slot before
    ``start``, and among the new tokens those where ``tree_mask`` [R, n, n] is true (ancestors and self)."""
    r, n, _ = tree_mask.shape
    keys = torch.arange(kv_len, device=start.device)
    prefix = keys[None, None, :] < start[:, None, None]
    rel = keys[None, :] - start[:, None]  # [R, kv]
    in_block = (rel >= 0) & (rel < n)
    block = tree_mask.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(r, n, kv_len))
    return prefix | (in_block[:, None, :] & block)


class Backbone(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Qwen3(nn.Module):
    """Qwen3 causal LM (parameter names of ``Qwen3ForCausalLM``); see the module docstring."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(c.head_dim, c.max_position_embeddings, c.rope_theta)
        self.apply(_init_weights)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    @property
    def inference(self) -> bool:
        return self.model.layers[0].inference if len(self.model.layers) else False

    @torch.no_grad()
    def sync_inference_weights(self) -> None:
        """Rebuild every layer's fused inference weights (call after each optimizer step that should reach
        :meth:`step` in eval mode: an engine does this on weight sync)."""
        for layer in self.model.layers:
            layer.pack_inference()

    def native_step_args(self, index: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Decoder layer ``index`` with the final norm and LM head as ``native.decoder_step`` takes them:
        the packed weight list (``reference/decoder_step.py``) and the RoPE table [P, D/2, 2]."""
        layer = self.model.layers[index]
        a, m = layer.self_attn, layer.mlp
        if not self.config.qk_norm:
            raise ValueError("native.decoder_step runs Qwen3 layers (with q/k norms)")
        weights = pack_weights(
            layer.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.q_norm.weight,
            a.k_norm.weight, a.o_proj.weight, layer.post_attention_layernorm.weight, m.gate_proj.weight,
            m.up_proj.weight, m.down_proj.weight, self.model.norm.weight, self.lm_head.weight, self.config.head_dim)
        return weights, self.rotary.native()

    def _capture(self, capture: tuple[int, ...]) -> tuple[int, ...]:
        """``capture`` as non-negative ``hidden_states`` indices (-1 = L, the final normed state)."""
        n = self.config.num_hidden_layers
        if any(not -n - 1 <= i <= n for i in capture):
            raise ValueError(f"capture indices must be in [{-n - 1}, {n}] (hidden_states indexing), got {capture}")
        return tuple(i % (n + 1) for i in capture)

    def _run(self, x, rope, attend, capture):
        hidden = {}
        for i, layer in enumerate(self.model.layers):
            if i in capture:
                hidden[i] = x
            x = layer(x, rope, attend.at(i))
        x = self.model.norm(x)
        hidden[self.config.num_hidden_layers] = x
        return self.lm_head(x).float(), [hidden[i] for i in capture]

    def forward(
        self,
        input_ids: torch.Tensor | None,
        capture: tuple[int, ...] = (),
        inputs_embeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward over whole sequences without a cache (training, log-probs).

        Args:
            input_ids: [B, T] tokens (right padding is harmless under the causal mask), or None when
                ``inputs_embeds`` [B, T, H] is given.
            capture: hidden states to return (module docstring), each [B, T, H].
            positions: [T] int64 RoPE positions (default 0..T-1).
            attn_mask: [T, T] or [B, T, T] bool, True where query i may attend key j (default causal).

        Returns logits [B, T, V] float32 and the captured hidden states.
        """
        capture = self._capture(capture)
        x = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        t = x.shape[1]
        if positions is None:
            if t > self.config.max_position_embeddings:
                raise ValueError(f"sequence has {t} positions, more than max_position_embeddings")
            positions = torch.arange(t, device=x.device)
        rope = self.rotary.tables(positions[None], self.inference)
        return self._run(x, rope, FullAttention(attn_mask), capture)

    def step(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        rows: torch.Tensor | None,
        start: torch.Tensor,
        kv_len: int,
        depth: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        capture: tuple[int, ...] = (),
        inputs_embeds: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run ``n`` new tokens per request against the cache and append their keys/values.

        Args:
            input_ids: [R, n] new tokens (rows may be padded: padded keys land beyond the valid prefix).
            cache: the KV cache; ``rows`` [R] int64 selects its batch rows (None: all rows, R = cache batch).
            start: [R] int64 valid cache length of each row; new token i is written to slot ``start + i``.
            kv_len: attend to cache slots ``[0, kv_len)``; must be >= max(start) + n (a host int: no sync).
            depth: [R, n] int64 offset of each new token's RoPE position from ``start`` (tree nodes: their
                depth); default ``arange(n)``.
            tree_mask: [R, n, n] bool, entry (i, j) true when new token i may attend to new token j
                (ancestor or self); default causal. Chain verification is the causal case.
            capture: hidden states to return (module docstring), each [R, n, H].
            inputs_embeds: [R, n, H] used instead of embedding ``input_ids``.
            attn_mask: [R, n, kv_len] bool over absolute cache slots (replaces the causal / tree mask).

        Returns logits [R, n, V] float32 and the captured hidden states.
        """
        capture = self._capture(capture)
        r, n = input_ids.shape
        if depth is None:
            depth = torch.arange(n, device=start.device).expand(r, n)
        if tree_mask is not None and attn_mask is None:
            attn_mask = step_mask(start, tree_mask, kv_len)
        rope = self.rotary.tables(start[:, None] + depth, self.inference)
        attend = CachedAttention(cache, rows, start, n, kv_len, self.config.num_attention_heads, attn_mask)
        x = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self._run(x, rope, attend, capture)

    @classmethod
    @torch.no_grad()
    def from_transformers(cls, model: nn.Module) -> Qwen3:
        """A copy of a transformers ``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` (same parameter names)."""
        ours = cls(ModelConfig.from_hf(model.config)).to(next(model.parameters()).dtype)
        state = dict(model.state_dict())
        if ours.config.tie_word_embeddings:
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        ours.load_state_dict(state)
        return ours.eval()


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def save_pretrained(model: Qwen3, directory: str, tokenizer: Tokenizer | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (+ tokenizer files) loadable by transformers and vLLM."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(model.config.to_hf_dict(tokenizer), f, indent=1)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        gen = {} if tokenizer is None else {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}
        json.dump(gen, f)
    if tokenizer is not None:
        tokenizer.save(directory)


def load_pretrained(directory: str) -> Qwen3:
    """Load a directory written by :func:`save_pretrained` (or any Qwen3 / Llama checkpoint of that layout)."""
    from safetensors.torch import load_file

    with open(os.path.join(directory, "config.json")) as f:
        model = Qwen3(ModelConfig.from_hf(json.load(f)))
    state = load_file(os.path.join(directory, "model.safetensors"))
    if model.config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state)
    return model
