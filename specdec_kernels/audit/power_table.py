"""Power against the peers' suites: which suite catches which planted bug, at what sample size and time.

``python -m specdec_kernels.audit.power_table --out results/audit`` runs three suites against every planted bug
of the exactness package and against a correct backend (``cpu``: the negative rows), and writes
``<out>/power_table.json`` (every test each suite ran) and ``<out>/power_table.md`` (the table; ``--name``
another file name, so that a folder can hold rows run by separate commands):

- **ours**: the exactness suite's own case for the bug (``chain_law.MUTANT_CASES``,
  ``block_traversal_law.MUTANT_CASES``) in its group-sequential looks (:mod:`..exactness.sequential`: at 1/64,
  1/8 and all of its design size for total variation 0.02, power 0.999 and alpha 4e-7, split over the looks),
  stopping at the first look that rejects; on a negative row, every one of those cases, each to its last look.
- **vllm-v2**: :func:`peer_suites.vllm_v2_suite` (vLLM Model Runner V2's tests and PR #54282's narrow test).
- **deepspec-pr48**: :func:`peer_suites.deepspec_pr48_suite` (DeepSpec PR #48, with its negative control).

A peer suite runs its tests in order and stops at the first that rejects (its verdict); ``seconds`` is the
wall time until the verdict, ``trials`` the trials it drew until then. Planted bugs of the chain verifier run
as ``chain_mutants.mutant_verifier``; those of block verification as the reference's ``method="block"`` with
the bug planted (``block_traversal_mutants.planted``); those of tree traversal only through ours, as the peer
designs drive a chain verifier. Every run is seeded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..exactness import block_traversal_law as btl
from ..exactness import block_traversal_mutants, chain_mutants, peer_suites, sequential
from ..exactness import goodness_of_fit as gof
from ..exactness.chain_law import (
    MUTANT_CASES,
    backend_verifier,
    case_by_name,
    check_sequence_law,
    law_check_for,
)
from .report import _fmt_p
from .runner import machine_environment

__all__ = ["ROWS", "Row", "run_row", "power_table", "table_markdown", "main"]

ALPHA = gof.SUITE_BUDGET.per_test_alpha
SUITES = ("ours", "vllm-v2", "deepspec-pr48")
SUITE_TITLES = {"ours": "ours (exactness suite)", "vllm-v2": "vLLM V2 design", "deepspec-pr48": "DeepSpec PR #48 design"}
CORRECT = "cpu"
TRAVERSAL_NA = "chain-only design: the bug is in a tree traversal (sibling order, coins, path weights)"
POINT_MASS_NA = "every draft at T > 0 comes with its draft law: the bug is in point-mass drafts"
INERT: dict[tuple[str, str], str] = {
    ("vllm-v2", "deterministic_resample_with_draft"): POINT_MASS_NA,
    ("vllm-v2", "bonus_wrong_row"): "every position has the same target row, so the previous row is the bonus row",
    ("deepspec-pr48", "deterministic_resample_with_draft"): POINT_MASS_NA,
    ("deepspec-pr48", "draft_temperature_missing"): "the design verifies at T = 1, where the bug changes no token",
    ("deepspec-pr48", "greedy_sampled"): "the design has no greedy (T = 0) request",
    ("deepspec-pr48", "block_max_score"): "V = 16 is one 16-entry block of the two-level Gumbel-max",
}
"""(peer suite, planted bug) pairs where the bug changes no token on any input the design generates (checked by
tests/audit/test_power_table.py), with the reason: not applicable rather than a miss."""
STEP_SEED = 11  # the step-law checks' seed (tests/exactness/test_block_traversal_mutants.py)


@dataclass(frozen=True)
class Row:
    """One line of the table: a planted bug (``family`` chain / block / traversal) or a correct backend
    (``bug`` None, ``family`` the methods it runs)."""

    label: str
    family: str
    bug: str | None = None


ROWS: tuple[Row, ...] = (
    Row(f"correct: `{CORRECT}` (token)", "chain"),
    Row(f"correct: `{CORRECT}` (block, traversal)", "block"),
    *(Row(f"`{b}`", "chain", b) for b in chain_mutants.MUTANTS),
    *(Row(f"`{b}`", "block" if b.startswith("block") else "traversal", b) for b in block_traversal_mutants.MUTANTS),
)


@contextlib.contextmanager
def _chain_verifier(row: Row) -> Iterator:
    """The chain verifier the peer suites run for ``row`` (None: they cannot express its bug)."""
    if row.family == "traversal":
        yield None
    elif row.bug is None:
        yield backend_verifier(CORRECT, method="block" if row.family == "block" else "token")
    elif row.family == "chain":
        yield chain_mutants.mutant_verifier(row.bug)
    else:
        with block_traversal_mutants.planted(row.bug):
            yield backend_verifier("reference", method="block")


def _ours_check(case_name: str, family: str, backend: str, verify=None) -> dict:
    """One case of ours: the law check of a chain case (through ``verify`` when given, else ``backend``), or of
    a block / traversal case (step law or whole sequence) through ``backend``."""
    wall, cpu = time.perf_counter(), time.process_time()
    step_cases = {c.name: c for c in btl.STEP_CASES}
    block_sequences = {c.name: c for c in btl.BLOCK_SEQUENCE_CASES}
    if family == "chain":
        case = case_by_name(case_name)
        check = law_check_for(case)(verify or backend_verifier(backend), case, ALPHA)
    elif case_name in block_sequences:
        check = check_sequence_law(backend_verifier(backend, method="block"), block_sequences[case_name], ALPHA)
    else:
        method, api = ("block", "chain") if family == "block" else ("traversal", "tree")
        check = btl.check_step_law(step_cases[case_name], method, btl.step_verifier(method, backend, api), ALPHA,
                                   seed=STEP_SEED)
    result = check.result
    return {"name": case_name, "statistic": _finite(result.statistic), "df": result.df, "pvalue": result.pvalue,
            "alpha": ALPHA, "rejects": bool(result.rejects(ALPHA)), "trials": check.num_samples,
            "look": check.look, "looks": check.looks, "seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}


def _ours_cases(row: Row) -> list[tuple[str, str]]:
    """(case, family) pairs ours runs on ``row``: the bug's case, or every bug case of the row's families."""
    if row.bug is not None:
        table = MUTANT_CASES if row.family == "chain" else btl.MUTANT_CASES
        return [(table[row.bug], row.family)]
    if row.family == "chain":
        return [(c, "chain") for c in dict.fromkeys(MUTANT_CASES.values())]
    pairs = {(btl.MUTANT_CASES[b], "block" if b.startswith("block") else "traversal"): None
             for b in block_traversal_mutants.MUTANTS}
    return list(pairs)


def _ours(row: Row) -> dict:
    tests = []
    for case_name, family in _ours_cases(row):
        if row.bug is None:
            tests.append(_ours_check(case_name, family, CORRECT))
        elif row.family == "chain":
            tests.append(_ours_check(case_name, family, "reference", chain_mutants.mutant_verifier(row.bug)))
        else:
            with block_traversal_mutants.planted(row.bug):
                tests.append(_ours_check(case_name, family, "reference"))
    return _cell(tests, rejecting=next((t["name"] for t in tests if t["rejects"]), None))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _cell(tests: list[dict], rejecting: str | None, control: dict | None = None) -> dict:
    cell = {"applicable": True, "caught": rejecting is not None, "rejecting_test": rejecting,
            "smallest_p": min(t["pvalue"] for t in tests), "trials": sum(t["trials"] for t in tests),
            "seconds": sum(t["seconds"] for t in tests), "cpu_seconds": sum(t.get("cpu_seconds", 0.0) for t in tests),
            "tests": tests, "control": control}
    if "look" in tests[0]:  # ours: the deciding look of the rejecting test, else the last look every case reached
        deciding = next((t for t in tests if t["name"] == rejecting), tests[-1])
        cell["look"], cell["looks"] = deciding["look"], deciding["looks"]
    return cell


def _peer_test(t: peer_suites.PeerTest) -> dict:
    d = asdict(t)
    d["statistic"] = _finite(t.statistic)
    d["rejects"] = t.rejects
    return d


def _peer(row: Row, suite: str, sizes: dict) -> dict:
    if (suite, row.bug) in INERT:
        return {"applicable": False, "reason": INERT[suite, row.bug]}
    with _chain_verifier(row) as verify:
        if verify is None:
            return {"applicable": False, "reason": TRAVERSAL_NA}
        cpu = time.process_time()
        if suite == "vllm-v2":
            run = peer_suites.vllm_v2_suite(verify, sizes["vllm-v2"], stop_at_first_rejection=True)
        else:
            run = peer_suites.deepspec_pr48_suite(verify, sizes["deepspec-pr48"], stop_at_first_rejection=True)
        cpu = time.process_time() - cpu
    control = _peer_test(run.control) if run.control is not None else None
    cell = _cell([_peer_test(t) for t in run.tests], run.rejecting.name if run.rejecting else None, control)
    cell["cpu_seconds"] = cpu
    if run.control is not None:
        cell["seconds"] += run.control.seconds
    return cell


def run_row(row: Row, sizes: dict) -> dict:
    """Every suite's cell of ``row``."""
    cells = {"ours": _ours(row)}
    for suite in SUITES[1:]:
        cells[suite] = _peer(row, suite, sizes)
    return {"label": row.label, "bug": row.bug, "family": row.family, "suites": cells}


