"""Value types of the fast simulation: domain descriptions, work items, statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .._errors import TwinError
from .._snapshot import DomainKind

__all__ = ["DomainInfo", "PhaseWork", "SimStatistics"]


@dataclass(frozen=True)
class DomainInfo:
    """What a governor needs to know about one clock domain."""

    name: str
    kind: DomainKind
    available_hz: tuple[int, ...]
    """Ascending."""
    transition_latency_s: float
    cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class PhaseWork:
    """One piece of work for :meth:`SimBoard.execute`.

    ``cycles`` per compute domain (``cluster*``, ``gpu``, ``npu``) run at that domain's clock;
    for a CPU cluster they are cluster cycles (all its cores busy). ``memory_bytes`` of DRAM
    traffic take ``bytes / bandwidth(memory clock)``. ``fixed_s`` does not depend on clocks.
    Elapsed = ``fixed_s + overlap * max(compute, memory) + (1 - overlap) * (compute + memory)``
    with ``compute`` the longest of the domains' times (domains run concurrently).

    Raises:
        TwinError: a negative amount, or ``overlap`` outside [0, 1].
    """

    cycles: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    memory_bytes: float = 0.0
    fixed_s: float = 0.0
    overlap: float = 1.0

    def __post_init__(self) -> None:
        for k, v in self.cycles.items():
            if not v >= 0:
                raise TwinError(f"PhaseWork.cycles[{k!r}] = {v!r}: must be >= 0")
        if not self.memory_bytes >= 0:
            raise TwinError(f"PhaseWork.memory_bytes = {self.memory_bytes!r}: must be >= 0")
        if not self.fixed_s >= 0:
            raise TwinError(f"PhaseWork.fixed_s = {self.fixed_s!r}: must be >= 0")
        if not 0.0 <= self.overlap <= 1.0:
            raise TwinError(f"PhaseWork.overlap = {self.overlap!r}: must be in [0, 1]")


@dataclass(frozen=True)
class SimStatistics:
    """Totals since the board was created (virtual time)."""

    time_s: float
    energy_j: float
    """Board/module input energy (VDD_IN on Orin, the modelled board total on RK3588)."""
    energy_by_rail_j: Mapping[str, float]
    energy_by_domain_j: Mapping[str, float]
    dynamic_energy_by_domain_j: Mapping[str, float]
    """The energy-model part (C V^2 f x utilisation) of each domain's energy."""
    peak_temp_c: float
    """Hottest true (noise-free) zone temperature seen."""
    peak_temp_by_zone_c: Mapping[str, float]
    throttle_events: int
    """Throttling episodes: times the board went from no cap to at least one domain capped below its
    top OPP (a cooling device's ``cur_state`` > 0, or a vendor temperature cap)."""
    throttled_time_s: float
    """Virtual time with at least one domain capped."""
    frequency_changes: int

    @property
    def mean_power_w(self) -> float:
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0
