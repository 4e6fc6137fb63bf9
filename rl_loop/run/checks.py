"""Checks of a run before any work starts: a user mistake fails at once, in one line naming the flag.

The values of the flags are checked where they are defined, by :class:`~rl_loop.config.RunConfig`; here is
what depends on this machine and on the files: ``check_run(cfg)`` (called by ``train.run``) checks the device,
the verification backend, the rollout backend, whether the draft rounds fit the policy's context, ``--out``
and, with ``--resume``, the checkpoint (``state.read_checkpoint``). Everything it raises is a
:class:`UsageError`; the CLIs print it as one line.
"""

from __future__ import annotations

from dataclasses import replace
from importlib.util import find_spec

from ..config import RunConfig
from ..step.engine import check_device
from ..step.rollouts import TreeShape
from .state import read_checkpoint
from .usage import UsageError, check_out_dir


def round_width(cfg: RunConfig) -> int:
    """Positions one verification round writes per request: chain k + 1, tree its node count, AR 1."""
    if cfg.spec == "chain":
        return cfg.k + 1
    if cfg.spec == "tree":
        return TreeShape.for_k(cfg.k).num_nodes
    return 1


def check_context(cfg: RunConfig) -> None:
    """``--k`` within what a round can use and the policy's context can hold (an absurd k would otherwise run
    out of memory in the drafter's warm start, a minute in)."""
    if cfg.spec == "none":
        return
    if cfg.k > cfg.max_new_tokens:
        raise UsageError(f"--k {cfg.k} is larger than max_new_tokens ({cfg.max_new_tokens}): a round never keeps "
                         "more tokens than a response has")
    from ..task import CharTokenizer, make_splits

    tok = CharTokenizer()
    train, val = make_splits(replace(cfg.task, seed=cfg.seed))
    prompt = max(len(tok.encode(p.prompt, bos=True)) for p in train + val)
    need = prompt + cfg.max_new_tokens + round_width(cfg) + 1
    if need > cfg.model.max_position_embeddings:
        raise UsageError(f"--k {cfg.k} does not fit the policy's context: prompt ({prompt}) + max_new_tokens "
                         f"({cfg.max_new_tokens}) + {round_width(cfg)} positions per round + 1 = {need} > "
                         f"max_position_embeddings ({cfg.model.max_position_embeddings})")


def check_verify_backend(name: str, device: str = "cpu") -> None:
    """``--verify-backend``: ``default`` or a specdec_kernels backend that runs on ``device``'s tensors here."""
    import specdec_kernels as sk
    from specdec_kernels.api import BACKENDS

    names = ("default", *(b for b in BACKENDS if b != "auto"))
    if name not in names:
        raise UsageError(f"--verify-backend must be one of {', '.join(names)}, got {name!r}")
    available = sk.available_backends(device)
    if name != "default" and name not in available:
        hint = {"triton": " (on CPU Triton runs only through its interpreter: set TRITON_INTERPRET=1)",
                "cpu": " (the native extension is not built: python setup.py build_ext --inplace)",
                "cuda": " (rollouts run on CPU tensors: --device cuda)"}.get(name, "")
        raise UsageError(f"--verify-backend {name} is not available here{hint}; available: {', '.join(available)}")


def check_device_run(cfg: RunConfig) -> None:
    """``--device cuda`` runs the in-process engine of the sync pipeline (Ray workers, the async pipeline and
    vLLM place their own models) with the torch decode path (``--decode native`` is a CPU kernel)."""
    check_device(cfg.device)
    if cfg.device == "cpu":
        return
    if cfg.backend != "own" or cfg.pipeline != "sync" or cfg.rollout_workers != 1:
        raise UsageError("--device cuda runs --backend own --pipeline sync --rollout-workers 1, got "
                         f"--backend {cfg.backend} --pipeline {cfg.pipeline} --rollout-workers {cfg.rollout_workers}")
    if cfg.decode == "native":
        raise UsageError("--decode native is a CPU kernel; --device cuda takes --decode auto or torch")


def check_backend(cfg: RunConfig) -> None:
    """``--backend vllm`` needs vLLM installed and a configuration it can serve."""
    if cfg.backend != "vllm":
        return
    if find_spec("vllm") is None:
        raise UsageError("--backend vllm needs vLLM, which is not installed (pip install vllm); "
                         "--backend own needs nothing more")
    from ..backends.vllm_backend import check_config

    try:
        check_config(cfg)
    except ValueError as e:
        raise UsageError(str(e)) from e


def check_run(cfg: RunConfig) -> None:
    """Every check above, cheapest first; with ``cfg.resume`` the checkpoint too (``state.read_checkpoint``)."""
    check_device_run(cfg)
    check_verify_backend(cfg.verify_backend, cfg.device)
    check_backend(cfg)
    check_context(cfg)
    if cfg.resume:  # before check_out_dir, which would create a mistyped --out
        read_checkpoint(cfg)
    check_out_dir(cfg.out)
