"""The policy's decode paths: one engine forward (``Qwen3.step`` against the KV cache) on each of them.

Both arms of every speed comparison (autoregressive and speculative rollouts) run the policy through the
same path, so a speedup never comes from one arm having a slower policy forward than the other.

- ``"torch"``: ``Qwen3.step`` as framework ops (the fused q/k/v and gate/up matrices of
  ``pack_inference``; about 15 ops per layer).
- ``"native"``: every policy layer through ``specdec_kernels.native.decoder_step``, the fused C++ layer
  step the drafter heads use (one call per layer; its final-norm + LM-head tail is discarded for every
  layer but the last). Causal rows only (autoregressive and chain rounds, prompt prefill); a tree round's
  ancestor mask falls back to ``"torch"``.

``"auto"`` resolves to ``"native"`` when the extension is built, else ``"torch"``: the measured ranking
on the target machine (``python -m rl_loop.experiments.decode_bench`` times one-token decodes and (k + 1)-row
verification forwards of each path, ``torch.compile`` included, and writes the table the README quotes).
Both paths write the same cache layout (q/k heads interleaved), so they can share a cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_kernels import native
from specdec_kernels.models import KVCache, Qwen3

DECODE_PATHS = ("auto", "torch", "native")


def resolve_decode_path(name: str, qk_norm: bool = True, device: str = "cpu") -> str:
    """``name`` with ``"auto"`` resolved (module docstring; on cuda ``"torch"``, which ``cuda_graphs.py``
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
