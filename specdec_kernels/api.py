"""Public entry points: validate once, normalise, dispatch to a backend (docs/design.md §3).

Backends receive normalised tensors (contiguous, on one device, int64 ids/seeds/positions, float32
temperature, int32 top-k, float32 top-p) and never re-validate.
"""

from __future__ import annotations

import importlib
import numbers
import os
from collections.abc import Callable

import torch

from . import sampling_mask as _mask
from .reference import block as _ref_block
from .reference import chain as _ref_chain
from .reference import sampling as _ref_sampling
from .reference import traversal as _ref_traversal
from .reference import tree as _ref_tree
from .reference.chain import ChainResult
from .reference.philox import MAX_POSITION, MAX_VOCAB
from .reference.tree import SIBLING_SAMPLING, TreeResult
from .sampling_mask import SamplingMask

__all__ = [
    "ChainResult", "TreeResult", "SamplingMask", "verify_chain", "verify_tree", "available_backends", "LOGIT_DTYPES",
    "checked_chain_args", "checked_tree_args",
]

LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
BACKENDS = ("auto", "reference", "triton", "cpu", "cuda")
CHAIN_METHODS = ("token", "block")
TREE_METHODS = ("token", "traversal")
# op name of each (op, method), and each backend's function for it: tables to grep, not names built from strings.
_METHOD_OPS = {("chain", "token"): "chain", ("chain", "block"): "chain_block",
               ("tree", "token"): "tree", ("tree", "traversal"): "tree_traversal"}
_REFERENCE_OPS = {"chain": _ref_chain.verify_chain, "chain_block": _ref_block.verify_chain_block,
                  "tree": _ref_tree.verify_tree, "tree_traversal": _ref_traversal.verify_tree_traversal}
# (module, function) of each op's Triton launcher, imported on first use (importing Triton is slow).
_TRITON_OPS = {"chain": (".triton.chain", "verify_chain"), "chain_block": (".triton.block", "verify_chain_block"),
               "tree": (".triton.tree", "verify_tree"), "tree_traversal": (".triton.traversal", "verify_tree_traversal")}
# The native op of each op (specdec_kernels.native.OPS gives its function per device type).
_NATIVE_OPS = {"chain": "verify_chain", "chain_block": "verify_chain_block", "tree": "verify_tree",
               "tree_traversal": "verify_tree_traversal"}


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
    """Backends that can run on tensors of ``device`` in this installation, fastest first.

    ``backend="auto"`` takes the first. On CPU tensors Triton runs only through its interpreter
    (TRITON_INTERPRET=1), a correctness tool slower than the reference, so it is listed last there.
    """
    device = torch.device(device)
    names = []
    if device.type == "cuda" and _triton_usable(device):
        names.append("triton")
    if _native_usable(device):
        names.append(device.type)
    names.append("reference")
    if device.type != "cuda" and _triton_usable(device):
        names.append("triton")
    return names


# The native op of each (backend, op) once resolved: a native backend given by name resolves the same way on
# every call, and the import and attribute lookups below cost ~50 us per call when the caches are cold (a
# verification step after a forward pass; benchmarks.call_overhead).
_NATIVE_RESOLVED: dict[tuple[str, str], Callable] = {}
# The native CPU op of each (backend, method) of verify_chain that resolved to one on CPU tensors ("cpu", or
# "auto" where the native backend comes first). An unvalidated call that has nothing to normalise (every
# per-request tensor given, no top_k, an int max_draft_len) goes straight to it: the op checks shapes, dtypes,
# devices and the cu it reads (csrc/checks.h), and whatever it rejects is retried on the checked path below,
# which converts what it can (int32 ids, non-contiguous tensors, ...) and otherwise raises the Python layer's
# own error. From cold caches the checked path costs ~90 us of Python per call (benchmarks.call_overhead).
_UNCHECKED_CPU_CHAIN: dict[tuple[str, str], Callable] = {}


def _resolve(backend: str, device: torch.device, op: str) -> Callable:
    if backend == device.type:
        fn = _NATIVE_RESOLVED.get((backend, op))
        if fn is not None:
            return fn
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = available_backends(device)[0]
    if backend == "reference":
        return _REFERENCE_OPS[op]
    if backend == "triton":
        if not _triton_usable(device):
            raise ValueError(
                "backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 and triton "
                f"installed (got device {device})"
            )
        module_name, function = _TRITON_OPS[op]
        return getattr(importlib.import_module(module_name, __package__), function)
    # native backends
    if device.type != backend:
        raise ValueError(f"backend={backend!r} needs {backend} tensors, got tensors on {device}")
    from . import native

    fn = native.op(_NATIVE_OPS[op], device.type)
    _NATIVE_RESOLVED[backend, op] = fn
    return fn


