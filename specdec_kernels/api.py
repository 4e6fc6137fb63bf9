"""Public entry points: validate once, normalise, dispatch to a backend (DESIGN.md §3).

Backends receive normalised tensors (contiguous, on one device, int64 ids/seeds/positions, float32
temperature, int32 top-k, float32 top-p) and never re-validate.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

import torch

from .reference import chain as _ref_chain
from .reference.chain import ChainResult
from .reference.philox import MAX_POSITION, MAX_VOCAB

__all__ = ["ChainResult", "verify_chain", "available_backends", "LOGIT_DTYPES"]

LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
BACKENDS = ("auto", "reference", "triton", "cpu", "cuda")


# ----------------------------------------------------------------------------------------------------
# Backend registry
# ----------------------------------------------------------------------------------------------------

def _triton_usable(device: torch.device) -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _native_usable(device: torch.device) -> bool:
    from . import native

    return native.has_device(device.type)


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Backends that can run on tensors of ``device`` in this installation, fastest first."""
    device = torch.device(device)
    names = []
    if device.type == "cuda" and _triton_usable(device):
        names.append("triton")
    if _native_usable(device):
        names.append(device.type)
    if device.type != "cuda" and _triton_usable(device):
        names.append("triton")
    names.append("reference")
    return names


def _resolve(backend: str, device: torch.device, op: str) -> Callable:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = available_backends(device)[0]
    if backend == "reference":
        return {"chain": _ref_chain.verify_chain}[op]
    if backend == "triton":
        if not _triton_usable(device):
            raise ValueError(
                "backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 and triton "
                f"installed (got device {device})"
            )
        module = importlib.import_module(f".triton.{op}", __package__)
        return module.__dict__[f"verify_{op}"]
    # native backends
    if device.type != backend:
        raise ValueError(f"backend={backend!r} needs {backend} tensors, got tensors on {device}")
    from . import native

    return native.op(f"verify_{op}", device.type)


# ----------------------------------------------------------------------------------------------------
# Validation helpers: each raises ValueError / TypeError naming the argument.
# ----------------------------------------------------------------------------------------------------

def _check_tensor(name: str, x, ndim: int, dtypes, device: torch.device | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} like target_logits, got {x.device}")


def _check_per_request(name: str, x, num_reqs: int, dtypes, device: torch.device) -> None:
    _check_tensor(name, x, 1, dtypes, device)
    if x.numel() != num_reqs:
        raise ValueError(f"{name} must have one entry per request ({num_reqs}), got {x.numel()}")


