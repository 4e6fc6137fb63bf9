"""What a rollout engine takes and returns: :class:`GenerationConfig` in, :class:`Rollouts` (with
:class:`RolloutStats`) out. Every engine (ours, vLLM's) speaks these types. Also a step's requests and
the batches built from them: the training batch of its rollouts and the supervised batch of the warm starts."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

import specdec_kernels as sk

from ..task import CharTokenizer, Problem, reward

SPEC_MODES = ("none", "chain", "tree")
# How speculative rounds are verified: "token" (token level, either spec), "block" (chains: block
# verification, Sun et al.), "traversal" (trees: traversal verification, Weng et al.). All are lossless.
VERIFY_METHODS = ("token", "block", "traversal")
VERIFY_SPEC = {"block": "chain", "traversal": "tree"}  # the one spec each optimal method verifies


@dataclass(frozen=True)
class TreeShape:
    """A draft tree of ``depth`` levels: the root's ``top_k`` best (greedy) or drawn (sampled: without
    replacement, Gumbel-top-k on the draft stream) children, then at each further level the ``beam`` best
    nodes by cumulative draft log-probability expanded the same way (``Drafter.propose_tree``)."""

    depth: int
    top_k: int = 2
    beam: int = 1

    def __post_init__(self) -> None:
        if min(self.depth, self.top_k, self.beam) < 1:
            raise ValueError(f"depth, top_k and beam must be >= 1, got {self}")

    @staticmethod
    def for_k(k: int) -> TreeShape:
        """The default tree for ``--k k``: depth k, two children at the root and under the best node of
        each level (2k draft nodes)."""
        return TreeShape(depth=k)

    @property
    def num_nodes(self) -> int:
        """Nodes per request, the root included (the same for every request)."""
        sizes = [self.top_k]
        for _ in range(1, self.depth):
            sizes.append(min(self.beam, sizes[-1]) * self.top_k)
        return 1 + sum(sizes)


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: sampling, speculation and batching knobs."""

    max_new_tokens: int = 48
    temperature: float = 1.0
    spec: str = "chain"
    k: int = 3
    max_batch: int = 32
    backend: str = "default"  # verify_chain / verify_tree backend; "default": see resolve_verify_backend
    tree: TreeShape | None = None  # spec="tree": the draft tree (None: TreeShape.for_k(k))
    # verification method of the speculative rounds (VERIFY_METHODS); spec="none" has no drafts and
    # ignores it, so a run's autoregressive arm is ``replace(gen, spec="none")`` whatever its method
    verify: str = "token"
    # also record, per response token (and the EOS), the ids the target kept when it was sampled
    # (``Rollouts.masks``; the in-process engine only)
    record_mask: bool = False
    # truncation of the target (``verify_chain`` / ``verify_tree`` top_k, top_p): 0 / 1.0 keep every token
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.spec not in SPEC_MODES:
            raise ValueError(f"spec must be one of {SPEC_MODES}, got {self.spec!r}")
        if self.verify not in VERIFY_METHODS:
            raise ValueError(f"verify must be one of {VERIFY_METHODS}, got {self.verify!r}")
        if self.spec != "none" and VERIFY_SPEC.get(self.verify, self.spec) != self.spec:
            raise ValueError(f"verify={self.verify!r} verifies spec={VERIFY_SPEC[self.verify]!r} rounds, "
                             f"got spec={self.spec!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_k must be >= 0 and top_p in (0, 1], got {self.top_k} and {self.top_p}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")

    @property
    def tree_shape(self) -> TreeShape:
        return self.tree or TreeShape.for_k(self.k)


def resolve_verify_backend(name: str, device: str = "cpu") -> str:
    """The verification backend: "default" = on cpu the fastest CPU backend (native when built, else the
    reference; ``available_backends`` never ranks the Triton interpreter first), on cuda ``"auto"`` (the
    library picks its Triton / CUDA kernels per call); any explicit specdec_kernels backend name is passed
    through."""
    if name != "default":
        return name
    if device == "cuda":
        return "auto"
    return sk.available_backends("cpu")[0]


@dataclass
class RolloutStats:
    """Counters of one ``generate`` call (speculative counters are zero for ``spec="none"``)."""

    k: int = 0  # draft positions counted in accepted_at (chain: k; tree: its depth)
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


class RolloutMask(NamedTuple):
    """One rollout's sampling mask in CSR: token t of the response (then the EOS when finished) was sampled
    from the target's kept set ``indices[indptr[t]:indptr[t + 1]]`` (ascending ids; ``specdec_kernels``'s
    ``SamplingMask`` of the verifications that emitted them)."""

    indptr: torch.Tensor  # [len(response) + finished + 1] int64
    indices: torch.Tensor  # [indptr[-1]] int32

    @staticmethod
    def of(kept: list[torch.Tensor]) -> RolloutMask:
        """The CSR of per-token kept ids."""
        counts = torch.tensor([0] + [k.numel() for k in kept], dtype=torch.int64)
        indices = torch.cat(kept) if kept else torch.zeros(0, dtype=torch.int32)
        return RolloutMask(counts.cumsum(0), indices.to(torch.int32))


@dataclass
class Rollouts:
    """Responses of one ``generate`` call, in request order."""

    response_ids: list[list[int]]  # without EOS
    finished: list[bool]  # True when the response ended with EOS (False: hit max_new_tokens)
    stats: RolloutStats
    masks: list[RolloutMask] | None = None  # per response (``GenerationConfig.record_mask``)


def request_seeds(run_seed: int, step: int, n: int) -> list[int]:
    """Distinct int64 Philox keys for the n requests of a step (reproducible from the run seed)."""
    rng = random.Random(f"{run_seed}/{step}")
    return [rng.getrandbits(63) for _ in range(n)]


def step_requests(run_seed: int, prompts_per_step: int, group_size: int, train: list[Problem],
                  tok: CharTokenizer, step: int) -> tuple[list[Problem], list[list[int]], list[int]]:
    """Step ``step``'s problems (``prompts_per_step`` drawn from ``train``, each repeated ``group_size``
    times), their token prompts and Philox seeds, all reproducible from the run seed."""
    rng = random.Random(f"prompts/{run_seed}/{step}")
    problems = [p for p in rng.sample(train, prompts_per_step) for _ in range(group_size)]
    prompts = [tok.encode(p.prompt, bos=True) for p in problems]
    return problems, prompts, request_seeds(run_seed, step, len(prompts))


def build_batch(
    prompts: list[list[int]], responses: list[list[int]], finished: list[bool], tok: CharTokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, T] padded prompt + response (+ EOS), mask [N, T - 1]: logits row j predicts a response token)."""
    seqs = [p + r + ([tok.eos_id] if f else []) for p, r, f in zip(prompts, responses, finished, strict=True)]
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), tok.pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), t - 1, dtype=torch.bool)
    for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(p) - 1 : len(s) - 1] = True
    return ids, mask


def score(problems: list[Problem], rollouts: Rollouts, tok: CharTokenizer) -> torch.Tensor:
    """[N] rewards of the responses (``task.reward``)."""
    return torch.tensor([reward(p, tok.decode(r), f) for p, r, f in
                         zip(problems, rollouts.response_ids, rollouts.finished, strict=True)])


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
