"""Fast simulation of a twin board in virtual time (no files): :class:`SimBoard`.

The model is split by concern: :mod:`~hetsched._twin.sim_core` (state built from a profile,
exact integration), :mod:`~hetsched._twin.sim_governors` (kernel governor emulation),
:mod:`~hetsched._twin.sim_thermal` (thermal steps and throttling); this module is the public
API on top.

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
  (``cpuidle/state*/disable``). ``jetson_clocks`` does both (NVIDIA ``jetson_clocks``; ``docs/sources.md`` [jetson-clocks]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from .._errors import TwinError, UnsupportedFrequencyError
from .._snapshot import DomainState, RailState, Snapshot, ZoneState
from .profiles import get_profile
from .schema import SocProfile
from .sim_core import INF
from .sim_thermal import SimThermal
from .sim_types import DomainInfo, PhaseWork, SimStatistics
from .state import BoardState, boot_state

__all__ = ["DomainInfo", "PhaseWork", "SimBoard", "SimStatistics", "idle_state_into"]


class SimBoard(SimThermal):
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
        self._init_core(prof, variant, ambient_c, seed, noise)
        self._init_thermal()
        for i in range(len(self._names)):
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
        return [n for n, g in zip(self._names, self._gates, strict=False) if g]

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

    def set_utilisation(self, domain: str, util: float, *, stalled: float = 0.0) -> None:
        """Background utilisation (0..1) of ``domain`` until changed.

        ``stalled`` is the part of that busy time (0..1) spent waiting on memory: the kernel sees
        all of ``util`` as load, but the stalled part draws only the domain's ``stall_activity``
        share of its busy power.

        Raises:
            TwinError: unknown domain, or ``util`` or ``stalled`` outside [0, 1].
        """
        i = self._i(domain)
        if not 0.0 <= util <= 1.0:
            raise TwinError(f"utilisation {util!r} for {domain}: must be in [0, 1]")
        if not 0.0 <= stalled <= 1.0:
            raise TwinError(f"stalled share {stalled!r} for {domain}: must be in [0, 1]")
        self._flush()
        self._util_bg[i] = float(util)
        self._act_bg[i] = float(util) * (1.0 - stalled + stalled * self._stall_act[i])
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

    def total_power_w(self) -> float:
        """Board/module input power (true)."""
        return (sum(self._power) + self.profile.board_static_w) / self.profile.converter_efficiency

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
                if self._work_rate == INF:
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
                if self._util_work[i] or self._act_work[i]:
                    self._util_work[i] = 0.0
                    self._act_work[i] = 0.0
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
        peaks = {nm: p for nm, p, z in zip(self._zone_names, self._peak, self.layout.zones, strict=False) if not z.offline}
        return SimStatistics(
            time_s=self.time_s,
            energy_j=total,
            energy_by_rail_j=MappingProxyType(rail_e),
            energy_by_domain_j=MappingProxyType(dict(zip(self._names, self._e_dom, strict=False))),
            dynamic_energy_by_domain_j=MappingProxyType(dict(zip(self._names, self._e_dyn, strict=False))),
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
            for a, cap in zip(th.actors, th.caps, strict=False):
                name = self._names[a]
                if cap is None:
                    state.cooling_states[name] = 0
                else:
                    av = self._avail[a]
                    state.cooling_states[name] = len(av) - 1 - av.index(cap)
        state.rail_power_w = {k: self.noise.power(v) for k, v in self._rails(self._power).items()}
        if prof.quirks.memory_rate_lock and self._mem >= 0:
            # A fixed memory rate means the firmware's rate lock is held (Jetson BPMP).
            state.emc_locked = self._gov[self._mem] == "userspace"
        return state

    # ------------------------------------------------------------------ event loop

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


def idle_state_into(profile: SocProfile, variant: str | None, state: BoardState) -> BoardState:
    """Fill ``state`` with the idle steady state of ``profile`` (for static board trees)."""
    board = SimBoard(profile, variant=variant, noise=False)
    return board.board_state(state)
