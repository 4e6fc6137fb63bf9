"""The V1 Triton audit target (``vllm-v1-triton``) against released vLLM Python sources (``--vllm-src``).

The sources are unpacked wheels under ``.cache/vllm-<version>`` (``.ci/run`` extracts them); each test that needs
one skips when its ``vllm/__init__.py`` is absent. What runs under the sources is checked in a subprocess that
imports vLLM from them, as the CLI's own rerun does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec_kernels.audit.__main__ import main
from tests.audit.test_audit_vllm_releases import needs_sources, sources
from tests.conftest import REPO

PROBE = """
import json, sys
import triton
from specdec_kernels.audit import vllm_targets
module = vllm_targets.v1_triton_module()
target = vllm_targets.v1_triton_target()
print(json.dumps({
    "file": module.__file__,
    "fly": hasattr(module, "apply_fly_random_acceptance_kernel"),
    "interpreted": isinstance(module.rejection_random_sample_kernel, triton.runtime.interpreter.InterpretedFunction),
    "refusal": target.refusal,
    "versions": target.versions,
    "description": target.description,
}))
"""


def _env(version: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=os.pathsep.join([str(sources(version)), str(REPO)]), VLLM_TARGET_DEVICE="cpu",
               TRITON_INTERPRET="1")
    return env


def test_vllm_src_without_vllm_names_the_releases_the_v1_target_reads(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["vllm-v1-triton", "--vllm-src", str(tmp_path), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("audit: error: --vllm-src: no vllm package in") and "0.32.x or 0.33.x" in err, err


@pytest.mark.slow
@needs_sources("0.33.0")
def test_v1_triton_target_loads_033s_rejection_sampler():
    """Under ``--vllm-src .cache/vllm-0.33.0`` the target runs 0.33's ``rejection_sampler.py`` (the release that
    adds FLy), its kernels interpreted, bonus tokens through vLLM's non-CPU sampler branches (no compiled ops)."""
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=_env("0.33.0"), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = json.loads(proc.stdout.splitlines()[-1])
    assert probe["file"] == str(sources("0.33.0") / "vllm" / "v1" / "sample" / "rejection_sampler.py")
    assert probe["fly"] and probe["interpreted"] and probe["refusal"] is None
    assert probe["versions"] == {"vllm": "0.33.0", "vllm_source": ".cache/vllm-0.33.0",
                                 "bonus_sampler": "forward_native"}
    assert "forward_native" in probe["description"]


@pytest.mark.slow
@needs_sources("0.28.0")
def test_v1_triton_refuses_a_release_it_has_not_read_in_one_line(tmp_path):
    """vLLM 0.28.0's sources import, but the V1 target (and the plugin its planted bugs run through) reads 0.32 and
    0.33 only: exit 2, one line naming both the release found and the ones it reads, the refusal in the report."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    cmd = [sys.executable, "-m", "specdec_kernels.audit", "vllm-v1-triton", "--vllm-src", ".cache/vllm-0.28.0",
           "--families", "greedy", "--out", str(tmp_path), "--quiet"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert line.startswith("audit: vllm-v1-triton cannot run here") and "0.28.0" in line and "0.32.x, 0.33.x" in line
    report = json.loads((tmp_path / "vllm-v1-triton.json").read_text())
    assert "0.28.0" in report["target"]["refusal"]


@pytest.mark.slow
@needs_sources("0.33.0")
def test_033_v1_triton_rejects_min_p_on_draft_rows_and_passes_the_rest(tmp_path):
    """0.33's V1 sampler still applies min-p to the bonus row only (finding 3): a min-p case is rejected, a top-k
    case and a greedy batch pass, and a planted bug run through the plugin's drop-in is caught."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    cmd = [sys.executable, "-m", "specdec_kernels.audit", "vllm-v1-triton", "--vllm-src", ".cache/vllm-0.33.0",
           "--families", "first-token,greedy,mutants", "--tv", "0.4", "--mutant-tv", "0.4", "--cases",
           "first-stoch-T1-topk3,first-stoch-T1-minp0.2,greedy-stoch-in-mixed,ratio_inverted",
           "--out", str(tmp_path), "--quiet"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads((tmp_path / "vllm-v1-triton-0.33.0.json").read_text())
    verdicts = {o["name"]: o["verdict"] for o in report["outcomes"]}
    assert verdicts == {"first-stoch-T1-topk3": "pass", "first-stoch-T1-minp0.2": "FAIL",
                        "greedy-stoch-in-mixed-batch": "pass", "ratio_inverted": "caught"}, proc.stderr[-3000:]
    assert proc.returncode == 1 and report["verdict"] == "LOSSY"
