"""The one rollout engine: batched autoregressive, chain- and tree-speculative rollouts on our kernels.

The engine drives a fixed number of *slots* (rows of the KV cache). Requests wait in a queue; whenever a
slot frees up (EOS or length cap) the next request starts in it, so the batch stays full across a GRPO
group (continuous batching). Every distinct prompt of a call is prefilled once, all in one forward, and
copied into the slots of its requests (a GRPO group shares its prompt), with the policy features the
drafter needs. Every round, for the active slots, the call's strategy (``strategies.py``: autoregressive,
chain or tree) proposes, the policy runs the proposal in ONE forward against the cache, the strategy
verifies (``verify_chain`` / ``verify_tree``, native CPU backend when built) and commits; the engine
books the emitted tokens and the statistics.

Randomness: request ``i`` carries a Philox key ``seed[i]``; the first row of a round decides absolute
position ``position = length + 1`` (the index of the next token in prompt + response); drafts are drawn at
the positions they propose (stream 3). See ``strategies.py`` for why this is lossless and batch invariant.
Tokens emitted past EOS or past ``max_new_tokens`` are discarded; truncating a sequence keeps its law.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from specdec_kernels import SamplingMask
from specdec_kernels.drafters import CachedDrafter
from specdec_kernels.drafters.training import sync_shared_weights
from specdec_kernels.models import KVCache, ModelConfig, Qwen3

from .cuda_graphs import GraphedStep, cuda_graph
from .decode import PolicyStep
from .device import module_device, weight_dtype
from .rollouts import GenerationConfig, RolloutMask, Rollouts, RolloutStats, resolve_verify_backend
from .strategies import strategy_for
from .weight_fingerprint import (
    ROLES,
    Prints,
    fingerprint,
    fused_copy,
    native_copy,
    same_storage,
    trainer_prints,
    trainer_tensors,
    verify,
)


class _Requests:
    """The requests of one ``generate`` call and the slots serving them (continuous batching).

    Per request: its response so far and whether it ended with EOS; the queue of requests not yet admitted.
    Per slot: the request it serves (-1: free), that request's Philox key, its valid cache length (tokens
    so far - 1) and its last emitted token, not yet in the cache.
    """

    def __init__(self, prompts: list[list[int]], seeds: list[int], num_slots: int,
                 device: torch.device = torch.device("cpu")) -> None:
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
        self.seed_t = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.length = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.last = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.length_host = [0] * num_slots  # ``length`` as the host knows it: attention spans without a sync
        self.kept: list[list[torch.Tensor]] | None = None  # per request, per token: its kept ids (record_mask)

    def rollouts(self, stats: RolloutStats, t_start: float) -> Rollouts:
        """The responses in request order, with the call's token count and wall time booked in ``stats``."""
        stats.tokens = sum(len(x) + int(f) for x, f in zip(self.responses, self.finished, strict=True))
        stats.time_s = time.perf_counter() - t_start
        masks = None if self.kept is None else [RolloutMask.of(k) for k in self.kept]
        return Rollouts(self.responses, self.finished, stats, masks)