def default_sizes(wide_vocab: int, narrow_trials: int, rounds: int) -> dict:
    return {"vllm-v2": peer_suites.VllmV2Sizes(wide_vocab=wide_vocab, narrow_trials=narrow_trials),
            "deepspec-pr48": peer_suites.DeepSpecSizes(rounds=rounds)}


def power_table(rows: tuple[Row, ...], sizes: dict, command: str, progress=None) -> dict:
    """Run ``rows``; the JSON record (command, environment, sizes, rows). The environment (the commit and
    whether the tree was clean) is taken before the first row: the code that runs is the code loaded then."""
    environment = machine_environment()
    started = time.perf_counter()
    out = []
    for row in rows:
        out.append(run_row(row, sizes))
        if progress:
            progress(out[-1])
    return {"tool": "specdec_kernels.audit.power_table", "command": command, "environment": environment,
            "alpha_ours": ALPHA, "looks_ours": list(sequential.LOOK_FRACTIONS), "sizes": {k: asdict(v) for k, v in sizes.items()},
            "peer_full_sizes": {"vllm-v2": asdict(peer_suites.VLLM_V2_SIZES),
                                "deepspec-pr48": asdict(peer_suites.DEEPSPEC_PR48_SIZES)},
            "deepspec_control": dict(zip(("weight", "noncentrality"),
                                         peer_suites.deepspec_control(sizes["deepspec-pr48"]), strict=True)),
            "seconds": time.perf_counter() - started, "rows": out}


