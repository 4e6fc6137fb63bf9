"""Markdown tables of a ``bench_native_cpu`` CSV: our time and fraction of read bandwidth, and the baselines.

Usage: python -m benchmarks.native_cpu_table benchmarks/results/chain_cpu_b64_k3_v151936.csv [--families flat]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from .common import read_csv


def _ms(row: dict[str, str] | None) -> str:
    if row is None or row["status"] != "ok":
        return "—" if row is None else row["status"].split(":")[0]
    return f"{float(row['median_ms']):.3g} [{float(row['min_ms']):.3g}, {float(row['max_ms']):.3g}]"


def table(rows: list[dict[str, str]], families: list[str] | None = None) -> str:
    """One markdown table: a line per case (dtype, family, mode, drafts), providers side by side."""
    cases: dict[tuple[str, ...], dict[str, dict[str, str]]] = defaultdict(dict)
    for r in rows:
        probe = r["provider"] in ("stream", "int16", "sum", "copy", "stream_need", "int16_need", "sum_need")
        if probe or (families and r["family"] not in families):
            continue
        cases[r["dtype"], r["family"], r["mode"], r["drafts"]][r["provider"]] = r
    lines = [
        "| dtype | logits | mode | drafts | accepted | ours ms [min, max] | % read bw [min, max] | "
        "% same-size read | "
        "vLLM step ms | vLLM kernel ms | torch ms | torch.compile ms | vLLM step / ours | vLLM kernel / ours | "
        "best torch / ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, by in cases.items():
        ours = by.get("ours")
        if ours is None or ours["status"] != "ok":
            continue
        t = float(ours["median_ms"])
        frac, same = (  # "—" for CSVs from before the same-size probes
            f"{100 * float(ours[c]):.0f} [{100 * float(ours[c + '_min']):.0f}, "
            f"{100 * float(ours[c + '_max']):.0f}]" if ours.get(c) else "—"
            for c in ("read_fraction", "same_size_fraction"))

        def ratio(names: tuple[str, ...], by: dict = by, t: float = t) -> str:
            times = [float(by[n]["median_ms"]) for n in names if n in by and by[n]["status"] == "ok"]
            return f"{min(times) / t:.1f}x" if times else "—"

        lines.append(f"| {' | '.join(key)} | {ours['mean_accepted']} | {_ms(ours)} | {frac} | {same} | "
                     f"{_ms(by.get('vllm_step'))} | {_ms(by.get('vllm'))} | {_ms(by.get('torch'))} | "
                     f"{_ms(by.get('torch_compile'))} | {ratio(('vllm_step',))} | {ratio(('vllm',))} | "
                     f"{ratio(('torch', 'torch_compile'))} |")
    return "\n".join(lines)


def bandwidth(rows: list[dict[str, str]]) -> str:
    """Read bandwidth per family and dtype (the fastest of the read probes over that dtype's logits, median
    over rounds) and copy bandwidth (fp32) per family's block of rounds."""
    seen = {(r["family"], r["dtype"]): r for r in rows if r["provider"] == "sum"}
    return "; ".join(f"{fam} {dtype}: read {r['read_gbs']} GB/s, copy {r['copy_gbs']} GB/s"
                     for (fam, dtype), r in seen.items())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.native_cpu_table", description=__doc__)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--families", default="", help="comma-separated subset of logits families")
    args = ap.parse_args(argv)
    rows = read_csv(args.csv)
    print(table(rows, [f for f in args.families.split(",") if f] or None))
    print()
    print(bandwidth(rows))
    print()
    print(f"command: `{rows[0]['command']}`; {rows[0]['device']}; commit {rows[0]['git_commit']}; {rows[0]['date_utc']}")


if __name__ == "__main__":
    main()
