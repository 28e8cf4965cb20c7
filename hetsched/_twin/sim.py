"""Fast simulation of a twin board in virtual time (no files): :class:`SimBoard`.

The board is the same model the live twin uses (:mod:`~hetsched._twin.physics`), advanced
in virtual seconds. The inner loop is event driven and lazy: power is piecewise constant,
so energies, busy time and work progress are integrated exactly whenever something
changes (a clock, a utilisation, a temperature step), not every tick. Thermal steps,
kernel throttling and kernel governors are periodic events; DVFS transitions take effect
after the domain's switch latency.

Kernel behaviour in the simulation:

* Each domain starts under the board's default governor (``ondemand``/``schedutil`` for
  CPUs, ``simple_ondemand``/``rknpu_ondemand``/``dmc_ondemand``/``nvhost_podgov``, BPMP
  for Jetson EMC), which re-picks its clock from measured utilisation every period.
  :meth:`SimBoard.set_frequency` switches that domain to ``userspace`` (as a governor does
  through sysfs); :meth:`SimBoard.set_governor` switches back.
* Throttling: the layout's ``step_wise`` / ``power_allocator`` instances and vendor
  temperature caps lower each domain's effective maximum; the achieved clock is the
  kernel's pick within [min, effective max].
* Idle power: blocks that power-gate when idle (Mali, RKNPU, Jetson GPU railgating) do so
  unless :meth:`SimBoard.set_power_gating` turns it off (``railgate_enable=0``); idle CPU
  cores use cpuidle's deep state unless :meth:`SimBoard.set_cpuidle` disables it
  (``cpuidle/state*/disable``). ``jetson_clocks`` does both (soc-sysfs.md §2.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from .._errors import TwinError, UnsupportedFrequencyError
from .._snapshot import DomainState, RailState, Snapshot, ZoneState
from .kernel import governor_target, pick_opp
from .physics import PowerAllocator, SensorNoise, StepWise, TempCapState, ThermalNetwork, leakage_share
from .profiles import SocProfile, get_profile
from .state import BoardState, boot_state, default_governor, governors_for

if TYPE_CHECKING:
    from .._snapshot import DomainKind

__all__ = ["DomainInfo", "PhaseWork", "SimBoard", "SimStatistics", "idle_state_into"]

_INF = math.inf


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


class _Throttle:
    __slots__ = ("inst", "zone_nodes", "actors", "sw", "ipa", "caps", "polling_s", "next_poll")


class SimBoard:
    """A twin board stepped in virtual time. See the module docstring.

    Raises:
        UnknownSocError: ``profile`` names no known SoC.
        TwinError: bad ``ambient_c``.
    """

    def __init__(
        self,
        profile: SocProfile | str,
        *,
        ambient_c: float = 25.0,
        seed: int = 0,
        noise: bool = True,
        variant: str | None = None,
        settle: bool = True,
    ) -> None:
        prof = get_profile(profile) if isinstance(profile, str) else profile
        if not -40.0 <= ambient_c <= 85.0:
            raise TwinError(f"ambient_c = {ambient_c!r}: outside -40..85 C")
        self.profile: SocProfile = prof
        self.variant = variant if variant is not None else prof.default_variant
        self.layout = prof.layout(self.variant)
        self.ambient_c = float(ambient_c)
        self.time_s = 0.0
        self.noise = SensorNoise(seed, temp_step_c=prof.temp_step_c, enabled=noise)

        doms = prof.domains
        self._names = [d.name for d in doms]
        self._index = {d.name: i for i, d in enumerate(doms)}
        self._kind = [d.kind for d in doms]
        self._avail = [list(d.available_hz) for d in doms]
        self._avail_t = [tuple(a) for a in self._avail]
        self._volt = [[o.voltage_mv for o in d.opps] for d in doms]
        self._vtop = [d.opps[-1].voltage_mv for d in doms]
        self._full = [[d.capacitance * o.voltage_mv**2 * o.freq_hz * 1e-18 * d.units for o in d.opps] for d in doms]
        self._idle_act = [d.idle_activity for d in doms]
        self._leak = [d.leak_w for d in doms]
        self._leak_k = [d.leak_per_c for d in doms]
        self._gates = [d.gates_when_idle for d in doms]
        self._gating_on = [d.gates_when_idle for d in doms]
        self._deep_leak = [d.deep_idle_leak_fraction for d in doms]
        self._cpuidle = True
        self._latency = [d.switch_latency_s for d in doms]
        self._bw_per_hz = [d.bytes_per_cycle * d.bandwidth_efficiency for d in doms]
        self._mem = next((i for i, d in enumerate(doms) if d.kind == "memory"), -1)
        n = len(doms)
        self._gov = [default_governor(prof, d) for d in doms]
        self._govs_ok = [governors_for(prof, d) for d in doms]
        self._min = [d.default_min_hz if d.default_min_hz is not None else d.min_hz for d in doms]
        self._max = [d.max_hz for d in doms]
        self._setspeed: list[int | None] = [None] * n
        self._cap: list[int | None] = [None] * n
        self._target = [d.boot_hz or d.min_hz for d in doms]  # what sysfs shows (achieved)
        self._oi = [self._avail[i].index(self._target[i]) for i in range(n)]  # OPP index in effect
        self._pending: list[tuple[float, int, int]] = []  # (time, domain, opp index)
        self._util_bg = [0.0] * n
        self._util_work = [0.0] * n
        self._util = [0.0] * n
        self._updown: list[tuple[int, int] | None] = [None] * n
        if prof.family == "rockchip" and "gpu" in self._index:
            self._updown[self._index["gpu"]] = (30, 10)
        self._gov_period = [0.02 if d.kind == "cpu" else 0.05 for d in doms]
        self._emc_floor = (doms[self._mem].boot_hz if prof.family == "tegra" and self._mem >= 0 else 0)

        # thermal
        self.net = ThermalNetwork(prof.nodes, ambient_c)
        node_index = {nm: j for j, nm in enumerate(self.net.names)}
        self._node_of = [node_index[d.thermal_node] for d in doms]
        self._root_node = next(j for j, nd in enumerate(prof.nodes) if nd.parent == "ambient")
        self._zone_nodes = [[node_index[nm] for nm in z.nodes] for z in self.layout.zones]
        self._zone_names = [z.type for z in self.layout.zones]
        self._peak = [-_INF] * len(self.layout.zones)
        # Thermal steps: the passive polling period near a trip, a coarser step when far below
        # (every node's RC time constant is >= 0.45 s, so 0.1 s steps stay accurate).
        self._th_dt_fast = max(0.02, min([self.layout.passive_polling_s] + [t.polling_s for t in self.layout.throttling]))
        self._th_dt_slow = max(self._th_dt_fast, 0.1)
        self._th_dt = self._th_dt_slow
        self._last_thermal = 0.0
        passive = [z.passive_trip_c for z in self.layout.zones if z.passive_trip_c is not None]
        passive += [c.above_c for c in self.layout.caps]
        self._fast_above_c = (min(passive) - 4.0) if passive else math.inf
        self._throttles: list[_Throttle] = []
        for inst in self.layout.throttling:
            th = _Throttle()
            th.inst = inst
            th.zone_nodes = self._zone_nodes[inst.zone]
            th.actors = [self._index[a] for a in inst.actors]
            z = self.layout.zones[inst.zone]
            trip = z.trips[inst.trip]
            th.sw = None
            th.ipa = None
            if inst.governor == "power_allocator" and inst.switch_on_trip is not None:
                th.ipa = PowerAllocator(z.trips[inst.switch_on_trip].temp_c, trip.temp_c, inst.sustainable_power_w)
            else:
                th.sw = StepWise(trip.temp_c, trip.hyst_c, [len(self._avail[a]) - 1 for a in th.actors])
            th.caps = [None] * len(th.actors)
            th.polling_s = inst.polling_s
            th.next_poll = 0.0
            self._throttles.append(th)
        self._vcaps = [
            (self._index[c.domain], node_index[c.node], c.max_hz, TempCapState(c.above_c, c.hyst_c))
            for c in self.layout.caps
        ]

        # accumulators
        self._power = [0.0] * n
        self._dyn = [0.0] * n
        self._e_dom = [0.0] * n
        self._e_dyn = [0.0] * n
        self._busy = [0.0] * n
        self._busy_mark = [0.0] * n
        self._node_e = [0.0] * len(prof.nodes)
        self._tis: list[dict[int, float]] = [dict() for _ in doms]
        self._t_flush = 0.0
        self._capped_since: float | None = None
        self._throttled_time = 0.0
        self._throttle_events = 0
        self._freq_changes = 0
        self._was_capped = [False] * n
        # work in progress (execute)
        self._work_rate = 0.0
        self._work_done = 0.0
        self._work: PhaseWork | None = None
        self._work_fixed_frac = 0.0

        self._next_thermal = self._th_dt
        self._thermal_ticks = 0
        self.power_sample_s = 0.05
        """Rail sensor sampling period for :meth:`snapshot` (board telemetry rate)."""
        self._snap_dom_cache: list[tuple[tuple[object, ...], DomainState] | None] = [None] * n
        self._snap_zone_tick = -1
        self._snap_ver = -1
        self._snap_pow_due = -1.0
        self._snap_doms: Mapping[str, DomainState] = MappingProxyType({})
        self._snap_cpu: tuple[float, ...] = ()
        self._snap_zones: Mapping[str, ZoneState] = MappingProxyType({})
        self._snap_rails: Mapping[str, RailState] = MappingProxyType({})
        self._snap_total = 0.0
        self._ver = 0
        self._next_gov = [self._gov_period[i] for i in range(n)]
        self._next_gov_any = min(self._next_gov)
        self._next_pending = _INF

        for i in range(n):
            self._recompute_power(i)
        if settle:
            self._settle_idle()

    # ------------------------------------------------------------------ public API

    def domains(self) -> Mapping[str, DomainInfo]:
        """Domain name -> :class:`DomainInfo` (``cluster<N>``, ``gpu``, ``npu``, ``memory``)."""
        return MappingProxyType({
            d.name: DomainInfo(d.name, d.kind, d.available_hz, d.switch_latency_s, d.cpus)
            for d in self.profile.domains
        })

    def _i(self, domain: str) -> int:
        try:
            return self._index[domain]
        except KeyError:
            raise TwinError(f"{self.profile.name} has no domain {domain!r}; domains: {', '.join(self._names)}") from None

    def frequency(self, domain: str) -> int:
        """The achieved frequency (Hz) as sysfs would show it, after any throttle cap.

        Raises:
            TwinError: unknown domain.
        """
        return self._target[self._i(domain)]

    def governor(self, domain: str) -> str:
        return self._gov[self._i(domain)]

    def set_frequency(self, domain: str, hz: int) -> int:
        """Ask for ``hz`` (userspace governor); returns the achieved frequency.

        Raises:
            TwinError: unknown domain.
            UnsupportedFrequencyError: ``hz`` is not in the domain's available list.
        """
        i = self._i(domain)
        if hz not in self._avail[i]:
            raise UnsupportedFrequencyError(
                f"{domain}: {hz} Hz is not an available frequency; available: {self._avail[i]}"
            )
        self._gov[i] = "userspace"
        self._setspeed[i] = int(hz)
        self._schedule_governor(i)
        self._apply_target(i)
        return self._target[i]

    def set_governor(self, domain: str, governor: str) -> None:
        """Hand ``domain`` to a kernel governor (``performance``, ``schedutil``, ...).

        Raises:
            TwinError: unknown domain or a governor the board does not offer.
        """
        i = self._i(domain)
        if governor not in self._govs_ok[i]:
            raise TwinError(f"{domain}: governor {governor!r} not available; available: {list(self._govs_ok[i])}")
        self._gov[i] = governor
        if governor != "userspace":
            self._setspeed[i] = None
        self._schedule_governor(i)
        self._kernel_governor(i, self._util[i])

    def set_limits(self, domain: str, *, min_hz: int | None = None, max_hz: int | None = None) -> int:
        """Set the user min/max (exact available values); returns the achieved frequency.

        Raises:
            UnsupportedFrequencyError: a limit not in the available list.
        """
        i = self._i(domain)
        for v in (min_hz, max_hz):
            if v is not None and v not in self._avail[i]:
                raise UnsupportedFrequencyError(f"{domain}: {v} Hz not available; available: {self._avail[i]}")
        if min_hz is not None:
            self._min[i] = min_hz
        if max_hz is not None:
            self._max[i] = max_hz
        self._ver += 1
        self._apply_target(i)
        return self._target[i]

    def kernel_limits(self, domain: str, *, min_hz: int | None = None, max_hz: int | None = None,
                      setspeed_hz: int | None = None) -> int:
        """Apply already-resolved kernel limits / userspace request (sysfs write semantics live in
        :mod:`~hetsched._twin.live`); values need not be OPPs. Returns the achieved frequency."""
        i = self._i(domain)
        if min_hz is not None:
            self._min[i] = int(min_hz)
        if max_hz is not None:
            self._max[i] = int(max_hz)
        if setspeed_hz is not None:
            self._setspeed[i] = int(setspeed_hz)
        self._ver += 1
        self._apply_target(i)
        return self._target[i]

    def user_limits(self, domain: str) -> tuple[int, int, int | None]:
        """(min, max, setspeed) as requested, before thermal caps."""
        i = self._i(domain)
        return (self._min[i], self._max[i], self._setspeed[i])

    def limits(self, domain: str) -> tuple[int, int]:
        """(min, effective max) as the kernel shows them (thermal caps included)."""
        i = self._i(domain)
        hi = self._eff_max(i)
        return (min(self._min[i], hi), hi)

    def thermal_cap(self, domain: str) -> int | None:
        return self._cap[self._i(domain)]

    def power_gating(self, domain: str) -> bool:
        """Whether ``domain`` is power-gated when idle now (False for blocks that never gate).

        Raises:
            TwinError: unknown domain.
        """
        return self._gating_on[self._i(domain)]

    def set_power_gating(self, domain: str, enabled: bool) -> None:
        """Let ``domain`` power-gate when idle (the default) or keep it powered (Jetson
        ``railgate_enable=0``): an ungated idle block draws its idle activity and leakage
        at the current clock's voltage.

        Raises:
            TwinError: unknown domain, or one with no power gating to switch (CPU clusters,
                memory).
        """
        i = self._i(domain)
        if not self._gates[i]:
            raise TwinError(f"{domain}: no power gating to switch (only {', '.join(self._gating_domains()) or 'none'})")
        self._flush()
        self._gating_on[i] = bool(enabled)
        self._ver += 1
        self._recompute_power(i)

    def _gating_domains(self) -> list[str]:
        return [n for n, g in zip(self._names, self._gates) if g]

    @property
    def cpuidle(self) -> bool:
        """Whether idle CPU cores may use cpuidle's deep state (False: WFI only)."""
        return self._cpuidle

    def set_cpuidle(self, enabled: bool) -> None:
        """Allow (default) or disable cpuidle's deep state on every CPU (``cpuidle/state*/disable``).

        Disabled, idle cores wait in WFI and leak in full
        (:attr:`~hetsched._twin.profiles.DomainProfile.deep_idle_leak_fraction`).
        """
        self._flush()
        self._cpuidle = bool(enabled)
        self._ver += 1
        for i in range(len(self._names)):
            self._recompute_power(i)

    def set_utilisation(self, domain: str, util: float) -> None:
        """Background utilisation (0..1) of ``domain`` until changed.

        Raises:
            TwinError: unknown domain or ``util`` outside [0, 1].
        """
        i = self._i(domain)
        if not 0.0 <= util <= 1.0:
            raise TwinError(f"utilisation {util!r} for {domain}: must be in [0, 1]")
        self._flush()
        self._util_bg[i] = float(util)
        self._update_util(i)

    def utilisation(self, domain: str) -> float:
        return self._util[self._i(domain)]

    def power(self, domain: str) -> float:
        """Current true power of ``domain`` (W)."""
        return self._power[self._i(domain)]

    def temperature(self, zone: str) -> float | None:
        """True (noise-free) temperature of the zone of that type, None if offline."""
        for k, z in enumerate(self.layout.zones):
            if z.type == zone:
                return None if z.offline else self._zone_temp(k)
        raise TwinError(f"no zone {zone!r}; zones: {', '.join(self._zone_names)}")

    def zone_temps(self) -> list[float | None]:
        return [None if z.offline else self._zone_temp(k) for k, z in enumerate(self.layout.zones)]

    def total_power_w(self) -> float:
        """Board/module input power (true)."""
        return (sum(self._power) + self.profile.board_static_w) / self.profile.converter_efficiency

    def rail_powers(self) -> dict[str, float]:
        return self._rails(self._power)

    def step(self, dt_s: float) -> None:
        """Advance the physics by ``dt_s`` virtual seconds.

        Raises:
            TwinError: negative ``dt_s``.
        """
        if not dt_s >= 0:
            raise TwinError(f"step({dt_s!r}): dt must be >= 0")
        self._run_until(self.time_s + dt_s)

    def idle(self, seconds: float, *, tick_s: float | None = None, on_tick: Callable[[SimBoard], None] | None = None) -> float:
        """Let ``seconds`` pass with no work (background utilisation stays); returns ``seconds``."""
        if on_tick is None or tick_s is None:
            self.step(seconds)
            return seconds
        end = self.time_s + seconds
        while self.time_s < end - 1e-12:
            self._run_until(min(end, self.time_s + tick_s))
            if self.time_s < end - 1e-12:
                on_tick(self)
        return seconds

    def execute(
        self, work: PhaseWork, *, tick_s: float = 0.01, on_tick: Callable[[SimBoard], None] | None = None
    ) -> float:
        """Run ``work`` under the current clocks; returns the elapsed virtual seconds.

        Physics advances in steps of at most ``tick_s``; ``on_tick`` (a governor) runs between
        ticks and may change clocks, which changes the remaining time and the power.

        Raises:
            TwinError: a cycles entry names no compute domain of this board, or ``tick_s`` <= 0.
        """
        if not tick_s > 0:
            raise TwinError(f"tick_s = {tick_s!r}: must be > 0")
        for k in work.cycles:
            i = self._index.get(k)
            if i is None or self._kind[i] == "memory":
                raise TwinError(f"PhaseWork.cycles names {k!r}: not a compute domain of {self.profile.name}")
        if work.memory_bytes > 0 and self._mem < 0:
            raise TwinError(f"{self.profile.name} has no memory domain for PhaseWork.memory_bytes")
        start = self.time_s
        self._flush()
        self._work = work
        self._work_done = 0.0
        self._work_rates()
        try:
            while self._work_done < 1.0:
                if self._work_rate == _INF:
                    break
                self._run_until(self.time_s + tick_s, work=True)
                if self._work_done >= 1.0:
                    break
                if on_tick is not None:
                    on_tick(self)
        finally:
            self._flush()
            self._work = None
            self._work_rate = 0.0
            for i in range(len(self._names)):
                if self._util_work[i]:
                    self._util_work[i] = 0.0
                    self._update_util(i)
        return self.time_s - start

    def snapshot(self) -> Snapshot:
        """Board state now as telemetry would read it (sensor noise included).

        Sensors are sampled as on a board: a zone's reading changes once per thermal polling
        period, rail readings every ``power_sample_s`` (or as soon as a clock or a utilisation
        changed); unchanged parts are reused, which keeps a snapshot per 10 ms decision cheap.
        """
        prof = self.profile
        noise = self.noise
        cache = self._snap_dom_cache
        rebuilt = False
        ver = self._ver
        dom_stale = ver != self._snap_ver
        for i, d in enumerate(prof.domains if dom_stale else ()):
            hi = self._eff_max(i)
            key = (self._target[i], self._util[i], self._min[i], hi, self._gov[i])
            hit = cache[i]
            if hit is None or hit[0] != key:
                cache[i] = (key, DomainState(
                    name=d.name, kind=d.kind, freq_hz=key[0], available_hz=self._avail_t[i],
                    min_hz=min(key[2], hi), max_hz=hi, utilisation=key[1], governor=key[4], cpus=d.cpus,
                ))
                rebuilt = True
        if rebuilt:
            self._snap_doms = MappingProxyType({self._names[i]: c[1] for i, c in enumerate(cache) if c is not None})
            cpu_util: list[float] = [0.0] * prof.cpu_count
            for i, d in enumerate(prof.domains):
                for c in d.cpus:
                    cpu_util[c] = self._util[i]
            self._snap_cpu = tuple(cpu_util)
        if self._snap_zone_tick != self._thermal_ticks:
            self._snap_zone_tick = self._thermal_ticks
            zones = {}
            for k, z in enumerate(self.layout.zones):
                t = None if z.offline else noise.temp(self._zone_temp(k))
                zones[z.type] = ZoneState(z.type, t, z.passive_trip_c, z.critical_trip_c)
            self._snap_zones = MappingProxyType(zones)
        if dom_stale or self.time_s >= self._snap_pow_due:
            self._snap_ver = ver
            self._snap_pow_due = self.time_s + self.power_sample_s
            self._flush()
            rail_e = self._rail_energy()
            rails = {}
            for r in prof.rails:
                p = self._rail_power(r, self._power)
                rails[r.name] = RailState(
                    r.name, noise.power(p), "measured" if r.measured else "estimated", rail_e[r.name]
                )
            self._snap_rails = MappingProxyType(rails)
            self._snap_total = noise.power(self.total_power_w())
        return Snapshot(
            time_s=self.time_s,
            domains=self._snap_doms,
            zones=self._snap_zones,
            rails=self._snap_rails,
            cpu_utilisation=self._snap_cpu,
            total_power_w=self._snap_total,
            soc=prof.name,
        )

    def statistics(self) -> SimStatistics:
        self._flush()
        prof = self.profile
        throttled = self._throttled_time
        if self._capped_since is not None:
            throttled += self.time_s - self._capped_since
        rail_e = self._rail_energy()
        total = (sum(self._e_dom) + prof.board_static_w * self.time_s) / prof.converter_efficiency
        peaks = {nm: p for nm, p, z in zip(self._zone_names, self._peak, self.layout.zones) if not z.offline}
        return SimStatistics(
            time_s=self.time_s,
            energy_j=total,
            energy_by_rail_j=MappingProxyType(rail_e),
            energy_by_domain_j=MappingProxyType(dict(zip(self._names, self._e_dom))),
            dynamic_energy_by_domain_j=MappingProxyType(dict(zip(self._names, self._e_dyn))),
            peak_temp_c=max(peaks.values()) if peaks else float("nan"),
            peak_temp_by_zone_c=MappingProxyType(peaks),
            throttle_events=self._throttle_events,
            throttled_time_s=throttled,
            frequency_changes=self._freq_changes,
        )

    def time_in_state(self, domain: str) -> dict[int, float]:
        self._flush()
        return dict(self._tis[self._i(domain)])

    def board_state(self, state: BoardState | None = None) -> BoardState:
        """Render the kernel-visible state (for the live tree): clocks, temps, rails, jiffies."""
        prof = self.profile
        if state is None:
            state = boot_state(prof, self.variant)
        self._flush()
        state.time_s = self.time_s
        for i, d in enumerate(prof.domains):
            ds = state.domains[d.name]
            ds.governor = self._gov[i]
            ds.cur_hz = self._target[i]
            ds.min_hz = self._min[i]
            ds.max_hz = self._max[i]
            ds.setspeed_hz = self._setspeed[i]
            ds.util = self._util[i]
            ds.thermal_cap_hz = self._cap[i]
            ds.time_in_state_s = dict(self._tis[i])
        temps = [None if z.offline else self.noise.temp(self._zone_temp(k)) for k, z in enumerate(self.layout.zones)]
        state.zone_temps_c = temps
        for th in self._throttles:
            for a, cap in zip(th.actors, th.caps):
                name = self._names[a]
                if cap is None:
                    state.cooling_states[name] = 0
                else:
                    av = self._avail[a]
                    state.cooling_states[name] = len(av) - 1 - av.index(cap)
        state.rail_power_w = {k: self.noise.power(v) for k, v in self._rails(self._power).items()}
        if prof.family == "tegra" and self._mem >= 0:
            # Jetson EMC under a fixed rate means BPMP's rate lock is held.
            state.emc_locked = self._gov[self._mem] == "userspace"
        return state

    # ------------------------------------------------------------------ internals

    def _eff_max(self, i: int) -> int:
        cap = self._cap[i]
        return self._max[i] if cap is None or cap >= self._max[i] else cap

    def _zone_temp(self, k: int) -> float:
        temps = self.net.temps
        return max(temps[j] for j in self._zone_nodes[k])

    def _rail_power(self, r, powers) -> float:  # type: ignore[no-untyped-def]
        prof = self.profile
        if r.total:
            return (sum(powers) + prof.board_static_w) / prof.converter_efficiency
        p = r.static_w
        for name, share in r.shares.items():
            p += share * powers[self._index[name]]
        return p

    def _rails(self, powers: list[float]) -> dict[str, float]:
        return {r.name: self._rail_power(r, powers) for r in self.profile.rails}

    def _rail_energy(self) -> dict[str, float]:
        prof = self.profile
        out = {}
        for r in prof.rails:
            if r.total:
                out[r.name] = (sum(self._e_dom) + prof.board_static_w * self.time_s) / prof.converter_efficiency
            else:
                e = r.static_w * self.time_s
                for name, share in r.shares.items():
                    e += share * self._e_dom[self._index[name]]
                out[r.name] = e
        return out

    def _flush(self) -> None:
        """Integrate everything from the last flush to now with the (constant) current values."""
        dt = self.time_s - self._t_flush
        if dt <= 0.0:
            return
        self._t_flush = self.time_s
        power = self._power
        node_e = self._node_e
        node_of = self._node_of
        for i in range(len(power)):
            p = power[i]
            e = p * dt
            self._e_dom[i] += e
            self._e_dyn[i] += self._dyn[i] * dt
            node_e[node_of[i]] += e
            self._busy[i] += self._util[i] * dt
            f = self._avail[i][self._oi[i]]
            tis = self._tis[i]
            tis[f] = tis.get(f, 0.0) + dt
        if self._work is not None:
            self._work_done += dt * self._work_rate

    def _recompute_power(self, i: int) -> None:
        u = self._util[i]
        oi = self._oi[i]
        if self._gating_on[i] and u <= 0.0:
            self._dyn[i] = 0.0
            self._power[i] = 0.0
            return
        full = self._full[i][oi]
        dyn = full * u
        idle = full * self._idle_act[i]
        t = self.net.temps[self._node_of[i]]
        leak = self._leak[i] * (self._volt[i][oi] / self._vtop[i]) * math.exp(self._leak_k[i] * (t - 25.0))
        if self._deep_leak[i] < 1.0:
            leak *= leakage_share(u, self._deep_leak[i], self._cpuidle)
        self._dyn[i] = dyn
        self._power[i] = dyn + idle + leak

    def _update_util(self, i: int) -> None:
        self._ver += 1
        u = self._util_bg[i] + self._util_work[i]
        self._util[i] = 1.0 if u > 1.0 else u
        self._recompute_power(i)

    def _apply_target(self, i: int) -> None:
        """Recompute the achieved clock of domain i under its governor/limits/caps."""
        if self._gov[i] == "userspace":
            self._set_target(i, pick_opp(self._avail[i], self._setspeed[i] or self._target[i], self._min[i], self._eff_max(i)))
        else:
            self._kernel_governor(i, self._util[i])

    def _kernel_governor(self, i: int, util: float) -> None:
        gov = self._gov[i]
        if gov == "rknpu_ondemand" and util <= 0.0 and self._target[i] <= self._eff_max(i):
            return  # a powered-off RKNPU is not re-clocked (it idles at its last rate, 1 GHz at boot)
        lo = self._min[i]
        hi = self._eff_max(i)
        if lo > hi:
            lo = hi
        av = self._avail[i]
        if gov == "bpmp":
            lo = max(lo, pick_opp(av, self._emc_floor, lo, hi))
        ud = self._updown[i]
        if ud is not None and gov == "simple_ondemand":
            up, down = ud
            load = util * 100.0
            cur = self._target[i]
            if load > up:
                f = pick_opp(av, hi, lo, hi)
            elif load > up - down:
                f = pick_opp(av, cur, lo, hi)
            else:
                f = pick_opp(av, int(cur * load / (up - down / 2)), lo, hi)
        else:
            f = governor_target(gov, util, self._target[i], av, lo, hi, self._setspeed[i])
        self._set_target(i, f)

    def _set_target(self, i: int, hz: int) -> None:
        if hz == self._target[i]:
            return
        self._ver += 1
        self._target[i] = hz
        self._freq_changes += 1
        oi = self._avail[i].index(hz)
        lat = self._latency[i]
        if lat <= 0.0:
            self._flush()
            self._oi[i] = oi
            self._recompute_power(i)
            if self._work is not None:
                self._work_rates()
            return
        # The new clock takes effect after the switch latency; a newer request supersedes.
        self._pending = [p for p in self._pending if p[1] != i]
        self._pending.append((self.time_s + lat, i, oi))
        self._next_pending = min(p[0] for p in self._pending)

    def _work_rates(self) -> None:
        """Work progress rate (fraction per second) and per-domain utilisation under current clocks."""
        w = self._work
        if w is None:
            return
        self._flush()
        compute = 0.0
        times = {}
        for name, cyc in w.cycles.items():
            i = self._index[name]
            t = cyc / self._avail[i][self._oi[i]]
            times[i] = t
            if t > compute:
                compute = t
        mem_t = 0.0
        m = self._mem
        if w.memory_bytes > 0.0:
            mem_t = w.memory_bytes / (self._avail[m][self._oi[m]] * self._bw_per_hz[m])
        ov = w.overlap
        total = w.fixed_s + ov * max(compute, mem_t) + (1.0 - ov) * (compute + mem_t)
        if total <= 0.0:
            self._work_rate = _INF
            self._work_done = 1.0
            return
        self._work_rate = 1.0 / total
        for i in range(len(self._names)):
            u = times.get(i, 0.0) / total
            if i == m and mem_t:
                u = mem_t / total
            if u != self._util_work[i]:
                self._util_work[i] = u
                self._update_util(i)

    def _run_until(self, t_end: float, *, work: bool = False) -> None:
        while True:
            nxt = self._next_thermal
            if self._next_gov_any < nxt:
                nxt = self._next_gov_any
            if self._next_pending < nxt:
                nxt = self._next_pending
            if work and self._work_rate > 0.0:
                # Progress since the last flush is not integrated yet: count it here.
                done = self._work_done + (self.time_s - self._t_flush) * self._work_rate
                t_fin = self.time_s + (1.0 - done) / self._work_rate
                if t_fin <= nxt and t_fin <= t_end:
                    self.time_s = t_fin
                    self._flush()
                    self._work_done = 1.0
                    return
            if nxt > t_end:
                self.time_s = t_end
                return
            self.time_s = nxt
            if self._next_pending <= nxt:
                self._do_pending()
            if self._next_thermal <= nxt:
                self._do_thermal()
            if self._next_gov_any <= nxt:
                self._do_governors()

    def _do_pending(self) -> None:
        self._flush()
        now = self.time_s
        keep = []
        changed = False
        for p in self._pending:
            if p[0] <= now + 1e-12:
                i = p[1]
                self._oi[i] = p[2]
                self._ver += 1
                self._recompute_power(i)
                changed = True
            else:
                keep.append(p)
        self._pending = keep
        self._next_pending = min((p[0] for p in keep), default=_INF)
        if changed and self._work is not None:
            self._work_rates()

    def _schedule_governor(self, i: int) -> None:
        """Kernel governors sample every period; userspace has no sampling (and costs nothing)."""
        self._ver += 1
        if self._gov[i] == "userspace":
            self._next_gov[i] = _INF
        elif self._next_gov[i] == _INF:
            self._flush()
            self._busy_mark[i] = self._busy[i]
            self._next_gov[i] = self.time_s + self._gov_period[i]
        self._next_gov_any = min(self._next_gov)

    def _do_governors(self) -> None:
        self._flush()
        now = self.time_s
        for i in range(len(self._names)):
            if self._next_gov[i] <= now + 1e-12:
                period = self._gov_period[i]
                util = (self._busy[i] - self._busy_mark[i]) / period
                self._kernel_governor(i, util)
                self._busy_mark[i] = self._busy[i]
                self._next_gov[i] += period
        self._next_gov_any = min(self._next_gov)

    def _do_thermal(self) -> None:
        self._flush()
        dt = self.time_s - self._last_thermal
        self._last_thermal = self.time_s
        if dt <= 0.0:
            return
        node_e = self._node_e
        powers = [e / dt for e in node_e]
        powers[self._root_node] += self.profile.soc_static_w
        self.net.step(powers, dt)
        for j in range(len(node_e)):
            node_e[j] = 0.0
        self._thermal_ticks += 1
        for i in range(len(self._names)):
            self._recompute_power(i)
        for k in range(len(self._peak)):
            t = self._zone_temp(k)
            if t > self._peak[k]:
                self._peak[k] = t
        self._do_throttling()
        hot = max(self._peak_now()) >= self._fast_above_c
        self._th_dt = self._th_dt_fast if hot else self._th_dt_slow
        self._next_thermal = self.time_s + self._th_dt

    def _peak_now(self) -> list[float]:
        return [self._zone_temp(k) for k in range(len(self._zone_nodes))]

    def _do_throttling(self) -> None:
        changed = False
        temps = self.net.temps
        for th in self._throttles:
            if self.time_s < th.next_poll - 1e-9:
                continue
            th.next_poll = self.time_s + th.polling_s
            t = max(temps[j] for j in th.zone_nodes)
            if th.sw is not None:
                th.sw.update(t)
                if True:
                    for k, a in enumerate(th.actors):
                        s = th.sw.states[k]
                        cap = None if s == 0 else self._avail[a][len(self._avail[a]) - 1 - s]
                        if cap != th.caps[k]:
                            th.caps[k] = cap
                            changed = True
            else:
                ipa = th.ipa
                max_w = [self._full[a][-1] for a in th.actors]
                budget = ipa.budget_w(t, sum(max_w))
                if budget is None:
                    new = [None] * len(th.actors)
                else:
                    req = [self._full[a][self._oi[a]] * max(self._util[a], 0.01) for a in th.actors]
                    granted = PowerAllocator.divvy(budget, req, max_w)
                    new = []
                    for k, a in enumerate(th.actors):
                        u = max(self._util[a], 0.01)
                        full = self._full[a]
                        best = 0
                        for oi in range(len(full)):
                            if full[oi] * u <= granted[k]:
                                best = oi
                        new.append(None if best == len(full) - 1 else self._avail[a][best])
                if new != th.caps:
                    th.caps = new
                    changed = True
        for _i_dom, node, _max_hz, st in self._vcaps:
            if st.update(temps[node]):
                changed = True
        if changed:
            self._apply_caps()

    def _apply_caps(self) -> None:
        n = len(self._names)
        caps: list[int | None] = [None] * n
        for th in self._throttles:
            for a, c in zip(th.actors, th.caps):
                if c is not None and (caps[a] is None or c < caps[a]):
                    caps[a] = c
        for i_dom, _node, max_hz, st in self._vcaps:
            if st.engaged and max_hz < self._avail[i_dom][-1]:
                if caps[i_dom] is None or max_hz < caps[i_dom]:
                    caps[i_dom] = max_hz
        any_capped = False
        for i in range(n):
            capped = caps[i] is not None and caps[i] < self._avail[i][-1]
            self._was_capped[i] = capped
            any_capped = any_capped or capped
            if caps[i] != self._cap[i]:
                self._cap[i] = caps[i]
                self._ver += 1
                self._apply_target(i)
        if any_capped and self._capped_since is None:
            self._capped_since = self.time_s
            self._throttle_events += 1
        elif not any_capped and self._capped_since is not None:
            self._throttled_time += self.time_s - self._capped_since
            self._capped_since = None

    def _settle_idle(self) -> None:
        """Start from the idle steady state (a board that has been on for a while)."""
        for _ in range(4):
            powers = [0.0] * len(self.net.temps)
            for i in range(len(self._names)):
                powers[self._node_of[i]] += self._power[i]
            powers[self._root_node] += self.profile.soc_static_w
            self.net.settle(powers, seconds=2000.0, dt=5.0)
            for i in range(len(self._names)):
                self._recompute_power(i)
        # Kernel governors at zero load settle their clocks too.
        for i in range(len(self._names)):
            if self._gov[i] != "userspace":
                self._kernel_governor(i, 0.0)
        for i, _t, oi in [(p[1], p[0], p[2]) for p in self._pending]:
            self._oi[i] = oi
            self._recompute_power(i)
        self._pending = []
        self._next_pending = _INF
        for k in range(len(self._peak)):
            self._peak[k] = self._zone_temp(k)


def idle_state_into(profile: SocProfile, variant: str | None, state: BoardState) -> BoardState:
    """Fill ``state`` with the idle steady state of ``profile`` (for static board trees)."""
    board = SimBoard(profile, variant=variant, noise=False)
    return board.board_state(state)