# -- the table ------------------------------------------------------------------------------------------

TABLE_HEADER = ("| row | " + " | ".join(SUITE_TITLES[s] for s in SUITES) + " |\n"
                "|---|" + "---|" * len(SUITES))


def _cell_text(cell: dict) -> str:
    if not cell["applicable"]:
        return f"not applicable: {cell['reason']}"
    verdict = f"**caught** by `{cell['rejecting_test']}`" if cell["caught"] else "passes"
    look = f" at look {cell['look']} of {cell['looks']}" if "look" in cell else ""
    text = (f"{verdict}{look}; p {_fmt_p(cell['smallest_p'])}; {cell['trials']:,} trials; {cell['seconds']:.1f} s "
            f"({cell['cpu_seconds']:.1f} s CPU)")
    control = cell.get("control")
    if control:
        says, sign = ("rejects", ">") if control["rejects"] else ("does NOT reject", "<=")
        chi2 = "inf" if control["statistic"] is None else f"{control['statistic']:.0f}"
        text += f"; negative control {says} (chi2 {chi2} {sign} {control['threshold']:.1f})"
    return text


def table_markdown(record: dict) -> str:
    """The Markdown table of a power-table record: one line per row, one cell per suite."""
    lines = [TABLE_HEADER]
    for row in record["rows"]:
        lines.append(f"| {row['label']} | " + " | ".join(_cell_text(row["suites"][s]) for s in SUITES) + " |")
    return "\n".join(lines)


def summary(record: dict) -> dict[str, dict]:
    """Per suite: bugs caught, bugs run, false alarms on the correct rows, seconds over all rows."""
    out = {}
    for s in SUITES:
        cells = [(r, r["suites"][s]) for r in record["rows"] if r["suites"][s]["applicable"]]
        bugs = [c for r, c in cells if r["bug"] is not None]
        out[s] = {"caught": sum(c["caught"] for c in bugs), "run": len(bugs),
                  "false_alarms": sum(c["caught"] for r, c in cells if r["bug"] is None),
                  "seconds": sum(c["seconds"] for _, c in cells)}
    return out


def _ours_sizes(record: dict) -> str:
    """How ours sized its cases in ``record`` (records written before the looks ran each case at its design size)."""
    if "looks_ours" not in record:
        return (f"each bug's own suite case at its design size (alpha {record['alpha_ours']:.0e}, total variation "
                "0.02 with power 0.999)")
    looks = ", ".join(f"1/{round(1 / f)}" for f in record["looks_ours"][:-1])
    return (f"each bug's own suite case in group-sequential looks at {looks} and all of its design size (alpha "
            f"{record['alpha_ours']:.0e} split over the looks, the last keeping power 0.999 at total variation "
            "0.02), stopping at the first look that rejects")


