"""vLLM 0.33.0's rejection samplers for the GPU benchmark, from the files ``benchmarks.gpu.prepare`` carried.

The device image has neither vLLM nor its dependencies, and a CUDA vLLM wheel is far over what a device run
can carry. So the kernels' own modules are executed from their files (``.cache/peers/vllm-0.33.0``) by the
audit's loader (:func:`specdec_kernels.audit.interpret.load_modules`), with ``vllm.triton_utils`` pointing at
the real Triton: compiled on a GPU, interpreted on CPU under ``TRITON_INTERPRET=1``.

- V2: ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample`` and the modules it
  imports (all of them small Triton modules), with ``sample/gumbel.py``'s ``apply_temperature``, which V2's
  sampler runs on a float32 copy of the logits before it: nothing stubbed.
- V1: ``vllm.v1.sample.rejection_sampler.rejection_sample`` (the function ``RejectionSampler.forward``
  calls after its sampling constraints) with its Triton kernels and their dispatchers
  (``jit_warmup_triton_helper``, loaded from its file too). What that module imports for the rest of the
  sampler (config, logger, outputs, the V1 ``Sampler``, penalties, ...) is stubbed (:data:`V1_STUBBED`): none
  of it runs in ``rejection_sample``.
"""

from __future__ import annotations

import logging
import os
import types
from pathlib import Path

import torch

from specdec_kernels.audit.interpret import InterpreterUnavailable, load_modules, triton_utils_shim

from .prepare import PEERS, VLLM_VERSION

VLLM_ROOT = PEERS / f"vllm-{VLLM_VERSION}"

V2_MODULES = (
    "vllm.v1.watermarking.prfs.base",
    "vllm.v1.watermarking.prfs.philox",
    "vllm.v1.worker.gpu.sample.gumbel",
    "vllm.v1.worker.gpu.sample.watermark",
    "vllm.v1.spec_decode.fly",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
)
V1_MODULES = (
    "vllm.model_executor.warmup.jit_warmup",
    "vllm.model_executor.warmup.jit_warmup_triton_helper",
    "vllm.v1.spec_decode.fly",
    "vllm.v1.sample.rejection_sampler",
)
# name -> attributes the V1 module imports from it (placeholders: rejection_sample uses none of them).
V1_STUBBED = {
    "vllm.config.model": ("PROCESSED_LOGPROBS_MODES",),
    "vllm.utils.torch_utils": ("async_tensor_h2d",),
    "vllm.v1.outputs": ("LogprobsLists", "LogprobsTensors", "SamplerOutput"),
    "vllm.v1.sample.logits_processor.builtin": ("MinTokensLogitsProcessor",),
    "vllm.v1.sample.metadata": ("SamplingMetadata",),
    "vllm.v1.sample.ops.bad_words": ("apply_bad_words_with_drafts",),
    "vllm.v1.sample.ops.penalties": ("apply_all_penalties",),
    "vllm.v1.sample.ops.topk_topp_sampler": ("apply_top_k_top_p",),
    "vllm.v1.sample.sampler": ("Sampler",),
    "vllm.v1.spec_decode.metadata": ("SpecDecodeMetadata",),
    "vllm.v1.spec_decode.utils": ("unconditional_to_conditional_rates",),
}


class PeerUnavailable(RuntimeError):
    """The carried sources are missing or do not load here (the reason in the message)."""


def _stub(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


class _NotRun:
    """Placeholder for a stubbed name: fails loudly if anything calls it."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise PeerUnavailable(f"{self.name} is a stub in benchmarks.gpu.peers (not carried)")


def _v1_stubs() -> dict[str, types.ModuleType]:
    stubs = {name: _stub(name, **{a: _NotRun(f"{name}.{a}") for a in attrs}) for name, attrs in V1_STUBBED.items()}
    stubs["vllm.config.model"].PROCESSED_LOGPROBS_MODES = ()
    stubs["vllm.logger"] = _stub("vllm.logger", init_logger=logging.getLogger)
    stubs["vllm.envs"] = _stub("vllm.envs", VLLM_TRITON_JIT_WARMUP_NUM_THREADS=1)
    cuda = torch.cuda.is_available()
    platform = types.SimpleNamespace(device_type="cuda" if cuda else "cpu", is_cuda=lambda: cuda)
    stubs["vllm.platforms"] = _stub("vllm.platforms", current_platform=platform)
    return stubs


def _shim() -> types.ModuleType:
    if os.environ.get("TRITON_INTERPRET") == "1":
        from specdec_kernels.audit import interp_libdevice

        return triton_utils_shim(interp_libdevice)
    return triton_utils_shim()


def _load(names: tuple[str, ...], stubs: dict[str, types.ModuleType] | None, root: Path) -> dict:
    if not (root / "vllm").is_dir():
        raise PeerUnavailable(f"vLLM {VLLM_VERSION} kernels not carried ({root} missing): run "
                              "`python -m benchmarks.gpu.prepare` and carry .cache/peers")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise PeerUnavailable("vLLM's Triton kernels need CUDA, or TRITON_INTERPRET=1 on CPU")
    try:
        return load_modules(names, _shim(), source_root=root, stubs=stubs)
    except (InterpreterUnavailable, ImportError, AttributeError) as exc:
        raise PeerUnavailable(f"vLLM {VLLM_VERSION} kernels did not load: {type(exc).__name__}: {exc}") from None


def load_v2(root: Path = VLLM_ROOT) -> types.SimpleNamespace:
    """vLLM 0.33.0's V2 verification step: ``apply_temperature`` (``sample/gumbel.py``: V2's sampler divides
    a float32 copy of the logits by the temperature in place before verifying, skipping T = 0 and 1) and
    ``rejection_sample`` (``rejection_sampler_utils``; its kernels use the temperature only to find greedy
    requests and to scale the draft logits)."""
    modules = _load(V2_MODULES, None, root)
    return types.SimpleNamespace(
        apply_temperature=modules["vllm.v1.worker.gpu.sample.gumbel"].apply_temperature,
        rejection_sample=modules["vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"].rejection_sample)


def load_v1(root: Path = VLLM_ROOT):
    """vLLM 0.33.0's V1 ``rejection_sample`` (``vllm.v1.sample.rejection_sampler``)."""
    return _load(V1_MODULES, _v1_stubs(), root)["vllm.v1.sample.rejection_sampler"].rejection_sample
