"""The built-in audit targets (our backends, the CUDA host emulation, the peers' adapters) and
``module:function`` lookup. :class:`AuditTarget` and the verifiers the adapters share are in
:mod:`.audit_target`; each peer's adapter module is imported when its target is built.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import Verifier
from .audit_target import (
    ALL_ARGUMENTS,
    FEATURES,
    AuditTarget,
    TargetError,
    device_verifier,
    reference_verifier,
)

__all__ = ["AuditTarget", "TargetError", "BUILTIN_TARGETS", "resolve_target", "ours_target", "device_verifier",
           "reference_verifier", "cuda_emulated_target", "FEATURES"]


def ours_target(backend: str, method: str = "token") -> AuditTarget:
    """``specdec_kernels.verify_chain(..., backend=backend)``; mutants run through the same device wrapper."""
    from .. import available_backends, verify_chain

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
    (:mod:`specdec_kernels.exactness.cuda_emulation`) on CPU tensors: the launch configurations of ``arch``, real
    barriers and warp exchanges under ``schedule``. Mutants run as for our other backends (on the CPU)."""
    from ..exactness import cuda_emulation

    description = (f"Our CUDA kernels (csrc/cuda, csrc/include/specdec/cuda/*.cuh, method={method!r}) compiled for the host "
                   f"and run through the CUDA host emulation (specdec_kernels.exactness.cuda_emulation.verify_chain): "
                   f"{arch} launch configurations, every block as cooperative fibers with real __syncthreads and "
                   f"warp exchanges, schedule {schedule!r} (seed {schedule_seed}), poisoned shared memory and "
                   "workspace, fenced outputs; the public API's argument checks.")
    if not cuda_emulation.available():
        return AuditTarget("cuda-emulated", description, None,
                           refusal="the CUDA host emulation is not built (run setup.py build_ext --inplace)")
    if arch not in cuda_emulation.ARCHS:
        raise ValueError(f"arch must be one of {sorted(cuda_emulation.ARCHS)}, got {arch!r}")
    verify = functools.partial(cuda_emulation.verify_chain, method=method, arch=cuda_emulation.ARCHS[arch], schedule=schedule,
                               schedule_seed=schedule_seed)
    return AuditTarget("cuda-emulated", description, verify,
                       supports=frozenset({"per_request_seed", "validation", "method"}), mutant=mutant_verifier,
                       mutant_base=reference_verifier, value_arguments=ALL_ARGUMENTS,
                       versions={"emulated_device": f"{arch} (sm_{cuda_emulation.ARCHS[arch]})", "schedule": schedule})


# The peers' adapters, imported when their target is built (each imports vLLM / FlashInfer / SGLang lazily).
def _vllm_v1(name: str) -> Callable[[], AuditTarget]:
    def build() -> AuditTarget:
        from . import vllm_targets

        return vllm_targets.TARGETS[name]()

    return build


def _vllm_v2_triton(method: str) -> Callable[[], AuditTarget]:
    def build() -> AuditTarget:
        from . import vllm_v2

        return vllm_v2.v2_triton_target(method)

    return build


def _flashinfer() -> AuditTarget:
    from . import flashinfer_target

    return flashinfer_target.target()


def _sglang() -> AuditTarget:
    from . import sglang_target

    return sglang_target.target()


def _transformers() -> AuditTarget:
    from . import transformers_target

    return transformers_target.target()


def _transformers_assisted() -> AuditTarget:
    from . import transformers_assisted

    return transformers_assisted.target()


BUILTIN_TARGETS: dict[str, Callable[[], AuditTarget]] = {
    "reference": functools.partial(ours_target, "reference"),
    "cpu": functools.partial(ours_target, "cpu"),
    "triton": functools.partial(ours_target, "triton"),
    "cuda": functools.partial(ours_target, "cuda"),
    "cuda-emulated": cuda_emulated_target,
    "vllm-v1-cpu": _vllm_v1("vllm-v1-cpu"),
    "vllm-v1-cpu-expand-fixed": _vllm_v1("vllm-v1-cpu-expand-fixed"),
    "vllm-v1-cpu-fixed": _vllm_v1("vllm-v1-cpu-fixed"),
    "vllm-v1-triton": _vllm_v1("vllm-v1-triton"),
    "vllm-v1-plugin": _vllm_v1("vllm-v1-plugin"),
    "vllm-v2-triton": _vllm_v2_triton("standard"),
    "vllm-v2-triton-block": _vllm_v2_triton("block"),
    "vllm-v2-triton-synthetic": _vllm_v2_triton("synthetic"),
    "flashinfer": _flashinfer,
    "sglang": _sglang,
    "transformers": _transformers,
    "transformers-assisted": _transformers_assisted,
}
"""Built-in TARGET names (anything with a colon is ``module:function``)."""
OURS = ("reference", "cpu", "triton", "cuda", "cuda-emulated")
"""The built-in targets that are our own backends (they take ``--method``)."""
VLLM_V2 = ("vllm-v2-triton", "vllm-v2-triton-block", "vllm-v2-triton-synthetic")
"""The built-in targets over vLLM's V2 ``_verify`` (they, and ``vllm-v1-triton``, take ``--vllm-src``)."""


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
