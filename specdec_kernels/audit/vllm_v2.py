"""Audit targets ``vllm-v2-triton`` (and ``-block``, ``-synthetic``): vLLM's V2 model runner
``RejectionSampler._verify`` (``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``), as far as it runs on CPU
tensors, for whichever vLLM this process imports (the installed one, or a release's unpacked Python sources
through ``python -m specdec_kernels.audit ... --vllm-src DIR``); read against 0.28.0, 0.29.0, 0.32.0 and 0.33.0.

What runs is vLLM's own code: ``_verify`` itself, ``Sampler.apply_sampling_params`` (V2's), the
``SamplingStates`` methods ``add_request`` / ``apply_temperature`` / ``apply_min_p`` / ``apply_top_k_top_p``,
every Triton kernel of ``rejection_sampler_utils.rejection_sample`` (interpreted on CPU, see :mod:`.interpret`),
and, for the narrow cases, V2's own draft sampling (:func:`v2_draft_sampler`). What cannot run on CPU is the
storage: V2's ``UvaBackedTensor`` needs pinned memory, so the per-request-state tensors are plain CPU tensors
with the same ``.np`` / ``.gpu`` views (one memory); the sampler has no penalty / bias / bad-words processors
and no thinking budget (our cases use none of them).

Translation (the layout of ``tests/vllm/test_vllm_v2.py``, read from ``_verify``'s callers): request b is request
state b; its rows are its drafts' rows then its bonus row; row j's input token is the previous token
(row 0: an arbitrary last token, 0) and the draft verified at row j is the input of row j + 1
(``verify_draft_sampled``), -1 for placeholders; ``pos`` = our position + j; draft probabilities q become
pre-temperature draft logits ``T * log q`` (so V2's softmax(draft_logits / T) is q). ``_verify`` takes the
arguments its release declares (0.28-0.30 lack ``seq_lens_upper_bound_np`` and ``verify_draft_sampled``, 0.31
lacks the latter). The output is ``sampled[b, :num_sampled[b]]``. Planted bugs run through the same objects with
``_verify`` replaced by the plugin's V2 drop-in (``integrations/vllm/v2._verify``) calling the mutant, where the
plugin supports the vLLM in use (0.32, 0.33).

The draft proposal (:func:`v2_draft_sampler`): with ``draft_sample_method="probabilistic"`` V2's speculators draw
each draft with ``sample.gumbel.gumbel_sample(draft_logits, idx_mapping, temperature, seeds, sample_src_positions,
apply_temperature=True, is_drafting=True, logits_cache=..., logits_cache_col=draft_step)`` (``Speculator.
sample_draft`` in 0.33, ``positions + 1`` in 0.28): the request's seed, keyed by the position of the row that
verifies the draft, the same (seed, position) as the acceptance uniform (``tl_rand32(seed, pos)``) and the
recovery noise (``gumbel_block_argmax(IS_DRAFTING=False)``) of that row. Up to 0.28.0 the three were one Philox
stream (``tl.randint(seed, pos)`` seeds the Gumbel noise and is the very word ``tl.rand(seed, pos)`` turns into
the uniform); vLLM PR #54282 (0.29.0) salts the draft's position (``_DRAFT_NOISE_SALT``, ``is_drafting``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import types
from types import SimpleNamespace
from unittest import mock

import numpy as np
import torch

from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import Verifier
from ..reference.chain import ChainResult
from .audit_target import AuditTarget, reference_verifier
from .vllm_common import MIN_P_NOTE, vllm_refusal, vllm_source, vllm_versions

__all__ = ["METHODS", "v2_triton_target", "v2_verifier", "v2_draft_sampler", "v2_inputs", "chain_result",
           "cpu_sampling_states", "v2_refusal"]

MODULES = (
    "vllm.v1.watermarking.prfs.philox",
    "vllm.v1.worker.gpu.sample.gumbel",
    "vllm.v1.worker.gpu.sample.watermark",
    "vllm.v1.worker.gpu.sample.min_p",
    "vllm.v1.worker.gpu.sample.states",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
)
OPTIONAL_MODULES = frozenset({"vllm.v1.watermarking.prfs.philox", "vllm.v1.worker.gpu.sample.watermark"})
"""Modules of :data:`MODULES` that older releases lack (0.28 and 0.29 have no watermarking; 0.30 no prfs)."""

VERIFY_PARAMS = ("logits", "draft_logits", "draft_sampled", "pos", "cu_num_logits", "idx_mapping", "idx_mapping_np",
                 "expanded_idx_mapping", "expanded_local_pos", "seq_lens_upper_bound_np", "verify_draft_sampled")
"""Every parameter of ``RejectionSampler._verify`` (after ``self``) in the releases read; the first nine are in all."""

METHODS = {"standard": "", "block": "-block", "synthetic": "-synthetic"}
"""V2's ``rejection_sample_method`` values this adapter sets (its speculative config), and each one's target name
suffix. ``synthetic`` accepts each draft with a fixed probability (:data:`SYNTHETIC_ACCEPTANCE`), whatever p and q: a
benchmarking mode, lossy by design."""
SYNTHETIC_ACCEPTANCE = 0.6
"""Conditional acceptance rate of every draft step under ``synthetic`` (unconditional rates 0.6, 0.36, ...)."""
FLY_DEFAULTS = {"fly_window_size": None, "fly_entropy_threshold": 0.3, "fly_entropy_top_k": 3}
"""0.33's speculative-config fields for FLy acceptance (its defaults: off), read by ``RejectionSampler.__init__``."""


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


