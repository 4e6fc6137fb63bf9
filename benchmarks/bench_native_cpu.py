"""Native CPU chain verification against vLLM's CPU path and plain torch, on the machine's read bandwidth.

One run times, on the same inputs and threads, side by side:

- ``ours``: ``specdec_kernels.verify_chain(..., backend="cpu")`` (bonus token included);
- ``vllm_step``: vLLM V1 ``RejectionSampler.forward`` with its CPU kernel overrides, on the same
  ``[T + B, V]`` logits: what a vLLM worker runs per speculative step (its ``Sampler`` draws the bonus
  tokens, the draft rows are gathered, made float32 and copied, then ``rejection_sample``), the same job
  as ours;
- ``vllm``: vLLM V1 ``rejection_sample`` alone on the draft rows, the bonus token ids given as input (it
  reads k / (k + 1) of our bytes and samples no bonus token: vLLM's verification kernel by itself);
- ``torch`` / ``torch_compile``: the plainest strong torch verifier, eager and ``torch.compile``d: argmax
  (greedy), Gumbel-max by the exponential race ``argmax(z - log E)`` (random, deterministic drafts), or
  softmax + coins + ``argmax(residual / E)`` (random, stochastic drafts) over every row at once;
- ``stream`` (``specdec_kernels.native.stream_sum``: a read-only pass with the verification passes' own
  software prefetch, on the same threads, float adds into eight accumulators), ``int16``
  (``native.stream_minmax16``: the loop of the 16-bit greedy pass alone, an integer max and min per vector,
  same prefetch and threads; on some runs of this VM it reads faster than ``stream``, on others slower) and
  ``sum`` (``torch.sum``, without prefetch), each over every dtype's own logits tensor (bf16 entries read in
  pairs as 32-bit words by ``stream``, any entries as 16-bit words by ``int16``): the fastest of the three in
  a round is the family's read bandwidth of that dtype's bytes (``torch.sum`` alone reads 10-25 % slower on
  some machines, faster on others; a bf16 case is a read of half the fp32 bytes, so its call's fixed costs
  weigh twice as much, and so they do in its reference); ``copy`` (``dst.copy_(src)`` over the fp32 logits,
  bandwidth counted as read + written bytes);
- ``stream_read``, ``int16_read`` and ``sum_read`` (per case): the same three reads of the case's dtype's
  whole tensor, timed right next to ours (ours, then these probes, on even rounds; the reverse on odd ones):
  the fastest of the three in a round is the case's read bandwidth in that round, the reference of its
  fractions. The family's probes can run tens of seconds from a case (its baselines take that long), and
  this VM's bandwidth has moved by 1.6x within such a span;
- ``stream_need``, ``int16_need`` and ``sum_need`` (per case): the three reads over the first
  ``must_read_bytes`` of the case's own logits, contiguous: reads of exactly as many bytes as the case
  must read, their calls' fixed costs and ramp included, timed next to the case's read probes; the fastest
  of the three in a round is that round's same-size read. A case that must read one row per request (a first
  draft rejected) reads a quarter of the tensor, and this VM reads 19 MB up to ~25 % slower per byte than
  78-156 MB, so ``read_fraction`` understates such cases; ``same_size_fraction`` (the same-size read's
  time over the provider's, per round) is the fraction of a read of the same size, reported beside it (not
  instead).

Protocol: for each logits family the inputs are built once; then ``--rounds`` rounds each time every case and
every provider (``--reps`` calls, median; ``--fast-reps`` for ours and the read probes, calls of a few
milliseconds, so that one call slowed by the VM's neighbours does not make a round's figure), providers in one
order on even rounds (ours, its probes, the baselines) and reversed on odd rounds; the CSV row of a (case,
provider) gives the min / median / max over rounds of those medians. Caches are evicted before every timed
call: a write of twice the last-level cache, at least 256 MiB (``evict_bytes``, or ``--evict-mib``; the CSV's
``evict_mib``). ``must_read_bytes`` is what an exact verifier has to read given our outcome on that input:
each request's logit rows up to its first rejection (all k + 1 when every draft is accepted; every entry of a
random row is needed, for its normalizer or its Gumbel race). Draft probabilities are not counted: an accepted
row needs q at the draft token only, and a rejected row's residual search reads q only on its few candidate
blocks (counting whole q rows, as this benchmark did before, made the stochastic fractions look up to twice as
good); ``read_fraction`` = median over rounds of ``must_read_bytes / time / read bandwidth`` (the fastest
of the case's read probes in the same round), with its min / max; a case row's ``read_gbs``
is the median over rounds of that bandwidth, a ``stream`` / ``sum`` row's the family's; ``same_size_fraction``
= median over rounds of the same-size read's time / the provider's, with its min / max.

Cases: fp32 and bf16 logits, temperature 1 (RL rollouts), greedy and random sampling, deterministic and
stochastic drafts, drafts ``accept`` (the worst case: drafts are our own samples, or q = p, so every draft
is accepted and every row read) and ``model`` (drafts from a noisy copy of the target, partial acceptance).
Logits families: ``flat`` (standard normal: nothing can be skipped), ``peaked`` (normal x 4 plus 8 strong
tokens), ``zipf`` (rank-frequency law of language-model outputs: ``-s log rank`` at a random permutation,
s ~ U(0.8, 1.4), plus N(0, 0.5) noise), ``qwen3`` (a forward of an untrained tiny Qwen3 with the 151936
vocabulary, built locally: no trained model of that vocabulary can be made here).

Usage (the committed CSV)::

    python -m benchmarks.bench_native_cpu --out results/benchmarks/chain_cpu_b64_k3_v151936.csv
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

import specdec_kernels as sk
from specdec_kernels import native

from . import vllm_v1
from .common import CsvWriter, OneLineParser, choice_list, largest_cache_bytes, provenance, require_positive

FAMILIES = ("flat", "zipf", "peaked", "qwen3")
MODES = ("greedy", "random_det", "random_stoch")
DRAFTS = ("accept", "model")
PROVIDERS = ("ours", "vllm_step", "vllm", "torch", "torch_compile")
READ_PROBES = ("stream_read", "int16_read", "sum_read")  # per case, next to ours: its dtype's whole tensor
SAME_SIZE_PROBES = ("stream_need", "int16_need", "sum_need")  # per case: reads of exactly its must_read_bytes
READS = ("stream", "int16", "sum")  # the family's read probes, per dtype
PROBES = (*READ_PROBES, *SAME_SIZE_PROBES)
FAST_REPS = ("ours", *PROBES)  # timed --fast-reps calls per round (the rest: --reps)
CASE_COLUMNS = ("batch", "k", "vocab", "dtype", "family", "mode", "drafts")
RESULT_COLUMNS = (
    "max_ms", "rounds", "mean_accepted", "must_read_bytes", "read_gbs", "copy_gbs",
    "read_fraction", "read_fraction_min", "read_fraction_max", "same_size_fraction", "same_size_fraction_min",
    "same_size_fraction_max", "evict_mib", "command",
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def evict_bytes(cache_bytes: int) -> int:
    """The size of the eviction write: twice the last-level cache, and at least 256 MiB.

    One cache's worth is not enough: on a 2-core Xeon VM with a 480 MiB L3, a 19 MB read ran 6 % faster
    after a 512 MiB write than after 1 or 2 GiB (which agreed), and 9 % faster after 256 MiB, the size
    used before."""
    return max(256 << 20, 2 * cache_bytes)


_EVICT = torch.empty(0)


def _evict_caches(num_bytes: int | None = None) -> None:
    """Write ``num_bytes`` (default: the size the last eviction wrote, else ``evict_bytes`` of this machine's
    last-level cache) so that the next call reads its inputs, and runs its code, from memory."""
    global _EVICT
    if num_bytes is None:
        num_bytes = _EVICT.numel() * 4 or evict_bytes(largest_cache_bytes())
    if _EVICT.numel() * 4 != num_bytes:
        _EVICT = torch.empty(num_bytes // 4)
    _EVICT.fill_(1.0)


def _median_time(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of ``reps`` calls of ``fn``, each from evicted caches."""
    times = []
    for _ in range(reps):
        _evict_caches()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --------------------------------------------------------------------------------------------- inputs
