"""Loads the compiled extension ``specdec_kernels._C`` (native CPU / CUDA kernels) when it was built.

A missing extension is not an error at import time: ``available()`` is False, ``backend="auto"`` falls
back to the next backend, and asking for a native backend explicitly raises one clear message.

Loading the extension registers the ``torch.ops.specdec.*`` ops (CPU, and CUDA when built with it);
this module adds their fake (meta) implementations so that they trace under ``torch.compile``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

_MISSING_MESSAGE = (
    "specdec_kernels was installed without its native extension (specdec_kernels._C): {reason}. "
    "Reinstall with a C++ compiler and torch available (pip install --no-build-isolation -e . builds it; "
    "SPECDEC_SKIP_NATIVE=1 skips it), "
    "or use backend='triton' / 'reference'."
)

_module = None
_error: str | None = None


def _load():
    global _module, _error
    if _module is None and _error is None:
        try:
            _module = importlib.import_module("specdec_kernels._C")
        except ImportError as exc:  # not built, or built against another torch
            _error = str(exc)
        else:
            _register_fakes()
            if getattr(_module, "CPU_ISA_MESSAGE", ""):  # SPECDEC_CPU_ISA named a build this CPU cannot run
                warnings.warn(_module.CPU_ISA_MESSAGE, RuntimeWarning, stacklevel=2)
    return _module


def _register_fakes() -> None:
    """Shape-only implementations of the specdec ops for FakeTensor tracing (torch.compile)."""
    import torch

    def chain_fake(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
                   seed, position, max_draft_len, row_threshold=None):
        num_reqs = cu_num_draft_tokens.shape[0] - 1
        out = target_logits.new_empty((num_reqs, max_draft_len + 1), dtype=torch.int32)
        return out, target_logits.new_empty((num_reqs,), dtype=torch.int32)

    def tree_fake(target_logits, node_token_ids, parent, cu_num_nodes, draft_probs, temperature, top_k, top_p,
                  seed, position, sibling_sampling, max_depth, row_threshold=None):
        num_reqs = cu_num_nodes.shape[0] - 1
        out = target_logits.new_empty((num_reqs, max_depth + 1), dtype=torch.int32)
        nodes = target_logits.new_empty((num_reqs, max_depth + 1), dtype=torch.int32)
        return out, nodes, target_logits.new_empty((num_reqs,), dtype=torch.int32)

    for name, fn in (("specdec::verify_chain", chain_fake), ("specdec::verify_tree", tree_fake),
                     ("specdec::verify_chain_block", chain_fake), ("specdec::verify_tree_traversal", tree_fake)):
        try:
            torch.library.register_fake(name, fn)
        except RuntimeError:  # already registered (module reloaded)
            pass


def available() -> bool:
    """True when the compiled extension imports."""
    return _load() is not None


def has_device(device_type: str) -> bool:
    """True when the extension has kernels for ``device_type`` ("cpu" or "cuda")."""
    module = _load()
    return module is not None and device_type in getattr(module, "DEVICES", ())


# The extension's function for each (op, device type) (csrc/bindings.cpp): a table to grep, not names built
# from strings.
OPS: dict[tuple[str, str], str] = {
    ("verify_chain", "cpu"): "verify_chain_cpu",
    ("verify_chain", "cuda"): "verify_chain_cuda",
    ("verify_tree", "cpu"): "verify_tree_cpu",
    ("verify_tree", "cuda"): "verify_tree_cuda",
    ("verify_chain_block", "cpu"): "verify_chain_block_cpu",
    ("verify_chain_block", "cuda"): "verify_chain_block_cuda",
    ("verify_tree_traversal", "cpu"): "verify_tree_traversal_cpu",
    ("verify_tree_traversal", "cuda"): "verify_tree_traversal_cuda",
    ("decoder_step", "cpu"): "decoder_step_cpu",
    ("philox_uniform_rows", "cpu"): "philox_uniform_rows_cpu",
    ("stream_sum", "cpu"): "stream_sum_cpu",
    ("stream_work", "cpu"): "stream_work_cpu",
    ("stream_minmax16", "cpu"): "stream_minmax16_cpu",
}


def has_op(name: str, device_type: str) -> bool:
    """True when the extension has the op ``name`` for ``device_type`` (an older build may lack it)."""
    attr = OPS.get((name, device_type))
    return attr is not None and has_device(device_type) and hasattr(_load(), attr)


def op(name: str, device_type: str) -> Callable:
    """The native implementation of ``name`` for ``device_type``, or a clear RuntimeError."""
    module = _load()
    if module is None:
        raise RuntimeError(_MISSING_MESSAGE.format(reason=_error))
    if device_type not in getattr(module, "DEVICES", ()):
        raise RuntimeError(f"specdec_kernels._C was built without {device_type} kernels")
    return getattr(module, OPS[name, device_type])


def decoder_step(x, weights, k_cache, v_cache, rows, start, depth, rope, num_heads: int, eps: float, qkv_add=None):
    """One Qwen3 decoder layer, final RMSNorm and LM head over ``n`` new tokens per request, fused (CPU).

    The drafter-head step: tens of requests x a few tokens, where ~40 framework ops would cost more in
    dispatch than in arithmetic. All tensors float32 / int64, contiguous, on the CPU:

    - ``x`` [R, n, H]: layer input (token embeddings, or a head's fused inputs).
    - ``weights``: input norm [H], qkv [(heads + 2 kv_heads) D, H] with each q/k head's rows ordered
      (0, D/2, 1, D/2 + 1, ...) so RoPE rotates adjacent pairs, q_norm [D], k_norm [D] (same order),
      o_proj [H, heads D], post-attention norm [H], gate_up [2 I, H] (gate rows first), down [H, I], final
      norm [H], lm_head [V, H].
    - ``k_cache``, ``v_cache`` [B, kv_heads, S, D]: request r uses cache row ``rows[r]``; new token i is
      written to slot ``start[r] + i`` and attends to slots ``[0, start[r] + i]``.
    - ``depth`` [R, n]: RoPE position of token i is ``start[r] + depth[r, i]``; ``rope`` [P, D/2, 2] holds
      (cos, sin) per position and pair.
    - ``qkv_add`` [R, n, (heads + 2 kv_heads) D] or None: added to the q/k/v projection (EAGLE-3's token half).

    The readable spec, weight packing included, is ``specdec_kernels.reference.decoder_step``.

    Returns logits [R, n, V] and the layer output (before the final norm) [R, n, H]. Shapes and index
    ranges are checked (a clear error names the argument); values are not.
    """
    return op("decoder_step", "cpu")(x, list(weights), k_cache, v_cache, rows, start, depth, rope, num_heads, eps,
                                     qkv_add)


def stream_sum(x) -> float:
    """The sum of a contiguous float32 CPU tensor ``x``, read on the verification ops' threads with their
    own software prefetch: the read-bandwidth probe of ``benchmarks/bench_native_cpu.py`` (a read-only
    stream at least as fast as the verification passes, which ``torch.sum`` is not on every machine)."""
    return op("stream_sum", "cpu")(x)


def stream_minmax16(x) -> tuple[int, int]:
    """The largest and smallest 16-bit integer in the bytes of a contiguous CPU tensor ``x`` (an even number of
    bytes), read on the verification ops' threads by the 16-bit greedy pass's loop (an integer max and min per
    vector, the same software prefetch): the integer read probe of ``benchmarks/bench_native_cpu.py``, beside
    ``stream_sum`` (float adds) and ``torch.sum``, so that the greedy pass cannot read faster than its
    reference by reading differently."""
    return op("stream_minmax16", "cpu")(x)


def stream_work(x, rounds: int) -> float:
    """``stream_sum`` with ``rounds`` (0 to 1024) dependent multiply-adds on every loaded vector (per
    round, one per 64-byte line with AVX-512, two with AVX2): the same read carrying a known amount of work
    (``rounds = 0`` is ``stream_sum`` itself), for ``benchmarks/stream_compute_probe.py``. The value means
    nothing; it is returned so that the reads and the work happen."""
    return op("stream_work", "cpu")(x, rounds)


def uniform_rows(seed, position, stream: int, vocab_size: int):
    """[R, V] float32 Philox uniforms of rows (``seed`` [R], ``position`` [R] int64, CPU) on ``stream``:
    ``specdec_kernels.reference.philox.uniform_rows`` bit for bit, in one native call (the drafters'
    sampling noise, stream 3)."""
    return op("philox_uniform_rows", "cpu")(seed, position, stream, vocab_size)
