"""specdec_kernels.models: the one Qwen3 implementation behind the policy, draft models and drafter heads."""

from .qwen3 import (
    CachedAttention,
    DecoderLayer,
    FullAttention,
    KVCache,
    ModelConfig,
    Qwen3,
    RMSNorm,
    Rotary,
    load_pretrained,
    num_parameters,
    save_pretrained,
    step_mask,
)

__all__ = [
    "CachedAttention", "DecoderLayer", "FullAttention", "KVCache", "ModelConfig", "Qwen3", "RMSNorm", "Rotary",
    "load_pretrained", "num_parameters", "save_pretrained", "step_mask",
]