def family_logits(family: str, rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, vocab] float32 logits of one family (module docstring)."""
    if family == "flat":
        return torch.randn(rows, vocab, generator=gen)
    if family == "peaked":
        x = torch.randn(rows, vocab, generator=gen) * 4.0
        hot = torch.randint(0, vocab, (rows, 8), generator=gen)
        return x.scatter_(1, hot, 20.0 + 4.0 * torch.rand(rows, 8, generator=gen))
    if family == "zipf":
        s = 0.8 + 0.6 * torch.rand(rows, 1, generator=gen)
        rank = torch.argsort(torch.rand(rows, vocab, generator=gen), dim=1).float() + 1.0
        return -s * rank.log() + 0.5 * torch.randn(rows, vocab, generator=gen)
    if family == "qwen3":
        return _tiny_qwen3_logits(rows, vocab, gen)
    raise ValueError(f"unknown logits family {family!r}")


def _tiny_qwen3_logits(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Logits of a seeded, untrained two-layer Qwen3 (hidden 64) over random token ids."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    config = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config).eval()
    ids = torch.randint(0, vocab, (rows // 8, 8), generator=gen)
    with torch.no_grad():
        return model(input_ids=ids).logits.reshape(rows, vocab).float().contiguous()


@dataclass
class Case:
    """One verification input: the logits family, dtype, mode and drafts, with every tensor built."""

    dtype: str
    family: str
    mode: str
    drafts_kind: str
    logits: torch.Tensor
    drafts: torch.Tensor
    draft_probs: torch.Tensor | None
    temperature: torch.Tensor


def build_cases(logits32: torch.Tensor, family: str, args, gen: torch.Generator) -> list[Case]:
    batch, k = args.batch, args.k
    draft_rows = (torch.arange(batch)[:, None] * (k + 1) + torch.arange(k)[None, :]).flatten()
    cases = []
    for dtype in args.dtypes:
        logits = logits32.to(DTYPES[dtype]).contiguous()
        target = logits[draft_rows].float()
        for mode in args.modes:
            temperature = torch.zeros(batch) if mode == "greedy" else torch.ones(batch)
            for drafts_kind in args.drafts:
                probs = None
                noisy = target + torch.randn(target.shape, generator=gen)
                if mode == "random_stoch":
                    q = torch.softmax(target if drafts_kind == "accept" else noisy, dim=-1)
                    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1)
                    probs = q.contiguous()  # fp32 draft probs for both logits dtypes, as vLLM keeps them
                elif drafts_kind == "model":
                    drafts = noisy.argmax(-1)
                elif mode == "greedy":
                    drafts = target.argmax(-1)
                else:
                    drafts = _own_samples(logits, temperature, args)
                cases.append(Case(dtype, family, mode, drafts_kind, logits, drafts, probs, temperature))
    return cases


def _keys(args) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 2**62, (args.batch,), generator=gen), torch.randint(0, 4096, (args.batch,), generator=gen)


def _own_samples(logits: torch.Tensor, temperature: torch.Tensor, args) -> torch.Tensor:
    """The token our sampler draws at every draft row, so that drafts equal to them are all accepted."""
    batch, k = args.batch, args.k
    seed, position = _keys(args)
    drafts = torch.empty(batch * k, dtype=torch.int64)
    for j in range(k):
        rows = torch.arange(batch) * (k + 1) + j
        sub = logits[torch.stack([rows, rows + 1], 1).flatten()].contiguous()
        res = sk.verify_chain(sub, torch.full((batch,), -1), torch.arange(batch + 1), temperature=temperature,
                              seed=seed, position=position + j, backend="cpu")
        drafts[torch.arange(batch) * k + j] = res.output_token_ids[:, 0].long()
    return drafts


# ------------------------------------------------------------------------------------------ providers
def ours(case: Case, args) -> Callable[[], object]:
    cu = torch.arange(args.batch + 1, dtype=torch.int64) * args.k
    seed, position = _keys(args)
    return lambda: sk.verify_chain(case.logits, case.drafts, cu, draft_probs=case.draft_probs,
                                   temperature=case.temperature, seed=seed, position=position, backend="cpu",
                                   max_draft_len=args.k, validate=False)


def torch_verify(logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                 mode: str, batch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch chain verification over every row: ([B, k + 1] tokens, -1 padded; [B] accepted)."""
    x = logits.float().view(batch, k + 1, -1)
    d = drafts.view(batch, k)
    if mode == "greedy":
        sampled = x.argmax(-1)
        ok = sampled[:, :k] == d
        fallback = sampled
    elif mode == "random_det":
        sampled = (x - torch.empty_like(x).exponential_().log()).argmax(-1)
        ok = sampled[:, :k] == d
        fallback = sampled
    else:
        p = torch.softmax(x, dim=-1)
        q = draft_probs.view(batch, k, -1)
        px = p[:, :k].gather(-1, d[..., None]).squeeze(-1)
        qx = q.gather(-1, d[..., None]).squeeze(-1)
        ok = torch.rand_like(px) * qx < px
        residual = (p[:, :k] - q).clamp_min(0.0)
        recovered = (residual / torch.empty_like(residual).exponential_()).argmax(-1)
        bonus = (p[:, k] / torch.empty_like(p[:, k]).exponential_()).argmax(-1)
        fallback = torch.cat([recovered, bonus[:, None]], dim=1)
    accepted = ok.int().cumprod(dim=1).sum(dim=1)
    cols = torch.arange(k + 1, device=x.device)[None, :]
    out = torch.where(cols < accepted[:, None], torch.cat([d, d[:, :1]], dim=1), fallback)
    out = torch.where(cols <= accepted[:, None], out, torch.full_like(out, -1))
    return out, accepted