def _no_processing(*args, **kwargs) -> None:
    return None


NO_PROCESSOR = SimpleNamespace(apply=_no_processing, apply_logit_bias=_no_processing,
                               apply_penalties=_no_processing, apply_bad_words=_no_processing)
"""Stand-in for the sampler's logit-bias, penalty, bad-words and thinking-budget states (0.28-0.30 call them by
these method names, 0.31+ keep a ``logits_processors`` list and a thinking budget with ``apply``): none in use."""


def _needs_processing(states, i: int) -> bool:
    """vLLM 0.28-0.30's ``Sampler.add_request`` rule, less the processors the CPU sampler lacks (later releases
    return it from ``SamplingStates.add_request``)."""
    t = states.temperature.np[i]
    return bool((t != 0.0 and t != 1.0) or states.min_p.np[i] != 0.0 or states.top_k.np[i] != states.vocab_size
                or states.top_p.np[i] != 1.0)


def _cpu_sampler(modules, num_reqs: int, vocab_size: int, params: list[SimpleNamespace]):
    """The V2 sampler's state and ``apply_sampling_params`` for ``params`` (one SamplingParams-like per
    request state), built on CPU."""
    sampler_cls = importlib.import_module("vllm.v1.worker.gpu.sample.sampler").Sampler
    states_cls = modules["vllm.v1.worker.gpu.sample.states"].SamplingStates
    states = cpu_sampling_states(states_cls, max(num_reqs, 1), vocab_size)
    needs = np.zeros(max(num_reqs, 1), dtype=bool)
    for i, p in enumerate(params):
        returned = states.add_request(i, p)  # None before 0.31, where the sampler decides
        needs[i] = _needs_processing(states, i) if returned is None else returned
    sampler = SimpleNamespace(
        sampling_states=states, needs_logits_processing=needs, logits_processors=[], use_fp64_gumbel=False,
        logit_bias_state=NO_PROCESSOR, penalties_state=NO_PROCESSOR, bad_words_state=NO_PROCESSOR,
        thinking_budget_state=NO_PROCESSOR, logprobs_mode="raw_logprobs", return_sampling_mask=False,
    )
    sampler.apply_sampling_params = types.MethodType(sampler_cls.apply_sampling_params, sampler)
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


