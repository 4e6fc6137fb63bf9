"""Audit target ``flashinfer``: ``flashinfer.sampling.chain_speculative_sampling`` (CUDA only).

FlashInfer's documented contract (``flashinfer/sampling.py``): ``chain_speculative_sampling(draft_probs
[B, n, V], draft_token_ids [B, n] int32, target_probs [B, n + 1, V], maybe_output_accepted_token_num=None,
maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None, seed=None, offset=None)``
returns ``output_token_ids [B, n + 1]`` (-1 after the emitted tokens) — in recent releases as a tuple with
``output_accepted_token_num`` and ``output_emitted_draft_token_num [B]`` (emitted drafts, bonus excluded).
Older releases return the tensor alone and fill the ``maybe_output_*`` tensors; both are read.

Translation (:mod:`.peer_common`): target probabilities from our reference transforms; deterministic drafts
become one-hot q (accept with probability p(x), residual p without x: the lossless reduction); chains cut at
their first placeholder and grouped by length, one call per group with one ``torch.Generator`` per call
(FlashInfer has no per-request seed, so replay / batch invariance do not apply). Planted bugs run through the
same adapter with FlashInfer's function replaced by :func:`contract_double` over the mutant.
"""

from __future__ import annotations

import importlib

import torch

from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import Verifier
from .audit_target import AuditTarget, reference_verifier
from .peer_common import check_parameters, group_chains

__all__ = ["chain_adapter", "contract_double", "target", "target_for", "PARAMETERS"]

PARAMETERS = ("draft_probs", "draft_token_ids", "target_probs", "maybe_output_accepted_token_num",
              "maybe_output_emitted_draft_token_num", "deterministic", "generator", "seed", "offset")
REQUIRED = ("draft_probs", "draft_token_ids", "target_probs", "maybe_output_emitted_draft_token_num")


def chain_adapter(chain_speculative_sampling, device: torch.device | str = "cuda") -> Verifier:
    """Our verifier signature over a function with FlashInfer's ``chain_speculative_sampling`` contract."""
    device = torch.device(device)

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None):
        vocab = target_logits.shape[-1]
        batch = group_chains(target_logits, draft_token_ids, cu_num_draft_tokens, temperature, top_k, top_p, seed,
                             position)
        cu, probs = batch.cu, batch.probs
        for n, members in batch.groups:
            drafts = torch.stack([draft_token_ids[int(cu[b]):int(cu[b]) + n] for b in members]).to(torch.int32)
            target = torch.stack([probs[int(cu[b]) + b:int(cu[b]) + b + n + 1] for b in members])
            if draft_probs is None:
                q = torch.nn.functional.one_hot(drafts.long(), vocab).float()
            else:
                q = torch.stack([draft_probs[int(cu[b]):int(cu[b]) + n].float() for b in members])
            generator = batch.generator(members, device)
            emitted = torch.zeros(len(members), dtype=torch.int32, device=device)
            result = chain_speculative_sampling(
                q.to(device), drafts.to(device), target.to(device),
                maybe_output_accepted_token_num=torch.zeros_like(emitted),
                maybe_output_emitted_draft_token_num=emitted, deterministic=True, generator=generator)
            tokens = result[0] if isinstance(result, tuple) else result
            if isinstance(result, tuple) and len(result) == 3:
                emitted = result[2]
            idx = torch.tensor(members)
            batch.out[idx, : n + 1] = tokens.cpu().to(torch.int32)
            batch.accepted[idx] = emitted.cpu().to(torch.int32)
        return batch.result()

    return verify


def contract_double(verify: Verifier):
    """A function with ``chain_speculative_sampling``'s contract computed by ``verify`` (our signature): the
    unit-test double for the adapter, and the host of the planted bugs. One request per batch row; its Philox
    key comes from ``generator``."""

    def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
                                   maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None,
                                   seed=None, offset=None):
        b, n, v = draft_probs.shape
        logits = torch.log(target_probs.float()).reshape(b * (n + 1), v)
        key = torch.randint(0, 2**62, (b,), generator=generator, device=draft_probs.device)
        res = verify(logits.cpu(), draft_token_ids.reshape(-1).long().cpu(), (torch.arange(b + 1) * n),
                     draft_probs.reshape(b * n, v).float().cpu(), torch.ones(b), None, None, key.cpu(),
                     torch.zeros(b, dtype=torch.int64))
        out = res.output_token_ids.to(torch.int32).to(draft_probs.device)
        emitted = res.num_accepted.to(torch.int32).to(draft_probs.device)
        for buffer in (maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num):
            if buffer is not None:
                buffer.add_(emitted)
        return out, emitted.clone(), emitted.clone()

    return chain_speculative_sampling


DESCRIPTION = (
    "FlashInfer `flashinfer.sampling.chain_speculative_sampling` on CUDA tensors; target probabilities from "
    "our reference temperature / top-k / top-p (one-hot argmax for greedy), deterministic drafts as one-hot "
    "q, chains cut at the first placeholder and grouped by length; one generator per call. Planted bugs run "
    "through the same adapter with the kernel replaced by a double of its documented contract.")


def target() -> AuditTarget:
    try:
        sampling = importlib.import_module("flashinfer.sampling")
    except ImportError as exc:
        return AuditTarget("flashinfer", DESCRIPTION, None,
                           refusal=f"FlashInfer is not installed ({exc}); it needs a CUDA GPU and `pip install flashinfer-python`")
    fn = getattr(sampling, "chain_speculative_sampling", None)
    if fn is None:
        return AuditTarget("flashinfer", DESCRIPTION, None,
                           refusal="flashinfer.sampling has no chain_speculative_sampling")
    problem = check_parameters(fn, PARAMETERS, REQUIRED, "flashinfer.sampling.chain_speculative_sampling")
    if problem:
        return AuditTarget("flashinfer", DESCRIPTION, None, refusal=problem)
    if not torch.cuda.is_available():
        return AuditTarget("flashinfer", DESCRIPTION, None,
                           refusal="FlashInfer's chain_speculative_sampling runs on CUDA tensors only; no CUDA GPU here")
    version = getattr(importlib.import_module("flashinfer"), "__version__", "unknown")
    return target_for(fn, version, "flashinfer.sampling.chain_speculative_sampling")


def target_for(fn, version: str, where: str, name: str = "flashinfer", description: str = DESCRIPTION) -> AuditTarget:
    """The audit target over ``fn``, a function with ``chain_speculative_sampling``'s contract (FlashInfer's
    own, or the benchmark's extension over FlashInfer's headers); refused when its signature differs."""
    problem = check_parameters(fn, PARAMETERS, REQUIRED, where)
    if problem:
        return AuditTarget(name, description, None, refusal=problem)

    def mutant(bug: str) -> Verifier:
        return chain_adapter(contract_double(mutant_verifier(bug)))

    base = chain_adapter(contract_double(reference_verifier))

    return AuditTarget(name, description, chain_adapter(fn), mutant=mutant, mutant_base=base,
                       versions={"flashinfer": version})
