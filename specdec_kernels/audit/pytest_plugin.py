"""pytest plugin of the audit: ``pytest --pyargs specdec_kernels.audit --verifier TARGET``.

Registered through the ``pytest11`` entry point of an installed specdec-kernels; from a source tree load it
by name: ``pytest -p specdec_kernels.audit.pytest_plugin --pyargs specdec_kernels.audit --verifier
TARGET``. TARGET is what ``python -m specdec_kernels.audit`` takes. Every audit case becomes one test
(``specdec_kernels/audit/test_audit.py``); ``--audit-report DIR`` also writes the session's Markdown + JSON
report. The plugin only adds options (it imports nothing heavy), so it costs nothing in other test runs.
"""

from __future__ import annotations

import os

import pytest

FAMILIES = "first-token,sequence,greedy,batch,bad-input,mutants,narrow"
INTERPRETED = ("triton", "vllm-v1-triton", "vllm-v2-triton", "vllm-v2-triton-block", "vllm-v2-triton-synthetic")
AUDIT_TESTS = "specdec_kernels.audit.test_audit"
ENTRY_POINT = "specdec_kernels_audit"  # pyproject.toml [project.entry-points.pytest11]


def pytest_addoption(parser):
    group = parser.getgroup("specdec-kernels audit")
    group.addoption("--verifier", default=None, help="audit TARGET: built-in name or package.module:function")
    group.addoption("--audit-families", default=FAMILIES, help=f"comma-separated families (default {FAMILIES})")
    group.addoption("--audit-cases", default=None, help="comma-separated case-name substrings to run")
    group.addoption("--audit-tv", type=float, default=0.02, help="total-variation error to detect (sample sizes)")
    group.addoption("--audit-report", default=None, help="write the session's Markdown + JSON report to this folder")


def pytest_configure(config):
    if config.getoption("--verifier", default=None) in INTERPRETED and "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():  # Triton on CPU tensors runs only in its interpreter
            os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(session, config, items):
    """Refuse once, at collection, when audit cases were collected without a usable --verifier."""
    if not any(getattr(item, "module", None) is not None and item.module.__name__ == AUDIT_TESTS for item in items):
        return
    from .targets import TargetError, resolve_target

    spec = config.getoption("--verifier")
    if not spec:
        raise pytest.UsageError("the audit needs --verifier TARGET (a built-in name or package.module:function)")
    try:
        target = resolve_target(spec)
    except TargetError as exc:
        raise pytest.UsageError(f"--verifier: {exc}") from None
    if target.verify is None:
        raise pytest.UsageError(f"--verifier {spec} cannot run here: {target.refusal}")
    config.stash[TARGET_KEY] = target


TARGET_KEY = pytest.StashKey()
