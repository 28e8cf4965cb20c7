"""What the governor knows about a phase: measurements and the model built from them.

Everything here is pure: plain data in, plain data out.

A :class:`PhaseModel` is what coordinate descent leaves behind: the phase measured at
a centre operating point, and along each domain's axis (that domain swept, the others
held at the centre). It predicts any operating point *separably*: the time (and the
power) at a point is the centre's plus, for each domain, the change its axis showed at
that domain's frequency. That is exact along the axes and a first-order approximation
off them, which is why the tuner re-centres and sweeps again, and why the chosen point
is measured once more before it is trusted.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .._errors import ProfileError
from ._points import OperatingPoint

__all__ = ["Choice", "Measurement", "PhaseModel", "choose"]

# Past this many combinations the joint search falls back to greedy descent.
_MAX_PRODUCT = 250_000


@dataclass(frozen=True)
class Measurement:
    """One unit of work (one occurrence of a phase) measured at some operating point."""

    seconds: float
    """Wall time per unit of work."""
    power_w: float
    """Mean total (sum of rails / board input) power while it ran."""

    @property
    def energy_j(self) -> float:
        return self.seconds * self.power_w

    @staticmethod
    def combine(samples: Sequence[Measurement]) -> Measurement:
        """Mean time, energy-weighted mean power of several runs of the same point.

        :raises ValueError: ``samples`` is empty.
        """
        if not samples:
            raise ValueError("no measurements to combine")
        t = sum(m.seconds for m in samples)
        e = sum(m.energy_j for m in samples)
        return Measurement(seconds=t / len(samples), power_w=e / t if t > 0 else 0.0)

    def to_json(self) -> list[float]:
        return [self.seconds, self.power_w]

    @staticmethod
    def from_json(obj: object) -> Measurement:
        if (
            not isinstance(obj, list)
            or len(obj) != 2
            or not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in obj)
        ):
            raise ProfileError(f"a measurement must be [seconds, watts] (finite, >= 0), got {obj!r}")
        return Measurement(float(obj[0]), float(obj[1]))


def _interp(table: Mapping[int, float], hz: int) -> float:
    """Piecewise-linear in frequency between measured points, clamped at the ends."""
    keys = sorted(table)
    if hz <= keys[0]:
        return table[keys[0]]
    if hz >= keys[-1]:
        return table[keys[-1]]
    for lo, hi in itertools.pairwise(keys):
        if lo <= hz <= hi:
            w = (hz - lo) / (hi - lo)
            return table[lo] * (1 - w) + table[hi] * w
    return table[keys[-1]]  # unreachable: keys are sorted and hz is inside


@dataclass(frozen=True)
class PhaseModel:
    """Separable time/power model of one phase (see the module docstring)."""

    center: OperatingPoint
    at_center: Measurement
    axes: Mapping[str, Mapping[int, Measurement]] = field(default_factory=lambda: MappingProxyType({}))
    """domain -> {frequency: measurement with the other domains at the centre}."""
    reference_s: float | None = None
    """Seconds per unit at the performance point (all domains at max): the slowdown reference."""
    best: OperatingPoint | None = None
    """The point tuning settled on (within the slowdown bound, least energy per unit)."""
    best_measured: Measurement | None = None
    unit: str = "phase"
    """What one unit of work is: ``"phase"`` (one occurrence of the phase) or ``"loop"`` (the
    phase and every working phase until it starts again, with the energy of any IDLE between:
    used when the phase sets slow domains for the whole loop, see ``DecisionInput.held``)."""

    def options(self, domain: str) -> tuple[int, ...]:
        """Frequencies this model can speak for on ``domain`` (ascending)."""
        axis = self.axes.get(domain)
        if axis:
            return tuple(sorted(axis))
        hz = self.center.get(domain)
        return () if hz is None else (hz,)

    def deltas(self, domain: str, hz: int) -> tuple[float, float]:
        """(seconds, watts) change from the centre when only ``domain`` moves to ``hz``."""
        axis = self.axes.get(domain)
        if not axis:
            return (0.0, 0.0)
        t = _interp({f: m.seconds for f, m in axis.items()}, hz) - self.at_center.seconds
        p = _interp({f: m.power_w for f, m in axis.items()}, hz) - self.at_center.power_w
        return (t, p)

    def predict(self, point: OperatingPoint) -> Measurement:
        """Predicted time and power per unit at ``point`` (domains the point lacks stay at the centre)."""
        t = self.at_center.seconds
        p = self.at_center.power_w
        for name, hz in point.items():
            if name in self.center:
                dt, dp = self.deltas(name, hz)
                t += dt
                p += dp
        return Measurement(max(t, 1e-12), max(p, 0.0))

    @property
    def slowdown_reference_s(self) -> float:
        """The reference time: the performance point's if known, else the fastest seen."""
        if self.reference_s is not None:
            return self.reference_s
        seen = [self.at_center.seconds] + [m.seconds for axis in self.axes.values() for m in axis.values()]
        return min(seen)

    # -- JSON -------------------------------------------------------------------

    def to_json(self) -> dict[str, object]:
        return {
            "center": self.center.as_dict(),
            "at_center": self.at_center.to_json(),
            "axes": {d: {str(f): m.to_json() for f, m in sorted(a.items())} for d, a in sorted(self.axes.items())},
            "reference_s": self.reference_s,
            "best": None if self.best is None else self.best.as_dict(),
            "best_measured": None if self.best_measured is None else self.best_measured.to_json(),
            "unit": self.unit,
        }

    @staticmethod
    def from_json(obj: object, where: str = "phase model") -> PhaseModel:
        """:raises ProfileError: any field missing or of the wrong type (the message says which)."""
        if not isinstance(obj, dict):
            raise ProfileError(f"{where}: expected an object, got {type(obj).__name__}")
        try:
            center = _point_from_json(obj["center"], f"{where}.center")
            at_center = Measurement.from_json(obj["at_center"])
            raw_axes = obj["axes"]
            if not isinstance(raw_axes, dict):
                raise ProfileError(f"{where}.axes: expected an object")
            axes: dict[str, Mapping[int, Measurement]] = {}
            for dom, table in raw_axes.items():
                if not isinstance(table, dict) or not table:
                    raise ProfileError(f"{where}.axes.{dom}: expected a non-empty object")
                axes[dom] = MappingProxyType({int(f): Measurement.from_json(m) for f, m in table.items()})
            ref = obj.get("reference_s")
            if ref is not None and not (isinstance(ref, int | float) and ref > 0):
                raise ProfileError(f"{where}.reference_s: expected a positive number or null, got {ref!r}")
            best_raw = obj.get("best")
            best = None if best_raw is None else _point_from_json(best_raw, f"{where}.best")
            bm_raw = obj.get("best_measured")
            bm = None if bm_raw is None else Measurement.from_json(bm_raw)
            unit = obj.get("unit", "phase")
            if unit not in ("phase", "loop"):
                raise ProfileError(f"{where}.unit: expected 'phase' or 'loop', got {unit!r}")
        except KeyError as exc:
            raise ProfileError(f"{where}: missing field {exc.args[0]!r}") from exc
        except ValueError as exc:
            if isinstance(exc, ProfileError):
                raise
            raise ProfileError(f"{where}: {exc}") from exc
        return PhaseModel(
            center, at_center, MappingProxyType(axes), None if ref is None else float(ref), best, bm, unit
        )


