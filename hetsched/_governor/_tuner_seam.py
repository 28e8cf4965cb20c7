"""The seam between the governor and the tuner that auto-tunes a phase's clocks.

:class:`Tuner` is what the engine (:mod:`._engine`), the tuning driver (:mod:`._tuning`) and
:mod:`hetsched.testing` use of a tuner, and nothing more: a tuner proposes points to run a
phase at, is told what each run measured, and ends with a :class:`~._model.PhaseModel`.
:class:`~._tuner.AxisTuner` (coordinate descent, with the budget-filling strategy of
:mod:`._tuner_budget` on top under a budget) is the one hetsched ships; :class:`TunerFactory` is how :class:`~._tuning.PhaseTuning` makes one, so a
different tuner replaces it without touching the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ._model import Measurement, PhaseModel
from ._points import DomainSpec, OperatingPoint
from ._tuner_config import TunerConfig

__all__ = ["Tuner", "TunerFactory", "TunerSettings", "TunerStatistics"]


@dataclass(frozen=True)
class TunerStatistics:
    measurements: int
    points: int
    passes_done: int
    done: bool
    measurement_limit: int = 0
    """The most measurements the tuner takes (:attr:`Tuner.measurement_limit`)."""
    cut_short: bool = False
    """Ended by :meth:`Tuner.finish` (the effort bound), on the best point measured by then."""


@dataclass(frozen=True)
class TunerSettings:
    """What the governor's configuration asks of a tuner for one phase."""

    slowdown: float
    """The slowdown bound this phase is tuned to."""
    power_cap_w: float | None = None
    """The budget's cap on predicted power (None: no budget)."""
    measured_cap_w: float | None = None
    """The cap on a point's measured power (None: ``power_cap_w``)."""
    levels: int = 5
    passes: int = 2
    repeats: int = 2
    guarded: bool = True
    """Whether budget-filling probes may run watched points near the cap."""
    max_measurements: int | None = None
    """The most measurements the tune may take (None: the tuner's own bound)."""
    config: TunerConfig = field(default_factory=TunerConfig)
    """The tuner's constants."""


@runtime_checkable
class Tuner(Protocol):
    """One phase's auto-tune, driven by the engine: ``propose`` / ``record`` until ``done``."""

    def propose(self) -> OperatingPoint | None:
        """The next point to run the phase at (None: done)."""

    def record(self, point: OperatingPoint, measurement: Measurement) -> None:
        """What one run of the phase at ``point`` measured."""

    def reject(self, point: OperatingPoint, power_w: float) -> None:
        """A watched run at ``point`` was stopped at ``power_w``, over the cap: never again."""

    def guarded(self, point: OperatingPoint) -> bool:
        """Whether ``point`` is a watched probe (the engine stops it at the first reading over the cap)."""

    def finish(self) -> bool:
        """End now on the best point measured (the effort bound); False: nothing to build on."""

    def model(self) -> PhaseModel | None:
        """The tuned model (its ``best`` set) once done, else None."""

    def measured(self) -> list[tuple[OperatingPoint, Measurement]]:
        """Every point measured so far, with what it measured."""

    @property
    def center(self) -> OperatingPoint:
        """The point the tuning is centred on now (the engine's fallback while it tunes)."""

    @property
    def measurement_limit(self) -> int:
        """The most measurements this tuner takes."""

    @property
    def cut_short(self) -> bool:
        """Ended by :meth:`finish` rather than by converging."""

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains this tuner sweeps."""

    @property
    def done(self) -> bool: ...

    def statistics(self) -> TunerStatistics: ...


class TunerFactory(Protocol):
    """Makes the tuner of one phase (``domains``: every domain's spec; ``tune``: those to sweep)."""

    def __call__(self, domains: Mapping[str, DomainSpec], tune: Sequence[str], settings: TunerSettings) -> Tuner: ...
