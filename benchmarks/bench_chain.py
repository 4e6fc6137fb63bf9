"""Chain-verification microbenchmark: our backends against vLLM and FlashInfer, with the roofline.

Every provider does the whole verification step from raw target logits: temperature, top-k/top-p where
the provider supports them, softmax where it needs one, acceptance, recovery and the bonus token.

Providers (each skipped with a reason in the CSV ``status`` column when it cannot run here):

- ``reference``: ``specdec_kernels`` torch reference (any device).
- ``triton``: the fused Triton kernel (CUDA only; the CPU interpreter is not a benchmark).
- ``cpu`` / ``cuda``: the native extension ``specdec_kernels._C`` when built.
- ``vllm_v1``: vLLM V1 ``RejectionSampler.forward`` (bonus sampling, temperature/top-k/top-p, softmax,
  ``rejection_sample``); on CPU through vLLM's own CPU kernel overrides.
- ``vllm_v2``: vLLM V2's step (CUDA only): its sampler's float32 copy and ``apply_temperature``, then
  ``rejection_sample`` (softmax inside; no top-k/top-p).
- ``flashinfer``: ``softmax`` + ``flashinfer.sampling.chain_speculative_sampling`` (CUDA only; one-hot
  draft probabilities stand in for deterministic drafts, uniform k per request).

Inputs: logits ~ N(0, 2^2) with one boosted token per row, sized so that the target gives it
probability ``p_top`` (default 0.7) at the benchmark temperature 0.8, like a confident language model.
Deterministic drafts are the target row's argmax; stochastic drafts are sampled from
q = softmax(target logits + N(0, 1)). Acceptance is therefore high but not certain (the CSV records the
mean accepted length), which matters to early-exit kernels.

Examples::

    python -m benchmarks.bench_chain --quick                     # ~1-2 min on CPU
    python -m benchmarks.bench_chain --batch 1,64 --k 3 --vocab 151936 --providers reference,triton
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import specdec_kernels as sk
from benchmarks.common import OneLineParser

from . import vllm_v1
from .common import (
    CsvWriter,
    copy_bandwidth_gbs,
    default_csv_path,
    parse_int_list,
    parse_str_list,
    provenance,
    time_fn,
)
from .roofline import achieved_fraction, chain_all_rows_bytes, chain_min_bytes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROVIDERS = ("reference", "triton", "cpu", "cuda", "vllm_v1", "vllm_v2", "flashinfer")
CASE_COLUMNS = ("batch", "k", "vocab", "dtype", "sampling", "drafts", "top_k", "top_p", "p_top")
RESULT_COLUMNS = (
    "mean_accepted", "min_bytes", "all_rows_bytes", "copy_gbs", "achieved_gbs", "roofline_fraction",
)


@dataclass(frozen=True)
class ChainCase:
    """One benchmark configuration. ``sampling``: "greedy" | "random"; ``drafts``: "deterministic" | "stochastic"."""

    batch: int
    k: int
    vocab: int
    dtype: str
    sampling: str
    drafts: str
    top_k: int = 0
    top_p: float = 1.0
    p_top: float = 0.7


# Temperature of every random request, and the spread of the synthetic logits.
BENCH_TEMPERATURE = 0.8
LOGIT_STD = 2.0


@dataclass
class ChainInputs:
    """The case's tensors in the layout of ``specdec_kernels.verify_chain`` (uniform k per request)."""

    case: ChainCase
    target_logits: torch.Tensor  # [B * (k + 1), V]
    draft_token_ids: torch.Tensor  # [B * k] int64
    cu_num_draft_tokens: torch.Tensor  # [B + 1] int64
    draft_probs: torch.Tensor | None  # [B * k, V] float32
    temperature: torch.Tensor  # [B] float32
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    seed: torch.Tensor  # [B] int64
    position: torch.Tensor  # [B] int64

    def api_kwargs(self) -> dict:
        return dict(
            target_logits=self.target_logits, draft_token_ids=self.draft_token_ids,
            cu_num_draft_tokens=self.cu_num_draft_tokens, draft_probs=self.draft_probs,
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
            position=self.position, max_draft_len=self.case.k, validate=False,
        )


