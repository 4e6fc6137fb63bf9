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

min-p and logit bias: vLLM builds these two logits processors only without speculative decoding (with it,
they are silently ignored). The patched ``build_logitsprocs`` builds them with speculation too, and
``forward`` applies them to every row the way vLLM's non-speculative sampler applies them to its one row:
logit bias before penalties on the draft rows (vLLM's own bonus-row path already applies it), and min-p on
the temperature-scaled draft and bonus rows, before our top-k / top-p. So speculative output has the law of
non-speculative vLLM with the same sampling parameters. Both processors keep per-request state indexed by
batch position, so they run once per draft step on a [B, V] block holding each request's row of that step.
Synthetic (0.32, 0.33) and FLy (0.33) acceptance are lossy by design and run vLLM's original forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...api import verify_chain
from . import runtime

GREEDY_EPS = 1e-5  # vLLM's Sampler treats temperature below this as greedy


def build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=()):
    """Drop-in for the V1 model runner's ``build_logitsprocs``: with speculative decoding (lossless
    acceptance, no custom processors), build vLLM's built-in processors as it does without speculation,
    min-p and logit bias included; otherwise vLLM's own function."""
    from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors

    spec = vllm_config.speculative_config
    method = getattr(spec, "rejection_sample_method", "standard")
    if spec is None or is_pooling_model or custom_logitsprocs or method in LOSSY_METHODS:
        return ORIGINAL_BUILD[0](vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
    return LogitsProcessors(ctor(vllm_config, device, is_pin_memory) for ctor in BUILTIN_LOGITS_PROCESSORS)


LOSSY_METHODS = ("synthetic", "fly")  # vLLM's lossy acceptance methods: vLLM's original code runs them


def validate_spec_decode(self, speculative_config) -> None:
    """Drop-in for ``SamplingParams._validate_spec_decode``: vLLM refuses min-p and logit bias under
    speculative decoding because its rejection sampler ignores them; the patched samplers honour them (V1
    through the processors :func:`build_logitsprocs` keeps, V2 through vLLM's own sampling states), so they
    pass, except with the lossy acceptance methods, which run vLLM's code and keep vLLM's refusal."""
    method = getattr(speculative_config, "rejection_sample_method", "standard")
    if speculative_config is None or method not in LOSSY_METHODS:
        return None
    return ORIGINAL_VALIDATE[0](self, speculative_config)


def step_rows(num_draft_tokens: list[int], device: torch.device, with_bonus: bool) -> list[tuple[torch.Tensor, ...]]:
    """Per draft step j: (rows [B], have [n_j], their rows [n_j]) indexing request b's row j in the layout
    [T + B, V] (``with_bonus``: each request's drafts then its bonus row) or [T, V] (drafts only). ``have``
    lists the batch positions of the requests that have a row j; the others point at row 0 and are not
    written back. Built on the host from vLLM's per-request draft counts (no device sync)."""
    extra = 1 if with_bonus else 0
    firsts, row = [], 0
    for k in num_draft_tokens:
        firsts.append(row)
        row += k + extra
    steps = []
    for j in range(max(num_draft_tokens, default=0) + extra):
        have = [b for b, k in enumerate(num_draft_tokens) if j < k + extra]
        rows = [firsts[b] + j if j < k + extra else 0 for b, k in enumerate(num_draft_tokens)]
        steps.append(tuple(torch.tensor(x, dtype=torch.int64, device=device)
                           for x in (rows, have, [firsts[b] + j for b in have])))
    return steps


def apply_per_step(logits: torch.Tensor, steps, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Run a per-request logits function on each step's [B, V] block of ``logits``, in place."""
    for rows, have, have_rows in steps:
        logits[have_rows] = fn(logits[rows].clone())[have]


def active(processor) -> bool:
    """False when a built-in processor holds no request's setting (host-side state: no sync), so the common
    batch without min-p or logit bias costs nothing."""
    if hasattr(processor, "min_p_count"):  # MinPLogitsProcessor
        return processor.min_p_count > 0
    if hasattr(processor, "biases"):  # LogitBiasLogitsProcessor
        return bool(processor.biases)
    return True


def apply_draft_processors(logits: torch.Tensor, sampling_metadata, num_draft_tokens: list[int]) -> None:
    """vLLM's non-argmax-invariant processors that its speculative path skips (logit bias: min-tokens is
    applied by vLLM with ``apply_with_spec_decode``) on the draft rows [T, V], in place."""
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

    processors = [p for p in sampling_metadata.logitsprocs.non_argmax_invariant
                  if not isinstance(p, MinTokensLogitsProcessor) and active(p)]
    if not processors:
        return
    steps = step_rows(num_draft_tokens, logits.device, with_bonus=False)
    for processor in processors:
        apply_per_step(logits, steps, processor.apply)


def apply_argmax_invariant(logits: torch.Tensor, sampling_metadata, num_draft_tokens: list[int]) -> None:
    """vLLM's argmax-invariant processors (min-p) on every row [T + B, V], in place, as its sampler runs them:
    on logits divided by the temperature (1 for greedy requests). They only mask (-inf), so the mask they set
    on the scaled row is copied onto our unscaled row; our kernel then scales, and applies top-k / top-p."""
    processors = [p for p in sampling_metadata.logitsprocs.argmax_invariant if active(p)]
    if not processors or sampling_metadata.all_greedy or sampling_metadata.temperature is None:
        return
    temperature = sampling_metadata.temperature.to(device=logits.device, dtype=torch.float32)
    temperature = torch.where(temperature < GREEDY_EPS, torch.ones_like(temperature), temperature)

    def mask(block: torch.Tensor) -> torch.Tensor:
        scaled = block / temperature[:, None]
        processed = scaled.clone()
        for processor in processors:
            processed = processor.apply(processed)
        banned = (processed == float("-inf")) & (scaled != float("-inf"))
        return block.masked_fill(banned, float("-inf"))

    apply_per_step(logits, step_rows(num_draft_tokens, logits.device, with_bonus=True), mask)


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


def draft_rows(metadata, device: torch.device) -> torch.Tensor:
    """[T] int64 rows of the draft tokens in our [T + B, V] layout (request b's drafts start at cu[b] + b)."""
    rows, start = [], 0
    for k in metadata.num_draft_tokens:
        rows.extend(range(start, start + k))
        start += k + 1
    return torch.tensor(rows, dtype=torch.int64, device=device)


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

    if self.synthetic_mode or getattr(self, "use_fly", False):
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
    num_draft_tokens = list(metadata.num_draft_tokens)
    target = raw_target.clone()
    if num_drafts:  # logit bias before vLLM's penalties, as its non-speculative sampler orders them
        apply_draft_processors(target, sampling_metadata, num_draft_tokens)
    target = self.apply_logits_processors(target, sampling_metadata, metadata)

    combined, cu = chain_inputs(metadata, target, bonus)
    apply_argmax_invariant(combined, sampling_metadata, num_draft_tokens)
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
            # vLLM reports processed logprobs after min-p, temperature, top-k and top-p: min-p as applied
            # above, the rest by vLLM's own transform.
            target = combined[draft_rows(metadata, device)]
            bonus = combined[cu[1:] + torch.arange(num_reqs, device=device)]
            target_lp = apply_sampling_constraints(target.clone(), metadata.cu_num_draft_tokens, sampling_metadata)
            ones = torch.arange(1, num_reqs + 1, dtype=metadata.cu_num_draft_tokens.dtype, device=device)
            bonus_lp = apply_sampling_constraints(bonus.clone(), ones, sampling_metadata)
        else:
            target_lp, bonus_lp = raw_target, raw_bonus
        logprobs_tensors = self._get_logprobs_tensors(
            sampling_metadata.max_num_logprobs, metadata, logits, target_lp, bonus_lp, output_token_ids
        )
    return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)


# The original forward, build_logitsprocs and _validate_spec_decode, set by ``plugin.apply`` (one-element
# lists so the replacements can call them).
ORIGINAL: list[Callable] = []
ORIGINAL_BUILD: list[Callable] = []
ORIGINAL_VALIDATE: list[Callable] = []
