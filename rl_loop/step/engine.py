"""The one rollout engine: batched autoregressive, chain- and tree-speculative rollouts on our kernels,
and everything it runs the policy with (the device, the decode path, CUDA graphs).

The engine drives a fixed number of *slots* (rows of the KV cache). Requests wait in a queue; whenever a
slot frees up (EOS or length cap) the next request starts in it, so the batch stays full across a GRPO
group (continuous batching). Every distinct prompt of a call is prefilled once, all in one forward, and
copied into the slots of its requests (a GRPO group shares its prompt), with the policy features the
drafter needs. Every round, for the active slots, the call's strategy (``strategies.py``: autoregressive,
chain or tree) proposes, the policy runs the proposal in ONE forward against the cache, the strategy
verifies (``verify_chain`` / ``verify_tree``, native CPU backend when built) and commits; the engine
books the emitted tokens and the statistics.

Devices (``--device cpu|cuda``; everything device-specific in rl_loop is named in this file; the rest of
the loop places its tensors on the policy's device and is otherwise the same code on both):

- ``cpu`` (default): float32 weights, verification on the native CPU kernels when built (``"default"``).
- ``cuda``: bf16 weights (the policy's LM-head matmul runs in bf16; ``Qwen3`` hands verification float32
  logits), verification with ``backend="auto"`` (the library's Triton / CUDA kernels), and CUDA graphs for
  the policy forward of both arms.

Decode paths (:class:`PolicyStep`): both arms of every speed comparison run the policy through the same
path, so a speedup never comes from one arm having a slower policy forward than the other.

- ``"torch"``: ``Qwen3.step`` as framework ops (the fused q/k/v and gate/up matrices of
  ``pack_inference``; about 15 ops per layer).
- ``"native"``: every policy layer through ``specdec_kernels.native.decoder_step``, the fused C++ layer
  step the drafter heads use (one call per layer). Causal rows only (autoregressive and chain rounds,
  prompt prefill); a tree round's ancestor mask falls back to ``"torch"``.
- ``"auto"``: ``"native"`` when the extension is built, else ``"torch"`` (the ranking that
  ``python -m rl_loop.experiments.decode_bench`` measures). Both paths write the same cache layout.

CUDA graphs (:class:`GraphedStep`): the autoregressive decode step and the speculative round's (k + 1)-row
verification forward, each captured once per batch shape and replayed, when every slot is active and the
rows are causal (a tree round and a partial batch run eagerly). Shapes are then static (the attention span
is the whole cache; ``Qwen3.step`` masks every slot past ``start + i``), so the replay needs no host-side
length. A graph holds the addresses of the cache and of the fused weights: the engine keeps one cache per
slot count on cuda and calls :meth:`GraphedStep.reset` on weight sync. The capture is injected: a CUDA
graph on a GPU; the CPU tests pass :class:`EagerGraph`, which replays by calling the function again."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdec_kernels import SamplingMask, native
from specdec_kernels.drafters import CachedDrafter
from specdec_kernels.drafters.training import sync_shared_weights
from specdec_kernels.models import KVCache, ModelConfig, Qwen3

from ..run.usage import UsageError
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

DEVICES = ("cpu", "cuda")


def check_device(name: str, cuda_available: bool | None = None) -> None:
    """``--device``: one of :data:`DEVICES`, and ``cuda`` only where torch sees a GPU (``cuda_available``
    overrides ``torch.cuda.is_available()`` for tests)."""
    if name not in DEVICES:
        raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if name == "cuda" and not available:
        raise UsageError("--device cuda: torch.cuda is not available here (no GPU, or a CPU-only torch); "
                         "use --device cpu")


def weight_dtype(device: str | torch.device) -> torch.dtype:
    """The policy's and drafter's weights on ``device``: bf16 on cuda, float32 on cpu."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def place(module: torch.nn.Module, device: str | torch.device) -> torch.nn.Module:
    """``module`` moved to ``device`` in its :func:`weight_dtype` (a no-op on cpu: float32 stays)."""
    return module.to(device=torch.device(device), dtype=weight_dtype(device))


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (where its inputs must live)."""
    return next(module.parameters()).device


DECODE_PATHS = ("auto", "torch", "native")


def resolve_decode_path(name: str, qk_norm: bool = True, device: str = "cpu") -> str:
    """``name`` with ``"auto"`` resolved (module docstring; on cuda ``"torch"``, which :class:`GraphedStep`
    graphs); raises ValueError for an unknown path and for ``"native"`` without the built extension, on a
    cuda policy (the kernel is a CPU op) or for a policy without q/k norms (the kernel runs Qwen3)."""
    if name not in DECODE_PATHS:
        raise ValueError(f"decode path must be one of {DECODE_PATHS}, got {name!r}")
    if device != "cpu":
        if name == "native":
            raise ValueError(f"decode path 'native' is a CPU kernel; the policy is on {device}")
        return "torch"
    built = native.has_op("decoder_step", "cpu")
    if name == "auto":
        return "native" if built and qk_norm else "torch"
    if name == "native" and not built:
        raise ValueError("decode path 'native' needs the native extension (python setup.py build_ext --inplace)")
    if name == "native" and not qk_norm:
        raise ValueError("decode path 'native' runs Qwen3 layers: the policy needs q/k norms (qk_norm=True)")
    return name


def describe(path: str) -> str:
    """A one-line description of a resolved decode path (``summary.json``'s ``ar_baseline``)."""
    if path == "native":
        return "policy: every layer through the fused native decoder_step (C++), one call per layer"
    if path == "torch":
        return "policy: Qwen3.step as torch ops (fused qkv / gate-up matrices)"
    return f"policy: served by the {path} engine"


class PolicyStep:
    """``Qwen3.step`` on a decode path. Call :meth:`sync` after every weight change (the engine does so on
    weight sync); the native path packs each layer's weights then."""

    def __init__(self, policy: Qwen3, path: str = "auto") -> None:
        self.policy = policy
        self.path = resolve_decode_path(path, policy.config.qk_norm, next(policy.parameters()).device.type)
        self.weights: list[list[torch.Tensor]] = []
        self.rope: torch.Tensor | None = None
        self.rows_all: torch.Tensor | None = None

    def sync(self) -> None:
        if self.path == "native":
            packed = [self.policy.native_step_args(i) for i in range(self.policy.config.num_hidden_layers)]
            self.weights = [w for w, _ in packed]
            self.rope = packed[0][1] if packed else None

    def __call__(
        self, input_ids: torch.Tensor, cache: KVCache, rows: torch.Tensor | None, start: torch.Tensor, kv_len: int,
        depth: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None, capture: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits [R, n, V] and the captured hidden states, as ``Qwen3.step`` returns them."""
        if self.path == "torch" or tree_mask is not None or not self.weights:
            return self.policy.step(input_ids, cache, rows, start, kv_len, depth=depth, tree_mask=tree_mask,
                                    capture=capture)
        c = self.policy.config
        capture = self.policy._capture(capture)
        r, n = input_ids.shape
        if depth is None:
            depth = torch.arange(n).expand(r, n).contiguous()
        if rows is None:
            rows = torch.arange(r)
        x = self.policy.model.embed_tokens(input_ids).float().contiguous()
        hidden: dict[int, torch.Tensor] = {}
        logits = None
        for i, weights in enumerate(self.weights):
            if i in capture:
                hidden[i] = x
            logits, x = native.decoder_step(x, weights, cache.k[i], cache.v[i], rows, start, depth, self.rope,
                                            c.num_attention_heads, c.rms_norm_eps)
        if c.num_hidden_layers in capture:
            hidden[c.num_hidden_layers] = F.rms_norm(x, (c.hidden_size,), self.policy.model.norm.weight,
                                                     c.rms_norm_eps)
        return logits, [hidden[i] for i in capture]


Step = Callable[..., tuple[torch.Tensor, list[torch.Tensor]]]


class EagerGraph:
    """A stand-in for a captured graph: :meth:`replay` calls ``fn`` again (same static inputs, same
    outputs written into the same tensors it returned at capture)."""

    def __init__(self, fn: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
        self.fn = fn
        self.outputs = fn()

    def replay(self) -> None:
        logits, hidden = self.fn()
        self.outputs[0].copy_(logits)
        for dst, src in zip(self.outputs[1], hidden, strict=True):
            dst.copy_(src)


class _CudaGraph:
    """``fn`` warmed up on a side stream, then captured into one ``torch.cuda.CUDAGraph``."""

    def __init__(self, fn: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy allocations (RoPE tables, cuBLAS workspaces) happen outside the capture
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn()

    def replay(self) -> None:
        self.graph.replay()


def cuda_graph(fn: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> _CudaGraph:
    """Capture ``fn`` (no arguments; reads and writes fixed tensors) as a CUDA graph."""
    return _CudaGraph(fn)


class GraphedStep:
    """A policy step (:class:`PolicyStep`'s call signature) whose full-batch causal rounds replay graphs.

    The warm-up and the capture run the forward on the round's real inputs; its cache writes (keys/values
    at ``start + i``) are the replay's own, so capturing on the first round of a shape loses nothing.
    """

    def __init__(self, step: Step, capture: Callable = cuda_graph) -> None:
        self.step = step
        self.capture = capture
        self.graphs: dict[tuple, tuple[KVCache, torch.Tensor, torch.Tensor, object]] = {}

    def reset(self) -> None:
        """Drop every graph (the weights they read were replaced)."""
        self.graphs.clear()

    def __call__(self, input_ids: torch.Tensor, cache: KVCache, rows: torch.Tensor | None, start: torch.Tensor,
                 kv_len: int, depth: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                 capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if rows is not None or depth is not None or tree_mask is not None:
            return self.step(input_ids, cache, rows, start, kv_len, depth=depth, tree_mask=tree_mask,
                             capture=capture)
        key = (tuple(input_ids.shape), capture, id(cache))
        entry = self.graphs.get(key)
        if entry is None or entry[0] is not cache:
            ids, st = input_ids.clone(), start.clone()
            graph = self.capture(lambda: self.step(ids, cache, None, st, cache.max_len, capture=capture))
            self.graphs[key] = (cache, ids, st, graph)
        else:
            _, ids, st, graph = entry
            ids.copy_(input_ids)
            st.copy_(start)
        graph.replay()  # a capture records without running: the first round of a shape replays too
        return graph.outputs


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
        """``graphs``: replay the round forward of both arms as CUDA graphs (:class:`GraphedStep`; default:
        on a cuda policy); ``graph_capture`` is the capture (tests pass :class:`EagerGraph`)."""
        self.policy = policy
        self.device = module_device(policy)
        self.policy_step = PolicyStep(policy, decode)  # both arms' policy forward (:class:`PolicyStep`)
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
