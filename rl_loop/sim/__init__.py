"""Performance simulator: projects what speculative rollouts buy an RL step, from this CPU to 2048 GPUs.

Entry points: ``python -m rl_loop.sim --preset NAME`` (and ``sweep``), ``python -m rl_loop.sim.calibrate``;
in code, :func:`rl_loop.sim.presets.evaluate` on a :class:`~rl_loop.sim.presets.Scenario`.
"""

from .generation import Parallelism, Speculation, Workload, simulate_generation
from .hardware import HARDWARE, Hardware, get_hardware
from .model_spec import QWEN3_8B, QWEN3_235B_A22B, ModelSpec, eagle3_head
from .presets import PRESETS, Scenario, evaluate, get_preset
from .step import StepSetup, simulate_step

__all__ = [
    "HARDWARE", "Hardware", "get_hardware", "ModelSpec", "QWEN3_8B", "QWEN3_235B_A22B", "eagle3_head",
    "Parallelism", "Speculation", "Workload", "simulate_generation", "StepSetup", "simulate_step",
    "PRESETS", "Scenario", "evaluate", "get_preset",
]