def _threshold_buffer(logits: torch.Tensor) -> torch.Tensor:
    """[rows] float32 NaN: the ``row_threshold`` output of a call that returns its mask (a row the kernel
    left unwritten keeps nothing, so the mask's tests see it)."""
    return torch.full((logits.shape[0],), float("nan"), dtype=torch.float32, device=logits.device)


def _with_mask(fn, args: tuple, sampling_mask) -> tuple:
    """``fn(*args)`` and its sampling mask (``sampling_mask``, from ``sampling_mask.py``), enumerated from the
    row thresholds every backend's kernel writes in its own verification pass when handed ``row_threshold``."""
    threshold = _threshold_buffer(args[0])
    result = fn(*args, row_threshold=threshold)
    return result, sampling_mask(args, result, threshold)


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


class ValueChecks:
    """The value checks of one call, read back with a single host sync.

    ``fail_if`` records a boolean tensor (any True entry fails the check) with its message; ``read``
    records an integer scalar tensor the call needs on the host (a longest chain, a deepest node).
    ``run`` copies everything to the host at once and raises the first failing check, in the order they
    were added, so the message blames the argument that is wrong first (a decreasing cu before a chain
    longer than max_draft_len). Every tensor recorded must be computed so that it stays in bounds on any
    input, since nothing is raised before ``run``.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flags: list[torch.Tensor] = []
        self._messages: list[str] = []
        self._values: list[torch.Tensor] = []

    def fail_if(self, cond: torch.Tensor, message: str) -> None:
        self._flags.append(cond.any())
        self._messages.append(message)

    def read(self, value: torch.Tensor) -> int:
        """Record a 0-d integer tensor; returns its index in ``run``'s result."""
        self._values.append(value.reshape(()).to(torch.int64))
        return len(self._values) - 1

    def run(self) -> list[int]:
        """One device-to-host copy of every flag and value; raises ValueError on the first failed check."""
        if not self._flags and not self._values:
            return []
        if self.device.type == "meta":
            raise ValueError(
                "meta tensors carry no values, but validate=True and max_draft_len=None / max_depth=None read "
                "them: pass validate=False and the output width to trace shapes"
            )
        packed = torch.stack([f.to(torch.int64) for f in self._flags] + self._values).tolist()
        for flag, message in zip(packed[: len(self._flags)], self._messages, strict=True):
            if flag:
                raise ValueError(message)
        return packed[len(self._flags):]


