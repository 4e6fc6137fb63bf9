"""Weight-sync check: a fingerprint of the weights a generator serves, compared with the trainer's after every sync.

A drafter that misses a weight sync fails silently: the rollouts stay lossless (the policy verifies every
draft), only the acceptance collapses (vllm-ascend #13209, NeMo-RL #3699); a policy that misses one makes
the rollouts off-policy, again without an error. Every backend (``engine.RolloutEngine``,
``ray_rollout.RolloutPool``, ``vllm_backend.VllmRolloutEngine``) therefore fingerprints what it serves, on
the serving side, after each sync and compares it here with the trainer's.

The fingerprint of a tensor (:class:`TensorPrint`) is a few reductions, keyed by the trainer's tensor name:
two sums of the raw bits read as signed 16-bit integers (plain, and weighted by the fixed index pattern
``i % 251 + 1``, so a permutation changes it; exact integers), four float64 sums (sum, sum weighted by
``i % 7 + 1``, sum of squares, sum of absolute values) and four evenly strided samples. Comparison:

- same dtype on both sides (every backend today: float32 trained, float32 served): exact, the word sums
  must be equal (integer sums: independent of the summation order and thread count);
- a dtype conversion on the way (e.g. a bf16 server of a float32 trainer): the float sums within the
  rounding of the narrower dtype, ``eps = finfo(narrower).eps``: ``|d sum| <= eps * sum|x|``,
  ``|d weighted| <= 7 eps * sum|x|``, ``|d sum|x|| <= eps * sum|x|``, ``|d sum x^2| <= 2 eps * sum x^2``,
  every sample within ``eps * |x|`` (each element moves by at most ``eps / 2 * |x|``: a factor 2 of margin).

Only floating-point tensors are fingerprinted (integer buffers such as a drafter's ``d2t`` never train).
A mismatch raises :class:`WeightSyncError` with one line: role (policy / drafter), tensor name, weights
version, the copy that differs and where it is served.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

NUM_SAMPLES = 4
WORD_PERIOD = 251  # prime: the word-weight pattern does not line up with element or row boundaries
FLOAT_PERIOD = 7
ROLES = ("policy", "drafter")


class WeightSyncError(RuntimeError):
    """The weights a generator serves differ from the trainer's after a weight sync (a missed sync)."""


@dataclass(frozen=True)
class TensorPrint:
    """The fingerprint of one tensor: shape, dtype and the reductions of the module docstring."""

    shape: tuple[int, ...]
    dtype: str
    word_sums: tuple[int, int]  # (sum, index-weighted sum) of the raw bits as signed 16-bit words
    sums: tuple[float, float, float, float]  # float64 (sum, index-weighted sum, sum of squares, sum of |x|)
    samples: tuple[float, ...]  # NUM_SAMPLES values at evenly strided flat indices


Prints = dict[str, TensorPrint]


_CHUNK = FLOAT_PERIOD * WORD_PERIOD * 512  # a multiple of both periods: the patterns restart at every chunk
_PATTERNS: dict[int, torch.Tensor] = {}


def _pattern(period: int, n: int) -> torch.Tensor:
    """``i % period + 1`` for i < n (n <= ``_CHUNK``), float64, built once per period."""
    if period not in _PATTERNS:
        _PATTERNS[period] = (torch.arange(_CHUNK) % period + 1).double()
    return _PATTERNS[period][:n]


def _weighted_sum(v: torch.Tensor, period: int) -> torch.Tensor:
    """``sum_i v[i] * (i % period + 1)`` of a 1-D float64 tensor: a dot product with the pattern per chunk."""
    if v.numel() <= _CHUNK:
        return torch.dot(v, _pattern(period, v.numel()))
    return sum(torch.dot(c, _pattern(period, c.numel())) for c in v.split(_CHUNK))


