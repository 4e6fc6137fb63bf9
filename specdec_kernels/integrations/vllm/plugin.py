"""vLLM general plugin: route vLLM's speculative-decoding verification through specdec-kernels.

vLLM calls :func:`register` in every process it starts (engine core, workers) through the entry point
``vllm.general_plugins: specdec_kernels``. It patches only when ``SPECDEC_VLLM=1``; :func:`apply` /
:func:`revert` and the :func:`patched` context manager do the same explicitly. Each replaces a method on
vLLM's sampler class (so instances built before patching are covered too) and restores the very object it
replaced. A vLLM whose version or signatures differ is refused (``compat.UnsupportedVLLMError``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from . import compat, runtime, v1, v2

ENV_FLAG = "SPECDEC_VLLM"

# target -> (owner class, original object from owner.__dict__) for every active patch.
_active: dict[compat.Target, tuple[type, object]] = {}
_logged = False


def _install(target: compat.Target, replacement, original_slot: list) -> None:
    owner, original = compat.resolve(target)
    compat.check_signature(original, target)
    original_slot[:] = [original]
    setattr(owner, target.name, replacement)
    _active[target] = (owner, original)


def apply(v2_required: bool = False) -> list[str]:
    """Patch vLLM's samplers; returns the patched names. Idempotent.

    The V1 sampler (and the V1 model runner's logits-processor builder) is always patched. The V2 sampler is patched when its module imports (it needs vLLM's
    GPU model runner code); ``v2_required=True`` makes a failure there an error instead of a skip.
    """
    compat.check_version(compat.installed_version())
    names = []
    if compat.V1_FORWARD not in _active:
        compat.check_targets(compat.V1_CALLED + compat.V1_BUILD_CALLED)
        _install(compat.V1_FORWARD, v1.forward, v1.ORIGINAL)
        try:
            _install(compat.V1_BUILD_LOGITSPROCS, v1.build_logitsprocs, v1.ORIGINAL_BUILD)
            _install(compat.SPEC_DECODE_PARAMS_GATE, v1.validate_spec_decode, v1.ORIGINAL_VALIDATE)
        except compat.UnsupportedVLLMError:
            revert()
            raise
    names += [t.qualname for t in (compat.V1_FORWARD, compat.V1_BUILD_LOGITSPROCS, compat.SPEC_DECODE_PARAMS_GATE)]
    if compat.V2_VERIFY not in _active:
        try:
            compat.check_targets(compat.V2_CALLED)
            compat.check_fields(*compat.SAMPLING_MASK_TENSORS)
            _install(compat.V2_VERIFY, v2._verify, v2.ORIGINAL)
            _install(compat.V2_VERIFY_IN_CHUNKS, v2._verify_in_chunks, v2.ORIGINAL_IN_CHUNKS)
        except compat.UnsupportedVLLMError:
            _uninstall(compat.V2_VERIFY, compat.V2_VERIFY_IN_CHUNKS)
            if v2_required:
                revert()
                raise
    if compat.V2_VERIFY in _active:
        names += [compat.V2_VERIFY.qualname, compat.V2_VERIFY_IN_CHUNKS.qualname]
    return names


def _uninstall(*targets: compat.Target) -> None:
    """Restore the objects these targets replaced (those not patched are skipped)."""
    for target in targets:
        if target in _active:
            owner, original = _active.pop(target)
            setattr(owner, target.name, original)


def revert() -> None:
    """Restore every object :func:`apply` replaced (a no-op when nothing is patched)."""
    for target, (owner, original) in list(_active.items()):
        setattr(owner, target.name, original)
        del _active[target]
    v1.ORIGINAL.clear()
    v1.ORIGINAL_BUILD.clear()
    v1.ORIGINAL_VALIDATE.clear()
    v2.ORIGINAL.clear()
    v2.ORIGINAL_IN_CHUNKS.clear()


def is_applied() -> bool:
    """True while at least one patch is active."""
    return bool(_active)


@contextlib.contextmanager
def patched(v2_required: bool = False) -> Iterator[list[str]]:
    """Context manager: patch on entry, restore the replaced objects on exit (only if it patched them)."""
    already = is_applied()
    names = apply(v2_required)
    try:
        yield names
    finally:
        if not already:
            revert()


def register() -> None:
    """vLLM general-plugin entry point: patch when ``SPECDEC_VLLM=1`` and log once per process what it patched.

    vLLM configures its logging after loading plugins, so the message is printed by the first patched call.
    """
    global _logged
    if os.environ.get(ENV_FLAG, "0") != "1":
        return
    names = apply()
    if not _logged:
        _logged = True
        runtime.announce(f"specdec-kernels plugin active in pid {os.getpid()}; patched: {', '.join(names)}")