def _fail_if(cond: torch.Tensor, message: str) -> None:
    if bool(cond.any()):
        raise ValueError(message)


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def normalize_sampling_params(
    num_reqs: int,
    device: torch.device,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seed: torch.Tensor | None,
    position: torch.Tensor | None,
    validate: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Check and normalise the per-request sampling arguments shared by every verifier."""
    if temperature is None:
        temperature = torch.zeros(num_reqs, dtype=torch.float32, device=device)
    _check_per_request("temperature", temperature, num_reqs, FLOAT_DTYPES, device)
    temperature = temperature.float().contiguous()
    if top_k is not None:
        _check_per_request("top_k", top_k, num_reqs, INDEX_DTYPES, device)
        top_k = top_k.to(torch.int32).contiguous()
    if top_p is not None:
        _check_per_request("top_p", top_p, num_reqs, FLOAT_DTYPES, device)
        top_p = top_p.float().contiguous()
    if seed is None:
        seed = torch.randint(-(2**63), 2**63 - 1, (num_reqs,), dtype=torch.int64, device=device)
    _check_per_request("seed", seed, num_reqs, INDEX_DTYPES, device)
    seed = seed.to(torch.int64).contiguous()
    if position is None:
        position = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    _check_per_request("position", position, num_reqs, INDEX_DTYPES, device)
    position = position.to(torch.int64).contiguous()
    if validate and num_reqs > 0:
        _fail_if(~(temperature >= 0) | torch.isinf(temperature),
                 "temperature must be finite and >= 0 (0 = greedy)")
        if top_k is not None:
            _fail_if(top_k < 0, "top_k must be >= 0 (0 or >= vocab size disables it)")
        if top_p is not None:
            _fail_if(~((top_p > 0) & (top_p <= 1)), "top_p must be in (0, 1]")
        _fail_if(position < 0, "position must be >= 0")
    return temperature, top_k, top_p, seed, position


def _check_logits(name: str, logits) -> None:
    _check_tensor(name, logits, 2, LOGIT_DTYPES, None)
    vocab_size = logits.shape[1]
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise ValueError(f"{name} must have a vocabulary size in [1, {MAX_VOCAB}], got {vocab_size}")


# ----------------------------------------------------------------------------------------------------
# verify_chain
# ----------------------------------------------------------------------------------------------------

def verify_chain(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    position: torch.Tensor | None = None,
    backend: str = "auto",
    *,
    max_draft_len: int | None = None,
    validate: bool = True,
) -> ChainResult:
    """Losslessly verify a ragged batch of draft chains against the target model's logits.

    Args:
        target_logits: [T + B, V] bf16/fp16/fp32. Request b owns rows ``cu[b] + b ... cu[b+1] + b``: one
            row per draft position, then one row for the bonus token.
        draft_token_ids: [T] int32/int64 drafted tokens; -1 marks a placeholder (always rejected).
        cu_num_draft_tokens: [B + 1] int32/int64 cumulative draft counts, starting at 0.
        draft_probs: [T, V] float draft distributions q for stochastic drafts, or None for deterministic
            drafts (ngram, greedy drafters).
        temperature: [B] float, 0 = greedy; None means every request is greedy.
        top_k: [B] int, 0 (or >= V) disables; top_p: [B] float in (0, 1], 1 disables. The verifier is
            lossless with respect to the truncated target (rules in ``reference/sampling.py``).
        seed: [B] int64 Philox key per request; None draws fresh keys from torch's generator.
        position: [B] int64 absolute position of each request's first draft token (default 0).
        backend: "auto" | "reference" | "triton" | "cpu" | "cuda".
        max_draft_len: width of the output minus one; None computes max(k_b) (one host sync).
        validate: check values (ranges, monotone cu); False skips every check that reads tensor values,
            for CUDA-graph capture. Kernels stay memory-safe either way: any draft id outside [0, V) is
            treated as a placeholder.

    Returns:
        ``ChainResult(output_token_ids [B, max_draft_len + 1] int32 -1 padded, num_accepted [B] int32)``:
        each request's accepted drafts followed by one recovered or bonus token.
    """
    _check_logits("target_logits", target_logits)
    device = target_logits.device
    _check_tensor("cu_num_draft_tokens", cu_num_draft_tokens, 1, INDEX_DTYPES, device)
    if cu_num_draft_tokens.numel() < 1:
        raise ValueError("cu_num_draft_tokens must have B + 1 >= 1 entries")
    _check_tensor("draft_token_ids", draft_token_ids, 1, INDEX_DTYPES, device)
    num_reqs = cu_num_draft_tokens.numel() - 1
    num_drafts = draft_token_ids.numel()
    num_rows, vocab_size = target_logits.shape
    if num_rows != num_drafts + num_reqs:
        raise ValueError(
            f"target_logits must have T + B = {num_drafts} + {num_reqs} rows "
            f"(draft_token_ids has T entries, cu_num_draft_tokens B + 1), got {num_rows}"
        )
    if draft_probs is not None:
        _check_tensor("draft_probs", draft_probs, 2, FLOAT_DTYPES, device)
        if tuple(draft_probs.shape) != (num_drafts, vocab_size):
            raise ValueError(
                f"draft_probs must have shape [T, V] = [{num_drafts}, {vocab_size}], got {tuple(draft_probs.shape)}"
            )
        draft_probs = draft_probs.contiguous()
    temperature, top_k, top_p, seed, position = normalize_sampling_params(
        num_reqs, device, temperature, top_k, top_p, seed, position, validate
    )
    cu = cu_num_draft_tokens.to(torch.int64).contiguous()
    lengths = cu[1:] - cu[:-1]
    if validate:
        _fail_if(cu[:1] != 0, "cu_num_draft_tokens must start at 0")
        _fail_if(lengths < 0, "cu_num_draft_tokens must be non-decreasing")
        _fail_if(cu[-1:] != num_drafts, f"cu_num_draft_tokens[-1] must equal len(draft_token_ids) = {num_drafts}")
        _fail_if((draft_token_ids < -1) | (draft_token_ids >= vocab_size),
                 f"draft_token_ids must be in [0, {vocab_size}) or -1 (placeholder)")
        if num_reqs:
            _fail_if(position + lengths > MAX_POSITION, f"position + num draft tokens must be <= {MAX_POSITION}")
    if max_draft_len is None:
        max_draft_len = int(lengths.max()) if num_reqs else 0
    elif not isinstance(max_draft_len, int) or max_draft_len < 0:
        raise ValueError(f"max_draft_len must be a non-negative int, got {max_draft_len!r}")
    elif validate and num_reqs:
        _fail_if(lengths > max_draft_len, f"max_draft_len={max_draft_len} is smaller than the longest chain")
    fn = _resolve(backend, device, "chain")
    return fn(
        target_logits.contiguous(), draft_token_ids.to(torch.int64).contiguous(), cu, draft_probs,
        temperature, top_k, top_p, seed, position, max_draft_len,
    )
