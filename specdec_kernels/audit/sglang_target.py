"""Audit target ``sglang``: ``sgl_kernel.tree_speculative_sampling_target_only`` (CUDA only), on chains.

SGLang's documented contract (``sgl-kernel/python/sgl_kernel/speculative.py`` and its callers in
``sglang/srt/speculative/eagle_info.py``): ``tree_speculative_sampling_target_only(predicts [B * N] int32
(out), accept_index [B, S + 1] int32 (out), accept_token_num [B] int32 (out), candidates [B, N] int64,
retrive_index [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N], uniform_samples [B, N]
float32, uniform_samples_for_final_sampling [B] float32, target_probs [B, N, V], [draft_probs [B, N, V]
in releases that take it, zeros], threshold_single=1.0, threshold_acc=1.0, deterministic=True)``. Node 0 of a
request is the root (the last emitted token); ``target_probs[b, j]`` is the law of the token after node j;
the emitted tokens are ``predicts[accept_index[b, i]]`` for i = 0 .. accept_token_num[b]. Thresholds 1.0 are
the lossless setting (lower values accept more, by design lossy).

A chain of k drafts is the tree root -> d1 -> ... -> dk (N = k + 1, no siblings). Target-only verification
ignores q, and is lossless for any drafter, so stochastic drafts are passed without their q. Translation of
probabilities, placeholders and grouping as for FlashInfer (:mod:`.peer_common`); the coins are drawn from
one generator per call (SGLang draws them with torch.rand). Planted bugs run through the same adapter with
the kernel replaced by :func:`contract_double` over the mutant (chains only).
"""

from __future__ import annotations

import importlib
import inspect

import torch

from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import Verifier
from .audit_target import AuditTarget, reference_verifier
from .peer_common import check_parameters, group_chains

__all__ = ["tree_adapter", "contract_double", "target", "PARAMETERS", "chain_tree"]

PARAMETERS = ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
              "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
              "draft_probs", "threshold_single", "threshold_acc", "deterministic")
REQUIRED = PARAMETERS[:10]


def chain_tree(num_reqs: int, k: int, device) -> dict[str, torch.Tensor]:
    """SGLang's retrieve arrays for ``num_reqs`` chains of ``k`` drafts (N = k + 1 nodes each)."""
    n = k + 1
    local = torch.arange(n, device=device)
    next_token = torch.where(local < k, local + 1, -1).expand(num_reqs, n).contiguous()
    return {
        "retrive_index": (torch.arange(num_reqs, device=device)[:, None] * n + local[None, :]).contiguous(),
        "retrive_next_token": next_token,
        "retrive_next_sibling": torch.full((num_reqs, n), -1, dtype=torch.int64, device=device),
    }


def tree_adapter(tree_fn, device: torch.device | str = "cuda") -> Verifier:
    """Our verifier signature over a function with ``tree_speculative_sampling_target_only``'s contract."""
    device = torch.device(device)
    takes_draft_probs = "draft_probs" in inspect.signature(tree_fn).parameters

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None):
        batch = group_chains(target_logits, draft_token_ids, cu_num_draft_tokens, temperature, top_k, top_p, seed,
                             position)
        cu, probs = batch.cu, batch.probs
        for k, members in batch.groups:
            g, n = len(members), k + 1
            candidates = torch.zeros((g, n), dtype=torch.int64)
            for row, b in enumerate(members):
                candidates[row, 1:] = draft_token_ids[int(cu[b]):int(cu[b]) + k]
            target = torch.stack([probs[int(cu[b]) + b:int(cu[b]) + b + n] for b in members]).to(device)
            generator = batch.generator(members, device)
            coins = torch.rand((g, n), generator=generator, device=device)
            final_coins = torch.rand((g,), generator=generator, device=device)
            predicts = torch.full((g * n,), -1, dtype=torch.int32, device=device)
            accept_index = torch.full((g, n), -1, dtype=torch.int32, device=device)
            accept_num = torch.zeros(g, dtype=torch.int32, device=device)
            extra = {"draft_probs": torch.zeros_like(target)} if takes_draft_probs else {}
            tree_fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                    candidates=candidates.to(device), uniform_samples=coins,
                    uniform_samples_for_final_sampling=final_coins, target_probs=target,
                    threshold_single=1.0, threshold_acc=1.0, deterministic=True,
                    **chain_tree(g, k, device), **extra)
            predicts, accept_index, accept_num = predicts.cpu(), accept_index.cpu(), accept_num.cpu()
            for row, b in enumerate(members):
                m = int(accept_num[row])
                batch.out[b, : m + 1] = predicts[accept_index[row, : m + 1].long()]
                batch.accepted[b] = m
        return batch.result()

    return verify


