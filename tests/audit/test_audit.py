"""The audit tool (specdec_kernels/audit): its verdicts can fail, its reports hold every case, its
command line refuses bad input in one line.

Small by design: law cases run at a large total-variation target (hundreds of samples, not tens of
thousands); the full-power runs are the committed reports under results/audit/.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.audit import (
    AuditOptions,
    AuditTarget,
    pytest_plugin,
    resolve_target,
    run_audit,
    write_report,
)
from specdec_kernels.audit.__main__ import build_parser, main
from specdec_kernels.audit.cases import GRID_FIRST_TOKEN_CASES, LAW_CASES, uses_min_p
from specdec_kernels.audit.families import FAMILIES, case_names, greedy_expected, run_family
from specdec_kernels.audit.pytest_plugin import ENTRY_POINT
from specdec_kernels.audit.targets import TargetError, reference_verifier
from specdec_kernels.exactness import chain_mutants
from specdec_kernels.exactness import goodness_of_fit as gof
from specdec_kernels.exactness.chain_law import first_token_law

QUICK = AuditOptions(tv=0.25, mutant_tv=0.25)
pytest_plugins = ["pytester"]


def reference(*args, **kwargs):
    return sk.verify_chain(*args, backend="reference", **kwargs)


reference.audit_supports = ("per_request_seed", "validation")


def ratio_inverted(*args, **kwargs):
    """A lossy verifier (accepts with min(1, q/p))."""
    return chain_mutants.mutant_verifier("ratio_inverted")(*args, **kwargs)


def recovery_reuses_coin(*args, **kwargs):
    """A lossy verifier that only the narrow design sees (recovery = inverse CDF of the residual at the coin)."""
    return chain_mutants.mutant_verifier("recovery_reuses_coin")(*args, **kwargs)


def greedy_sampled(*args, **kwargs):
    return chain_mutants.mutant_verifier("greedy_sampled")(*args, **kwargs)


def unseeded(*args, **kwargs):
    """Lossless, but draws its keys from torch's generator: not batch invariant, not replayable."""
    args = list(args)
    args[7] = torch.randint(0, 2**40, args[7].shape)
    return sk.verify_chain(*args, backend="reference", **kwargs)


unseeded.audit_supports = ("per_request_seed",)


def no_checks(*args, **kwargs):
    """Lossless on valid input, never validates."""
    return sk.verify_chain(*args, backend="reference", validate=False, **kwargs)


no_checks.audit_supports = ("validation",)


def _target(name: str) -> AuditTarget:
    return resolve_target(f"tests.audit.test_audit:{name}")


def _one(target, family, name, opts=QUICK):
    outcomes = list(run_family(target, family, AuditOptions(tv=opts.tv, mutant_tv=opts.mutant_tv, cases=(name,),
                                                            exact=True)))
    assert len(outcomes) == 1
    return outcomes[0]


def test_case_tables_are_complete_and_distinct():
    names = [c.name for c in LAW_CASES]
    assert len(names) == len(set(names))
    for family in FAMILIES:
        assert len(case_names(family)) == len(set(case_names(family))) > 0
    temps = {c.cfg.temperature for c in LAW_CASES}
    assert {0.0, 0.7, 1.0} <= temps
    assert any(c.cfg.top_k for c in LAW_CASES) and any(c.cfg.top_p < 1 for c in LAW_CASES)
    assert sum(uses_min_p(c) for c in LAW_CASES) >= 4


@pytest.mark.parametrize("case", [c for c in GRID_FIRST_TOKEN_CASES if uses_min_p(c)], ids=lambda c: c.name)
def test_min_p_cases_remove_tokens(case):
    """Each min-p case truncates (else a verifier ignoring min-p could not fail it)."""
    law = first_token_law(case)
    plain = first_token_law(type(case)(case.name, case.vocab_size, type(case.cfg)(case.cfg.temperature),
                                       case.drafts, case.seed))
    assert (law == 0).sum() > (plain == 0).sum()
    assert gof.total_variation(law, plain) > 0.02


