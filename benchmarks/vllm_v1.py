"""vLLM V1's rejection sampler as a benchmark provider, on the same inputs as ours (shared by
``bench_chain`` and ``bench_native_cpu``).

Two entry points of vLLM (0.32, as read from its source) are timed:

- ``step``: ``RejectionSampler.forward`` on the ``[T + B, V]`` logits, exactly what a vLLM worker runs per
  speculative step: the bonus rows sampled by its ``Sampler``, the draft rows gathered, made float32 and
  copied (its logprobs bookkeeping), then ``rejection_sample``. Same inputs and same output as
  ``verify_chain``: the like-for-like baseline.
- ``kernel``: ``rejection_sample`` alone on the ``[T, V]`` draft rows, handed the bonus ids (so it reads a
  ``k / (k + 1)`` share of the logits and samples no bonus token): vLLM's verification kernel by itself,
  a lower bound of what vLLM can do.

On CPU, vLLM swaps its Triton kernels for C++ ones only when a CPU worker starts; ``load`` does that once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

_CPU_KERNELS_REGISTERED: list[bool] = []


def load():
    """vLLM's V1 sampler module objects (a namespace of the classes used here), its CPU kernel overrides
    registered. Raises ImportError when vLLM is missing or its layout differs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    if current_platform.is_cpu() and not _CPU_KERNELS_REGISTERED:
        current_platform.register_triton_kernel_overrides()
        _CPU_KERNELS_REGISTERED.append(True)

    class V1:
        pass

    v1 = V1()
    v1.RejectionSampler, v1.rejection_sample = rejection_sampler.RejectionSampler, rejection_sampler.rejection_sample
    v1.LogitsProcessors, v1.SamplingMetadata = LogitsProcessors, SamplingMetadata
    v1.Sampler, v1.SpecDecodeMetadata = Sampler, SpecDecodeMetadata
    return v1


def sampling_metadata(v1, temperature: torch.Tensor, top_k: torch.Tensor | None = None,
                      top_p: torch.Tensor | None = None):
    """vLLM's SamplingMetadata for a batch with these per-request temperatures (0 = greedy), no penalties,
    no logprobs, no logits processors."""
    b, device = temperature.shape[0], temperature.device
    greedy = bool((temperature == 0).all())
    return v1.SamplingMetadata(
        temperature=None if greedy else temperature, all_greedy=greedy, all_random=bool((temperature > 0).all()),
        top_p=top_p, top_k=top_k, generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(b, device=device), presence_penalties=torch.zeros(b, device=device),
        repetition_penalties=torch.ones(b, device=device), output_token_ids=[[] for _ in range(b)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=v1.LogitsProcessors(),
    )


def spec_metadata(v1, draft_token_ids: torch.Tensor, batch: int, k: int):
    """vLLM's SpecDecodeMetadata for ``batch`` requests of ``k`` drafts each, in our row layout (request b's
    draft rows, then its bonus row)."""
    device = draft_token_ids.device
    rows = torch.arange(batch * (k + 1), device=device).view(batch, k + 1)
    return v1.SpecDecodeMetadata(
        draft_token_ids=draft_token_ids.to(torch.int32),
        num_draft_tokens=[k] * batch,
        cu_num_draft_tokens=(torch.arange(1, batch + 1, device=device) * k).to(torch.int32),
        cu_num_sampled_tokens=(torch.arange(1, batch + 1, device=device) * (k + 1)).to(torch.int32),
        target_logits_indices=rows[:, :k].reshape(-1).to(torch.int32),
        bonus_logits_indices=rows[:, k].to(torch.int32),
        logits_indices=rows.reshape(-1).to(torch.int32),
    )


def step(v1, logits: torch.Tensor, draft_token_ids: torch.Tensor, draft_probs: torch.Tensor | None,
         batch: int, k: int, sampling) -> Callable[[], object]:
    """``RejectionSampler.forward`` on ``logits`` [batch * (k + 1), V] (bonus tokens sampled by vLLM)."""
    sampler = v1.RejectionSampler(v1.Sampler())
    metadata = spec_metadata(v1, draft_token_ids, batch, k)
    return lambda: sampler(metadata, draft_probs, logits, sampling)


def kernel(v1, logits: torch.Tensor, draft_token_ids: torch.Tensor, draft_probs: torch.Tensor | None,
           batch: int, k: int, sampling) -> Callable[[], object]:
    """``rejection_sample`` on the draft rows of ``logits`` alone, the bonus ids given (zeros)."""
    device = logits.device
    draft_rows = (torch.arange(batch, device=device)[:, None] * (k + 1) + torch.arange(k, device=device)).flatten()
    rows = logits[draft_rows].contiguous()
    drafts = draft_token_ids.to(torch.int32)
    bonus = torch.zeros(batch, 1, dtype=torch.int32, device=device)
    cu_end = (torch.arange(1, batch + 1, dtype=torch.int32, device=device) * k).contiguous()
    return lambda: v1.rejection_sample(drafts, [k] * batch, k, cu_end, draft_probs, rows, bonus, sampling)
