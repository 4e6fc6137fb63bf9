"""vLLM V1 rejection-sampler inputs built on CPU as vLLM's input batch builds them (vLLM 0.32's contracts).

``spec_metadata`` lays logits out as our row layout (per request: its draft rows, then its bonus row);
``sampling_metadata`` mirrors ``vllm/v1/worker/gpu_input_batch.py``'s SamplingMetadata (temperature None
when all greedy, top-k / top-p None when unused, per-request generators for seeded requests, min-p as
vLLM's own ``MinPLogitsProcessor`` fed through its ``update_state`` protocol). Shared by the audit's vLLM
targets and the vLLM tests (``tests/vllm/vllm_helpers.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

__all__ = ["spec_metadata", "sampling_metadata", "min_p_processor", "request_generators"]

KEY_MULTIPLIER = 0x9E3779B97F4A7C15


def spec_metadata(spec_tokens: list[list[int]]):
    """SpecDecodeMetadata whose logits layout is, per request, its draft rows then its bonus row."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    metadata = SpecDecodeMetadata.make_dummy(spec_tokens, device=torch.device("cpu"))
    target, bonus, row = [], [], 0
    for tokens in spec_tokens:
        target += range(row, row + len(tokens))
        row += len(tokens)
        bonus.append(row)
        row += 1
    metadata.target_logits_indices = torch.tensor(target, dtype=torch.int32)
    metadata.bonus_logits_indices = torch.tensor(bonus, dtype=torch.int32)
    metadata.logits_indices = torch.arange(row, dtype=torch.int32)
    return metadata


def min_p_processor(min_p: list[float]):
    """vLLM's ``MinPLogitsProcessor`` holding ``min_p[b]`` for request b, set through ``update_state``."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max(len(min_p), 1)))
    processor = MinPLogitsProcessor(config, torch.device("cpu"), False)
    added = [(i, SimpleNamespace(min_p=float(m)), None, []) for i, m in enumerate(min_p)]
    processor.update_state(BatchUpdate(batch_size=len(min_p), removed=[], added=added, moved=[]))
    return processor


def request_generators(seed: torch.Tensor, position: torch.Tensor) -> dict[int, torch.Generator]:
    """One torch.Generator per request, seeded from (seed, position): seeded requests in vLLM's sense, so a
    request's randomness is its own and every call replays."""
    out = {}
    for i, (s, p) in enumerate(zip(seed.tolist(), position.tolist(), strict=True)):
        out[i] = torch.Generator().manual_seed((s * KEY_MULTIPLIER + p) % (1 << 63))
    return out


def sampling_metadata(
    num_reqs: int,
    temperature: list[float] | None = None,
    top_k: list[int] | None = None,
    top_p: list[float] | None = None,
    generators: dict | None = None,
    max_num_logprobs: int | None = None,
    output_token_ids: list[list[int]] | None = None,
    spec_token_ids: list[list[int]] | None = None,
    prompt_token_ids: torch.Tensor | None = None,
    frequency_penalties: list[float] | None = None,
    bad_words_token_ids: dict | None = None,
    allowed_token_ids_mask: torch.Tensor | None = None,
    min_p: list[float] | None = None,
):
    """SamplingMetadata as vLLM's input batch builds it (temperature None means all greedy)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    temps = None if temperature is None else torch.tensor(temperature, dtype=torch.float32)
    all_greedy = temps is None or bool((temps == 0).all())
    all_random = temps is not None and bool((temps > 0).all())
    no_penalties = frequency_penalties is None
    zeros = torch.zeros(num_reqs)
    processors = [min_p_processor(min_p)] if min_p is not None and any(m > 0 for m in min_p) else []
    return SamplingMetadata(
        temperature=None if all_greedy else temps,
        all_greedy=all_greedy,
        all_random=all_random,
        top_p=None if top_p is None else torch.tensor(top_p, dtype=torch.float32),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32),
        generators=generators or {},
        max_num_logprobs=max_num_logprobs,
        no_penalties=no_penalties,
        prompt_token_ids=prompt_token_ids,
        frequency_penalties=zeros if no_penalties else torch.tensor(frequency_penalties),
        presence_penalties=zeros,
        repetition_penalties=torch.ones(num_reqs),
        output_token_ids=output_token_ids if output_token_ids is not None else [[] for _ in range(num_reqs)],
        allowed_token_ids_mask=allowed_token_ids_mask,
        bad_words_token_ids=bad_words_token_ids or {},
        logitsprocs=LogitsProcessors(processors),
        spec_token_ids=spec_token_ids,
    )
