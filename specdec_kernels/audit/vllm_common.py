"""What the vLLM V1 and V2 audit targets share: whether vLLM can be audited here, its version and where this
process imports it from, the min-p note."""

from __future__ import annotations

import importlib
import os

__all__ = ["MIN_P_NOTE", "vllm_refusal", "vllm_source", "vllm_versions"]

MIN_P_NOTE = (" The min-p cases hand min-p to the sampler directly: vLLM 0.32 itself refuses min_p > 0 with "
              "speculative decoding when it validates a request (`SamplingParams._validate_spec_decode`).")


def vllm_refusal() -> str | None:
    """Why the vLLM targets cannot run here (not installed, unsupported version), or None."""
    try:
        from ..integrations.vllm import compat

        compat.check_version(compat.installed_version())
        compat.check_targets((compat.V1_FORWARD, *compat.V1_CALLED))
    except Exception as exc:  # UnsupportedVLLMError or an import failure of vLLM itself
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def vllm_versions() -> dict[str, str]:
    from ..integrations.vllm import compat

    return {"vllm": compat.installed_version()}


def vllm_source() -> str:
    """Where this process imports vLLM from: its folder on ``sys.path`` relative to the working directory (a
    release's sources unpacked there, ``--vllm-src``), else "installed"."""
    rel = os.path.relpath(os.path.dirname(os.path.dirname(importlib.import_module("vllm").__file__)))
    return "installed" if rel.startswith("..") or "-packages" in rel else rel
