"""Adversarial ``verify_chain`` / ``verify_tree`` calls with validation off, and what every backend owes them.

``validate=False`` skips every check that reads tensor values (for CUDA-graph capture), so the kernels meet
whatever a caller's bug produces: ``cu`` entries that decrease, go negative or run past the end, parents
pointing anywhere, token ids and output widths that do not fit, garbage temperatures, top-k and top-p. DESIGN
promises that no backend ever crashes, hangs, reads out of bounds or emits a token outside [0, V) on them.

:func:`chain_call` / :func:`tree_call` draw such calls (hypothesis), :func:`outcomes` runs them on every
backend and :func:`problems` lists what went wrong:

- ``out of range``: an output token outside [-1, V), an accepted count outside [0, width], an accepted node
  outside [-1, N), or a result of the wrong shape or dtype;
- ``out-of-bounds read``: the logits are a slice of a larger buffer whose guard rows put all their mass on a
  token (V - 1) that every real row bans, so a read of a neighbouring row shows up as that token;
- ``error``: anything but the one error allowed: the CPU backend checks a host-resident ``cu`` for free and
  raises ValueError when it is inconsistent (a crash or hang kills the run, which counts too);
- ``disagreement``: where the clamping rules are defined (a non-decreasing ``cu``, sane sampling
  parameters; ``reference.chain.chain_spans`` / ``reference.tree.tree_spans``), backends that answer must
  emit identical tokens.

Backend "raw" calls the raw torch op (``torch.ops.specdec.verify_chain`` / ``verify_tree``) with the op's
dtypes and no Python validation at all: ValueError is its only allowed error too.

``python -m tests.harness.fuzz --examples 2000`` runs a longer campaign and prints the counts per
category (the CI part in ``tests/kernels/test_unvalidated.py`` is small and seeded).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from specdec_kernels import api

__all__ = ["FuzzCall", "chain_call", "tree_call", "outcomes", "problems", "GUARD_ROWS"]

GUARD_ROWS = 4
GUARD_LOGIT = 1.0e4
INT64_EXTREMES = (-(2**63), -(2**62), -99999, 2**62, 2**63 - 1)
CU_KINDS = ("valid", "valid", "monotone", "garbage", "extreme")  # valid twice: most calls stay comparable


@dataclass
class FuzzCall:
    """One drawn call: keyword arguments of ``verify_chain`` / ``verify_tree`` (backend excluded)."""

    op: str  # "chain" | "tree"
    kwargs: dict
    vocab: int
    num_rows: int
    width: int | None  # max_draft_len / max_depth as passed (None: computed)
    comparable: bool  # the clamping rules define one answer: backends must agree
    guard: int | None  # the token only guard rows can produce (None when V = 1)
    tags: dict = field(default_factory=dict)  # what the draw chose, for the campaign's counts


def _guarded_logits(rows: int, vocab: int, g: torch.Generator, dtype: torch.dtype, nonfinite: bool):
    """Logits [rows, V] as the middle of a buffer with GUARD_ROWS guard rows on each side."""
    logits = torch.randn(rows, vocab, generator=g) * 2
    if nonfinite and rows:
        u = torch.rand(rows, vocab, generator=g)
        logits = torch.where(u < 0.1, float("nan"), logits)
        logits = torch.where((u >= 0.1) & (u < 0.2), float("inf"), logits)
        logits = torch.where((u >= 0.2) & (u < 0.3), float("-inf"), logits)
    guard = None
    if vocab >= 2:
        guard = vocab - 1
        logits[:, guard] = float("-inf")
    buffer = torch.full((rows + 2 * GUARD_ROWS, vocab), -GUARD_LOGIT)
    if guard is not None:
        buffer[:, guard] = GUARD_LOGIT
    buffer[GUARD_ROWS : GUARD_ROWS + rows] = logits
    buffer = buffer.to(dtype)
    return buffer[GUARD_ROWS : GUARD_ROWS + rows], guard


def _ints(draw, n: int, lo: int, hi: int, g: torch.Generator, extremes: bool) -> torch.Tensor:
    x = torch.randint(lo, hi + 1, (n,), generator=g) if n else torch.zeros(0, dtype=torch.int64)
    if extremes and n:
        for i in draw(st.lists(st.integers(0, n - 1), max_size=2)):
            x[i] = draw(st.sampled_from(INT64_EXTREMES))
    return x


def _cu(draw, kind: str, num_reqs: int, total: int, g: torch.Generator, strict: bool) -> tuple[torch.Tensor, str]:
    """cu [B + 1] of the given kind: valid, monotone (non-decreasing, any range), garbage, extreme; returns
    (cu, the kind drawn: "valid" falls back to "monotone" when no valid cu exists)."""
    if kind == "valid":
        low = 1 if strict else 0  # trees: every request has its root
        extra = total - low * num_reqs
        if num_reqs == 0 or extra < 0:
            kind = "monotone"
        else:
            cuts = torch.randint(0, extra + 1, (num_reqs - 1,), generator=g).sort().values
            lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([extra])])) + low
            return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)]), kind
    if kind == "monotone":
        return torch.randint(-3, total + 4, (num_reqs + 1,), generator=g).sort().values, kind
    return _ints(draw, num_reqs + 1, -total - 5, 2 * total + 5, g, extremes=kind == "extreme"), kind


def _draft_probs(draw, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Normalised random draft distributions; sometimes a row of NaN, inf, negative or zero entries.

    A negative probability is garbage like a negative temperature (the CPU residual search bounds a block's
    residual by the target's mass there, which a negative q breaks): such calls owe memory safety only, not
    agreement in chains (:func:`_probs_sane`)."""
    probs = torch.rand(rows, vocab, generator=g)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-30)
    if rows and draw(st.booleans()):
        probs[draw(st.integers(0, rows - 1))] = draw(st.sampled_from([float("nan"), float("inf"), -0.5, 0.0]))
    return probs


