"""The ``transformers-assisted`` target: transformers' assisted generation end to end on tiny Llamas. Its law
is our reference transforms' law of the target's logits, its real path passes a law case, its negative controls
(a candidate generator returning a q it did not sample from, argmax candidates passed off as sampled, a planted
verification bug) are rejected at the committed report's sample sizes, every patch is undone, and a user error
is one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specdec_kernels.audit import AuditOptions
from specdec_kernels.audit.targets import resolve_target
from specdec_kernels.exactness.markov_models import SamplingConfig, all_sequences, step_probs
from tests.conftest import REPO

pytest.importorskip("transformers")
from specdec_kernels.audit import transformers_assisted as hfa  # noqa: E402

ALPHA = 4e-7  # the suite's per-test alpha


@pytest.mark.parametrize("cfg", [hfa.T1, hfa.T07K3, hfa.T13P08, SamplingConfig(0.5, top_k=2, top_p=0.7)],
                         ids=lambda c: c.label())
def test_law_is_the_reference_transforms_law_of_the_target_logits(cfg):
    """transformers' processors (what plain generate samples from) give our reference transforms' law: the law
    the audit tests against is not transformers' own say-so."""
    target = hfa.tiny_models()["target"]
    seqs = all_sequences(hfa.VOCAB, hfa.NEW_TOKENS)
    ours = torch.ones(seqs.shape[0], dtype=torch.float64)
    with torch.no_grad():
        for t in range(hfa.NEW_TOKENS):
            ids = torch.cat([torch.tensor(hfa.PROMPT).expand(seqs.shape[0], -1), seqs[:, :t]], dim=1)
            ours *= step_probs(target(ids).logits[:, -1].float(), cfg).double().gather(1, seqs[:, t:t + 1]).squeeze(1)
    law = hfa.sequence_law(cfg)
    assert abs(float(law.sum()) - 1) < 1e-5
    torch.testing.assert_close(law, ours, atol=1e-6, rtol=1e-4)


def test_models_share_a_vocabulary_and_the_close_assistant_is_close():
    models = hfa.tiny_models()
    prompt = torch.tensor([hfa.PROMPT])
    with torch.no_grad():
        p, close, far = (models[k](prompt).logits[0, -1].softmax(-1) for k in ("target", "close", "far"))
    assert p.shape == close.shape == far.shape == (hfa.VOCAB,)
    assert 0.5 * (p - close).abs().sum() < 0.5 * (p - far).abs().sum()


@pytest.mark.slow
def test_assisted_generation_passes_a_law_case_and_verifies_candidates():
    case = next(c for c in hfa.CASES if c.name == "hf-assisted-close-T1.3-p0.8")
    check, stats = hfa.check_case(case, ALPHA, 0.3, 0.999)
    assert not check.result.rejects(ALPHA), check.result
    assert stats.calls >= check.num_samples // 2 and 0 < stats.accepted < stats.candidates


@pytest.mark.slow
@pytest.mark.parametrize("name", ["candidates-raw-logits", "candidates-argmax"])
def test_candidate_generators_that_misreport_q_are_rejected(name):
    """Sized as the committed report's controls (--mutant-tv 0.1): the q-contract breaches must be caught."""
    case = next(c for c in hfa.CONTROLS if c.name == name)
    check, stats = hfa.check_case(case, ALPHA, 0.1, 0.999)
    assert check.result.rejects(ALPHA), check.result
    assert stats.calls > 0


def test_greedy_assisted_generation_is_the_targets_greedy():
    outcome = hfa._greedy_outcome("assisted-greedy-far")
    assert outcome.verdict == "pass", outcome.detail


def test_patches_are_undone_and_the_callers_generator_untouched():
    """A control case replaces the target's candidate generator, the assistant's threshold and
    ``_speculative_sampling``; afterwards every one is what it was, and torch's global generator too."""
    import transformers.generation.utils as utils

    models = hfa.tiny_models()
    original = utils._speculative_sampling
    threshold = models["close"].generation_config.assistant_confidence_threshold
    state = torch.random.get_rng_state()
    case = hfa.AssistedCase("planted", hfa.T1, "close", 99, confidence=0.0, candidates="raw-logits",
                            bug="ratio_inverted")
    tokens, stats = hfa.generate_sequences(case, 4)
    assert tokens.shape == (4, hfa.NEW_TOKENS) and (tokens >= 0).all() and stats.calls > 0
    assert utils._speculative_sampling is original
    assert "_get_candidate_generator" not in vars(models["target"])
    assert models["close"].generation_config.assistant_confidence_threshold == threshold
    assert torch.equal(torch.random.get_rng_state(), state)
    again, _ = hfa.generate_sequences(case, 4)
    assert torch.equal(tokens, again)  # seeded: a failure replays


def test_target_is_a_system_with_its_own_families():
    target = resolve_target("transformers-assisted")
    assert target.verify is not None and target.system is not None and target.versions["transformers"]
    names = {f: target.system.case_names(f) for f in target.system.families}
    assert names["sequence"][0] == "hf-plain-T1" and "candidates-raw-logits" in names["mutants"]
    threads = torch.get_num_threads()
    selected = list(target.system.run("greedy", AuditOptions(cases=("assisted-greedy-close",), exact=True)))
    assert [o.name for o in selected] == ["assisted-greedy-close"]
    assert torch.get_num_threads() == threads  # one thread while it runs, the caller's after


def test_refused_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "transformers.generation", None)
    monkeypatch.setitem(sys.modules, "transformers.generation.candidate_generator", None)
    refused = hfa.target()
    assert refused.verify is None and "transformers>=" in refused.refusal


def test_cli_refuses_families_the_system_has_no_cases_in(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdec_kernels.audit", "transformers-assisted", "--families",
                        "bad-input,narrow", "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--families" in r.stderr, r.stderr
