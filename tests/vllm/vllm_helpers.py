"""Builders for vLLM V1 rejection-sampler inputs (SpecDecodeMetadata, SamplingMetadata) on CPU.

The metadata builders live in the package (the audit's vLLM targets use them too)."""

from __future__ import annotations

import torch

from specdec_kernels.audit.vllm_inputs import sampling_metadata, spec_metadata

__all__ = ["onehot_logits", "sampling_metadata", "spec_metadata"]


def onehot_logits(rows: list[list[int]], vocab_size: int = 100, override: int | None = None) -> torch.Tensor:
    """Logits whose argmax is ``rows[b][j]`` on request b's j-th row (drafts, then bonus)."""
    flat = [token for request in rows for token in request]
    logits = torch.full((len(flat), vocab_size), -100.0)
    logits[torch.arange(len(flat)), torch.tensor(flat)] = 100.0
    if override is not None:
        logits[:, override] = 99.0
    return logits