def test_lossless_verifier_passes_and_report_holds_every_case(tmp_path):
    target = _target("reference")
    report = run_audit(target, ("first-token", "greedy", "batch"), AuditOptions(
        tv=0.25, cases=("first-stoch-T1", "first-deter-greedy", "greedy-deter", "replay-stoch")),
        command="python -m specdec_kernels.audit tests.audit.test_audit:reference")
    assert report.verdict() == "PASS", [o for o in report.outcomes if o.verdict != "pass"]
    md, js = write_report(report, tmp_path)
    data = json.loads(js.read_text())
    assert data["environment"]["device"] and data["environment"]["commit"]  # the machine and the commit
    law = [o for o in data["outcomes"] if o["family"] == "first-token" and o["verdict"] == "pass"]
    assert law and all(o["alpha"] == pytest.approx(4e-7) and o["pvalue"] >= o["alpha"] for o in law)  # a pass
    ran = {o.name: o for o in report.outcomes}  # the file holds the figures the run computed
    assert all((o["num_samples"], o["pvalue"]) == (ran[o["name"]].num_samples, ran[o["name"]].pvalue) for o in law)
    assert all(o["num_samples"] > 0 for o in law)  # a pass on no samples would be vacuous
    assert data["level"]["family_wise_bound"] == pytest.approx(data["level"]["num_statistical_tests"] * 4e-7)
    text = md.read_text()
    assert "python -m specdec_kernels.audit tests.audit.test_audit:reference" in text
    assert all(o["name"] in text for o in data["outcomes"])


def test_lossy_verifier_is_rejected_with_the_cells_that_show_it():
    outcome = _one(_target("ratio_inverted"), "first-token", "first-stoch-T1")
    assert outcome.verdict == "FAIL" and outcome.pvalue < 4e-7
    assert outcome.cells and all({"cell", "observed", "expected"} <= set(c) for c in outcome.cells)


def test_min_p_cases_are_not_applicable_without_min_p():
    assert _one(_target("reference"), "first-token", "first-stoch-T1-minp0.2").verdict == "n/a"


def test_greedy_identity_catches_sampled_greedy_requests():
    assert _one(_target("greedy_sampled"), "greedy", "greedy-deter-all-greedy").verdict == "FAIL"
    assert _one(_target("reference"), "greedy", "greedy-stoch-in-mixed-batch").verdict == "pass"


def test_greedy_expected_rule():
    logits = torch.tensor([[0.0, 2.0], [3.0, 0.0], [0.0, 1.0], [5.0, 0.0], [0.0, 1.0]])  # argmax 1 0 1 | 0 1
    drafts = torch.tensor([1, 1, 0])
    cu = torch.tensor([0, 2, 3])
    assert greedy_expected(logits, drafts, cu) == [[1, 0], [0, 1]]


def test_batch_invariance_catches_a_global_generator():
    assert _one(_target("unseeded"), "batch", "replay-stoch").verdict == "FAIL"
    assert _one(_target("unseeded"), "batch", "alone-vs-batch-deter").verdict == "FAIL"
    assert _one(_target("ratio_inverted"), "batch", "replay-deter").verdict == "n/a"


def test_bad_input_table_passes_ours_and_catches_a_silent_verifier():
    ours = list(run_family(_target("reference"), "bad-input", QUICK))
    assert ours and all(o.verdict == "pass" for o in ours), [o for o in ours if o.verdict != "pass"]
    silent = {o.name: o for o in run_family(_target("no_checks"), "bad-input", QUICK)}
    assert silent["temperature: negative"].verdict == "FAIL"
    assert "accepted silently" in silent["temperature: negative"].detail
    assert silent["target_logits: float64"].verdict == "pass"  # dtype checks stay on with validate=False


