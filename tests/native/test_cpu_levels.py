"""The package on x86-64 CPUs this machine is not, under qemu-user: ``qemu-x86_64 -cpu Haswell`` (AVX2 + FMA,
no AVX-512) and ``-cpu Nehalem`` (SSE4.2, no AVX). QEMU's CPU model answers the dispatcher's CPUID questions
and faults (SIGILL) on any instruction the model lacks, AVX-512 included, so this is the test of "no code
built for an instruction set runs before the dispatcher chose it" and of the dispatch itself.

Each model runs one emulated process: it imports the package (the native extension loads, which used to
fault in an AVX-512 object's load-time constructor), reports the instruction set the dispatcher picked, and
verifies chains and trees on the native backend; the tokens must equal the reference's, computed here
without emulation. The inputs are built here and handed over in a file, so they do not depend on the
emulated CPU. The two processes run side by side, about a minute in all on two cores.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import native
from tests.conftest import REPO
from tests.native.test_native import _assert_same, _chain_case, _tree_case

ROOT = str(REPO)
QEMU = shutil.which("qemu-x86_64")
# QEMU CPU model -> (SPECDEC_CPU_ISA, the build the dispatcher must pick): Nehalem is asked for AVX2 kernels,
# which it cannot run, and must fall back to the generic build with one warning.
MODELS = {"Haswell": ("", "avx2"), "Nehalem": ("avx2", "generic")}
FALLBACK_WARNING = "SPECDEC_CPU_ISA=avx2: this CPU cannot run the avx2 kernels; using generic"

pytestmark = [
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 CPU models"),
    pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 is not installed (Debian package qemu-user)"),
    pytest.mark.skipif(not native.has_device("cpu"), reason="the native extension was not built"),
    pytest.mark.slow,  # the package under qemu CPU models: minutes
]

_EMULATED = """
    import sys, torch
    import specdec_kernels as sk
    from specdec_kernels import native
    cases = torch.load(sys.argv[1])
    out = {"isa": native._load().CPU_ISA}
    for name, (kind, kw) in cases.items():
        verify = sk.verify_chain if kind == "chain" else sk.verify_tree
        out[name] = tuple(verify(**kw, backend="cpu"))
    torch.save(out, sys.argv[2])
"""


def _cases() -> dict:
    """Chains and trees, greedy and random, fp32 and bf16, V = 151936 among them, with top-k / top-p,
    deterministic and stochastic drafts, token-level and block / traversal verification."""
    gen = torch.Generator().manual_seed(46)
    qwen = 151936
    cases = {
        "chain greedy fp32": ("chain", _chain_case(3, 3, qwen, torch.float32, gen, greedy_frac=1.0)),
        "chain greedy bf16 specials": ("chain", _chain_case(4, 3, 1001, torch.bfloat16, gen, greedy_frac=1.0,
                                                            specials=True)),
        "chain random fp32 deterministic": ("chain", _chain_case(3, 3, qwen, torch.float32, gen, greedy_frac=0.0)),
        "chain random bf16 deterministic": ("chain", _chain_case(3, 3, qwen, torch.bfloat16, gen, greedy_frac=0.0)),
        "chain random bf16 stochastic top-k top-p": ("chain", _chain_case(3, 3, qwen, torch.bfloat16, gen,
                                                                          probs=True, top_k=True, top_p=True)),
        "chain random fp32 stochastic top-p": ("chain", _chain_case(3, 3, qwen, torch.float32, gen, probs=True,
                                                                    top_p=True)),
        "tree greedy bf16": ("tree", _tree_case(2, qwen, torch.bfloat16, gen, greedy_frac=1.0, max_nodes=5)),
        "tree random fp32 iid top-k": ("tree", _tree_case(2, qwen, torch.float32, gen, probs=True, top_k=True,
                                                          max_nodes=5)),
        "tree random bf16 without replacement top-p": ("tree", _tree_case(4, 1001, torch.bfloat16, gen, probs=True,
                                                                           sibling="without_replacement",
                                                                           top_p=True)),
    }
    cases["chain block fp32"] = ("chain", dict(_chain_case(3, 3, 4099, torch.float32, gen, probs=True),
                                               method="block"))
    cases["tree traversal bf16"] = ("tree", dict(_tree_case(3, 4099, torch.bfloat16, gen, probs=True),
                                                 method="traversal"))
    return cases


def test_native_kernels_on_cpus_without_avx512_or_avx(tmp_path):
    """Under Haswell and Nehalem models: the package imports, the dispatcher picks avx2 / generic (Nehalem asked
    for avx2 by SPECDEC_CPU_ISA, with one warning), and every case's tokens (and accepted counts / nodes)
    equal the reference's. Shown able to fail: on the extension as
    it was before the word-threshold table became a constant expression, both processes die with SIGILL
    while the extension loads (an AVX-512 conversion in a load-time constructor)."""
    cases = _cases()
    path = tmp_path / "cases.pt"
    torch.save(cases, path)
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    procs = {model: subprocess.Popen([QEMU, "-cpu", model, sys.executable, "-c", textwrap.dedent(_EMULATED),
                                      str(path), str(tmp_path / f"{model}.pt")],
                                     cwd=ROOT, env={**env, "SPECDEC_CPU_ISA": cap}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
             for model, (cap, _) in MODELS.items()}
    outputs = {model: proc.communicate(timeout=600) for model, proc in procs.items()}
    for model, proc in procs.items():
        stderr = "\n".join(line for line in outputs[model][1].splitlines() if "TCG doesn't support" not in line)
        assert proc.returncode == 0, f"{model}: exit {proc.returncode}\n{stderr[-3000:]}"
    assert FALLBACK_WARNING in outputs["Nehalem"][1] and "SPECDEC_CPU_ISA" not in outputs["Haswell"][1]
    for model, (_, isa) in MODELS.items():
        got = torch.load(tmp_path / f"{model}.pt")
        assert got["isa"] == isa, (model, got["isa"])
        for name, (kind, kw) in cases.items():
            verify = sk.verify_chain if kind == "chain" else sk.verify_tree
            ref = verify(**kw, backend="reference")
            _assert_same(ref, type(ref)(*got[name]), f"{model}: {name}")
