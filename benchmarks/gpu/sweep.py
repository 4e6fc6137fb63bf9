"""The device run's chain sweep: ours against FlashInfer, vLLM V1 / V2 and plain torch, interleaved.

    python -m benchmarks.gpu.sweep --out $OUT/chain_sweep.csv            # GPU: the grid below, in order
    python -m benchmarks.gpu.sweep --device cpu --out /tmp/dry.csv       # CPU dry run: tiny shapes

Providers (a provider that cannot run a case is written with ``status = skipped: <reason>``):

- ``cuda`` / ``triton`` / ``cpu`` / ``reference``: ``specdec_kernels.verify_chain`` (``cpu`` and
  ``reference`` on CPU only; ``triton`` on CPU runs interpreted, dry run only);
- ``flashinfer``: FlashInfer's ``OnlineSoftmax`` over the float32 logits with the per-row temperature, then
  ``ChainSpeculativeSampling`` (our extension over its headers, ``flashinfer_ext``), as vLLM / SGLang call
  ``flashinfer.sampling.softmax`` + ``chain_speculative_sampling``; ``flashinfer_kernel``: the chain kernel
  alone on precomputed float32 probabilities (its bytes are those float32 rows). Deterministic drafts get
  one-hot draft probabilities (what that API needs); no top-k / top-p, no greedy requests;
- ``vllm_v2``: vLLM 0.33.0 V2's step as its ``RejectionSampler._verify`` runs it: the sampler's float32
  copy of the logits and its ``apply_temperature`` kernel (random requests), then ``rejection_sample``
  (softmax, acceptance, recovery and bonus in its kernels); no top-k / top-p; ``vllm_v1``: V1 ``rejection_sample`` as ``RejectionSampler.forward`` calls
  it: draft rows gathered, float32, divided by the temperature, then its softmax and Triton kernels, the bonus
  ids given (V1 samples them in its ``Sampler``, not timed); both from the carried sources (``peers``);
- ``torch`` / ``torch_compile``: ``bench_native_cpu.torch_verify`` (argmax; Gumbel race; softmax + coins +
  residual race), eager and ``torch.compile``d (``dynamic=True``: compiled once per mode, in the warm-up of its first case);
- ``read``: ``torch.sum`` over the case's logits, timed in the same rounds: the read bandwidth each
  provider's ``read_fraction`` is measured against.

Timing: per case every provider is built and warmed up (compiles land there), then ``--rounds`` rounds
time each provider's ``--inner`` back-to-back calls with CUDA events (``time.perf_counter`` on CPU), the
provider order reversed every other round; min / median / max of the per-call times. ``read_bytes``: what a
verifier must read given the case's outcome (``roofline.chain_min_bytes``: logit rows up to each first
rejection, their draft-probability rows, ids and outputs; float32 probability rows for
``flashinfer_kernel``). Rows are flushed one by one: a timeout keeps every finished case.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

import specdec_kernels as sk

from ..bench_chain import ChainCase, ChainInputs, Skip, make_inputs, vllm_v2_step
from ..bench_native_cpu import torch_verify
from ..common import CsvWriter, OneLineParser, provenance
from ..roofline import chain_min_bytes

PROVIDERS = ("cuda", "triton", "cpu", "reference", "flashinfer", "flashinfer_kernel", "vllm_v2", "vllm_v1",
             "torch", "torch_compile", "read")
CASE_COLUMNS = ("case", "batch", "k", "vocab", "dtype", "sampling", "drafts", "top_k", "top_p")
RESULT_COLUMNS = ("max_ms", "inner", "read_bytes", "achieved_gbs", "read_gbs", "read_fraction", "mean_accepted",
                  "command")


# ---------------------------------------------------------------------------------------------- grid
def gpu_grid() -> list[tuple[str, ChainCase]]:
    """(label, case) in priority order: FlashInfer's published points, the main bf16 grid, then the rest."""
    cases = [("flashinfer_point", ChainCase(16, 5, 32000, "float32", "random", "stochastic")),
             ("flashinfer_point", ChainCase(32, 8, 128256, "float32", "random", "stochastic"))]
    cases += [("main", ChainCase(b, k, 151936, "bfloat16", "random", "stochastic"))
              for b in (1, 16, 32, 64, 256) for k in (1, 3, 5, 8)]
    cases += [("vocab_fp32", ChainCase(b, k, v, "float32", "random", "stochastic"))
              for v in (32000, 128256) for b in (1, 16, 64, 256) for k in (3, 5)]
    cases += [("greedy", ChainCase(b, k, 151936, "bfloat16", "greedy", "deterministic")) for b in (1, 16, 64, 256)
              for k in (3, 5)]
    cases += [("deterministic", ChainCase(b, k, 151936, "bfloat16", "random", "deterministic"))
              for b in (1, 16, 64, 256) for k in (3, 5)]
    cases += [("top_k_top_p", ChainCase(b, k, 151936, "bfloat16", "random", "stochastic", top_k=50, top_p=0.9))
              for b in (1, 16, 64, 256) for k in (3, 5)]
    return cases


