"""Audit target ``transformers``: Hugging Face transformers' ``_speculative_sampling`` (assisted generation).

The function (``transformers/generation/utils.py``) verifies one sequence's candidates:
``_speculative_sampling(candidate_input_ids [1, L + n], candidate_logits [1, n, V], candidate_length n,
new_logits [1, n + 1, V])`` takes softmax of both logits, accepts candidate i while ``torch.rand <= p_i /
q_i``, samples the next token from ``norm(max(0, p - q))`` at the first rejection (from p after n matches)
with ``torch.multinomial``, and returns ``(valid_tokens [1, m + 1], m)``. ``generate`` calls it only with
``do_sample=True`` and at least one candidate, after its logits processors (temperature, top-k, top-p) have
run on both models' logits.

Translation: one call per request. ``new_logits`` is the log of the request's target law from our reference
transforms (:func:`.peer_common.row_target_probs`: one-hot argmax for greedy requests), ``candidate_logits``
the log of the draft law (``draft_probs``; deterministic drafts as one-hot q, the lossless reduction), the
chain cut at its first placeholder. A request with no candidate is one ``torch.multinomial`` draw from p, as
``generate`` samples without candidates. The function draws from torch's global generator: each call runs
inside ``torch.random.fork_rng`` seeded by the request's (seed, position), so a request's tokens depend on
its own inputs only. Planted bugs run through the same adapter with the function replaced by a double of its
contract over the mutant.
"""

from __future__ import annotations

import importlib

import torch

from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import Verifier
from .audit_target import AuditTarget, reference_verifier
from .peer_common import check_parameters, group_chains, group_seed

__all__ = ["adapter", "contract_double", "target", "PARAMETERS"]

PARAMETERS = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits",
              "assistant_ensemble_weight")
REQUIRED = PARAMETERS[:4]
MIN_VERSION = "4.35"  # the first release with generation.utils._speculative_sampling's four-argument form


def adapter(speculative_sampling) -> Verifier:
    """Our verifier signature over a function with ``_speculative_sampling``'s contract."""

    def verify(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs=None, temperature=None,
               top_k=None, top_p=None, seed=None, position=None):
        vocab = target_logits.shape[-1]
        batch = group_chains(target_logits, draft_token_ids, cu_num_draft_tokens, temperature, top_k, top_p, seed,
                             position)
        for n, members in batch.groups:
            for b in members:
                first = int(batch.cu[b])
                rows = batch.probs[first + b:first + b + n + 1]
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(group_seed(batch.seed, batch.position, [b]))
                    if n == 0:  # no candidate: generate samples the next token from p alone
                        batch.out[b, 0] = int(torch.multinomial(rows[0], 1))
                        continue
                    drafts = draft_token_ids[first:first + n].long()
                    q = (torch.nn.functional.one_hot(drafts, vocab).float() if draft_probs is None
                         else draft_probs[first:first + n].float())
                    context = torch.cat([torch.zeros(1, dtype=torch.long), drafts])[None]  # one prompt token
                    tokens, matches = speculative_sampling(context, torch.log(q)[None], n, torch.log(rows)[None])
                m = int(matches)
                batch.out[b, :m + 1] = tokens[0, :m + 1].to(torch.int32)
                batch.accepted[b] = m
        return batch.result()

    return verify


def contract_double(verify: Verifier):
    """A function with ``_speculative_sampling``'s contract computed by ``verify`` (our signature): the unit
    test double for the adapter, and the host of the planted bugs. Its Philox key comes from torch's global
    generator, which the adapter seeds per request."""

    def speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                             assistant_ensemble_weight=None):
        n = candidate_length
        drafts = candidate_input_ids[0, -n:].long()
        key = torch.randint(0, 2**62, (1,))
        res = verify(new_logits[0].float(), drafts, torch.tensor([0, n]), candidate_logits[0].float().softmax(-1),
                     torch.ones(1), None, None, key, torch.zeros(1, dtype=torch.int64))
        m = int(res.num_accepted[0])
        return res.output_token_ids[:, :m + 1].long(), torch.tensor(m)

    return speculative_sampling


DESCRIPTION = (
    "Hugging Face transformers `generation.utils._speculative_sampling` (assisted generation's verification, "
    "one sequence per call); target and draft laws from our reference transforms as log-probabilities, "
    "deterministic drafts as one-hot q, chains cut at the first placeholder, a request without candidates "
    "sampled from p; torch's global generator seeded per request inside fork_rng. Planted bugs run through "
    "the same adapter with the function replaced by a double of its contract.")


def target() -> AuditTarget:
    try:
        utils = importlib.import_module("transformers.generation.utils")
    except ImportError as exc:
        return AuditTarget("transformers", DESCRIPTION, None,
                           refusal=f"transformers is not installed ({exc}); it needs transformers>={MIN_VERSION}")
    fn = getattr(utils, "_speculative_sampling", None)
    if fn is None:
        return AuditTarget("transformers", DESCRIPTION, None,
                           refusal=f"transformers.generation.utils has no _speculative_sampling; it needs "
                                   f"transformers>={MIN_VERSION}")
    problem = check_parameters(fn, PARAMETERS, REQUIRED, "transformers.generation.utils._speculative_sampling")
    if problem:
        return AuditTarget("transformers", DESCRIPTION, None, refusal=problem)
    version = importlib.import_module("transformers").__version__

    def mutant(bug: str) -> Verifier:
        return adapter(contract_double(mutant_verifier(bug)))

    return AuditTarget("transformers", DESCRIPTION, adapter(fn), supports=frozenset({"per_request_seed"}),
                       mutant=mutant, mutant_base=adapter(contract_double(reference_verifier)),
                       versions={"transformers": version})
