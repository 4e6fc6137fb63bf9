"""Every command of rl_loop and of the benchmarks reports a command-line mistake (a mistyped flag, a missing or
bad argument) in one line, ``python -m ...: error: ...``, exit status 2, with no usage block."""

from __future__ import annotations

import importlib
import pathlib

import pytest

COMMANDS = {
    "rl_loop": [
        "rl_loop.__main__", "rl_loop.run.equivalence", "rl_loop.backends.vllm_check", "rl_loop.sim.__main__",
        "rl_loop.sim.sweep", "rl_loop.sim.calibrate", "rl_loop.sim.shape_table", "rl_loop.sim.preregister",
        "rl_loop.sim.gpu_preregister", "rl_loop.sim.ray_workers", "rl_loop.experiments.bench",
        "rl_loop.experiments.decode_bench", "rl_loop.experiments.repeat", "rl_loop.experiments.verify_bench",
        "rl_loop.experiments.seeds", "rl_loop.experiments.tree_bench", "rl_loop.experiments.gpu_rollout",
        "rl_loop.experiments.drafter_acceptance",
    ],
    "benchmarks": [
        "benchmarks.ab_builds", "benchmarks.bench_block_traversal", "benchmarks.bench_chain",
        "benchmarks.bench_decoder_step", "benchmarks.bench_drafter", "benchmarks.bench_native_cpu",
        "benchmarks.bench_sampling_mask", "benchmarks.bench_tree", "benchmarks.call_overhead",
        "benchmarks.native_cpu_table", "benchmarks.overlap_probe", "benchmarks.plot", "benchmarks.roofline",
        "benchmarks.stream_compute_probe", "benchmarks.vllm_e2e_cpu", "benchmarks.gpu.flashinfer_ext",
        "benchmarks.gpu.prepare", "benchmarks.gpu.sweep",
    ],
}


@pytest.mark.parametrize("module", [m for mods in COMMANDS.values() for m in mods])
def test_a_mistyped_flag_is_one_line(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main(["--no-such-flag", "1"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert len(err.splitlines()) == 1 and err.startswith(f"python -m {module.split('.')[0]}") and ": error: " in err, err


@pytest.mark.parametrize("package", list(COMMANDS))
def test_every_command_is_listed(package):
    """A new command (a module with an argument parser and a ``main``) joins the lists above."""
    root = pathlib.Path(importlib.import_module(package).__file__).parent
    found = {".".join((package, *p.relative_to(root).with_suffix("").parts)) for p in root.rglob("*.py")
             if "Parser(" in p.read_text() and "\ndef main(" in p.read_text()}
    assert found == set(COMMANDS[package])