_COMPILED: dict[str, Callable] = {}


def torch_provider(case: Case, args, compiled: bool) -> Callable[[], object]:
    fn = torch_verify
    if compiled:
        fn = _COMPILED.setdefault("verify", torch.compile(torch_verify, dynamic=False))
    return lambda: fn(case.logits, case.drafts, case.draft_probs, case.mode, args.batch, args.k)


def vllm_providers(args) -> dict[str, Callable[[Case], Callable[[], object]]]:
    """Factories of vLLM's ``step`` and ``kernel`` callables (benchmarks/vllm_v1.py) by provider name; empty
    (reason printed) when vLLM cannot run."""
    try:
        v1 = vllm_v1.load()
    except Exception as exc:  # vllm not installed or incompatible: recorded as errors
        print(f"vllm unavailable: {exc}", file=sys.stderr)
        return {}

    def factory(entry: Callable) -> Callable[[Case], Callable[[], object]]:
        return lambda case: entry(v1, case.logits, case.drafts, case.draft_probs, args.batch, args.k,
                                  vllm_v1.sampling_metadata(v1, case.temperature))

    return {"vllm_step": factory(vllm_v1.step), "vllm": factory(vllm_v1.kernel)}


def must_read_bytes(case: Case, num_accepted: torch.Tensor) -> int:
    """Logit rows up to each request's first rejection (bonus row when all accepted); no q rows (module
    docstring)."""
    vocab = case.logits.shape[1]
    return int((num_accepted + 1).sum()) * vocab * case.logits.element_size()


