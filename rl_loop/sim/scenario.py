"""A simulator scenario: a step setup plus speculation settings (its own module so that the presets and
the ``cpu-here`` calibration can both build one without importing each other)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .generation import Speculation
from .hardware import Hardware
from .model_spec import ModelSpec
from .step import StepSetup


@dataclass(frozen=True)
class Scenario:
    """A step setup plus speculation settings (``spec.k`` is the default draft length)."""

    name: str
    description: str
    setup: StepSetup
    spec: Speculation
    assumptions: tuple[str, ...] = ()
    paper: dict[str, float] = field(default_factory=dict)

    @property
    def hardware(self) -> Hardware:
        return self.setup.hardware

    @property
    def model(self) -> ModelSpec:
        return self.setup.model

    def with_k(self, k: int) -> Scenario:
        return replace(self, spec=self.spec.with_k(k))

    def with_acceptance(self, acceptance: tuple[float, ...]) -> Scenario:
        return replace(self, spec=replace(self.spec, acceptance=tuple(acceptance)))
