"""Slot-based drafters for the rollout engine, and their distillation from the policy.

- :class:`Eagle3Drafter` (default): an EAGLE-3 style head. It reads the policy's own hidden states from
  three layers (low, middle, high), fuses them (``fc``: 3H -> H), pairs the fused feature at position t
  with the embedding of token t + 1 (``fuse``: 2H -> H), runs ONE Qwen3 decoder layer with its own KV
  cache and predicts token t + 2 with the policy's LM head. Beyond the first draft it feeds its own output
  hidden state where the policy feature would go (trained for that by "training-time test" unrolling).
  Its embedding and LM head are the policy's: :meth:`sync` copies them after every policy update.
- MTP (``build_drafter("mtp")``): the same head fed only the policy's last hidden state (a DeepSeek-style
  multi-token-prediction module: embedding of token t + 1 and hidden state t through one block).
- :class:`DraftModelDrafter`: a small independent Qwen3 language model.

Both keep per-slot state so the engine can admit new requests into freed slots (continuous batching).
The policy features come for free: the engine asks the policy's verification forward for them.
"""

from __future__ import annotations

import math
import random
import time

import torch
from torch import nn

from .engine import DraftSampler, SlotDrafter
from .model import KVCache, ModelConfig, Qwen3, RMSNorm

# ----------------------------------------------------------------------------------------------------
# Draft model
# ----------------------------------------------------------------------------------------------------


class DraftModelDrafter(SlotDrafter):
    """A small Qwen3 language model as drafter, with its own per-slot KV cache.

    Per slot the drafter keeps the valid length of its cache and the 1-2 tokens it has not run yet (the
    last emitted token, and the last draft when all k were accepted). A chain of k drafts costs k forwards:
    the first runs the pending tokens, the others one draft each.
    """

    kind = "draft_model"

    def __init__(self, model: Qwen3) -> None:
        self.model = model

    def reset(self, num_slots: int, max_len: int) -> None:
        self.model.eval()
        self.model.sync_inference_weights()
        self.cache = KVCache(self.model.config, num_slots, max_len + 2)
        self.length = torch.zeros(num_slots, dtype=torch.long)
        self.pending: list[list[int]] = [[] for _ in range(num_slots)]
        self.base = torch.zeros(num_slots, dtype=torch.long)
        self.k = 0

    @torch.no_grad()
    def admit(self, slots, prompts, hidden):
        width = max(len(p) for p in prompts) - 1
        rows = torch.tensor(slots)
        if width > 0:
            ids = torch.zeros(len(slots), width, dtype=torch.long)
            for i, p in enumerate(prompts):
                ids[i, : len(p) - 1] = torch.tensor(p[:-1])
            self.model.step(ids, self.cache, rows, torch.zeros(len(slots), dtype=torch.long), width)
        for s, p in zip(slots, prompts, strict=True):
            self.length[s] = len(p) - 1
            self.pending[s] = [p[-1]]

    @torch.no_grad()
    def propose(self, slots, k, temperature, generator):
        self.k = k
        idx = slice(None) if slots is None else slots
        slot_list = range(len(self.pending)) if slots is None else slots.tolist()
        pend = [self.pending[s] for s in slot_list]
        width = max(len(p) for p in pend)
        ids = torch.tensor([p + [p[-1]] * (width - len(p)) for p in pend])
        n_pend = torch.tensor([len(p) for p in pend])
        start = self.length[idx]
        logits, _ = self.model.step(ids, self.cache, slots, start, int(start.max()) + width)
        last = logits[torch.arange(len(pend)), n_pend - 1]
        sampler = DraftSampler(temperature, k, last.shape[-1], generator)
        base = start + n_pend
        self.base[idx] = base
        tokens, probs = [], []
        for j in range(k):
            tok, q = sampler(last, j)
            tokens.append(tok)
            probs.append(q)
            if j + 1 < k:
                logits, _ = self.model.step(tok[:, None], self.cache, slots, base + j, int(base.max()) + j + 1)
                last = logits[:, 0]
        return torch.stack(tokens, 1), (torch.stack(probs, 1) if sampler.stochastic else None)

    def commit(self, slots, num_accepted, outputs, hidden):
        slot_list = range(len(self.pending)) if slots is None else slots.tolist()
        k = self.k
        for i, s in enumerate(slot_list):
            a = num_accepted[i]
            self.length[s] = self.base[s] + min(a, k - 1)
            out = outputs[i]
            self.pending[s] = out[a - 1 : a + 1] if a == k else [out[a]]

    def trainable(self) -> nn.Module:
        return self.model

    def distill_loss(self, policy: Qwen3, ids: torch.Tensor, mask: torch.Tensor, unroll: int = 0) -> torch.Tensor:
        """Soft cross-entropy to the policy's next-token distribution on the ``mask`` [B, T-1] positions."""
        with torch.no_grad():
            target, _ = policy(ids)
        logits, _ = self.model(ids)
        p = torch.softmax(target[:, :-1][mask], -1)
        return -(p * torch.log_softmax(logits[:, :-1][mask], -1)).sum(-1).mean()