def cpu_grid() -> list[tuple[str, ChainCase]]:
    """The same kinds of case at tiny shapes, for the dry run (seconds on a CPU)."""
    return [("flashinfer_point", ChainCase(2, 3, 512, "float32", "random", "stochastic")),
            ("main", ChainCase(2, 2, 512, "bfloat16", "random", "stochastic")),
            ("greedy", ChainCase(2, 2, 512, "bfloat16", "greedy", "deterministic")),
            ("top_k_top_p", ChainCase(2, 2, 512, "bfloat16", "random", "stochastic", top_k=50, top_p=0.9))]


# ------------------------------------------------------------------------------------------ providers
def _ours(backend: str) -> Callable[[ChainInputs], Callable[[], object]]:
    def build(inputs: ChainInputs) -> Callable[[], object]:
        device = inputs.target_logits.device
        if backend in ("cpu", "reference") and device.type == "cuda":
            raise Skip(f"{backend} is timed in the CPU dry run only")
        if backend not in sk.available_backends(device):
            hint = " (TRITON_INTERPRET=1 on CPU)" if backend == "triton" else ""
            raise Skip(f"backend {backend!r} not available on {device.type}{hint}")
        kwargs = inputs.api_kwargs()
        return lambda: sk.verify_chain(**kwargs, backend=backend)

    return build


def _row_temperature(inputs: ChainInputs) -> torch.Tensor:
    """Per logit row: the request's temperature (1 for greedy requests: FlashInfer / V1 then take the
    argmax path or one-hot probabilities)."""
    t = torch.where(inputs.temperature == 0, torch.ones_like(inputs.temperature), inputs.temperature)
    return t.repeat_interleave(inputs.case.k + 1).contiguous()


def _no_top_k_top_p(inputs: ChainInputs, who: str) -> None:
    if inputs.case.top_k or inputs.case.top_p < 1.0:
        raise Skip(f"{who} applies no top-k / top-p")


_FLASHINFER: list = []


def _flashinfer_module():
    if not _FLASHINFER:
        from .flashinfer_ext import ExtensionUnavailable, load

        try:
            _FLASHINFER.append(load())
        except ExtensionUnavailable as exc:
            _FLASHINFER.append(exc)
    if isinstance(_FLASHINFER[0], Exception):
        raise Skip(f"flashinfer: {_FLASHINFER[0]}")
    return _FLASHINFER[0]


def _flashinfer(kernel_only: bool) -> Callable[[ChainInputs], Callable[[], object]]:
    def build(inputs: ChainInputs) -> Callable[[], object]:
        if inputs.target_logits.device.type != "cuda":
            raise Skip("FlashInfer's kernels need CUDA")
        _no_top_k_top_p(inputs, "FlashInfer chain_speculative_sampling")
        if inputs.case.sampling == "greedy":
            raise Skip("FlashInfer's chain kernel samples; greedy verification (an argmax match) is not its job")
        fi = _flashinfer_module()
        b, k, v = inputs.case.batch, inputs.case.k, inputs.case.vocab
        device = inputs.target_logits.device
        q = (torch.nn.functional.one_hot(inputs.draft_token_ids, v).float() if inputs.draft_probs is None
             else inputs.draft_probs).view(b, k, v).contiguous()
        ids = inputs.draft_token_ids.to(torch.int32).view(b, k).contiguous()
        temperature = _row_temperature(inputs)
        workspace = torch.empty(1 << 20, dtype=torch.uint8, device=device)
        probs = torch.empty(b * (k + 1), v, dtype=torch.float32, device=device)
        out = torch.empty(b, k + 1, dtype=torch.int32, device=device)
        accepted, emitted = (torch.zeros(b, dtype=torch.int32, device=device) for _ in range(2))
        seed, offset = inputs.seed.contiguous(), torch.zeros_like(inputs.seed)
        logits = inputs.target_logits

        def chain():
            fi.chain_speculative_sampling(q, ids, probs.view(b, k + 1, v), out, accepted, emitted, seed, offset, True)
            return out

        if kernel_only:
            fi.softmax(logits.float().contiguous(), temperature, probs, workspace, True)
            return chain

        def step():
            fi.softmax(logits.float().contiguous(), temperature, probs, workspace, True)
            return chain()

        return step

    return build


