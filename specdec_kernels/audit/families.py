"""The audit's case families, each yielding one :class:`Outcome` per case.

- ``first-token`` / ``sequence``: the law cases (:mod:`.cases`) through ``chain_law.check_first_token_law`` /
  ``check_sequence_law``, at the suite's per-test alpha and a sample size from the power calculation.
- ``greedy``: temperature-0 requests emit exactly the target-argmax rule's tokens, alone and inside a batch
  of sampled requests.
- ``batch``: replay (same inputs and seeds, same tokens), and every request's tokens the same alone, in its
  batch, and in shuffled sub-batches (targets with per-request seeds).
- ``bad-input``: the shared table (:mod:`specdec_kernels.exactness.bad_inputs`): malformed calls must raise
  ValueError / TypeError naming the argument, NaN / inf logits must still give ids in [0, V).
- ``mutants``: each planted bug through the target's own adapter path, on the case the suite uses for it;
  it must be rejected.
- ``narrow``: vLLM's narrow shared-stream design (``chain_law.NARROW_CASES``: V = 16, the draft law the
  target's ranking reversed, drafts drawn inside the system): the law of the rejected first token and of the
  accepted draft's bonus token. ``AuditOptions.narrow_trials`` fixes its trial count (vLLM ran 200,000).
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from ..exactness import goodness_of_fit as gof
from ..exactness.bad_inputs import BAD_ARGUMENTS, HOSTILE_VALUES, valid_call
from ..exactness.chain_law import (
    MUTANT_CASES,
    NARROW_CASES,
    FirstTokenCase,
    LawCheck,
    NarrowCase,
    SequenceCase,
    case_by_name,
    check_first_token_law,
    check_narrow_law,
    check_sequence_law,
    law_check_for,
)
from ..exactness.chain_mutants import DRAFT_STREAMS, MUTANTS
from .audit_target import AuditTarget
from .cases import GRID_FIRST_TOKEN_CASES, GRID_SEQUENCE_CASES, LAW_CASES, uses_min_p

__all__ = ["Outcome", "FAMILIES", "AuditOptions", "run_family", "law_case_by_name", "case_names"]

FAMILIES = ("first-token", "sequence", "greedy", "batch", "bad-input", "mutants", "narrow")
PASS, FAIL, NA, ERROR = "pass", "FAIL", "n/a", "error"
CAUGHT, MISSED, INERT = "caught", "MISSED", "inert"


@dataclass
class Outcome:
    """One case's result. ``verdict``: pass / FAIL / n/a / error (mutants: caught / MISSED / inert / error;
    inert: on this path the planted bug changes no token of the case, so no test can see it)."""

    family: str
    name: str
    verdict: str
    detail: str
    num_samples: int | None = None
    statistic: float | None = None
    df: int | None = None
    pvalue: float | None = None
    alpha: float | None = None
    test: str | None = None
    power: float | None = None
    tv: float | None = None
    cells: list[dict] | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        if out["statistic"] is not None and not math.isfinite(out["statistic"]):
            out["statistic"] = str(out["statistic"])
        return out


@dataclass(frozen=True)
class AuditOptions:
    """Which cases run and at what level: ``alpha`` per statistical test, sample sizes that detect a
    total-variation error ``tv`` with probability ``power``; ``cases``: name substrings (None = all).
    Planted bugs run at ``mutant_tv`` (the suite's design point, 0.02, whatever ``tv`` the law cases use:
    the smallest planted bug sits exactly there)."""

    alpha: float = gof.SUITE_BUDGET.per_test_alpha
    tv: float = 0.02
    power: float = 0.999
    cases: tuple[str, ...] | None = None
    exact: bool = False  # ``cases`` are whole names, not substrings
    mutant_tv: float = 0.02  # planted bugs are always run at the suite's design point
    done: frozenset[str] = frozenset()  # "family:name" of cases a resumed run already holds
    narrow_trials: int | None = None  # trials of each narrow case (None: from alpha, tv and power)

    def selected(self, name: str, family: str) -> bool:
        if f"{family}:{name}" in self.done:
            return False
        if self.cases is None:
            return True
        if self.exact:
            return name in self.cases
        return any(part in name for part in self.cases)


def law_case_by_name(name: str) -> FirstTokenCase | SequenceCase | NarrowCase:
    """A law case of the audit (suite case or grid case) by name."""
    for case in GRID_FIRST_TOKEN_CASES + GRID_SEQUENCE_CASES:
        if case.name == name:
            return case
    return case_by_name(name)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" (at {where.name}, {where.filename.rsplit('/', 1)[-1]}:{where.lineno})" if where else ""
    return (text[0][:300] if text else type(exc).__name__) + at


def design_power(law: torch.Tensor, n: int, alpha: float, tv: float) -> float:
    """Power of the law test against any law at total variation ``tv`` (chi-square bound; point mass exact)."""
    support = int((law > 0).sum())
    if support <= 1:
        return 1.0 - (1.0 - tv) ** n
    return gof.chi2_power(n, tv, support - 1, alpha)


def _cell_label(case, index: int) -> str:
    vocab = case.vocab_size
    if isinstance(case, NarrowCase):
        if index == 2 * vocab:
            return "invalid outcome"
        return f"rejected, token {index}" if index < vocab else f"accepted, bonus {index - vocab}"
    if isinstance(case, FirstTokenCase):
        return "invalid id" if index == vocab else f"token {index}"
    num_sequences = vocab ** case.length
    if index == num_sequences:
        return "invalid sequence"
    digits = []
    for _ in range(case.length):
        digits.append(index % vocab)
        index //= vocab
    return "seq " + "".join(str(d) for d in reversed(digits))


def _worst_cells(case, check: LawCheck, count: int = 6) -> list[dict]:
    n = int(check.observed.sum())
    expected = check.expected * n
    gap = (check.observed.double() - expected).abs()
    worst = gap.argsort(descending=True)[:count].tolist()
    return [{"cell": _cell_label(case, i), "observed": int(check.observed[i]), "expected": round(float(expected[i]), 1)}
            for i in worst if gap[i] > 0]


def _law_outcomes(target: AuditTarget, family: str, opts: AuditOptions) -> Iterator[Outcome]:
    kind = FirstTokenCase if family == "first-token" else SequenceCase
    check = check_first_token_law if family == "first-token" else check_sequence_law
    for case in LAW_CASES:
        if not isinstance(case, kind) or not opts.selected(case.name, family):
            continue
        if uses_min_p(case) and "min_p" not in target.supports:
            yield Outcome(family, case.name, NA, "the verifier takes no min_p")
            continue
        yield _run_law(family, case, check, target.verify, opts)[0]


def _run_law(family, case, check, verify, opts, expect_reject: bool = False, name: str | None = None
             ) -> tuple[Outcome, LawCheck | None]:
    torch.manual_seed(0)  # for verifiers that draw from torch's global generator
    start = time.perf_counter()
    try:
        # Fixed-size tests, not the suite's looks (exactness/sequential.py): each outcome reports its design's
        # power at its sample size, which a run stopped at an early look would not have.
        result = check(verify, case, opts.alpha, opts.tv, opts.power, looks=False)
    except Exception as exc:  # the verifier failed on a valid case: report it, keep auditing
        return Outcome(family, name or case.name, ERROR, _one_line(exc), seconds=time.perf_counter() - start), None
    law = result.expected[:-1]
    res = result.result
    rejects = res.rejects(opts.alpha)
    if expect_reject:
        verdict = CAUGHT if rejects else MISSED
    else:
        verdict = FAIL if rejects else PASS
    if isinstance(case, SequenceCase):
        detail = f"{case.cfg.label()}, drafter {case.drafter}, k={case.k}, V={case.vocab_size}, length {case.length}"
    elif isinstance(case, NarrowCase):
        detail = (f"{case.cfg.label()}, {case.drafts} drafts drawn in the system, V={case.vocab_size}, "
                  "draft law = target ranking reversed")
    else:
        detail = f"{case.cfg.label()}, {case.drafts} drafts, V={case.vocab_size}"
    return Outcome(
        family, name or case.name, verdict, detail, num_samples=result.num_samples,
        statistic=float(res.statistic), df=int(res.df), pvalue=float(res.pvalue), alpha=opts.alpha,
        test=res.method, power=design_power(law, result.num_samples, opts.alpha, opts.tv), tv=opts.tv,
        cells=_worst_cells(case, result) if rejects else None, seconds=time.perf_counter() - start,
    ), result


# ----------------------------------------------------------------------------------------------------
# Greedy identity
# ----------------------------------------------------------------------------------------------------

def _ragged_batch(g: torch.Generator, b: int, v: int, max_k: int, stochastic: bool):
    k = torch.randint(0, max_k + 1, (b,), generator=g)
    cu = torch.zeros(b + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(k, 0)
    t = int(cu[-1])
    logits = torch.randn(t + b, v, generator=g) * 2
    return k, cu, logits, (torch.softmax(torch.randn(t, v, generator=g), -1) if stochastic else None)


def greedy_expected(logits: torch.Tensor, drafts: torch.Tensor, cu: torch.Tensor) -> list[list[int]]:
    """Each request's tokens under greedy verification: drafts while they equal the row argmax, then the
    argmax of the first mismatching row (or of the bonus row)."""
    argmax = logits.argmax(-1).tolist()
    out = []
    for b in range(cu.numel() - 1):
        lo, hi = int(cu[b]), int(cu[b + 1])
        tokens = []
        for j in range(hi - lo + 1):
            row = lo + b + j
            tokens.append(argmax[row])
            if j == hi - lo or int(drafts[lo + j]) != argmax[row]:
                break
        out.append(tokens)
    return out


def _emitted(res, b: int) -> list[int]:
    n = int(res.num_accepted[b])
    return [int(x) for x in res.output_token_ids[b, : n + 1]]


def _greedy_drafts(g, logits, cu, v) -> torch.Tensor:
    """Half the drafts are the row's argmax (so chains get accepted), a third random, the rest placeholders."""
    b = cu.numel() - 1
    lengths = (cu[1:] - cu[:-1])
    req = torch.repeat_interleave(torch.arange(b), lengths)
    rows = torch.arange(int(cu[-1])) + req
    choice = torch.rand(rows.numel(), generator=g)
    random = torch.randint(0, v, (rows.numel(),), generator=g)
    return torch.where(choice < 0.5, logits[rows].argmax(-1), torch.where(choice < 0.85, random, -1))


