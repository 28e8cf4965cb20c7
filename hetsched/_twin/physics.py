"""The twin's physical model: pure functions and small state machines, no I/O.

* Power of a domain = dynamic ``C * V^2 * f`` times its switching activity (kernel energy
  model, one term per busy unit) + a small clock-tree/refresh term at idle + leakage that grows
  exponentially with temperature and linearly with voltage. A unit that has work but waits on
  memory switches at its ``stall_activity`` share, while the kernel counts it as busy (the
  load governors see), which is why load-driven governors over-clock memory-bound phases. Power-gated blocks (Mali,
  RKNPU, a railgated Jetson GPU) draw nothing at zero utilisation, unless software keeps
  them powered (Jetson ``railgate_enable=0``): then leakage and idle activity at the current
  voltage. Idle CPU cores in cpuidle's deep state (``c7``/``cpu-sleep``) are powered down and
  stop leaking, but for the cluster's shared part (:func:`leakage_share`); with cpuidle
  disabled (``jetson_clocks``) they wait in WFI and leak in full.
* An RC thermal network: each node has a heat capacity and a resistance to its parent
  (another node or ambient). Integrated with a per-node exponential (Gauss-Seidel) update,
  stable for any step.
* Kernel throttling: ``step_wise`` (one cooling state per polling period while above a
  passive trip and rising; back down only below trip - hysteresis and falling) and
  ``power_allocator`` (IPA's PID on the control temperature, budget split in proportion to
  requested power), plus Rockchip's OPP-table temperature caps.
* Seeded sensor noise and an exact energy integrator for piecewise-constant power.

Plain floats and lists throughout: the fast simulation calls these tens of thousands of
times per wall second.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from .profiles import ThermalNode

__all__ = [
    "EnergyIntegrator",
    "PowerAllocator",
    "SensorNoise",
    "StepWise",
    "TempCapState",
    "ThermalNetwork",
    "dynamic_power_w",
    "leakage_share",
    "leakage_w",
]


def dynamic_power_w(
    capacitance: float, voltage_mv: float, freq_hz: float, units: int, util: float, idle_activity: float = 0.0
) -> float:
    """Dynamic power: ``units * C * mV^2 * MHz / 1e12`` W times (utilisation + idle activity).

    ``capacitance`` is the device-tree ``dynamic-power-coefficient`` (uW per mV^2 per MHz per unit).
    """
    full = capacitance * voltage_mv * voltage_mv * (freq_hz * 1e-6) * 1e-12 * units
    return full * (util + idle_activity)


def leakage_w(leak_w: float, voltage_mv: float, v_top_mv: float, temp_c: float, leak_per_c: float) -> float:
    """Leakage: ``leak_w`` at 25 C and the top voltage, linear in V, exponential in T."""
    return leak_w * (voltage_mv / v_top_mv) * math.exp(leak_per_c * (temp_c - 25.0))


def leakage_share(util: float, deep_idle_leak_fraction: float, deep_idle: bool = True) -> float:
    """Fraction of a domain's leakage drawn at utilisation ``util`` (0..1).

    Busy units leak in full; idle units leak ``deep_idle_leak_fraction`` of theirs when a
    deep idle state may power them down (``deep_idle``), else in full (WFI keeps them powered).
    """
    if not deep_idle:
        return 1.0
    return util + (1.0 - util) * deep_idle_leak_fraction


class ThermalNetwork:
    """RC network of :class:`~hetsched._twin.profiles.ThermalNode` s above an ambient temperature.

    ``temps`` holds node temperatures in node order. :meth:`step` takes node powers (W) held
    constant over ``dt``.
    """

    __slots__ = ("_c", "_cache", "_g_sum", "_nbrs", "_parent", "ambient_c", "names", "temps")

    def __init__(self, nodes: Sequence[ThermalNode], ambient_c: float = 25.0) -> None:
        self.ambient_c = float(ambient_c)
        self.names = [n.name for n in nodes]
        index = {n: i for i, n in enumerate(self.names)}
        self._c = [float(n.capacitance_j_per_k) for n in nodes]
        self._parent = [index[n.parent] if n.parent != "ambient" else -1 for n in nodes]
        # Neighbour lists as (index or -1 for ambient, conductance).
        nbrs: list[list[tuple[int, float]]] = [[] for _ in nodes]
        for i, n in enumerate(nodes):
            g = 1.0 / n.resistance_k_per_w
            p = self._parent[i]
            nbrs[i].append((p, g))
            if p >= 0:
                nbrs[p].append((i, g))
        self._nbrs = nbrs
        self._g_sum = [sum(g for _, g in nb) for nb in nbrs]
        self._cache: dict[float, list[float]] = {}
        self.temps = [self.ambient_c] * len(nodes)

    def _alphas(self, dt: float) -> list[float]:
        a = self._cache.get(dt)
        if a is None:
            a = [1.0 - math.exp(-dt * g / c) for g, c in zip(self._g_sum, self._c, strict=False)]
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[dt] = a
        return a

    def step(self, power_w: Sequence[float], dt: float) -> None:
        """Advance by ``dt`` seconds with node powers ``power_w`` (W)."""
        temps = self.temps
        amb = self.ambient_c
        alphas = self._alphas(dt)
        for i, nb in enumerate(self._nbrs):
            flow = power_w[i]
            for j, g in nb:
                flow += g * (temps[j] if j >= 0 else amb)
            t_eq = flow / self._g_sum[i]
            temps[i] += (t_eq - temps[i]) * alphas[i]

    def heat_to_ambient_w(self) -> float:
        """Heat leaving the network into ambient right now (W)."""
        out = 0.0
        for i, nb in enumerate(self._nbrs):
            for j, g in nb:
                if j < 0:
                    out += g * (self.temps[i] - self.ambient_c)
        return out

    def stored_heat_j(self) -> float:
        """Heat stored above ambient (J)."""
        return sum(c * (t - self.ambient_c) for c, t in zip(self._c, self.temps, strict=False))

    def settle(self, power_w: Sequence[float], *, seconds: float = 3600.0, dt: float = 1.0) -> None:
        """Run to (near) steady state under constant ``power_w``."""
        n = int(seconds / dt)
        for _ in range(n):
            self.step(power_w, dt)


class StepWise:
    """Kernel ``step_wise`` for one passive trip and its cooling devices.

    Called once per polling period with the zone temperature. The trip is *crossed* when the
    temperature reaches ``trip_c``; it stays crossed until the temperature falls below
    ``trip_c - hyst_c`` (the kernel's trip threshold with hysteresis). While crossed and the
    temperature is rising, every device goes one cooling state deeper (up to its max); once
    no longer crossed and falling, one state shallower.
    """

    __slots__ = ("_last", "crossed", "hyst_c", "max_states", "states", "trip_c")

    def __init__(self, trip_c: float, hyst_c: float, max_states: Sequence[int]) -> None:
        self.trip_c = trip_c
        self.hyst_c = hyst_c
        self.max_states = list(max_states)
        self.states = [0] * len(self.max_states)
        self.crossed = False
        self._last: float | None = None

    def update(self, temp_c: float) -> bool:
        """Apply one polling period; returns True when any cooling state changed."""
        last = self._last if self._last is not None else temp_c
        self._last = temp_c
        if self.crossed:
            if temp_c < self.trip_c - self.hyst_c:
                self.crossed = False
        elif temp_c >= self.trip_c:
            self.crossed = True
        changed = False
        if self.crossed and temp_c >= last:
            # "raising" (or stable while over the trip on the first crossing)
            if temp_c > last or not any(self.states):
                for i, m in enumerate(self.max_states):
                    if self.states[i] < m:
                        self.states[i] += 1
                        changed = True
        elif not self.crossed and temp_c <= last:
            for i in range(len(self.states)):
                if self.states[i] > 0:
                    self.states[i] -= 1
                    changed = True
        return changed


class PowerAllocator:
    """Kernel ``power_allocator`` (IPA) for one zone.

    ``P_max = k_p * e + k_i * sum(e) + SP`` with ``e = T_control - T``; ``k_pu = 2 SP / (T_c - T_on)``
    when below the control temperature, ``k_po = SP / (T_c - T_on)`` above, ``k_i = k_pu / 10``
    integrated only while above control (integral_cutoff = 0), clamped to [0, sum of max power].
    Below the switch-on temperature it does not limit and resets its integral.
    """

    __slots__ = ("active", "control_c", "integral", "k_i", "k_po", "k_pu", "sustainable_w", "switch_on_c")

    def __init__(self, switch_on_c: float, control_c: float, sustainable_w: float) -> None:
        self.switch_on_c = switch_on_c
        self.control_c = control_c
        self.sustainable_w = sustainable_w
        span = max(1e-6, control_c - switch_on_c)
        self.k_pu = 2.0 * sustainable_w / span
        self.k_po = sustainable_w / span
        self.k_i = self.k_pu / 10.0
        self.integral = 0.0
        self.active = False

    def budget_w(self, temp_c: float, max_total_w: float) -> float | None:
        """Total power budget for this period, or None (no limit: below switch-on)."""
        if temp_c < self.switch_on_c:
            self.active = False
            self.integral = 0.0
            return None
        self.active = True
        err = self.control_c - temp_c
        p = (self.k_po if err < 0 else self.k_pu) * err
        if err < 0.0:
            nxt = self.integral + err
            if abs(self.k_i * nxt) < max_total_w:
                self.integral = nxt
        budget = p + self.k_i * self.integral + self.sustainable_w
        return min(max(budget, 0.0), max_total_w)

    @staticmethod
    def divvy(budget_w: float, requested_w: Sequence[float], max_w: Sequence[float]) -> list[float]:
        """Split ``budget_w`` in proportion to requests, capped at each actor's max; surplus re-shared."""
        n = len(requested_w)
        granted = [0.0] * n
        total_req = sum(requested_w)
        if total_req <= 0.0:
            return [budget_w / n if n else 0.0] * n
        extra = 0.0
        for i in range(n):
            g = budget_w * requested_w[i] / total_req
            if g > max_w[i]:
                extra += g - max_w[i]
                g = max_w[i]
            granted[i] = g
        if extra > 0.0:
            room = [max_w[i] - granted[i] for i in range(n)]
            total_room = sum(room)
            if total_room > 0.0:
                for i in range(n):
                    granted[i] += min(room[i], extra * room[i] / total_room)
        return granted


class TempCapState:
    """A temperature-triggered frequency cap with hysteresis (Rockchip ``rockchip,high-temp``)."""

    __slots__ = ("above_c", "engaged", "hyst_c")

    def __init__(self, above_c: float, hyst_c: float) -> None:
        self.above_c = above_c
        self.hyst_c = hyst_c
        self.engaged = False

    def update(self, temp_c: float) -> bool:
        """Returns True when the cap engaged or released."""
        if self.engaged:
            if temp_c < self.above_c - self.hyst_c:
                self.engaged = False
                return True
        elif temp_c > self.above_c:
            self.engaged = True
            return True
        return False


class SensorNoise:
    """Seeded sensor noise: Gaussian, quantised to the sensor's resolution."""

    __slots__ = ("_rng", "enabled", "power_rel_sd", "temp_sd_c", "temp_step_c")

    def __init__(
        self, seed: int = 0, *, temp_sd_c: float = 0.15, temp_step_c: float = 0.001, power_rel_sd: float = 0.01,
        enabled: bool = True,
    ) -> None:
        self._rng = random.Random(seed)
        self.temp_sd_c = temp_sd_c
        self.temp_step_c = temp_step_c
        self.power_rel_sd = power_rel_sd
        self.enabled = enabled

    def temp(self, true_c: float) -> float:
        t = true_c + self._rng.gauss(0.0, self.temp_sd_c) if self.enabled else true_c
        step = self.temp_step_c
        return round(round(t / step) * step, 6)

    def power(self, true_w: float) -> float:
        if not self.enabled or true_w <= 0.0:
            return true_w
        return max(0.0, true_w * (1.0 + self._rng.gauss(0.0, self.power_rel_sd)))

    def chance(self, p: float) -> bool:
        return self._rng.random() < p


class EnergyIntegrator:
    """Exact energy of piecewise-constant power (rectangle rule on the segments it is given).

    ``add(power_w, dt)`` for a segment; ``add_sample(t, p)`` integrates sampled power with the
    trapezoid rule (telemetry).
    """

    __slots__ = ("_last_p", "_last_t", "energy_j", "time_s")

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.time_s = 0.0
        self._last_t: float | None = None
        self._last_p = 0.0

    def add(self, power_w: float, dt: float) -> None:
        self.energy_j += power_w * dt
        self.time_s += dt

    def add_sample(self, t: float, power_w: float) -> None:
        if self._last_t is not None and t > self._last_t:
            dt = t - self._last_t
            self.energy_j += 0.5 * (power_w + self._last_p) * dt
            self.time_s += dt
        self._last_t = t
        self._last_p = power_w

    @property
    def mean_power_w(self) -> float:
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0