_VLLM: dict[str, object] = {}


def _vllm_fn(version: str):
    if version not in _VLLM:
        from . import peers

        try:
            _VLLM[version] = peers.load_v2() if version == "v2" else peers.load_v1()
        except peers.PeerUnavailable as exc:
            _VLLM[version] = exc
    if isinstance(_VLLM[version], Exception):
        raise Skip(f"vllm {version}: {_VLLM[version]}")
    return _VLLM[version]


def _vllm_v2(inputs: ChainInputs) -> Callable[[], object]:
    v2 = _vllm_fn("v2")  # first: a peer that is not carried says so on every case
    _no_top_k_top_p(inputs, "vLLM V2 rejection_sample")
    return vllm_v2_step(inputs, v2.rejection_sample, v2.apply_temperature)


def _vllm_v1(inputs: ChainInputs) -> Callable[[], object]:
    rejection_sample = _vllm_fn("v1")
    _no_top_k_top_p(inputs, "the V1 path timed here (its top-k / top-p runs in torch before it)")
    case, device = inputs.case, inputs.target_logits.device
    b, k = case.batch, case.k
    rows = (torch.arange(b, device=device)[:, None] * (k + 1) + torch.arange(k, device=device)).flatten()
    greedy = case.sampling == "greedy"
    t = inputs.temperature.repeat_interleave(k)[:, None]
    metadata = types.SimpleNamespace(all_greedy=greedy, all_random=not greedy, temperature=inputs.temperature,
                                     generators={})
    drafts = inputs.draft_token_ids.to(torch.int32)
    cu_end = (torch.arange(1, b + 1, device=device) * k).to(torch.int32)
    bonus = torch.zeros(b, 1, dtype=torch.int32, device=device)
    logits, q = inputs.target_logits, inputs.draft_probs

    def step():
        x = logits[rows].to(torch.float32)
        if not greedy:
            x = x.div_(t)
        return rejection_sample(drafts, [k] * b, k, cu_end, q, x, bonus, metadata)

    return step


_COMPILED: list[Callable] = []


def _torch(compiled: bool) -> Callable[[ChainInputs], Callable[[], object]]:
    def build(inputs: ChainInputs) -> Callable[[], object]:
        _no_top_k_top_p(inputs, "the plain torch verifier")
        case = inputs.case
        mode = "greedy" if case.sampling == "greedy" else (
            "random_det" if case.drafts == "deterministic" else "random_stoch")
        fn = torch_verify
        if compiled:
            if not _COMPILED:
                _COMPILED.append(torch.compile(torch_verify, dynamic=True))  # one compile per mode, not per shape
            fn = _COMPILED[0]
        logits, t = inputs.target_logits, _row_temperature(inputs)[:, None]
        greedy = mode == "greedy"
        return lambda: fn(logits if greedy else logits.float() / t, inputs.draft_token_ids, inputs.draft_probs,
                          mode, case.batch, case.k)

    return build


def _read(inputs: ChainInputs) -> Callable[[], object]:
    logits = inputs.target_logits
    return lambda: logits.sum()


