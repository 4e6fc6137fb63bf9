"""What the audit runs against: :class:`AuditTarget`, the built-in targets, and ``module:function`` lookup.

A target wraps a *verifier*: a callable with ``verify_chain``'s positional signature (``target_logits,
draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p, seed, position``, plus a
``min_p=`` keyword where ``supports`` says so) returning an object with ``output_token_ids`` [B, K + 1]
(-1 padded) and ``num_accepted`` [B]. Adapters translate that call into a peer's own signature and the
peer's output back. ``mutant(bug)`` returns the same adapter path with the peer's verification replaced
by one of the suite's planted-bug samplers, so the audit can show that it would have caught a bug in that
very harness.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..mutants import mutant_verifier
from ..toy_models import Verifier

__all__ = ["AuditTarget", "TargetError", "BUILTIN_TARGETS", "resolve_target", "ours_target", "device_verifier",
           "reference_verifier", "cuda_emulated_target"]

FEATURES = ("min_p", "per_request_seed", "validation", "method")
"""``supports`` entries: ``min_p`` (takes a ``min_p=`` keyword), ``per_request_seed`` (a request's tokens
depend only on its own inputs, seed and position: replay and batch invariance apply), ``validation``
(takes our argument types directly, so the whole bad-input table applies), ``method`` (takes ``method=``)."""


class TargetError(ValueError):
    """The TARGET cannot be resolved or cannot run here; the message is one line for the user."""


@dataclass(frozen=True)
class AuditTarget:
    """One verifier under audit.

    ``verify`` is None when the target cannot run on this machine; ``refusal`` then says why in one line.
    ``value_arguments`` names the arguments whose values the adapter hands to the peer unchanged (the
    "value" rows of the bad-input table run only for those). ``versions`` records the peer's version.
    ``mutant_base`` is the mutant path with the unmutated reference verification in the bug's place: a
    planted bug whose counts equal its counts is reported inert (it cannot act on this path).
    """

    name: str
    description: str
    verify: Verifier | None
    refusal: str | None = None
    supports: frozenset[str] = frozenset()
    mutant: Callable[[str], Verifier] | None = None
    mutant_base: Verifier | None = None
    value_arguments: frozenset[str] = frozenset()
    versions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.supports) - set(FEATURES)
        if unknown:
            raise ValueError(f"supports holds unknown features {sorted(unknown)}; known: {FEATURES}")
        if (self.verify is None) == (self.refusal is None):
            raise ValueError("give exactly one of verify (runs here) and refusal (why it cannot)")


ALL_ARGUMENTS = frozenset({"target_logits", "draft_token_ids", "cu_num_draft_tokens", "draft_probs",
                           "temperature", "top_k", "top_p", "seed", "position"})


def reference_verifier(*args, **kwargs):
    """``verify_chain(..., backend="reference", validate=False)``: the unmutated twin of every mutant."""
    from ... import verify_chain

    kwargs.pop("backend", None)
    kwargs.pop("validate", None)  # adapters that call verify_chain unvalidated (the vLLM drop-ins) pass it too
    return verify_chain(*args, backend="reference", validate=False, **kwargs)


def device_verifier(verify: Verifier, device: torch.device | str) -> Verifier:
    """``verify`` on ``device``: tensor arguments moved there, the result's tensors back to the CPU."""
    device = torch.device(device)
    if device.type == "cpu":
        return verify

    @functools.wraps(verify)
    def moved(*args, **kwargs):
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        res = verify(*args, **kwargs)
        return type(res)(*(x.cpu() for x in res))

    return moved


def ours_target(backend: str, method: str = "token") -> AuditTarget:
    """``specdec_kernels.verify_chain(..., backend=backend)``; mutants run through the same device wrapper."""
    from ... import available_backends, verify_chain

    device = "cuda" if backend == "cuda" or (backend == "triton" and torch.cuda.is_available()) else "cpu"
    description = (f"specdec_kernels.verify_chain(backend={backend!r}, method={method!r}) on {device} tensors "
                   "(inputs moved there, results back).")
    if backend not in available_backends(device):
        hint = " (set TRITON_INTERPRET=1 on CPU)" if backend == "triton" else ""
        return AuditTarget(backend, description, None,
                           refusal=f"backend {backend!r} is not available on {device} here{hint}")
    extra = {} if method == "token" else {"method": method}
    verify = device_verifier(functools.partial(verify_chain, backend=backend, **extra), device)

    def mutant(bug: str) -> Verifier:
        return device_verifier(mutant_verifier(bug), device)

    return AuditTarget(backend, description, verify, supports=frozenset({"per_request_seed", "validation", "method"}),
                       mutant=mutant, mutant_base=device_verifier(reference_verifier, device),
                       value_arguments=ALL_ARGUMENTS)


EMULATED_SCHEDULE = "random"
"""Thread interleaving of the ``cuda-emulated`` target: a random ready thread at every step (the strongest
of the emulation's schedules at exposing a missing barrier), seeded by :data:`EMULATED_SCHEDULE_SEED`."""
EMULATED_SCHEDULE_SEED = 17