def _point_from_json(obj: object, where: str) -> OperatingPoint:
    if not isinstance(obj, dict) or not all(isinstance(v, int) and v > 0 for v in obj.values()):
        raise ProfileError(f"{where}: expected {{domain: Hz}} with positive integers, got {obj!r}")
    return OperatingPoint.of(obj)


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`."""

    point: OperatingPoint
    predicted: Measurement
    within_slowdown: bool
    within_power: bool


def _pareto(opts: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """Drop options that are both slower and hungrier than another (ties keep the faster clock)."""
    kept = []
    for hz, dt, dp in opts:
        dominated = any(
            (dt2 <= dt and dp2 <= dp) and (dt2 < dt or dp2 < dp or hz2 > hz) for hz2, dt2, dp2 in opts if hz2 != hz
        )
        if not dominated:
            kept.append((hz, dt, dp))
    return kept or opts[:1]


def choose(
    model: PhaseModel,
    *,
    slowdown: float,
    power_cap_w: float | None = None,
    fixed: Mapping[str, int] | None = None,
    power_bias_w: float = 0.0,
) -> Choice:
    """The operating point with the least predicted energy per unit, jointly over domains.

    Constraints, in order of precedence: predicted power (plus ``power_bias_w``, what
    the model has been seen to under-predict) below ``power_cap_w``; predicted time
    within ``(1 + slowdown)`` of the reference. If nothing meets the time bound within
    the cap, the fastest point within the cap; if nothing meets the cap, the least power.
    Domains in ``fixed`` stay at the given frequency (locked, or not worth switching).
    """
    fixed = dict(fixed or {})
    t0 = model.at_center.seconds
    p0 = model.at_center.power_w
    base_t, base_p = t0, p0
    free: list[str] = []
    options: list[list[tuple[int, float, float]]] = []
    chosen_fixed: dict[str, int] = {}
    for dom, center_hz in model.center.items():
        if dom in fixed:
            dt, dp = model.deltas(dom, fixed[dom])
            base_t += dt
            base_p += dp
            chosen_fixed[dom] = fixed[dom]
            continue
        opts = [(hz, *model.deltas(dom, hz)) for hz in model.options(dom)] or [(center_hz, 0.0, 0.0)]
        free.append(dom)
        options.append(_pareto(opts))
    bound = model.slowdown_reference_s * (1.0 + slowdown)
    cap = math.inf if power_cap_w is None else power_cap_w - power_bias_w

    size = math.prod(len(o) for o in options) if options else 1
    if size <= _MAX_PRODUCT:
        idx = _search_product(options, base_t, base_p, bound, cap)
    else:
        idx = _search_greedy(options, base_t, base_p, bound, cap)
    freqs = dict(chosen_fixed)
    t, p = base_t, base_p
    for dom, opts, i in zip(free, options, idx, strict=True):
        hz, dt, dp = opts[i]
        freqs[dom] = hz
        t += dt
        p += dp
    pred = Measurement(max(t, 1e-12), max(p, 0.0))
    return Choice(OperatingPoint.of(freqs), pred, pred.seconds <= bound * (1 + 1e-9), pred.power_w <= cap)


def _search_product(
    options: list[list[tuple[int, float, float]]], base_t: float, base_p: float, bound: float, cap: float
) -> list[int]:
    if not options:
        return []
    grids = np.meshgrid(*[np.arange(len(o)) for o in options], indexing="ij")
    flat = [g.ravel() for g in grids]
    t = np.full(flat[0].shape, base_t)
    p = np.full(flat[0].shape, base_p)
    for opts, ix in zip(options, flat, strict=True):
        t = t + np.array([o[1] for o in opts])[ix]
        p = p + np.array([o[2] for o in opts])[ix]
    t = np.maximum(t, 1e-12)
    p = np.maximum(p, 0.0)
    power_ok = p <= cap
    both = power_ok & (t <= bound * (1 + 1e-9))
    if both.any():
        # Least energy; among (near-)equal energies the faster one.
        score = np.where(both, t * p * (1 + 1e-9) + t * 1e-12, np.inf)
        k = int(np.argmin(score))
    elif power_ok.any():
        k = int(np.argmin(np.where(power_ok, t, np.inf)))
    else:
        k = int(np.argmin(p))
    return [int(ix[k]) for ix in flat]


def _search_greedy(
    options: list[list[tuple[int, float, float]]], base_t: float, base_p: float, bound: float, cap: float
) -> list[int]:
    """Start from each domain's fastest option; step down whichever saves most energy per second lost."""

    def fastest(o: list[tuple[int, float, float]]) -> int:
        return min(range(len(o)), key=lambda i: (o[i][1], -o[i][0]))

    idx = [fastest(o) for o in options]

    def totals(ix: list[int]) -> tuple[float, float]:
        return (base_t + sum(o[i][1] for o, i in zip(options, ix, strict=True)),
                base_p + sum(o[i][2] for o, i in zip(options, ix, strict=True)))

    while True:
        t, p = totals(idx)
        best: tuple[float, list[int]] | None = None
        for d, opts in enumerate(options):
            for i in range(len(opts)):
                if i == idx[d]:
                    continue
                trial = list(idx)
                trial[d] = i
                t2, p2 = totals(trial)
                if p > cap:
                    gain = (p - p2) / max(t2 - t, 1e-9) if p2 < p else -math.inf
                elif t2 <= bound and p2 <= cap:
                    gain = t * p - t2 * p2
                else:
                    continue
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, trial)
        if best is None:
            return idx
        idx = best[1]