# ----------------------------------------------------------------------------------------------------
# EAGLE-3 style head
# ----------------------------------------------------------------------------------------------------


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Low, middle and high policy layers whose outputs feed the head."""
    return (0, num_layers // 2, num_layers - 1) if num_layers >= 3 else (0, 0, num_layers - 1)


class Eagle3Head(nn.Module):
    """Fusion layers + one Qwen3 decoder layer (as a 1-layer :class:`Qwen3` for its cached step)."""

    def __init__(self, policy_config: ModelConfig, feature_layers: tuple[int, ...], intermediate_size: int = 256):
        super().__init__()
        h = policy_config.hidden_size
        self.feature_layers = tuple(feature_layers)
        self.fc = nn.Linear(len(feature_layers) * h, h, bias=False)
        self.fuse = nn.Linear(2 * h, h, bias=False)
        self.feature_norm = RMSNorm(h, policy_config.rms_norm_eps)
        cfg = ModelConfig(**{**policy_config.__dict__, "num_hidden_layers": 1,
                             "intermediate_size": intermediate_size, "tie_word_embeddings": True})
        self.decoder = Qwen3(cfg)  # its embedding / LM head are overwritten by sync() with the policy's
        for p in self.decoder.model.embed_tokens.parameters():
            p.requires_grad_(False)
        for m in (self.fc, self.fuse):
            nn.init.normal_(m.weight, std=0.02)

    def sync(self, policy: Qwen3) -> None:
        with torch.no_grad():
            self.decoder.model.embed_tokens.weight.copy_(policy.model.embed_tokens.weight)
            if not policy.config.tie_word_embeddings:
                raise ValueError("Eagle3Head shares a tied embedding / LM head with the policy")

    def features(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """Fused policy feature [.., H] from the policy's layer outputs (each [.., H])."""
        return self.feature_norm(self.fc(torch.cat(hidden, -1)))

    def inputs(self, tokens: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        return self.fuse(torch.cat([self.decoder.model.embed_tokens(tokens), feature], -1))


class _NativeHeadStep:
    """The head's decoder step as one native call (``specdec_kernels.native.decoder_step``).

    A step of the one-layer head is ~40 small torch ops whose dispatch costs several times their
    arithmetic at tens of rows; the fused CPU kernel runs the same math in one call. The input fusion
    ``fuse([embed(t); f])`` is split as ``T[t] + f W2^T`` with ``T = embed W1^T`` precomputed per weight
    sync. Snapshots the weights: rebuild after every weight change (``Eagle3Drafter.reset`` does).
    """

    def __init__(self, head: Eagle3Head) -> None:
        from specdec_kernels import native

        dec, c = head.decoder, head.decoder.config
        h = c.hidden_size
        with torch.no_grad():
            self.token_table = (dec.model.embed_tokens.weight @ head.fuse.weight[:, :h].t()).contiguous()
            self.feature_weight = head.fuse.weight[:, h:].t().contiguous()
        self.weights, self.rope = dec.native_step_args(0)
        self.num_heads, self.eps = c.num_attention_heads, c.rms_norm_eps
        self.step = native.op("decoder_step", "cpu")  # resolved once, not per draft step (native.decoder_step)

    def __call__(self, toks, feats, cache, rows, start, depth):
        x = torch.addmm(self.token_table[toks].flatten(0, 1), feats.flatten(0, 1), self.feature_weight)
        return self.step(x.view(*toks.shape, -1), self.weights, cache.k[0], cache.v[0], rows, start.contiguous(),
                         depth.contiguous(), self.rope, self.num_heads, self.eps)


def native_head_available() -> bool:
    """True when the fused CPU head step (the compiled extension) can serve :class:`Eagle3Drafter`."""
    from specdec_kernels import native

    return native.has_op("decoder_step", "cpu")


class Eagle3Drafter(SlotDrafter):
    """Slot-based EAGLE-3 style drafting (see module docstring).

    Per slot: committed head-cache length, and the pending rows (fused policy feature at position t,
    token t + 1) verified since the last proposal but not yet run by the head (1 .. k + 1 rows).
    ``native``: run each head step as one fused CPU kernel call (None: when the extension is built and
    the head is float32); False keeps the torch path (same math; tests compare the two).
    """

    kind = "eagle3"

    def __init__(self, head: Eagle3Head, native: bool | None = None) -> None:
        self.head = head
        self.hidden_layers = head.feature_layers
        self.native = native

    def sync(self, policy: Qwen3) -> None:
        self.head.sync(policy)

    def reset(self, num_slots: int, max_len: int) -> None:
        self.head.eval()
        self.head.decoder.sync_inference_weights()
        self.cache = KVCache(self.head.decoder.config, num_slots, max_len + 2)
        self.length = torch.zeros(num_slots, dtype=torch.long)
        h = self.head.fc.out_features
        # pending rows per slot, as tensors (no per-slot Python work in the hot path): [S, W, H], [S, W], [S]
        self.pend_feat = torch.zeros(num_slots, 1, h)
        self.pend_tok = torch.zeros(num_slots, 1, dtype=torch.long)
        self.n_pend = torch.zeros(num_slots, dtype=torch.long)
        self.all_rows = torch.arange(num_slots)
        use_native = self.native
        if use_native is None:
            use_native = native_head_available() and self.head.fc.weight.dtype == torch.float32
        self.kernel = _NativeHeadStep(self.head) if use_native else None

    def _decode(self, toks, feats, slots, start, depth):
        """Head logits [R, n, V] and output hidden states [R, n, H] for ``n`` new rows per slot (token
        ``toks`` paired with policy/head feature ``feats``), appended to the head's cache at ``start``."""
        if self.kernel is not None:
            return self.kernel(toks, feats, self.cache, self.all_rows if slots is None else slots, start, depth)
        n = toks.shape[1]
        logits, (g,) = self.head.decoder.step(toks, self.cache, slots, start, int(start.max()) + n, depth=depth,
                                              hidden_layers=(0,), inputs_embeds=self.head.inputs(toks, feats))
        return logits, g

    @torch.no_grad()
    def admit(self, slots, prompts, hidden):
        # hidden: policy layer outputs over prompt[:-1] ([A, W, H] each); row t pairs feature t with token t+1
        feats = self.head.features(hidden)  # [A, W, H]
        lengths = [len(p) for p in prompts]
        w = max(lengths) - 2
        rows = torch.tensor(slots)
        if w > 0:
            toks = torch.zeros(len(slots), w, dtype=torch.long)
            for i, p in enumerate(prompts):
                toks[i, : len(p) - 2] = torch.tensor(p[1:-1])
            self._decode(toks, feats[:, :w], rows, torch.zeros(len(slots), dtype=torch.long),
                         (torch.arange(w) + 1).expand(len(slots), w))
        last = torch.tensor([len(p) - 2 for p in prompts])
        self.length[rows] = last
        self.pend_feat[rows, 0] = feats[torch.arange(len(slots)), last]
        self.pend_tok[rows, 0] = torch.tensor([p[-1] for p in prompts])
        self.n_pend[rows] = 1

    @torch.no_grad()
    def propose(self, slots, k, temperature, generator):
        idx = slice(None) if slots is None else slots
        n = self.n_pend[idx]
        r, width = n.numel(), int(n.max())
        toks = self.pend_tok[idx, :width]  # rows past n_b are stale: written beyond the valid prefix, ignored
        feats = self.pend_feat[idx, :width]
        start = self.length[idx]
        # head row j sits at the position of its token: the cache slot index + 1
        depth = torch.arange(width).expand(r, width) + 1
        logits, g = self._decode(toks, feats, slots, start, depth)
        ar = torch.arange(r)
        last, g = logits[ar, n - 1], g[ar, n - 1]
        base = start + n
        self.length[idx] = base  # pending rows are verified: committed
        sampler = DraftSampler(temperature, k, last.shape[-1], generator)
        tokens, probs = [], []
        ones = torch.ones(r, 1, dtype=torch.long)
        for j in range(k):
            tok, q = sampler(last, j)
            tokens.append(tok)
            probs.append(q)
            if j + 1 < k:
                logits, g = self._decode(tok[:, None], g[:, None], slots, base + j, ones)
                last, g = logits[:, 0], g[:, 0]
        return torch.stack(tokens, 1), (torch.stack(probs, 1) if sampler.stochastic else None)

    @torch.no_grad()
    def commit(self, slots, num_accepted, outputs, hidden):
        idx = slice(None) if slots is None else slots
        feats = self.head.features(hidden)  # [R, k + 1, H]: policy features at [last, d_1 .. d_k]
        width = feats.shape[1]
        if self.pend_tok.shape[1] < width:
            old_feat, old_tok = self.pend_feat, self.pend_tok
            self.pend_feat = torch.zeros(old_feat.shape[0], width, old_feat.shape[2])
            self.pend_tok = torch.zeros(old_tok.shape[0], width, dtype=torch.long)
            self.pend_feat[:, : old_feat.shape[1]] = old_feat
            self.pend_tok[:, : old_tok.shape[1]] = old_tok
        # row j pairs the feature at position j with the token verified after it (accepted draft or final)
        self.pend_feat[idx, :width] = feats
        self.pend_tok[idx, :width] = torch.tensor([o + [0] * (width - len(o)) for o in outputs])
        self.n_pend[idx] = torch.tensor(num_accepted) + 1

    def trainable(self) -> nn.Module:
        return self.head

    def distill_loss(self, policy: Qwen3, ids: torch.Tensor, mask: torch.Tensor, unroll: int = 1) -> torch.Tensor:
        """Soft cross-entropy of the head to the policy, with ``unroll`` training-time-test steps.

        Row i (i = 0..T-2) pairs the policy feature at position i with token i + 1 and predicts the
        policy's distribution at position i + 1 (token i + 2). Step s > 0 rows replace the feature by the
        head's own output of step s - 1 at row i - 1 and attend to real rows <= i - s, to their own chain's
        earlier speculative rows, and to themselves: exactly what drafting the (s+1)-th token sees.
        ``mask`` [B, T - 1] marks the rows whose predicted token counts (response positions).
        """
        with torch.no_grad():
            target, hidden = policy(ids, hidden_layers=self.head.feature_layers)
        t = ids.shape[1] - 1
        feat = self.head.features([x[:, :t] for x in hidden])
        tok = ids[:, 1:]
        p = torch.softmax(target[:, 1:], -1)  # row i's target: the policy at position i + 1
        valid = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1)  # token i + 2 is a response token
        row = torch.arange(t)
        inputs = [self.head.inputs(tok, feat)]
        total = torch.zeros(())
        count = 0
        for s in range(unroll + 1):
            x = torch.cat(inputs, 1)
            n = x.shape[1]
            q_step, q_row = (torch.arange(n) // t)[:, None], (torch.arange(n) % t)[:, None]
            k_step, k_row = q_step.T, q_row.T
            visible = ((k_step == 0) & (k_row <= q_row - q_step)) | (
                (k_step >= 1) & (k_step <= q_step) & (k_row == q_row - q_step + k_step)
            )
            _, (g,) = self.head.decoder(None, hidden_layers=(0,), inputs_embeds=x, positions=q_row[:, 0] + 1,
                                        attn_mask=visible)
            g_s = g[:, s * t :]
            logp = torch.log_softmax(self.head.decoder.lm_head(self.head.decoder.model.norm(g_s)).float(), -1)
            use = valid & (row >= s)[None, :]
            total = total - (p * logp).sum(-1)[use].sum()
            count += int(use.sum())
            if s < unroll:  # the next step's row i continues the chain whose previous row is i - 1
                inputs.append(self.head.inputs(tok, torch.cat([torch.zeros_like(g_s[:, :1]), g_s[:, :-1]], 1)))
        return total / max(count, 1)


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------


def distill(
    drafter: SlotDrafter,
    policy: Qwen3,
    batches,
    steps: int,
    lr: float = 3e-3,
    time_limit_s: float | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    unroll: int | None = None,
) -> list[float]:
    """Train the drafter to match the policy on ``batches()`` -> (ids [B, T], mask [B, T-1]) sequences.

    Used for the warm start (reference solutions) and for online adaptation (fresh rollouts).
    ``unroll``: training-time-test steps of an EAGLE-style head (None: the drafter's default); unrolling
    ``k - 1`` steps trains every draft position a k-token proposal uses.
    """
    module = drafter.trainable()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = optimizer or torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    module.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        if optimizer is None:
            for g in opt.param_groups:
                g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps)) * min(1.0, (step + 1) / 10)
        ids, mask = batches()
        loss = drafter.distill_loss(policy, ids, mask) if unroll is None else drafter.distill_loss(policy, ids, mask, unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
            break
    module.eval()
    return losses


def problem_batches(problems, tokenizer, batch_size: int, seed: int):
    """A ``batches()`` callable over reference solutions (used to warm-start drafters)."""
    from .model import sft_batch

    rng = random.Random(seed)
    return lambda: sft_batch(rng.sample(problems, min(batch_size, len(problems))), tokenizer)


def build_drafter(kind: str, policy: Qwen3, seed: int = 0) -> SlotDrafter:
    """A fresh, untrained drafter of ``kind`` ("eagle3" or "draft_model") for ``policy``."""
    torch.manual_seed(seed)
    if kind == "eagle3":
        head = Eagle3Head(policy.config, default_feature_layers(policy.config.num_hidden_layers))
        drafter = Eagle3Drafter(head)
        drafter.sync(policy)
        return drafter
    if kind == "mtp":  # DeepSeek-style MTP module: [embed(token t+1); last hidden state t] -> one block
        c = policy.config
        drafter = Eagle3Drafter(Eagle3Head(c, (c.num_hidden_layers - 1,)))
        drafter.sync(policy)
        return drafter
    if kind == "draft_model":
        c = policy.config
        cfg = ModelConfig(**{**c.__dict__, "num_hidden_layers": 1, "intermediate_size": 256})
        return DraftModelDrafter(Qwen3(cfg))
    raise ValueError(f"drafter must be 'eagle3', 'mtp' or 'draft_model', got {kind!r}")


__all__ = [
    "DraftModelDrafter", "Eagle3Drafter", "Eagle3Head", "build_drafter", "distill", "problem_batches",
    "default_feature_layers",
]
