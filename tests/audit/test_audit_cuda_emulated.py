"""The ``cuda-emulated`` audit target: our CUDA kernels through the CUDA host emulation, as the audit runs them.

A thin adapter (``specdec_kernels.audit.targets.cuda_emulated_target``): these tests show that it runs
the emulated kernels (launches recorded, the reference's tokens for the same seeds), that the audit's
families pass through it at a small sample size, that its planted bugs are caught, and that it refuses
clearly when the emulation is not built. The full-power run is the committed report
``results/audit/cuda-emulated.md``.
"""

from __future__ import annotations

import json

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.audit import AuditOptions, resolve_target
from specdec_kernels.audit.__main__ import main
from specdec_kernels.audit.families import run_family
from specdec_kernels.audit.targets import TargetError, cuda_emulated_target
from specdec_kernels.exactness import cuda_emulation
from specdec_kernels.exactness.chain_law import case_by_name, sample_first_tokens

needs_emulation = pytest.mark.skipif(not cuda_emulation.available(),
                                     reason="CUDA host emulation not built (setup.py build_ext)")


def _one(target, family: str, name: str, tv: float = 0.25):
    outcomes = list(run_family(target, family, AuditOptions(tv=tv, mutant_tv=tv, cases=(name,), exact=True)))
    assert len(outcomes) == 1
    return outcomes[0]


@needs_emulation
def test_target_runs_the_emulated_kernels_and_emits_the_references_tokens():
    target = resolve_target("cuda-emulated")
    assert target.verify is not None and target.supports == frozenset({"per_request_seed", "validation", "method"})
    case = case_by_name("first-stoch-T1-topk3")
    got = sample_first_tokens(target.verify, case, 48)
    launches = cuda_emulation.last_launches()
    assert launches and all(launch.threads > 0 for launch in launches)
    ref = sample_first_tokens(lambda *a: sk.verify_chain(*a, backend="reference"), case, 48)
    assert torch.equal(got, ref)
    assert target.versions["schedule"] == "random" and "h200" in target.versions["emulated_device"]


@needs_emulation
@pytest.mark.parametrize("family,name", [
    ("first-token", "first-stoch-T1"),
    ("first-token", "first-deter-greedy"),
    ("sequence", "seq-ngram-k3-T1-o1"),
    ("greedy", "greedy-stoch-in-mixed-batch"),
    ("batch", "alone-vs-batch-deter"),
    ("bad-input", "temperature: negative"),
])
def test_audit_families_pass_through_the_adapter(family, name):
    outcome = _one(resolve_target("cuda-emulated"), family, name)
    assert outcome.verdict == "pass", outcome


@needs_emulation
def test_planted_bug_is_caught_on_this_target():
    assert _one(resolve_target("cuda-emulated"), "mutants", "ratio_inverted").verdict == "caught"


@needs_emulation
def test_method_and_arch_reach_the_emulation():
    target = resolve_target("cuda-emulated", "block")
    assert "method='block'" in target.description
    assert target.verify.keywords["method"] == "block"
    b200 = cuda_emulated_target(arch="b200")
    assert b200.verify.keywords["arch"] == cuda_emulation.ARCHS["b200"] and "b200" in b200.versions["emulated_device"]
    with pytest.raises(ValueError, match="arch"):
        cuda_emulated_target(arch="a100")
    with pytest.raises(TargetError, match="our own backends"):
        resolve_target("vllm-v1-cpu", "block")


def test_refuses_clearly_without_the_emulation(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cuda_emulation, "available", lambda: False)
    target = resolve_target("cuda-emulated")
    assert target.verify is None and "not built" in target.refusal
    assert main(["cuda-emulated", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot run here" in err[0]
    assert json.loads((tmp_path / "cuda-emulated.json").read_text())["verdict"] == "REFUSED"
