"""Telemetry: periodic samples of clocks, temperatures, power and utilisation into a ring buffer.

::

    async with Telemetry(root, period_s=0.1) as tm:   # first sample taken before the body runs
        snap = tm.latest()                            # hetsched.Snapshot, plain data
        await tm.wait_sample()                        # next one

The tree is discovered once, at construction; each sample then costs one
``open``/``read``/``close`` per file on pre-resolved paths (no directory walks, no
path resolution), so a full sample of a board stays well under a millisecond.
The file reads of a periodic sample run in a worker thread (``anyio.to_thread``)
because on hardware an INA3221 read is an i2c transaction that can block for
milliseconds; the estimator and the ring buffer are then updated on the event
loop, so a model shared with a live twin is never touched from two threads.
If a sample fails (a sensor became unreadable), the sampling task fails and the
error leaves ``async with`` (the first sample's error as itself, before the body runs).

Energy is integrated per rail: trapezoidally from instantaneous power (INA3221,
estimates), exactly from counter deltas for RAPL (wrap-aware). Where the board
has no power sensor (RK3588), an injected ``estimator`` (the twin's power model,
for instance) turns the rest of the snapshot into per-rail watts, and those rails
are marked ``source="estimated"``; without one, such rails read ``None``.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._errors import PlatformError, RuntimeStateError
from .._snapshot import DomainState, RailState, Snapshot, ZoneState
from . import power as _power
from ._fs import ResolvedPath, SysfsRoot, parse_int, parse_name
from .discovery import Platform, discover
from .procstat import CpuTimes, parse_proc_stat, utilisation
from .sampleplan import compile_plan, decode_load
from .thermal import OFFLINE_MILLIDEG, plausible_temp_c

__all__ = ["Estimator", "Telemetry", "TelemetryStatistics"]

Estimator = Callable[[Snapshot], Mapping[str, float]]
"""Maps a snapshot (without rails) to watts per rail name; a ``"board"``/``"total"`` entry is the
board input (otherwise the total is the sum of the entries)."""

Clock = Callable[[], float]

# What a value of each kind of file can be; anything else is garbage (a broken sensor, a
# corrupted tree) and reads as absent. Generous: 1 THz in the file's unit (kHz or Hz), 10 kW,
# 1 kV, 10 kA: no edge board comes near, and a value past them cannot be trusted.
_FREQ = (0, 10**12)
_MW = (0, 10**7)
_MV = (0, 10**6)
_MA = (-(10**7), 10**7)
_UJ = (0, None)


@dataclass(frozen=True)
class TelemetryStatistics:
    samples: int
    """Samples taken since construction."""
    retained: int
    """Samples currently in the ring buffer (at most ``capacity``)."""
    capacity: int
    period_s: float
    last_sample_us: float | None
    mean_sample_us: float | None
    overruns: int
    """Periods skipped because a sample took longer than ``period_s``."""
    flaky_reads: int
    """Reads that failed with EAGAIN/EIO/ENODATA (fused-off zones, i2c noise) and gave None."""
    energy_j: Mapping[str, float]
    """Energy integrated per rail since the first sample."""
    estimated_power: bool
    """True when some rails come from a model rather than a sensor."""


@dataclass(frozen=True, slots=True)
class _Partial:
    t0: int
    read_ns: int
    now: float
    domains: dict[str, DomainState]
    zones: dict[str, ZoneState]
    cpu_util: tuple[float, ...]
    rails: dict[str, RailState]
    dt: float | None
    total: float | None


class Telemetry:
    """Samples a board (real or twin) periodically; see the module docstring.

    :param root: sysfs root (a path or a :class:`SysfsRoot`); ``"/"`` on a board.
    :param period_s: sampling period (> 0).
    :param capacity: ring-buffer length (>= 1).
    :param clock: seconds, monotonic; stamps snapshots and integrates energy.
    :param estimator: per-rail power model for boards without sensors (see :data:`Estimator`);
        without one, rails only a model can fill read ``None``. The platform layer never picks
        a model itself: ``hetsched._estimators.power_estimator_for(platform)`` is the SoC model's one.
    :param platform: an already discovered :class:`Platform` for this root (skips discovery).
    :raises PlatformError: bad ``period_s`` or ``capacity``.
    :raises SysfsError: the root is not a directory, or discovery failed.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | SysfsRoot = "/",
        *,
        period_s: float = 0.1,
        capacity: int = 600,
        clock: Clock = time.monotonic,
        estimator: Estimator | None = None,
        platform: Platform | None = None,
    ) -> None:
        if not (isinstance(period_s, (int, float)) and math.isfinite(period_s) and period_s > 0):
            raise PlatformError(f"Telemetry period_s must be a positive number of seconds, got {period_s!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise PlatformError(f"Telemetry capacity must be an int >= 1, got {capacity!r}")
        self._fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
        self.period_s = float(period_s)
        self.capacity = capacity
        self._clock = clock
        self.platform = platform if platform is not None else discover(self._fs)
        self._estimator = estimator
        self._plan = compile_plan(self._fs, self.platform)
        self._ring: deque[Snapshot] = deque(maxlen=capacity)
        self._samples = 0
        self._overruns = 0
        self._sample_ns_total = 0
        self._last_sample_ns: int | None = None
        self._prev_times: Mapping[int, CpuTimes] | None = None
        self._prev_t: float | None = None
        self._prev_power: dict[str, float] = {}
        self._prev_energy_uj: dict[str, int] = {}
        self._energy_j: dict[str, float] = {}
        self._tg: TaskGroup | None = None
        self._new_sample: anyio.Event | None = None

    # -- sampling ---------------------------------------------------------------

    def sample_once(self) -> Snapshot:
        """Take one sample now (synchronously), store it and return it.

        Absent or flaky sensors give ``None`` fields, never an exception.

        :raises SysfsPermissionError: a file that was readable at discovery no longer is.
        """
        return self._finish(self._read())

    def _read(self) -> _Partial:
        """The file I/O half of a sample (runs in a worker thread when sampling periodically)."""
        t0 = time.perf_counter_ns()
        read = self._fs.read_bytes
        num = self._num
        now = self._clock()

        per_cpu: dict[int, float] = {}
        if self._plan.proc_stat is not None:
            raw = read(self._plan.proc_stat)
            if raw is not None:
                times = parse_proc_stat(raw.decode("ascii", "replace"))
                if self._prev_times is not None:
                    per_cpu = utilisation(self._prev_times, times)
                self._prev_times = times

        domains: dict[str, DomainState] = {}
        for d in self._plan.domains:
            freq = num(d.cur, _FREQ) if d.cur is not None else None
            util: float | None = None
            if d.kind == "cpu":
                vals = [per_cpu[c] for c in d.cpus if c in per_cpu]
                util = sum(vals) / len(vals) if vals else None
            elif d.load is not None:
                util = decode_load(read(d.load), d.load_format, freq)
            gov = self._name(d.governor) if d.governor is not None else None
            lo = num(d.min, _FREQ) if d.min is not None else None
            hi = num(d.max, _FREQ) if d.max is not None else None
            s = d.cur_scale
            domains[d.name] = DomainState(
                name=d.name,
                kind=d.kind,
                freq_hz=freq * s if freq is not None else None,
                available_hz=d.available_hz,
                min_hz=lo * s if lo is not None else None,
                max_hz=hi * s if hi is not None else None,
                utilisation=util,
                governor=gov,
                cpus=d.cpus,
            )

        zones: dict[str, ZoneState] = {}
        for z in self._plan.zones:
            temp = self._temp(z.temp) if z.temp is not None else None
            zones[z.name] = ZoneState(z.name, temp, z.passive_c, z.critical_c)

        dt = now - self._prev_t if self._prev_t is not None else None
        powers: dict[str, float | None] = {}
        total: float | None = None
        for r in self._plan.rails:
            watts: float | None = None
            if r.energy is not None:
                uj = num(r.energy, _UJ)
                prev = self._prev_energy_uj.get(r.name)
                if uj is not None:
                    if prev is not None and dt:
                        joules = _power.energy_delta_uj(prev, uj, r.max_range_uj) / 1e6
                        self._energy_j[r.name] = self._energy_j.get(r.name, 0.0) + joules
                        watts = joules / dt
                    self._prev_energy_uj[r.name] = uj
            else:
                if r.power_mw is not None:
                    mw = num(r.power_mw, _MW)
                    watts = mw / 1000.0 if mw is not None else None
                if watts is None and r.voltage is not None and r.current is not None:
                    watts = _power.power_w_from_mv_ma(num(r.voltage, _MV), num(r.current, _MA))
                self._integrate(r.name, watts, dt)
            powers[r.name] = watts
            if r.is_total and watts is not None:
                total = watts

        cpu_util = tuple(per_cpu.get(c, 0.0) for c in range(self._plan.n_cpus)) if per_cpu else ()
        rails: dict[str, RailState] = {
            name: RailState(name, w, "measured", self._energy_j.get(name)) for name, w in powers.items()
        }
        if total is None and self._plan.rails and all(w is not None for w in powers.values()):
            total = sum(w for w in powers.values() if w is not None)
        self._prev_t = now
        return _Partial(t0, time.perf_counter_ns() - t0, now, domains, zones, cpu_util, rails, dt, total)

    def _num(self, path: ResolvedPath, bounds: tuple[int, int | None]) -> int | None:
        raw = self._fs.read_bytes(path)
        value = parse_int(raw, lo=bounds[0], hi=bounds[1])
        if value is None and raw is not None and raw.strip():
            self._fs.note_garbage(path, raw, "a number in range")
        return value

    def _name(self, path: ResolvedPath) -> str | None:
        raw = self._fs.read_bytes(path)
        name = parse_name(raw)
        if name is None and raw is not None and raw.strip():
            self._fs.note_garbage(path, raw, "a governor name")
        return name

    def _temp(self, path: ResolvedPath) -> float | None:
        raw = self._fs.read_bytes(path)
        milli = parse_int(raw)
        temp = plausible_temp_c(milli)
        if temp is None and raw is not None and raw.strip() and (milli is None or milli > OFFLINE_MILLIDEG):
            self._fs.note_garbage(path, raw, "a temperature")
        return temp

    def _finish(self, part: _Partial) -> Snapshot:
        """The pure half of a sample: estimator, snapshot, ring buffer (runs on the caller's thread,
        so an estimator backed by a live twin's model never races the twin's event loop)."""
        t1 = time.perf_counter_ns()
        now, rails, dt, total, cpu_util = part.now, part.rails, part.dt, part.total, part.cpu_util
        domains_ro = MappingProxyType(part.domains)
        zones_ro = MappingProxyType(part.zones)
        if self._plan.estimated_names or self._estimator is not None:
            total = self._estimate(now, domains_ro, zones_ro, cpu_util, rails, dt, total)

        snap = Snapshot(
            time_s=now,
            domains=domains_ro,
            zones=zones_ro,
            rails=MappingProxyType(rails),
            cpu_utilisation=cpu_util,
            total_power_w=total,
            soc=self.platform.soc,
        )
        self._ring.append(snap)
        self._samples += 1
        elapsed = part.read_ns + time.perf_counter_ns() - t1
        self._last_sample_ns = elapsed
        self._sample_ns_total += elapsed
        return snap

    def _integrate(self, name: str, watts: float | None, dt: float | None) -> None:
        prev = self._prev_power.get(name)
        if watts is None:
            self._prev_power.pop(name, None)
            return
        if prev is not None and dt is not None and dt > 0:
            self._energy_j[name] = self._energy_j.get(name, 0.0) + 0.5 * (prev + watts) * dt
        else:
            self._energy_j.setdefault(name, 0.0)
        self._prev_power[name] = watts

    def _estimate(
        self,
        now: float,
        domains: Mapping[str, DomainState],
        zones: Mapping[str, ZoneState],
        cpu_util: tuple[float, ...],
        rails: dict[str, RailState],
        dt: float | None,
        total: float | None,
    ) -> float | None:
        if self._estimator is None:
            for name in self._plan.estimated_names:
                rails[name] = RailState(name, None, "estimated", None)
            return total
        partial = Snapshot(
            time_s=now, domains=domains, zones=zones, cpu_utilisation=cpu_util, soc=self.platform.soc
        )
        estimate = self._estimator(partial)
        est_total: float | None = None
        for name, watts in estimate.items():
            w = float(watts)
            self._integrate(name, w, dt)
            rails[name] = RailState(name, w, "estimated", self._energy_j.get(name))
            if name in _power.TOTAL_RAIL_NAMES:
                est_total = w
        for name in self._plan.estimated_names:
            if name not in rails:
                rails[name] = RailState(name, None, "estimated", self._energy_j.get(name))
        if total is not None:
            return total
        if est_total is None:
            est_total = sum(float(w) for w in estimate.values()) if estimate else None
        return est_total

    # -- access -----------------------------------------------------------------

    def latest(self) -> Snapshot:
        """The most recent sample. :raises RuntimeStateError: no sample taken yet."""
        if not self._ring:
            raise RuntimeStateError("no telemetry sample yet: enter 'async with Telemetry(...)' or call sample_once()")
        return self._ring[-1]

    def history(self) -> tuple[Snapshot, ...]:
        """Retained samples, oldest first (at most ``capacity``)."""
        return tuple(self._ring)

    def energy_j(self) -> Mapping[str, float]:
        """Energy integrated per rail since the first sample (J)."""
        return MappingProxyType(dict(self._energy_j))

    def statistics(self) -> TelemetryStatistics:
        n = self._samples
        return TelemetryStatistics(
            samples=n,
            retained=len(self._ring),
            capacity=self.capacity,
            period_s=self.period_s,
            last_sample_us=self._last_sample_ns / 1000.0 if self._last_sample_ns is not None else None,
            mean_sample_us=self._sample_ns_total / n / 1000.0 if n else None,
            overruns=self._overruns,
            flaky_reads=self._fs.statistics().flaky_reads,
            energy_j=self.energy_j(),
            estimated_power=bool(self._plan.estimated_names) or self._estimator is not None,
        )

    # -- async lifecycle --------------------------------------------------------

    async def wait_sample(self) -> Snapshot:
        """Wait for the next periodic sample and return it (bound it with ``anyio.fail_after``).

        :raises RuntimeStateError: not inside ``async with``.
        """
        if self._tg is None or self._new_sample is None:
            raise RuntimeStateError("Telemetry.wait_sample() needs 'async with Telemetry(...)'")
        await self._new_sample.wait()
        return self.latest()

    async def __aenter__(self) -> Telemetry:
        if self._tg is not None:
            raise RuntimeStateError("this Telemetry is already running")
        self._new_sample = anyio.Event()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await tg.start(self._run)
        except BaseException:
            # The first sample failed (e.g. permission): close the empty group, raise the cause as is.
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            raise
        self._tg = tg
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        tg, self._tg = self._tg, None
        if tg is None:
            return None
        tg.cancel_scope.cancel()
        # The body's own exception is not handed to the task group (which would wrap it in an
        # ExceptionGroup); returning None lets it propagate unchanged. Only a failure of the
        # sampling task itself surfaces from here.
        await tg.__aexit__(None, None, None)
        return None

    async def _run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._finish(await anyio.to_thread.run_sync(self._read))
        self._signal()
        task_status.started()
        next_at = anyio.current_time() + self.period_s
        while True:
            await anyio.sleep(max(0.0, next_at - anyio.current_time()))
            self._finish(await anyio.to_thread.run_sync(self._read))
            self._signal()
            next_at += self.period_s
            now = anyio.current_time()
            if now > next_at:
                # Fell behind (slow sensors, loaded host): skip the missed ticks, don't burst.
                missed = int((now - next_at) / self.period_s) + 1
                self._overruns += missed
                next_at += missed * self.period_s

    def _signal(self) -> None:
        event, self._new_sample = self._new_sample, anyio.Event()
        if event is not None:
            event.set()