class RolloutEngine:
    """Generates responses for token prompts with the policy, autoregressively or speculatively."""

    def __init__(self, policy: Qwen3, drafter: CachedDrafter | None, eos_id: int, decode: str = "auto",
                 check_sync: bool = True, graphs: bool | None = None, graph_capture=cuda_graph) -> None:
        """``graphs``: replay the round forward of both arms as CUDA graphs (``cuda_graphs.py``; default:
        on a cuda policy); ``graph_capture`` is the capture (tests pass ``cuda_graphs.EagerGraph``)."""
        self.policy = policy
        self.device = module_device(policy)
        self.policy_step = PolicyStep(policy, decode)  # both arms' policy forward (``decode.py``)
        if graphs is None:
            graphs = self.device.type == "cuda"
        self.graphed = GraphedStep(self.policy_step, graph_capture) if graphs else None
        self.round_step = self.graphed or self.policy_step
        self.caches: dict[int, KVCache] = {}  # with graphs: one cache per slot count (graphs hold its address)
        self.drafter = drafter
        self.eos_id = eos_id
        self.version = 0
        self.check_sync = check_sync
        self.sync()

    def sync(self, version: int | None = None) -> None:
        """Weight sync: refresh the policy's fused inference weights and the drafter's shared weights (the
        drafter re-packs its own at every ``generate``); ``version`` tags the weights now served. Then,
        with ``check_sync``, every served copy is compared with the trainer's weights (``weight_fingerprint``:
        raises ``WeightSyncError`` naming the tensor of a missed sync)."""
        self.policy.sync_inference_weights()
        self.policy_step.sync()
        if self.graphed is not None:
            self.graphed.reset()
        if self.drafter is not None:
            sync_shared_weights(self.drafter.head, self.policy)
        if version is not None:
            self.version = version
        if self.check_sync:
            served = self.served_prints()
            names = {role: set().union(*(copy.get(role, {}) for copy in served.values())) for role in ROLES}
            expected = trainer_prints(self.policy.state_dict(), self.drafter, names)
            for label, prints in served.items():
                verify(expected, prints, self.version, f"the in-process engine ({label})")

    def served_prints(self, own: dict[str, dict[str, torch.Tensor]] | None = None) -> dict[str, dict[str, Prints]]:
        """Fingerprints of every copy of the weights this engine serves, by copy, then role, then the trainer's
        tensor name: the policy's fused inference weights, the native decode path's packed weights (when it
        runs) and the drafter head. A tensor that is ``own``'s memory (default: the policy's and drafter's
        tensors as a synced server holds them, ``weight_fingerprint.trainer_tensors``) is not a copy and is
        left out."""
        own = trainer_tensors(self.policy.state_dict(), self.drafter) if own is None else own
        copies = {"fused inference weights": {"policy": fused_copy(self.policy)}}
        if self.policy_step.weights:
            copies["native decode weights"] = {"policy": native_copy(self.policy, self.policy_step.weights)}
        if self.drafter is not None:
            copies["drafter head"] = {"drafter": self.drafter.head.state_dict()}
        return {label: {role: fingerprint({n: t for n, t in tensors.items() if not same_storage(t, own[role].get(n))})
                        for role, tensors in copy.items()} for label, copy in copies.items()}

    def summary(self) -> dict:
        """What ``summary.json`` records about the engine (the vLLM backend records its method)."""
        return {"decode_path": self.policy_step.path}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], seeds: list[int], config: GenerationConfig,
                 strategy: object | None = None) -> Rollouts:
        """Sample one response per prompt (prompts include BOS; ``seeds`` are int64 Philox keys per request).
        ``strategy`` replaces the one ``config`` names (the equivalence check's planted lossy control)."""
        req = _Requests(prompts, seeds, min(config.max_batch, len(prompts)), self.device)
        if strategy is None:
            strategy = strategy_for(config.spec, self.drafter, config.k, config.tree_shape, config.temperature,
                                    config.verify)
        strategy.record_mask, strategy.top_k, strategy.top_p = config.record_mask, config.top_k, config.top_p
        if config.record_mask:
            req.kept = [[] for _ in prompts]
        self.policy.eval()
        t_start = time.perf_counter()
        num_slots = len(req.slot_req)
        width = strategy.width
        max_len = max(map(len, prompts)) + config.max_new_tokens + width + 1
        if max_len > self.policy.config.max_position_embeddings:
            raise ValueError(f"prompt + max_new_tokens + {width} rows per round = {max_len} exceeds "
                             "max_position_embeddings")
        cache = self._cache(num_slots, max_len)
        strategy.reset(num_slots, cache.max_len)
        stats = RolloutStats(k=strategy.depth, accepted_at=[0] * strategy.depth)
        length, last = req.length, req.last
        temp = torch.full((num_slots,), float(config.temperature), device=self.device)
        backend = resolve_verify_backend(config.backend, self.device.type)
        all_rows = torch.arange(num_slots, device=self.device)
        while True:
            active = self._admit(req, cache, strategy, stats)
            if not active:
                break
            every = len(active) == num_slots  # the policy reads the cache as views, without a gather
            rows = all_rows if every else torch.tensor(active, device=self.device)  # (a copy from the host)
            start = length[rows]
            kv_len = max(req.length_host[s] for s in active) + width
            temp_r, seed_r, position = temp[rows], req.seed_t[rows], start + 1
            t0 = time.perf_counter()
            prop = strategy.propose(rows, last[rows], temp_r, seed_r, position)
            t1 = time.perf_counter()
            logits, hidden = self._forward(prop, cache, rows, every, start, kv_len, length, strategy.capture)
            t2 = time.perf_counter()
            ver = strategy.verify(logits, prop, temp_r, seed_r, position, backend)
            strategy.compact(cache, rows, start, ver)
            length[rows] += 1 + ver.num_accepted.long()
            last[rows] = ver.output_token_ids.gather(1, ver.num_accepted.long()[:, None])[:, 0].long()
            out, num_acc = ver.output_token_ids.tolist(), ver.num_accepted.tolist()  # both arms' one sync
            t3 = time.perf_counter()
            self._record_round(stats, (t0, t1, t2, t3), active, out, num_acc, req, config.max_new_tokens, ver.mask)
            strategy.commit(rows, ver, hidden)
        return req.rollouts(stats, t_start)

    def _forward(self, prop, cache: KVCache, rows: torch.Tensor, every: bool, start: torch.Tensor, kv_len: int,
                 length: torch.Tensor, capture: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The round's policy forward: logits [R, n, V] and captured hidden states of the active ``rows``.

        With graphs, a causal round of a partial batch still runs every slot (the captured shape): an idle
        slot's row reads its stale last token and writes keys/values past its own dead prefix, which the next
        request admitted there overwrites before attending to them; its outputs are dropped."""
        causal = prop.depth is None and prop.tree_mask is None
        if every or self.graphed is None or not causal:
            return self.round_step(prop.tokens, cache, None if every else rows, start, kv_len, depth=prop.depth,
                                   tree_mask=prop.tree_mask, capture=capture)
        tokens = torch.zeros((cache.batch, prop.tokens.shape[1]), dtype=prop.tokens.dtype, device=self.device)
        tokens[rows] = prop.tokens
        # an idle slot's length may run past the context by a round's overshoot; active ones never do
        start_all = length.clamp(max=cache.max_len - tokens.shape[1])
        logits, hidden = self.round_step(tokens, cache, None, start_all, kv_len, capture=capture)
        return logits[rows], [h[rows] for h in hidden]

    def _cache(self, num_slots: int, max_len: int) -> KVCache:
        """The policy's KV cache of a call: fresh on cpu; with graphs one per slot count, as long as the
        policy's context (graphs hold its address, so every call's shapes match)."""
        dtype = weight_dtype(self.device)
        if self.graphed is None:
            return KVCache(self.policy.config, num_slots, max_len, dtype=dtype, device=self.device)
        cache = self.caches.get(num_slots)
        if cache is None:
            cache = KVCache(self.policy.config, num_slots, self.policy.config.max_position_embeddings, dtype=dtype,
                            device=self.device)
            self.caches[num_slots] = cache
        return cache

    def _record_round(
        self, stats: RolloutStats, times: tuple[float, float, float, float], active: list[int],
        out: list[list[int]], num_acc: list[int], req: _Requests, max_new_tokens: int,
        mask: SamplingMask | None = None,
    ) -> None:
        """Book one verification round: timings (draft / target / verify between the four ``times``),
        acceptance counters, each active slot's emitted tokens appended to its response (stopping at EOS or
        ``max_new_tokens``, which frees the slot), and with ``mask`` (the round's sampling mask) the kept ids
        of each kept token, the EOS included, to its request's ``kept``."""
        t0, t1, t2, t3 = times
        stats.draft_s += t1 - t0
        stats.target_s += t2 - t1
        stats.verify_s += t3 - t2
        stats.forwards += 1
        stats.rounds += len(active)
        if mask is not None and req.kept is not None:
            indptr, first = mask.indptr.tolist(), mask.cu_num_emitted.tolist()
        for i, s in enumerate(active):
            a = num_acc[i]
            emitted = out[i][: a + 1]
            stats.emitted_per_round += a + 1
            for j in range(a):
                stats.accepted_at[j] += 1
            req.length_host[s] += a + 1
            r = req.slot_req[s]
            resp = req.responses[r]
            for t, tok in enumerate(emitted):
                if mask is not None and req.kept is not None:
                    e = first[i] + t
                    req.kept[r].append(mask.indices[indptr[e]:indptr[e + 1]])
                if tok == self.eos_id:
                    req.finished[r] = True
                    break
                resp.append(tok)
                if len(resp) >= max_new_tokens:
                    break
            if req.finished[r] or len(resp) >= max_new_tokens:
                req.slot_req[s] = -1

    def _admit(self, req: _Requests, cache: KVCache, strategy, stats: RolloutStats) -> list[int]:
        """Start queued requests in free slots (and in the strategy's drafter); returns the active slots.

        A request's prompt keys/values come from the call's :class:`_PromptStore` (every distinct prompt
        prefilled once, in one forward, at the first admission), so admitting is a copy and a freed slot
        is refilled at once: no slot idles waiting for a prefill batch.
        """
        num_slots, queue, slot_req = len(req.slot_req), req.queue, req.slot_req
        free = [s for s in range(num_slots) if slot_req[s] < 0]
        if queue and free:
            t0 = time.perf_counter()
            if req.store is None:
                req.store = _PromptStore(self.policy.config, self.policy_step, req.prompts, strategy.capture,
                                         self.device)
            admitted = [(s, queue.popleft()) for s in free[: len(queue)]]
            slots = [s for s, _ in admitted]
            prompts = [req.prompts[r] for _, r in admitted]
            hidden = req.store.copy_into(cache, slots, prompts)
            for s, r in admitted:
                slot_req[s] = r
                req.length_host[s] = len(req.prompts[r]) - 1
            dst = torch.tensor(slots, device=self.device)
            req.seed_t[dst] = torch.tensor([req.seeds[r] for _, r in admitted], device=self.device)
            req.length[dst] = torch.tensor([req.length_host[s] for s in slots], device=self.device)
            req.last[dst] = torch.tensor([p[-1] for p in prompts], device=self.device)
            strategy.admit(slots, prompts, hidden)
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

    def __init__(self, config: ModelConfig, step: PolicyStep, prompts: list[list[int]], capture: tuple[int, ...],
                 device: torch.device = torch.device("cpu")) -> None:
        self.index: dict[tuple[int, ...], int] = {}
        for p in prompts:
            self.index.setdefault(tuple(p), len(self.index))
        distinct = list(self.index)
        self.width = max(map(len, distinct)) - 1
        self.hidden: list[torch.Tensor] = []
        self.device = device
        if self.width == 0:
            return
        self.cache = KVCache(config, len(distinct), self.width, dtype=weight_dtype(device), device=device)
        ids = torch.zeros(len(distinct), self.width, dtype=torch.long)
        for i, p in enumerate(distinct):
            ids[i, : len(p) - 1] = torch.tensor(p[:-1])
        _, self.hidden = step(ids.to(device), self.cache, None, torch.zeros(len(distinct), dtype=torch.long,
                                                                               device=device),
                              self.width, capture=capture)

    def copy_into(self, cache: KVCache, slots: list[int], prompts: list[list[int]]) -> list[torch.Tensor]:
        """Copy the stored ``prompts`` into cache rows ``slots``; returns their hidden states ([A, W, H] each)."""
        if self.width == 0:
            return []
        src = torch.tensor([self.index[tuple(p)] for p in prompts], device=self.device)
        dst = torch.tensor(slots, device=self.device)
        cache.k[:, dst, :, : self.width] = self.cache.k[:, src]
        cache.v[:, dst, :, : self.width] = self.cache.v[:, src]
        return [h[src] for h in self.hidden]
