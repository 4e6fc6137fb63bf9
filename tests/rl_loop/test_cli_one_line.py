"""Every rl_loop command reports a command-line mistake (a mistyped flag, a missing or bad argument) in one
line, ``python -m ...: error: ...``, exit status 2, with no usage block."""

from __future__ import annotations

import importlib

import pytest

COMMANDS = [
    "rl_loop.__main__", "rl_loop.run.equivalence", "rl_loop.backends.vllm_check",
    "rl_loop.sim.__main__", "rl_loop.sim.sweep", "rl_loop.sim.calibrate", "rl_loop.sim.shape_table",
    "rl_loop.sim.preregister", "rl_loop.sim.gpu_preregister", "rl_loop.sim.ray_workers",
    "rl_loop.experiments.bench", "rl_loop.experiments.decode_bench", "rl_loop.experiments.repeat",
    "rl_loop.experiments.verify_bench", "rl_loop.experiments.seeds", "rl_loop.experiments.tree_bench",
    "rl_loop.experiments.gpu_rollout", "rl_loop.experiments.drafter_acceptance",
]


@pytest.mark.parametrize("module", COMMANDS)
def test_a_mistyped_flag_is_one_line(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main(["--no-such-flag", "1"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert len(err.splitlines()) == 1 and err.startswith("python -m rl_loop") and ": error: " in err, err


def test_every_command_is_listed():
    """A new rl_loop command with a ``main`` joins the list above."""
    import pathlib

    root = pathlib.Path(importlib.import_module("rl_loop").__file__).parent
    found = {".".join(("rl_loop", *p.relative_to(root).with_suffix("").parts)) for p in root.rglob("*.py")
             if "\ndef main(" in p.read_text()}
    assert found == set(COMMANDS)
