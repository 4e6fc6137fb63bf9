"""Audit target ``vllm-v2-triton``: vLLM 0.32's V2 model runner ``RejectionSampler._verify``
(``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``), as far as it runs on CPU tensors.

What runs is vLLM's own code: ``_verify`` itself, ``Sampler.apply_sampling_params`` (V2's), the
``SamplingStates`` methods ``add_request`` / ``apply_temperature`` / ``apply_min_p`` / ``apply_top_k_top_p``,
and every Triton kernel of ``rejection_sampler_utils.rejection_sample`` (interpreted on CPU, see
:mod:`.interpret`). What cannot run on CPU is the storage: V2's ``UvaBackedTensor`` needs pinned memory, so
the per-request-state tensors are plain CPU tensors with the same ``.np`` / ``.gpu`` views (one memory),
the sampler has no penalty / bias / bad-words processors and its thinking budget is disabled (our cases use
none of them).

Translation (the layout of ``tests/vllm/test_vllm_v2.py``, read from ``_verify``'s callers): request b is request
state b; its rows are its drafts' rows then its bonus row; row j's input token is the previous token
(row 0: an arbitrary last token, 0) and the draft verified at row j is the input of row j + 1
(``verify_draft_sampled``), -1 for placeholders; ``pos`` = our position + j; draft probabilities q become
pre-temperature draft logits ``T * log q`` (so V2's softmax(draft_logits / T) is q). The output is
``sampled[b, :num_sampled[b]]``. Planted bugs run through the same objects with ``_verify`` replaced by the
plugin's V2 drop-in (``integrations/vllm/v2._verify``) calling the mutant.
"""

from __future__ import annotations

import contextlib
import types
from types import SimpleNamespace
from unittest import mock

import numpy as np
import torch

from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import Verifier
from ..reference.chain import ChainResult
from .audit_target import AuditTarget, reference_verifier
from .vllm_common import MIN_P_NOTE, vllm_refusal, vllm_versions

__all__ = ["v2_triton_target", "v2_verifier", "v2_inputs", "chain_result", "cpu_sampling_states"]

MODULES = (
    "vllm.v1.watermarking.prfs.philox",
    "vllm.v1.worker.gpu.sample.gumbel",
    "vllm.v1.worker.gpu.sample.watermark",
    "vllm.v1.worker.gpu.sample.min_p",
    "vllm.v1.worker.gpu.sample.states",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
)


class _CpuBacked:
    """``UvaBackedTensor`` without pinned memory: ``.cpu``, ``.np`` and ``.gpu`` are one CPU buffer."""

    def __init__(self, size: int, dtype: torch.dtype):
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu

    def copy_to_uva(self, n: int | None = None) -> torch.Tensor:
        return self.gpu


def cpu_sampling_states(states_cls, max_num_reqs: int, vocab_size: int):
    """A V2 ``SamplingStates`` whose buffers are :class:`_CpuBacked` (the rest of its __init__ as in vLLM)."""
    states = object.__new__(states_cls)
    states.max_num_reqs, states.vocab_size = max_num_reqs, vocab_size
    states.temperature = _CpuBacked(max_num_reqs, torch.float32)
    states.top_k = _CpuBacked(max_num_reqs, torch.int32)
    states.top_p = _CpuBacked(max_num_reqs, torch.float32)
    states.min_p = _CpuBacked(max_num_reqs, torch.float32)
    states.seeds = _CpuBacked(max_num_reqs, torch.int64)
    states.seeds_set = np.zeros(max_num_reqs, dtype=bool)
    states.top_k.np.fill(vocab_size)
    states.top_p.np.fill(1.0)
    states.num_logprobs = np.full(max_num_reqs, -1, dtype=np.int32)
    return states


def _cpu_sampler(modules, num_reqs: int, vocab_size: int, params: list[SimpleNamespace]):
    """The V2 sampler's state and ``apply_sampling_params`` for ``params`` (one SamplingParams-like per
    request state), built on CPU."""
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.sample.thinking_budget import ThinkingBudgetState

    states_cls = modules["vllm.v1.worker.gpu.sample.states"].SamplingStates
    states = cpu_sampling_states(states_cls, max(num_reqs, 1), vocab_size)
    needs = np.zeros(max(num_reqs, 1), dtype=bool)
    for i, p in enumerate(params):
        needs[i] = states.add_request(i, p)
    sampler = SimpleNamespace(
        sampling_states=states, needs_logits_processing=needs, logits_processors=[], use_fp64_gumbel=False,
        thinking_budget_state=ThinkingBudgetState(SimpleNamespace(max_num_reqs=max(num_reqs, 1),
                                                                  device=torch.device("cpu")), None),
        logprobs_mode="raw_logprobs", return_sampling_mask=False,
    )
    sampler.apply_sampling_params = types.MethodType(Sampler.apply_sampling_params, sampler)
    return sampler


def v2_inputs(draft_token_ids, cu, position):
    """V2's per-row tensors for our ragged batch (see the module docstring)."""
    num_reqs = cu.numel() - 1
    ks = (cu[1:] - cu[:-1]).tolist()
    ids = draft_token_ids.tolist()
    inputs, pos, state, local, cu_logits = [], [], [], [], [0]
    for b, k in enumerate(ks):
        drafts = ids[int(cu[b]):int(cu[b]) + k]
        inputs += [0, *drafts]
        pos += [int(position[b]) + j for j in range(k + 1)]
        state += [b] * (k + 1)
        local += list(range(k + 1))
        cu_logits.append(cu_logits[-1] + k + 1)
    as64 = lambda x: torch.tensor(x, dtype=torch.int64)
    return SimpleNamespace(
        verify_draft_sampled=as64(inputs), pos=as64(pos), cu_num_logits=torch.tensor(cu_logits, dtype=torch.int32),
        idx_mapping=torch.arange(num_reqs, dtype=torch.int32), idx_mapping_np=np.arange(num_reqs, dtype=np.int32),
        expanded_idx_mapping=torch.tensor(state, dtype=torch.int32),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32),
        seq_lens_upper_bound_np=np.array([p + 1 for p in pos[-1:]] * num_reqs, dtype=np.int32), ks=ks,
    )