def test_mutants_run_through_the_target_and_are_caught():
    target = _target("reference")
    outcome = _one(target, "mutants", "bonus_wrong_row")
    assert outcome.verdict == "caught" and outcome.family == "mutants"
    blind = AuditTarget("blind", "a target whose mutant path ignores the bug", target.verify,
                        mutant=lambda bug: target.verify)
    assert _one(blind, "mutants", "greedy_sampled").verdict == "MISSED"
    # With the unmutated twin given, a bug that changes no token on the path is reported inert, not missed.
    twin = AuditTarget("twin", "mutant path = reference", target.verify, mutant=lambda bug: reference_verifier,
                       mutant_base=reference_verifier)
    assert _one(twin, "mutants", "greedy_sampled").verdict == "inert"
    # Adapters that call verify_chain unvalidated (the vLLM drop-ins) pass validate= to the twin as well.
    unvalidated = lambda *a, **kw: reference_verifier(*a, validate=False, **kw)  # noqa: E731
    quiet = AuditTarget("quiet-twin", "the twin called as the vLLM drop-ins call verify_chain", target.verify,
                        mutant=lambda bug: unvalidated, mutant_base=unvalidated)
    assert _one(quiet, "mutants", "greedy_sampled").verdict == "inert"
    # A twin that cannot run leaves the bug missed, and the report says why.
    broken = AuditTarget("broken-twin", "the twin raises", target.verify, mutant=lambda bug: reference_verifier,
                         mutant_base=lambda *a, **kw: 1 / 0)
    missed = _one(broken, "mutants", "greedy_sampled")
    assert missed.verdict == "MISSED" and "did not run" in missed.detail


