"""Building blocks shared by the drafter heads: RMSNorm, rotary embedding, a KV cache with per-sequence
lengths, and a Llama-style decoder layer that attends over that cache under an explicit mask.

Parameter names follow the Llama/vLLM convention (``self_attn.q_proj``, ``mlp.gate_proj``,
``input_layernorm`` ...) so that heads can be saved in the layout vLLM loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, returned in ``x``'s dtype (Llama/Qwen3 convention)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf).to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale (``weight``), initialised to ones."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply neox-style rotary embedding to ``x`` [B, heads, M, d] at ``positions`` [B, M]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None, :, None] * inv_freq  # [B, 1, M, d/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


@dataclass
class LayerConfig:
    """Shape of one decoder layer (``input_size`` is 2H for EAGLE-3's first layer, H otherwise)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before rotary


class KVCache:
    """Per-layer K/V buffers ``[B, n_kv, capacity, head_dim]`` plus committed lengths ``[B]``.

    Slots ``< length[b]`` are committed; speculative rows are written after them and simply overwritten
    by the next commit. ``bound`` is a host-side upper bound on every slot in use, so growing the buffers
    never needs a device-to-host sync.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, capacity: int = 64) -> None:
        shape = (batch, num_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = torch.zeros(batch, dtype=torch.int64, device=device)
        self.bound = 0

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def ensure(self, slots_needed: int) -> None:
        """Grow the buffers (doubling) so that slots ``[0, slots_needed)`` exist."""
        cap = self.capacity
        if slots_needed <= cap:
            return
        new_cap = max(slots_needed, 2 * cap)
        for buf in (self.k, self.v):
            for i, t in enumerate(buf):
                grown = t.new_zeros(t.shape[0], t.shape[1], new_cap, t.shape[3])
                grown[:, :, :cap] = t
                buf[i] = grown

    def select(self, index: torch.Tensor) -> None:
        """Keep the sequences ``index`` only."""
        self.k = [t[index] for t in self.k]
        self.v = [t[index] for t in self.v]
        self.length = self.length[index]


class DecoderLayer(nn.Module):
    """Llama-style pre-norm decoder layer attending over a :class:`KVCache` with an explicit mask.

    ``forward(x, residual, positions, slots, mask, kv, layer)``: ``x`` [B, M, input_size] (already
    normed), ``residual`` [B, M, H]; writes the new K/V rows at ``slots`` [B, M] and attends from each
    row to the slots where ``mask`` [B, M, S] is True (S <= capacity). Returns the pre-norm output
    ``residual + attn + mlp`` [B, M, H].
    """

    def __init__(self, cfg: LayerConfig, input_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        attn = nn.Module()
        attn.q_proj = nn.Linear(input_size, nh * d, bias=False)
        attn.k_proj = nn.Linear(input_size, nkv * d, bias=False)
        attn.v_proj = nn.Linear(input_size, nkv * d, bias=False)
        attn.o_proj = nn.Linear(nh * d, h, bias=False)
        if cfg.qk_norm:
            attn.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            attn.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = attn
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.mlp = mlp

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        b, m, _ = x.shape
        a = self.self_attn
        q = a.q_proj(x).view(b, m, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(b, m, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(b, m, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        if cfg.qk_norm:
            q, k = a.q_norm(q), a.k_norm(k)
        return rotary(q, positions, cfg.rope_theta), rotary(k, positions, cfg.rope_theta), v

    def _finish(self, q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor,
                residual: torch.Tensor) -> torch.Tensor:
        b, _, m, _ = q.shape
        rep = self.cfg.num_heads // self.cfg.num_kv_heads
        if rep > 1:
            keys = keys.repeat_interleave(rep, dim=1)
            vals = vals.repeat_interleave(rep, dim=1)
        att = F.scaled_dot_product_attention(q, keys.to(q.dtype), vals.to(q.dtype), attn_mask=mask[:, None])
        h = residual + self.self_attn.o_proj(att.transpose(1, 2).reshape(b, m, -1))
        y = self.post_attention_layernorm(h)
        y = self.mlp.down_proj(F.silu(self.mlp.gate_proj(y)) * self.mlp.up_proj(y))
        return h + y

    def forward(self, x: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor, kv: KVCache, layer: int) -> torch.Tensor:
        q, k, v = self._qkv(x, positions)
        b, nkv, m, d = k.shape
        idx = slots[:, None, :, None].expand(b, nkv, m, d)
        kv.k[layer].scatter_(2, idx, k.to(kv.k[layer].dtype))
        kv.v[layer].scatter_(2, idx, v.to(kv.v[layer].dtype))
        s = mask.shape[-1]
        return self._finish(q, kv.k[layer][:, :, :s], kv.v[layer][:, :, :s], mask, residual)

    def forward_train(self, x: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]
                      ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Differentiable cache-free variant: attends to ``past`` (K, V) blocks then its own rows.

        ``mask`` [B, M, S] covers the concatenation of the past blocks and the new rows (S = sum + M).
        Returns the output and this call's (K, V) so later unroll steps can attend to it.
        """
        q, k, v = self._qkv(x, positions)
        keys = torch.cat([p[0] for p in past] + [k], dim=2)
        vals = torch.cat([p[1] for p in past] + [v], dim=2)
        return self._finish(q, keys, vals, mask, residual), (k, v)
