"""Replacement for the V2 model runner's ``RejectionSampler._verify``
(``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``, vLLM 0.32's CUDA default).

vLLM's contract, as read from its source (``_verify`` and ``rejection_sampler_utils.rejection_sample``):

- ``logits`` [L, V] with ``cu_num_logits`` [B + 1]: request b owns rows ``cu[b] ... cu[b+1] - 1``, one per draft
  token and a last (bonus) row, which is exactly our row layout with ``cu_draft = cu_num_logits - b``.
- ``verify_draft_sampled`` [L]: the input token of each row; the draft verified at row r is entry r + 1
  (-1 = placeholder). ``pos`` [L]: absolute position of each row's input token.
- ``idx_mapping`` [B] / ``expanded_idx_mapping`` [L]: persistent request-state index of each request / row;
  ``expanded_local_pos`` [L]: the row's index within its request (its draft step).
- ``draft_logits`` [max_num_reqs, num_speculative_steps, V'] or None: *pre-temperature* draft logits by
  request state and step, so q = softmax(draft_logits / temperature).
- ``sampler.apply_sampling_params`` turns logits into the target's final logits (penalties, logit bias,
  bad words, temperature, min-p, top-k, top-p), which vLLM keeps doing. Greedy requests have temperature 0.
- ``sampler.sampling_states.seeds`` [max_num_reqs] int64: a per-request seed (random when unset).
- Output: ``(processed_logits, sampled [B, num_speculative_steps + 1] int64, num_sampled [B] int32)`` where
  ``num_sampled`` = accepted drafts + 1 and entries past it are ignored.

The decisions are ours (``verify_chain`` with temperature 1 on the already-processed logits, Philox key =
the request's vLLM seed, position = the absolute position of its first row, so every position is decided
once per seed). Synthetic acceptance, block verification, watermarking and 0.33's FLy acceptance run vLLM's
original code.

Limitation: this path needs vLLM's CUDA model runner, so on CPU it is tested by calling
:func:`verify_v2` directly with tensors built to this contract.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...api import verify_chain
from . import runtime


def verify_v2(
    processed_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    verify_draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    num_speculative_steps: int,
    backend: str | None = None,
    method: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one V2 chunk with ``verify_chain``; returns (sampled [B, S + 1] int64 -1 padded, num_sampled [B] int32).

    Shapes as in the module docstring; ``temperature`` and ``seeds`` are indexed by request state;
    ``method`` defaults to ``SPECDEC_VLLM_METHOD`` (``runtime.chain_method``).
    """
    device = processed_logits.device
    num_logits, vocab_size = processed_logits.shape
    cu = cu_num_logits.to(device=device, dtype=torch.int64)
    num_reqs = cu.numel() - 1
    num_drafts = num_logits - num_reqs
    req_state = idx_mapping.to(device=device, dtype=torch.int64)
    cu_draft = cu - torch.arange(num_reqs + 1, device=device)

    # Draft rows (every row but each request's last), in order, without a host sync.
    is_bonus = torch.zeros(num_logits, dtype=torch.int8, device=device)
    is_bonus[cu[1:] - 1] = 1
    draft_rows = torch.sort(is_bonus, stable=True).indices[:num_drafts]
    draft_ids = verify_draft_sampled.to(torch.int64)[draft_rows + 1] if num_drafts else draft_rows

    temp = temperature.to(device=device, dtype=torch.float32)[req_state]
    greedy = temp == 0
    # The processed logits already carry temperature / top-k / top-p: sample them at temperature 1.
    chain_temperature = torch.where(greedy, torch.zeros_like(temp), torch.ones_like(temp))

    q = None
    if draft_logits is not None:
        row_state = expanded_idx_mapping.to(device=device, dtype=torch.int64)[draft_rows]
        row_step = expanded_local_pos.to(device=device, dtype=torch.int64)[draft_rows]
        draft_rows_logits = draft_logits[row_state, row_step, :vocab_size].float()
        row_temp = temperature.to(device=device, dtype=torch.float32)[row_state]
        row_temp = torch.where(row_temp == 0, torch.ones_like(row_temp), row_temp)
        q = torch.softmax(draft_rows_logits / row_temp[:, None], dim=-1)
        if q.shape[1] < vocab_size:
            q = torch.nn.functional.pad(q, (0, vocab_size - q.shape[1]))
        q = q * (draft_ids >= 0).to(q.dtype)[:, None]  # a placeholder proposes nothing

    seed = seeds.to(device=device, dtype=torch.int64)[req_state]
    position = pos.to(device=device, dtype=torch.int64)[cu[:-1]]
    backend = backend or runtime.backend_for(device)
    result = verify_chain(
        processed_logits, draft_ids, cu_draft, q, chain_temperature, None, None, seed, position,
        backend=backend, method=method or runtime.chain_method(), max_draft_len=num_speculative_steps,
        validate=False,
    )
    runtime.trace("v2", backend, num_reqs, num_drafts, result.num_accepted)
    return result.output_token_ids.to(torch.int64), (result.num_accepted + 1).to(torch.int32)


def _verify(
    self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
    expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled,
):
    """Drop-in for the V2 ``RejectionSampler._verify``: same arguments, same outputs."""
    if (self.synthetic_conditional_rates is not None or self.use_block_verification
            or self.watermark_key is not None or getattr(self, "fly_window_size", 0)):
        return ORIGINAL[0](
            self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
            expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled,
        )
    processed_logits = self.sampler.apply_sampling_params(
        logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, draft_sampled, expanded_local_pos,
        seq_lens_upper_bound_np,
    )
    states = self.sampler.sampling_states
    sampled, num_sampled = verify_v2(
        processed_logits, draft_logits, verify_draft_sampled, cu_num_logits, pos, idx_mapping,
        expanded_idx_mapping, expanded_local_pos, states.temperature.gpu, states.seeds.gpu,
        self.num_speculative_steps,
    )
    return processed_logits, sampled, num_sampled


# The original _verify, set by ``plugin.apply``.
ORIGINAL: list[Callable] = []
