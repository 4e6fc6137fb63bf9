"""The V2 audit target against released vLLM Python sources (``--vllm-src``), and the narrow cases' drafts drawn
by the system under test.

vLLM up to 0.28.0 drew V2's probabilistic draft proposal, the acceptance uniform and the recovery noise from one
Philox (seed, position) stream; 0.29.0 salts the draft's position (vLLM PR #54282, ``_DRAFT_NOISE_SALT``). The
narrow case, drafting through V2's own ``gumbel_sample``, must reject 0.28.0 and pass 0.29.0 and 0.33.0. The
sources are unpacked wheels under ``.cache/vllm-<version>`` (``.ci/run`` extracts them); each test that needs one
skips when its ``vllm/__init__.py`` is absent. Each audit runs in a subprocess (the CLI reruns itself there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec_kernels.audit.__main__ import main
from specdec_kernels.exactness.chain_law import NARROW_CASES, draft_proposals, sample_narrow
from specdec_kernels.reference.chain import ChainResult
from tests.conftest import REPO

NARROW_TRIALS = 1000  # 0.28.0's deterministic-draft narrow statistic is far past the critical value there


def sources(version: str) -> Path:
    return REPO / ".cache" / f"vllm-{version}"


def needs_sources(version: str):
    path = sources(version)
    return pytest.mark.skipif(not (path / "vllm" / "__init__.py").exists(),
                              reason=f"vLLM {version} sources absent at {path} (.ci/run unpacks them)")


def _audit(version: str, out: Path, *args: str) -> tuple[int, dict]:
    """``python -m specdec_kernels.audit vllm-v2-triton --vllm-src <sources>`` in a subprocess; (status, report)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    cmd = [sys.executable, "-m", "specdec_kernels.audit", "vllm-v2-triton", "--vllm-src",
           str(sources(version).relative_to(REPO)), "--out", str(out), "--quiet", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    report = out / f"vllm-v2-triton-{version}.json"
    assert report.exists(), (proc.stdout + proc.stderr)[-3000:]
    return proc.returncode, json.loads(report.read_text())


def _outcomes(report: dict) -> dict[str, dict]:
    return {o["name"]: o for o in report["outcomes"]}


def test_narrow_drafts_come_from_the_systems_draft_sampler():
    """A verifier that declares ``draft_sampler`` drafts the narrow case's proposals itself, keyed by the request's
    seed and position; without one the drafts are our Philox Gumbel-max (their law: q)."""
    case = NARROW_CASES[0]
    _, q = case.pair()
    seen = {}

    def verify(target_logits, draft_token_ids, cu, draft_probs, temperature, top_k, top_p, seed, position):
        seen["drafts"] = draft_token_ids.clone()
        n = cu.numel() - 1
        out = torch.stack([draft_token_ids, torch.full((n,), 5)], dim=1)
        return ChainResult(out.to(torch.int32), torch.ones(n, dtype=torch.int32))

    def draft_sampler(draft_logits, temperature, seed, position):
        seen["sampler"] = (draft_logits.clone(), temperature.clone(), seed.clone(), position.clone())
        return (seed + position) % 16

    verify.draft_sampler = draft_sampler
    cells = sample_narrow(verify, case, 40)
    logits, temperature, seed, position = seen["sampler"]
    assert torch.equal(seen["drafts"], (seed + position) % 16)
    assert torch.equal(logits, torch.log(q).expand(40, 16)) and torch.equal(temperature, torch.ones(40))
    assert torch.equal(seed, case.seed * (1 << 32) + torch.arange(40))
    assert torch.equal(cells, torch.full((40,), 16 + 5))  # accepted, bonus token 5

    drafts = draft_proposals(lambda *a: None, q, seed.repeat(100), torch.arange(4000))
    freq = torch.bincount(drafts, minlength=16).double() / drafts.numel()
    assert (freq - q.double()).abs().max() < 0.03


@pytest.mark.parametrize("target, message", [("cpu", "--vllm-src applies to"), ("vllm-v2-triton", "no vllm package in")])
def test_vllm_src_refuses_other_targets_and_folders_without_vllm(target, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([target, "--vllm-src", str(tmp_path), "--out", str(tmp_path)])
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
@needs_sources("0.28.0")
def test_narrow_rejects_028_shared_stream(tmp_path):
    """vLLM 0.28.0's V2 drafts on the (seed, position) stream its recovery noise comes from: with point-mass
    drafts (q not handed to the verifier) the recovery redraws the draft's own Gumbel noise, and the narrow case
    rejects it at 1,000 trials; the report names that vLLM and the sources it ran."""
    status, report = _audit("0.28.0", tmp_path, "--families", "narrow", "--cases", "narrow-deter",
                            "--narrow-trials", str(NARROW_TRIALS))
    assert status == 1 and report["verdict"] == "LOSSY"
    assert report["target"]["versions"]["vllm"] == "0.28.0"
    assert report["target"]["versions"]["vllm_source"] == ".cache/vllm-0.28.0"
    assert "--vllm-src .cache/vllm-0.28.0" in report["command"]
    outcome = _outcomes(report)["narrow-deter-V16-reversed"]
    assert outcome["verdict"] == "FAIL" and outcome["pvalue"] < 1e-12, outcome


@pytest.mark.slow
@needs_sources("0.29.0")
def test_narrow_passes_029_the_first_fixed_release(tmp_path):
    """The same audit, seeds and trials on 0.29.0 (PR #54282: the draft's position salted) passes."""
    status, report = _audit("0.29.0", tmp_path, "--families", "narrow", "--cases", "narrow-deter",
                            "--narrow-trials", str(NARROW_TRIALS))
    assert report["target"]["versions"]["vllm"] == "0.29.0"
    assert status == 0 and report["verdict"] == "PASS", _outcomes(report)


@pytest.mark.slow
@needs_sources("0.33.0")
def test_033_passes_narrow_and_small_law_cases(tmp_path):
    """0.33.0 through the same adapter: narrow, a top-k and a min-p first-token case, greedy identity; the planted
    bugs run through the plugin's drop-in there (0.33 is a release it supports) and one is caught."""
    status, report = _audit("0.33.0", tmp_path, "--families", "first-token,greedy,narrow,mutants", "--tv", "0.4",
                            "--mutant-tv", "0.4", "--narrow-trials", str(NARROW_TRIALS), "--cases",
                            "first-stoch-T0.7-topk3,first-deter-T1-minp0.2,greedy-deter-in-mixed,narrow-deter,"
                            "ratio_inverted")
    outcomes = _outcomes(report)
    assert report["target"]["versions"]["vllm"] == "0.33.0"
    assert {o["verdict"] for n, o in outcomes.items() if n != "ratio_inverted"} == {"pass"}, outcomes
    assert outcomes["ratio_inverted"]["verdict"] == "caught", outcomes
    assert status == 0
