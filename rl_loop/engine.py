"""Batched rollouts: autoregressive and lossless chain speculation on our own verification kernels.

One engine drives a fixed number of *slots* (rows of the KV cache). Requests wait in a queue; whenever a
slot frees up (EOS or length cap) the next request starts in it, so the batch stays full across a GRPO
group (continuous batching). Every distinct prompt of a call is prefilled once, all in one forward, and
copied into the slots of its requests (a GRPO group shares its prompt). Every round, for the active slots:

- ``spec="none"``: the policy runs one token per slot, and ``verify_chain`` with zero drafts samples the
  next token (its bonus path: Gumbel-max with Philox stream 2). Using the same kernel for autoregressive
  sampling keeps the randomness spec identical for both modes.
- ``spec="chain"``: the drafter proposes ``k`` tokens; the policy runs the ``k + 1`` rows
  ``[last emitted token, d_1 .. d_k]`` in ONE forward against the cache; ``verify_chain`` accepts a prefix
  and emits one correction/bonus token. Compaction is a length update: the keys/values of rejected drafts
  sit beyond the valid prefix and are overwritten by the next forward.

Randomness (DESIGN.md §4): request ``i`` carries a Philox key ``seed[i]``; verification row j decides the
token at absolute position ``position + j`` where ``position`` is the index of the first draft in the full
sequence (prompt + response). Every absolute position is decided by exactly one verification row, so the
emitted sequence has the autoregressive law whatever the drafter does (lossless); at temperature 0 the
output is the argmax chain, token-identical to autoregressive decoding. Drafts are sampled with a torch
generator (the drafter's randomness never changes the output law, only the acceptance rate).

Tokens emitted past EOS or past ``max_new_tokens`` are discarded; truncating a sequence keeps its law.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

import specdec_kernels as sk

from .model import KVCache, Qwen3

SPEC_MODES = ("none", "chain", "tree")


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: sampling, speculation and batching knobs."""

    max_new_tokens: int = 48
    temperature: float = 1.0
    spec: str = "chain"
    k: int = 3
    max_batch: int = 32
    backend: str = "default"  # verify_chain backend; "default": see resolve_verify_backend

    def __post_init__(self) -> None:
        if self.spec not in SPEC_MODES:
            raise ValueError(f"spec must be one of {SPEC_MODES}, got {self.spec!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")


def resolve_verify_backend(name: str) -> str:
    """The verification backend: "default" = the fastest CPU backend (native when built, else the
    reference; ``available_backends`` never ranks the Triton interpreter first); any explicit
    specdec_kernels backend name is passed through.
    """
    if name != "default":
        return name
    return sk.available_backends("cpu")[0]


