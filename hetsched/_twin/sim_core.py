"""The fast simulation's state and its exact integration (power, energy, work progress).

:class:`SimCore` holds what :class:`~hetsched._twin.sim.SimBoard` knows about each domain as
parallel lists indexed by domain (the inner loop is hot), builds them from a profile
(:meth:`SimCore._init_core`), and integrates the piecewise-constant power exactly
(:meth:`SimCore._flush`). Governor emulation and thermal throttling build on it
(:mod:`~hetsched._twin.sim_governors`, :mod:`~hetsched._twin.sim_thermal`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from .._errors import TwinError
from .._snapshot import DomainState, RailState, ZoneState
from .physics import SensorNoise, ThermalNetwork, leakage_share
from .schema import RailProfile, SocProfile
from .sim_types import PhaseWork
from .state import default_governor, governors_for

__all__ = ["INF", "SimCore"]

INF = math.inf


class SimCore:
    """Per-domain state, power and energy integration of a simulated board."""

    profile: SocProfile

    def _init_core(self, prof: SocProfile, variant: str | None, ambient_c: float, seed: int, noise: bool) -> None:
        """Build the per-domain state of ``prof`` at boot (clocks, governors, accumulators)."""
        self.profile = prof
        self.variant = variant if variant is not None else prof.default_variant
        self.layout = prof.layout(self.variant)
        self.ambient_c = float(ambient_c)
        self.time_s = 0.0
        self.noise = SensorNoise(seed, temp_step_c=prof.temp_step_c, enabled=noise)

        doms = prof.domains
        n = len(doms)
        self._names = [d.name for d in doms]
        self._index = {d.name: i for i, d in enumerate(doms)}
        self._kind = [d.kind for d in doms]
        self._avail = [list(d.available_hz) for d in doms]
        self._avail_t = [tuple(a) for a in self._avail]
        self._volt = [[o.voltage_mv for o in d.opps] for d in doms]
        self._vtop = [d.opps[-1].voltage_mv for d in doms]
        self._full = [[d.capacitance * o.voltage_mv**2 * o.freq_hz * 1e-18 * d.units for o in d.opps] for d in doms]
        self._idle_act = [d.idle_activity for d in doms]
        self._stall_act = [d.stall_activity for d in doms]
        self._leak = [d.leak_w for d in doms]
        self._leak_k = [d.leak_per_c for d in doms]
        self._gates = [d.gates_when_idle for d in doms]
        self._gating_on = [d.gates_when_idle for d in doms]
        self._deep_leak = [d.deep_idle_leak_fraction for d in doms]
        self._cpuidle = True
        self._latency = [d.switch_latency_s for d in doms]
        self._bw_per_hz = [d.bytes_per_cycle * d.bandwidth_efficiency for d in doms]
        self._mem = next((i for i, d in enumerate(doms) if d.kind == "memory"), -1)

        # Clocks and governors.
        self._gov = [default_governor(prof, d) for d in doms]
        self._gov_boot = list(self._gov)
        self._govs_ok = [governors_for(prof, d) for d in doms]
        self._min = [d.default_min_hz if d.default_min_hz is not None else d.min_hz for d in doms]
        self._max = [d.max_hz for d in doms]
        self._setspeed: list[int | None] = [None] * n
        self._cap: list[int | None] = [None] * n
        self._target = [d.boot_hz or d.min_hz for d in doms]  # what sysfs shows (achieved)
        self._oi = [self._avail[i].index(self._target[i]) for i in range(n)]  # OPP index in effect
        self._pending: list[tuple[float, int, int]] = []  # (time, domain, opp index)
        self._util_bg = [0.0] * n
        self._act_bg = [0.0] * n
        self._util_work = [0.0] * n  # kernel-visible busy share of the work (stalls included)
        self._act_work = [0.0] * n  # switching activity of the work (stalls at stall_activity)
        self._util = [0.0] * n  # what the kernel sees: governors, load files, snapshots
        self._act = [0.0] * n  # what draws dynamic power
        self._updown = [d.ondemand_thresholds for d in doms]
        self._floor = [d.governor_floor_hz for d in doms]
        self._gov_period = [0.02 if d.kind == "cpu" else 0.05 for d in doms]
        self._next_gov = [self._gov_period[i] for i in range(n)]
        self._next_gov_any = min(self._next_gov)
        self._next_pending = INF

        # Thermal network and zones.
        self.net = ThermalNetwork(prof.nodes, ambient_c)
        self._node_index = {nm: j for j, nm in enumerate(self.net.names)}
        self._node_of = [self._node_index[d.thermal_node] for d in doms]
        self._root_node = next(j for j, nd in enumerate(prof.nodes) if nd.parent == "ambient")
        self._zone_nodes = [[self._node_index[nm] for nm in z.nodes] for z in self.layout.zones]
        self._zone_names = [z.type for z in self.layout.zones]
        self._peak = [-INF] * len(self.layout.zones)

        # Accumulators.
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
        # Work in progress (execute).
        self._work_rate = 0.0
        self._work_done = 0.0
        self._work: PhaseWork | None = None
        self._work_fixed_frac = 0.0

        # Snapshot caches.
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

    # ------------------------------------------------------------------ lookups

    def _i(self, domain: str) -> int:
        try:
            return self._index[domain]
        except KeyError:
            raise TwinError(f"{self.profile.name} has no domain {domain!r}; domains: {', '.join(self._names)}") from None

    def _eff_max(self, i: int) -> int:
        cap = self._cap[i]
        return self._max[i] if cap is None or cap >= self._max[i] else cap

    def _zone_temp(self, k: int) -> float:
        temps = self.net.temps
        return max(temps[j] for j in self._zone_nodes[k])

    # ------------------------------------------------------------------ rails

    def _rail_power(self, r: RailProfile, powers: Sequence[float]) -> float:
        prof = self.profile
        if r.total:
            return (sum(powers) + prof.board_static_w) / prof.converter_efficiency
        p = r.static_w
        for name, share in r.shares.items():
            p += share * powers[self._index[name]]
        return p

    def _rails(self, powers: Sequence[float]) -> dict[str, float]:
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

    # ------------------------------------------------------------------ integration

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
        # A stalled unit is powered and counts as busy (``_util``) but switches less (``_act``).
        u = self._util[i]
        oi = self._oi[i]
        if self._gating_on[i] and u <= 0.0:
            self._dyn[i] = 0.0
            self._power[i] = 0.0
            return
        full = self._full[i][oi]
        dyn = full * self._act[i]
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
        a = self._act_bg[i] + self._act_work[i]
        self._act[i] = 1.0 if a > 1.0 else a
        self._recompute_power(i)

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
            self._work_rate = INF
            self._work_done = 1.0
            return
        self._work_rate = 1.0 / total
        inv = 1.0 / total
        util_work = self._util_work
        act_work = self._act_work
        stall_act = self._stall_act
        for i in range(len(self._names)):
            t = times.get(i, 0.0)
            if i == m and mem_t:
                u = a = mem_t * inv
            elif t > 0.0:
                # The unit is occupied while it computes or its share of the phase's memory traffic
                # is in flight (the phase's time were it the only compute domain); the part beyond
                # its compute is a memory stall. Waiting on another domain is idle, not a stall.
                busy = ov * (t if t > mem_t else mem_t) + (1.0 - ov) * (t + mem_t)
                u = busy * inv
                a = (t + stall_act[i] * (busy - t)) * inv
            else:
                u = a = 0.0
            if u != util_work[i] or a != act_work[i]:
                util_work[i] = u
                act_work[i] = a
                self._update_util(i)