def _check_flag(name: str, value) -> bool:
    """A boolean keyword (return_mask): a bool, not merely truthy."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _check_width(name: str, value) -> int:
    """An output width argument (max_draft_len, max_depth): an int in [0, MAX_POSITION]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if not 0 <= value <= MAX_POSITION:
        raise ValueError(f"{name} must be in [0, {MAX_POSITION}], got {value}")
    return int(value)


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a contiguous ``dtype`` tensor; ``x`` itself, with no tensor op, when it already is one (the
    unvalidated call of a kernel is a handful of these, and each op a cold cache makes cost tens of us)."""
    return x if x.dtype == dtype and x.is_contiguous() else x.to(dtype).contiguous()


def normalize_sampling_params(
    num_reqs: int,
    device: torch.device,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seed: torch.Tensor | None,
    position: torch.Tensor | None,
    validate: bool,
    checks: ValueChecks | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Check and normalise the per-request sampling arguments shared by every verifier.

    Value checks go to ``checks`` when given (the caller runs them with its own), else they run here.
    ``top_k`` is read as int64 and clamped to [0, MAX_VOCAB] before it narrows to int32, so any value
    >= V keeps meaning "disabled" (a negative one does too when validation is off).
    """
    if temperature is None:
        temperature = torch.zeros(num_reqs, dtype=torch.float32, device=device)
    _check_per_request("temperature", temperature, num_reqs, FLOAT_DTYPES, device)
    temperature = _as(temperature, torch.float32)
    if top_k is not None:
        _check_per_request("top_k", top_k, num_reqs, INDEX_DTYPES, device)
        top_k = top_k.to(torch.int64)
    if top_p is not None:
        _check_per_request("top_p", top_p, num_reqs, FLOAT_DTYPES, device)
        top_p = _as(top_p, torch.float32)
    if seed is None:
        seed = torch.randint(-(2**63), 2**63 - 1, (num_reqs,), dtype=torch.int64, device=device)
    _check_per_request("seed", seed, num_reqs, INDEX_DTYPES, device)
    seed = _as(seed, torch.int64)
    if position is None:
        position = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    _check_per_request("position", position, num_reqs, INDEX_DTYPES, device)
    position = _as(position, torch.int64)
    own = checks is None
    if validate and num_reqs > 0:
        checks = ValueChecks(device) if own else checks
        checks.fail_if(~(temperature >= 0) | torch.isinf(temperature),
                       "temperature must be finite and >= 0 (0 = greedy)")
        if top_k is not None:
            checks.fail_if(top_k < 0, "top_k must be >= 0 (0 or >= vocab size disables it)")
        if top_p is not None:
            checks.fail_if(~((top_p > 0) & (top_p <= 1)), "top_p must be in (0, 1]")
        checks.fail_if((position < 0) | (position > MAX_POSITION), f"position must be in [0, {MAX_POSITION}]")
        if own:
            checks.run()
    if top_k is not None:
        top_k = top_k.clamp(0, MAX_VOCAB).to(torch.int32).contiguous()
    return temperature, top_k, top_p, seed, position


def _min_p_rows(
    logits: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor, row_starts: torch.Tensor,
    checks: ValueChecks | None,
) -> torch.Tensor:
    """The target rows after min-p (``reference.sampling.min_p_logits``), each row under its request's
    temperature and ``min_p`` [B]; ``row_starts`` [B] holds each request's first row (clamped spans: any row
    maps to a request, so an invalid cu stays in bounds). The range check goes to ``checks`` (the caller's one
    host sync) when given. Called only when ``min_p`` is given: without it a call builds no spans for it."""
    num_reqs = row_starts.numel()
    _check_per_request("min_p", min_p, num_reqs, FLOAT_DTYPES, logits.device)
    min_p = _as(min_p, torch.float32)
    if checks is not None and num_reqs:
        checks.fail_if(~((min_p >= 0) & (min_p <= 1)), "min_p must be in [0, 1] (0 disables it)")
    if num_reqs == 0 or logits.shape[0] == 0:
        return logits
    rows = torch.arange(logits.shape[0], device=logits.device)
    req = (torch.searchsorted(row_starts.contiguous(), rows, right=True) - 1).clamp(0, num_reqs - 1)
    return _ref_sampling.min_p_logits(logits, temperature[req], min_p[req])


