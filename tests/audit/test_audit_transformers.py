"""The transformers audit adapter: Hugging Face's ``_speculative_sampling`` itself (it runs on this CPU)
passes the audit's law cases through the adapter, the same adapter over a planted bug fails them, and a
missing or changed function is refused in one line."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from specdec_kernels.audit import AuditOptions, AuditTarget
from specdec_kernels.audit import transformers_target as hf
from specdec_kernels.audit.families import run_family
from specdec_kernels.audit.targets import reference_verifier, resolve_target
from specdec_kernels.exactness import chain_mutants

pytest.importorskip("transformers")


def _run(target, family, cases):
    return {o.name: o for o in run_family(target, family, AuditOptions(tv=0.25, cases=cases, exact=True))}


@pytest.mark.slow
def test_real_function_passes_the_law_cases():
    target = resolve_target("transformers")
    assert target.verify is not None and target.versions["transformers"]
    outcomes = {**_run(target, "first-token", ("first-deter-T1", "first-stoch-T0.7-topk3", "first-deter-greedy")),
                **_run(target, "sequence", ("seq-ngram-k3-T0.7-o1",))}
    assert len(outcomes) == 4
    assert all(o.verdict == "pass" for o in outcomes.values()), [o for o in outcomes.values() if o.verdict != "pass"]


def test_adapter_is_keyed_by_the_requests_seed_and_position():
    """One call per request, torch's generator seeded by that request's (seed, position): the same request
    gives the same tokens alone and in another batch, and the caller's global generator is untouched."""
    verify = resolve_target("transformers").verify
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 11, generator=g)
    drafts = torch.tensor([1, 4, 2, 7, 5, 0])
    cu = torch.tensor([0, 3, 6])
    q = torch.softmax(torch.randn(6, 11, generator=g), -1)
    seed, position = torch.tensor([5, 9]), torch.tensor([100, 7])
    state = torch.random.get_rng_state()
    both = verify(logits, drafts, cu, q, torch.ones(2), None, None, seed, position)
    assert torch.equal(torch.random.get_rng_state(), state)
    second = verify(logits[4:], drafts[3:], torch.tensor([0, 3]), q[3:], torch.ones(1), None, None, seed[1:],
                    position[1:])
    assert torch.equal(both.output_token_ids[1], second.output_token_ids[0])
    accepted = both.num_accepted
    assert ((both.output_token_ids >= 0).sum(1) == accepted + 1).all()


@pytest.mark.slow
@pytest.mark.parametrize("bug,family,case", [
    ("ratio_inverted", "first-token", "first-stoch-T1"),
    ("bonus_wrong_row", "sequence", "seq-self-k3-T0.7-k2-o2"),
])
def test_adapter_over_a_planted_bug_fails(bug, family, case):
    target = AuditTarget("hf-double", "adapter over the contract double",
                         hf.adapter(hf.contract_double(chain_mutants.mutant_verifier(bug))))
    assert _run(target, family, (case,))[case].verdict == "FAIL"


@pytest.mark.slow
def test_adapter_over_the_lossless_double_passes():
    target = AuditTarget("hf-double", "adapter over the contract double", hf.adapter(hf.contract_double(reference_verifier)))
    outcome = _run(target, "first-token", ("first-stoch-T1",))["first-stoch-T1"]
    assert outcome.verdict == "pass"


def test_missing_or_changed_function_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "transformers.generation", None)
    monkeypatch.setitem(sys.modules, "transformers.generation.utils", None)
    missing = hf.target()
    assert missing.verify is None and "transformers>=4.35" in missing.refusal
    changed = types.ModuleType("transformers.generation.utils")
    changed._speculative_sampling = lambda candidate_input_ids, candidate_logits, extra: None
    monkeypatch.setitem(sys.modules, "transformers.generation.utils", changed)
    refused = hf.target()
    assert refused.verify is None and "lacks parameters ['candidate_length', 'new_logits']" in refused.refusal
