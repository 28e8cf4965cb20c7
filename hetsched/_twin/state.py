"""Kernel-visible state of a twin board: what its sysfs files show at one instant.

Mutable plain objects (the live twin updates them in place, then the tree writer renders
them). Frequencies in Hz, temperatures in degrees C.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .schema import DomainProfile, SocProfile

__all__ = ["BoardState", "DomainState", "boot_state", "default_governor", "governors_for"]


def governors_for(profile: SocProfile, dom: DomainProfile) -> tuple[str, ...]:
    """What ``scaling_available_governors`` / ``available_governors`` lists for ``dom``."""
    return profile.quirks.governors[dom.kind]


def default_governor(profile: SocProfile, dom: DomainProfile) -> str:
    """The governor ``dom`` boots under."""
    return profile.quirks.default_governors[dom.kind]


@dataclass
class DomainState:
    """One domain as the kernel sees it."""

    governor: str
    cur_hz: int
    min_hz: int
    """User/QoS minimum (resolved as the kernel shows it, before thermal caps)."""
    max_hz: int
    """User/QoS maximum (before thermal caps)."""
    setspeed_hz: int | None = None
    """userspace governor's requested frequency (cpufreq setspeed / devfreq set_freq / EMC rate)."""
    util: float = 0.0
    thermal_cap_hz: int | None = None
    """Cap from kernel throttling / vendor temperature limits (None = none)."""
    time_in_state_s: dict[int, float] = field(default_factory=dict)
    transitions: int = 0

    def effective_max(self) -> int:
        return self.max_hz if self.thermal_cap_hz is None else min(self.max_hz, self.thermal_cap_hz)


@dataclass
class BoardState:
    """Everything dynamic the tree shows."""

    time_s: float
    domains: dict[str, DomainState]
    zone_temps_c: list[float | None]
    """Per zone index of the layout; None = the read fails (offline / flaky sensor)."""
    cooling_states: dict[str, int]
    """Domain name -> cooling device cur_state."""
    rail_power_w: dict[str, float]
    cpu_jiffies: list[list[int]]
    """Per CPU: user nice system idle iowait irq softirq steal guest guest_nice (USER_HZ=100)."""
    emc_locked: bool = False
    emc_iso_cap_hz: int = 0
    fan_pwm: int = 62


def boot_state(profile: SocProfile, variant: str | None = None, *, ambient_c: float = 25.0) -> BoardState:
    """The state a freshly booted, idle board shows (the fixture spec's values)."""
    layout = profile.layout(variant)
    doms: dict[str, DomainState] = {}
    for d in profile.domains:
        lo = d.default_min_hz if d.default_min_hz is not None else d.min_hz
        doms[d.name] = DomainState(
            governor=default_governor(profile, d),
            cur_hz=d.boot_hz or d.min_hz,
            min_hz=lo,
            max_hz=d.max_hz,
        )
    idle_temp = profile.quirks.boot_temp_c
    temps: list[float | None] = []
    for i, z in enumerate(layout.zones):
        temps.append(None if z.offline else round(idle_temp + 0.5 * i, 3))
    cooling = {a: 0 for t in layout.throttling for a in t.actors}
    jiffies = [[16735, 18, 4611, 592803, 557, 0, 103, 0, 0, 0] for _ in range(profile.cpu_count)]
    return BoardState(
        time_s=0.0,
        domains=doms,
        zone_temps_c=temps,
        cooling_states=cooling,
        rail_power_w={},
        cpu_jiffies=jiffies,
    )
