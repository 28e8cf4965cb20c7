"""What the governor knows about a phase: measurements and the model built from them.

Everything here is pure: plain data in, plain data out.

A :class:`PhaseModel` is what coordinate descent leaves behind: the phase measured at a
centre operating point, and along each domain's axis (that domain swept, the others held
at the centre). Along the axes it is exact; off them it combines the axes with two
cross terms, because one domain's clock changes how long the others are busy:

* time: the axes' slowdowns add when the domains' work is serial and only the largest
  counts when it overlaps (a memory-bound phase does not slow down further when its GPU
  is lowered until the GPU becomes the bottleneck). The predicted time is the centre's
  plus the speed-ups, plus ``coupling`` x the sum of the slowdowns and
  ``1 - coupling`` x the largest one;
* power: a domain's dynamic *energy* per unit of work depends on its own clock, and is
  spread over however long the phase lasts, while static power and leakage depend on the
  clocks alone. The prediction is ``energy_share`` x (the axes' energy changes added,
  time changes beyond them at the centre's power, over the predicted time) plus
  ``1 - energy_share`` x (the axes' power changes added).

Both shares are fitted (:func:`fit_coupling`) on the measured points off the axes
(earlier passes' sweeps, the verified choices); without any, the model is separable in
time and power. The chosen point is measured once more before it is trusted.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

import numpy as np

from .._errors import ProfileError
from ._points import OperatingPoint

__all__ = ["Choice", "Measurement", "Objective", "PhaseModel", "choose", "fit_coupling"]

# Past this many combinations the joint search falls back to greedy descent.
_MAX_PRODUCT = 250_000
# Under a time objective, points this close to the fastest feasible one count as equally
# fast (run-to-run noise is of this order) and the least energy among them wins: a clock
# that buys no time is not worth its watts.
TIME_TIE = 0.005
_GRID = tuple(i / 20 for i in range(21))

Objective = Literal["energy", "time", "price"]


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


def _combine_arrays(
    t0: float, p0: float, dts: Sequence[np.ndarray], dps: Sequence[np.ndarray], coupling: float, energy_share: float,
    conservative: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised prediction from per-domain (dt, dp) deltas (see the module docstring)."""
    zero = np.zeros_like(dts[0]) if dts else np.zeros(1)
    neg = sum((np.minimum(d, 0.0) for d in dts), zero)
    pos_sum = sum((np.maximum(d, 0.0) for d in dts), zero)
    pos_max = np.maximum.reduce([np.maximum(d, 0.0) for d in dts]) if dts else zero
    t = np.maximum(t0 + neg + coupling * pos_sum + (1.0 - coupling) * pos_max, 1e-12)
    p_sep = p0 + sum(dps, zero)
    e0 = t0 * p0
    # Each axis's energy change, less what its time change cost at the centre's power ...
    de = sum(((t0 + dt) * (p0 + dp) - e0 - p0 * dt for dt, dp in zip(dts, dps, strict=True)), zero)
    # ... plus the centre's power over the predicted change of time.
    p_en = (e0 + de + p0 * (t - t0)) / t
    p = np.maximum(p_sep, p_en) if conservative else (1.0 - energy_share) * p_sep + energy_share * p_en
    return t, np.maximum(p, 0.0)


