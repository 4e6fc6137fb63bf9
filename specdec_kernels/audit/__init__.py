"""The exactness suite as an audit tool: run it against any verifier, get a report to attach to a bug.

Command line: ``python -m specdec_kernels.audit TARGET`` (``--help`` for options). In code::

    from specdec_kernels.audit import AuditTarget, run_audit, write_report
    target = AuditTarget("mine", "my sampler", my_verify_chain)
    write_report(run_audit(target), "audit-report")

pytest: ``pytest --pyargs specdec_kernels.audit --verifier package.module:function``.
Modules: ``audit_target`` (what is audited), ``targets`` (the built-in targets, ``module:function`` lookup),
``cases`` (law cases), ``families`` (the case families), ``runner`` / ``report`` (run, render), and one
adapter module per peer (``vllm_targets`` and ``vllm_v2`` with ``vllm_common``, ``flashinfer_target``,
``sglang_target``, ``transformers_target``), imported by ``targets`` when their target is built. The laws, mutants and statistics
come from :mod:`specdec_kernels.exactness`. Importing this package imports neither vLLM nor Triton.
"""

from __future__ import annotations

from .families import FAMILIES, AuditOptions, Outcome
from .report import to_json, to_markdown, write_report
from .runner import AuditReport, run_audit
from .targets import BUILTIN_TARGETS, AuditTarget, TargetError, resolve_target

__all__ = [
    "AuditOptions", "AuditReport", "AuditTarget", "BUILTIN_TARGETS", "FAMILIES", "Outcome", "TargetError",
    "resolve_target", "run_audit", "to_json", "to_markdown", "write_report",
]