def markdown(record: dict) -> str:
    env = record["environment"]
    v2, ds = record["sizes"]["vllm-v2"], record["sizes"]["deepspec-pr48"]
    full = record["peer_full_sizes"]["vllm-v2"]
    s = summary(record)
    totals = "; ".join(f"{SUITE_TITLES[k]}: {v['caught']} of {v['run']} bugs caught, {v['false_alarms']} false "
                       f"alarms, {v['seconds']:.0f} s" for k, v in s.items())
    return "\n".join([
        "# Power against the peers' suites",
        "",
        f"Command: `{record['command']}`  ",
        f"Commit: {env['commit']}; machine: {env['device']} ({env['platform']}, {env['torch_threads']} torch "
        f"threads, torch {env['torch']}); {record['seconds']:.0f} s wall.",
        "",
        f"Sizes. Ours: {_ours_sizes(record)}. "
        f"vLLM V2 design: wide V = {v2['wide_vocab']} (vLLM: {full['wide_vocab']}), "
        f"{v2['trials_per_token'] * v2['wide_vocab']:,} trials per configuration (10 x V), (k, T) in "
        f"{', '.join(f'({k}, {t:g})' for k, t in v2['wide_configs'])}, greedy k in "
        f"{', '.join(map(str, v2['greedy_steps']))}; narrow V = {v2['narrow_vocab']} at {v2['narrow_trials']:,} "
        f"trials (vLLM: {full['narrow_trials']:,}). DeepSpec PR #48 design: {ds['rounds']:,} rounds of k = "
        f"{ds['steps']}, V = {ds['vocab']}; negative control at noncentrality "
        f"{record['deepspec_control']['noncentrality']:.0f}.",
        "",
        "A peer suite stops at its first rejecting test; trials and seconds (wall, and the process's CPU "
        "seconds: the machine is shared) are those until its verdict, with the negative control where it ran. "
        "Ours runs the one case the suite assigns to the bug; on a correct row, every such case"
        + (", each to its last look. p: the smallest p-value of the tests run (ours: the deciding look's, adjusted "
           "for the looks; " if "looks_ours" in record else ". p: the smallest p-value of the tests run (")
        + "a peer test rejects on its threshold, not on p).",
        "",
        table_markdown(record),
        "",
        f"Totals: {totals}.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_kernels.audit.power_table",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="audit-report", help="output folder (default: audit-report)")
    ap.add_argument("--wide-vocab", type=int, default=256,
                    help="vLLM design's wide vocabulary (trials 10 x V per configuration; vLLM: 4096; default 256)")
    ap.add_argument("--narrow-trials", type=int, default=50_000,
                    help="vLLM design's narrow test trials (vLLM: 200,000; default 50,000)")
    ap.add_argument("--rounds", type=int, default=20_000, help="DeepSpec design's rounds (default: its 20,000)")
    ap.add_argument("--bugs", default=None,
                    help="comma-separated planted bugs to run (default: all, with the correct rows)")
    ap.add_argument("--name", default="power_table",
                    help="file name of the record and table in --out, without suffix (default: power_table); "
                    "another name keeps the rows a folder already holds, e.g. one more bug at other sizes")
    args = ap.parse_args(argv)
    rows = ROWS
    if args.bugs is not None:
        wanted = [b.strip() for b in args.bugs.split(",") if b.strip()]
        known = {r.bug for r in ROWS if r.bug}
        if not wanted or any(b not in known for b in wanted):
            ap.exit(2, f"power_table: error: --bugs from {','.join(sorted(known))}\n")
        rows = tuple(r for r in ROWS if r.bug in wanted)
    if not args.name or Path(args.name).name != args.name or args.name.startswith("."):
        ap.exit(2, f"power_table: error: --name must be a plain file name, got {args.name!r}\n")
    if min(args.wide_vocab, args.narrow_trials, args.rounds) < 2:
        ap.exit(2, "power_table: error: --wide-vocab, --narrow-trials and --rounds must be at least 2\n")
    command = "python -m specdec_kernels.audit.power_table " + shlex.join(argv if argv is not None else sys.argv[1:])
    sizes = default_sizes(args.wide_vocab, args.narrow_trials, args.rounds)

    def progress(row: dict) -> None:
        print(row["label"] + ": " + "; ".join(f"{s}: {_cell_text(row['suites'][s])}" for s in SUITES), flush=True)

    torch.manual_seed(0)
    record = power_table(rows, sizes, command.strip(), progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{args.name}.json", out / f"{args.name}.md"
    js.write_text(json.dumps(record, indent=1) + "\n")
    md.write_text(markdown(record))
    print(f"wrote {js} and {md} ({record['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
