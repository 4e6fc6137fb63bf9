"""Builders for vLLM V1 rejection-sampler inputs (SpecDecodeMetadata, SamplingMetadata) on CPU."""

from __future__ import annotations

import torch


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
):
    """SamplingMetadata as vLLM's input batch builds it (temperature None means all greedy)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    temps = None if temperature is None else torch.tensor(temperature, dtype=torch.float32)
    all_greedy = temps is None or bool((temps == 0).all())
    all_random = temps is not None and bool((temps > 0).all())
    no_penalties = frequency_penalties is None
    zeros = torch.zeros(num_reqs)
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
        logitsprocs=LogitsProcessors(),
        spec_token_ids=spec_token_ids,
    )


def onehot_logits(rows: list[list[int]], vocab_size: int = 100, override: int | None = None) -> torch.Tensor:
    """Logits whose argmax is ``rows[b][j]`` on request b's j-th row (drafts, then bonus)."""
    flat = [token for request in rows for token in request]
    logits = torch.full((len(flat), vocab_size), -100.0)
    logits[torch.arange(len(flat)), torch.tensor(flat)] = 100.0
    if override is not None:
        logits[:, override] = 99.0
    return logits
