"""The audit matrix: one line per committed report (verifier, version, verdict, law cases rejected, the
smallest law p-value and the case that shows it), the summary table of docs/exactness-and-audit.md, which
tests/docs/test_audit_matrix.py checks against the reports.

Usage: ``python -m specdec_kernels.audit.matrix [DIR]`` (default ``results/audit``) prints the Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .report import _fmt_p
from .runner import STATISTICAL_FAMILIES

__all__ = ["audit_reports", "matrix_rows", "matrix_table"]

HEADER = ("| verifier | version | verdict | law cases rejected | smallest p-value | case that shows it | report |\n"
          "|---|---|---|---:|---:|---|---|")


def _version(report: dict) -> str:
    """The audited software's version: the peer's own (vLLM, transformers, ...) where the target records one,
    else ours at the report's commit."""
    peers = {k: v for k, v in (report["target"].get("versions") or {}).items() if k in ("vllm", "transformers",
                                                                                        "flashinfer", "sglang")}
    if peers:
        return ", ".join(f"{k} {v}" for k, v in sorted(peers.items()))
    env = report["environment"]
    return f"specdec_kernels {env.get('specdec_kernels', '?')} ({env.get('commit') or 'no commit'})"


def matrix_rows(reports: dict[str, dict]) -> list[dict[str, str]]:
    """One row per report (file stem -> its JSON), in file order: the law outcomes (first-token, sequence,
    narrow) with a p-value decide the smallest p-value and its case; a refused target has neither."""
    rows = []
    for stem, r in sorted(reports.items()):
        laws = [o for o in r["outcomes"] if o["family"] in STATISTICAL_FAMILIES and o.get("pvalue") is not None]
        rejected = sum(o["verdict"] == "FAIL" for o in laws)
        low = min(laws, key=lambda o: o["pvalue"], default=None)
        case = f"`{low['name']}` ({low['detail']})" if low else (r["target"].get("refusal") or "")
        rows.append({"verifier": f"`{r['target']['name']}`", "version": _version(r), "verdict": r["verdict"],
                     "rejected": f"{rejected} of {len(laws)}" if laws else "—",
                     "p": _fmt_p(low["pvalue"]) if low else "—", "case": case.replace("|", "\\|"),
                     "report": f"`{stem}.md`"})
    return rows


def audit_reports(folder: str | Path = "results/audit") -> dict[str, dict]:
    """``{file stem: report}`` of the audit reports in ``folder`` (JSON files with ``outcomes``: the power table
    beside them is not one)."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))}
    return {stem: r for stem, r in found.items() if isinstance(r, dict) and "outcomes" in r}


def matrix_table(folder: str | Path = "results/audit") -> str:
    """The Markdown table of every audit report in ``folder``."""
    reports = audit_reports(folder)
    lines = [HEADER] + ["| " + " | ".join(row.values()) + " |" for row in matrix_rows(reports)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_kernels.audit.matrix", description=__doc__.split("\n")[0])
    ap.add_argument("folder", nargs="?", default="results/audit", help="folder of audit reports (*.json)")
    args = ap.parse_args(argv)
    if not Path(args.folder).is_dir():
        ap.exit(2, f"audit.matrix: error: folder: {args.folder} is not a directory\n")
    print(matrix_table(args.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
