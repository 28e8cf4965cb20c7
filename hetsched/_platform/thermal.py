"""thermal: zones, their temperatures (millidegrees C) and trip points.

Layout (kernel ABI)::

    sys/class/thermal/thermal_zoneN -> ../../devices/virtual/thermal/thermal_zoneN
    thermal_zoneN/{type, temp, mode, policy, trip_point_K_{temp,type,hyst}}

Fused-off Orin zones (``cv0-2`` on NX/Nano) either fail with ``EAGAIN`` (the
:class:`~hetsched._platform._fs.SysfsRoot` read returns None) or read
``-256000``; both are an *absent* temperature, as jtop treats them.

A value no sensor can report (below absolute zero, above :data:`MAX_PLAUSIBLE_MILLIDEG`,
a 21-digit number) is garbage and reads as absent too: it must never reach the leakage
model's exponential.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._fs import SysfsRoot, parse_int

__all__ = [
    "MAX_PLAUSIBLE_MILLIDEG",
    "OFFLINE_MILLIDEG",
    "ThermalZone",
    "TripPoint",
    "parse_temp_c",
    "plausible_temp_c",
    "read_temp_c",
    "read_zones",
    "zone_short_name",
]

THERMAL_CLASS = "sys/class/thermal"
THERMAL_VIRTUAL = "sys/devices/virtual/thermal"
#: What tegrastats prints as ``CV0@-256C``: the zone's sensor is fused off (jtop skips it too:
#: https://github.com/rbonghi/jetson_stats/blob/master/jtop/core/temperature.py).
OFFLINE_MILLIDEG = -256000
#: Far above any silicon's critical trip (115 °C in the RK3588 device trees, ``rk-bsp-dtsi`` /
#: ``rk-mainline-dts`` in docs/sources.md), and the kernel's thermal core clamps nothing: a
#: reading above it is a broken read, not a temperature.
MAX_PLAUSIBLE_MILLIDEG = 500_000
#: Absolute zero in millidegrees; the thermal core's ``THERMAL_TEMP_INVALID`` (-274000,
#: include/linux/thermal.h) lies below it and is rejected with it.
_ABS_ZERO_MILLIDEG = -273_150

_TRIP_RE = re.compile(r"^trip_point_(\d+)_temp$")


def plausible_temp_c(milli: int | None) -> float | None:
    """Millidegrees -> °C; None for offline (<= -256000) and implausible values (see module doc)."""
    if milli is None or milli <= OFFLINE_MILLIDEG or not _ABS_ZERO_MILLIDEG <= milli <= MAX_PLAUSIBLE_MILLIDEG:
        return None
    return milli / 1000.0


def parse_temp_c(text: str | bytes | None) -> float | None:
    """``"44384\\n"`` -> ``44.384``; None for absent, empty, malformed, offline (<= -256000)
    or implausible (below absolute zero, above 500 °C)."""
    return plausible_temp_c(parse_int(text))


def zone_short_name(zone_type: str) -> str:
    """jtop's short name: the type cut at the first ``-`` (``cpu-thermal`` -> ``cpu``, ``CPU-therm`` -> ``CPU``)."""
    return zone_type.split("-", 1)[0]


@dataclass(frozen=True)
class TripPoint:
    index: int
    temp_c: float
    type: str
    """``passive``, ``active``, ``hot`` or ``critical``."""
    hyst_c: float | None = None


@dataclass(frozen=True)
class ThermalZone:
    index: int
    type: str
    path: str
    """Root-relative resolved zone directory."""
    policy: str | None
    mode: str | None
    trips: tuple[TripPoint, ...]

    @property
    def name(self) -> str:
        return f"thermal_zone{self.index}"

    @property
    def passive_trip_c(self) -> float | None:
        """Lowest passive trip (where the kernel starts throttling), or None."""
        temps = [t.temp_c for t in self.trips if t.type == "passive"]
        return min(temps) if temps else None

    @property
    def critical_trip_c(self) -> float | None:
        temps = [t.temp_c for t in self.trips if t.type == "critical"]
        return min(temps) if temps else None


def _zone_dirs(fs: SysfsRoot) -> list[tuple[int, str]]:
    for base in (THERMAL_CLASS, THERMAL_VIRTUAL):
        found = [
            (int(e[12:]), f"{base}/{e}")
            for e in fs.listdir(base)
            if e.startswith("thermal_zone") and e[12:].isdigit()
        ]
        if found:
            return sorted(found)
    return []


def read_trips(fs: SysfsRoot, path: str) -> tuple[TripPoint, ...]:
    trips = []
    for entry in fs.listdir(path):
        m = _TRIP_RE.match(entry)
        if not m:
            continue
        k = int(m.group(1))
        temp = parse_temp_c(fs.read_text(f"{path}/{entry}"))
        if temp is None:
            continue
        hyst = fs.read_int(f"{path}/trip_point_{k}_hyst", lo=0, hi=MAX_PLAUSIBLE_MILLIDEG)
        trips.append(
            TripPoint(
                index=k,
                temp_c=temp,
                type=fs.read_name(f"{path}/trip_point_{k}_type") or "unknown",
                hyst_c=hyst / 1000.0 if hyst is not None else None,
            )
        )
    return tuple(sorted(trips, key=lambda t: t.index))


def read_zones(fs: SysfsRoot) -> list[ThermalZone]:
    """Every thermal zone, by index; ``[]`` when the root has none.

    :raises SysfsPermissionError: a zone file may not be read.
    """
    zones = []
    for index, rel in _zone_dirs(fs):
        resolved = fs.contained(rel)  # None: a zone linked out of the root, skipped (noted once)
        if resolved is None:
            continue
        path = resolved.rel
        zones.append(
            ThermalZone(
                index=index,
                type=fs.read_str(f"{path}/type") or f"thermal_zone{index}",
                path=path,
                policy=fs.read_name(f"{path}/policy"),
                mode=fs.read_name(f"{path}/mode"),
                trips=read_trips(fs, path),
            )
        )
    return zones


def read_temp_c(fs: SysfsRoot, zone: ThermalZone) -> float | None:
    """Current temperature in °C, or None (absent, ``EAGAIN``, ``-256000``)."""
    raw = fs.read_bytes(f"{zone.path}/temp")
    milli = parse_int(raw)
    temp = plausible_temp_c(milli)
    if temp is None and raw is not None and raw.strip() and (milli is None or milli > OFFLINE_MILLIDEG):
        fs.note_garbage(f"{zone.path}/temp", raw, "a temperature")
    return temp
