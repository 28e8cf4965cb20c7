"""Thermal guard: a first-order RC model per zone, fitted online, turned into a power cap.

Each zone is modelled as one thermal RC driven by the board's total power ``P``::

    dT/dt = (T_amb + R·P - T) / tau          i.e.   dT/dt = a + b·P - c·T

with ``c = 1/tau``, ``b = R/tau``, ``a = T_amb/tau``. The parameters are fitted by
recursive least squares (with slow forgetting, so the fit follows a board whose heatsink
warms up) on windows of telemetry: each window gives the slope of the temperature
(a least-squares line, robust to sensor noise), the mean power and the mean
temperature. A steady workload keeps ``P`` nearly constant, so the data alone may not
separate ``a`` (ambient) from ``b`` (resistance): a fit whose parameters are not
physically plausible is not used, and the zone is guarded by a proportional fallback
instead (the temperature extrapolated over the horizon from the measured slope, each
degree over the limit costing ``1/R_prior`` watts). Once the guard has moved the power,
the data identify ``R`` and the fit takes over.

From a fitted zone, the hottest it may get over the coming horizon ``h`` at constant
power ``P`` is ``T(h) = T_inf + (T0 - T_inf)·exp(-h/tau)`` with ``T_inf = T_amb + R·P``,
so the largest power that keeps ``T(h)`` at or below ``limit`` is::

    P_cap = (limit - T_amb - (T0 - T_amb)·e) / (R·(1 - e)),    e = exp(-h/tau)

The governor treats ``P_cap`` like the power budget: it lowers clocks until the
predicted power fits, before the zone reaches its passive trip, so the kernel never
has to throttle. A zone with only a critical trip is kept ``critical_margin_c`` below it
(:meth:`ThermalGuard.zone_limit_c`); one already past its limit caps at 95 % of the power now
at every tick, so the cap only falls until it cools. Everything here is pure (no I/O); :class:`ThermalGuard` keeps the
per-zone fits and windows of one governor and the cap they give now.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._snapshot import Snapshot
    from ._decide import GovernorConfig

__all__ = ["RCFit", "ThermalGuard", "ThermalPrior", "ZoneWindow", "zone_power_cap"]

_REACTIVE_BAND_C = 1.0
"""A zone without a usable fit is capped once its temperature, extrapolated over the horizon,
comes within this of its limit. Wider: caps earlier and more often; narrower: later, closer
to the limit."""
REACTIVE_STEP = 0.95
"""A zone within the reactive band of its limit caps the board at this fraction of the power
now, at every tick until it stops rising: one step down per tick. Smaller: the zone cools
sooner, the clocks dip deeper; larger: a slower descent that may overshoot the limit."""


@dataclass(frozen=True)
class ThermalPrior:
    """Generic starting guesses (not any board's): weak, the data overrides them quickly."""

    tau_s: float = 30.0
    r_c_per_w: float = 4.0
    ambient_c: float = 25.0
    confidence: float = 1.0
    """How many windows' worth of evidence the prior counts as."""


@dataclass(frozen=True)
class RCFit:
    """Recursive-least-squares state of ``dT/dt = a + b·P - c·T`` for one zone."""

    theta: tuple[float, float, float]
    cov: tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float]]
    n: int = 0
    forgetting: float = 0.999
    last_power_w: float | None = None
    """Mean power of the latest window: where ``T_inf`` is best known."""
    ambient_ceiling_c: float | None = None
    """Ambient cannot be above this (the coolest this zone was seen): see :meth:`params`."""

    @staticmethod
    def from_prior(prior: ThermalPrior = ThermalPrior(), *, forgetting: float = 0.999) -> RCFit:
        c = 1.0 / prior.tau_s
        theta = (prior.ambient_c * c, prior.r_c_per_w * c, c)
        # Prior variances scaled to the parameters' magnitudes (a is large, b and c small).
        scale = 1.0 / max(prior.confidence, 1e-6)
        var = (max(abs(theta[0]), 1.0) ** 2 * scale, max(theta[1], 0.05) ** 2 * 4 * scale, theta[2] ** 2 * 4 * scale)
        cov = ((var[0], 0.0, 0.0), (0.0, var[1], 0.0), (0.0, 0.0, var[2]))
        return RCFit(theta, cov, 0, forgetting)

    def update(self, slope_c_per_s: float, power_w: float, temp_c: float, *, weight: float = 1.0) -> RCFit:
        """One window's evidence: mean slope, mean power, mean temperature (``weight`` windows' worth)."""
        w = math.sqrt(weight)
        x = (w, power_w * w, -temp_c * w)
        slope_c_per_s *= w
        P = self.cov
        px = tuple(sum(P[i][j] * x[j] for j in range(3)) for i in range(3))
        denom = self.forgetting + sum(x[i] * px[i] for i in range(3))
        k = tuple(v / denom for v in px)
        err = slope_c_per_s - sum(self.theta[i] * x[i] for i in range(3))
        theta = tuple(self.theta[i] + k[i] * err for i in range(3))
        cov = tuple(
            tuple((P[i][j] - k[i] * px[j]) / self.forgetting for j in range(3)) for i in range(3)
        )
        return replace(self, theta=theta, cov=cov, n=self.n + 1, last_power_w=power_w / w)  # type: ignore[arg-type]

    def with_ambient_ceiling(self, temp_c: float) -> RCFit:
        """Note that the zone was seen at ``temp_c``: ambient is at most that."""
        if self.ambient_ceiling_c is not None and self.ambient_ceiling_c <= temp_c:
            return self
        return replace(self, ambient_ceiling_c=temp_c)

    def params(self) -> tuple[float, float, float] | None:
        """(tau, R, ambient), or None when the fit is not usable.

        The data pin down ``tau`` and ``T_inf`` at the recent power well, the split of
        ``T_inf`` into ambient + R·P less so. Ambient is capped at the coolest the zone
        was seen and R re-derived through ``T_inf`` at the recent power, which keeps the
        prediction right near the operating point where the cap is used.
        """
        a, b, c = self.theta
        if self.n < 3 or c <= 0 or not 1.0 <= 1.0 / c <= 10_000.0:
            return None
        tau = 1.0 / c
        amb = a / c
        r = b / c
        ceiling = self.ambient_ceiling_c
        p = self.last_power_w
        if ceiling is not None and p is not None and p > 0 and (amb > ceiling or not 0.05 <= r <= 100.0):
            t_inf = (a + b * p) / c
            amb = ceiling
            r = (t_inf - amb) / p
        if not 0.05 <= r <= 100.0:
            return None
        return tau, r, amb

    # -- derived physical parameters ---------------------------------------------

    @property
    def usable(self) -> bool:
        """Fitted on a few windows and physically plausible (tau 1 s..3 h, R 0.05..100 K/W)."""
        return self.params() is not None

    @property
    def tau_s(self) -> float:
        p = self.params()
        return p[0] if p else 1.0 / self.theta[2]

    @property
    def r_c_per_w(self) -> float:
        p = self.params()
        return p[1] if p else self.theta[1] / self.theta[2]

    @property
    def ambient_c(self) -> float:
        p = self.params()
        return p[2] if p else self.theta[0] / self.theta[2]

    def predict(self, temp_c: float, power_w: float, horizon_s: float) -> float:
        """Temperature after ``horizon_s`` at constant ``power_w`` from ``temp_c``."""
        t_inf = self.ambient_c + self.r_c_per_w * power_w
        return t_inf + (temp_c - t_inf) * math.exp(-horizon_s / self.tau_s)

    def power_cap(self, temp_c: float, limit_c: float, horizon_s: float) -> float:
        """Largest constant power keeping the zone at or below ``limit_c`` for ``horizon_s``."""
        e = math.exp(-horizon_s / self.tau_s)
        return (limit_c - self.ambient_c - (temp_c - self.ambient_c) * e) / (self.r_c_per_w * (1.0 - e))


