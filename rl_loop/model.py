"""A Qwen3-architecture causal LM in plain torch, with a KV cache, tree attention masks and a warm start.

The module's parameter names are exactly those of ``transformers.Qwen3ForCausalLM``, so
:func:`save_pretrained` writes a ``config.json`` + ``model.safetensors`` directory that transformers and
vLLM load unchanged (``head_dim`` 64: vLLM's CPU attention wants it). The forward pass is our own (not
the transformers one) because rollouts are overhead-bound on CPU: one fused path handles prefill, decode,
chain verification (k + 1 rows per request in one forward) and tree verification (ancestor masks), all
against a per-request KV cache with per-request lengths.

Math follows Qwen3: RMSNorm (float32 statistics), q/k per-head RMSNorm before RoPE (half-rotation), grouped
query attention, SwiGLU MLP, tied embeddings by default. ``tests/test_rl_model.py`` checks logits against
``transformers.Qwen3ForCausalLM`` loaded from the saved directory.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .task import CharTokenizer, Problem


@dataclass(frozen=True)
class ModelConfig:
    """Architecture knobs (a subset of ``Qwen3Config``)."""

    vocab_size: int = 32
    # Deep and narrow (1.1M parameters): on the 2-core target machine the default run's verification
    # forward of (k + 1) x 32 rows costs ~1.4x a one-token decode (per-op overhead, not matmul FLOPs,
    # dominates; a 4-layer hidden-128 policy paid ~1.9x), and one step of the one-layer drafter head costs
    # ~1/6 of a policy forward instead of ~1/3.
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

    def to_hf_dict(self, tokenizer: CharTokenizer | None = None) -> dict:
        """``config.json`` contents for ``Qwen3ForCausalLM``."""
        d = asdict(self)
        d.update(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
            attention_bias=False, attention_dropout=0.0, initializer_range=0.02, use_cache=True,
            use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers,
            torch_dtype="float32", rope_scaling=None,
        )
        if tokenizer is not None:
            d.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
        return d


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)  # one fused op (float32 models)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
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
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Backbone(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVCache:
    """Per-request key/value buffers ``[L, B, H_kv, S, D]``; request b's valid prefix is ``lengths[b]``.

    ``lengths`` lives in the caller (the engine), which knows it on the host; the cache only stores tensors.
    Compaction after verification is a length update (chain: the rejected tail is simply overwritten by
    the next forward) or :meth:`gather_positions` (tree: accepted nodes move to contiguous slots).
    """

    def __init__(self, c: ModelConfig, batch: int, max_len: int, dtype: torch.dtype = torch.float32) -> None:
        shape = (c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.max_len = max_len

    def gather_positions(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` [R, m] to ``dst`` [R, m] of the requests ``rows`` [R] in every layer."""
        r = rows[:, None].expand_as(src)
        for buf in (self.k, self.v):
            vals = buf[:, r, :, src]  # [L, R, m, H, D]
            buf[:, r, :, dst] = vals

    def reset_rows(self, rows: torch.Tensor) -> None:
        """Nothing to clear (lengths live in the engine); kept for symmetry with other cache types."""