def v2_verifier(modules, verify_fn=None, method: str = "standard") -> Verifier:
    """Our verifier signature over V2's ``RejectionSampler._verify`` under ``rejection_sample_method=method``
    (or ``verify_fn(self, ...)`` with ``_verify``'s parameters, e.g. the plugin's drop-in). vLLM's own path also
    carries ``draft_sampler`` (:func:`v2_draft_sampler`), which the narrow cases draw their drafts with."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    rs_cls = modules["vllm.v1.worker.gpu.spec_decode.rejection_sampler"].RejectionSampler
    params = tuple(inspect.signature(rs_cls._verify).parameters)[1:]

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None, min_p=None):
        num_reqs = cu_num_draft_tokens.numel() - 1
        vocab = target_logits.shape[-1]
        cu = cu_num_draft_tokens.to(torch.int64)
        position = torch.zeros(num_reqs, dtype=torch.int64) if position is None else position
        temperature = torch.zeros(num_reqs) if temperature is None else temperature
        params_of = [SimpleNamespace(
            temperature=float(temperature[b]), top_k=int(top_k[b]) if top_k is not None else 0,
            top_p=float(top_p[b]) if top_p is not None else 1.0, min_p=float(min_p[b]) if min_p is not None else 0.0,
            seed=int(seed[b]) if seed is not None else None, logprobs=None) for b in range(num_reqs)]
        sampler = _cpu_sampler(modules, num_reqs, vocab, params_of)
        x = v2_inputs(draft_token_ids, cu, position)
        steps = max(max(x.ks, default=0), 1)
        rates = [SYNTHETIC_ACCEPTANCE ** (i + 1) for i in range(steps)] if method == "synthetic" else None
        spec_config = SimpleNamespace(num_speculative_tokens=steps, enable_adaptive_verification=False,
                                      rejection_sample_method=method, synthetic_acceptance_rates=rates, **FLY_DEFAULTS)
        rs = rs_cls(sampler, spec_config, torch.device("cpu"))
        draft_logits = None
        if draft_probs is not None:
            draft_logits = torch.full((max(num_reqs, 1), steps, vocab), float("-inf"))
            scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
            for b, k in enumerate(x.ks):
                lo = int(cu[b])
                draft_logits[b, :k] = torch.log(draft_probs[lo:lo + k].float()) * scale[b]
        call = rs._verify if verify_fn is None else types.MethodType(verify_fn, rs)
        args = dict(logits=target_logits.float().contiguous(), draft_logits=draft_logits,
                    draft_sampled=x.verify_draft_sampled, pos=x.pos, cu_num_logits=x.cu_num_logits,
                    idx_mapping=x.idx_mapping, idx_mapping_np=x.idx_mapping_np,
                    expanded_idx_mapping=x.expanded_idx_mapping, expanded_local_pos=x.expanded_local_pos,
                    seq_lens_upper_bound_np=x.seq_lens_upper_bound_np, verify_draft_sampled=x.verify_draft_sampled)
        _, sampled, num_sampled = call(**{name: args[name] for name in params})
        return chain_result(sampled, num_sampled, x.ks)

    if verify_fn is None:
        verify.draft_sampler = v2_draft_sampler(modules)
    return verify


def v2_draft_sampler(modules):
    """V2's probabilistic draft proposal as ``Speculator.sample_draft`` makes it (module docstring), for one draft
    step: ``draft(draft_logits [N, V] float32, temperature [N], seed [N] int64, position [N] int64) -> [N] int64``,
    request n being request state n, ``position[n]`` the position of the row that verifies the draft.

    The speculator's ``logits_cache`` is not passed: the interpreter cannot run its masked store, and at draft
    step 0 it changes nothing drawn (it only stores the logits that verification reads, which the adapter hands
    ``_verify`` itself; 0.33 mixes the step into the seed, ``spec_step_seed(seed, 0) == seed``)."""
    gumbel = modules["vllm.v1.worker.gpu.sample.gumbel"]
    drafting = {"is_drafting": True} if "is_drafting" in inspect.signature(gumbel.gumbel_sample).parameters else {}

    def draft(draft_logits, temperature, seed, position):
        n = draft_logits.shape[0]
        return gumbel.gumbel_sample(
            draft_logits.float().contiguous(), torch.arange(n, dtype=torch.int32), temperature.float().contiguous(),
            seed.to(torch.int64).contiguous(), position.to(torch.int64).contiguous(), apply_temperature=True,
            use_fp64=False, **drafting)

    return draft


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


def v2_refusal() -> str | None:
    """Why V2's ``_verify`` cannot be audited here (vLLM missing, a CUDA machine, a ``_verify`` with parameters
    this adapter does not know), or None."""
    try:
        rs_cls = importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler").RejectionSampler
    except Exception as exc:  # vLLM missing, or an import failure of vLLM itself
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    if torch.cuda.is_available():
        return "on a CUDA machine audit V2 through its model runner; this adapter is the CPU-interpreted path"
    params = tuple(inspect.signature(rs_cls._verify).parameters)[1:]
    unknown = [p for p in params if p not in VERIFY_PARAMS]
    if unknown or params[:9] != VERIFY_PARAMS[:9]:
        return f"vLLM's V2 RejectionSampler._verify{params} is not a signature this adapter has read"
    return None


def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def v2_triton_target(method: str = "standard") -> AuditTarget:
    name = "vllm-v2-triton" + METHODS[method]
    description = (
        f"vLLM V2 model runner `RejectionSampler._verify` (rejection_sample_method={method!r}) with V2's "
        "`Sampler.apply_sampling_params` and `SamplingStates` methods and the Triton kernels of "
        "`rejection_sampler_utils.rejection_sample`, interpreted on CPU tensors (`TRITON_INTERPRET=1`); V2's "
        "pinned-memory state buffers are replaced by plain CPU tensors (the V2 runner itself needs CUDA). Per-request "
        "seeds are V2's own (seed, position) streams. The narrow cases' drafts are V2's own probabilistic draft "
        "proposals (`gumbel_sample(..., is_drafting=True)` as `Speculator.sample_draft` calls it), keyed by the "
        "request's seed and the position of the row that verifies them.")
    if method == "synthetic":
        description += (f" Synthetic acceptance accepts each draft with probability {SYNTHETIC_ACCEPTANCE} whatever "
                        "the target and draft laws: vLLM's benchmarking mode, lossy by design; its law cases are "
                        "expected to fail.")
    refusal = v2_refusal()
    if refusal is None:
        from .interpret import InterpreterUnavailable, interpreted_modules

        try:
            modules = interpreted_modules(tuple(m for m in MODULES if m not in OPTIONAL_MODULES or _present(m)))
        except InterpreterUnavailable as exc:
            refusal = str(exc)
    if refusal:
        return AuditTarget(name, description + MIN_P_NOTE, None, refusal=refusal)

    versions = {**vllm_versions(), "vllm_source": vllm_source()}
    plugin_refusal = vllm_refusal() if method == "standard" else "the plugin leaves this method to vLLM"
    if plugin_refusal is not None:
        description += f" Planted bugs do not run (they run through the plugin's V2 drop-in: {plugin_refusal})."
        mutants = {}
    else:
        description += (" Planted bugs run through the same objects with `_verify` replaced by the plugin's V2 "
                        "drop-in calling the mutant.")
        mutants = dict(mutant=lambda bug: v2_verifier(modules, _plugin_verify(mutant_verifier(bug))),
                       mutant_base=v2_verifier(modules, _plugin_verify(reference_verifier)))
    return AuditTarget(name, description + MIN_P_NOTE, v2_verifier(modules, method=method),
                       supports=frozenset({"min_p", "per_request_seed"}),
                       value_arguments=frozenset({"target_logits", "draft_token_ids", "temperature"}),
                       versions=versions, **mutants)


def _plugin_verify(verify: Verifier):
    def verify_v2(self, *args, **kwargs):
        with _verify_in_plugin(verify) as patched:
            return patched(self, *args, **kwargs)

    return verify_v2