def _probs_sane(probs: torch.Tensor | None) -> bool:
    return probs is None or not bool((probs < 0).any())


def _sampling(draw, num_reqs: int, vocab: int, g: torch.Generator) -> tuple[dict, bool]:
    """temperature / top_k / top_p / seed / position, sane or garbage; returns (kwargs, sane)."""
    sane = draw(st.sampled_from([True, True, False]))
    temperature = torch.rand(num_reqs, generator=g) * 2
    temperature = torch.where(torch.rand(num_reqs, generator=g) < 0.3, 0.0, temperature)
    kw: dict = {"seed": torch.randint(-(2**63), 2**63 - 1, (num_reqs,), generator=g),
                "position": torch.randint(0, 1 << 20, (num_reqs,), generator=g)}
    if draw(st.booleans()):
        kw["top_k"] = torch.randint(0, vocab + 2, (num_reqs,), generator=g)
        if draw(st.booleans()) and num_reqs:  # int64 values >= V and past int32: all mean "disabled"
            kw["top_k"][0] = draw(st.sampled_from([2**31, 2**32 + 3, 2**40]))
    if draw(st.booleans()):
        kw["top_p"] = torch.rand(num_reqs, generator=g) * 0.9 + 0.1
    if not sane and num_reqs:
        bad = torch.tensor([-1.0, float("nan"), float("inf"), -float("inf"), 1e-30, 1e30])
        temperature[0] = bad[draw(st.integers(0, len(bad) - 1))]
        if "top_k" in kw:
            kw["top_k"][-1] = draw(st.sampled_from([-1, -(2**31), -(2**63)]))
        if "top_p" in kw:
            kw["top_p"][-1] = draw(st.sampled_from([0.0, -0.5, 1.5, float("nan"), float("inf")]))
        kw["position"][-1] = draw(st.sampled_from([-1, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -(2**63)]))
    kw["temperature"] = temperature
    return kw, sane


def _guard_holds(kw: dict) -> bool:
    """A negative temperature turns the banned guard token's -inf into +inf: the guard proves nothing."""
    return not bool((kw["temperature"] < 0).any())


