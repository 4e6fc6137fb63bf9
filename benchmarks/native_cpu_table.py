"""Markdown tables of a ``bench_native_cpu`` CSV: our time and fraction of read bandwidth, and the baselines;
the issue-16 targets it meets; and, with ``--against``, how far each case moved from another run.

Usage: python -m benchmarks.native_cpu_table results/benchmarks/chain_cpu_b64_k3_v151936.csv [--families flat]
       python -m benchmarks.native_cpu_table new.csv --against results/benchmarks/chain_cpu_b64_k3_v151936.csv

``--against REF``: one line per case of ours' fraction of read bandwidth in REF and in this run (median of the
rounds, [lowest, highest] round), the move in percentage points, and whether this run's median lies within
REF's [lowest, highest] round widened by ``--tolerance`` points on either side (default 6: the spread between
the committed Xeon sweep and its reproduction, ``results/benchmarks/chain_cpu_b64_k3_v151936*.csv``; the
figures are in benchmarks/README.md, checked by tests/docs/test_docs.py).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from .common import OneLineParser, read_csv

# Issue 16's floors on ours' fraction of read bandwidth (median of the rounds), per mode, and on the vLLM step's
# time over ours with flat logits and every draft accepted.
TARGETS = {"greedy": 0.80, "random_det": 0.50, "random_stoch": 0.50}
STEP_RATIO_TARGET = 4.0


def _ms(row: dict[str, str] | None) -> str:
    if row is None or row["status"] != "ok":
        return "—" if row is None else row["status"].split(":")[0]
    return f"{float(row['median_ms']):.3g} [{float(row['min_ms']):.3g}, {float(row['max_ms']):.3g}]"


def _pct(row: dict[str, str], column: str = "read_fraction") -> str:
    """A fraction column of a row in percent: median [min, max]; "—" where the row has none (CSVs from before
    the same-size probes)."""
    if not row.get(column):
        return "—"
    return (f"{100 * float(row[column]):.0f} [{100 * float(row[column + '_min']):.0f}, "
            f"{100 * float(row[column + '_max']):.0f}]")


def _cases(rows: list[dict[str, str]], families: list[str] | None = None) -> dict[tuple[str, ...], dict]:
    """Rows by case (dtype, family, mode, drafts), then by provider; the family-level probes left out."""
    cases: dict[tuple[str, ...], dict[str, dict[str, str]]] = defaultdict(dict)
    for r in rows:
        probe = r["provider"] in ("stream", "int16", "sum", "copy", "stream_need", "int16_need", "sum_need")
        if probe or (families and r["family"] not in families):
            continue
        cases[r["dtype"], r["family"], r["mode"], r["drafts"]][r["provider"]] = r
    return cases


def _ours(cases: dict[tuple[str, ...], dict]) -> dict[tuple[str, ...], dict[str, str]]:
    """ours' timed rows of ``_cases`` by case."""
    return {key: by["ours"] for key, by in cases.items()
            if "ours" in by and by["ours"]["status"] == "ok" and by["ours"].get("read_fraction")}


def table(rows: list[dict[str, str]], families: list[str] | None = None) -> str:
    """One markdown table: a line per case (dtype, family, mode, drafts), providers side by side."""
    cases = _cases(rows, families)
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
        frac, same = _pct(ours), _pct(ours, "same_size_fraction")

        def ratio(names: tuple[str, ...], by: dict = by, t: float = t) -> str:
            times = [float(by[n]["median_ms"]) for n in names if n in by and by[n]["status"] == "ok"]
            return f"{min(times) / t:.1f}x" if times else "—"

        lines.append(f"| {' | '.join(key)} | {ours['mean_accepted']} | {_ms(ours)} | {frac} | {same} | "
                     f"{_ms(by.get('vllm_step'))} | {_ms(by.get('vllm'))} | {_ms(by.get('torch'))} | "
                     f"{_ms(by.get('torch_compile'))} | {ratio(('vllm_step',))} | {ratio(('vllm',))} | "
                     f"{ratio(('torch', 'torch_compile'))} |")
    return "\n".join(lines)


def targets(rows: list[dict[str, str]]) -> list[str]:
    """One line per issue-16 target: the lowest case (median, and its lowest round) against the floor, and the
    vLLM step's smallest ratio over the flat, every-draft-accepted cases."""
    cases = _cases(rows)
    ours = _ours(cases)
    lines = []
    for mode, floor in TARGETS.items():
        of_mode = {key: r for key, r in ours.items() if key[2] == mode}
        if not of_mode:
            continue
        key, r = min(of_mode.items(), key=lambda kv: float(kv[1]["read_fraction"]))
        ok = float(r["read_fraction"]) >= floor
        lines.append(f"{mode}: lowest {_pct(r)} % of read bandwidth ({' '.join(key)}), target >= "
                     f"{100 * floor:.0f} %: {'met' if ok else 'NOT met'}")
    ratios = {key: float(by["vllm_step"]["median_ms"]) / float(ours[key]["median_ms"])
              for key, by in cases.items() if key[1] == "flat" and key[3] == "accept" and key in ours
              and by.get("vllm_step", {}).get("status") == "ok"}
    if ratios:
        (dtype, _, mode, _), low = min(ratios.items(), key=lambda kv: kv[1])
        lines.append(f"vLLM step / ours, flat, every draft accepted: lowest {low:.1f}x ({dtype} {mode}), target >= "
                     f"{STEP_RATIO_TARGET:.0f}x: {'met' if low >= STEP_RATIO_TARGET else 'NOT met'}")
    return lines


