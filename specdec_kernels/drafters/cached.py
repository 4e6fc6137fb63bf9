"""One driver for every KV-cached drafter: slots, prefill / commit, chain and tree proposals (base.Drafter).

A head (nn.Module) supplies the model; the driver does batching, ragged lengths, cache slots, masks,
positions, vocabulary mapping and sampling. What a head provides:

- ``head.decode(token_ids [R, n], hidden_in [R, n, H] | None, cache, rows, start [R], kv_len,
  depth [R, n] | None, attn_mask [R, n, kv_len] | None) -> hidden_out [R, n, H]`` (before the final
  norm): rows written at cache slots ``start + i``, RoPE positions ``start + depth`` (default: the slot),
  causal by slot unless ``attn_mask`` is given;
- ``head.project_features(features [B, T, F], backend) -> [B, T, H]`` (feature heads only);
- ``head.norm``, ``head.lm_head.weight`` [Vd, H], ``head.d2t`` [Vd] int64, ``head.vocab_size``,
  ``head.feature_size``, ``head.feature_layers`` (what the target must capture, ``features.py``),
  ``head.layer_config`` (the cache's shape), ``head.pack_inference()`` (fused eval weights) and
  ``head.native_step()`` (the causal step as one native call, or None);
- ``head.uses_features``: True for EAGLE-3 / MTP (a row pairs the target's features at position t with
  the token at t + 1, as in EAGLE), False for a draft model (a row is one token).

Cache slot s holds row s; a row's rotary position equals its slot. Chain drafts are written after the
committed rows (causal: one native call per draft step when available); tree nodes are written after
the committed rows and attend to the committed rows and to their own ancestors only.

Slots (continuous batching): :meth:`CachedDrafter.reset` starts ``num_slots`` empty slots,
:meth:`CachedDrafter.admit` prefills sequences into some of them, and ``propose`` / ``propose_tree`` /
``commit`` take ``rows`` [R] to work on a subset in place (None: every slot).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.qwen3 import KVCache
from .base import Drafter, DraftProposal, TreeProposal, draft_uniforms
from .head_ops import head_sample, head_topk, logits_sample, logits_topk


def _check_int_tensor(name: str, t: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    return t.to(torch.int64)


class CachedDrafter(Drafter):
    """Drives a drafter head (see module docstring) with a per-slot KV cache.

    ``backend``: "torch" (eager) or "triton" (fused head kernels; GPU or TRITON_INTERPRET=1).
    ``native``: run causal head steps as one ``native.decoder_step`` call (None: whenever the head
    supports it and the backend is "torch"; False: always the torch ops; same math, tested).
    """

    def __init__(self, head: nn.Module, backend: str = "torch", native: bool | None = None) -> None:
        if backend not in ("torch", "triton"):
            raise ValueError(f"backend must be 'torch' or 'triton', got {backend!r}")
        self.head = head
        self.backend = backend
        self.native = native
        self.vocab_size = int(head.vocab_size)
        self.draft_vocab_size = int(head.lm_head.weight.shape[0])
        self.feature_size = int(head.feature_size)
        self.feature_layers = tuple(head.feature_layers)
        self.cache: KVCache | None = None
        self.kernel = None

    def __getstate__(self) -> dict:
        """Pickles (Ray actors, deep copies) carry the head, not the per-call state or the native step."""
        state = dict(self.__dict__)
        state.update(cache=None, kernel=None)
        return state

    def trainable(self) -> nn.Module:
        """The module whose parameters training updates (the head; for a draft model the LM)."""
        return getattr(self.head, "lm", self.head)

    # ------------------------------------------------------------------------------------ state
    @property
    def num_tokens(self) -> torch.Tensor:
        self._require_state()
        return self._num_tokens

    def _require_state(self) -> None:
        if self.cache is None:
            raise RuntimeError("call prefill() (or reset() and admit()) before propose()/commit()")

    def reset(self, num_slots: int, max_len: int | None = None) -> None:
        """Start ``num_slots`` empty slots (fill them with :meth:`admit`); ``max_len``: the most cache rows
        a slot will hold (None: grow on demand). Snapshots the head's inference weights (and the native
        step): call after every weight update."""
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        head = self.head
        w = head.lm_head.weight
        head.eval()
        head.pack_inference()
        use_native = self.backend == "torch" if self.native is None else self.native
        self.kernel = head.native_step() if use_native else None
        if self.native and self.kernel is None:
            raise RuntimeError("native=True, but this head has no native step (extension missing, Llama-style "
                               "or non-float32 head)")
        self.cache = KVCache(head.layer_config, num_slots, max_len or 64, dtype=w.dtype, device=w.device)
        self._grows = max_len is None
        self._length = torch.zeros(num_slots, dtype=torch.int64, device=w.device)
        self._bound = 0  # host-side max of _length (no device sync to size an attention span)
        self._num_tokens = torch.zeros(num_slots, dtype=torch.int64, device=w.device)
        self._last_token = torch.zeros(num_slots, dtype=torch.int64, device=w.device)
        hsize = head.layer_config.hidden_size
        self._root_h = w.new_zeros(num_slots, hsize)
        width = hsize if self.backend == "triton" else self.draft_vocab_size
        self._root_x = w.new_zeros(num_slots, width, dtype=w.dtype if self.backend == "triton" else torch.float32)

    def _room(self, slots_needed: int) -> None:
        if slots_needed > self.cache.max_len:
            if not self._grows:
                raise ValueError(f"a slot needs {slots_needed} cache rows, more than max_len={self.cache.max_len}")
            self.cache.grow(slots_needed)

    def select(self, batch_index: torch.Tensor) -> None:
        self._require_state()
        idx = batch_index.to(torch.int64)
        self.cache.select(idx)
        self._length = self._length[idx]
        self._bound = int(self._length.max()) if idx.numel() else 0
        self._num_tokens = self._num_tokens[idx]
        self._last_token = self._last_token[idx]
        self._root_h = self._root_h[idx]
        self._root_x = self._root_x[idx]

    def _check_features(self, feats: torch.Tensor | None, b: int, rows: int) -> torch.Tensor | None:
        if not self.head.uses_features:
            return None
        if not isinstance(feats, torch.Tensor):
            raise TypeError("target_features must be a tensor [B, rows, F] for this drafter")
        if feats.dim() != 3 or feats.shape[0] != b or feats.shape[1] < rows or feats.shape[2] != self.feature_size:
            raise ValueError(
                f"target_features must have shape [{b}, >={rows}, {self.feature_size}], got {list(feats.shape)}")
        return feats[:, :rows]

    # ------------------------------------------------------------------------------- head steps
    def _step(self, tokens: torch.Tensor, hidden_in: torch.Tensor | None, rows: torch.Tensor, start: torch.Tensor,
              depth: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None, kv_len: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [R, n] at slots ``start + i``: (hidden out [R, n, H], scores [R, n, W]) where the scores are
        draft logits (torch) or normed hidden states (triton: the fused kernels apply ``lm_head``)."""
        r, n = tokens.shape
        if depth is None:
            depth = torch.arange(n, device=tokens.device).expand(r, n)
        if self.kernel is not None and attn_mask is None:
            logits, h = self.kernel(tokens, hidden_in, self.cache, rows, start, depth)
            return h, logits
        kv_len = self._bound + n if kv_len is None else kv_len
        h = self.head.decode(tokens, hidden_in, self.cache, rows, start, kv_len, depth, attn_mask)
        hn = self.head.norm(h)
        return h, (hn if self.backend == "triton" else (hn @ self.head.lm_head.weight.t()).float())

    def _draw_topk(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.backend == "triton":
            return head_topk(x, self.head.lm_head.weight, self.head.d2t, k, self.backend)
        return logits_topk(x, self.head.d2t, k)

    def _draw_sample(self, x, k, temperature, seed, position, uniforms=None):
        if self.backend == "triton":
            return head_sample(x, self.head.lm_head.weight, self.head.d2t, self.vocab_size, temperature, seed,
                               position, k, self.backend)
        return logits_sample(x, self.head.d2t, self.vocab_size, temperature, seed, position, k, uniforms)

    def _extend(self, rows: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor | None, count: torch.Tensor,
                start: torch.Tensor, start_bound: int) -> None:
        """Append ``count[b]`` of the ``tokens`` [R, T] rows (and their features) to slots ``rows`` at
        ``start`` (a host bound on it: ``start_bound``)."""
        r, t = tokens.shape
        self._room(start_bound + t)
        hidden_in = None if feats is None else self.head.project_features(feats, self.backend)
        h, x = self._step(tokens, hidden_in, rows, start, kv_len=start_bound + t)
        ar = torch.arange(r, device=tokens.device)
        self._root_h[rows] = h[ar, count - 1].to(self._root_h.dtype)
        self._root_x[rows] = x[ar, count - 1].to(self._root_x.dtype)
        self._length[rows] = start + count
        self._bound = int(self._length.max())  # one host sync per round: bounds the attention span

    # ------------------------------------------------------------------------------------ protocol
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, lengths: torch.Tensor, next_token_ids: torch.Tensor,
                target_features: torch.Tensor | None) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError("input_ids must be a tensor [B, L] with L >= 1")
        self.reset(input_ids.shape[0])
        self.admit(torch.arange(input_ids.shape[0], device=input_ids.device), input_ids, lengths, next_token_ids,
                   target_features)

    @torch.no_grad()
    def admit(self, rows: torch.Tensor, input_ids: torch.Tensor, lengths: torch.Tensor,
              next_token_ids: torch.Tensor, target_features: torch.Tensor | None) -> None:
        """Prefill new sequences into slots ``rows`` [R] of the running batch (arguments as :meth:`prefill`
        with R sequences); the other slots are untouched."""
        self._require_state()
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError("input_ids must be a tensor [B, L] with L >= 1")
        b, seq = input_ids.shape
        rows = _check_int_tensor("rows", rows, (b,))
        ids = _check_int_tensor("input_ids", input_ids, (b, seq))
        lengths = _check_int_tensor("lengths", lengths, (b,))
        nxt = _check_int_tensor("next_token_ids", next_token_ids, (b,))
        if bool(((lengths < 1) | (lengths > seq)).any()):
            raise ValueError(f"lengths must be in [1, {seq}]")
        for name, t in (("input_ids", ids), ("next_token_ids", nxt)):
            if bool(((t < 0) | (t >= self.vocab_size)).any()):
                raise ValueError(f"{name} must be in [0, {self.vocab_size})")
        feats = self._check_features(target_features, b, seq)
        ar = torch.arange(b, device=ids.device)
        if self.head.uses_features:
            tokens = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
            tokens[ar, lengths - 1] = nxt
            count = lengths
        else:
            tokens = torch.cat([ids, torch.zeros_like(ids[:, :1])], dim=1)
            tokens[ar, lengths] = nxt
            count = lengths + 1
            tokens = tokens[:, : int(count.max())]
        self._num_tokens[rows] = lengths + 1
        self._last_token[rows] = nxt
        self._extend(rows, tokens, feats, count, torch.zeros(b, dtype=torch.int64, device=ids.device), 0)

    @torch.no_grad()
    def commit(self, num_accepted: torch.Tensor, output_token_ids: torch.Tensor,
               target_features: torch.Tensor | None, rows: torch.Tensor | None = None) -> None:
        self._require_state()
        rows = self._rows(rows)
        b = rows.numel()
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
        tokens = torch.where(valid, out, torch.zeros_like(out))
        self._last_token[rows] = tokens[ar, n]
        self._num_tokens[rows] += n + 1
        self._extend(rows, tokens, feats, n + 1, self._length[rows], self._bound)

    def _rows(self, rows: torch.Tensor | None) -> torch.Tensor:
        if rows is None:
            return torch.arange(self._length.numel(), device=self._length.device)
        return _check_int_tensor("rows", rows, (rows.numel(),) if isinstance(rows, torch.Tensor) else (0,))

    def _sampling_args(self, b, temperature, seed, position, rows):
        if temperature is None:
            return None, None, None
        if not isinstance(temperature, torch.Tensor) or tuple(temperature.shape) != (b,):
            raise ValueError(f"temperature must be a tensor of shape [{b}]")
        if not temperature.is_floating_point():
            raise TypeError("temperature must be a floating-point tensor")
        if bool((~torch.isfinite(temperature) | (temperature < 0)).any()):
            raise ValueError("temperature must be finite and >= 0")
        if seed is None:
            raise ValueError("seed [B] is required when temperature is given")
        seed = _check_int_tensor("seed", seed, (b,))
        position = self._num_tokens[rows] if position is None else _check_int_tensor("position", position, (b,))
        return temperature.float(), seed, position

    @torch.no_grad()
    def propose(self, k: int, temperature: torch.Tensor | None = None, seed: torch.Tensor | None = None,
                position: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> DraftProposal:
        """A chain of ``k`` drafts per slot in ``rows`` (see ``base.Drafter.propose``): the same tokens as
        ``propose_tree(k, 1, 1)``, with causal head steps (one native call each when available)."""
        self._require_state()
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"depth must be a positive int, got {k!r}")
        rows = self._rows(rows)
        b = rows.numel()
        temperature, seed, position = self._sampling_args(b, temperature, seed, position, rows)
        self._room(self._bound + k)
        dev = rows.device
        uniforms = None
        if temperature is not None and self.backend != "triton":  # every step's noise in one Philox call
            pos = (position[:, None] + torch.arange(k, device=dev)[None, :]).reshape(-1)
            uniforms = draft_uniforms(seed.repeat_interleave(k), pos, self.vocab_size).view(b, k, -1)
        x, h = self._root_x[rows], self._root_h[rows]
        base = self._length[rows]
        tokens, probs = [], []
        zero = torch.zeros(b, 1, dtype=torch.int64, device=dev)
        for j in range(k):
            if temperature is None:
                tok = self._draw_topk(x, 1).target_ids[:, 0]
            else:
                s = self._draw_sample(x, 1, temperature, seed, position + j,
                                      None if uniforms is None else uniforms[:, j])
                tok = s.target_ids[:, 0]
                probs.append(s.q)
            tokens.append(tok)
            if j + 1 < k:
                hid = h[:, None] if self.head.uses_features else None
                h, x = self._step(tok[:, None], hid, rows, base + j, depth=zero, kv_len=self._bound + j + 1)
                h, x = h[:, 0], x[:, 0]
        return DraftProposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None)

    @torch.no_grad()
    def propose_tree(self, depth: int, top_k: int, beam_width: int,
                     temperature: torch.Tensor | None = None, seed: torch.Tensor | None = None,
                     position: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> TreeProposal:
        self._require_state()
        for name, val in (("depth", depth), ("top_k", top_k), ("beam_width", beam_width)):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        if top_k > self.draft_vocab_size:
            raise ValueError(f"top_k must be <= draft_vocab_size={self.draft_vocab_size}, got {top_k}")
        rows = self._rows(rows)
        b = rows.numel()
        dev = rows.device
        temperature, seed, position = self._sampling_args(b, temperature, seed, position, rows)
        sampled = temperature is not None

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
        tokens[:, 0] = self._last_token[rows]
        probs = torch.zeros(b, n_nodes, self.vocab_size, device=dev) if sampled else None
        root_h = self._root_h[rows]
        node_hidden = root_h.new_zeros(b, n_nodes, root_h.shape[-1])
        anc = torch.zeros(b, n_nodes, max(n_scratch, 1), dtype=torch.bool, device=dev)

        self._room(self._bound + n_scratch)
        base = self._length[rows]
        span = self._bound + n_scratch
        key = torch.arange(span, device=dev)
        rel = key[None, :] - base[:, None]  # [B, span] scratch index of each key slot
        in_scratch = (rel >= 0) & (rel < n_scratch)
        committed = rel < 0
        ar = torch.arange(b, device=dev)[:, None]

        lo, hi = 0, 1  # node range of the previous level
        used = 0
        nxt = 1
        for d in range(1, depth + 1):
            e = expand[d - 1]
            if d == 1:
                exp_idx = torch.zeros(b, 1, dtype=torch.int64, device=dev)
                x = self._root_x[rows][:, None]
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
                if self.head.uses_features:
                    hidden_in = torch.where((par == 0)[..., None], root_h[:, None], node_hidden[ar, par])
                start = base + used
                # the node's row sits where a chain's row of the same depth would: position base + d - 2
                pos_offset = torch.full((b, e), d - 2 - used, dtype=torch.int64, device=dev)
                h_out, x = self._step(tokens.gather(1, exp_idx), hidden_in, rows, start, pos_offset, mask, span)
                node_hidden[ar, exp_idx] = h_out.to(node_hidden.dtype)
                used += e
            flat = x.reshape(b * e, x.shape[-1])
            if sampled:
                s = self._draw_sample(flat, top_k, temperature.repeat_interleave(e), seed.repeat_interleave(e),
                                      (position + (d - 1)).repeat_interleave(e))
                probs[ar, exp_idx] = s.q.view(b, e, -1)
                ids, lp = s.target_ids, s.log_probs
            else:
                ids, lp = self._draw_topk(flat, top_k)
            cnt = e * top_k
            rng = slice(nxt, nxt + cnt)
            tokens[:, rng] = ids.view(b, cnt)
            parent[:, rng] = exp_idx.repeat_interleave(top_k, dim=1)
            node_depth[:, rng] = d
            logp[:, rng] = logp.gather(1, exp_idx).repeat_interleave(top_k, dim=1) + lp.view(b, cnt)
            lo, hi = nxt, nxt + cnt
            nxt += cnt
        return TreeProposal(tokens, parent, node_depth, logp, probs)
