"""Audit targets over the carried peers, for the device run (neither FlashInfer nor vLLM is installed there):

    python -m specdec_kernels.audit benchmarks.gpu.audit_targets:flashinfer --out DIR ...
    python -m specdec_kernels.audit benchmarks.gpu.audit_targets:vllm_v2 --out DIR ...

- ``flashinfer``: FlashInfer's ``ChainSpeculativeSampling`` kernel through our extension
  (``flashinfer_ext``), behind a function with ``flashinfer.sampling.chain_speculative_sampling``'s contract,
  audited by the built-in FlashInfer adapter (:func:`specdec_kernels.audit.flashinfer_target.target_for`):
  the same translation and planted bugs as the ``flashinfer`` target. Philox keys: one per request, drawn
  from the adapter's generator (FlashInfer's Python API draws one (seed, offset) per call instead).
- ``vllm_v2``: vLLM 0.33.0's V2 step (its Triton kernels compiled on the GPU) in the V2 runner's layout
  (:func:`specdec_kernels.audit.vllm_v2.v2_inputs`): V2's ``apply_temperature`` on a float32 copy of the
  logits, top-k / top-p as V2's sampler applies them next (logits outside the support set to -inf; the
  support from our reference's law), then ``rejection_sample``; per-request seeds are V2's own (seed,
  position) Philox streams. Planted bugs run through the audit's own mutant
  verifiers (this target has no plugin path to host them).

Both refuse, with the reason, on a machine without CUDA or without the carried sources.
"""

from __future__ import annotations

import torch

from specdec_kernels.audit.audit_target import AuditTarget, reference_verifier
from specdec_kernels.exactness.chain_mutants import mutant_verifier

from . import peers
from .flashinfer_ext import ExtensionUnavailable
from .flashinfer_ext import load as load_flashinfer_ext
from .prepare import PEERS

__all__ = ["flashinfer", "vllm_v2", "flashinfer_contract", "v2_kernel_verifier"]


def _factory(fn):
    fn.is_audit_target_factory = True  # resolve_target calls it
    return fn


def flashinfer_contract(ext):
    """``chain_speculative_sampling`` with FlashInfer's Python contract, over our extension ``ext``."""

    def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
                                   maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None,
                                   seed=None, offset=None):
        b, n, _ = draft_probs.shape
        device = draft_probs.device
        out = torch.empty(b, n + 1, dtype=torch.int32, device=device)
        accepted = maybe_output_accepted_token_num
        emitted = maybe_output_emitted_draft_token_num
        accepted = torch.zeros(b, dtype=torch.int32, device=device) if accepted is None else accepted
        emitted = torch.zeros(b, dtype=torch.int32, device=device) if emitted is None else emitted
        keys = torch.randint(0, 2**62, (b,), generator=generator, device=device) if seed is None else (
            torch.full((b,), int(seed), dtype=torch.int64, device=device))
        offsets = torch.full((b,), int(offset or 0), dtype=torch.int64, device=device)
        ext.chain_speculative_sampling(draft_probs.float().contiguous(), draft_token_ids.int().contiguous(),
                                       target_probs.float().contiguous(), out, accepted, emitted, keys, offsets,
                                       bool(deterministic))
        return out, accepted, emitted

    return chain_speculative_sampling


FLASHINFER_DESCRIPTION = (
    "FlashInfer's ChainSpeculativeSampling kernel (sampling.cuh from the flashinfer-python wheel) through the "
    "benchmark's extension benchmarks/gpu/flashinfer_chain.cu, behind a function with "
    "flashinfer.sampling.chain_speculative_sampling's contract (one Philox key per request from the adapter's "
    "generator), audited through the flashinfer target's adapter: target probabilities from our reference "
    "transforms, deterministic drafts as one-hot q, chains grouped by length.")