@dataclass(frozen=True)
class PhaseModel:
    """Time/power model of one phase from coordinate-descent axes (see the module docstring)."""

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
    coupling: float = 1.0
    """Share of the axes' slowdowns that add up (1: serial work; 0: only the largest counts)."""
    energy_share: float = 0.0
    """Share of the power that follows energy spread over time rather than the clocks alone."""

    def measured_points(self) -> list[tuple[OperatingPoint, Measurement]]:
        """The centre and every axis point, with what was measured there."""
        out = [(self.center, self.at_center)]
        out += [(self.center.with_(d, hz), m) for d, axis in self.axes.items() for hz, m in axis.items()
                if d in self.center]
        return out

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

    def predict(self, point: OperatingPoint, *, conservative: bool = False) -> Measurement:
        """Predicted time and power per unit at ``point`` (domains the point lacks stay at the centre).

        ``conservative``: the higher of the two power models (for a point about to run
        under a power cap before the shares are known).
        """
        dts: list[np.ndarray] = []
        dps: list[np.ndarray] = []
        for name, hz in point.items():
            if name in self.center:
                dt, dp = self.deltas(name, hz)
                dts.append(np.array([dt]))
                dps.append(np.array([dp]))
        t, p = _combine_arrays(self.at_center.seconds, self.at_center.power_w, dts, dps, self.coupling,
                               self.energy_share, conservative)
        return Measurement(float(t[0]), float(p[0]))

    def anchored(self) -> PhaseModel:
        """This model re-centred on its measured best point (itself if there is none).

        Predictions near the point tuning settled on then start from what was measured
        there, not from the axes' centre (which may be far, across cross terms the axes do
        not show); the axes are shifted to pass through it (a separable move).
        """
        if self.best is None or self.best_measured is None:
            return self
        at = self.best_measured
        centre = OperatingPoint.of({d: self.best.get(d) or hz for d, hz in self.center.items()})
        axes: dict[str, Mapping[int, Measurement]] = {}
        for d, axis in self.axes.items():
            t0 = _interp({f: m.seconds for f, m in axis.items()}, centre[d])
            p0 = _interp({f: m.power_w for f, m in axis.items()}, centre[d])
            shifted = {f: Measurement(max(at.seconds + m.seconds - t0, 1e-12), max(at.power_w + m.power_w - p0, 0.0))
                       for f, m in axis.items()}
            shifted[centre[d]] = at
            axes[d] = MappingProxyType(shifted)
        return replace(self, center=centre, at_center=at, axes=MappingProxyType(axes))

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
            "coupling": self.coupling,
            "energy_share": self.energy_share,
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
            # Profiles written before the cross terms existed are separable (the defaults).
            shares = {k: obj.get(k, d) for k, d in (("coupling", 1.0), ("energy_share", 0.0))}
            for k, v in shares.items():
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                    raise ProfileError(f"{where}.{k}: expected a number in [0, 1], got {v!r}")
        except KeyError as exc:
            raise ProfileError(f"{where}: missing field {exc.args[0]!r}") from exc
        except ValueError as exc:
            if isinstance(exc, ProfileError):
                raise
            raise ProfileError(f"{where}: {exc}") from exc
        return PhaseModel(
            center, at_center, MappingProxyType(axes), None if ref is None else float(ref), best, bm, unit,
            float(shares["coupling"]), float(shares["energy_share"]),
        )


def _point_from_json(obj: object, where: str) -> OperatingPoint:
    if not isinstance(obj, dict) or not all(isinstance(v, int) and v > 0 for v in obj.values()):
        raise ProfileError(f"{where}: expected {{domain: Hz}} with positive integers, got {obj!r}")
    return OperatingPoint.of(obj)


def _off_axis(model: PhaseModel, point: OperatingPoint) -> bool:
    moved = sum(1 for d, hz in point.items() if d in model.center and model.center[d] != hz)
    return moved >= 2