# ---------------------------------------------------------------------------------------------- driver
def run_family(family: str, args, gen: torch.Generator, writer: CsvWriter, info: dict, vllm) -> None:
    rows = args.batch * (args.k + 1)
    logits32 = family_logits(family, rows, args.vocab, gen)
    cases = build_cases(logits32, family, args, gen)
    dst = torch.empty_like(logits32)
    # The read probes run over each dtype's own logits tensor: a bf16 case is judged against a read of its
    # own bytes (half the fp32 tensor's), fixed costs of a call included.
    tensors = {c.dtype: c.logits for c in cases}
    bandwidth: dict[tuple[str, str], Callable[[], object]] = {}
    for dtype, x in tensors.items():
        bandwidth["stream", dtype] = lambda x=x: native.stream_sum(_as_words(x))
        bandwidth["int16", dtype] = lambda x=x: native.stream_minmax16(x)
        bandwidth["sum", dtype] = lambda x=x: torch.sum(x)
    bandwidth["copy", "float32"] = lambda: dst.copy_(logits32)
    callables: dict[tuple[int, str], Callable[[], object]] = {}
    status: dict[tuple[int, str], str] = {}
    for i, case in enumerate(cases):
        for name in args.providers:
            try:
                if name == "ours":
                    fn = ours(case, args)
                elif name in ("vllm", "vllm_step"):
                    if name not in vllm:
                        raise RuntimeError("vllm unavailable")
                    fn = vllm[name](case)
                else:
                    fn = torch_provider(case, args, compiled=name == "torch_compile")
                fn()  # warm-up (and compilation)
                callables[i, name] = fn
            except Exception as exc:  # recorded in the CSV, never silently dropped
                status[i, name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    accepted = {i: ours(c, args)().num_accepted for i, c in enumerate(cases)}
    need = {i: must_read_bytes(c, accepted[i]) for i, c in enumerate(cases)}
    for i, case in enumerate(cases):  # the case's read probes, interleaved with its providers
        callables[i, "stream_read"] = bandwidth["stream", case.dtype]
        callables[i, "int16_read"] = bandwidth["int16", case.dtype]
        callables[i, "sum_read"] = bandwidth["sum", case.dtype]
        callables[i, "stream_need"] = lambda w=same_size_words(case, need[i]): native.stream_sum(w)
        callables[i, "int16_need"] = lambda w=same_size_words(case, need[i]): native.stream_minmax16(w)
        callables[i, "sum_need"] = lambda x=same_size_entries(case, need[i]): torch.sum(x)
    times: dict[tuple[int, str], list[float]] = {key: [] for key in callables}
    bw_times: dict[tuple[str, str], list[float]] = {key: [] for key in bandwidth}
    for r in range(args.rounds):
        order = list(bandwidth) + list(range(len(cases)))
        for item in order if r % 2 == 0 else order[::-1]:
            if isinstance(item, tuple):
                bw_times[item].append(_median_time(bandwidth[item], args.fast_reps))
                continue
            names = [n for n in _case_order(args.providers) if (item, n) in callables]
            for name in names if r % 2 == 0 else names[::-1]:
                reps = args.fast_reps if name in FAST_REPS else args.reps
                times[item, name].append(_median_time(callables[item, name], reps))
    read_per_round = {
        dtype: [x.numel() * x.element_size() / t
                for t in _faster_per_round(*(bw_times[p, dtype] for p in READS))]
        for dtype, x in tensors.items()}
    read_gbs = {dtype: statistics.median(rates) for dtype, rates in read_per_round.items()}
    # Each case's own read bandwidth per round: its read probes, timed next to ours.
    case_read = {i: [tensors[c.dtype].numel() * tensors[c.dtype].element_size() / t
                     for t in _faster_per_round(*(times[i, p] for p in READ_PROBES))]
                 for i, c in enumerate(cases)}
    copy_gbs = 2 * logits32.numel() * 4 / statistics.median(bw_times["copy", "float32"])
    for i, case in enumerate(cases):
        base = {**info, "batch": args.batch, "k": args.k, "vocab": args.vocab, "dtype": case.dtype,
                "family": family, "mode": case.mode, "drafts": case.drafts_kind,
                "mean_accepted": f"{float(accepted[i].float().mean()):.3f}", "must_read_bytes": need[i],
                "read_gbs": f"{statistics.median(case_read[i]) / 1e9:.4g}",
                "copy_gbs": f"{copy_gbs / 1e9:.4g}", "rounds": args.rounds}
        same_size = _faster_per_round(*(times[i, p] for p in SAME_SIZE_PROBES))
        for name in (*args.providers, *PROBES):
            if (i, name) not in callables:
                writer.write({**base, "provider": name, "status": status[i, name]})
                continue
            t = times[i, name]
            fractions = [need[i] / ti / bw for ti, bw in zip(t, case_read[i], strict=True)]
            same = [tn / ti for tn, ti in zip(same_size, t, strict=True)]
            writer.write({**base, "provider": name, "status": "ok",
                          "repeats": args.fast_reps if name in FAST_REPS else args.reps,
                          "median_ms": f"{statistics.median(t) * 1e3:.4g}",
                          "min_ms": f"{min(t) * 1e3:.4g}", "max_ms": f"{max(t) * 1e3:.4g}",
                          "read_fraction": f"{statistics.median(fractions):.4g}",
                          "read_fraction_min": f"{min(fractions):.4g}",
                          "read_fraction_max": f"{max(fractions):.4g}",
                          "same_size_fraction": f"{statistics.median(same):.4g}",
                          "same_size_fraction_min": f"{min(same):.4g}",
                          "same_size_fraction_max": f"{max(same):.4g}"})
    for (key, dtype), t in bw_times.items():
        writer.write({**info, "batch": args.batch, "k": args.k, "vocab": args.vocab, "dtype": dtype,
                      "family": family, "provider": key, "status": "ok", "rounds": args.rounds,
                      "repeats": args.fast_reps,
                      "median_ms": f"{statistics.median(t) * 1e3:.4g}", "min_ms": f"{min(t) * 1e3:.4g}",
                      "max_ms": f"{max(t) * 1e3:.4g}",
                      # the fp32 copy probe runs whatever --dtypes selects; bf16 alone has no fp32 read
                      "read_gbs": f"{read_gbs[dtype] / 1e9:.4g}" if dtype in read_gbs else "",
                      "copy_gbs": f"{copy_gbs / 1e9:.4g}"})


def _case_order(providers: list[str]) -> list[str]:
    """A case's timing order in an even round (odd rounds reverse it): ours, then its read probes, so that
    its fractions are against reads taken seconds from it, then the baselines."""
    first = ["ours"] if "ours" in providers else []
    return [*first, *PROBES, *(p for p in providers if p != "ours")]


def _faster_per_round(*probes: list[float]) -> list[float]:
    """Per round, the shortest of the read probes' times: that round's read."""
    return [min(ts) for ts in zip(*probes, strict=True)]


def _as_words(x: torch.Tensor) -> torch.Tensor:
    """The bytes of contiguous logits ``x`` as a flat tensor of float32 words, for native.stream_sum (a
    16-bit tensor's pairs of entries read as one word; an odd last entry left out)."""
    flat = x.reshape(-1)
    if x.dtype == torch.float32:
        return flat
    return flat[: flat.numel() - flat.numel() % 2].view(torch.float32)


def same_size_words(case: Case, need: int) -> torch.Tensor:
    """The first ``need`` bytes of the case's logits (rounded down to whole 32-bit words), contiguous: what
    the ``stream_need`` and ``int16_need`` probes read."""
    return _as_words(case.logits)[: need // 4]


def same_size_entries(case: Case, need: int) -> torch.Tensor:
    """The first ``need`` bytes of the case's logits, entries of its own dtype: what ``sum_need`` reads."""
    return case.logits.reshape(-1)[: need // case.logits.element_size()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m benchmarks.bench_native_cpu", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--threads", type=int, default=2, help="torch and OpenMP threads (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of the whole interleaved sweep")
    ap.add_argument("--reps", type=int, default=2, help="timed calls per baseline provider and round (median)")
    ap.add_argument("--fast-reps", type=int, default=7,
                    help="timed calls per round of ours and of the read probes (median; default 7)")
    ap.add_argument("--families", type=choice_list(FAMILIES), default=list(FAMILIES))
    ap.add_argument("--dtypes", type=choice_list(tuple(DTYPES)), default=list(DTYPES))
    ap.add_argument("--modes", type=choice_list(MODES), default=list(MODES))
    ap.add_argument("--drafts", type=choice_list(DRAFTS), default=list(DRAFTS))
    ap.add_argument("--providers", type=choice_list(PROVIDERS), default=list(PROVIDERS))
    ap.add_argument("--evict-mib", type=int, default=0,
                    help="MiB written before every timed call (default 0: twice the last-level cache, >= 256)")
    ap.add_argument("--out", required=True, help="CSV path (written row by row)")
    args = ap.parse_args(argv)
    require_positive(ap, args, ("batch", "k", "vocab", "threads", "rounds", "reps", "fast_reps"))
    if args.evict_mib < 0:
        ap.error(f"--evict-mib must be >= 0, got {args.evict_mib}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    if not native.has_device("cpu"):
        raise SystemExit("specdec_kernels._C is not built: pip install --no-build-isolation -e .")
    torch.set_num_threads(args.threads)
    isa = os.environ.get("SPECDEC_CPU_ISA")  # part of the command: it picks the build that runs
    command = (f"SPECDEC_CPU_ISA={isa} " if isa else "") + "python -m benchmarks.bench_native_cpu " + \
        " ".join(sys.argv[1:] if argv is None else argv)
    evict_mib = args.evict_mib or evict_bytes(largest_cache_bytes()) >> 20
    _evict_caches(evict_mib << 20)
    info = {**provenance(torch.device("cpu")), "command": command.strip(), "evict_mib": evict_mib}
    info["device"] += f" isa={native._load().CPU_ISA}"
    gen = torch.Generator().manual_seed(0)
    vllm = vllm_providers(args) if {"vllm", "vllm_step"} & set(args.providers) else {}
    columns = CASE_COLUMNS + RESULT_COLUMNS
    with CsvWriter(args.out, columns) as writer:
        for family in args.families:
            t0 = time.perf_counter()
            run_family(family, args, gen, writer, info, vllm)
            print(f"{family}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
