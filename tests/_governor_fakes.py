"""A table-driven fake board for the governor tests (virtual time, no files).

Time and power of one unit of each phase come from a function of the phase and the
current clocks (the "table"); one zone heats as a first-order RC from total power.
Writes are recorded; ``ignore_writes`` makes every domain frequency-locked; ``lag_s``
delays when a written clock takes effect (a transition latency).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from hetsched._governor import (
    DomainSpec,
    GovernorEngine,
    Measurement,
    OperatingPoint,
    Phase,
    PhaseModel,
    Tuner,
    TunerSettings,
    TunerStatistics,
    axis_tuner,
)
from hetsched._governor._state_dir import StateDir
from hetsched._snapshot import Snapshot, ZoneState

Table = Callable[[Phase, Mapping[str, int]], tuple[float, float]]


def domains() -> dict[str, DomainSpec]:
    mhz = 1_000_000
    return {
        "cluster0": DomainSpec("cluster0", "cpu", tuple(f * mhz for f in (400, 800, 1200, 1600, 2000)), 1e-4),
        "gpu": DomainSpec("gpu", "gpu", tuple(f * mhz for f in (300, 400, 500, 600, 700, 800, 900, 1000)), 5e-3),
        "memory": DomainSpec("memory", "memory", tuple(f * mhz for f in (500, 1000, 1500, 2000)), 8e-3),
    }


def additive_table(
    cycles: Mapping[Phase, Mapping[str, float]],
    watts_per_ghz2: Mapping[str, float],
    *,
    static_w: float = 2.0,
    fixed_s: float = 0.0,
) -> Table:
    """time = fixed + sum(cycles_d / f_d); power = static + sum(k_d * f_d^2) (GHz)."""

    def table(phase: Phase, f: Mapping[str, int]) -> tuple[float, float]:
        c = cycles.get(phase, {})
        t = fixed_s + sum(c.get(d, 0.0) / hz for d, hz in f.items())
        p = static_w + sum(watts_per_ghz2[d] * (hz / 1e9) ** 2 for d, hz in f.items())
        return t, p

    return table


class TableBoard:
    """The fake board; implements the governor's ClockPort."""

    soc: str | None = "fake"
    state_dir: StateDir | None = None  # ClockPort capabilities: no state directory (publishes nothing),
    integrates_samples_by_telemetry = False  # its snapshots carry their own power,
    settle_s = 0.0  # and a write shows at once

    def __init__(
        self,
        table: Table,
        *,
        specs: dict[str, DomainSpec] | None = None,
        ambient_c: float = 25.0,
        r_c_per_w: float = 4.0,
        tau_s: float = 20.0,
        passive_trip_c: float | None = None,
        ignore_writes: bool = False,
        lag_s: Mapping[str, float] | None = None,
    ) -> None:
        self.table = table
        self.specs = specs or domains()
        self.freq = {n: s.available_hz[len(s.available_hz) // 2] for n, s in self.specs.items()}
        self.t = 0.0
        self.temp = ambient_c
        self.ambient = ambient_c
        self.r = r_c_per_w
        self.tau = tau_s
        self.trip = passive_trip_c
        self.ignore_writes = ignore_writes
        self.lag_s = dict(lag_s or {})
        """Domain -> seconds before a written clock takes effect (sysfs shows it at once)."""
        self.effective = dict(self.freq)
        self._pending: list[tuple[float, str, int]] = []
        self.power = table(Phase.IDLE, self.freq)[1]
        self.writes: list[tuple[float, str, int]] = []
        self.power_trace: list[float] = []
        self.max_temp = ambient_c

    # -- ClockPort -------------------------------------------------------------------
    def domains(self) -> Mapping[str, DomainSpec]:
        return self.specs

    def now(self) -> float:
        return self.t

    def sample(self) -> Snapshot:
        zones = {"soc": ZoneState("soc", self.temp, self.trip, None)}
        return Snapshot(time_s=self.t, zones=MappingProxyType(zones), total_power_w=self.power)

    def save(self) -> dict[str, int]:
        return dict(self.freq)

    def restore(self, saved: dict[str, int]) -> None:
        self.freq.update(saved)
        self.effective.update(saved)
        self._pending.clear()

    def idle(self, engine: GovernorEngine, seconds: float, tick_s: float = 0.01) -> None:
        """Enter IDLE and let ``seconds`` pass at the idle power of the current clocks."""
        engine.enter(Phase.IDLE)
        self.advance(seconds, self.table(Phase.IDLE, self.clocks)[1], engine, tick_s)

    @property
    def clocks(self) -> Mapping[str, int]:
        """The clocks in effect (what the work runs at)."""
        return self.effective if self.lag_s else self.freq

    def write(self, domain: str, hz: int) -> None:
        self.writes.append((self.t, domain, hz))
        if not self.ignore_writes:
            self.freq[domain] = hz
            lag = self.lag_s.get(domain, 0.0)
            self._pending = [p for p in self._pending if p[1] != domain]
            if lag > 0:
                self._pending.append((self.t + lag, domain, hz))
            else:
                self.effective[domain] = hz

    def read(self, domain: str) -> int:
        return self.freq[domain]

    # -- driving -----------------------------------------------------------------------
    def advance(self, seconds: float, power: float, engine: GovernorEngine | None, tick_s: float = 0.01) -> None:
        left = seconds
        while left > 1e-12:
            dt = min(tick_s, left)
            self.power = power
            self.power_trace.append(power)
            a = math.exp(-dt / self.tau)
            t_inf = self.ambient + self.r * power
            self.temp = t_inf + (self.temp - t_inf) * a
            self.max_temp = max(self.max_temp, self.temp)
            self.t += dt
            left -= dt
            for p in [p for p in self._pending if p[0] <= self.t + 1e-12]:
                self.effective[p[1]] = p[2]
                self._pending.remove(p)
            if engine is not None:
                engine.tick()

    def run(self, engine: GovernorEngine, phase: Phase, tick_s: float = 0.01) -> tuple[float, float]:
        """Enter ``phase`` and run one unit of it at whatever clocks the governor set.

        Clocks changed mid-phase (thermal guard) apply to the rest of the unit.
        """
        engine.enter(phase)
        done = 0.0  # fraction of the unit finished
        energy = 0.0
        elapsed = 0.0
        while done < 1.0 - 1e-12:
            secs, watts = self.table(phase, self.clocks)
            if secs <= 0:
                break
            dt = min(tick_s, (1.0 - done) * secs)
            if self._pending:
                # Up to the next clock change, so a lagging write lands where it should.
                dt = min(dt, max(min(p[0] for p in self._pending) - self.t, 1e-9))
            self.advance(dt, watts, engine, tick_s)
            done += dt / secs
            energy += dt * watts
            elapsed += dt
        return elapsed, energy


class RecordingTuner:
    """A :class:`~hetsched.lowlevel.Tuner` around another, logging what its driver proposed and
    recorded (only the protocol's members are used)."""

    def __init__(self, inner: Tuner, log: TunerLog) -> None:
        self._inner = inner
        self._log = log

    def propose(self) -> OperatingPoint | None:
        point = self._inner.propose()
        self._log.proposed.append(point)
        return point

    def record(self, point: OperatingPoint, measurement: Measurement) -> None:
        self._log.records.append((point, measurement))
        self._inner.record(point, measurement)

    def reject(self, point: OperatingPoint, power_w: float) -> None:
        self._inner.reject(point, power_w)

    def guarded(self, point: OperatingPoint) -> bool:
        return self._inner.guarded(point)

    def finish(self) -> bool:
        return self._inner.finish()

    def model(self) -> PhaseModel | None:
        return self._inner.model()

    def measured(self) -> list[tuple[OperatingPoint, Measurement]]:
        return self._inner.measured()

    @property
    def center(self) -> OperatingPoint:
        return self._inner.center

    @property
    def measurement_limit(self) -> int:
        return self._inner.measurement_limit

    @property
    def cut_short(self) -> bool:
        return self._inner.cut_short

    @property
    def domains(self) -> tuple[str, ...]:
        return self._inner.domains

    @property
    def done(self) -> bool:
        return self._inner.done

    def statistics(self) -> TunerStatistics:
        return self._inner.statistics()


class TunerLog:
    """A :class:`~hetsched.lowlevel.TunerFactory` making the axis tuner behind a
    :class:`RecordingTuner`: every proposal and every measurement handed to any of them, in order."""

    def __init__(self) -> None:
        self.proposed: list[OperatingPoint | None] = []
        self.records: list[tuple[OperatingPoint, Measurement]] = []

    def __call__(self, domains: Mapping[str, DomainSpec], tune: Sequence[str], settings: TunerSettings) -> Tuner:
        return RecordingTuner(axis_tuner(domains, tune, settings), self)


def make_tuner(
    specs: Mapping[str, DomainSpec],
    tune: Sequence[str],
    *,
    slowdown: float,
    power_cap_w: float | None = None,
    measured_cap_w: float | None = None,
    levels: int = 6,
    passes: int = 2,
    repeats: int = 2,
    guarded: bool = False,
    max_measurements: int | None = None,
) -> Tuner:
    """The shipped tuner, seen only through the :class:`~hetsched.lowlevel.Tuner` protocol
    (the defaults are :class:`~hetsched.GovernorConfig`'s, guarded probes off)."""
    return axis_tuner(specs, tune, TunerSettings(
        slowdown=slowdown, power_cap_w=power_cap_w, measured_cap_w=measured_cap_w, levels=levels, passes=passes,
        repeats=repeats, guarded=guarded, max_measurements=max_measurements,
    ))