def against(rows: list[dict[str, str]], ref: list[dict[str, str]], tolerance: float) -> list[str]:
    """A markdown table of each case's fraction of read bandwidth in ``ref`` and in ``rows`` (cases of both),
    the move in points, and whether the median of ``rows`` lies within ref's [lowest, highest] round widened
    by ``tolerance`` points; then a summary line."""
    new, old = _ours(_cases(rows)), _ours(_cases(ref))
    lines = ["| dtype | logits | mode | drafts | reference % read bw [min, max] | this run | move (points) | "
             f"within ±{tolerance:g} |", "|---|---|---|---|---|---|---|---|"]
    moves, outside = [], []
    for key in (k for k in old if k in new):
        o, n = old[key], new[key]
        move = 100 * (float(n["read_fraction"]) - float(o["read_fraction"]))
        lo = 100 * float(o["read_fraction_min"]) - tolerance
        hi = 100 * float(o["read_fraction_max"]) + tolerance
        inside = lo <= 100 * float(n["read_fraction"]) <= hi
        moves.append((move, key))
        if not inside:
            outside.append(key)
        lines.append(f"| {' | '.join(key)} | {_pct(o)} | {_pct(n)} | {round(move):+d} | {'yes' if inside else 'NO'} |")
    if not moves:
        return ["no case in common with the reference"]
    low, high = min(moves), max(moves)
    lines += ["", f"{len(moves) - len(outside)} of {len(moves)} cases within the reference's [min, max] ±"
              f"{tolerance:g} points; moves from {low[0]:+.1f} ({' '.join(low[1])}) to {high[0]:+.1f} "
              f"({' '.join(high[1])}) points" + (f"; outside: {', '.join(' '.join(k) for k in outside)}"
                                                 if outside else "")]
    return lines


def bandwidth(rows: list[dict[str, str]]) -> str:
    """Read bandwidth per family and dtype (the fastest of the read probes over that dtype's logits, median
    over rounds) and copy bandwidth (fp32) per family's block of rounds."""
    seen = {(r["family"], r["dtype"]): r for r in rows if r["provider"] == "sum"}
    return "; ".join(f"{fam} {dtype}: read {r['read_gbs']} GB/s, copy {r['copy_gbs']} GB/s"
                     for (fam, dtype), r in seen.items())


COLUMNS = ("provider", "status", "dtype", "family", "mode", "drafts", "command", "device", "git_commit", "date_utc")


def _load(paths: list[str]) -> list[dict[str, str]]:
    """The rows of bench_native_cpu CSVs; exits with one line when one cannot be read or is not such a CSV."""
    try:
        rows = read_csv(paths)
    except (OSError, UnicodeDecodeError) as exc:
        sys.exit(f"native_cpu_table: cannot read the CSV: {exc}")
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        sys.exit(f"native_cpu_table: {', '.join(paths)} is not a bench_native_cpu CSV ("
                 + (f"no {', '.join(missing)} column" if missing else "no rows") + ")")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="python -m benchmarks.native_cpu_table", description=__doc__)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--families", default="", help="comma-separated subset of logits families")
    ap.add_argument("--against", default=None, metavar="REF.csv",
                    help="another run's CSV: each case's move from it (module docstring)")
    ap.add_argument("--tolerance", type=float, default=6.0,
                    help="points either side of the reference's [min, max] round (default 6)")
    args = ap.parse_args(argv)
    if not args.tolerance >= 0:  # NaN too
        ap.error(f"--tolerance must be >= 0 (got {args.tolerance:g})")
    rows = _load(args.csv)
    ref = _load([args.against]) if args.against else None
    print(table(rows, [f for f in args.families.split(",") if f] or None))
    print()
    print(bandwidth(rows))
    print()
    print("\n".join(targets(rows)))
    print()
    print(f"command: `{rows[0]['command']}`; {rows[0]['device']}; commit {rows[0]['git_commit']}; {rows[0]['date_utc']}")
    if ref is not None:
        print()
        print(f"against `{args.against}` (commit {ref[0]['git_commit']}, {ref[0]['date_utc']}):")
        print("\n".join(against(rows, ref, args.tolerance)))


if __name__ == "__main__":
    main()
