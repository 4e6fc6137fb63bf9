"""One driver for every KV-cached drafter: prefill / commit / chain and tree proposals (base.Drafter).

A head (nn.Module) supplies four things; the driver does batching, ragged lengths, cache slots, masks,
positions, vocabulary mapping and sampling:

- ``head.step(token_ids [B, M], hidden_in [B, M, H] | None, positions [B, M], slots [B, M],
  mask [B, M, S], kv, backend) -> (hidden_out [B, M, H] | None, normed [B, M, H])``;
- ``head.project_features(features [B, T, F], backend) -> [B, T, H]`` (feature heads only);
- ``head.lm_head.weight`` [Vd, H], ``head.d2t`` [Vd] int64; ``head.vocab_size``, ``head.feature_size``;
- ``head.uses_features``: True for EAGLE-3 / MTP (a row pairs the target's features at position t with
  the token at t + 1, as in EAGLE), False for a draft model (a row is one token).

Cache slot s holds row s; a row's rotary position equals its slot. Speculative tree nodes are written
after the committed rows and attend to the committed rows and to their own ancestors only.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .base import Drafter, TreeProposal
from .head_ops import head_sample, head_topk
from .layers import KVCache


def _check_int_tensor(name: str, t: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    return t.to(torch.int64)


class CachedDrafter(Drafter):
    """Drives a drafter head (see module docstring) with a per-sequence KV cache.

    ``backend``: "torch" (eager) or "triton" (fused head kernels; GPU or TRITON_INTERPRET=1).
    """

    def __init__(self, head: nn.Module, backend: str = "torch") -> None:
        if backend not in ("torch", "triton"):
            raise ValueError(f"backend must be 'torch' or 'triton', got {backend!r}")
        self.head = head
        self.backend = backend
        self.vocab_size = int(head.vocab_size)
        self.draft_vocab_size = int(head.lm_head.weight.shape[0])
        self.feature_size = int(head.feature_size)
        self.kv: KVCache | None = None

    # ------------------------------------------------------------------------------------ state
    @property
    def num_tokens(self) -> torch.Tensor:
        self._require_state()
        return self._num_tokens

    def _require_state(self) -> None:
        if self.kv is None:
            raise RuntimeError("call prefill() before propose()/commit()")

    def select(self, batch_index: torch.Tensor) -> None:
        self._require_state()
        idx = batch_index.to(torch.int64)
        self.kv.select(idx)
        self.kv.bound = int(self.kv.length.max()) if idx.numel() else 0
        self._num_tokens = self._num_tokens[idx]
        self._last_token = self._last_token[idx]
        self._root_hn = self._root_hn[idx]
        if self._root_hidden is not None:
            self._root_hidden = self._root_hidden[idx]

    # ------------------------------------------------------------------ slots (continuous batching)
    def reset(self, num_slots: int) -> None:
        """Start an empty batch of ``num_slots`` sequences; fill slots with :meth:`admit`."""
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        w = self.head.lm_head.weight
        self.kv = KVCache(self.head.num_layers, num_slots, self.head.num_kv_heads, self.head.head_dim,
                          w.dtype, w.device)
        self._num_tokens = torch.zeros(num_slots, dtype=torch.int64, device=w.device)
        self._last_token = torch.zeros(num_slots, dtype=torch.int64, device=w.device)
        self._root_hn = w.new_zeros(num_slots, w.shape[1])
        self._root_hidden = w.new_zeros(num_slots, w.shape[1]) if self.head.uses_features else None

    def subset(self, rows: torch.Tensor) -> CachedDrafter:
        """A drafter holding copies of the state of sequences ``rows`` [R] (propose/commit on it, then
        write it back with :meth:`update`)."""
        self._require_state()
        idx = rows.to(torch.int64)
        sub = copy.copy(self)
        sub.kv = copy.copy(self.kv)
        sub.kv.k, sub.kv.v, sub.kv.length = list(self.kv.k), list(self.kv.v), self.kv.length
        sub.select(idx)
        return sub

    def update(self, rows: torch.Tensor, sub: CachedDrafter) -> None:
        """Write the state of ``sub`` (from :meth:`subset` or a prefilled drafter) into sequences ``rows``."""
        self._require_state()
        sub._require_state()
        idx = rows.to(torch.int64)
        self.kv.ensure(sub.kv.capacity)
        cap = sub.kv.capacity
        for layer in range(len(self.kv.k)):
            self.kv.k[layer][idx, :, :cap] = sub.kv.k[layer]
            self.kv.v[layer][idx, :, :cap] = sub.kv.v[layer]
        self.kv.length = self.kv.length.index_copy(0, idx, sub.kv.length)
        self.kv.bound = max(self.kv.bound, sub.kv.bound)
        self._num_tokens = self._num_tokens.index_copy(0, idx, sub._num_tokens)
        self._last_token = self._last_token.index_copy(0, idx, sub._last_token)
        self._root_hn = self._root_hn.index_copy(0, idx, sub._root_hn)
        if self._root_hidden is not None:
            self._root_hidden = self._root_hidden.index_copy(0, idx, sub._root_hidden)

    def admit(self, rows: torch.Tensor, input_ids: torch.Tensor, lengths: torch.Tensor,
              next_token_ids: torch.Tensor, target_features: torch.Tensor | None) -> None:
        """Prefill new sequences into slots ``rows`` [R] of the running batch (arguments as :meth:`prefill`
        with R sequences); the other slots are untouched."""
        self._require_state()
        fresh = copy.copy(self)
        fresh.kv = None
        fresh.prefill(input_ids, lengths, next_token_ids, target_features)
        self.update(rows, fresh)

    def _check_features(self, feats: torch.Tensor | None, b: int, rows: int) -> torch.Tensor | None:
        if not self.head.uses_features:
            return None
        if not isinstance(feats, torch.Tensor):
            raise TypeError("target_features must be a tensor [B, rows, F] for this drafter")
        if feats.dim() != 3 or feats.shape[0] != b or feats.shape[1] < rows or feats.shape[2] != self.feature_size:
            raise ValueError(
                f"target_features must have shape [{b}, >={rows}, {self.feature_size}], got {list(feats.shape)}")
        return feats[:, :rows]

    # ------------------------------------------------------------------------------------ protocol
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, lengths: torch.Tensor, next_token_ids: torch.Tensor,
                target_features: torch.Tensor | None) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError("input_ids must be a tensor [B, L] with L >= 1")
        b, seq = input_ids.shape
        ids = _check_int_tensor("input_ids", input_ids, (b, seq))
        lengths = _check_int_tensor("lengths", lengths, (b,))
        nxt = _check_int_tensor("next_token_ids", next_token_ids, (b,))
        if bool(((lengths < 1) | (lengths > seq)).any()):
            raise ValueError(f"lengths must be in [1, {seq}]")
        for name, t in (("input_ids", ids), ("next_token_ids", nxt)):
            if bool(((t < 0) | (t >= self.vocab_size)).any()):
                raise ValueError(f"{name} must be in [0, {self.vocab_size})")
        feats = self._check_features(target_features, b, seq)
        w = self.head.lm_head.weight
        self.kv = KVCache(self.head.num_layers, b, self.head.num_kv_heads, self.head.head_dim,
                          w.dtype, w.device, capacity=max(64, seq + 16))
        ar = torch.arange(b, device=ids.device)
        if self.head.uses_features:
            rows = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
            rows[ar, lengths - 1] = nxt
            count = lengths
        else:
            rows = torch.cat([ids, torch.zeros_like(ids[:, :1])], dim=1)
            rows[ar, lengths] = nxt
            count = lengths + 1
        self._num_tokens = lengths + 1
        self._last_token = nxt.clone()
        self._extend(rows, feats, count)

    @torch.no_grad()
    def commit(self, num_accepted: torch.Tensor, output_token_ids: torch.Tensor,
               target_features: torch.Tensor | None) -> None:
        self._require_state()
        b = self._num_tokens.shape[0]
        if not isinstance(output_token_ids, torch.Tensor) or output_token_ids.dim() != 2:
            raise ValueError("output_token_ids must be a tensor [B, K + 1]")
        width = output_token_ids.shape[1]
        out = _check_int_tensor("output_token_ids", output_token_ids, (b, width))
        n = _check_int_tensor("num_accepted", num_accepted, (b,))
        if bool(((n < 0) | (n >= width)).any()):
            raise ValueError(f"num_accepted must be in [0, {width - 1}]")
        ar = torch.arange(b, device=out.device)
        valid = torch.arange(width, device=out.device)[None, :] <= n[:, None]
        if bool((valid & ((out < 0) | (out >= self.vocab_size))).any()):
            raise ValueError(f"output_token_ids[:, :num_accepted + 1] must be in [0, {self.vocab_size})")
        feats = self._check_features(target_features, b, width)
        rows = torch.where(valid, out, torch.zeros_like(out))
        self._last_token = rows[ar, n]
        self._num_tokens = self._num_tokens + n + 1
        self._extend(rows, feats, n + 1)

    def _extend(self, rows: torch.Tensor, feats: torch.Tensor | None, count: torch.Tensor) -> None:
        """Append ``count[b]`` of the ``rows`` [B, T] (and their features) to each sequence's cache."""
        kv = self.kv
        b, t = rows.shape
        kv.ensure(kv.bound + t)
        slots = kv.length[:, None] + torch.arange(t, device=rows.device)[None, :]
        span = kv.bound + t
        mask = torch.arange(span, device=rows.device)[None, None, :] <= slots[:, :, None]
        hidden_in = None
        if feats is not None:
            hidden_in = self.head.project_features(feats, self.backend)
        h_out, hn = self.head.step(rows, hidden_in, slots, slots, mask, kv, self.backend)
        ar = torch.arange(b, device=rows.device)
        self._root_hn = hn[ar, count - 1]
        self._root_hidden = None if h_out is None else h_out[ar, count - 1]
        kv.length = kv.length + count
        kv.bound = int(kv.length.max())  # one host sync per round: bounds the attention span

    @torch.no_grad()
    def propose_tree(self, depth: int, top_k: int, beam_width: int,
                     temperature: torch.Tensor | None = None, seed: torch.Tensor | None = None,
                     position: torch.Tensor | None = None) -> TreeProposal:
        self._require_state()
        for name, val in (("depth", depth), ("top_k", top_k), ("beam_width", beam_width)):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        if top_k > self.draft_vocab_size:
            raise ValueError(f"top_k must be <= draft_vocab_size={self.draft_vocab_size}, got {top_k}")
        b = self._num_tokens.shape[0]
        dev = self._num_tokens.device
        sampled = temperature is not None
        if sampled:
            if not isinstance(temperature, torch.Tensor) or tuple(temperature.shape) != (b,):
                raise ValueError(f"temperature must be a tensor of shape [{b}]")
            if not temperature.is_floating_point():
                raise TypeError("temperature must be a floating-point tensor")
            if bool((~torch.isfinite(temperature) | (temperature < 0)).any()):
                raise ValueError("temperature must be finite and >= 0")
            if seed is None:
                raise ValueError("seed [B] is required when temperature is given")
            seed = _check_int_tensor("seed", seed, (b,))
            position = self._num_tokens if position is None else _check_int_tensor("position", position, (b,))
            temperature = temperature.float()

        # Level sizes are data independent, so every sequence gets the same N.
        expand = [1]
        sizes = [top_k]
        for _ in range(1, depth):
            expand.append(min(beam_width, sizes[-1]))
            sizes.append(expand[-1] * top_k)
        n_nodes = 1 + sum(sizes)
        n_scratch = sum(expand[1:])

        tokens = torch.zeros(b, n_nodes, dtype=torch.int64, device=dev)
        parent = torch.full((b, n_nodes), -1, dtype=torch.int64, device=dev)
        node_depth = torch.zeros(b, n_nodes, dtype=torch.int64, device=dev)
        logp = torch.zeros(b, n_nodes, dtype=torch.float32, device=dev)
        tokens[:, 0] = self._last_token
        probs = torch.zeros(b, n_nodes, self.vocab_size, device=dev) if sampled else None
        hsize = self._root_hn.shape[-1]
        node_hidden = self._root_hn.new_zeros(b, n_nodes, hsize)
        anc = torch.zeros(b, n_nodes, max(n_scratch, 1), dtype=torch.bool, device=dev)

        kv = self.kv
        kv.ensure(kv.bound + n_scratch)
        base = kv.length
        span = kv.bound + n_scratch
        key = torch.arange(span, device=dev)
        rel = key[None, :] - base[:, None]  # [B, span] scratch index of each key slot
        in_scratch = (rel >= 0) & (rel < n_scratch)
        committed = rel < 0
        ar = torch.arange(b, device=dev)[:, None]
        w = self.head.lm_head.weight
        d2t = self.head.d2t

        lo, hi = 0, 1  # node range of the previous level
        used = 0
        nxt = 1
        for d in range(1, depth + 1):
            e = expand[d - 1]
            if d == 1:
                exp_idx = torch.zeros(b, 1, dtype=torch.int64, device=dev)
                hn = self._root_hn[:, None]
            else:
                sel = torch.topk(logp[:, lo:hi], e, dim=1).indices.sort(dim=1).values
                exp_idx = lo + sel
                par = parent.gather(1, exp_idx)
                own = torch.zeros(b, e, anc.shape[-1], dtype=torch.bool, device=dev)
                own[:, torch.arange(e, device=dev), used + torch.arange(e, device=dev)] = True
                anc_new = anc[ar, par] | own
                anc[ar, exp_idx] = anc_new
                att = anc_new.gather(2, rel.clamp(0, anc.shape[-1] - 1)[:, None, :].expand(b, e, span))
                mask = committed[:, None, :] | (in_scratch[:, None, :] & att)
                hidden_in = None
                if self._root_hidden is not None:
                    hidden_in = torch.where((par == 0)[..., None], self._root_hidden[:, None],
                                            node_hidden[ar, par])
                slots = base[:, None] + used + torch.arange(e, device=dev)[None, :]
                positions = (base - 1 + (d - 1))[:, None].expand(b, e)
                h_out, hn = self.head.step(tokens.gather(1, exp_idx), hidden_in, positions, slots, mask, kv,
                                           self.backend)
                if h_out is not None:
                    node_hidden[ar, exp_idx] = h_out
                used += e
            flat = hn.reshape(b * e, hsize)
            if sampled:
                s = head_sample(flat, w, d2t, self.vocab_size, temperature.repeat_interleave(e),
                                seed.repeat_interleave(e), (position + (d - 1)).repeat_interleave(e), top_k,
                                self.backend)
                probs[ar, exp_idx] = s.q.view(b, e, -1)
                ids, lp = s.target_ids, s.log_probs
            else:
                ids, lp = head_topk(flat, w, d2t, top_k, self.backend)
            cnt = e * top_k
            rng = slice(nxt, nxt + cnt)
            tokens[:, rng] = ids.view(b, cnt)
            parent[:, rng] = exp_idx.repeat_interleave(top_k, dim=1)
            node_depth[:, rng] = d
            logp[:, rng] = logp.gather(1, exp_idx).repeat_interleave(top_k, dim=1) + lp.view(b, cnt)
            lo, hi = nxt, nxt + cnt
            nxt += cnt
        return TreeProposal(tokens, parent, node_depth, logp, probs)
