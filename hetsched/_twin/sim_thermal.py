"""Thermal steps and kernel throttling of the fast simulation.

Thermal steps advance the RC network (:class:`~hetsched._twin.physics.ThermalNetwork`) with the
energy each node received since the last step: the passive polling period near a trip, a
coarser step when far below. Throttling follows the layout: ``step_wise`` and
``power_allocator`` instances poll their zone and cap their actors; vendor OPP-table
temperature caps (``rockchip,high-temp``) cap a domain above a temperature. The lowest cap of
each domain is its effective maximum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .physics import PowerAllocator, StepWise, TempCapState
from .schema import ThrottleInstance
from .sim_core import INF
from .sim_governors import SimGovernors

__all__ = ["SimThermal"]


@dataclass(slots=True)
class _Throttle:
    """One throttling instance at run time: its zone's nodes, actors and current caps."""

    inst: ThrottleInstance
    zone_nodes: list[int]
    actors: list[int]
    sw: StepWise | None
    ipa: PowerAllocator | None
    caps: list[int | None]
    polling_s: float
    next_poll: float = 0.0


class SimThermal(SimGovernors):
    """Thermal integration and throttling on top of :class:`SimGovernors`."""

    def _init_thermal(self) -> None:
        """Build the thermal step schedule, throttling instances and vendor caps of the layout."""
        layout = self.layout
        # Every node's RC time constant is >= 0.45 s, so 0.1 s steps far below a trip stay accurate.
        self._th_dt_fast = max(0.02, min([layout.passive_polling_s] + [t.polling_s for t in layout.throttling]))
        self._th_dt_slow = max(self._th_dt_fast, 0.1)
        self._th_dt = self._th_dt_slow
        self._last_thermal = 0.0
        self._next_thermal = self._th_dt
        passive = [z.passive_trip_c for z in layout.zones if z.passive_trip_c is not None]
        passive += [c.above_c for c in layout.caps]
        self._fast_above_c = (min(passive) - 4.0) if passive else math.inf
        self._throttles: list[_Throttle] = []
        for inst in layout.throttling:
            actors = [self._index[a] for a in inst.actors]
            z = layout.zones[inst.zone]
            trip = z.trips[inst.trip]
            sw: StepWise | None = None
            ipa: PowerAllocator | None = None
            if inst.governor == "power_allocator" and inst.switch_on_trip is not None:
                ipa = PowerAllocator(z.trips[inst.switch_on_trip].temp_c, trip.temp_c, inst.sustainable_power_w)
            else:
                sw = StepWise(trip.temp_c, trip.hyst_c, [len(self._avail[a]) - 1 for a in actors])
            self._throttles.append(_Throttle(
                inst=inst, zone_nodes=self._zone_nodes[inst.zone], actors=actors, sw=sw, ipa=ipa,
                caps=[None] * len(actors), polling_s=inst.polling_s,
            ))
        self._vcaps = [
            (self._index[c.domain], self._node_index[c.node], c.max_hz, TempCapState(c.above_c, c.hyst_c))
            for c in layout.caps
        ]

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

    def _ipa_caps(self, th: _Throttle, ipa: PowerAllocator, t: float) -> list[int | None]:
        """power_allocator: the budget split over the actors, each at the highest OPP it affords."""
        max_w = [self._full[a][-1] for a in th.actors]
        budget = ipa.budget_w(t, sum(max_w))
        if budget is None:
            return [None] * len(th.actors)
        # The kernel's cooling devices estimate power from the load they see (stalls count as busy),
        # so IPA overestimates a stalled actor's power, as on a board.
        req = [self._full[a][self._oi[a]] * max(self._util[a], 0.01) for a in th.actors]
        granted = PowerAllocator.divvy(budget, req, max_w)
        new: list[int | None] = []
        for k, a in enumerate(th.actors):
            u = max(self._util[a], 0.01)
            full = self._full[a]
            best = 0
            for oi in range(len(full)):
                if full[oi] * u <= granted[k]:
                    best = oi
            new.append(None if best == len(full) - 1 else self._avail[a][best])
        return new

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
                for k, a in enumerate(th.actors):
                    s = th.sw.states[k]
                    cap = None if s == 0 else self._avail[a][len(self._avail[a]) - 1 - s]
                    if cap != th.caps[k]:
                        th.caps[k] = cap
                        changed = True
            elif th.ipa is not None:
                new = self._ipa_caps(th, th.ipa, t)
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
            for a, c in zip(th.actors, th.caps, strict=False):
                cur = caps[a]
                if c is not None and (cur is None or c < cur):
                    caps[a] = c
        for i_dom, _node, max_hz, st in self._vcaps:
            if st.engaged and max_hz < self._avail[i_dom][-1]:
                cur = caps[i_dom]
                if cur is None or max_hz < cur:
                    caps[i_dom] = max_hz
        any_capped = False
        for i in range(n):
            c = caps[i]
            capped = c is not None and c < self._avail[i][-1]
            self._was_capped[i] = capped
            any_capped = any_capped or capped
            if c != self._cap[i]:
                self._cap[i] = c
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
        self._next_pending = INF
        for k in range(len(self._peak)):
            self._peak[k] = self._zone_temp(k)
