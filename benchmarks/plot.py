"""Figures and tables from benchmark CSVs.

``python -m benchmarks.plot results/benchmarks/chain_cpu_quick.csv --out chain.png --table``
draws median time against batch size (log-log), one panel per (sampling, drafts) x vocabulary at one
draft length k, one line per provider, and prints a markdown table with each provider's time relative to
the ``--baseline`` provider measured in the same run.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from .common import OneLineParser, read_csv


def ok_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r.get("status") == "ok"]


def markdown_table(rows: list[dict[str, str]], baseline: str) -> str:
    """One line per case: each provider's median ms and its ratio to ``baseline`` (same CSV row set)."""
    rows = ok_rows(rows)
    providers = sorted({r["provider"] for r in rows}, key=lambda p: (p != baseline, p))
    key_cols = ("batch", "k", "vocab", "dtype", "sampling", "drafts")
    cases: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        cases[tuple(r[c] for c in key_cols)][r["provider"]] = float(r["median_ms"])
    header = "| " + " | ".join(key_cols) + " | " + " | ".join(f"{p} ms" for p in providers)
    header += "".join(f" | {p} / {baseline}" for p in providers if p != baseline) + " |"
    lines = [header, "|" + "---|" * (len(key_cols) + 2 * len(providers) - 1)]
    for key in sorted(cases, key=lambda k: (int(k[2]), k[3], k[4], k[5], int(k[1]), int(k[0]))):
        times = cases[key]
        cells = [f"{times[p]:.3f}" if p in times else "-" for p in providers]
        base = times.get(baseline)
        ratios = [f"{times[p] / base:.3g}" if p in times and base else "-" for p in providers if p != baseline]
        lines.append("| " + " | ".join(list(key) + cells + ratios) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, str]], out: Path, k: int | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ok_rows(rows)
    if not rows:
        raise SystemExit("no successful rows to plot")
    ks = sorted({int(r["k"]) for r in rows})
    k = k if k is not None else ks[-1]
    rows = [r for r in rows if int(r["k"]) == k]
    panels = sorted({(r["sampling"], r["drafts"]) for r in rows})
    vocabs = sorted({int(r["vocab"]) for r in rows})
    fig, axes = plt.subplots(len(panels), len(vocabs), figsize=(4.2 * len(vocabs), 3.2 * len(panels)),
                             squeeze=False)
    device = rows[0].get("device", "")
    for i, (sampling, drafts) in enumerate(panels):
        for j, vocab in enumerate(vocabs):
            ax = axes[i][j]
            sel = [r for r in rows if (r["sampling"], r["drafts"]) == (sampling, drafts) and int(r["vocab"]) == vocab]
            lines: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
            for r in sel:
                lines[(r["provider"], r["dtype"])].append((int(r["batch"]), float(r["median_ms"])))
            for (provider, dtype), pts in sorted(lines.items()):
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{provider} ({dtype})")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{sampling}, {drafts} drafts, V={vocab}", fontsize=9)
            ax.set_xlabel("batch")
            ax.set_ylabel("median ms")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"chain verification, k={k}, {device}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python -m benchmarks.plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: next to the first CSV)")
    parser.add_argument("--k", type=int, default=None, help="draft length to plot (default: the largest)")
    parser.add_argument("--table", action="store_true", help="print a markdown table")
    parser.add_argument("--baseline", default="reference", help="provider the table's ratios divide by")
    args = parser.parse_args(argv)
    rows = read_csv(args.csv)
    out = args.out or args.csv[0].with_suffix(".png")
    print(f"wrote {plot(rows, out, args.k)}")
    if args.table:
        print(markdown_table(rows, args.baseline))


if __name__ == "__main__":
    main()
