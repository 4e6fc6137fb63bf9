"""Shared test configuration: Triton tests need the interpreter on CPU-only machines."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON_RUNNABLE = HAS_TRITON and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

requires_triton = pytest.mark.skipif(
    not TRITON_RUNNABLE, reason="needs triton and a GPU, or TRITON_INTERPRET=1 on CPU"
)