def contract_double(verify: Verifier):
    """A function with the target-only tree contract, for chain-shaped trees, computed by ``verify``: the
    unit-test double for the adapter and the host of the planted bugs (coins seed its Philox key)."""

    def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                              retrive_next_token, retrive_next_sibling, uniform_samples,
                                              uniform_samples_for_final_sampling, target_probs, draft_probs=None,
                                              threshold_single=1.0, threshold_acc=1.0, deterministic=True):
        if (retrive_next_sibling != -1).any():
            raise ValueError("contract_double handles chains only (no siblings)")
        b, n, v = target_probs.shape
        k = n - 1
        logits = torch.log(target_probs.float()).reshape(b * n, v).cpu()
        key = (uniform_samples_for_final_sampling.double().cpu() * 2**52).to(torch.int64)
        res = verify(logits, candidates[:, 1:].reshape(-1).long().cpu(), torch.arange(b + 1) * k, None,
                     torch.ones(b), None, None, key, torch.zeros(b, dtype=torch.int64))
        for row in range(b):
            m = int(res.num_accepted[row])
            nodes = retrive_index[row, : m + 1].to(torch.int64)
            accept_index[row, : m + 1] = nodes.to(accept_index.dtype)
            predicts[nodes] = res.output_token_ids[row, : m + 1].to(predicts.dtype).to(predicts.device)
            accept_token_num[row] = m

    return tree_speculative_sampling_target_only


DESCRIPTION = (
    "SGLang `sgl_kernel.tree_speculative_sampling_target_only` on CUDA tensors, each chain as a tree without "
    "siblings, thresholds 1.0 (lossless setting); target probabilities from our reference temperature / "
    "top-k / top-p (one-hot argmax for greedy), chains cut at the first placeholder and grouped by length, "
    "coins from one generator per call. Planted bugs run through the same adapter with the kernel replaced by "
    "a double of its documented contract.")


def target() -> AuditTarget:
    try:
        sgl_kernel = importlib.import_module("sgl_kernel")
    except ImportError as exc:
        return AuditTarget("sglang", DESCRIPTION, None,
                           refusal=f"sgl_kernel is not installed ({exc}); it needs a CUDA GPU and `pip install sgl-kernel`")
    fn = getattr(sgl_kernel, "tree_speculative_sampling_target_only", None)
    if fn is None:
        return AuditTarget("sglang", DESCRIPTION, None, refusal="sgl_kernel has no tree_speculative_sampling_target_only")
    problem = check_parameters(fn, PARAMETERS, REQUIRED, "sgl_kernel.tree_speculative_sampling_target_only")
    if problem:
        return AuditTarget("sglang", DESCRIPTION, None, refusal=problem)
    if not torch.cuda.is_available():
        return AuditTarget("sglang", DESCRIPTION, None,
                           refusal="sgl_kernel's tree_speculative_sampling_target_only runs on CUDA tensors only; "
                           "no CUDA GPU here")

    def mutant(bug: str) -> Verifier:
        return tree_adapter(contract_double(mutant_verifier(bug)))

    base = tree_adapter(contract_double(reference_verifier))

    return AuditTarget("sglang", DESCRIPTION, tree_adapter(fn), mutant=mutant, mutant_base=base,
                       versions={"sgl_kernel": getattr(sgl_kernel, "__version__", "unknown")})