BUILDERS: dict[str, Callable[[ChainInputs], Callable[[], object]]] = {
    "cuda": _ours("cuda"), "triton": _ours("triton"), "cpu": _ours("cpu"), "reference": _ours("reference"),
    "flashinfer": _flashinfer(kernel_only=False), "flashinfer_kernel": _flashinfer(kernel_only=True),
    "vllm_v2": _vllm_v2, "vllm_v1": _vllm_v1, "torch": _torch(compiled=False), "torch_compile": _torch(compiled=True),
    "read": _read,
}


# ------------------------------------------------------------------------------------------- timing
def _per_call_ms(fn: Callable[[], object], device: torch.device, inner: int) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) * 1e3 / inner


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, warmup: int, rounds: int,
                     inner: int) -> dict[str, list[float]]:
    """Per-call milliseconds of every callable in each round; warm-up first, order reversed every other round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(_per_call_ms(fns[name], device, inner))
    return times


# ----------------------------------------------------------------------------------------------- run
def gpu_description(device: torch.device) -> str:
    """The device column: GPU name, driver, clocks (nvidia-smi), or the CPU from ``provenance``."""
    if device.type != "cuda":
        return provenance(device)["device"]
    query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
    try:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20, check=True).stdout.strip().splitlines()[0]
        name, driver, sm, sm_max, mem, power = (x.strip() for x in line.split(","))
        return f"{name}; driver {driver}; SM {sm} (max {sm_max}); mem {mem}; power limit {power}"
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return torch.cuda.get_device_name(device)


def peer_versions() -> dict[str, str]:
    """The ``vllm`` / ``flashinfer`` provenance columns: the versions of the carried sources the providers
    load (``.cache/peers/manifest.json``), not of whatever is installed; "" when not carried."""
    from .prepare import PEERS

    try:
        manifest = json.loads((PEERS / "manifest.json").read_text())
    except (OSError, ValueError):
        return {"vllm": "", "flashinfer": ""}
    return {"vllm": f"{manifest['vllm']['version']} (carried sources)",
            "flashinfer": f"{manifest['flashinfer']['version']} (carried headers)"}


def run(cases: list[tuple[str, ChainCase]], providers: list[str], device: torch.device, out: Path, warmup: int,
        rounds: int, inner: int, command: str, log=print) -> Path:
    """One CSV row per (case, provider), flushed as it is measured."""
    prov = {**provenance(device), **peer_versions(), "device": gpu_description(device), "command": command}
    env = {**prov, "cuda": torch.version.cuda or "", "providers": providers,
           "capability": ".".join(map(str, torch.cuda.get_device_capability(device))) if device.type == "cuda" else ""}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".env.json").write_text(json.dumps(env, indent=1) + "\n")
    log(f"device: {prov['device']}  commit {prov['git_commit']}  -> {out}")
    outcome_backend = "cuda" if "cuda" in sk.available_backends(device) else (
        "triton" if device.type == "cuda" else "cpu" if "cpu" in sk.available_backends(device) else "reference")
    with CsvWriter(out, CASE_COLUMNS + RESULT_COLUMNS) as writer:
        for label, case in cases:
            inputs = make_inputs(case, device)
            outcome = sk.verify_chain(**inputs.api_kwargs(), backend=outcome_backend)
            lengths = inputs.cu_num_draft_tokens[1:] - inputs.cu_num_draft_tokens[:-1]
            q_bytes = None if inputs.draft_probs is None else 4
            need = chain_min_bytes(outcome.num_accepted, lengths, case.vocab, inputs.target_logits.element_size(),
                                   q_bytes)
            need_f32 = chain_min_bytes(outcome.num_accepted, lengths, case.vocab, 4, 4)
            base = {**prov, **asdict(case), "case": label,
                    "mean_accepted": f"{float(outcome.num_accepted.float().mean()):.3f}"}
            rows, fns = {}, {}
            for name in providers:
                rows[name] = {**base, "provider": name}
                try:
                    fns[name] = BUILDERS[name](inputs)
                except Skip as exc:
                    rows[name]["status"] = f"skipped: {exc}"
                except Exception as exc:  # recorded, not fatal
                    rows[name]["status"] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            try:
                times = time_interleaved(fns, device, warmup, rounds, inner)
            except Exception as exc:  # one provider failing at run time: time the others alone
                times = {}
                for name, fn in fns.items():
                    try:
                        times.update(time_interleaved({name: fn}, device, warmup, rounds, inner))
                    except Exception as inner_exc:
                        rows[name]["status"] = f"error: {type(inner_exc).__name__}: {str(inner_exc)[:200]}"
                log(f"  interleaved timing failed ({type(exc).__name__}); timed one by one")
            read_bytes_all = inputs.target_logits.numel() * inputs.target_logits.element_size()
            read_gbs = (read_bytes_all / (statistics.median(times["read"]) * 1e-3) / 1e9) if "read" in times else None
            for name, row in rows.items():
                if name in times:
                    t = times[name]
                    nbytes = read_bytes_all if name == "read" else need_f32 if name == "flashinfer_kernel" else need
                    med = statistics.median(t)
                    gbs = nbytes / (med * 1e-3) / 1e9
                    row.update(status="ok", median_ms=f"{med:.4f}", min_ms=f"{min(t):.4f}", max_ms=f"{max(t):.4f}",
                               repeats=len(t), inner=inner, read_bytes=nbytes, achieved_gbs=f"{gbs:.4g}")
                    if read_gbs:
                        row.update(read_gbs=f"{read_gbs:.4g}", read_fraction=f"{gbs / read_gbs:.4g}")
                writer.write(row)
                log(f"{label:>16} {case.batch:>4} {case.k} {case.vocab:>6} {case.dtype:>8} {case.sampling:>6} "
                    f"{case.drafts[:5]:>5} {name:>17}: {row.get('median_ms') or row['status']}")
    return out


def summarize(path: Path) -> str:
    """One line per case of a sweep CSV: its shape, then each provider's median ms ("-" when not timed)."""
    from ..common import read_csv

    rows = read_csv([path])
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    cases: dict[tuple, dict[str, str]] = {}
    for r in rows:
        key = tuple(r[c] for c in CASE_COLUMNS)
        cases.setdefault(key, {})[r["provider"]] = r["median_ms"] if r["status"] == "ok" else "-"
    lines = [" ".join(f"{c:>8}" for c in ("case", "B", "k", "V", "dtype", "sampl", "drafts", "topk", "topp"))
             + " | " + " ".join(f"{p:>{max(len(p), 9)}}" for p in providers) + "   (median ms)"]
    for key, times in cases.items():
        lines.append(" ".join(f"{str(v)[:8]:>8}" for v in key) + " | "
                     + " ".join(f"{times.get(p, ''):>{max(len(p), 9)}}" for p in providers))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m benchmarks.gpu.sweep", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, help="CSV path (rows written as measured)")
    p.add_argument("--summary", type=Path, default=None, metavar="CSV",
                   help="print a sweep CSV as one line per case (median ms per provider) and exit")
    p.add_argument("--providers", default=",".join(PROVIDERS), help=f"comma list from {','.join(PROVIDERS)}")
    p.add_argument("--max-cases", type=int, default=None, help="stop after this many cases of the grid")
    p.add_argument("--labels", default=None, help="comma list: only cases with these labels (default all)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per provider (default 3 GPU, 1 CPU)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7 GPU, 2 CPU)")
    p.add_argument("--inner", type=int, default=None, help="calls per round (default 10 GPU, 1 CPU)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.summary is not None:
        print(summarize(args.summary))
        return 0
    if args.out is None:
        parser.error("--out is required (or --summary CSV)")
    device = torch.device(args.device)
    providers = [x.strip() for x in args.providers.split(",") if x.strip()]
    unknown = [x for x in providers if x not in PROVIDERS]
    if unknown:
        raise SystemExit(f"--providers: unknown {unknown}; choose from {','.join(PROVIDERS)}")
    if "read" not in providers:
        providers.append("read")
    gpu = device.type == "cuda"
    cases = gpu_grid() if gpu else cpu_grid()
    if args.labels:
        keep = set(args.labels.split(","))
        cases = [c for c in cases if c[0] in keep]
    cases = cases[: args.max_cases]
    if not gpu:
        torch.set_num_threads(1)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.gpu.sweep " + shlex.join(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        command = "TRITON_INTERPRET=1 " + command
    run(cases, providers, device, args.out, args.warmup if args.warmup is not None else (3 if gpu else 1),
        args.rounds or (7 if gpu else 2), args.inner or (10 if gpu else 1), command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

