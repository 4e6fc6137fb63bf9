"""Where a run computes (``--device cpu|cuda``): the device check, the weights' dtype and the verification
backend of each device. Everything device-specific in rl_loop is named here or in ``cuda_graphs.py``; the
rest of the loop places its tensors on the policy's device and is otherwise the same code on both.

- ``cpu`` (default): float32 weights, verification on the native CPU kernels when built (``"default"``);
  the behaviour and tokens of every run before ``--device`` existed.
- ``cuda``: bf16 weights (the policy's LM-head matmul runs in bf16; ``Qwen3`` hands verification float32
  logits), verification with ``backend="auto"`` (the library's Triton / CUDA kernels), and CUDA graphs for
  the policy forward of both arms (``cuda_graphs.py``).
"""

from __future__ import annotations

import torch

from ..run.usage import UsageError

DEVICES = ("cpu", "cuda")


def check_device(name: str, cuda_available: bool | None = None) -> None:
    """``--device``: one of :data:`DEVICES`, and ``cuda`` only where torch sees a GPU (``cuda_available``
    overrides ``torch.cuda.is_available()`` for tests)."""
    if name not in DEVICES:
        raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if name == "cuda" and not available:
        raise UsageError("--device cuda: torch.cuda is not available here (no GPU, or a CPU-only torch); "
                         "use --device cpu")


def weight_dtype(device: str | torch.device) -> torch.dtype:
    """The policy's and drafter's weights on ``device``: bf16 on cuda, float32 on cpu."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def place(module: torch.nn.Module, device: str | torch.device) -> torch.nn.Module:
    """``module`` moved to ``device`` in its :func:`weight_dtype` (a no-op on cpu: float32 stays)."""
    return module.to(device=torch.device(device), dtype=weight_dtype(device))


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (where its inputs must live)."""
    return next(module.parameters()).device
