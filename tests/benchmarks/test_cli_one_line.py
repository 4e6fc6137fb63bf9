"""Every benchmark command reports a command-line mistake (a mistyped flag, a missing or bad argument) in one
line, ``python -m ...: error: ...``, exit status 2, with no usage block."""

from __future__ import annotations

import importlib
import pathlib

import pytest

COMMANDS = [
    "benchmarks.ab_builds", "benchmarks.bench_block_traversal", "benchmarks.bench_chain",
    "benchmarks.bench_decoder_step", "benchmarks.bench_drafter", "benchmarks.bench_native_cpu",
    "benchmarks.bench_sampling_mask", "benchmarks.bench_tree", "benchmarks.call_overhead",
    "benchmarks.native_cpu_table", "benchmarks.overlap_probe", "benchmarks.plot", "benchmarks.roofline",
    "benchmarks.stream_compute_probe", "benchmarks.vllm_e2e_cpu", "benchmarks.gpu.flashinfer_ext",
    "benchmarks.gpu.prepare", "benchmarks.gpu.sweep",
]


@pytest.mark.parametrize("module", COMMANDS)
def test_a_mistyped_flag_is_one_line(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main(["--no-such-flag", "1"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert len(err.splitlines()) == 1 and err.startswith("python -m benchmarks") and ": error: " in err, err


def test_every_command_is_listed():
    """A new benchmark command with an argument parser joins the list above."""
    root = pathlib.Path(importlib.import_module("benchmarks").__file__).parent
    found = {".".join(("benchmarks", *p.relative_to(root).with_suffix("").parts)) for p in root.rglob("*.py")
             if "Parser(" in p.read_text() and "\ndef main(" in p.read_text()}
    assert found == set(COMMANDS)