class Qwen3(nn.Module):
    """Qwen3 causal LM (parameter names of ``Qwen3ForCausalLM``).

    :meth:`forward` runs full sequences (training, log-probs); :meth:`step` runs new tokens against a
    :class:`KVCache` (prefill, decode, chain/tree verification).
    """

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        if c.head_dim % 2:
            raise ValueError(f"head_dim must be even, got {c.head_dim}")
        self.config = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        t = torch.arange(c.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)
        # Inference path: q/k head dims interleaved as (j, j + D/2) pairs so RoPE is one complex multiply.
        self.register_buffer("rope_cis", torch.polar(torch.ones_like(freqs), freqs), persistent=False)
        half = c.head_dim // 2
        self.register_buffer("rope_perm", torch.stack([torch.arange(half), torch.arange(half) + half], 1).flatten(),
                             persistent=False)
        self.apply(self._init)
        self._fused: dict[int, tuple[torch.Tensor, ...]] = {}

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    # ------------------------------------------------------------------------------------------------
    def _layer(
        self, layer: DecoderLayer, x: torch.Tensor, rope: tuple, attend,
        cache_kv: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        c = self.config
        b, n, _ = x.shape
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        fused = self._fused.get(id(layer)) if not self.training else None
        if fused is not None:
            # Inference: one matmul for q, k, v; q/k head dims are stored interleaved (see
            # sync_inference_weights), so RoPE is a complex multiply. Attention scores are unchanged
            # because q and k are permuted alike; the KV cache holds keys in this layout.
            wqkv, wgu, qn, kn = fused
            qkv = F.linear(h, wqkv)
            nq, nk = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
            half = c.head_dim // 2
            q = F.rms_norm(qkv[..., :nq].reshape(b, n, -1, c.head_dim), (c.head_dim,), qn, c.rms_norm_eps)
            k = F.rms_norm(qkv[..., nq : nq + nk].reshape(b, n, -1, c.head_dim), (c.head_dim,), kn, c.rms_norm_eps)
            cis = rope[0]
            q = torch.view_as_real(torch.view_as_complex(q.view(b, n, -1, half, 2)) * cis).view(b, n, -1, c.head_dim)
            k = torch.view_as_real(torch.view_as_complex(k.view(b, n, -1, half, 2)) * cis).view(b, n, -1, c.head_dim)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = qkv[..., nq + nk :].reshape(b, n, -1, c.head_dim).transpose(1, 2)
        else:
            cos, sin = rope
            q = attn.q_norm(attn.q_proj(h).view(b, n, c.num_attention_heads, c.head_dim)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(h).view(b, n, c.num_key_value_heads, c.head_dim)).transpose(1, 2)
            v = attn.v_proj(h).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        o = attend(q, k, v, cache_kv)
        x = x + attn.o_proj(o.transpose(1, 2).reshape(b, n, -1))
        h = layer.post_attention_layernorm(x)
        if fused is not None:
            gate, up = F.linear(h, wgu).chunk(2, dim=-1)
            return x + layer.mlp.down_proj(F.silu(gate) * up)
        return x + layer.mlp(h)

    def _rope(self, positions: torch.Tensor, batched: bool) -> tuple:
        """RoPE tables for ``positions`` ([T] or [R, n] when ``batched``) in the layout _layer expects."""
        if self._fused and not self.training:
            cis = self.rope_cis[positions]
            return (cis[:, :, None, :] if batched else cis[None, :, None, :],)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        return (cos[:, None], sin[:, None]) if batched else (cos[None, None], sin[None, None])

    @torch.no_grad()
    def sync_inference_weights(self) -> None:
        """Rebuild the fused q/k/v and gate/up matrices used by :meth:`step` in eval mode.

        Call after every optimizer step that should reach the rollout engine (the engine does this on
        weight sync); training mode never uses them.
        """
        c, perm = self.config, self.rope_perm

        def interleave(w: torch.Tensor) -> torch.Tensor:  # rows of each head reordered by rope_perm
            return w.view(-1, c.head_dim, w.shape[-1])[:, perm].reshape(w.shape)

        self._fused = {
            id(layer): (
                torch.cat([interleave(layer.self_attn.q_proj.weight), interleave(layer.self_attn.k_proj.weight),
                           layer.self_attn.v_proj.weight]).detach().clone(),
                torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).detach().clone(),
                layer.self_attn.q_norm.weight[perm].detach().clone(),
                layer.self_attn.k_norm.weight[perm].detach().clone(),
            )
            for layer in self.model.layers
        }

    @torch.no_grad()
    def native_step_args(self, index: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Decoder layer ``index`` with the final norm and LM head, as ``specdec_kernels.native.decoder_step``
        takes them: the weight list (fused q/k/v and gate/up from :meth:`sync_inference_weights`, which must
        have run) and the RoPE table [P, D/2, 2]. Snapshots: rebuild after a weight update."""
        layer = self.model.layers[index]
        wqkv, wgu, qn, kn = self._fused[id(layer)]
        weights = [w.detach().contiguous() for w in (
            layer.input_layernorm.weight, wqkv, qn, kn, layer.self_attn.o_proj.weight,
            layer.post_attention_layernorm.weight, wgu, layer.mlp.down_proj.weight, self.model.norm.weight,
            self.lm_head.weight)]
        return weights, torch.view_as_real(self.rope_cis).contiguous()

    def forward(
        self,
        input_ids: torch.Tensor | None,
        hidden_layers: tuple[int, ...] = (),
        inputs_embeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward over whole sequences without a cache (training, log-probs).

        Args:
            input_ids: [B, T] tokens (right padding is harmless under the causal mask), or None when
                ``inputs_embeds`` [B, T, H] is given.
            hidden_layers: decoder layers whose outputs to return (each [B, T, H]; -1 = final normed state).
            positions: [T] int64 RoPE positions (default 0..T-1).
            attn_mask: [T, T] bool, True where query i may attend key j (default causal).

        Returns logits [B, T, V] float32 and the requested hidden states.
        """
        x = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        t = x.shape[1]
        if positions is None:
            if t > self.config.max_position_embeddings:
                raise ValueError(f"sequence has {t} positions, more than max_position_embeddings")
            positions = torch.arange(t)
        rope = self._rope(positions, batched=False)

        def attend(q, k, v, _):
            if attn_mask is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)

        return self._run(x, rope, attend, None, hidden_layers)

    def _run(self, x, rope, attend, cache, hidden_layers):
        hidden = {}
        for i, layer in enumerate(self.model.layers):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            x = self._layer(layer, x, rope, attend, kv)
            if i in hidden_layers:
                hidden[i] = x
        x = self.model.norm(x)
        if -1 in hidden_layers:
            hidden[-1] = x
        return self.lm_head(x).float(), [hidden[i] for i in hidden_layers]

    def step(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        rows: torch.Tensor | None,
        start: torch.Tensor,
        kv_len: int,
        depth: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        hidden_layers: tuple[int, ...] = (),
        inputs_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run ``n`` new tokens per request against the cache and append their keys/values.

        Args:
            input_ids: [R, n] new tokens (rows may be padded: padded keys land beyond the valid prefix).
            cache: the KV cache; ``rows`` [R] int64 selects its batch rows (None: all rows, R = cache batch).
            start: [R] int64 valid cache length of each row; new token i is written to slot ``start + i``.
            kv_len: attend to cache slots ``[0, kv_len)``; must be >= max(start) + n (a host int: no sync).
            depth: [R, n] int64 offset of each new token's position from ``start`` (tree nodes: depth);
                default ``arange(n)``.
            tree_mask: [R, n, n] bool, entry (i, j) true when new token i may attend to new token j
                (ancestor or self); default causal. Chain verification is the causal case.
            hidden_layers: decoder layers whose outputs to return (see :meth:`forward`).
            inputs_embeds: [R, n, H] used instead of embedding ``input_ids`` (drafter heads).

        Returns logits [R, n, V] float32 and the requested hidden states.
        """
        r, n = input_ids.shape
        if kv_len > cache.max_len:
            raise ValueError(f"kv_len={kv_len} exceeds the cache length {cache.max_len}")
        ar = torch.arange(n)
        if depth is None:
            depth = ar.expand(r, n)
        pos = start[:, None] + depth  # [R, n] RoPE positions
        rope = self._rope(pos, batched=True)
        slot = start[:, None] + ar[None, :]  # [R, n] cache slots of the new tokens
        # mask [R, 1, n, kv_len]: cached prefix, plus the new block under tree_mask (causal by default).
        keys = torch.arange(kv_len)
        if tree_mask is None:  # causal: new token i sees every slot up to its own
            mask = (keys[None, None, :] <= slot[:, :, None])[:, None]
        else:
            prefix = keys[None, None, :] < start[:, None, None]  # [R, 1, kv]
            rel = keys[None, :] - start[:, None]  # [R, kv]
            in_block = (rel >= 0) & (rel < n)
            block = tree_mask.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(r, n, kv_len))
            mask = (prefix | (in_block[:, None, :] & block))[:, None]
        rr = (torch.arange(r) if rows is None else rows)[:, None].expand(r, n)

        # Explicit attention: for these tiny shapes (a few new rows against <= a few hundred keys) it is
        # several times faster on CPU than the masked SDPA kernel, and the mask becomes one additive bias.
        bias = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, float("-inf"))
        group = self.config.num_attention_heads // self.config.num_key_value_heads
        if group > 1:  # grouped-query attention: the query heads of a group are stacked along the rows
            bias = bias.repeat(1, 1, group, 1)
        scale = self.config.head_dim ** -0.5

        def attend(q, k, v, kv):
            kc, vc = kv
            kc[rr, :, slot] = k.transpose(1, 2)
            vc[rr, :, slot] = v.transpose(1, 2)
            if rows is None:  # views, no gather
                kc, vc = kc[:, :, :kv_len], vc[:, :, :kv_len]
            else:
                kc, vc = kc[rows, :, :kv_len], vc[rows, :, :kv_len]
            hq, hk = q.shape[1], kc.shape[1]
            if hq != hk:  # grouped-query attention: query heads of one group share a key/value head
                q = q.reshape(r, hk, (hq // hk) * n, -1)
            att = torch.softmax(torch.matmul(q, kc.transpose(-1, -2)) * scale + bias, dim=-1)
            o = torch.matmul(att, vc)
            return o.reshape(r, hq, n, -1) if hq != hk else o

        x = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self._run(x, rope, attend, cache, hidden_layers)


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ----------------------------------------------------------------------------------------------------
# Save / load in the transformers layout
# ----------------------------------------------------------------------------------------------------

def save_pretrained(model: Qwen3, directory: str, tokenizer: CharTokenizer | None = None) -> None:
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
    """Load a directory written by :func:`save_pretrained` (or any Qwen3 checkpoint of the same shape)."""
    from safetensors.torch import load_file

    with open(os.path.join(directory, "config.json")) as f:
        raw = json.load(f)
    fields = ModelConfig.__dataclass_fields__
    model = Qwen3(ModelConfig(**{k: v for k, v in raw.items() if k in fields}))
    state = load_file(os.path.join(directory, "model.safetensors"))
    if model.config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state)
    return model


# ----------------------------------------------------------------------------------------------------
# Supervised warm start
# ----------------------------------------------------------------------------------------------------

def sft_batch(
    problems: list[Problem], tokenizer: CharTokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, T], target mask [B, T - 1]) for BOS + prompt + solution + EOS, loss on the response."""
    seqs, starts = [], []
    for p in problems:
        prompt = tokenizer.encode(p.prompt, bos=True)
        seqs.append(prompt + tokenizer.encode(p.solution) + [tokenizer.eos_id])
        starts.append(len(prompt))
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), t - 1, dtype=torch.bool)
    for i, (s, st) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, st - 1 : len(s) - 1] = True
    return ids, mask


def supervised_warm_start(
    model: Qwen3,
    problems: list[Problem],
    tokenizer: CharTokenizer,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    time_limit_s: float | None = None,
) -> list[float]:
    """Next-token cross-entropy on reference solutions (cosine LR), so RL starts with non-zero rewards.

    Stops after ``steps`` or ``time_limit_s`` seconds, whichever comes first. Returns the loss curve.
    """
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    losses: list[float] = []
    t0 = time.perf_counter()
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps)) * min(1.0, (step + 1) / 20)
        ids, mask = sft_batch(rng.sample(problems, min(batch_size, len(problems))), tokenizer)
        logits, _ = model(ids)
        loss = F.cross_entropy(logits[:, :-1][mask], ids[:, 1:][mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
            break
    model.eval()
    return losses
