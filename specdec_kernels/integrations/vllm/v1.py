"""Replacement for vLLM's V1 ``RejectionSampler.forward`` (``vllm/v1/sample/rejection_sampler.py``).

vLLM's contract (0.32), as read from its source:

- ``logits`` [T + B, V]: target rows of the T draft tokens (``metadata.target_logits_indices``, request-major)
  and one bonus row per request (``metadata.bonus_logits_indices``). ``metadata.cu_num_draft_tokens`` [B] is
  the *inclusive* cumulative draft count, ``metadata.draft_token_ids`` [T] may hold -1 placeholders, and
  ``draft_probs`` [T, V] is given for probabilistic drafters only (None for ngram and greedy drafters).
- ``sampling_metadata``: ``temperature`` [B] (None when all greedy; 0 marks greedy requests), ``top_k`` [B]
  (V when disabled) and ``top_p`` [B] (1 when disabled) or None, ``generators`` {request index:
  torch.Generator} for seeded requests, logits-processor and penalty state, ``max_num_logprobs``.
- Output: ``SamplerOutput(sampled_token_ids [B, max_spec_len + 1] int32, -1 padded, logprobs_tensors)``,
  which ``RejectionSampler.parse_output`` turns into token lists.

What stays vLLM's: penalties, bad words, allowed token ids, min-tokens and the thinking budget are applied
by vLLM's own methods (``Sampler.apply_logits_processors`` for bonus rows, ``RejectionSampler.
apply_logits_processors`` for draft rows, in vLLM's order), logprobs come from vLLM's
``_get_logprobs_tensors``, and the synthetic (lossy) acceptance mode runs vLLM's original forward.

What is ours: temperature, top-k, top-p and every accept / recover / bonus decision, by
``specdec_kernels.verify_chain`` with stateless Philox randomness. Each request's Philox key is one int64
drawn per step from its generator (seeded requests: reproducible) or from torch's default generator.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...api import verify_chain
from . import runtime

GREEDY_EPS = 1e-5  # vLLM's Sampler treats temperature below this as greedy


def chain_inputs(
    metadata, logits_processed_target: torch.Tensor, logits_processed_bonus: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleave processed target rows [T, V] and bonus rows [B, V] into our layout [T + B, V].

    Request b owns our rows ``cu[b] + b ... cu[b+1] + b`` (drafts, then its bonus row). Returns the logits
    and ``cu_num_draft_tokens`` [B + 1] (int64, leading 0).
    """
    device = logits_processed_target.device
    cu_incl = metadata.cu_num_draft_tokens.to(device=device, dtype=torch.int64)
    num_reqs = cu_incl.numel()
    num_drafts = logits_processed_target.shape[0]
    cu = torch.cat([cu_incl.new_zeros(1), cu_incl])
    counts = cu[1:] - cu[:-1]
    req_of_draft = torch.repeat_interleave(torch.arange(num_reqs, device=device), counts, output_size=num_drafts)
    target_rows = torch.arange(num_drafts, device=device) + req_of_draft
    bonus_rows = cu_incl + torch.arange(num_reqs, device=device)
    combined = logits_processed_target.new_empty((num_drafts + num_reqs, logits_processed_target.shape[1]))
    combined[target_rows] = logits_processed_target
    combined[bonus_rows] = logits_processed_bonus
    return combined, cu