def _check_draft_probs(
    draft_probs, rows_name: str, num_rows: int, vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """Check optional draft distributions of shape [num_rows, V] (rows named ``rows_name``); contiguous."""
    if draft_probs is None:
        return None
    _check_tensor("draft_probs", draft_probs, 2, FLOAT_DTYPES, device)
    if tuple(draft_probs.shape) != (num_rows, vocab_size):
        raise ValueError(
            f"draft_probs must have shape [{rows_name}, V] = [{num_rows}, {vocab_size}], "
            f"got {tuple(draft_probs.shape)}"
        )
    return draft_probs if draft_probs.is_contiguous() else draft_probs.contiguous()  # no op when it is (_as)


def _check_method(method, op: str) -> str:
    """The backend op name of ``method`` for ``op`` ("chain" / "tree"), or an error naming ``method``."""
    allowed = CHAIN_METHODS if op == "chain" else TREE_METHODS
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, one of {allowed}, got {type(method).__name__}")
    if method not in allowed:
        raise ValueError(f"method must be one of {allowed}, got {method!r}")
    return _METHOD_OPS[(op, method)]


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
    method: str = "token",
    max_draft_len: int | None = None,
    validate: bool = True,
    return_mask: bool = False,
    min_p: torch.Tensor | None = None,
) -> ChainResult | tuple[ChainResult, SamplingMask]:
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
        min_p: [B] float in [0, 1], 0 disables (keyword): drops the tokens whose tempered probability is
            below min_p times the row's largest, after temperature and before top-k / top-p (vLLM's order;
            ``reference.sampling.min_p_logits``). Applied once to the logits before the backend runs (one
            softmax pass and a copy of the logits), so every backend, the law and the mask see the same rows.
        seed: [B] int64 Philox key per request; None draws fresh keys from torch's generator.
        position: [B] int64 absolute position of each request's first draft token (default 0).
        backend: "auto" | "reference" | "triton" | "cpu" | "cuda".
        method: "token" (Leviathan / Chen token-level verification) or "block" (Sun et al.'s block
            verification, ``reference/block.py``): lossless too and optimal for one draft block, it accepts
            at least as many drafts in expectation (strictly more in general for chains of k >= 2
            stochastic drafts) at the cost of reading every row of the chain. Deterministic drafts (no
            ``draft_probs``, i.e. one-hot q) gain nothing: no valid verifier accepts the first i drafts
            with more than the target's probability of them, which token level already does, so "block"
            then runs token level (identical tokens).
        max_draft_len: width of the output minus one, in [0, 2**31 - 1]; None computes max(k_b) (read in
            the one host sync of the call).
        validate: check values (ranges, monotone cu) with one host sync; False skips every check that reads
            tensor values, for CUDA-graph capture. Every backend stays memory-safe and in the vocabulary
            either way: a draft id outside [0, V) is a placeholder, cu entries are clamped into [0, T] and
            chains are cut at max_draft_len (``reference.chain.chain_spans``; the row after the last kept
            draft is sampled as the bonus row), and the CPU backend, which reads its cu on the host for free,
            raises ValueError on an inconsistent cu instead.
        return_mask: also return the sampling mask, per emitted token the ids its row's target kept after
            temperature, min-p, top-k and top-p (the argmax set when greedy): ``sampling_mask.SamplingMask``, CSR as
            vLLM's ``return_sampling_mask``. Every backend writes each decided row's truncation threshold
            during verification and the mask is enumerated from it (one compare per emitted row,
            ``sampling_mask``). Host syncs (not CUDA-graph capturable); False adds no work.

    Returns:
        ``ChainResult(output_token_ids [B, max_draft_len + 1] int32 -1 padded, num_accepted [B] int32)``:
        each request's accepted drafts followed by one recovered or bonus token; with ``return_mask=True``
        the pair ``(ChainResult, SamplingMask)``.
    """
    if return_mask is not False:
        _check_flag("return_mask", return_mask)
    if (not return_mask and not validate and type(max_draft_len) is int and top_k is None and min_p is None
            and temperature is not None
            and seed is not None and position is not None and type(backend) is str and type(method) is str):
        fn = _UNCHECKED_CPU_CHAIN.get((backend, method))
        if fn is not None and (backend == "cpu" or getattr(target_logits, "is_cpu", False) is True):
            try:
                return fn(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, None, top_p,
                          seed, position, max_draft_len)
            except (TypeError, ValueError, RuntimeError):
                pass  # the checked path normalises what it can, and names the argument otherwise
    op = _check_method(method, "chain")
    args = checked_chain_args(
        target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p, seed, position,
        max_draft_len=max_draft_len, validate=validate, min_p=min_p,
    )
    fn = _resolve(backend, target_logits.device, op)
    if fn is _NATIVE_RESOLVED.get(("cpu", op)):  # resolves only for CPU tensors
        _UNCHECKED_CPU_CHAIN[backend, method] = fn
    return _with_mask(fn, args, _mask.chain_sampling_mask) if return_mask else fn(*args)


def checked_chain_args(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    position: torch.Tensor | None = None,
    *,
    max_draft_len: int | None = None,
    validate: bool = True,
    min_p: torch.Tensor | None = None,
) -> tuple:
    """``verify_chain``'s argument checks and normalisation (same arguments, same errors, same one host sync).

    Returns the positional arguments every backend's ``verify_chain`` takes: (logits, draft ids, cu,
    draft_probs, temperature, top_k, top_p, seed, position, max_draft_len), normalised as the module
    docstring says, the logits with ``min_p`` applied when it is given. Test harnesses that launch kernels
    themselves (``exactness.cuda_emulation``) start here.
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
    draft_probs = _check_draft_probs(draft_probs, "T", num_drafts, vocab_size, device)
    if max_draft_len is not None:
        max_draft_len = _check_width("max_draft_len", max_draft_len)
    checks = ValueChecks(device)
    temperature, top_k, top_p, seed, position = normalize_sampling_params(
        num_reqs, device, temperature, top_k, top_p, seed, position, validate, checks
    )
    cu = _as(cu_num_draft_tokens, torch.int64)
    # Chain lengths as the kernels read them (reference.chain.chain_spans: clamped into [0, T]), so the
    # widths and sums below stay in range on any cu; equal to cu[1:] - cu[:-1] on a valid cu. Only the
    # checks and max_draft_len=None read them.
    needs_spans = validate or max_draft_len is None or min_p is not None
    spans = _ref_chain.chain_spans(cu, num_drafts) if needs_spans else None
    lengths = spans[1] if validate or max_draft_len is None else None
    if min_p is not None:  # request b's rows start at its first draft's index plus b (one bonus row each before)
        target_logits = _min_p_rows(target_logits, temperature, min_p,
                                    spans[0] + torch.arange(num_reqs, device=device), checks if validate else None)
    if validate:
        checks.fail_if(cu[:1] != 0, "cu_num_draft_tokens must start at 0")
        checks.fail_if(cu[1:] < cu[:-1], "cu_num_draft_tokens must be non-decreasing")
        checks.fail_if(cu[-1:] != num_drafts,
                       f"cu_num_draft_tokens[-1] must equal len(draft_token_ids) = {num_drafts}")
        checks.fail_if((draft_token_ids < -1) | (draft_token_ids >= vocab_size),
                       f"draft_token_ids must be in [0, {vocab_size}) or -1 (placeholder)")
        if draft_probs is not None:
            checks.fail_if(~torch.isfinite(draft_probs) | (draft_probs < 0), "draft_probs must be finite and >= 0")
        if max_draft_len is not None:
            checks.fail_if(lengths > max_draft_len, f"max_draft_len={max_draft_len} is smaller than the longest chain")
        checks.fail_if(position > MAX_POSITION - lengths, f"position + num draft tokens must be <= {MAX_POSITION}")
    longest = checks.read(lengths.max()) if max_draft_len is None and num_reqs else None
    values = checks.run()
    if max_draft_len is None:
        max_draft_len = values[longest] if longest is not None else 0
    return (
        target_logits.contiguous(), _as(draft_token_ids, torch.int64), cu, draft_probs,
        temperature, top_k, top_p, seed, position, max_draft_len,
    )


