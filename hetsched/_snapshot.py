"""Plain-data state of a board at one instant.

Telemetry (real sysfs or a live twin) and the fast simulation both produce a
:class:`Snapshot`; placement policies and the governor consume it. Nothing here
does I/O, so decisions made from a snapshot are pure functions of it.

Domain names are logical and stable across boards: CPU clusters are
``"cluster<N>"`` (N = the cpufreq policy number, i.e. its first CPU), and the
others are ``"gpu"``, ``"npu"`` and ``"memory"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = ["DomainKind", "DomainState", "RailState", "Snapshot", "ZoneState"]

DomainKind = Literal["cpu", "gpu", "npu", "memory"]

_EMPTY: Mapping[str, object] = MappingProxyType({})


@dataclass(frozen=True)
class DomainState:
    """One clock domain (a CPU cluster, the GPU, the NPU or the memory controller)."""

    name: str
    kind: DomainKind
    freq_hz: int | None
    """Current frequency, or None when it could not be read (absent/flaky sensor)."""
    available_hz: tuple[int, ...] = ()
    """Available frequencies, ascending."""
    min_hz: int | None = None
    max_hz: int | None = None
    utilisation: float | None = None
    """Busy fraction in [0, 1], or None when the board does not expose it."""
    governor: str | None = None
    cpus: tuple[int, ...] = ()
    """For CPU clusters: the CPUs of the cluster."""


@dataclass(frozen=True)
class ZoneState:
    """One thermal zone."""

    name: str
    temp_c: float | None
    passive_trip_c: float | None = None
    critical_trip_c: float | None = None


@dataclass(frozen=True)
class RailState:
    """One power rail; ``source`` says whether a sensor measured it or a model estimated it."""

    name: str
    power_w: float | None
    source: Literal["measured", "estimated"] = "measured"
    energy_j: float | None = None
    """Energy integrated since the sampler started, where known."""


@dataclass(frozen=True)
class Snapshot:
    """Board state at ``time_s`` (seconds on the sampler's clock)."""

    time_s: float
    domains: Mapping[str, DomainState] = field(default_factory=lambda: MappingProxyType({}))
    zones: Mapping[str, ZoneState] = field(default_factory=lambda: MappingProxyType({}))
    rails: Mapping[str, RailState] = field(default_factory=lambda: MappingProxyType({}))
    cpu_utilisation: tuple[float, ...] = ()
    """Per-CPU busy fraction (index = CPU number) from /proc/stat deltas; empty on the first sample."""
    total_power_w: float | None = None
    """Board input power (e.g. Orin VDD_IN) or the modelled total where no sensor exists."""
    soc: str | None = None

    def hottest_headroom_c(self) -> float | None:
        """Smallest (passive trip - temperature) over zones that have both, or None."""
        gaps = [
            z.passive_trip_c - z.temp_c
            for z in self.zones.values()
            if z.passive_trip_c is not None and z.temp_c is not None
        ]
        return min(gaps) if gaps else None