def make_inputs(case: ChainCase, device: torch.device, seed: int = 0) -> ChainInputs:
    """Deterministic random inputs for ``case``, generated on ``device`` (fast for GPU-sized cases)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    b, k, v = case.batch, case.k, case.vocab
    logits = torch.randn(b * (k + 1), v, generator=gen, device=device) * LOGIT_STD
    if v > 1 and 0.0 < case.p_top < 1.0:
        # exp(boost / T) = p / (1 - p) * E[sum of the other tokens' exp(z / T)], z ~ N(0, std^2).
        t = BENCH_TEMPERATURE
        boost = t * (math.log(case.p_top / (1 - case.p_top)) + math.log(v - 1) + (LOGIT_STD / t) ** 2 / 2)
        top = torch.randint(0, v, (b * (k + 1), 1), generator=gen, device=device)
        logits.scatter_add_(1, top, torch.full_like(top, boost, dtype=logits.dtype))
    draft_rows = (torch.arange(b, device=device)[:, None] * (k + 1) + torch.arange(k, device=device)[None, :])
    draft_rows = draft_rows.reshape(-1)
    draft_probs = None
    if case.drafts == "stochastic":
        noise = torch.randn(b * k, v, generator=gen, device=device)
        draft_probs = torch.softmax(logits[draft_rows] + noise, dim=-1)
        drafts = torch.multinomial(draft_probs, 1, generator=gen).squeeze(-1) if b * k else draft_rows
    else:
        drafts = logits[draft_rows].argmax(dim=-1)
    return ChainInputs(
        case=case,
        target_logits=logits.to(DTYPES[case.dtype]),
        draft_token_ids=drafts.to(torch.int64),
        cu_num_draft_tokens=torch.arange(b + 1, device=device) * k,
        draft_probs=draft_probs,
        temperature=torch.full((b,), 0.0 if case.sampling == "greedy" else BENCH_TEMPERATURE, device=device),
        top_k=torch.full((b,), case.top_k, dtype=torch.int32, device=device) if case.top_k else None,
        top_p=torch.full((b,), case.top_p, device=device) if case.top_p < 1.0 else None,
        seed=torch.randint(0, 2**62, (b,), generator=gen, device=device),
        position=torch.full((b,), 1000, dtype=torch.int64, device=device),
    )


# ----------------------------------------------------------------------------------------------------
# Providers: each returns a zero-argument callable, or raises Skip with the reason.
# ----------------------------------------------------------------------------------------------------

class Skip(Exception):
    """The provider cannot run this case here (reason in the message)."""


# The reference materialises several int64 [rows, V] tensors (Philox); beyond this many logits it would
# take minutes (CPU) or tens of GB (GPU) per call, so larger cases skip it.
MAX_REFERENCE_ELEMENTS = 1 << 27


def _ours(backend: str) -> Callable[[ChainInputs], Callable[[], object]]:
    def build(inputs: ChainInputs) -> Callable[[], object]:
        device = inputs.target_logits.device
        if backend == "reference" and inputs.target_logits.numel() > MAX_REFERENCE_ELEMENTS:
            raise Skip(f"reference skipped above {MAX_REFERENCE_ELEMENTS} logits")
        if backend == "triton" and device.type != "cuda":
            raise Skip("triton is benchmarked on CUDA only (the CPU interpreter is not a benchmark)")
        if backend not in sk.available_backends(device):
            raise Skip(f"backend {backend!r} not available on {device.type}")
        kwargs = inputs.api_kwargs()
        return lambda: sk.verify_chain(**kwargs, backend=backend)

    return build


def _vllm_v1(inputs: ChainInputs) -> Callable[[], object]:
    try:
        v1 = vllm_v1.load()
    except ImportError as exc:
        raise Skip(f"vllm V1 sampler not importable: {exc}") from None
    case = inputs.case
    sampling = vllm_v1.sampling_metadata(v1, inputs.temperature, inputs.top_k, inputs.top_p)  # greedy: all 0
    return vllm_v1.step(v1, inputs.target_logits, inputs.draft_token_ids, inputs.draft_probs, case.batch, case.k,
                        sampling)


def _vllm_v2(inputs: ChainInputs) -> Callable[[], object]:
    device = inputs.target_logits.device
    if device.type != "cuda":
        raise Skip("vllm V2 rejection sampler needs CUDA")
    case = inputs.case
    if case.top_k or case.top_p < 1.0:
        raise Skip("vllm V2 rejection_sample applies no top-k/top-p itself")
    try:
        from vllm.v1.worker.gpu.sample.gumbel import apply_temperature
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample
    except ImportError as exc:
        raise Skip(f"vllm V2 sampler not importable: {exc}") from None
    return vllm_v2_step(inputs, rejection_sample, apply_temperature)


def vllm_v2_step(inputs: ChainInputs, rejection_sample: Callable, apply_temperature: Callable) -> Callable[[], object]:
    """One call of vLLM V2's verification on ``inputs`` as its sampler makes it: for random sampling a float32
    copy of the logits with the temperature applied in place (``rejection_sample`` applies none), then
    ``rejection_sample`` (the functions are passed in: the installed vLLM's, or the carried sources')."""
    case, device = inputs.case, inputs.target_logits.device
    b, k, v = case.batch, case.k, case.vocab
    local = torch.arange(k + 1, device=device).repeat(b)
    request = torch.arange(b, device=device).repeat_interleave(k + 1)
    # V2 reads the draft checked by logit row i at draft_sampled[i + 1]: per request, the last accepted
    # token (unused here) followed by the k drafts.
    verify = torch.zeros(b, k + 1, dtype=torch.int64, device=device)
    verify[:, 1:] = inputs.draft_token_ids.view(b, k)
    draft_logits = None
    if inputs.draft_probs is not None:  # V2 takes softmax(draft_logits / T) as q: pass T * log q
        t = torch.where(inputs.temperature > 0, inputs.temperature, torch.ones_like(inputs.temperature))
        draft_logits = (torch.log(inputs.draft_probs).view(b, k, v) * t[:, None, None]).contiguous()
    expanded = request.to(torch.int32)
    args = (
        draft_logits, verify.view(-1), (torch.arange(b + 1, device=device) * (k + 1)).to(torch.int32),
        (inputs.position[request] + local), torch.arange(b, dtype=torch.int32, device=device), expanded,
        local.to(torch.int32), inputs.temperature, inputs.seed, k,
    )
    assert b * (k + 1) == inputs.target_logits.shape[0]
    logits = inputs.target_logits
    if case.sampling == "greedy":  # V2's sampler leaves the logits alone when no request needs processing
        return lambda: rejection_sample(logits, *args)

    def step():  # V2's sampler first: a float32 copy, the temperature in place
        x = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
        apply_temperature(x, expanded, inputs.temperature)
        return rejection_sample(x, *args)

    return step


def _flashinfer(inputs: ChainInputs) -> Callable[[], object]:
    device = inputs.target_logits.device
    if device.type != "cuda":
        raise Skip("flashinfer needs CUDA")
    try:
        from flashinfer.sampling import chain_speculative_sampling
    except ImportError as exc:
        raise Skip(f"flashinfer not importable: {exc}") from None
    case = inputs.case
    if case.top_k or case.top_p < 1.0:
        raise Skip("flashinfer chain_speculative_sampling takes probabilities; top-k/top-p not included here")
    b, k, v = case.batch, case.k, case.vocab
    temperature = torch.where(inputs.temperature == 0, 1.0, inputs.temperature)
    row_temperature = temperature.repeat_interleave(k + 1)[:, None]
    if inputs.draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(inputs.draft_token_ids, v).float().view(b, k, v)
    else:
        draft_probs = inputs.draft_probs.view(b, k, v)
    draft_ids = inputs.draft_token_ids.to(torch.int32).view(b, k)
    logits = inputs.target_logits

    def run():
        target_probs = torch.softmax(logits.float() / row_temperature, dim=-1).view(b, k + 1, v)
        return chain_speculative_sampling(draft_probs, draft_ids, target_probs)

    return run


PROVIDER_BUILDERS: dict[str, Callable[[ChainInputs], Callable[[], object]]] = {
    "reference": _ours("reference"),
    "triton": _ours("triton"),
    "cpu": _ours("cpu"),
    "cuda": _ours("cuda"),
    "vllm_v1": _vllm_v1,
    "vllm_v2": _vllm_v2,
    "flashinfer": _flashinfer,
}


# ----------------------------------------------------------------------------------------------------
# Sweep
# ----------------------------------------------------------------------------------------------------

QUICK = dict(batch=[1, 8], k=[1, 3], vocab=[32000], dtype=["float32"], sampling=["greedy", "random"],
             drafts=["deterministic", "stochastic"])
FULL = dict(batch=[1, 8, 64, 256], k=[1, 3, 5, 7], vocab=[32000, 151936, 262144], dtype=["bfloat16", "float32"],
            sampling=["greedy", "random"], drafts=["deterministic", "stochastic"])


def cases_from_args(args: argparse.Namespace) -> list[ChainCase]:
    preset = QUICK if args.quick else FULL
    grid = {name: getattr(args, name) or preset[name] for name in preset}
    cases = []
    for b, k, v, dtype, sampling, drafts in itertools.product(*grid.values()):
        if sampling == "greedy" and drafts == "stochastic":
            continue  # greedy requests ignore draft probabilities: same work as deterministic
        cases.append(ChainCase(b, k, v, dtype, sampling, drafts, top_k=args.top_k, top_p=args.top_p,
                               p_top=args.p_top))
    return cases


def run(cases: list[ChainCase], providers: list[str], device: torch.device, out: Path,
        warmup: int, repeats: int, copy_bytes: int | None = None, log=print) -> Path:
    """Time every provider on every case; write one CSV row per (case, provider)."""
    prov = provenance(device)
    # Fastest backend for the outcome, never the Triton interpreter on CPU.
    outcome_backend = next(b for b in sk.available_backends(device) if device.type == "cuda" or b != "triton")
    copy_gbs = copy_bandwidth_gbs(device, copy_bytes)
    log(f"device: {prov['device']}  copy bandwidth: {copy_gbs:.1f} GB/s  -> {out}")
    with CsvWriter(out, CASE_COLUMNS + RESULT_COLUMNS) as writer:
        for case in cases:
            inputs = make_inputs(case, device)
            # The outcome (accepted counts) fixes the minimal bytes; every backend emits the same tokens.
            outcome = sk.verify_chain(**inputs.api_kwargs(), backend=outcome_backend)
            lengths = inputs.cu_num_draft_tokens[1:] - inputs.cu_num_draft_tokens[:-1]
            logit_bytes = inputs.target_logits.element_size()
            q_bytes = None if inputs.draft_probs is None else inputs.draft_probs.element_size()
            min_bytes = chain_min_bytes(outcome.num_accepted, lengths, case.vocab, logit_bytes, q_bytes)
            all_bytes = chain_all_rows_bytes(lengths, case.vocab, logit_bytes, q_bytes)
            base = {**prov, **asdict(case), "copy_gbs": f"{copy_gbs:.4g}", "min_bytes": min_bytes,
                    "all_rows_bytes": all_bytes,
                    "mean_accepted": f"{float(outcome.num_accepted.float().mean()) if case.batch else 0.0:.3f}"}
            for name in providers:
                row = {**base, "provider": name}
                try:
                    fn = PROVIDER_BUILDERS[name](inputs)
                    timing = time_fn(fn, device, warmup=warmup, repeats=repeats)
                except Skip as exc:
                    row["status"] = f"skipped: {exc}"
                except Exception as exc:  # a failing provider is recorded, not fatal
                    row["status"] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
                else:
                    achieved = min_bytes / (timing.median_ms * 1e-3) / 1e9
                    row.update(status="ok", median_ms=f"{timing.median_ms:.4f}", min_ms=f"{timing.min_ms:.4f}",
                               repeats=timing.repeats, achieved_gbs=f"{achieved:.4g}",
                               roofline_fraction=f"{achieved_fraction(min_bytes, timing.median_ms, copy_gbs):.4g}")
                writer.write(row)
                shown = row["median_ms"] if row["status"] == "ok" else row["status"]
                log(f"{case}  {name:>10}: {shown}")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m benchmarks.bench_chain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small CPU-friendly preset (~1-2 min on CPU)")
    parser.add_argument("--batch", type=parse_int_list, help="comma list, e.g. 1,8,64,256")
    parser.add_argument("--k", type=parse_int_list, help="draft lengths, e.g. 1,3,5,7")
    parser.add_argument("--vocab", type=parse_int_list, help="vocabulary sizes, e.g. 32000,151936,262144")
    parser.add_argument("--dtype", type=parse_str_list, help=f"logit dtypes from {sorted(DTYPES)}")
    parser.add_argument("--sampling", type=parse_str_list, help="greedy,random")
    parser.add_argument("--drafts", type=parse_str_list, help="deterministic,stochastic")
    parser.add_argument("--top-k", type=int, default=0, help="top-k for every request (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="top-p for every request (1 = off)")
    parser.add_argument("--p-top", type=float, default=0.7,
                        help="target probability of each row's boosted token (0 = plain Gaussian logits)")
    parser.add_argument("--providers", type=parse_str_list, default=list(PROVIDERS),
                        help=f"comma list from {PROVIDERS}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 2 CPU (1 quick), 5 GPU)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls (default 5 CPU (3 quick), 50 GPU)")
    parser.add_argument("--copy-mib", type=int, default=None,
                        help="tensor size for the copy-bandwidth measurement (default 1024 GPU, 128 CPU)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default 1 on CPU: shared machines make more threads noisy)")
    parser.add_argument("--out", type=Path, default=None, help="CSV path (default results/benchmarks/...)")
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    unknown = [p for p in args.providers if p not in PROVIDERS]
    if unknown:
        raise SystemExit(f"unknown providers {unknown}; choose from {PROVIDERS}")
    for name, allowed in (("dtype", DTYPES), ("sampling", ("greedy", "random")),
                          ("drafts", ("deterministic", "stochastic"))):
        bad = [x for x in getattr(args, name) or [] if x not in allowed]
        if bad:
            raise SystemExit(f"--{name}: unknown values {bad}; choose from {sorted(allowed)}")
    gpu = device.type == "cuda"
    if args.threads is not None or not gpu:
        torch.set_num_threads(args.threads or 1)
    warmup = args.warmup if args.warmup is not None else (5 if gpu else 1 if args.quick else 2)
    repeats = args.repeats if args.repeats is not None else (50 if gpu else 3 if args.quick else 5)
    out = args.out or default_csv_path("chain", device)
    copy_bytes = None if args.copy_mib is None else args.copy_mib << 20
    return run(cases_from_args(args), args.providers, device, out, warmup, repeats, copy_bytes)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