# ----------------------------------------------------------------------------------------------------
# verify_tree
# ----------------------------------------------------------------------------------------------------

def _check_tree_values(
    checks: ValueChecks,
    node_token_ids: torch.Tensor,
    parent: torch.Tensor,
    cu: torch.Tensor,
    vocab_size: int,
    unique_siblings: bool,
) -> torch.Tensor:
    """Record the tree-structure checks of a ragged batch; returns each node's depth [N] (int64).

    Everything is computed on the bounds-safe layout (reference.tree.tree_layout), since the checks are
    only read, all at once, after this returns.
    """
    num_nodes = parent.numel()
    checks.fail_if(cu[:1] != 0, "cu_num_nodes must start at 0")
    checks.fail_if(cu[1:] <= cu[:-1],
                   "cu_num_nodes must be strictly increasing: every request needs at least its root node")
    checks.fail_if(cu[-1:] != num_nodes, f"cu_num_nodes[-1] must equal the number of nodes N = {num_nodes}")
    device = parent.device
    par = parent.to(torch.int64)
    _, local, length = _ref_tree.node_requests(cu, num_nodes)
    is_first = local == 0
    checks.fail_if(is_first & (par != -1), "parent: node 0 of each request must be its root (parent -1)")
    checks.fail_if(~is_first & (par == -1),
                   "parent: only node 0 of each request may be a root (parent -1); the root must be at node 0")
    checks.fail_if((par < -1) | (par >= length), "parent: a parent index points out of its request")
    checks.fail_if(~is_first & (par == local), "parent: a node is its own parent (cycle)")
    checks.fail_if(~is_first & (par > local),
                   "parent: parents must point backwards (parent[i] < i within a request); a forward pointer can "
                   "form a cycle")
    tokens = node_token_ids.to(torch.int64)
    checks.fail_if(~is_first & ((tokens < -1) | (tokens >= vocab_size)),
                   f"node_token_ids must be in [0, {vocab_size}) or -1 (placeholder) for non-root nodes")
    tree = _ref_tree.tree_layout(cu, torch.where(is_first, -1, par))
    if unique_siblings and num_nodes:
        # (parent, token) pairs of real children must be distinct.
        real = (tree.parent >= 0) & (tokens >= 0) & (tokens < vocab_size)
        key = torch.where(real, tree.parent * (vocab_size + 1) + tokens, -1 - torch.arange(num_nodes, device=device))
        sorted_key = torch.sort(key).values
        checks.fail_if((sorted_key[1:] == sorted_key[:-1]) & (sorted_key[1:] >= 0),
                       "node_token_ids: two siblings carry the same token; deterministic trees and trees drawn "
                       "without replacement need distinct sibling tokens")
    return _ref_tree.node_depth(tree)


