"""The governor's books: energy and power from telemetry, time and energy per phase.

:class:`PowerMeter` turns telemetry snapshots into the board's energy since start and its
(smoothed) power; :class:`PhaseLedger` keeps, per phase, how often it ran, for how long,
what it cost, how long it is expected to last and how far the phase model's power is off.
Neither decides anything: :class:`~hetsched._governor._engine.GovernorEngine` reads them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from .._snapshot import Snapshot
from ._phase import Phase
from ._statistics import PhaseStatistics

__all__ = ["PhaseLedger", "PowerMeter"]

_EWMA_DURATION = 0.3
"""Weight of the newest run in a phase's expected length. Larger: follows a changed workload
sooner, and one slow run moves the switching decisions more."""
_EWMA_BIAS = 0.2
"""Weight of the newest error in a phase's power-model bias. Larger: follows a warming board
sooner, and noise reaches the cap decisions more."""
_POWER_SMOOTH_S = 1.0
"""Time constant of the smoothed board power (``smooth_w``). Longer: steadier, slower to show a
change."""
INPUT_RAIL_SHARE = 0.8
"""The largest rail with an energy counter is taken for the board's input rail (it carries every
other rail) only if it reads at least this share of the total power; else the meter integrates
the power itself. Larger: a rail that misses part of the board is refused more often."""


class PowerMeter:
    """Energy integrated from telemetry since start, and the board's power now.

    :param counters: use the input rail's cumulative energy where the snapshot carries one
        (a board's own counter, a simulation's exact integral). False where that figure is
        only the telemetry's trapezoid of the very samples the governor takes (a sysfs
        board's INA3221 readings, a live twin's): see :meth:`observe`.
    """

    def __init__(self, *, counters: bool = True) -> None:
        self.energy_j = 0.0
        self.power_w: float | None = None
        """The last power sample (the board's mean power since the sample before)."""
        self.smooth_w: float | None = None
        """Power smoothed over about a second."""
        self.max_smooth_w = 0.0
        self.peak_temp_c: dict[str, float] = {}
        """The hottest each thermal zone has read."""
        self.counters = counters
        self._total_rail: str | None = None
        self._last_counter: float | None = None
        self._last_t: float | None = None

    def observe(self, t: float, snap: Snapshot) -> tuple[float | None, float]:
        """Account for ``snap`` taken at ``t``: returns (power now or None, seconds since the last power sample)."""
        for name, zone in snap.zones.items():
            temp = zone.temp_c
            if temp is not None and math.isfinite(temp) and temp > self.peak_temp_c.get(name, -math.inf):
                self.peak_temp_c[name] = temp
        power = snap.total_power_w
        if power is None:
            vals = [r.power_w for r in snap.rails.values() if r.power_w is not None]
            power = sum(vals) if vals else None
        counter = self._energy_counter(snap, power) if self.counters else None
        dt = t - self._last_t if self._last_t is not None else 0.0
        if counter is not None:
            # The board's own energy counter is better than integrating our sparser samples,
            # and its rate is the mean power since the last sample: samples taken at phase
            # boundaries would otherwise see mostly the instants between phases.
            if self._last_counter is not None and counter >= self._last_counter:
                self.energy_j += counter - self._last_counter
                if dt > 0:
                    power = (counter - self._last_counter) / dt
            self._last_counter = counter
        if power is not None:
            if counter is None and self._last_t is not None and dt > 0:
                # A rail reading is the mean over the interval that just ended (a sensor's
                # averaging window, RAPL's counter delta, a twin's last period), so it stands
                # for the time since the sample before. The trapezoid of the same samples
                # (what a telemetry integral of them is) gives a short busy phase and the long
                # wait after it the same blend of both, whatever their lengths: a point that
                # makes the busy phase slower and longer would look free.
                self.energy_j += power * dt
            if self.smooth_w is None or self._last_t is None:
                self.smooth_w = power
            else:
                a = min(1.0, max(0.0, dt) / _POWER_SMOOTH_S)
                self.smooth_w += a * (power - self.smooth_w)
            self._last_t, self.power_w = t, power
            self.max_smooth_w = max(self.max_smooth_w, self.smooth_w)
        return power, dt

    def _energy_counter(self, snap: Snapshot, power: float | None) -> float | None:
        """Cumulative energy of the board-input rail, if the snapshot carries one."""
        if self._total_rail is None:
            rails = [r for r in snap.rails.values() if r.energy_j is not None and r.power_w is not None]
            if not rails:
                return None
            top = max(rails, key=lambda r: r.power_w or 0.0)
            # The input rail carries every other rail: it is the largest, and near the total.
            if power is not None and (top.power_w or 0.0) < INPUT_RAIL_SHARE * power:
                return None
            self._total_rail = top.name
        rail = snap.rails.get(self._total_rail)
        return None if rail is None else rail.energy_j


class PhaseLedger:
    """Per phase: occurrences, time, energy, expected and shortest length, power-model bias."""

    def __init__(self) -> None:
        self.occurrences: dict[Phase, int] = {}
        self.total_s: dict[Phase, float] = {}
        self.energy_j: dict[Phase, float] = {}
        self.expected: dict[Phase, float] = {}
        """A running mean of each phase's length."""
        self.shortest: dict[Phase, float] = {}
        """The fastest each phase has run (at the top clocks, once it ran there): what decides
        which domains a phase is long enough to switch when tuning, so a slow start under the
        kernel governors (or a slow tuning point) does not make a slow domain look switchable."""
        self.bias: dict[Phase, float] = {}
        """Measured minus predicted power of each tuned phase (a running mean)."""
        self.clocks: dict[Phase, dict[str, int]] = {}
        """The clocks each phase's latest occurrence ran at."""

    def record(self, phase: Phase, seconds: float, energy_j: float, clocks: Mapping[str, int] | None = None) -> None:
        """One occurrence of ``phase`` ended: it took ``seconds`` and ``energy_j`` at ``clocks``."""
        if clocks is not None:
            self.clocks[phase] = dict(clocks)
        self.occurrences[phase] = self.occurrences.get(phase, 0) + 1
        self.total_s[phase] = self.total_s.get(phase, 0.0) + seconds
        self.energy_j[phase] = self.energy_j.get(phase, 0.0) + energy_j
        prev = self.expected.get(phase)
        self.expected[phase] = seconds if prev is None else prev + _EWMA_DURATION * (seconds - prev)
        if seconds > 0:
            self.shortest[phase] = min(seconds, self.shortest.get(phase, math.inf))

    def update_bias(self, phase: Phase, error_w: float) -> None:
        """``phase`` drew ``error_w`` more than its model predicted."""
        b = self.bias.get(phase)
        self.bias[phase] = error_w if b is None else b + _EWMA_BIAS * (error_w - b)

    def length(self, phase: Phase | None) -> float | None:
        """The length switching decisions assume for ``phase`` (see :attr:`shortest`)."""
        if phase is None:
            return None
        return self.shortest.get(phase, self.expected.get(phase))

    def mean_power(self, phase: Phase) -> float | None:
        """Mean power of every occurrence of ``phase`` so far (None before it took time)."""
        t = self.total_s.get(phase, 0.0)
        return self.energy_j.get(phase, 0.0) / t if t > 0 else None

    def statistics(self, phase: Phase, *, tuned: bool, tuning: bool, untunable: bool) -> PhaseStatistics:
        return PhaseStatistics(
            occurrences=self.occurrences.get(phase, 0),
            total_s=self.total_s.get(phase, 0.0),
            energy_j=self.energy_j.get(phase, 0.0),
            expected_s=self.expected.get(phase),
            tuned=tuned,
            tuning=tuning,
            untunable=untunable,
            power_bias_w=self.bias.get(phase, 0.0),
            clocks=MappingProxyType(dict(self.clocks.get(phase, {}))),
        )