@dataclass(frozen=True)
class ZoneWindow:
    """Telemetry samples of one zone collected until the window is long enough to fit on."""

    times: tuple[float, ...] = ()
    temps: tuple[float, ...] = ()
    powers: tuple[float, ...] = ()
    weights: tuple[float, ...] = ()

    def add(self, time_s: float, temp_c: float, power_w: float, weight_s: float = 1.0) -> ZoneWindow:
        """One sample; ``power_w`` is the mean power over the ``weight_s`` seconds before it."""
        return ZoneWindow(
            (*self.times, time_s), (*self.temps, temp_c), (*self.powers, power_w), (*self.weights, max(weight_s, 0.0))
        )

    @property
    def span_s(self) -> float:
        return self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0

    def summary(self) -> tuple[float, float, float] | None:
        """(slope °C/s by least squares, time-weighted mean power, mean temperature), or None if too few samples."""
        n = len(self.times)
        if n < 3 or self.span_s <= 0:
            return None
        mt = sum(self.times) / n
        my = sum(self.temps) / n
        sxx = sum((t - mt) ** 2 for t in self.times)
        sxy = sum((t - mt) * (y - my) for t, y in zip(self.times, self.temps, strict=True))
        wsum = sum(self.weights)
        mean_p = (
            sum(p * w for p, w in zip(self.powers, self.weights, strict=True)) / wsum if wsum > 0 else sum(self.powers) / n
        )
        return (sxy / sxx, mean_p, my)