def fit_coupling(model: PhaseModel, measured: Sequence[tuple[OperatingPoint, Measurement]]) -> PhaseModel:
    """``model`` with ``coupling`` and ``energy_share`` fitted to the points off its axes.

    Least squares on relative error over a grid of both shares (time first, then power at
    the fitted time), so a handful of points suffices; points on an axis (fitted exactly by
    any share) and the centre are skipped. Without off-axis points ``model`` is returned.
    """
    pts = [(p, m) for p, m in measured if _off_axis(model, p) and m.seconds > 0 and m.power_w > 0]
    if not pts:
        return model
    doms = [d for d in model.center if d in model.axes]
    dts = [np.array([model.deltas(d, p.get(d) or model.center[d])[0] for p, _ in pts]) for d in doms]
    dps = [np.array([model.deltas(d, p.get(d) or model.center[d])[1] for p, _ in pts]) for d in doms]
    ts = np.array([m.seconds for _, m in pts])
    ps = np.array([m.power_w for _, m in pts])
    t0, p0 = model.at_center.seconds, model.at_center.power_w

    def err_t(c: float) -> float:
        t, _ = _combine_arrays(t0, p0, dts, dps, c, 0.0)
        return float(np.sum(((t - ts) / ts) ** 2))

    # Ties go to the higher share: the serial sum predicts more time (the safe side).
    coupling = min(reversed(_GRID), key=lambda c: err_t(c) - 1e-15 * c)

    def err_p(s: float) -> float:
        _, p = _combine_arrays(t0, p0, dts, dps, coupling, s)
        return float(np.sum(((p - ps) / ps) ** 2))

    share = min(_GRID, key=err_p)
    return replace(model, coupling=coupling, energy_share=share)


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`."""

    point: OperatingPoint
    predicted: Measurement
    within_slowdown: bool
    within_power: bool


def _pareto(opts: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """Drop options that are both slower and hungrier than another (ties keep the faster clock).

    With the cross terms this is a heuristic for the power cap (a slower option lowers
    the others' utilisation), but an option slower *and* hungrier on its own axis is
    not one a cap needs in practice, and pruning keeps the joint search exhaustive.
    """
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
    objective: Objective = "energy",
    conservative: bool = False,
    price_j_per_s: float = 0.0,
) -> Choice:
    """The best operating point by the model's prediction, jointly over domains.

    ``objective="energy"``: the least energy per unit with predicted time within
    ``(1 + slowdown)`` of the reference; if nothing meets the time bound within the cap,
    the fastest point within the cap. ``objective="time"`` (a power budget to fill): the
    fastest point within the cap (points within :data:`TIME_TIE` of it count as equally
    fast: the least energy among them), ``slowdown`` unused. ``objective="price"``: the least
    ``energy + price_j_per_s x time`` (a second of the loop priced in joules, see
    :func:`~hetsched._governor._loop.allocate_loop`), ``slowdown`` unused. Either way predicted power
    (plus ``power_bias_w``, what the model has been seen to under-predict) must stay
    below ``power_cap_w``; if nothing does, the least power. Domains in ``fixed`` stay
    at the given frequency (locked, or not worth switching). ``conservative``: judge
    power by the higher of the two power models (see :meth:`PhaseModel.predict`).
    """
    fixed = dict(fixed or {})
    names: list[str] = []
    options: list[list[tuple[int, float, float]]] = []
    for dom, center_hz in model.center.items():
        if dom in fixed:
            names.append(dom)
            options.append([(fixed[dom], *model.deltas(dom, fixed[dom]))])
            continue
        opts = [(hz, *model.deltas(dom, hz)) for hz in model.options(dom)] or [(center_hz, 0.0, 0.0)]
        names.append(dom)
        options.append(_pareto(opts))
    bound = model.slowdown_reference_s * (1.0 + slowdown)
    cap = math.inf if power_cap_w is None else power_cap_w - power_bias_w

    def evaluate(idx: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        dts = [np.array([o[1] for o in opts])[ix] for opts, ix in zip(options, idx, strict=True)]
        dps = [np.array([o[2] for o in opts])[ix] for opts, ix in zip(options, idx, strict=True)]
        return _combine_arrays(model.at_center.seconds, model.at_center.power_w, dts, dps,
                               model.coupling, model.energy_share, conservative)

    size = math.prod(len(o) for o in options) if options else 1
    if not options:
        idx: list[int] = []
    elif size <= _MAX_PRODUCT:
        idx = _search_product(options, evaluate, bound, cap, objective, price_j_per_s)
    else:
        idx = _search_greedy(options, evaluate, bound, cap, objective, price_j_per_s)
    freqs = {dom: opts[i][0] for dom, opts, i in zip(names, options, idx, strict=True)}
    if idx:
        t_arr, p_arr = evaluate([np.array([i]) for i in idx])
        pred = Measurement(float(t_arr[0]), float(p_arr[0]))
    else:
        pred = model.at_center
    within_t = objective != "energy" or pred.seconds <= bound * (1 + 1e-9)
    return Choice(OperatingPoint.of(freqs), pred, within_t, pred.power_w <= cap)


def _pick(t: np.ndarray, p: np.ndarray, bound: float, cap: float, objective: Objective, price: float = 0.0) -> int:
    power_ok = p <= cap
    if not power_ok.any():
        return int(np.argmin(p))
    if objective == "price":
        return int(np.argmin(np.where(power_ok, t * p + price * t, np.inf)))
    if objective == "time":
        fastest = float(np.min(np.where(power_ok, t, np.inf)))
        near = power_ok & (t <= fastest * (1 + TIME_TIE))
        return int(np.argmin(np.where(near, t * p * (1 + 1e-9) + t * 1e-12, np.inf)))
    both = power_ok & (t <= bound * (1 + 1e-9))
    if both.any():
        # Least energy; among (near-)equal energies the faster one.
        return int(np.argmin(np.where(both, t * p * (1 + 1e-9) + t * 1e-12, np.inf)))
    return int(np.argmin(np.where(power_ok, t, np.inf)))


def _search_product(
    options: list[list[tuple[int, float, float]]],
    evaluate: Callable[[Sequence[np.ndarray]], tuple[np.ndarray, np.ndarray]],
    bound: float, cap: float, objective: Objective, price: float = 0.0,
) -> list[int]:
    grids = np.meshgrid(*[np.arange(len(o)) for o in options], indexing="ij")
    flat = [g.ravel() for g in grids]
    t, p = evaluate(flat)
    k = _pick(t, p, bound, cap, objective, price)
    return [int(ix[k]) for ix in flat]


def _search_greedy(
    options: list[list[tuple[int, float, float]]],
    evaluate: Callable[[Sequence[np.ndarray]], tuple[np.ndarray, np.ndarray]],
    bound: float, cap: float, objective: Objective, price: float = 0.0,
) -> list[int]:
    """Coordinate descent from each domain's fastest option: move one domain at a time to
    whichever of its options the objective prefers with the others where they are, until
    no single move improves."""
    idx = [min(range(len(o)), key=lambda i, o=o: (o[i][1], -o[i][0])) for o in options]  # type: ignore[misc]
    for _ in range(50):
        moved = False
        for d, opts in enumerate(options):
            trial = [np.full(len(opts), i) for i in idx]
            trial[d] = np.arange(len(opts))
            t, p = evaluate(trial)
            k = _pick(t, p, bound, cap, objective, price)
            if k != idx[d]:
                idx[d] = k
                moved = True
        if not moved:
            break
    return idx