@dataclass
class RolloutStats:
    """Counters of one ``generate`` call (speculative counters are zero for ``spec="none"``)."""

    k: int = 0
    rounds: int = 0  # verification rounds summed over requests (one per request per target forward)
    forwards: int = 0  # batched target forwards
    tokens: int = 0  # response tokens kept
    accepted_at: list[int] = field(default_factory=list)  # [k] rounds whose draft j (0-based) was accepted
    emitted_per_round: int = 0  # tokens emitted by verification (before EOS/length truncation)
    time_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification round (accepted drafts + 1); 1.0 for autoregressive."""
        return self.emitted_per_round / max(self.rounds, 1)

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft j is accepted) for j = 1..k (accepted implies every earlier draft was accepted)."""
        return [a / max(self.rounds, 1) for a in self.accepted_at]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.time_s, 1e-9)

    def merge(self, other: RolloutStats) -> None:
        """Accumulate ``other`` into self (same k)."""
        if not self.accepted_at:
            self.accepted_at = [0] * len(other.accepted_at)
            self.k = other.k
        for name in ("rounds", "forwards", "tokens", "emitted_per_round", "time_s", "draft_s", "target_s",
                     "verify_s", "prefill_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for j, a in enumerate(other.accepted_at):
            self.accepted_at[j] += a

    def as_dict(self) -> dict:
        return {
            "k": self.k, "rounds": self.rounds, "forwards": self.forwards, "tokens": self.tokens,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_by_position": self.acceptance_by_position, "tokens_per_s": self.tokens_per_s,
            "time_s": self.time_s, "draft_s": self.draft_s, "target_s": self.target_s,
            "verify_s": self.verify_s, "prefill_s": self.prefill_s,
        }


@dataclass
class Rollouts:
    """Responses of one ``generate`` call, in request order."""

    response_ids: list[list[int]]  # without EOS
    finished: list[bool]  # True when the response ended with EOS (False: hit max_new_tokens)
    stats: RolloutStats


class SlotDrafter:
    """What the engine needs from a drafter: per-slot state, batched proposals over active slots.

    ``hidden_layers`` names the policy layers whose outputs the drafter consumes (EAGLE-3 style features;
    empty for a draft model). All tensors are over the active slots ``slots`` [R] (None = every slot).
    """

    hidden_layers: tuple[int, ...] = ()

    def reset(self, num_slots: int, max_len: int) -> None:
        raise NotImplementedError

    def admit(self, slots: list[int], prompts: list[list[int]], hidden: list[torch.Tensor]) -> None:
        """Start requests in ``slots``; ``prompts`` include the last prompt token (not yet run by the policy)."""
        raise NotImplementedError

    def propose(
        self, slots: torch.Tensor | None, k: int, temperature: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts [R, k] int64 and their draft distributions [R, k, V] float32 (None for greedy batches)."""
        raise NotImplementedError

    def commit(
        self, slots: torch.Tensor | None, num_accepted: list[int], outputs: list[list[int]],
        hidden: list[torch.Tensor],
    ) -> None:
        """Record verification results (``outputs[i]`` = accepted drafts + final token) and policy features."""
        raise NotImplementedError

    def sync(self, policy: Qwen3) -> None:
        """Weight sync after a policy update (shared embeddings / heads); default: nothing shared."""


class DraftSampler:
    """Samples draft tokens for one proposal of ``k`` steps over ``R`` rows with few ops per step.

    The Gumbel noise of all k steps is drawn at once from ``generator``. Sampled rows draw
    ``argmax(z / T + g)`` (Gumbel-max: a sample of q = softmax(z / T)) and report q; greedy rows
    (temperature 0) take the argmax and report a one-hot q. When every row is greedy no q is built
    (deterministic drafts). The drafter's randomness only changes acceptance, never the output law.
    """

    def __init__(self, temperature: torch.Tensor, k: int, vocab_size: int, generator: torch.Generator) -> None:
        self.stochastic = bool((temperature > 0).any())
        self.mixed = self.stochastic and bool((temperature == 0).any())
        self.greedy_rows = temperature == 0
        self.inv_t = torch.where(temperature > 0, 1.0 / temperature.clamp(min=1e-6), torch.ones_like(temperature))[:, None]
        if self.stochastic:
            u = torch.rand((k, temperature.numel(), vocab_size), generator=generator).clamp_(min=1e-20)
            self.gumbel = -torch.log(-torch.log(u))

    def __call__(self, logits: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [R] and q [R, V] (None for all-greedy batches) from draft logits [R, V]."""
        if not self.stochastic:
            return logits.argmax(-1), None
        z = logits * self.inv_t
        token = (z + self.gumbel[step]).argmax(-1)
        q = torch.softmax(z, -1)
        if self.mixed:
            greedy = logits.argmax(-1)
            token = torch.where(self.greedy_rows, greedy, token)
            q = torch.where(self.greedy_rows[:, None], torch.nn.functional.one_hot(greedy, q.shape[-1]).float(), q)
        return token, q


class _Requests:
    """The requests of one ``generate`` call and the slots serving them (continuous batching).

    Per request: its response so far and whether it ended with EOS; the queue of requests not yet admitted.
    Per slot: the request it serves (-1: free), that request's Philox key, its valid cache length (tokens
    so far - 1) and its last emitted token, not yet in the cache.
    """

    def __init__(self, prompts: list[list[int]], seeds: list[int], num_slots: int) -> None:
        if len(prompts) != len(seeds):
            raise ValueError(f"prompts and seeds must have the same length, got {len(prompts)} and {len(seeds)}")
        if any(len(p) < 1 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.prompts, self.seeds = prompts, seeds
        self.responses: list[list[int]] = [[] for _ in prompts]
        self.finished = [False] * len(prompts)
        self.queue = deque(range(len(prompts)))
        self.store: _PromptStore | None = None  # built at the first admission (needs the policy)
        self.slot_req = [-1] * num_slots
        self.seed_t = torch.zeros(num_slots, dtype=torch.long)
        self.length = torch.zeros(num_slots, dtype=torch.long)
        self.last = torch.zeros(num_slots, dtype=torch.long)

    def rollouts(self, stats: RolloutStats, t_start: float) -> Rollouts:
        """The responses in request order, with the call's token count and wall time booked in ``stats``."""
        stats.tokens = sum(len(x) + int(f) for x, f in zip(self.responses, self.finished, strict=True))
        stats.time_s = time.perf_counter() - t_start
        return Rollouts(self.responses, self.finished, stats)


class RolloutEngine:
    """Generates responses for token prompts with the policy, autoregressively or speculatively."""

    def __init__(self, policy: Qwen3, drafter: SlotDrafter | None, eos_id: int) -> None:
        self.policy = policy
        self.drafter = drafter
        self.eos_id = eos_id
        self.sync()

    def sync(self) -> None:
        """Weight sync: refresh the policy's fused inference weights and the drafter's shared weights."""
        self.policy.sync_inference_weights()
        if self.drafter is not None:
            self.drafter.sync(self.policy)

    def _record_round(
        self, stats: RolloutStats, times: tuple[float, float, float, float], active: list[int],
        out: list[list[int]], num_acc: list[int], req: _Requests, max_new_tokens: int,
    ) -> list[list[int]]:
        """Book one verification round: timings (draft / target / verify between the four ``times``),
        acceptance counters, each active slot's emitted tokens appended to its response (stopping at EOS or
        ``max_new_tokens``, which frees the slot). Returns the emitted tokens per active slot."""
        t0, t1, t2, t3 = times
        stats.draft_s += t1 - t0
        stats.target_s += t2 - t1
        stats.verify_s += t3 - t2
        stats.forwards += 1
        stats.rounds += len(active)
        outputs = []
        for i, s in enumerate(active):
            a = num_acc[i]
            emitted = out[i][: a + 1]
            outputs.append(emitted)
            stats.emitted_per_round += a + 1
            for j in range(a):
                stats.accepted_at[j] += 1
            req.last[s] = emitted[-1]
            r = req.slot_req[s]
            resp = req.responses[r]
            for tok in emitted:
                if tok == self.eos_id:
                    req.finished[r] = True
                    break
                resp.append(tok)
                if len(resp) >= max_new_tokens:
                    break
            if req.finished[r] or len(resp) >= max_new_tokens:
                req.slot_req[s] = -1
        return outputs

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], seeds: list[int], config: GenerationConfig) -> Rollouts:
        """Sample one response per prompt (prompts include BOS; ``seeds`` are int64 Philox keys per request)."""
        req = _Requests(prompts, seeds, min(config.max_batch, len(prompts)))
        spec = config.spec != "none"
        if spec and self.drafter is None:
            raise ValueError(f"spec={config.spec!r} needs a drafter")
        if config.spec == "tree":
            raise ValueError("spec='tree' is not supported by this engine yet")
        self.policy.eval()
        t_start = time.perf_counter()
        k = config.k if spec else 0
        num_slots = len(req.slot_req)
        max_len = max(map(len, prompts)) + config.max_new_tokens + k + 1
        if max_len > self.policy.config.max_position_embeddings:
            raise ValueError(f"prompt + max_new_tokens + k = {max_len} exceeds max_position_embeddings")
        cache = KVCache(self.policy.config, num_slots, max_len)
        if spec:
            self.drafter.reset(num_slots, max_len)
        stats = RolloutStats(k=k, accepted_at=[0] * k)
        generator = torch.Generator().manual_seed(int(sum(seeds)) & 0x7FFFFFFF)
        seed_t, length, last = req.seed_t, req.length, req.last
        temp = torch.full((num_slots,), float(config.temperature))
        vocab = self.policy.config.vocab_size
        hidden_layers = self.drafter.hidden_layers if spec else ()
        backend = resolve_verify_backend(config.backend)
        while True:
            active = self._admit(req, cache, hidden_layers, self.drafter if spec else None, stats)
            if not active:
                break
            rows = None if len(active) == num_slots else torch.tensor(active)
            idx = slice(None) if rows is None else rows
            start = length[idx]
            r = len(active)
            t0 = time.perf_counter()
            if spec:
                drafts, q = self.drafter.propose(rows, k, temp[idx], generator)
                ids = torch.cat([last[idx][:, None], drafts], 1)
            else:
                drafts, q = torch.zeros(0, dtype=torch.long), None
                ids = last[idx][:, None]
            t1 = time.perf_counter()
            logits, hidden = self.policy.step(ids, cache, rows, start, int(start.max()) + k + 1,
                                              hidden_layers=hidden_layers)
            t2 = time.perf_counter()
            res = sk.verify_chain(
                logits.reshape(r * (k + 1), vocab), drafts.reshape(-1),
                torch.arange(r + 1, dtype=torch.long) * k,
                draft_probs=None if q is None else q.reshape(r * k, vocab),
                temperature=temp[idx], seed=seed_t[idx], position=start + 1,
                backend=backend, max_draft_len=k,
            )
            out = res.output_token_ids.tolist()
            num_acc = res.num_accepted.tolist()
            t3 = time.perf_counter()
            length[idx] += 1 + res.num_accepted.long()
            outputs = self._record_round(stats, (t0, t1, t2, t3), active, out, num_acc, req, config.max_new_tokens)
            if spec:
                self.drafter.commit(rows, num_acc, outputs, hidden)
        return req.rollouts(stats, t_start)

    def _admit(
        self, req: _Requests, cache: KVCache, hidden_layers: tuple[int, ...], drafter: SlotDrafter | None,
        stats: RolloutStats,
    ) -> list[int]:
        """Start queued requests in free slots (and in ``drafter``); returns the active slots.

        A request's prompt keys/values come from the call's :class:`_PromptStore` (every distinct prompt
        prefilled once, in one forward, at the first admission), so admitting is a copy and a freed slot
        is refilled at once: no slot idles waiting for a prefill batch.
        """
        num_slots, queue, slot_req = len(req.slot_req), req.queue, req.slot_req
        free = [s for s in range(num_slots) if slot_req[s] < 0]
        if queue and free:
            t0 = time.perf_counter()
            if req.store is None:
                req.store = _PromptStore(self.policy, req.prompts, hidden_layers)
            admitted = [(s, queue.popleft()) for s in free[: len(queue)]]
            slots = [s for s, _ in admitted]
            prompts = [req.prompts[r] for _, r in admitted]
            hidden = req.store.copy_into(cache, slots, prompts)
            for s, r in admitted:
                slot_req[s] = r
                req.seed_t[s] = req.seeds[r]
                req.length[s] = len(req.prompts[r]) - 1
                req.last[s] = req.prompts[r][-1]
            if drafter is not None:
                drafter.admit(slots, prompts, hidden)
            stats.prefill_s += time.perf_counter() - t0
        return [s for s in range(num_slots) if slot_req[s] >= 0]


class _PromptStore:
    """Prompt keys/values (and the policy hidden states a drafter needs) of every distinct prompt of one
    ``generate`` call, from ONE prefill forward over all of them.

    GRPO samples a group of responses per prompt, so distinct prompts are a fraction of the requests; and a
    prefill forward costs about as much as a decode forward at these sizes (per-op overhead), so one batched
    prefill replaces one per admission. Admission copies a prompt's cached rows into the request's slot.
    Every token but the last of each prompt is stored (the last one is the first decode input).
    """

    def __init__(self, policy: Qwen3, prompts: list[list[int]], hidden_layers: tuple[int, ...]) -> None:
        self.index: dict[tuple[int, ...], int] = {}
        for p in prompts:
            self.index.setdefault(tuple(p), len(self.index))
        distinct = list(self.index)
        self.width = max(map(len, distinct)) - 1
        self.hidden: list[torch.Tensor] = []
        if self.width == 0:
            return
        self.cache = KVCache(policy.config, len(distinct), self.width)
        ids = torch.zeros(len(distinct), self.width, dtype=torch.long)
        for i, p in enumerate(distinct):
            ids[i, : len(p) - 1] = torch.tensor(p[:-1])
        _, self.hidden = policy.step(ids, self.cache, None, torch.zeros(len(distinct), dtype=torch.long),
                                     self.width, hidden_layers=hidden_layers)

    def copy_into(self, cache: KVCache, slots: list[int], prompts: list[list[int]]) -> list[torch.Tensor]:
        """Copy the stored ``prompts`` into cache rows ``slots``; returns their hidden states ([A, W, H] each)."""
        if self.width == 0:
            return []
        src = torch.tensor([self.index[tuple(p)] for p in prompts])
        dst = torch.tensor(slots)
        cache.k[:, dst, :, : self.width] = self.cache.k[:, src]
        cache.v[:, dst, :, : self.width] = self.cache.v[:, src]
        return [h[src] for h in self.hidden]