@_factory
def flashinfer() -> AuditTarget:
    name = "flashinfer-ext"
    try:
        ext = load_flashinfer_ext()
    except ExtensionUnavailable as exc:
        return AuditTarget(name, FLASHINFER_DESCRIPTION, None, refusal=str(exc))
    from specdec_kernels.audit import flashinfer_target

    version = "unknown"
    try:
        import json

        version = json.loads((PEERS / "manifest.json").read_text())["flashinfer"]["version"] + " (headers)"
    except (OSError, ValueError, KeyError):
        pass
    return flashinfer_target.target_for(flashinfer_contract(ext), version, "benchmarks.gpu.audit_targets",
                                        name=name, description=FLASHINFER_DESCRIPTION)


def v2_kernel_verifier(v2, device: torch.device | str = "cuda"):
    """Our verifier signature over V2's step (``peers.load_v2()``: ``apply_temperature`` on a float32 copy of
    the logits, top-k / top-p as a mask, then ``rejection_sample``; the kernels on ``device``)."""
    from specdec_kernels.audit.peer_common import row_target_probs
    from specdec_kernels.audit.vllm_v2 import chain_result, v2_inputs

    device = torch.device(device)

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None):
        num_reqs = cu_num_draft_tokens.numel() - 1
        vocab = target_logits.shape[-1]
        cu = cu_num_draft_tokens.to(torch.int64)
        position = torch.zeros(num_reqs, dtype=torch.int64) if position is None else position
        temperature = torch.zeros(num_reqs) if temperature is None else temperature.float()
        seed = torch.zeros(num_reqs, dtype=torch.int64) if seed is None else seed
        x = v2_inputs(draft_token_ids, cu, position)
        on = lambda t: t.to(device)  # noqa: E731
        # V2's sampler: a float32 copy, the temperature in place, then top-k / top-p (a mask of the support).
        logits = on(target_logits.float().contiguous())
        v2.apply_temperature(logits, on(x.expanded_idx_mapping), on(temperature))
        if top_k is not None or top_p is not None:
            support = row_target_probs(target_logits.float(), cu, temperature, top_k, top_p) > 0
            logits = logits.masked_fill(~on(support), float("-inf"))
        steps = max(max(x.ks, default=0), 1)
        draft_logits = None
        if draft_probs is not None:
            draft_logits = torch.full((max(num_reqs, 1), steps, vocab), float("-inf"))
            scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
            for b, k in enumerate(x.ks):
                lo = int(cu[b])
                draft_logits[b, :k] = torch.log(draft_probs[lo:lo + k].float()) * scale[b]
            draft_logits = draft_logits.to(device)
        sampled, num_sampled = v2.rejection_sample(
            logits, draft_logits, on(x.verify_draft_sampled), on(x.cu_num_logits), on(x.pos),
            on(x.idx_mapping), on(x.expanded_idx_mapping), on(x.expanded_local_pos), on(temperature),
            on(seed.to(torch.int64)), steps)
        return chain_result(sampled, num_sampled, x.ks)

    return verify


V2_DESCRIPTION = (
    "vLLM 0.33.0 V2 `rejection_sampler_utils.rejection_sample` (its Triton kernels compiled on the GPU, loaded "
    "from the wheel's files by benchmarks.gpu.peers) in the V2 runner's layout, after V2's `apply_temperature` "
    "on a float32 copy of the logits and top-k / top-p as V2's sampler applies them (logits outside the support "
    "set to -inf); V2's own (seed, position) Philox streams. "
    "Planted bugs run through the audit's mutant verifiers.")


@_factory
def vllm_v2() -> AuditTarget:
    name = "vllm-v2-kernel"
    if not torch.cuda.is_available():
        return AuditTarget(name, V2_DESCRIPTION, None, refusal="this target runs V2's kernels compiled on a CUDA GPU")
    try:
        v2 = peers.load_v2()
    except peers.PeerUnavailable as exc:
        return AuditTarget(name, V2_DESCRIPTION, None, refusal=str(exc))
    return AuditTarget(name, V2_DESCRIPTION, v2_kernel_verifier(v2), supports=frozenset({"per_request_seed"}),
                       mutant=mutant_verifier, mutant_base=reference_verifier,
                       value_arguments=frozenset({"target_logits", "draft_token_ids", "temperature"}),
                       versions={"vllm": f"{peers.VLLM_VERSION} (carried sources)"})