def cuda_emulated_target(method: str = "token", arch: str = "h200", schedule: str = EMULATED_SCHEDULE,
                         schedule_seed: int = EMULATED_SCHEDULE_SEED) -> AuditTarget:
    """Our CUDA kernels (``csrc/cuda/``, ``csrc/include/specdec/cuda/*.cuh``) through the CUDA host emulation
    (:mod:`specdec_kernels.testing.cuda_host`) on CPU tensors: the launch configurations of ``arch``, real
    barriers and warp exchanges under ``schedule``. Mutants run as for our other backends (on the CPU)."""
    from .. import cuda_host

    description = (f"Our CUDA kernels (csrc/cuda, csrc/include/specdec/cuda/*.cuh, method={method!r}) compiled for the host "
                   f"and run through the CUDA host emulation (specdec_kernels.testing.cuda_host.verify_chain): "
                   f"{arch} launch configurations, every block as cooperative fibers with real __syncthreads and "
                   f"warp exchanges, schedule {schedule!r} (seed {schedule_seed}), poisoned shared memory and "
                   "workspace, fenced outputs; the public API's argument checks.")
    if not cuda_host.available():
        return AuditTarget("cuda-emulated", description, None,
                           refusal="the CUDA host emulation is not built (run setup.py build_ext --inplace)")
    if arch not in cuda_host.ARCHS:
        raise ValueError(f"arch must be one of {sorted(cuda_host.ARCHS)}, got {arch!r}")
    verify = functools.partial(cuda_host.verify_chain, method=method, arch=cuda_host.ARCHS[arch], schedule=schedule,
                               schedule_seed=schedule_seed)
    return AuditTarget("cuda-emulated", description, verify,
                       supports=frozenset({"per_request_seed", "validation", "method"}), mutant=mutant_verifier,
                       mutant_base=reference_verifier, value_arguments=ALL_ARGUMENTS,
                       versions={"emulated_device": f"{arch} (sm_{cuda_host.ARCHS[arch]})", "schedule": schedule})


def _vllm(name: str) -> Callable[[], AuditTarget]:
    def build() -> AuditTarget:
        module = importlib.import_module(".vllm_targets", __package__)
        return module.TARGETS[name]()

    return build


def _peer(module_name: str) -> Callable[[], AuditTarget]:
    def build() -> AuditTarget:
        return importlib.import_module(f".{module_name}", __package__).target()

    return build


BUILTIN_TARGETS: dict[str, Callable[[], AuditTarget]] = {
    "reference": functools.partial(ours_target, "reference"),
    "cpu": functools.partial(ours_target, "cpu"),
    "triton": functools.partial(ours_target, "triton"),
    "cuda": functools.partial(ours_target, "cuda"),
    "cuda-emulated": cuda_emulated_target,
    "vllm-v1-cpu": _vllm("vllm-v1-cpu"),
    "vllm-v1-cpu-expand-fixed": _vllm("vllm-v1-cpu-expand-fixed"),
    "vllm-v1-cpu-fixed": _vllm("vllm-v1-cpu-fixed"),
    "vllm-v1-triton": _vllm("vllm-v1-triton"),
    "vllm-v1-plugin": _vllm("vllm-v1-plugin"),
    "vllm-v2-triton": _vllm("vllm-v2-triton"),
    "flashinfer": _peer("flashinfer_target"),
    "sglang": _peer("sglang_target"),
}
"""Built-in TARGET names (anything with a colon is ``module:function``)."""
OURS = ("reference", "cpu", "triton", "cuda", "cuda-emulated")
"""The built-in targets that are our own backends (they take ``--method``)."""


def _from_object(spec: str, obj) -> AuditTarget:
    if isinstance(obj, AuditTarget):
        return obj
    if not callable(obj):
        raise TargetError(f"{spec} is a {type(obj).__name__}, not a verifier (a callable) or an AuditTarget")
    supports = frozenset(getattr(obj, "audit_supports", ()))
    description = (f"{spec}: a user verifier with verify_chain's positional signature; the planted-bug mutants "
                   "run through the same audit harness.")
    try:
        return AuditTarget(spec, description, obj, supports=supports, mutant=mutant_verifier,
                           mutant_base=reference_verifier,
                           value_arguments=ALL_ARGUMENTS if "validation" in supports else frozenset())
    except ValueError as exc:
        raise TargetError(f"{spec}: audit_supports: {exc}") from None


def resolve_target(spec: str, method: str = "token") -> AuditTarget:
    """The target named ``spec``: a built-in name, or ``module:attribute`` where the attribute is an
    :class:`AuditTarget`, a zero-argument factory decorated as one, or a verifier callable."""
    if ":" not in spec:
        if spec not in BUILTIN_TARGETS:
            names = ", ".join(BUILTIN_TARGETS)
            raise TargetError(f"unknown target {spec!r}; use one of {names}, or module:function")
        if method != "token":
            if spec not in OURS:
                raise TargetError(f"--method {method} applies to our own backends only, not {spec}")
            return cuda_emulated_target(method) if spec == "cuda-emulated" else ours_target(spec, method)
        return BUILTIN_TARGETS[spec]()
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise TargetError(f"target {spec!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"cannot import {module_name!r}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if getattr(obj, "is_audit_target_factory", False):
        obj = obj()
    return _from_object(spec, obj)