def _greedy_outcomes(target: AuditTarget, opts: AuditOptions) -> Iterator[Outcome]:
    g = torch.Generator().manual_seed(23)
    b, v = 96, 11
    for stochastic in (False, True):
        k, cu, logits, q = _ragged_batch(g, b, v, 4, stochastic)
        drafts = _greedy_drafts(g, logits, cu, v)
        expected = greedy_expected(logits, drafts, cu)
        seed = torch.arange(b, dtype=torch.int64) + 1000
        position = torch.randint(0, 1000, (b,), generator=g)
        kind = "stochastic" if stochastic else "deterministic"
        top_k = torch.full((b,), 3, dtype=torch.int32)
        top_p = torch.full((b,), 0.7)
        runs = {
            f"greedy-{kind[:5]}-all-greedy": (torch.zeros(b), None, None, torch.ones(b, dtype=torch.bool)),
            f"greedy-{kind[:5]}-topk-topp-ignored": (torch.zeros(b), top_k, top_p, torch.ones(b, dtype=torch.bool)),
            f"greedy-{kind[:5]}-in-mixed-batch": (torch.where(torch.arange(b) % 3 == 1, 1.0, 0.0), None, None,
                                                   torch.arange(b) % 3 != 1),
        }
        for name, (temperature, tk, tp, greedy_rows) in runs.items():
            if not opts.selected(name, "greedy"):
                continue
            start = time.perf_counter()
            try:
                res = target.verify(logits, drafts, cu, q, temperature, tk, tp, seed, position)
            except Exception as exc:
                yield Outcome("greedy", name, ERROR, _one_line(exc), seconds=time.perf_counter() - start)
                continue
            wrong = [i for i in range(b) if greedy_rows[i] and _emitted(res, i) != expected[i]]
            n_greedy = int(greedy_rows.sum())
            if wrong:
                i = wrong[0]
                detail = (f"{len(wrong)} of {n_greedy} greedy requests differ from the argmax rule; request {i} "
                          f"(k={int(k[i])}) emitted {_emitted(res, i)}, expected {expected[i]}")
                verdict = FAIL
            else:
                detail = f"{n_greedy} greedy requests (k in 0..4, V={v}) token-identical to the argmax rule"
                verdict = PASS
            yield Outcome("greedy", name, verdict, detail, num_samples=n_greedy, seconds=time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------------
# Replay and batch invariance
# ----------------------------------------------------------------------------------------------------

def _mixed_batch(stochastic: bool):
    g = torch.Generator().manual_seed(5 + stochastic)
    b, v = 12, 11
    k, cu, logits, q = _ragged_batch(g, b, v, 4, stochastic)
    drafts = torch.randint(-1 if not stochastic else 0, v, (int(cu[-1]),), generator=g)
    if stochastic:
        drafts = torch.multinomial(q, 1, generator=g).squeeze(1) if q.numel() else drafts
    temperature = torch.where(torch.rand(b, generator=g) < 0.3, 0.0, 0.5 + torch.rand(b, generator=g))
    top_k = torch.where(torch.rand(b, generator=g) < 0.5, 4, 0).to(torch.int32)
    top_p = torch.where(torch.rand(b, generator=g) < 0.5, 0.8, 1.0)
    seed = torch.randint(0, 2**40, (b,), generator=g)
    position = torch.randint(0, 1000, (b,), generator=g)
    return k, cu, logits, drafts, q, temperature, top_k, top_p, seed, position


def _sub_batch(full, idx: list[int]):
    k, cu, logits, drafts, q, temperature, top_k, top_p, seed, position = full
    rows, draft_rows = [], []
    for i in idx:
        lo, hi = int(cu[i]), int(cu[i + 1])
        rows += list(range(lo + i, hi + i + 1))
        draft_rows += list(range(lo, hi))
    sub_k = k[idx]
    sub_cu = torch.zeros(len(idx) + 1, dtype=torch.int64)
    sub_cu[1:] = torch.cumsum(sub_k, 0)
    dr = torch.tensor(draft_rows, dtype=torch.int64)
    return (sub_k, sub_cu, logits[rows], drafts[dr], None if q is None else q[dr], temperature[idx], top_k[idx],
            top_p[idx], seed[idx], position[idx])


def _call(target: AuditTarget, batch):
    _, cu, logits, drafts, q, temperature, top_k, top_p, seed, position = batch
    return target.verify(logits, drafts, cu, q, temperature, top_k, top_p, seed, position)


def _batch_outcomes(target: AuditTarget, opts: AuditOptions) -> Iterator[Outcome]:
    for stochastic in (False, True):
        kind = "stoch" if stochastic else "deter"
        names = [n for n in (f"replay-{kind}", f"alone-vs-batch-{kind}", f"shuffled-sub-batches-{kind}")
                 if opts.selected(n, "batch")]
        if not names:
            continue
        if "per_request_seed" not in target.supports:
            for name in names:
                yield Outcome("batch", name, NA, "the verifier has no per-request seed")
            continue
        full = _mixed_batch(stochastic)
        b = full[0].numel()
        start = time.perf_counter()
        try:
            ref = _call(target, full)
            reference = [_emitted(ref, i) for i in range(b)]
        except Exception as exc:
            for name in names:
                yield Outcome("batch", name, ERROR, _one_line(exc))
            continue
        g = torch.Generator().manual_seed(9)
        shuffled = [torch.randperm(b, generator=g)[: 3 + 3 * t].tolist() for t in range(4)]
        trials = {
            f"replay-{kind}": [list(range(b))],
            f"alone-vs-batch-{kind}": [[i] for i in range(b)],
            f"shuffled-sub-batches-{kind}": shuffled,
        }
        for name, subsets in trials.items():
            if name not in names:
                continue
            try:
                diffs = []
                for idx in subsets:
                    res = _call(target, _sub_batch(full, idx))
                    diffs += [(i, _emitted(res, j)) for j, i in enumerate(idx) if _emitted(res, j) != reference[i]]
            except Exception as exc:
                yield Outcome("batch", name, ERROR, _one_line(exc), seconds=time.perf_counter() - start)
                continue
            if diffs:
                i, got = diffs[0]
                detail = (f"{len(diffs)} request outputs changed; request {i} emitted {got}, in the full batch "
                          f"{reference[i]}")
            else:
                detail = f"{sum(len(s) for s in subsets)} request outputs identical to the full batch's ({b} requests)"
            yield Outcome("batch", name, FAIL if diffs else PASS, detail, num_samples=sum(len(s) for s in subsets),
                          seconds=time.perf_counter() - start)
            start = time.perf_counter()


# ----------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------

POSITIONAL = ("target_logits", "draft_token_ids", "cu_num_draft_tokens", "draft_probs", "temperature", "top_k",
              "top_p", "seed", "position")


def _bad_input_outcomes(target: AuditTarget, opts: AuditOptions) -> Iterator[Outcome]:
    for row, hostile in _bad_input_rows():
        name = f"{row.argument}: {row.what}"
        if not opts.selected(name, "bad-input"):
            continue
        applies = "validation" in target.supports or (row.kind == "value" and row.argument in target.value_arguments)
        if not applies:
            yield Outcome("bad-input", name, NA, "the adapter cannot hand this input to the peer unchanged")
            continue
        kwargs = valid_call()
        row.mutate(kwargs)
        start = time.perf_counter()
        try:
            res = target.verify(*(kwargs[a] for a in POSITIONAL))
        except (ValueError, TypeError) as exc:
            named = row.argument in str(exc)
            verdict = PASS if named or "validation" not in target.supports else FAIL
            why = "raised, naming the argument" if named else "raised without naming the argument"
            yield Outcome("bad-input", name, verdict, f"{why}: {_one_line(exc)}", seconds=time.perf_counter() - start)
            continue
        except Exception as exc:
            yield Outcome("bad-input", name, FAIL, f"raised {_one_line(exc)} (not ValueError / TypeError)",
                          seconds=time.perf_counter() - start)
            continue
        out = res.output_token_ids.to(torch.int64)
        vocab = kwargs["target_logits"].shape[-1] if hasattr(kwargs["target_logits"], "shape") else 0
        bad_ids = out[(out != -1) & ((out < 0) | (out >= vocab))].tolist()
        if hostile:
            verdict = FAIL if bad_ids else PASS
            detail = (f"emitted ids outside [0, {vocab}): {bad_ids[:6]}" if bad_ids
                      else f"returned; every emitted id in [0, {vocab})")
        else:
            verdict = FAIL
            detail = "accepted silently (no ValueError / TypeError)" + (
                f"; emitted ids outside [0, {vocab}): {bad_ids[:6]}" if bad_ids else "")
        yield Outcome("bad-input", name, verdict, detail, seconds=time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------------
# Mutants through the target's adapter path
# ----------------------------------------------------------------------------------------------------

def _mutant_outcomes(target: AuditTarget, opts: AuditOptions) -> Iterator[Outcome]:
    for bug in MUTANTS:
        if not opts.selected(bug, "mutants"):
            continue
        case = law_case_by_name(MUTANT_CASES[bug])
        if target.mutant is None:
            yield Outcome("mutants", bug, NA, "the target has no way to plant a bug in its adapter path")
            continue
        check = _sized(law_check_for(case), opts)
        try:
            verify = target.mutant(bug)
        except Exception as exc:
            yield Outcome("mutants", bug, ERROR, _one_line(exc))
            continue
        if bug in DRAFT_STREAMS and not hasattr(verify, "draft_stream"):
            verify = _drafting_on(verify, DRAFT_STREAMS[bug])  # the adapter dropped the bug's drafting half
        design = dataclasses.replace(opts, tv=opts.mutant_tv)
        outcome, result = _run_law("mutants", case, check, verify, design, expect_reject=True, name=bug)
        outcome.detail = f"case {case.name} ({outcome.detail})"
        if outcome.verdict == MISSED and target.mutant_base is not None:
            # Same path, same seeds, the unmutated verification: identical counts mean the bug is inert here.
            base, base_result = _run_law("mutants", case, check, target.mutant_base, design, name=bug)
            if base_result is None:
                outcome.detail += f"; the unmutated twin of this path did not run ({base.detail})"
            elif torch.equal(base_result.observed, result.observed):
                outcome.verdict = INERT
                outcome.detail += "; the unmutated path emits the very same counts: the bug cannot act here"
            outcome.seconds += base.seconds
        yield outcome


# ----------------------------------------------------------------------------------------------------
# Narrow design (V = 16, reversed draft ranking)
# ----------------------------------------------------------------------------------------------------

def _sized(check, opts: AuditOptions):
    """``check``, with the narrow cases run at ``opts.narrow_trials`` trials when that is set."""
    if check is not check_narrow_law or opts.narrow_trials is None:
        return check
    return lambda verify, case, alpha, tv, power, looks=False: check_narrow_law(verify, case, alpha, tv, power,
                                                                                num_samples=opts.narrow_trials)


def _drafting_on(verify, stream: int):
    """``verify`` in a system that drafts on Philox stream ``stream`` (``chain_law.draft_stream`` reads it)."""
    def system(*args, **kwargs):
        return verify(*args, **kwargs)

    system.draft_stream = stream
    return system


def _narrow_outcomes(target: AuditTarget, opts: AuditOptions) -> Iterator[Outcome]:
    for case in NARROW_CASES:
        if opts.selected(case.name, "narrow"):
            yield _run_law("narrow", case, _sized(check_narrow_law, opts), target.verify, opts)[0]


RUNNERS: dict[str, Callable[[AuditTarget, AuditOptions], Iterator[Outcome]]] = {
    "first-token": lambda t, o: _law_outcomes(t, "first-token", o),
    "sequence": lambda t, o: _law_outcomes(t, "sequence", o),
    "greedy": _greedy_outcomes,
    "batch": _batch_outcomes,
    "bad-input": _bad_input_outcomes,
    "mutants": _mutant_outcomes,
    "narrow": _narrow_outcomes,
}


def _bad_input_rows():
    return [(row, False) for row in BAD_ARGUMENTS if row.argument in POSITIONAL] + [(r, True) for r in HOSTILE_VALUES]


def case_names(family: str, target: AuditTarget | None = None) -> list[str]:
    """Every case name of ``family`` (of ``target``'s system where it has one), in run order, without running
    anything."""
    if target is not None and target.system is not None:
        return target.system.case_names(family)
    if family in ("first-token", "sequence"):
        kind = FirstTokenCase if family == "first-token" else SequenceCase
        return [c.name for c in LAW_CASES if isinstance(c, kind)]
    if family == "greedy":
        return [f"greedy-{kind}-{what}" for kind in ("deter", "stoch")
                for what in ("all-greedy", "topk-topp-ignored", "in-mixed-batch")]
    if family == "batch":
        return [f"{what}-{kind}" for kind in ("deter", "stoch")
                for what in ("replay", "alone-vs-batch", "shuffled-sub-batches")]
    if family == "bad-input":
        return [f"{row.argument}: {row.what}" for row, _ in _bad_input_rows()]
    if family == "mutants":
        return list(MUTANTS)
    if family == "narrow":
        return [c.name for c in NARROW_CASES]
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def run_family(target: AuditTarget, family: str, opts: AuditOptions) -> Iterator[Outcome]:
    """Yield the outcomes of one family's cases for ``target`` (which must be runnable here); an end-to-end
    system runs its own cases."""
    if target.system is not None:
        return target.system.run(family, opts)
    if family not in RUNNERS:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return RUNNERS[family](target, opts)
