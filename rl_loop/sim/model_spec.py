"""Transformer descriptions (dense or MoE) and what one forward pass reads and computes.

Everything here is per forward pass over a batch, before dividing across devices: bytes of weights
touched, bytes of KV cache read, FLOPs. :mod:`rl_loop.sim.generation` turns these into time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (Qwen3 layout: GQA attention, SwiGLU MLP or MoE of SwiGLU experts).

    ``intermediate_size`` is the dense MLP width (unused for MoE layers); an MoE layer holds
    ``num_experts`` experts of width ``moe_intermediate_size``, ``experts_per_token`` of them active.
    ``extra_params`` counts weights outside the decoder layers and the LM head (e.g. an EAGLE-3 head's
    input fusion), read on every forward.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    tie_embeddings: bool = False
    extra_params: int = 0
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError("experts_per_token must be in [1, num_experts] for an MoE model")
        if not self.num_experts and self.intermediate_size <= 0:
            raise ValueError("a dense model needs intermediate_size > 0")

    # ---- parameter counts -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        return q + kv + o

    @property
    def expert_params(self) -> int:
        """Parameters of one MoE expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self.num_experts * self.expert_params + self.hidden_size * self.num_experts  # + router
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        layers = self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer)
        return layers + self.lm_head_params + self.embedding_params + self.extra_params

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies with (embedding lookup excluded, as in 6ND accounting)."""
        if self.is_moe:
            mlp = self.experts_per_token * self.expert_params + self.hidden_size * self.num_experts
        else:
            mlp = self.mlp_params_per_layer
        return self.num_layers * (self.attention_params_per_layer + mlp) + self.lm_head_params + self.extra_params

    @property
    def dense_params(self) -> int:
        """Parameters every forward reads whatever the routing: attention, router, LM head, extras."""
        router = self.hidden_size * self.num_experts if self.is_moe else self.mlp_params_per_layer
        return self.num_layers * (self.attention_params_per_layer + router) + self.lm_head_params + self.extra_params

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param

    def with_(self, **changes) -> ModelSpec:
        return replace(self, **changes)

    # ---- per-forward costs ------------------------------------------------------------------------
    def experts_touched(self, num_tokens: float) -> float:
        """Expected distinct experts per MoE layer hit by ``num_tokens`` tokens under uniform routing.

        Why it matters: verifying k + 1 tokens per sequence reads more experts than decoding one, so for
        small MoE batches verification is not free; at RL batch sizes every expert is read anyway.
        """
        if not self.is_moe:
            return 0.0
        miss = (1.0 - self.experts_per_token / self.num_experts) ** max(num_tokens, 0.0)
        return self.num_experts * (1.0 - miss)

    def weight_bytes(self, num_tokens: float) -> tuple[float, float]:
        """(dense bytes, expert bytes) of weights read by one forward over ``num_tokens`` tokens."""
        dense = self.dense_params * self.bytes_per_param
        experts = self.num_layers * self.experts_touched(num_tokens) * self.expert_params * self.bytes_per_param
        return dense, experts

    def linear_flops(self, num_tokens: float) -> float:
        """Matmul FLOPs of one forward over ``num_tokens`` tokens: 2 x active params per token."""
        return 2.0 * self.active_params * num_tokens

    def attention_flops(self, query_tokens: float, context_tokens: float) -> float:
        """QK^T and PV FLOPs: ``query_tokens`` attending, on average, over ``context_tokens`` keys each."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim * query_tokens * context_tokens


# Qwen3-8B (config.json): 36 layers, hidden 4096, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936,
# untied embeddings -> 8.19 B parameters.
QWEN3_8B = ModelSpec(
    name="Qwen3-8B", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
    vocab_size=151936, intermediate_size=12288,
)
# Qwen3-235B-A22B: 94 layers, hidden 4096, 64 q / 4 kv heads of 128, 128 experts of width 1536, 8 active.
QWEN3_235B_A22B = ModelSpec(
    name="Qwen3-235B-A22B", num_layers=94, hidden_size=4096, num_heads=64, num_kv_heads=4, head_dim=128,
    vocab_size=151936, num_experts=128, experts_per_token=8, moe_intermediate_size=1536,
)


def eagle3_head(target: ModelSpec, draft_vocab: int = 32000, intermediate_size: int | None = None) -> ModelSpec:
    """An EAGLE-3 drafter for ``target``: one decoder layer of the target's shape, an input fusion of
    three hidden states (3h x h) and an LM head over a reduced draft vocabulary; embeddings are shared
    with the target (not counted). A dense layer (``intermediate_size``, default the target's MLP width or
    3 x hidden for an MoE target) stands in for the target's layer."""
    return ModelSpec(
        name=f"EAGLE-3({target.name})", num_layers=1, hidden_size=target.hidden_size,
        num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
        vocab_size=draft_vocab,
        intermediate_size=intermediate_size or target.intermediate_size or 3 * target.hidden_size,
        tie_embeddings=True, extra_params=3 * target.hidden_size * target.hidden_size, dtype=target.dtype,
    )