def zone_power_cap(
    fits: Mapping[str, RCFit],
    temps: Mapping[str, float],
    limits: Mapping[str, float],
    *,
    horizon_s: float,
    power_now_w: float | None,
    reactive_band_c: float,
    slopes: Mapping[str, float] | None = None,
    r_prior_c_per_w: float = ThermalPrior().r_c_per_w,
) -> tuple[float | None, str | None]:
    """The tightest power cap over zones, and the zone that sets it (None, None if unconstrained).

    A zone with a usable fit gets :meth:`RCFit.power_cap`. Otherwise, when its
    temperature extrapolated over the horizon (last window's slope) comes within
    ``reactive_band_c`` of the limit, the cap is the power now less ``1/r_prior`` W per
    degree over. In every case, a zone already within the band caps at :data:`REACTIVE_STEP`
    of the power now (the governor keeps stepping down until the zone stops rising).
    """
    best: float | None = None
    who: str | None = None
    for zone, limit in limits.items():
        temp = temps.get(zone)
        if temp is None:
            continue
        fit = fits.get(zone)
        cap: float | None = None
        if fit is not None and fit.usable:
            cap = fit.power_cap(temp, limit, horizon_s)
        elif power_now_w is not None:
            predicted = temp + max((slopes or {}).get(zone, 0.0), 0.0) * horizon_s
            over = predicted - (limit - reactive_band_c)
            if over > 0:
                cap = power_now_w - over / r_prior_c_per_w
        if temp >= limit - reactive_band_c and power_now_w is not None:
            reactive = power_now_w * REACTIVE_STEP
            cap = reactive if cap is None else min(cap, reactive)
        if cap is not None and (best is None or cap < best):
            best, who = cap, zone
    return best, who


class ThermalGuard:
    """The fits, windows and trip limits of every zone, and the mean-power cap they give now."""

    def __init__(self, config: GovernorConfig) -> None:
        self.config = config
        self.cap_w: float | None = None
        self.zone: str | None = None
        """The zone that sets the cap, if any."""
        self._fits: dict[str, RCFit] = {}
        self._windows: dict[str, ZoneWindow] = {}
        self._limits: dict[str, float] = {}
        self._slopes: dict[str, float] = {}
        self._temps: dict[str, float] = {}

    def observe(
        self, t: float, snap: Snapshot, power: float | None, dt: float, *, smooth_w: float | None, phase_s: float
    ) -> None:
        """Fit every zone of ``snap`` (taken at ``t``, ``dt`` after the last power sample) and update the cap.

        :param power: the board's power now (None: fits are not updated).
        :param smooth_w: the smoothed power (the cap's reactive part starts from it).
        :param phase_s: the expected length of the phase in progress (the horizon is at least that).
        """
        for name, zone in snap.zones.items():
            limit = self.zone_limit_c(zone.passive_trip_c, zone.critical_trip_c)
            if limit is None or zone.temp_c is None:
                continue
            self._limits[name] = limit
            if power is None:
                continue
            if name not in self._fits:
                self._fits[name] = RCFit.from_prior()
            self._fits[name] = self._fits[name].with_ambient_ceiling(zone.temp_c)
            win = self._windows.get(name, ZoneWindow()).add(t, zone.temp_c, power, dt)
            if win.span_s >= self.config.thermal_window_s:
                summary = win.summary()
                if summary is not None:
                    self._fits[name] = self._fits[name].update(*summary)
                    self._slopes[name] = summary[0]
                win = ZoneWindow()
            self._windows[name] = win
        self._update_cap(snap, smooth_w, phase_s)

    def zone_limit_c(self, passive_c: float | None, critical_c: float | None) -> float | None:
        """The temperature a zone is kept under: ``thermal_margin_c`` below its passive trip, at
        most ``critical_margin_c`` below its critical trip (the only limit of a zone with no
        passive trip); None for a zone with neither."""
        limits = []
        if passive_c is not None:
            limits.append(passive_c - self.config.thermal_margin_c)
        if critical_c is not None:
            limits.append(critical_c - self.config.critical_margin_c)
        return min(limits) if limits else None

    def _update_cap(self, snap: Snapshot, smooth_w: float | None, phase_s: float) -> None:
        temps = {n: z.temp_c for n, z in snap.zones.items() if z.temp_c is not None}
        self._temps.update(temps)
        horizon = max(self.config.thermal_horizon_s, phase_s)
        cap, zone = zone_power_cap(
            self._fits, temps, self._limits, horizon_s=horizon, power_now_w=smooth_w,
            reactive_band_c=_REACTIVE_BAND_C, slopes=self._slopes,
        )
        old = self.cap_w
        hot = any(temps.get(z, -math.inf) >= limit for z, limit in self._limits.items())
        if hot and old is not None and (cap is None or cap > old):
            cap = old  # a zone past its limit: the cap only falls until it cools (whatever power does)
        if cap is None or cap >= 1e6:
            # Far from every trip: release the cap only with hysteresis (see below).
            cap = math.inf
        if old is None:
            self.cap_w = None if math.isinf(cap) else cap
        elif cap < old:
            self.cap_w = cap
        elif cap > old * (1.0 + self.config.cap_hysteresis):
            self.cap_w = None if math.isinf(cap) else cap
        self.zone = zone if self.cap_w is not None else None

    def near_trip(self) -> bool:
        """A zone read (last) past half of ``thermal_margin_c`` over its limit: within half the
        margin of its passive trip, where nothing but the guard's cap of the moment may run."""
        half = 0.5 * self.config.thermal_margin_c
        return any(self._temps.get(z, -math.inf) > limit + half for z, limit in self._limits.items())

    def pressure(self, max_power_w: float) -> bool:
        """The cap is below the most the board has drawn (smoothed): the guard is holding it back."""
        return self.cap_w is not None and self.cap_w < max_power_w