def test_refused_target_writes_a_report_and_exit_code_2(tmp_path, capsys):
    assert main(["sglang", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot run here" in err[0]
    assert json.loads((tmp_path / "sglang.json").read_text())["verdict"] == "REFUSED"


@pytest.mark.parametrize("argv,message", [
    (["nope"], "unknown target"),
    (["no.such.module:fn"], "cannot import"),
    (["tests.audit.test_audit:missing"], "has no attribute"),
    (["tests.audit.test_audit:QUICK"], "not a verifier"),
    (["reference", "--tv", "2"], "--tv must be in (0, 1)"),
    (["reference", "--families", "first-token,laws"], "--families"),
    (["vllm-v1-cpu", "--method", "block"], "--method block applies to our own backends only"),
    (["reference", "--families", "narow"], "--families: unknown ['narow']"),
    (["reference", "--families", "narrow", "--narrow-trials", "0"], "--narrow-trials must be in [1, 10,000,000]"),
    (["reference", "--narrow-trials", "200k"], "argument --narrow-trials: invalid int value: '200k'"),
    (["reference", "--narrow-trials"], "argument --narrow-trials: expected one argument"),
])
def test_bad_arguments_give_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def test_command_line_end_to_end(tmp_path, capsys):
    """One command, one report: exit 1 for a lossy verifier, and the command is written in the report."""
    argv = ["tests.audit.test_audit:ratio_inverted", "--families", "first-token", "--cases", "first-stoch-T1",
            "--tv", "0.25", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 1
    assert "LOSSY" in capsys.readouterr().err
    data = json.loads((tmp_path / "tests.audit.test_audit_ratio_inverted.json").read_text())
    assert data["verdict"] == "LOSSY" and data["command"].endswith(" ".join(argv))


def test_help_lists_the_options():
    text = build_parser().format_help()
    assert all(opt in text for opt in ("--families", "--cases", "--tv", "--mutant-tv", "--method", "--out",
                                       "--narrow-trials"))
    assert "narrow" in text


@pytest.mark.slow
def test_narrow_family_passes_ours_and_rejects_a_shared_uniform(tmp_path, capsys):
    """``--families narrow``: the V = 16 reversed-ranking cases pass the reference (exit 0) and reject a verifier
    whose recovery reuses the acceptance coin (exit 1, LOSSY), at the trial count given on the command line."""
    argv = ["--families", "narrow", "--narrow-trials", "12000", "--quiet"]
    assert main(["reference", *argv, "--out", str(tmp_path / "ours")]) == 0
    ours = json.loads((tmp_path / "ours" / "reference.json").read_text())
    assert [o["name"] for o in ours["outcomes"]] == case_names("narrow")
    assert all(o["verdict"] == "pass" and o["num_samples"] == 12000 for o in ours["outcomes"])
    assert ours["level"]["narrow_trials"] == 12000
    assert "narrow cases run at 12,000 trials" in (tmp_path / "ours" / "reference.md").read_text()
    assert main(["tests.audit.test_audit:recovery_reuses_coin", *argv, "--out", str(tmp_path / "lossy")]) == 1
    assert "LOSSY" in capsys.readouterr().err
    lossy = json.loads((tmp_path / "lossy" / "tests.audit.test_audit_recovery_reuses_coin.json").read_text())
    stoch = next(o for o in lossy["outcomes"] if "stoch" in o["name"])
    assert stoch["verdict"] == "FAIL" and stoch["cells"][0]["cell"].startswith(("rejected", "accepted"))


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["shared_stream", "recovery_reuses_coin", "bonus_on_recovery_stream"])
def test_shared_stream_mutants_are_caught_through_the_target(bug):
    """Through our reference target's mutant path (the shared-stream bug's in-system drafter included), at the
    narrow design's own sample size."""
    outcome = _one(resolve_target("reference"), "mutants", bug, AuditOptions())
    assert outcome.verdict == "caught" and outcome.detail.startswith("case narrow-"), outcome


def _plugin_args() -> list[str]:
    """``-p`` for the audit plugin unless an installed specdec-kernels already loads it (pytest11; an install
    that predates the plugin's module path names another module and does not)."""
    installed = any(ep.name == ENTRY_POINT and ep.value == pytest_plugin.__name__
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", pytest_plugin.__name__]


def test_pytest_entry_point(tmp_path, pytester):
    """pytest --pyargs specdec_kernels.audit --verifier TARGET: one test per case, report on request."""
    result = pytester.runpytest_inprocess(
        "-q", "-p", "no:cacheprovider", *_plugin_args(), "--pyargs",
        "specdec_kernels.audit", "--verifier", "tests.audit.test_audit:ratio_inverted", "--audit-cases",
        "first-stoch-T1-topk3,first-deter-T1-", "--audit-tv", "0.25", "--audit-report", str(tmp_path))
    # The stochastic-draft bug fails its stochastic case; deterministic cases pass; min-p is skipped.
    result.assert_outcomes(failed=1, passed=2, skipped=1)
    assert json.loads((tmp_path / "tests.audit.test_audit_ratio_inverted.json").read_text())["outcomes"]


def test_target_resolution():
    assert resolve_target("reference").verify is not None
    if not torch.cuda.is_available():
        assert "not available" in resolve_target("cuda").refusal
    with pytest.raises(TargetError):
        resolve_target("tests.audit.test_audit:")
    target = resolve_target("tests.audit.test_audit:reference")
    assert target.supports == frozenset({"per_request_seed", "validation"})
    wrapped = resolve_target("tests.audit.test_audit:ratio_inverted")
    assert wrapped.mutant is chain_mutants.mutant_verifier and wrapped.supports == frozenset()


def test_our_backends_run_their_own_mutants():
    assert resolve_target("reference").mutant("coin_reused").__name__ == "mutant_coin_reused"


def test_a_resumed_audit_equals_one_run(tmp_path, capsys):
    """--max-seconds stops between cases (exit 3); --resume goes on; the result equals one uninterrupted run."""
    base = ["reference", "--families", "first-token,greedy", "--cases", "first-stoch-T1,greedy-deter", "--tv",
            "0.3", "--quiet"]
    split = tmp_path / "split"
    assert main([*base, "--out", str(split), "--max-seconds", "0"]) == 3
    assert json.loads((split / "reference.json").read_text())["verdict"] == "INCOMPLETE"
    while main([*base, "--out", str(split), "--max-seconds", "0", "--resume"]) == 3:
        pass
    assert main([*base, "--out", str(tmp_path / "whole")]) == 0
    a, b = (json.loads((tmp_path / d / "reference.json").read_text()) for d in ("split", "whole"))
    key = lambda d: [(o["name"], o["verdict"], o["pvalue"], o["num_samples"]) for o in d["outcomes"]]
    assert key(a) == key(b) and a["command"] == b["command"].replace(str(tmp_path / "whole"), str(split))
    assert a["sessions"] > 1 and a["complete"]
    capsys.readouterr()


@pytest.mark.slow
def test_shared_stream_mutant_keeps_its_drafting_through_an_adapter():
    """A peer's adapter wraps the mutant in its own function, dropping ``draft_stream``: the audit puts the bug's
    drafting half back, so the shared stream is still caught on that path."""
    target = resolve_target("reference")
    adapter = AuditTarget("adapter", "a wrapper that drops attributes", target.verify,
                          mutant=lambda bug: (lambda *a, **kw: chain_mutants.mutant_verifier(bug)(*a, **kw)))
    outcome = _one(adapter, "mutants", "shared_stream", AuditOptions())
    assert outcome.verdict == "caught", outcome