@st.composite
def chain_call(draw, max_batch: int = 4, max_drafts: int = 8, vocab_sizes: tuple[int, ...] = (1, 2, 5, 16)) -> FuzzCall:
    """A ``verify_chain(..., validate=False)`` call with a possibly inconsistent cu, ids and width."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    vocab = draw(st.sampled_from(vocab_sizes))
    num_reqs = draw(st.integers(0, max_batch))
    num_drafts = draw(st.integers(0, max_drafts))
    cu, cu_kind = _cu(draw, draw(st.sampled_from(CU_KINDS)), num_reqs, num_drafts, g, strict=False)
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16]))
    logits, guard = _guarded_logits(num_drafts + num_reqs, vocab, g, dtype, draw(st.booleans()))
    ids = _ints(draw, num_drafts, -3, vocab + 2, g, extremes=draw(st.booleans()))
    kw, sane = _sampling(draw, num_reqs, vocab, g)
    width = draw(st.one_of(st.none(), st.integers(0, max_drafts + 2)))
    if width is None and cu_kind in ("garbage", "extreme"):
        width = draw(st.integers(0, max_drafts + 2))  # a computed width follows the clamped lengths anyway
    probs = None
    if draw(st.booleans()):
        probs = _draft_probs(draw, num_drafts, vocab, g)
    kw.update(target_logits=logits, draft_token_ids=ids, cu_num_draft_tokens=cu, draft_probs=probs,
              max_draft_len=width, validate=False)
    sane = sane and _probs_sane(probs)
    return FuzzCall("chain", kw, vocab, num_drafts + num_reqs, width, cu_kind in ("valid", "monotone") and sane,
                    guard if _guard_holds(kw) else None, {"cu": cu_kind, "sampling": "sane" if sane else "garbage"})


@st.composite
def tree_call(draw, max_batch: int = 4, max_nodes: int = 10, vocab_sizes: tuple[int, ...] = (1, 2, 5, 16)) -> FuzzCall:
    """A ``verify_tree(..., validate=False)`` call with a possibly inconsistent cu, parents, ids and depth."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    vocab = draw(st.sampled_from(vocab_sizes))
    num_reqs = draw(st.integers(0, max_batch))
    num_nodes = draw(st.integers(0, max_nodes))
    cu, cu_kind = _cu(draw, draw(st.sampled_from(CU_KINDS)), num_reqs, num_nodes, g, strict=True)
    parent_kind = draw(st.sampled_from(["tree", "garbage"])) if cu_kind == "valid" and num_reqs else "garbage"
    if parent_kind == "tree":  # each non-root node's parent a random earlier node of its request
        local = torch.arange(num_nodes) - cu[:-1][torch.searchsorted(cu[1:], torch.arange(num_nodes), right=True)]
        parent = torch.where(local == 0, -1, (torch.rand(num_nodes, generator=g) * local).long())
    else:
        parent = _ints(draw, num_nodes, -3, max_nodes + 2, g, extremes=draw(st.booleans()))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16]))
    logits, guard = _guarded_logits(num_nodes, vocab, g, dtype, draw(st.booleans()))
    ids = _ints(draw, num_nodes, -3, vocab + 2, g, extremes=draw(st.booleans()))
    kw, sane = _sampling(draw, num_reqs, vocab, g)
    width = draw(st.one_of(st.none(), st.integers(0, max_nodes + 1)))
    probs = None
    sibling = "iid"
    if draw(st.booleans()):
        probs = _draft_probs(draw, num_nodes, vocab, g)
        sibling = draw(st.sampled_from(["iid", "without_replacement"]))
    kw.update(target_logits=logits, node_token_ids=ids, parent=parent, cu_num_nodes=cu, draft_probs=probs,
              sibling_sampling=sibling, max_depth=width, validate=False)
    return FuzzCall("tree", kw, vocab, num_nodes, width, cu_kind in ("valid", "monotone") and sane,
                    guard if _guard_holds(kw) else None,
                    {"cu": cu_kind, "parent": parent_kind, "sampling": "sane" if sane else "garbage"})


def on_device(call: FuzzCall, device: torch.device | str) -> dict:
    """The call's keyword arguments with every tensor on ``device`` (the logits' guard rows included)."""
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in call.kwargs.items()}
    logits = call.kwargs["target_logits"]
    buffer = logits._base if logits._base is not None else logits
    start = logits.storage_offset() // max(logits.shape[1], 1)
    kwargs["target_logits"] = buffer.to(device)[start : start + logits.shape[0]]
    return kwargs


def raw_op(call: FuzzCall, kwargs: dict):
    """The call through the raw torch op (``torch.ops.specdec.*``: no Python validation at all), with the
    dtypes the op takes (int64 ids, int32 top-k, float32 temperature / top-p: garbage values included)."""
    from specdec_kernels import native
    from specdec_kernels.reference.chain import ChainResult
    from specdec_kernels.reference.tree import TreeResult

    native.available()  # loading the extension registers the ops
    cu = kwargs["cu_num_draft_tokens" if call.op == "chain" else "cu_num_nodes"]
    per_request = torch.zeros(max(cu.numel() - 1, 0), dtype=torch.int64, device=cu.device)  # API defaults
    given = {name: kwargs.get(name) if kwargs.get(name) is not None else default
             for name, default in (("temperature", per_request), ("seed", per_request), ("position", per_request),
                                   ("top_k", None), ("top_p", None), ("draft_probs", None))}
    as_dtype = {"temperature": torch.float32, "seed": torch.int64, "position": torch.int64, "top_k": torch.int32,
                "top_p": torch.float32, "draft_probs": torch.float32}
    given = {name: None if value is None else value.to(as_dtype[name]) for name, value in given.items()}
    sampling = tuple(given[name] for name in ("draft_probs", "temperature", "top_k", "top_p", "seed", "position"))
    if call.op == "chain":
        out = torch.ops.specdec.verify_chain(kwargs["target_logits"], kwargs["draft_token_ids"].long(),
                                             kwargs["cu_num_draft_tokens"].long(), *sampling, call.width or 0)
        return ChainResult(*out)
    out = torch.ops.specdec.verify_tree(kwargs["target_logits"], kwargs["node_token_ids"].long(),
                                        kwargs["parent"].long(), kwargs["cu_num_nodes"].long(), *sampling,
                                        kwargs.get("sibling_sampling", "iid"), call.width or 0)
    return TreeResult(*out)


