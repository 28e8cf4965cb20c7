"""Counter tracks of a session trace: the board's clocks, temperatures and rail powers.

A :class:`CounterSampler` reads the session's root with its own :class:`Telemetry` (stamped
with the session's clock, so samples sit on the same timeline as the stage events) and turns
each snapshot into Chrome trace counter events (``"ph": "C"``) on the ``board`` process::

    freq <domain>   {"MHz": ...}     every clock domain (CPU clusters, GPU, NPU, memory)
    temp <zone>     {"C": ...}       every thermal zone
    power <rail>    {"W": ...}       every rail (measured, or the SoC model's estimate)

A reading that is absent or flaky (``None`` in the snapshot) gives no point: a gap, not a zero.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import HetschedError
from .._snapshot import Snapshot

__all__ = ["CounterSampler", "counter_events"]

Emit = Callable[[dict[str, Any]], None]


def counter_events(snap: Snapshot, *, pid: int, ts_us: float) -> list[dict[str, Any]]:
    """The counter events of one snapshot (pure)."""
    out: list[dict[str, Any]] = []

    def put(name: str, unit: str, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            out.append({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": ts_us, "args": {unit: round(value, 3)}})

    for d in snap.domains.values():
        put(f"freq {d.name}", "MHz", d.freq_hz / 1e6 if d.freq_hz is not None else None)
    for z in snap.zones.values():
        put(f"temp {z.name}", "C", z.temp_c)
    for r in snap.rails.values():
        put(f"power {r.name}", "W", r.power_w)
    return out


def board_description(snap: Snapshot) -> dict[str, Any]:
    """What a viewer or a plot needs besides the points: trips, ranges, rail sources (pure)."""
    return {
        "soc": snap.soc,
        "domains": {d.name: {"kind": d.kind, "min_mhz": d.min_hz / 1e6 if d.min_hz else None,
                             "max_mhz": d.max_hz / 1e6 if d.max_hz else None} for d in snap.domains.values()},
        "zones": {z.name: {"passive_trip_c": z.passive_trip_c, "critical_trip_c": z.critical_trip_c}
                  for z in snap.zones.values()},
        "rails": {r.name: {"source": r.source} for r in snap.rails.values()},
    }


class CounterSampler:
    """Samples one root into counter events; blocking (the caller runs :meth:`sample` in a
    worker thread, one call at a time, so the telemetry reader and its power model are only
    ever used by one thread at a time).

    Use :meth:`for_root`, which returns None for a root without telemetry.
    """

    def __init__(self, telemetry: Any, *, pid: int, to_us: Callable[[float], float]):
        self._telemetry = telemetry
        self._pid = pid
        self._to_us = to_us
        self.samples = 0
        self.errors = 0
        self.last_error: str | None = None
        self.description: dict[str, Any] = {}

    @classmethod
    def for_root(cls, root: str | os.PathLike[str], *, clock: Callable[[], float], pid: int,
                 to_us: Callable[[float], float]) -> CounterSampler | None:
        """A sampler for ``root``, or None when it has no clock domain, zone or rail, or cannot
        be read (a trace without counters is still a trace). Blocking: discovery walks the tree."""
        from .._estimators import power_estimator_for
        from .._platform.discovery import discover
        from .._platform.telemetry import Telemetry

        try:
            platform = discover(root)
            if not (platform.cpu_clusters or platform.devices or platform.thermal_zones or platform.power_rails):
                return None
            telemetry = Telemetry(root, clock=clock, estimator=power_estimator_for(platform), platform=platform)
        except HetschedError:
            return None
        return cls(telemetry, pid=pid, to_us=to_us)

    def sample(self, emit: Emit) -> None:
        """Take one sample and emit its counters; a failed read is counted, never raised (the
        trace must not end the session)."""
        try:
            snap = self._telemetry.sample_once()
        except (HetschedError, OSError) as exc:
            self.errors += 1
            self.last_error = str(exc)
            return
        self.samples += 1
        if not self.description:
            self.description = board_description(snap)
        for ev in counter_events(snap, pid=self._pid, ts_us=self._to_us(snap.time_s)):
            emit(ev)

    def other_data(self) -> Mapping[str, Any]:
        return {**self.description, "samples": self.samples, "sample_errors": self.errors,
                "last_sample_error": self.last_error}
