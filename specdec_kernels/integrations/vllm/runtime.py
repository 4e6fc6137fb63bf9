"""Settings shared by the V1 and V2 patches: backend choice, Philox keys, and the optional usage trace.

Environment variables:

- ``SPECDEC_VLLM_BACKEND``: verify_chain backend ("auto" by default: the fastest compiled or GPU backend
  for the logits' device; on CPU the Triton interpreter is never chosen automatically).
- ``SPECDEC_VLLM_METHOD``: verify_chain method, "token" (default) or "block" (block verification, Sun
  et al.). Block verification needs draft probabilities, which vLLM passes for probabilistic drafting
  (``draft_sample_method="probabilistic"`` with ``rejection_sample_method="standard"``: EAGLE / EAGLE-3, MTP,
  draft model, DFlash); for drafts without them (ngram, suffix, greedy drafting) it is token level.
- ``SPECDEC_VLLM_TRACE``: path of a file to which every patched call appends one line
  ``<sampler> <backend> <pid> <num_requests> <num_draft_tokens> <num_accepted>``; for checking that the patch ran in the
  worker process and for acceptance statistics. Off when unset (then nothing syncs with the host).
"""

from __future__ import annotations

import os

import torch

from ...api import available_backends

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def backend_for(device: torch.device) -> str:
    """The verify_chain backend to use for logits on ``device``."""
    chosen = os.environ.get("SPECDEC_VLLM_BACKEND", "auto")
    if chosen != "auto":
        return chosen
    return available_backends(device)[0]


METHODS = ("token", "block")


def chain_method() -> str:
    """The verify_chain method from ``SPECDEC_VLLM_METHOD`` ("token" when unset); a clear error otherwise."""
    method = os.environ.get("SPECDEC_VLLM_METHOD", "token")
    if method not in METHODS:
        raise ValueError(f"SPECDEC_VLLM_METHOD must be one of {METHODS}, got {method!r}")
    return method


def fresh_keys(num_reqs: int, device: torch.device) -> torch.Tensor:
    """[num_reqs] int64 Philox keys drawn from torch's default generator (unseeded requests)."""
    return torch.randint(_INT64_MIN, _INT64_MAX, (num_reqs,), dtype=torch.int64, device=device)


def key_from_generator(generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """[1] int64 Philox key drawn from a seeded request's generator.

    One draw per verification step: the generator advances deterministically, so a seeded request gets
    the same keys (and tokens) in every run, and a new key each step, so no (key, position) pair is
    ever used twice.
    """
    key = torch.randint(_INT64_MIN, _INT64_MAX, (1,), dtype=torch.int64, generator=generator,
                        device=generator.device)
    return key.to(device)


_announced: list[str] = []


def announce(message: str | None = None) -> None:
    """Log ``message`` once per process through vLLM's logger.

    vLLM configures logging after it loads plugins, so a message given at plugin load is kept and
    printed by the first patched call, when vLLM's handler exists.
    """
    if message is not None:
        _announced[:] = [message]
        return
    if _announced and _announced[0]:
        from vllm.logger import init_logger

        init_logger("vllm.specdec_kernels").info(_announced[0])
        _announced[0] = ""


def trace(sampler: str, backend: str, num_reqs: int, num_drafts: int, num_accepted: torch.Tensor) -> None:
    """Append one usage line to ``$SPECDEC_VLLM_TRACE`` when it is set."""
    announce()
    path = os.environ.get("SPECDEC_VLLM_TRACE")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"{sampler} {backend} {os.getpid()} {num_reqs} {num_drafts} {int(num_accepted.sum())}\n")