def v2_verifier(modules, verify_fn=None) -> Verifier:
    """Our verifier signature over V2's ``RejectionSampler._verify`` (or ``verify_fn(self, ...)`` with
    ``_verify``'s signature, e.g. the plugin's drop-in)."""
    rs_cls = modules["vllm.v1.worker.gpu.spec_decode.rejection_sampler"].RejectionSampler

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None, min_p=None):
        num_reqs = cu_num_draft_tokens.numel() - 1
        vocab = target_logits.shape[-1]
        cu = cu_num_draft_tokens.to(torch.int64)
        position = torch.zeros(num_reqs, dtype=torch.int64) if position is None else position
        temperature = torch.zeros(num_reqs) if temperature is None else temperature
        params = [SimpleNamespace(
            temperature=float(temperature[b]), top_k=int(top_k[b]) if top_k is not None else 0,
            top_p=float(top_p[b]) if top_p is not None else 1.0, min_p=float(min_p[b]) if min_p is not None else 0.0,
            seed=int(seed[b]) if seed is not None else None, logprobs=None) for b in range(num_reqs)]
        sampler = _cpu_sampler(modules, num_reqs, vocab, params)
        x = v2_inputs(draft_token_ids, cu, position)
        steps = max(max(x.ks, default=0), 1)
        spec_config = SimpleNamespace(num_speculative_tokens=steps, enable_adaptive_verification=False,
                                      rejection_sample_method="strict", synthetic_acceptance_rates=None)
        rs = rs_cls(sampler, spec_config, torch.device("cpu"))
        draft_logits = None
        if draft_probs is not None:
            draft_logits = torch.full((max(num_reqs, 1), steps, vocab), float("-inf"))
            scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
            for b, k in enumerate(x.ks):
                lo = int(cu[b])
                draft_logits[b, :k] = torch.log(draft_probs[lo:lo + k].float()) * scale[b]
        call = rs._verify if verify_fn is None else types.MethodType(verify_fn, rs)
        _, sampled, num_sampled = call(
            target_logits.float().contiguous(), draft_logits, x.verify_draft_sampled, x.pos, x.cu_num_logits,
            x.idx_mapping, x.idx_mapping_np, x.expanded_idx_mapping, x.expanded_local_pos,
            x.seq_lens_upper_bound_np, x.verify_draft_sampled,
        )
        return chain_result(sampled, num_sampled, x.ks)

    return verify


def chain_result(sampled: torch.Tensor, num_sampled: torch.Tensor, ks: list[int]) -> ChainResult:
    """V2's ``sampled`` [B, >= 1] / ``num_sampled`` [B] as our ChainResult (-1 after the emitted tokens)."""
    sampled, num_sampled = sampled.cpu(), num_sampled.cpu()
    width = max(ks, default=0) + 1
    cols = torch.arange(width)
    sampled = sampled[:, :width].to(torch.int64)
    if sampled.shape[1] < width:
        sampled = torch.nn.functional.pad(sampled, (0, width - sampled.shape[1]), value=-1)
    n = num_sampled.to(torch.int64)
    out = torch.where(cols[None, :] < n[:, None], sampled, torch.full_like(sampled, -1))
    return ChainResult(out.to(torch.int32), (n - 1).clamp(min=0).to(torch.int32))


@contextlib.contextmanager
def _verify_in_plugin(verify: Verifier):
    from ..integrations.vllm import v2

    with mock.patch.object(v2, "verify_chain", verify):
        yield v2._verify


def v2_triton_target() -> AuditTarget:
    description = (
        "vLLM V2 model runner `RejectionSampler._verify` with V2's `Sampler.apply_sampling_params` and "
        "`SamplingStates` methods and the Triton kernels of `rejection_sampler_utils.rejection_sample`, "
        "interpreted on CPU tensors (`TRITON_INTERPRET=1`); V2's pinned-memory state buffers are replaced by "
        "plain CPU tensors (the V2 runner itself needs CUDA). Per-request seeds are V2's own (seed, position) "
        "Philox streams. Planted bugs run through the same objects with `_verify` replaced by the plugin's V2 "
        "drop-in calling the mutant.") + MIN_P_NOTE
    name = "vllm-v2-triton"
    refusal = vllm_refusal()
    if refusal is None and torch.cuda.is_available():
        refusal = "on a CUDA machine audit V2 through its model runner; this adapter is the CPU-interpreted path"
    if refusal is None:
        from .interpret import InterpreterUnavailable, interpreted_modules

        try:
            modules = interpreted_modules(MODULES)
        except InterpreterUnavailable as exc:
            refusal = str(exc)
    if refusal:
        return AuditTarget(name, description, None, refusal=refusal)

    return AuditTarget(name, description, v2_verifier(modules), supports=frozenset({"min_p", "per_request_seed"}),
                       mutant=lambda bug: v2_verifier(modules, _plugin_verify(mutant_verifier(bug))),
                       mutant_base=v2_verifier(modules, _plugin_verify(reference_verifier)),
                       value_arguments=frozenset({"target_logits", "draft_token_ids", "temperature"}),
                       versions=vllm_versions())


def _plugin_verify(verify: Verifier):
    def verify_v2(self, *args):
        with _verify_in_plugin(verify) as patched:
            return patched(self, *args)

    return verify_v2

