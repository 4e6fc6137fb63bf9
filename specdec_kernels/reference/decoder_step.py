"""The fused decoder-layer step (``specdec_kernels.native.decoder_step``) as readable torch: the spec.

One call = one Qwen3 decoder layer over ``n`` new tokens per request against the request's KV cache, then
the final RMSNorm and the LM head: what a one-layer drafter head (EAGLE-3, MTP, a one-layer draft model)
runs per draft step. The native CPU kernel must return the same logits, layer outputs and cache writes to
float32 rounding (``tests/kernels/test_decoder_step.py``).

Weight packing (:func:`pack_weights`): the ten tensors the op takes, in order,

    input norm [H], qkv [(heads + 2 kv_heads) D, Hin], q_norm [D], k_norm [D], o_proj [H, heads D],
    post-attention norm [H], gate_up [2 I, H] (gate rows first), down [H, I], final norm [H], lm_head [V, H]

with every q and k head's rows (and the q/k norm weights) reordered ``(0, D/2, 1, D/2 + 1, ...)``
(:func:`interleave_heads`), so that the half-rotation RoPE of Qwen3 becomes a rotation of adjacent pairs
``(x_2j, x_2j+1)`` by the angle of frequency j. Attention scores are unchanged because q and k are
permuted alike; the cache holds keys in this layout. ``rope`` [P, D/2, 2] holds (cos, sin) per position
and pair (:func:`rope_table`).

``qkv_add`` [R, n, (heads + 2 kv_heads) D] (optional) is added to the q/k/v projection before the q/k
norms: an EAGLE-3 layer projects the concatenation ``[input_layernorm(embed(token)); hidden_norm(h)]``,
whose token half is a per-token table computed once per weight sync (see
``specdec_kernels.drafters.eagle3``), while ``x`` = h is both the normed input and the residual.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NUM_WEIGHTS = 10


def interleave_heads(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows (or entries, for a 1-D weight) of every head of ``weight`` [heads * D, ...] or [D] reordered
    ``(0, D/2, 1, D/2 + 1, ...)``: RoPE's half rotation becomes a rotation of adjacent pairs."""
    half = head_dim // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], 1).flatten().to(weight.device)
    if weight.dim() == 1:
        return weight[perm]
    return weight.reshape(-1, head_dim, *weight.shape[1:])[:, perm].reshape(weight.shape)


def rope_table(max_positions: int, head_dim: int, theta: float) -> torch.Tensor:
    """[P, D/2, 2] float32 (cos, sin) of position p and frequency j = theta ** (-2j / D)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    return torch.stack([ang.cos(), ang.sin()], -1).contiguous()


def pack_weights(
    input_norm: torch.Tensor, q_proj: torch.Tensor, k_proj: torch.Tensor, v_proj: torch.Tensor,
    q_norm: torch.Tensor, k_norm: torch.Tensor, o_proj: torch.Tensor, post_norm: torch.Tensor,
    gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor, final_norm: torch.Tensor,
    lm_head: torch.Tensor, head_dim: int,
) -> list[torch.Tensor]:
    """The op's ten weights (module docstring) from one Qwen3 layer's ``nn.Linear``-layout matrices."""
    qkv = torch.cat([interleave_heads(q_proj, head_dim), interleave_heads(k_proj, head_dim), v_proj])
    weights = [input_norm, qkv, interleave_heads(q_norm, head_dim), interleave_heads(k_norm, head_dim), o_proj,
               post_norm, torch.cat([gate_proj, up_proj]), down_proj, final_norm, lm_head]
    return [w.detach().float().contiguous() for w in weights]


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` [..., D] by (cos, sin) [..., D/2]."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


def decoder_step(
    x: torch.Tensor, weights: list[torch.Tensor], k_cache: torch.Tensor, v_cache: torch.Tensor,
    rows: torch.Tensor, start: torch.Tensor, depth: torch.Tensor, rope: torch.Tensor, num_heads: int,
    eps: float, qkv_add: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer + final norm + LM head over ``x`` [R, n, H] (see the module docstring).

    Request r uses cache row ``rows[r]`` of ``k_cache`` / ``v_cache`` [B, kv_heads, S, D]; new token i is
    written to slot ``start[r] + i``, attends to slots ``[0, start[r] + i]`` and sits at RoPE position
    ``start[r] + depth[r, i]``. Returns logits [R, n, V] and the layer output before the final norm
    [R, n, H]; the cache rows are updated in place.
    """
    w_in, w_qkv, w_qn, w_kn, w_o, w_post, w_gu, w_down, w_norm, w_head = weights
    reqs, n, hidden = x.shape
    kv_heads, d = k_cache.shape[1], k_cache.shape[3]
    res = x.reshape(reqs * n, hidden).float()
    qkv = F.rms_norm(res, (hidden,), w_in, eps) @ w_qkv.t()
    if qkv_add is not None:
        qkv = qkv + qkv_add.reshape(reqs * n, -1)
    q, k, v = qkv.split([num_heads * d, kv_heads * d, kv_heads * d], -1)
    pos = (start[:, None] + depth).reshape(-1)
    cos, sin = rope[pos, :, 0][:, None], rope[pos, :, 1][:, None]
    q = _rotate_pairs(F.rms_norm(q.view(-1, num_heads, d), (d,), w_qn, eps), cos, sin)
    k = _rotate_pairs(F.rms_norm(k.view(-1, kv_heads, d), (d,), w_kn, eps), cos, sin)
    slot = start[:, None] + torch.arange(n)[None, :]  # [R, n]
    row = rows[:, None].expand(reqs, n)
    k_cache[row, :, slot] = k.view(reqs, n, kv_heads, d)
    v_cache[row, :, slot] = v.view(reqs, n, kv_heads, d)
    kv_len = int(slot.max()) + 1
    keys, vals = k_cache[rows, :, :kv_len], v_cache[rows, :, :kv_len]  # [R, kv_heads, S, D]
    group = num_heads // kv_heads
    keys, vals = keys.repeat_interleave(group, 1), vals.repeat_interleave(group, 1)
    qh = q.view(reqs, n, num_heads, d).transpose(1, 2)  # [R, heads, n, D]
    visible = torch.arange(kv_len)[None, None, :] <= slot[:, :, None]  # [R, n, S]
    scores = (qh @ keys.transpose(-1, -2)) * d**-0.5
    att = torch.softmax(scores.masked_fill(~visible[:, None], float("-inf")), -1)
    o = (att @ vals).transpose(1, 2).reshape(reqs * n, num_heads * d)
    res = res + o @ w_o.t()
    gate, up = (F.rms_norm(res, (hidden,), w_post, eps) @ w_gu.t()).chunk(2, -1)
    res = res + (F.silu(gate) * up) @ w_down.t()
    logits = F.rms_norm(res, (hidden,), w_norm, eps) @ w_head.t()
    return logits.view(reqs, n, -1), res.view(reqs, n, hidden)
