"""Auto-tune of one phase: coordinate descent over domains, as a pure state machine.

The tuner never measures anything itself. Its driver (the governor while a program
runs, or a benchmark on the simulation) asks :meth:`AxisTuner.propose` for the next
operating point, runs one unit of the phase's work there, and hands back what it
measured with :meth:`AxisTuner.record`. So the same tuner runs unchanged against a
board, the live twin, the fast simulation or a table in a test.

Each pass measures the centre point, then sweeps every domain along its own axis with
the others held at the centre (a coarse grid first, then a finer one around what the
previous pass chose): ``sum(levels)`` measurements instead of their product. From the
axes the separable :class:`~hetsched._governor._model.PhaseModel` picks the least
energy per unit within the slowdown bound and the power cap, jointly over domains;
that becomes the next centre. Finally the chosen point itself is measured; if it is
slower than the bound (the separable model was optimistic), the bound is tightened by
the overshoot and the choice is made again.

The board warms while it is tuned (leakage, hence power, grows with temperature), so a
sweep measured in order would make the points measured later look dearer. The centre is
measured again after each axis, and each axis point is taken relative to the centre
interpolated to when it ran (drift removed); the final comparison of measured points
uses the same correction against the last pass's centre.

Under a power cap the first centre is the lowest point and axes are swept upwards,
stopping before a step whose power, extrapolated from the last two, would break the
cap; so tuning itself respects the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from .._errors import GovernorError
from ._model import Measurement, PhaseModel, _interp, choose
from ._points import DomainSpec, OperatingPoint

__all__ = ["AxisTuner", "TunerStatistics"]


@dataclass(frozen=True)
class TunerStatistics:
    measurements: int
    points: int
    passes_done: int
    done: bool


def _grid(n: int, levels: int) -> list[int]:
    if n <= levels:
        return list(range(n))
    return sorted({round(i * (n - 1) / (levels - 1)) for i in range(levels)})


class AxisTuner:
    """Coordinate-descent auto-tune of one phase over the domains in ``tune``.

    :raises GovernorError: ``tune`` is empty or names an unknown domain.
    """

    def __init__(
        self,
        domains: Mapping[str, DomainSpec],
        tune: Sequence[str],
        *,
        slowdown: float,
        power_cap_w: float | None = None,
        levels: int = 6,
        passes: int = 2,
        repeats: int = 2,
    ) -> None:
        if not tune:
            raise GovernorError("auto-tune needs at least one domain to sweep")
        unknown = [d for d in tune if d not in domains]
        if unknown:
            raise GovernorError(f"auto-tune: unknown domains {unknown}; known: {sorted(domains)}")
        self._specs = {d: domains[d] for d in tune}
        self._order = list(tune)
        self._slowdown = slowdown
        self._effective_slowdown = slowdown
        self._cap = power_cap_w
        self._levels = levels
        self._passes = passes
        self._repeats = repeats
        self._pass = 0
        self._samples: dict[OperatingPoint, list[Measurement]] = {}
        self._seq_of: dict[OperatingPoint, list[int]] = {}
        """When (in measurement order) each sample of each point was taken."""
        self._measurements = 0
        self._reference: float | None = None
        self._prev_axes: dict[str, dict[int, Measurement]] = {}
        self._prev_center: OperatingPoint | None = None
        self._grids: dict[str, list[int]] = {}
        self._verify_tries = 0
        self._done = False
        self._chosen: OperatingPoint | None = None
        self._model: PhaseModel | None = None
        if power_cap_w is None:
            start = OperatingPoint.of({d: s.max_hz for d, s in self._specs.items()})
        else:
            start = OperatingPoint.of({d: s.min_hz for d, s in self._specs.items()})
        self._begin_pass(start, {d: list(range(len(s.available_hz))) for d, s in self._specs.items()})

    # -- plan -----------------------------------------------------------------

    def _begin_pass(self, center: OperatingPoint, span: Mapping[str, list[int]]) -> None:
        self._center = center
        self._pass_start = self._measurements
        self._axes: dict[str, dict[int, Measurement]] = {d: {} for d in self._order}
        self._stage = "center"
        self._pending: list[tuple[str, list[int], list[int], list[bool]]] = []
        for d in self._order:
            spec = self._specs[d]
            c_idx = spec.index(center[d])
            idxs = span[d]
            grid = [idxs[i] for i in _grid(len(idxs), self._levels)]
            self._grids[d] = grid
            up = [spec.available_hz[i] for i in grid if i > c_idx]
            if self._cap is not None and c_idx + 1 < len(spec.available_hz) and (c_idx + 1) in idxs:
                # Under a cap the first step up is the smallest the table has, so the
                # power slope is known (and the overshoot risk tiny) before bigger steps.
                first = spec.available_hz[c_idx + 1]
                up = [first] + [hz for hz in up if hz != first]
            down = [spec.available_hz[i] for i in reversed(grid) if i < c_idx]
            self._pending.append((d, up, down, [False]))
        self._current: OperatingPoint | None = center

    def propose(self) -> OperatingPoint | None:
        """The next point to run one unit of work at, or None when tuning is done."""
        if self._done:
            return None
        if self._current is not None and len(self._samples.get(self._current, ())) < self._repeats:
            return self._current
        self._current = self._next_point()
        return self._current

    def _next_point(self) -> OperatingPoint | None:
        if self._stage == "verify":
            return self._after_verify()
        while self._pending:
            d, up, down, rechecked = self._pending[0]
            while up:
                hz = up[0]
                if self._cap is not None and self._extrapolated_power(d, hz) > self._cap:
                    up.clear()
                    break
                up.pop(0)
                return self._center.with_(d, hz)
            if down:
                return self._center.with_(d, down.pop(0))
            if not rechecked[0] and self._axes[d]:
                rechecked[0] = True
                return self._center  # the centre again: how far the board drifted meanwhile
            self._pending.pop(0)
        return self._end_pass()

    def _extrapolated_power(self, d: str, hz: int) -> float:
        axis = dict(self._axes[d])
        if self._samples.get(self._center):
            at_center = Measurement.combine(self._samples[self._center])
            axis[self._center[d]] = at_center
            prev = self._prev_axes.get(d)
            if prev:
                # The earlier, wider sweep re-based on this centre fills in below.
                pp = _interp({f: m.power_w for f, m in prev.items()}, self._center[d])
                for f, m in prev.items():
                    axis.setdefault(f, Measurement(m.seconds, at_center.power_w + m.power_w - pp))
        if any(f >= hz for f in axis):
            return _interp({f: m.power_w for f, m in axis.items()}, hz)
        pts = sorted(f for f in axis if f < hz)[-2:]
        if len(pts) < 2:
            return axis[pts[-1]].power_w if pts else 0.0
        (f1, f2) = pts
        p1, p2 = axis[f1].power_w, axis[f2].power_w
        slope = max((p2 - p1) / (f2 - f1), 0.0)
        # Power grows faster than linearly above the voltage knee: be generous with the slope.
        return p2 + 1.5 * slope * (hz - f2)

    def _end_pass(self) -> OperatingPoint | None:
        model = self._build_model()
        self._pass += 1
        ch = choose(model, slowdown=self._effective_slowdown, power_cap_w=self._cap)
        self._prev_axes = {d: dict(a) for d, a in model.axes.items()}
        self._prev_center = model.center
        if self._pass < self._passes and ch.point != self._center:
            span: dict[str, list[int]] = {}
            for d in self._order:
                spec = self._specs[d]
                i = spec.index(ch.point[d])
                grid = self._grids[d]
                lo = max([g for g in grid if g < i], default=i)
                hi = min([g for g in grid if g > i], default=i)
                span[d] = list(range(lo, hi + 1))
            self._begin_pass(ch.point, span)
            return self._center
        self._model = model
        self._chosen = ch.point
        self._stage = "verify"
        return ch.point

    def _after_verify(self) -> OperatingPoint | None:
        assert self._model is not None and self._chosen is not None
        m = Measurement.combine(self._samples[self._chosen])
        ref = self._model.slowdown_reference_s
        over = m.seconds / (ref * (1 + self._slowdown))
        cap_broken = self._cap is not None and m.power_w > self._cap
        if (over > 1.0 or cap_broken) and self._verify_tries < 3:
            self._verify_tries += 1
            if over > 1.0:
                self._effective_slowdown = max(0.0, self._effective_slowdown - (over - 1.0) * (1 + self._slowdown) - 0.005)
            bias = max(0.0, m.power_w - self._model.predict(self._chosen).power_w) if cap_broken else 0.0
            ch = choose(self._model, slowdown=self._effective_slowdown, power_cap_w=self._cap, power_bias_w=bias)
            if ch.point != self._chosen:
                self._chosen = ch.point
                return ch.point
        # Whatever the model predicted, keep the best point actually *measured* within
        # the bounds (centres, axis points and verified choices all count).
        best, best_m = self._best_measured(ref)
        if best is None:
            best, best_m = self._chosen, m
        self._model = PhaseModel(
            center=self._model.center,
            at_center=self._model.at_center,
            axes=self._model.axes,
            reference_s=self._model.reference_s,
            best=best,
            best_measured=best_m,
        )
        self._done = True
        return None

    def _centre_at(self, seq: float, since: int) -> Measurement | None:
        """The centre's measurement interpolated to measurement ``seq`` (clamped at the ends)."""
        log = [(q, m) for q, m in zip(self._seq_of.get(self._center, ()), self._samples.get(self._center, ()), strict=True)
               if q >= since]
        if not log:
            return None
        if seq <= log[0][0]:
            return log[0][1]
        for (q0, m0), (q1, m1) in zip(log, log[1:], strict=False):
            if q0 <= seq <= q1:
                w = (seq - q0) / (q1 - q0) if q1 > q0 else 0.0
                return Measurement(m0.seconds + w * (m1.seconds - m0.seconds), m0.power_w + w * (m1.power_w - m0.power_w))
        return log[-1][1]

    def _corrected(self, point: OperatingPoint, at_center: Measurement, since: int) -> Measurement | None:
        """``point``'s samples since ``since``, as ``at_center`` plus their difference from the
        centre at the time each ran (None if it has none, or the centre none, since then)."""
        pairs = [(q, m) for q, m in zip(self._seq_of.get(point, ()), self._samples.get(point, ()), strict=True) if q >= since]
        if not pairs:
            return None
        dt = dp = 0.0
        for q, m in pairs:
            c = self._centre_at(q, since)
            if c is None:
                return None
            dt += m.seconds - c.seconds
            dp += m.power_w - c.power_w
        n = len(pairs)
        return Measurement(max(at_center.seconds + dt / n, 1e-12), max(at_center.power_w + dp / n, 0.0))

    def _best_measured(self, ref: float) -> tuple[OperatingPoint | None, Measurement | None]:
        bound = ref * (1 + self._slowdown)
        # Points measured since the last pass began, drift-corrected against its centre, so a
        # point measured on a cooler board does not win by that alone.
        centre_now = self._samples.get(self._center)
        measured: list[tuple[OperatingPoint, Measurement]] = []
        if centre_now:
            at_center = Measurement.combine(centre_now)
            for p in self._samples:
                m = at_center if p == self._center else self._corrected(p, at_center, self._pass_start)
                if m is not None:
                    measured.append((p, m))
        if not measured:
            measured = [(p, Measurement.combine(ms)) for p, ms in self._samples.items() if ms]
        in_cap = [(p, m) for p, m in measured if self._cap is None or m.power_w <= self._cap]
        ok = [(p, m) for p, m in in_cap if m.seconds <= bound]
        if ok:
            return min(ok, key=lambda pm: (pm[1].energy_j, pm[1].seconds))
        if in_cap:
            return min(in_cap, key=lambda pm: pm[1].seconds)
        return None, None

    def _build_model(self) -> PhaseModel:
        at_center = Measurement.combine(self._samples[self._center])
        if self._pass == 0 and self._cap is None:
            # The fastest run at the top clocks: a run slowed by something else (a clock
            # still settling from the point before) must not loosen the bound.
            self._reference = min(m.seconds for m in self._samples[self._center])
        axes: dict[str, Mapping[int, Measurement]] = {}
        for d in self._order:
            axis = {
                hz: self._corrected(self._center.with_(d, hz), at_center, self._pass_start) or m
                for hz, m in self._axes[d].items()
            }
            axis[self._center[d]] = at_center
            prev = self._prev_axes.get(d)
            if prev and self._prev_center is not None:
                # Carry the wider earlier sweep over, re-based on this centre (separable shift).
                c_hz = self._center[d]
                pt = _interp({f: m.seconds for f, m in prev.items()}, c_hz)
                pp = _interp({f: m.power_w for f, m in prev.items()}, c_hz)
                for f, m in prev.items():
                    if f not in axis:
                        axis[f] = Measurement(
                            max(at_center.seconds + m.seconds - pt, 1e-12), max(at_center.power_w + m.power_w - pp, 0.0)
                        )
            axes[d] = MappingProxyType(axis)
        return PhaseModel(self._center, at_center, MappingProxyType(axes), self._reference)

    # -- measurements -------------------------------------------------------------

    def record(self, point: OperatingPoint, measurement: Measurement) -> None:
        """One unit of work measured at ``point`` (points not asked for are ignored)."""
        if self._done:
            return
        self._seq_of.setdefault(point, []).append(self._measurements)
        self._measurements += 1
        self._samples.setdefault(point, []).append(measurement)
        if self._stage == "center" and point == self._center:
            self._stage = "axes"
        elif point != self._center:
            for d in self._order:
                if point == self._center.with_(d, point[d]) and point[d] != self._center[d]:
                    if len(self._samples[point]) >= 1:
                        self._axes[d][point[d]] = Measurement.combine(self._samples[point])
                    break

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains this tuner sweeps."""
        return tuple(self._order)

    @property
    def done(self) -> bool:
        return self._done

    def model(self) -> PhaseModel | None:
        """The tuned model (with ``best`` set) once done, else None."""
        return self._model if self._done else None

    def statistics(self) -> TunerStatistics:
        return TunerStatistics(
            measurements=self._measurements, points=len(self._samples), passes_done=self._pass, done=self._done
        )