def sampling_inputs(sampling_metadata, num_reqs: int, device: torch.device):
    """Map vLLM's SamplingMetadata onto verify_chain's temperature / top_k / top_p / seed / position.

    temperature 0 (or below vLLM's greedy epsilon) is greedy; top_k == V and top_p == 1 are vLLM's
    "disabled" values, which are ours too. Seeded requests draw their key from their own generator.
    """
    if sampling_metadata.all_greedy or sampling_metadata.temperature is None:
        temperature = torch.zeros(num_reqs, dtype=torch.float32, device=device)
    else:
        temperature = sampling_metadata.temperature.to(device=device, dtype=torch.float32)
        temperature = torch.where(temperature < GREEDY_EPS, torch.zeros_like(temperature), temperature)
    top_k = sampling_metadata.top_k
    if top_k is not None:
        top_k = top_k.to(device=device, dtype=torch.int64).clamp(min=0)
    top_p = sampling_metadata.top_p
    if top_p is not None:
        top_p = top_p.to(device=device, dtype=torch.float32)
    seed = runtime.fresh_keys(num_reqs, device)
    for index, generator in sorted(sampling_metadata.generators.items()):
        if index < num_reqs:
            seed[index : index + 1] = runtime.key_from_generator(generator, device)
    # A fresh key every step: position 0 names the first draft row of *this* step.
    position = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    return temperature, top_k, top_p, seed, position


def draft_probs_for(draft_probs: torch.Tensor | None, draft_token_ids: torch.Tensor, vocab_size: int):
    """Draft probabilities [T, V] float32 with placeholder rows zeroed (a placeholder proposes nothing, so
    its recovery samples the target itself), padded or cut to the target vocabulary."""
    if draft_probs is None:
        return None
    q = draft_probs.float()
    if q.shape[1] < vocab_size:
        q = torch.nn.functional.pad(q, (0, vocab_size - q.shape[1]))
    elif q.shape[1] > vocab_size:
        q = q[:, :vocab_size]
    return q * (draft_token_ids >= 0).to(q.dtype)[:, None]


def forward(self, metadata, draft_probs, logits, sampling_metadata):
    """Drop-in for ``RejectionSampler.forward``: same arguments, same ``SamplerOutput``."""
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

    if self.synthetic_mode:
        return ORIGINAL[0](self, metadata, draft_probs, logits, sampling_metadata)

    device = logits.device
    num_reqs = len(metadata.num_draft_tokens)
    num_drafts = metadata.draft_token_ids.numel()
    vocab_size = logits.shape[1]

    # Bonus rows first, exactly as vLLM's bonus sampler processes them (this also advances the
    # thinking-budget state before the draft rows read it, in vLLM's order).
    raw_bonus = logits[metadata.bonus_logits_indices].to(torch.float32)
    bonus = self.sampler.apply_logits_processors(raw_bonus.clone(), sampling_metadata, True)
    raw_target = logits[metadata.target_logits_indices].to(torch.float32)
    target = self.apply_logits_processors(raw_target.clone(), sampling_metadata, metadata)

    combined, cu = chain_inputs(metadata, target, bonus)
    temperature, top_k, top_p, seed, position = sampling_inputs(sampling_metadata, num_reqs, device)
    draft_ids = metadata.draft_token_ids.to(torch.int64)
    backend = runtime.backend_for(device)
    result = verify_chain(
        combined, draft_ids, cu, draft_probs_for(draft_probs, draft_ids, vocab_size),
        temperature, top_k, top_p, seed, position,
        backend=backend, method=runtime.chain_method(), max_draft_len=metadata.max_spec_len, validate=False,
    )
    output_token_ids = result.output_token_ids
    runtime.trace("v1", backend, num_reqs, num_drafts, result.num_accepted)

    logprobs_tensors = None
    if sampling_metadata.max_num_logprobs is not None:
        if self.is_processed_logprobs_mode:
            # vLLM reports processed logprobs after temperature / top-k / top-p; use its own transform.
            target_lp = apply_sampling_constraints(target.clone(), metadata.cu_num_draft_tokens, sampling_metadata)
            ones = torch.arange(1, num_reqs + 1, dtype=metadata.cu_num_draft_tokens.dtype, device=device)
            bonus_lp = apply_sampling_constraints(bonus.clone(), ones, sampling_metadata)
        else:
            target_lp, bonus_lp = raw_target, raw_bonus
        logprobs_tensors = self._get_logprobs_tensors(
            sampling_metadata.max_num_logprobs, metadata, logits, target_lp, bonus_lp, output_token_ids
        )
    return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)


# The original forward, set by ``plugin.apply`` (a one-element list so the replacement can call it).
ORIGINAL: list[Callable] = []
