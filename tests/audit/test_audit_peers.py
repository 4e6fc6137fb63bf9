"""FlashInfer and SGLang audit adapters, tested on CPU against doubles of their documented contracts.

No GPU here: the real kernels cannot run, so each adapter is run over ``contract_double(verifier)`` (a
function with the peer's documented signature, computed by one of our verifiers): over the reference it must
pass the audit's cases, over a planted bug it must fail them, and the real targets must refuse clearly.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.audit import AuditOptions, AuditTarget
from specdec_kernels.audit import flashinfer_target as fi
from specdec_kernels.audit import sglang_target as sg
from specdec_kernels.audit.families import run_family
from specdec_kernels.audit.peer_common import effective_lengths, group_chains, row_target_probs
from specdec_kernels.audit.targets import reference_verifier
from specdec_kernels.exactness import chain_mutants

QUICK = AuditOptions(tv=0.25, mutant_tv=0.25)


def reference(*args, **kwargs):
    return sk.verify_chain(*args, backend="reference", **kwargs)


def _adapted(peer: str, verify) -> AuditTarget:
    if peer == "flashinfer":
        return AuditTarget("fi-double", "adapter over the contract double", fi.chain_adapter(
            fi.contract_double(verify), "cpu"))
    return AuditTarget("sg-double", "adapter over the contract double", sg.tree_adapter(sg.contract_double(verify), "cpu"))


def _run(target, family, cases):
    return {o.name: o for o in run_family(target, family, AuditOptions(tv=0.25, cases=cases, exact=True))}


@pytest.mark.parametrize("peer", ["flashinfer", "sglang"])
def test_adapter_over_a_lossless_double_passes(peer):
    target = _adapted(peer, reference)
    law = _run(target, "first-token", ("first-deter-T1", "first-stoch-T0.7-topk3", "first-deter-greedy"))
    greedy = _run(target, "greedy", ("greedy-deter-all-greedy", "greedy-deter-in-mixed-batch"))
    seq = _run(target, "sequence", ("seq-ngram-k3-T0.7-o1",))
    outcomes = {**law, **greedy, **seq}
    assert len(outcomes) == 6
    assert all(o.verdict == "pass" for o in outcomes.values()), [o for o in outcomes.values() if o.verdict != "pass"]


@pytest.mark.parametrize("peer,bug,family,case", [
    ("flashinfer", "ratio_inverted", "first-token", "first-stoch-T1"),
    ("flashinfer", "bonus_wrong_row", "sequence", "seq-self-k3-T0.7-k2-o2"),
    ("sglang", "bonus_wrong_row", "sequence", "seq-self-k3-T0.7-k2-o2"),
])
def test_adapter_over_a_planted_bug_fails(peer, bug, family, case):
    outcome = _run(_adapted(peer, chain_mutants.mutant_verifier(bug)), family, (case,))[case]
    assert outcome.verdict == "FAIL", outcome


def test_target_only_adapter_reports_stochastic_bugs_inert():
    """SGLang's verification ignores q: a bug in how q is used cannot act through that adapter."""
    target = AuditTarget("sg", "double", sg.tree_adapter(sg.contract_double(reference), "cpu"),
                         mutant=lambda bug: sg.tree_adapter(sg.contract_double(chain_mutants.mutant_verifier(bug)), "cpu"),
                         mutant_base=sg.tree_adapter(sg.contract_double(reference_verifier), "cpu"))
    outcome = list(run_family(target, "mutants", AuditOptions(mutant_tv=0.25, cases=("ratio_inverted",))))[0]
    assert outcome.verdict == "inert"


def test_chain_tree_layout():
    tree = sg.chain_tree(2, 2, "cpu")
    assert tree["retrive_index"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert tree["retrive_next_token"].tolist() == [[1, 2, -1], [1, 2, -1]]
    assert (tree["retrive_next_sibling"] == -1).all()


def test_chains_are_cut_at_the_first_placeholder():
    drafts = torch.tensor([3, -1, 2, 1, 9, 0])
    cu = torch.tensor([0, 3, 3, 6])
    assert effective_lengths(drafts, cu, vocab_size=5) == [1, 0, 1]


def test_group_chains_groups_by_cut_length_and_pads_the_outputs():
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 2, 2, 4, 5])
    drafts = torch.tensor([1, 2, 0, -1, 3])  # chain lengths after the cut: 2, 0, 1, 1
    logits = torch.randn(int(cu[-1]) + 4, 5, generator=g)
    seed = torch.tensor([3, 4, 5, 6])
    batch = group_chains(logits, drafts, cu, torch.ones(4), None, None, seed, None)
    assert batch.groups == [(0, [1]), (1, [2, 3]), (2, [0])]
    assert batch.out.shape == (4, 3) and (batch.out == -1).all() and (batch.accepted == 0).all()
    assert batch.position.tolist() == [0, 0, 0, 0] and batch.cu.dtype == torch.int64
    torch.testing.assert_close(batch.probs, row_target_probs(logits, cu, torch.ones(4), None, None))
    a, b = (batch.generator([2, 3], torch.device("cpu")) for _ in range(2))
    assert torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=b))
    other = batch.generator([0], torch.device("cpu"))
    assert not torch.equal(torch.rand(3, generator=other), torch.rand(3, generator=batch.generator([2, 3], "cpu")))


def test_row_target_probs_greedy_is_onehot_and_sampled_rows_are_the_reference_law():
    logits = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, 2, 3])
    probs = row_target_probs(logits, cu, torch.tensor([0.0, 0.7]), None, torch.tensor([1.0, 0.8]))
    assert torch.equal(probs[:3], torch.nn.functional.one_hot(logits[:3].argmax(-1), 7).float())
    expected = sk.reference.sampling.target_probs(logits[3:], torch.full((2,), 0.7), None, torch.full((2,), 0.8))
    torch.testing.assert_close(probs[3:], expected)


@pytest.mark.parametrize("module,attr,build", [
    ("flashinfer.sampling", "chain_speculative_sampling", fi.target),
    ("sgl_kernel", "tree_speculative_sampling_target_only", sg.target),
])
def test_real_targets_refuse_clearly(monkeypatch, module, attr, build):
    top = module.split(".")[0]
    monkeypatch.setitem(sys.modules, top, None)  # not installed
    missing = build()
    assert missing.verify is None and "not installed" in missing.refusal
    fake_top = types.ModuleType(top)
    fake = fake_top if module == top else types.ModuleType(module)
    params = fi.PARAMETERS if top == "flashinfer" else sg.PARAMETERS
    exec(f"def {attr}({', '.join(params)}): pass", fake.__dict__)  # the documented signature
    monkeypatch.setitem(sys.modules, top, fake_top)
    monkeypatch.setitem(sys.modules, module, fake)
    if fake is not fake_top:
        fake_top.sampling = fake
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA" in build().refusal
    exec(f"def {attr}(x, y): pass", fake.__dict__)  # a changed contract
    changed = build().refusal
    assert "lacks parameters" in changed
