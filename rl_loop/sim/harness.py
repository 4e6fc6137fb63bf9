"""A measurement harness: batched rollouts of a tiny Qwen3 target (``transformers``), autoregressive vs
chain speculative decoding with a small draft model and ``specdec_kernels.verify_chain``.

It exists to check the simulator against something we can run: :mod:`rl_loop.sim.calibrate` predicts the
speedups measured here from micro-measurements only, taking the acceptance curve measured here as its
workload input.

Engine, in the simulator's terms:

- a batch of ``batch`` requests, each with a response length fixed in advance (drawn from a long-tailed
  distribution, so autoregressive and speculative runs decode the same lengths); finished requests leave
  the batch (``DynamicCache.batch_select_indices``), so the batch shrinks and the tail decides the time;
- autoregressive step: one target forward over one token per request, then ``verify_chain`` with zero
  drafts (its bonus path samples the token);
- speculative step: ``k`` draft forwards (the first also feeds the draft the tokens it has not seen), one
  target forward over ``k + 1`` tokens per request, ``verify_chain`` with the draft distributions;
- no KV compaction: every forward appends its slots to the cache and rejected slots are masked out, so a
  request attends over ``k + 1`` slots per step (``Workload(kv_growth="slots")`` in the simulator).

The draft model is the target truncated to its first ``draft_layers`` layers (same embeddings, final norm
and LM head): a self-speculative drafter that needs no training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .model_spec import ModelSpec


@dataclass(frozen=True)
class HarnessConfig:
    """Tiny target and draft, and the rollout batch. Sizes keep one run to seconds on 2 cores."""

    vocab_size: int = 1024
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    draft_layers: int = 1
    init_std: float = 0.08  # larger than the usual 0.02 so later layers change the distribution
    late_layer_scale: float = 0.3  # output projections of layers the draft lacks are scaled by this
    batch: int = 8
    prompt_len: int = 16
    response_median: float = 48.0
    response_sigma: float = 0.6
    max_response_len: int = 160
    temperature: float = 1.0
    backend: str = "reference"
    seed: int = 0

    def response_lengths(self) -> np.ndarray:
        """Same construction as ``Workload.response_lengths``: quantiles of the log-normal, shuffled."""
        from .generation import Workload

        return Workload(1, self.batch, self.prompt_len, self.response_median, self.response_sigma,
                        self.max_response_len).response_lengths().astype(np.int64)

    def target_spec(self, dtype: str = "fp32") -> ModelSpec:
        return ModelSpec(name="tiny-qwen3", num_layers=self.num_layers, hidden_size=self.hidden_size,
                         num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                         vocab_size=self.vocab_size, intermediate_size=self.intermediate_size, dtype=dtype)

    def draft_spec(self, dtype: str = "fp32") -> ModelSpec:
        return self.target_spec(dtype).with_(name="tiny-qwen3-draft", num_layers=self.draft_layers)


def build_models(cfg: HarnessConfig):
    """(target, draft) ``Qwen3ForCausalLM`` in eval mode, built by the library's model builder
    (``specdec_kernels.models.tiny_qwen3``: every weight but the norms N(0, ``init_std``^2), untied head) and
    converted to transformers; the draft is the target's first ``draft_layers`` layers with its embedding,
    final norm and head."""
    from dataclasses import replace as replace_config

    from specdec_kernels.models import ModelConfig
    from specdec_kernels.models.tiny_qwen3 import spread_qwen3, to_transformers

    config = ModelConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                         head_dim=cfg.head_dim, max_position_embeddings=4096, tie_word_embeddings=False)
    target = spread_qwen3(config, torch.Generator().manual_seed(cfg.seed), std=cfg.init_std)
    with torch.no_grad():  # layers past the draft's contribute less, as in a trained early-exit model
        for layer in target.model.layers[cfg.draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(cfg.late_layer_scale)
            layer.mlp.down_proj.weight.mul_(cfg.late_layer_scale)
    draft = type(target)(replace_config(config, num_hidden_layers=cfg.draft_layers))
    missing = draft.load_state_dict(target.state_dict(), strict=False)
    if missing.missing_keys:
        raise RuntimeError(f"draft weights not found in the target: {missing.missing_keys}")
    return to_transformers(target.eval()), to_transformers(draft.eval())


@dataclass
class RunResult:
    """One generation run: wall time, engine steps, tokens and acceptance counts by draft position."""

    k: int
    time_s: float
    steps: int
    tokens: int
    rounds: int = 0  # request-steps (one per request per verification)
    accepted_at: list[int] = field(default_factory=list)  # rounds whose draft j (0-based) was accepted
    outputs: list[list[int]] = field(default_factory=list, repr=False)  # response tokens per request

    @property
    def acceptance_curve(self) -> tuple[float, ...]:
        """Conditional acceptance by draft position: P(draft j accepted | drafts < j accepted)."""
        reached = ([self.rounds] + self.accepted_at)[: len(self.accepted_at)]
        return tuple(a / r if r else 0.0 for a, r in zip(self.accepted_at, reached, strict=True))

    @property
    def tokens_per_step(self) -> float:
        return 1.0 + sum(self.accepted_at) / self.rounds if self.rounds else 1.0


def _sample(target_logits, drafts, cu, draft_probs, temperature, seed, position, backend):
    import specdec_kernels as sk

    return sk.verify_chain(target_logits, drafts, cu, draft_probs=draft_probs, temperature=temperature,
                           seed=seed, position=position, backend=backend)


@torch.no_grad()
def run_rollouts(target, draft, cfg: HarnessConfig, k: int = 0, run_seed: int = 0) -> RunResult:
    """Generate ``cfg.batch`` responses of the fixed lengths, autoregressively (``k = 0``) or with chain
    speculation of ``k`` drafts, and time it (prefill included)."""
    from transformers import DynamicCache

    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    gen = torch.Generator().manual_seed(1000 + run_seed)
    lengths = torch.as_tensor(cfg.response_lengths())
    B, V = cfg.batch, cfg.vocab_size
    prompts = torch.randint(0, V, (B, cfg.prompt_len), generator=torch.Generator().manual_seed(cfg.seed))
    seeds = torch.arange(B, dtype=torch.int64) + 7919 * (run_seed + 1)
    temp = torch.full((B,), cfg.temperature)
    empty = torch.empty(0, dtype=torch.int64)

    start = time.thread_time()
    cache_t = DynamicCache(config=target.config)
    logits = target(input_ids=prompts, past_key_values=cache_t, use_cache=True).logits[:, -1]
    mask_t = torch.ones(B, cfg.prompt_len, dtype=torch.long)
    length = torch.full((B,), cfg.prompt_len, dtype=torch.int64)  # tokens with valid KV = position of `last`
    res = _sample(logits, empty, torch.zeros(B + 1, dtype=torch.int64), None, temp, seeds, length, cfg.backend)
    last = res.output_token_ids[:, 0].long()
    emitted = torch.ones(B, dtype=torch.int64)
    outputs: list[list[int]] = [[t] for t in last.tolist()]
    if k:
        cache_d = DynamicCache(config=draft.config)
        draft(input_ids=prompts, past_key_values=cache_d, use_cache=True)
        mask_d = torch.ones(B, cfg.prompt_len, dtype=torch.long)
        pend = torch.zeros(B, dtype=torch.int64)  # last draft, fed to the draft when all k were accepted
        pend_ok = torch.zeros(B, dtype=torch.long)
    alive = torch.arange(B)
    steps = rounds = 0
    accepted_at = [0] * k

    def drop_finished():
        nonlocal alive, mask_t, length, last, emitted, seeds, temp
        keep = (emitted < lengths[alive]).nonzero().flatten()
        if keep.numel() == alive.numel():
            return
        alive, mask_t, length, last, emitted = alive[keep], mask_t[keep], length[keep], last[keep], emitted[keep]
        seeds, temp = seeds[keep], temp[keep]
        cache_t.batch_select_indices(keep)
        if k:
            nonlocal mask_d, pend, pend_ok
            mask_d, pend, pend_ok = mask_d[keep], pend[keep], pend_ok[keep]
            cache_d.batch_select_indices(keep)

    drop_finished()
    while alive.numel():
        b = alive.numel()
        steps += 1
        if k == 0:
            mask_t = torch.cat([mask_t, torch.ones(b, 1, dtype=torch.long)], 1)
            logits = target(input_ids=last[:, None], attention_mask=mask_t, position_ids=length[:, None],
                            past_key_values=cache_t, use_cache=True).logits[:, -1]
            res = _sample(logits, empty, torch.zeros(b + 1, dtype=torch.int64), None, temp, seeds, length + 1,
                          cfg.backend)
            last = res.output_token_ids[:, 0].long()
            length += 1
            emitted += 1
            for r, t in zip(alive.tolist(), last.tolist(), strict=True):
                outputs[r].append(t)
        else:
            # Draft k tokens: the first forward also feeds the previous round's last draft if it was kept.
            mask_d = torch.cat([mask_d, pend_ok[:, None], torch.ones(b, 1, dtype=torch.long)], 1)
            pos = torch.stack([length - 1, length], 1)
            inp = torch.stack([pend, last], 1)
            drafts, probs = [], []
            for i in range(k):
                dl = draft(input_ids=inp, attention_mask=mask_d, position_ids=pos, past_key_values=cache_d,
                           use_cache=True).logits[:, -1]
                if cfg.temperature > 0:
                    q = torch.softmax(dl.float() / cfg.temperature, -1)
                    d = torch.multinomial(q, 1, generator=gen).flatten()
                    probs.append(q)
                else:  # greedy drafts are deterministic: no draft distribution
                    d = dl.argmax(-1)
                drafts.append(d)
                if i < k - 1:
                    mask_d = torch.cat([mask_d, torch.ones(b, 1, dtype=torch.long)], 1)
                    inp, pos = d[:, None], (length + 1 + i)[:, None]
            drafts_t = torch.stack(drafts, 1)  # [b, k]
            # Verify: one target forward over [last, d_1 .. d_k].
            mask_t = torch.cat([mask_t, torch.ones(b, k + 1, dtype=torch.long)], 1)
            tpos = length[:, None] + torch.arange(k + 1)
            tl = target(input_ids=torch.cat([last[:, None], drafts_t], 1), attention_mask=mask_t,
                        position_ids=tpos, past_key_values=cache_t, use_cache=True).logits
            res = _sample(tl.reshape(b * (k + 1), V), drafts_t.reshape(-1), torch.arange(b + 1) * k,
                          torch.stack(probs, 1).reshape(b * k, V) if probs else None, temp, seeds, length + 1,
                          cfg.backend)
            acc = res.num_accepted.long()
            # Rejected slots stay in the caches, masked out.
            mask_t[:, -(k + 1):] = (torch.arange(k + 1) <= acc[:, None]).long()
            if k > 1:
                mask_d[:, -(k - 1):] = (torch.arange(k - 1) < acc[:, None]).long()
            pend, pend_ok = drafts_t[:, -1], (acc == k).long()
            last = res.output_token_ids.gather(1, acc[:, None]).flatten().long()
            for r, row, a in zip(alive.tolist(), res.output_token_ids.tolist(), acc.tolist(), strict=True):
                outputs[r].extend(row[: a + 1])
            length += acc + 1
            emitted += acc + 1
            rounds += b
            for j in range(k):
                accepted_at[j] += int((acc > j).sum())
        drop_finished()
    elapsed = time.thread_time() - start
    outputs = [o[:n] for o, n in zip(outputs, lengths.tolist(), strict=True)]
    return RunResult(k=k, time_s=elapsed, steps=steps, tokens=int(lengths.sum()), rounds=rounds,
                     accepted_at=accepted_at, outputs=outputs)