@torch.no_grad()
def tensor_print(t: torch.Tensor) -> TensorPrint:
    """:class:`TensorPrint` of ``t`` (any floating dtype, any layout)."""
    shape = tuple(t.shape)
    flat = t.detach().reshape(-1) if t.device.type == "cpu" else t.detach().cpu().reshape(-1)
    # The raw bits as 16-bit words (bytes for 1-byte dtypes), in float64: every partial sum is an integer
    # below 2**53 (up to 2**30 words per tensor), so both sums are exact in any summation order.
    words = (flat.view(torch.uint8) if flat.element_size() == 1 else flat.view(torch.int16)).double()
    x = flat.double()
    n = x.numel()
    values = torch.stack([words.sum(), _weighted_sum(words, WORD_PERIOD), x.sum(), _weighted_sum(x, FLOAT_PERIOD),
                          torch.dot(x, x), x.abs().sum()]).tolist()
    return TensorPrint(
        shape=shape, dtype=str(t.dtype).removeprefix("torch."),
        word_sums=(int(values[0]), int(values[1])), sums=tuple(values[2:]),
        samples=tuple(x[[i * (n - 1) // (NUM_SAMPLES - 1) for i in range(NUM_SAMPLES)]].tolist()) if n else (),
    )


def fingerprint(tensors: Mapping[str, torch.Tensor], names: Collection[str] | None = None) -> Prints:
    """Fingerprints of the floating-point tensors of ``tensors`` (only ``names`` when given), keyed by name."""
    return {name: tensor_print(t) for name, t in tensors.items()
            if t.is_floating_point() and (names is None or name in names)}


def same_storage(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether ``a`` is ``b``'s memory (same address, shape, strides, dtype): not a copy, it cannot miss a sync."""
    return (b is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


def differs(expected: TensorPrint, served: TensorPrint) -> str | None:
    """How ``served`` differs from ``expected`` (module docstring: exact for one dtype, the narrower dtype's
    rounding across a conversion), or None when it matches."""
    if expected.shape != served.shape:
        return f"shape {list(served.shape)}, expected {list(expected.shape)}"
    if expected.dtype == served.dtype:
        if expected.word_sums != served.word_sums:
            return f"sum {served.sums[0]:.9g}, expected {expected.sums[0]:.9g} (bits differ)"
        return None
    eps = max(torch.finfo(getattr(torch, expected.dtype)).eps, torch.finfo(getattr(torch, served.dtype)).eps)
    abs_sum, sq = expected.sums[3], expected.sums[2]
    bounds = (eps * abs_sum, FLOAT_PERIOD * eps * abs_sum, 2 * eps * sq, eps * abs_sum)
    labels = ("sum", "weighted sum", "sum of squares", "sum of |x|")
    for label, e, s, bound in zip(labels, expected.sums, served.sums, bounds, strict=True):
        if abs(e - s) > bound:
            return f"{label} {s:.9g}, expected {e:.9g} (beyond {served.dtype} rounding of {expected.dtype})"
    for i, (e, s) in enumerate(zip(expected.samples, served.samples, strict=True)):
        if abs(e - s) > eps * abs(e):
            return f"sample {i} {s:.9g}, expected {e:.9g} (beyond {served.dtype} rounding of {expected.dtype})"
    return None


def _when(version: int) -> str:
    """The weights version, and the step whose update it is (the loop syncs version ``step + 1``)."""
    return f"weights version {version}" + (f" (after step {version - 1})" if version > 0 else " (initial)")


def verify(expected: Mapping[str, Prints], served: Mapping[str, Prints], version: int, where: str) -> None:
    """Compare the served fingerprints with the trainer's, role by role (``policy`` / ``drafter``).

    ``expected[role]``: every tensor the server must hold; ``served[role]``: what one served copy holds
    (a name it does not hold is not checked in it: a backend passes one copy per call). Raises
    :class:`WeightSyncError` naming the first tensor that differs.
    """
    for role in ROLES:
        want, got = expected.get(role) or {}, served.get(role) or {}
        for name, print_ in want.items():
            if name not in got:
                continue
            why = differs(print_, got[name])
            if why is not None:
                raise WeightSyncError(f"weight sync check failed at {_when(version)}: {role} tensor {name} "
                                      f"served by {where} differs from the trainer's: {why}")


def require_all(expected: Mapping[str, Prints], served: Mapping[str, Prints], version: int, where: str) -> None:
    """:func:`verify`, and every expected tensor must be served (a tensor the server lost is a failed sync)."""
    for role in ROLES:
        missing = sorted(set(expected.get(role) or {}) - set(served.get(role) or {}))
        if missing:
            raise WeightSyncError(f"weight sync check failed at {_when(version)}: {role} tensor {missing[0]} "
                                  f"is not served by {where}")
    verify(expected, served, version, where)


# -- what the trainer trained ------------------------------------------------------------------------------

def drafter_tensors(drafter, policy_embedding: torch.Tensor) -> dict[str, torch.Tensor]:
    """The drafter head's tensors as a synced server must hold them: its own, with the weights it shares with
    the policy (``drafters.training.sync_shared_weights``: the embedding; an MTP head's lm_head too) taken
    from the policy (``policy_embedding`` [V, H]; the LM head is tied to it)."""
    head = drafter.head
    out = dict(head.state_dict())
    if getattr(head, "uses_features", False):
        out["embed_tokens.weight"] = policy_embedding
        if not hasattr(head, "fc"):  # MTP shares the policy's (tied) LM head
            out["lm_head.weight"] = policy_embedding
    return out


def trainer_tensors(policy_state: Mapping[str, torch.Tensor], drafter) -> dict[str, dict[str, torch.Tensor]]:
    """What a synced server must hold, by role: ``policy`` = ``policy_state`` (a state dict), ``drafter`` =
    the drafter's head with the shared weights of ``policy_state`` (empty without a drafter)."""
    tensors = {"policy": dict(policy_state), "drafter": {}}
    if drafter is not None:
        tensors["drafter"] = drafter_tensors(drafter, policy_state["model.embed_tokens.weight"])
    return tensors


def trainer_prints(policy_state: Mapping[str, torch.Tensor], drafter,
                   names: Mapping[str, Collection[str]] | None = None) -> dict[str, Prints]:
    """The trainer's fingerprints of :func:`trainer_tensors` (only ``names[role]`` when given)."""
    return {role: fingerprint(t, None if names is None else names.get(role, ()))
            for role, t in trainer_tensors(policy_state, drafter).items()}


# -- what the in-process engine serves ---------------------------------------------------------------------

def deinterleave_heads(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Inverse of ``reference.decoder_step.interleave_heads``: the rows of every head back in RoPE's half
    order (the trainer's layout), so a fused copy is compared under the trainer's tensor names."""
    half = head_dim // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], 1).flatten()
    out = torch.empty_like(weight)
    if weight.dim() == 1:
        out[perm] = weight
        return out
    out.reshape(-1, head_dim, *weight.shape[1:])[:, perm] = weight.reshape(-1, head_dim, *weight.shape[1:])
    return out


def _unpack_layer(prefix: str, config, qkv: torch.Tensor, gate_up: torch.Tensor, q_norm: torch.Tensor | None,
                  k_norm: torch.Tensor | None) -> dict[str, torch.Tensor]:
    d = config.head_dim
    nq, nk = config.num_attention_heads * d, config.num_key_value_heads * d
    out = {
        f"{prefix}self_attn.q_proj.weight": deinterleave_heads(qkv[:nq], d),
        f"{prefix}self_attn.k_proj.weight": deinterleave_heads(qkv[nq : nq + nk], d),
        f"{prefix}self_attn.v_proj.weight": qkv[nq + nk :],
        f"{prefix}mlp.gate_proj.weight": gate_up[: config.intermediate_size],
        f"{prefix}mlp.up_proj.weight": gate_up[config.intermediate_size :],
    }
    if config.qk_norm and q_norm is not None:
        out[f"{prefix}self_attn.q_norm.weight"] = deinterleave_heads(q_norm, d)
        out[f"{prefix}self_attn.k_norm.weight"] = deinterleave_heads(k_norm, d)
    return out


def fused_copy(policy) -> dict[str, torch.Tensor]:
    """The policy's fused inference weights (``Qwen3.sync_inference_weights``), under the trainer's names."""
    out = {}
    for i, layer in enumerate(policy.model.layers):
        if getattr(layer, "fused", None) is not None:
            qkv, gate_up, qn, kn = layer.fused
            out.update(_unpack_layer(f"model.layers.{i}.", policy.config, qkv, gate_up, qn, kn))
    return out


def native_copy(policy, packed: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The native decode path's packed weights (``engine.PolicyStep.weights``: per layer the ten weights of
    ``reference.decoder_step.pack_weights``), under the trainer's names."""
    out = {}
    for i, w in enumerate(packed):
        p = f"model.layers.{i}."
        out.update(_unpack_layer(p, policy.config, w[1], w[6], w[2], w[3]))
        out.update({f"{p}input_layernorm.weight": w[0], f"{p}self_attn.o_proj.weight": w[4],
                    f"{p}post_attention_layernorm.weight": w[5], f"{p}mlp.down_proj.weight": w[7],
                    "model.norm.weight": w[8], "lm_head.weight": w[9]})
    return out