def verify_tree(
    target_logits: torch.Tensor,
    node_token_ids: torch.Tensor,
    parent: torch.Tensor,
    cu_num_nodes: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    position: torch.Tensor | None = None,
    sibling_sampling: str = "iid",
    backend: str = "auto",
    *,
    method: str = "token",
    max_depth: int | None = None,
    validate: bool = True,
    return_mask: bool = False,
    min_p: torch.Tensor | None = None,
) -> TreeResult | tuple[TreeResult, SamplingMask]:
    """Losslessly verify a ragged batch of token trees against the target model's logits.

    Args:
        target_logits: [N, V] bf16/fp16/fp32; row i is the target distribution of the token after node i.
            Request b owns nodes ``cu[b] ... cu[b+1] - 1``; its node 0 is the root (the last emitted token).
        node_token_ids: [N] int32/int64 token of each node (the root's entry is ignored); -1 marks a
            placeholder child (never accepted).
        parent: [N] int32/int64 local index of each node's parent within its request, -1 at the root;
            parents point backwards (parent[i] < i). Siblings are ordered by local index.
        cu_num_nodes: [B + 1] int32/int64 cumulative node counts (every request has >= 1 node).
        draft_probs: [N, V] float, row i the draft distribution q from which node i's children were drawn
            (stochastic trees), or None for deterministic trees (top-k / greedy drafters, static trees).
        temperature, top_k, top_p, seed, min_p: [B] as in ``verify_chain``.
        position: [B] int64 absolute position of the token after each root (a depth-d node decides the
            token at ``position + d``); default 0.
        sibling_sampling: how siblings were drawn from q in stochastic trees: "iid" (SpecInfer multi-step
            verification) or "without_replacement" (recursive rejection sampling). Ignored without
            draft_probs.
        backend: "auto" | "reference" | "triton" | "cpu" | "cuda".
        method: "token" (the root-to-leaf walks above) or "traversal" (Weng et al.'s traversal
            verification, ``reference/traversal.py``): lossless, leaf to root at the sequence level, at least
            as many accepted nodes in expectation for stochastic trees (equal at depth 1, where it is
            recursive rejection sampling; on a chain it is ``verify_chain(method="block")``, token for
            token). Deterministic trees and greedy requests run the token-level walk, which no verifier
            beats on a fixed tree.
        max_depth: width of the outputs minus one, in [0, 2**31 - 1]; None computes the deepest node's depth
            (read in the one host sync of the call). Nodes deeper than max_depth are ignored when
            ``validate=False``.
        validate: check values (tree structure, ranges, duplicate siblings) with one host sync; False skips
            every check that reads tensor values, for CUDA-graph capture. Every backend stays memory-safe and
            in the vocabulary either way: cu entries are clamped into [0, N] (``reference.tree.tree_spans``; a
            request left without nodes emits nothing), nodes whose parent does not point backwards inside
            their request are detached, and the CPU backend raises ValueError on an inconsistent cu instead.

    Returns:
        ``TreeResult(output_token_ids [B, D + 1] int32, accepted_nodes [B, D + 1] int32,
        num_accepted [B] int32)`` with D = max_depth: the accepted path's tokens then one emitted token;
        the accepted path's local node indices starting with the root 0; both -1 padded. With
        ``return_mask=True`` the pair ``(TreeResult, SamplingMask)``: as in ``verify_chain``, output token j
        decided at the row of ``accepted_nodes[b, j]``.
    """
    if return_mask is not False:
        _check_flag("return_mask", return_mask)
    op = _check_method(method, "tree")
    args = checked_tree_args(
        target_logits, node_token_ids, parent, cu_num_nodes, draft_probs, temperature, top_k, top_p, seed, position,
        sibling_sampling, max_depth=max_depth, validate=validate, min_p=min_p,
    )
    fn = _resolve(backend, target_logits.device, op)
    return _with_mask(fn, args, _mask.tree_sampling_mask) if return_mask else fn(*args)


