"""The audit as pytest cases (options from ``audit/pytest_plugin.py``): one test per case of every selected family.

A law case fails when its test rejects at the suite's per-test alpha; a planted-bug case fails when the
bug is *not* caught through the target's adapter path; n/a cases are skipped with their reason.
"""

from __future__ import annotations

import pytest

from .families import CAUGHT, NA, PASS, AuditOptions, case_names, run_family
from .pytest_plugin import TARGET_KEY
from .runner import AuditReport


def _selection(config) -> list[tuple[str, str]]:
    families = [f.strip() for f in config.getoption("--audit-families").split(",") if f.strip()]
    parts = config.getoption("--audit-cases")
    parts = [p.strip() for p in parts.split(",")] if parts else None
    out = []
    for family in families:
        for name in case_names(family):
            if parts is None or any(p in name for p in parts):
                out.append((family, name))
    return out


def pytest_generate_tests(metafunc):
    if "audit_case" in metafunc.fixturenames:
        cases = _selection(metafunc.config)
        metafunc.parametrize("audit_case", cases, ids=[f"{f}:{n}" for f, n in cases])


@pytest.fixture(scope="session")
def audit_target(request):
    """The target the plugin resolved at collection (it refuses a missing or unusable --verifier there)."""
    return request.config.stash[TARGET_KEY]


@pytest.fixture(scope="session")
def audit_report(request, audit_target):
    options = AuditOptions(tv=request.config.getoption("--audit-tv"))
    report = AuditReport(audit_target, "pytest --pyargs specdec_kernels.audit --verifier "
                         + request.config.getoption("--verifier"), options,
                         tuple(dict.fromkeys(f for f, _ in _selection(request.config))))
    yield report
    out = request.config.getoption("--audit-report")
    if out:
        from .report import write_report
        from .runner import _environment

        report.environment = _environment(audit_target)
        report.seconds = sum(o.seconds for o in report.outcomes)
        write_report(report, out)


def test_audit_case(audit_case, audit_target, audit_report):
    family, name = audit_case
    opts = AuditOptions(tv=audit_report.options.tv, cases=(name,), exact=True)
    outcomes = list(run_family(audit_target, family, opts))
    assert len(outcomes) == 1, f"case {name!r} of {family} produced {len(outcomes)} outcomes"
    outcome = outcomes[0]
    audit_report.outcomes.append(outcome)
    if outcome.verdict == NA:
        pytest.skip(outcome.detail)
    expected = CAUGHT if family == "mutants" else PASS
    assert outcome.verdict == expected, f"{outcome.verdict}: {outcome.detail} (p={outcome.pvalue}, n={outcome.num_samples})"