def outcomes(call: FuzzCall, backends: list[str], device: torch.device | str = "cpu") -> dict[str, object]:
    """Each backend's result (on the host), or the exception it raised. Backend "raw" is the raw torch op
    of the device's native kernels."""
    fn = api.verify_chain if call.op == "chain" else api.verify_tree
    kwargs = on_device(call, device)
    results: dict[str, object] = {}
    for backend in backends:
        try:
            res = raw_op(call, kwargs) if backend == "raw" else fn(**kwargs, backend=backend)
            results[backend] = type(res)(*(t.cpu() for t in res))
        except Exception as exc:  # recorded, judged by problems()
            results[backend] = exc
    return results


def problems(call: FuzzCall, results: dict[str, object]) -> list[str]:
    """What the results owe the call (module docstring); empty when everything holds."""
    found = []
    answers = {}
    num_reqs = call.kwargs["cu_num_draft_tokens" if call.op == "chain" else "cu_num_nodes"].numel() - 1
    for backend, res in results.items():
        if isinstance(res, Exception):
            if not (backend in ("cpu", "raw") and isinstance(res, ValueError)):
                found.append(f"error: {backend}: {type(res).__name__}: {str(res)[:200]}")
            continue
        out, acc = res.output_token_ids, res.num_accepted
        expected_width = call.width if backend != "raw" else (call.width or 0)
        width = out.shape[1] - 1 if out.dim() == 2 else -1
        if (out.dtype, acc.dtype) != (torch.int32, torch.int32) or tuple(out.shape)[:1] != (num_reqs,) \
                or (expected_width is not None and width != expected_width):
            found.append(f"out of range: {backend}: shape/dtype {tuple(out.shape)} {out.dtype}")
            continue
        if ((out < -1) | (out >= call.vocab)).any() or ((acc < 0) | (acc > width)).any():
            found.append(f"out of range: {backend}: tokens {out.tolist()} accepted {acc.tolist()}")
        if call.op == "tree":
            nodes = res.accepted_nodes
            if tuple(nodes.shape) != tuple(out.shape) or ((nodes < -1) | (nodes >= max(call.num_rows, 1))).any():
                found.append(f"out of range: {backend}: accepted nodes {nodes.tolist()}")
        if call.guard is not None and (out == call.guard).any():
            found.append(f"out-of-bounds read: {backend}: guard token {call.guard} emitted: {out.tolist()}")
        if backend != "raw" or call.width is not None:  # the raw op's width 0 stands in for None
            answers[backend] = json.dumps([r.tolist() for r in res])
    if call.comparable and len(set(answers.values())) > 1:
        found.append(f"disagreement: {answers}")
    return found


def default_backends(device: str = "cpu") -> list[str]:
    """Every backend usable for ``device`` tensors, plus "raw" when the native kernels exist."""
    backends = api.available_backends(device)
    return backends + (["raw"] if device in backends else [])


def category(problem: str) -> str:
    return problem.split(":", 1)[0]


def campaign(op: str, examples: int, backends: list[str], seed: int, hang_s: float) -> dict:
    """Run ``examples`` drawn calls of ``op`` on ``backends``; counts per category and per tag."""
    stats: Counter = Counter()
    first: dict[str, str] = {}
    strategy = chain_call() if op == "chain" else tree_call()

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(call=strategy)
    def body(call: FuzzCall) -> None:
        faulthandler.dump_traceback_later(hang_s, exit=True)  # a hang ends the run with a traceback
        results = outcomes(call, backends)
        faulthandler.cancel_dump_traceback_later()
        stats["calls"] += 1
        stats["backend calls"] += len(results)
        for backend in ("cpu", "raw"):
            stats[f"{backend} ValueError (inconsistent cu)"] += isinstance(results.get(backend), ValueError)
        stats["comparable"] += call.comparable
        for key, value in call.tags.items():
            stats[f"{key}={value}"] += 1
        for problem in problems(call, results):
            stats[category(problem)] += 1
            first.setdefault(category(problem), problem)

    start = time.perf_counter()
    hypothesis_seed(seed)(body)()
    return {"op": op, "examples": examples, "backends": backends, "seconds": round(time.perf_counter() - start, 1),
            "counts": dict(stats), "first": first}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fuzz verify_chain / verify_tree with validate=False on every "
                                                 "backend; prints counts per category (JSON).")
    parser.add_argument("--examples", type=int, default=500, help="drawn calls per op")
    parser.add_argument("--ops", default="chain,tree")
    parser.add_argument("--backends", default=",".join(default_backends()),
                        help="comma-separated (default: every backend usable here, and 'raw': the raw CPU op)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-s", type=float, default=120.0, help="a call slower than this counts as a hang")
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    report = [campaign(op, args.examples, backends, args.seed, args.hang_s) for op in args.ops.split(",")]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