def checked_tree_args(
    target_logits: torch.Tensor,
    node_token_ids: torch.Tensor,
    parent: torch.Tensor,
    cu_num_nodes: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    position: torch.Tensor | None = None,
    sibling_sampling: str = "iid",
    *,
    max_depth: int | None = None,
    validate: bool = True,
    min_p: torch.Tensor | None = None,
) -> tuple:
    """``verify_tree``'s argument checks and normalisation (same arguments, same errors, same one host sync).

    Returns the positional arguments every backend's ``verify_tree`` takes: (logits, node ids, parent, cu,
    draft_probs, temperature, top_k, top_p, seed, position, sibling_sampling, max_depth), normalised, the
    logits with ``min_p`` applied when it is given.
    """
    _check_logits("target_logits", target_logits)
    device = target_logits.device
    _check_tensor("cu_num_nodes", cu_num_nodes, 1, INDEX_DTYPES, device)
    if cu_num_nodes.numel() < 1:
        raise ValueError("cu_num_nodes must have B + 1 >= 1 entries")
    _check_tensor("node_token_ids", node_token_ids, 1, INDEX_DTYPES, device)
    _check_tensor("parent", parent, 1, INDEX_DTYPES, device)
    num_reqs = cu_num_nodes.numel() - 1
    num_rows, vocab_size = target_logits.shape
    num_nodes = node_token_ids.numel()
    if parent.numel() != num_nodes:
        raise ValueError(f"parent must have one entry per node (N = {num_nodes}), got {parent.numel()}")
    if num_rows != num_nodes:
        raise ValueError(f"target_logits must have one row per node (N = {num_nodes}), got {num_rows}")
    if not isinstance(sibling_sampling, str):
        raise TypeError(f"sibling_sampling must be a str, got {type(sibling_sampling).__name__}")
    if sibling_sampling not in SIBLING_SAMPLING:
        raise ValueError(f"sibling_sampling must be one of {SIBLING_SAMPLING}, got {sibling_sampling!r}")
    draft_probs = _check_draft_probs(draft_probs, "N", num_nodes, vocab_size, device)
    checks = ValueChecks(device)
    temperature, top_k, top_p, seed, position = normalize_sampling_params(
        num_reqs, device, temperature, top_k, top_p, seed, position, validate, checks
    )
    cu = _as(cu_num_nodes, torch.int64)
    if min_p is not None:
        target_logits = _min_p_rows(target_logits, temperature, min_p, _ref_tree.tree_spans(cu, num_nodes)[0],
                                    checks if validate else None)
    if max_depth is not None:
        max_depth = _check_width("max_depth", max_depth)
    depth = None
    if validate:
        unique = draft_probs is None or sibling_sampling == "without_replacement"
        depth = _check_tree_values(checks, node_token_ids, parent, cu, vocab_size, unique)
        if draft_probs is not None:
            checks.fail_if(~torch.isfinite(draft_probs) | (draft_probs < 0), "draft_probs must be finite and >= 0")
    width = max_depth
    if max_depth is None:
        if depth is None:
            depth = _ref_tree.node_depth(_ref_tree.tree_layout(cu, parent.to(torch.int64)))
        width = depth.max() if num_nodes else torch.zeros((), dtype=torch.int64, device=device)
        deepest = checks.read(width)
    elif validate and num_nodes:
        checks.fail_if(depth > max_depth, f"max_depth={max_depth} is smaller than the deepest node's depth")
    if validate and num_reqs:
        checks.fail_if(position > MAX_POSITION - width, f"position + max_depth must be <= {MAX_POSITION}")
    values = checks.run()
    if max_depth is None:
        max_depth = values[deepest]
    return (
        target_logits.contiguous(), _as(node_token_ids, torch.int64), _as(parent, torch.int64),
        cu, draft_probs, temperature, top_k, top_p, seed, position, sibling_sampling, max_depth,
    )
