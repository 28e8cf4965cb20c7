"""Auto-tune of one phase: coordinate descent over domains, as a pure state machine.

The tuner never measures anything itself. Its driver (the governor while a program
runs, or a benchmark on the simulation) asks :meth:`AxisTuner.propose` for the next
operating point, runs one unit of the phase's work there, and hands back what it
measured with :meth:`AxisTuner.record`. So the same tuner runs unchanged against a
board, the live twin, the fast simulation or a table in a test.

Each pass measures the centre point, then sweeps every domain along its own axis with
the others held at the centre (a coarse grid first, then a finer one around what the
previous pass chose): ``sum(levels)`` measurements instead of their product. Domains
whose own axis bought no time are then raised *together* once (a joint probe: work split
over concurrent domains is as slow as the slowest, which no single axis shows); if that
paid, the next pass starts from it. The :class:`~hetsched._governor._model.PhaseModel`
built from the axes, its cross terms fitted on every point off them, picks the next
centre jointly over domains. Finally the chosen point itself is measured; if it is slower
than the bound, the bound is tightened by the overshoot and the choice is made again.
The result is the best point *measured* in any pass, not a prediction.

Objective: the least energy per unit within the slowdown bound (against the top clocks'
time); under a power budget (``power_cap_w``) the fastest point within it (the budget is
a constraint to fill), the least energy breaking ties within run-to-run noise.

The board warms while it is tuned (leakage, hence power, grows with temperature), so a
sweep measured in order would make the points measured later look dearer. The centre is
measured again after each axis; the drift it shows, chained across passes, is removed
from every measurement before points are compared.

Under a power cap the first centre is the lowest point and axes are swept upwards,
stopping before a step whose power, extrapolated from the last two, would break the
cap. Every point not measured yet must have a power *bound* (not a prediction) at least
``_EXPLORE_MARGIN`` under the cap: along an axis the top two points' slope doubled, and
never less than the phase drawing its dynamic power as much faster as the clock ratio
allows; off the axes (joint probe, next centre) the same from a measured point below it.
So tuning keeps to the budget, at the price of the last few percent of it on coarse
tables (Orin's EMC steps 665 -> 2133 MHz: no bound lets that step be tried at 10 W).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from .._errors import GovernorError
from ._model import TIME_TIE, Choice, Measurement, Objective, PhaseModel, _interp, choose, fit_coupling
from ._points import DomainSpec, OperatingPoint

__all__ = ["AxisTuner", "TunerStatistics"]


@dataclass(frozen=True)
class TunerStatistics:
    measurements: int
    points: int
    passes_done: int
    done: bool


_BUDGET_PASSES = 3
"""At least this many passes under a power budget (they stop early once the centre stays)."""
_EXPLORE_MARGIN = 0.05
"""Under a cap, a point not measured yet is tried only if its power bound is this far under it
(bounds from neighbours off the axes are not tight; a phase's mean hides its peaks)."""
_ENERGY_TIE = 0.001
"""Measured energies this close count as equal (then the lower clocks win)."""
_EXTRA_PASSES = 4
"""Passes a joint probe that paid may add (each re-centres on it and sweeps again)."""


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
        objective: Objective | None = None,
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
        # A power budget is a constraint to fill: under one, the fastest point that fits.
        self._objective: Objective = objective or ("energy" if power_cap_w is None else "time")
        self._levels = levels
        # Filling a budget moves the bottleneck from domain to domain as clocks rise (the GPU
        # first, then the CPUs it waited on): a pass per move, while the centre still moves.
        self._passes = passes if self._objective == "energy" else max(passes, _BUDGET_PASSES)
        self._repeats = repeats
        self._pass = 0
        self._samples: dict[OperatingPoint, list[Measurement]] = {}
        self._seq_of: dict[OperatingPoint, list[int]] = {}
        """When (in measurement order) each sample of each point was taken."""
        self._measurements = 0
        self._reference: float | None = None
        self._prev_axes: dict[str, dict[int, Measurement]] = {}
        self._prev_center: OperatingPoint | None = None
        self._pass_log: list[tuple[int, OperatingPoint]] = []
        """(first measurement, centre) of every pass so far."""
        self._grids: dict[str, list[int]] = {}
        self._verify_tries = 0
        self._extra_passes = 0
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
        self._pass_log.append((self._measurements, center))
        self._axes: dict[str, dict[int, Measurement]] = {d: {} for d in self._order}
        self._stage = "center"
        self._probe: OperatingPoint | None = None
        self._probed = False
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
                if self._cap is not None and self._extrapolated_power(d, hz) > self._cap * (1 - _EXPLORE_MARGIN):
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
        if not self._probed:
            self._probed = True
            self._probe = self._joint_probe()
            if self._probe is not None:
                return self._probe
        return self._end_pass()

    def _joint_probe(self) -> OperatingPoint | None:
        """The centre with every domain whose own axis bought no time raised together (or None).

        Work split over domains that run concurrently (a data loader on two CPU clusters)
        is as slow as the slowest: raising either alone shows nothing, raising both does.
        Coordinate descent cannot see that, so each pass measures this one joint point too.
        """
        t0 = Measurement.combine(self._samples[self._center]).seconds
        flat: dict[str, int] = {}
        for d in self._order:
            higher = [hz for hz in self._axes[d] if hz > self._center[d]]
            if higher and min(self._axes[d][hz].seconds for hz in higher) > t0 * (1 - 0.01):
                flat[d] = max(higher)
        if len(flat) < 2:
            return None
        p0 = Measurement.combine(self._samples[self._center]).power_w
        # Highest joint step first; under a cap the first that fits even if the phase gets as
        # much shorter as the largest clock ratio allows, with every domain's energy per unit
        # of work unchanged (the axes alone cannot show how much the joint move shortens it,
        # and the shorter phase draws the same energy faster).
        levels = {d: sorted(hz for hz in self._axes[d] if hz > self._center[d]) for d in flat}
        steps = max(len(v) for v in levels.values())
        for k in range(steps, 0, -1):
            point = self._center
            extra = 0.0
            ratio = 1.0
            for d, hzs in levels.items():
                # The same share of each domain's way up, so they stay in step.
                hz = hzs[max(0, round(k / steps * len(hzs)) - 1)]
                point = point.with_(d, hz)
                extra += self._axes[d][hz].power_w - p0
                ratio = max(ratio, hz / self._center[d])
            if self._cap is None or self._scaled(p0 + extra, ratio) <= self._cap * (1 - _EXPLORE_MARGIN):
                return point
        return None

    def _extrapolated_power(self, d: str, hz: int) -> float:
        """A bound on the power at ``hz`` on ``d``'s axis.

        Between points this pass measured: interpolated. Above them: extrapolated from the
        top two (or scaled from the centre alone), and never below what an earlier pass's
        sweep, re-based on this centre, shows there (that sweep ran with the other domains
        elsewhere: the shift is separable, the cross terms are not, so it cannot stand alone).
        """
        axis = dict(self._axes[d])
        if not self._samples.get(self._center):
            return 0.0
        at_center = Measurement.combine(self._samples[self._center])
        axis[self._center[d]] = at_center
        prev = self._prev_axes.get(d)
        rebased: dict[int, float] = {}
        if prev:
            pp = _interp({f: m.power_w for f, m in prev.items()}, self._center[d])
            rebased = {f: at_center.power_w + m.power_w - pp for f, m in prev.items()}
        if any(f >= hz for f in axis):
            return _interp({f: m.power_w for f, m in axis.items()}, hz)
        pts = sorted(f for f in axis if f < hz)[-2:]
        f2 = pts[-1]
        p2 = axis[f2].power_w
        # A faster clock may shorten the phase by up to its ratio, the other domains' work
        # then drawn over less time: their share at least that much more.
        bound = self._scaled(p2, hz / f2)
        if len(pts) == 2:
            f1 = pts[0]
            slope = max((p2 - axis[f1].power_w) / (f2 - f1), 0.0)
            # Power grows faster than linearly above the voltage knee, and a phase mean
            # hides its peaks: twice the slope.
            bound = max(bound, p2 + 2.0 * slope * (hz - f2))
        if rebased and any(f >= hz for f in rebased):
            bound = max(bound, _interp(rebased, hz))
        return bound

    def _safe(self, ch: Choice, model: PhaseModel) -> Choice:
        """``ch``, or under a cap the best point measured so far if ``ch`` is not safe to run.

        The model's prediction off its axes is no bound: a point is safe only if some
        measured point with no clock above it, raised along the axes and drawn as much
        faster as the largest clock ratio allows (:meth:`_scaled`), stays under the cap.
        """
        if self._cap is None or ch.point in self._samples:
            return ch
        bound = math.inf
        for y, ms in self._samples.items():
            if not ms or any((y.get(d) or hz) > hz for d, hz in ch.point.items()):
                continue
            p = Measurement.combine(ms).power_w
            ratio = 1.0
            for d, hz in ch.point.items():
                yd = y.get(d)
                if yd is None or yd == hz or d not in model.axes:
                    continue
                axis = {f: m.power_w for f, m in model.axes[d].items()}
                p += max(0.0, _interp(axis, hz) - _interp(axis, yd))
                ratio = max(ratio, hz / yd)
            bound = min(bound, self._scaled(p, ratio))
        if bound <= self._cap:
            return ch
        best, best_m = self._best_measured(model.slowdown_reference_s)
        if best is None or best_m is None:
            return ch
        return Choice(best, best_m, True, True)

    def _scaled(self, power_w: float, ratio: float) -> float:
        """``power_w`` with everything above the least power this tuner has seen (an upper
        bound on the static part) drawn ``ratio`` times faster."""
        floor = min((m.power_w for ms in self._samples.values() for m in ms), default=0.0)
        floor = min(floor, power_w)
        return floor + (power_w - floor) * ratio

    def _end_pass(self) -> OperatingPoint | None:
        model = self._build_model()
        self._pass += 1
        # The next point runs before it is measured: under a cap, judged by the higher of the
        # two power models until the points off the axes have fitted the cross terms.
        ch = choose(model, slowdown=self._effective_slowdown, power_cap_w=self._cap, objective=self._objective,
                    conservative=self._cap is not None)
        ch = self._safe(ch, model)
        self._prev_axes = {d: dict(a) for d, a in model.axes.items()}
        self._prev_center = model.center
        probe = self._probe
        if probe is not None and self._samples.get(probe) and self._extra_passes < _EXTRA_PASSES:
            pm = Measurement.combine(self._samples[probe])
            if pm.seconds < min(ch.predicted.seconds, model.at_center.seconds) * (1 - 0.01) and (
                self._cap is None or pm.power_w <= self._cap
            ):
                # The joint move paid where no single one did: sweep again from there.
                self._extra_passes += 1
                self._passes += 1
                ch = replace(ch, point=probe)
        if self._pass < self._passes and ch.point != self._center:
            span: dict[str, list[int]] = {}
            for d in self._order:
                spec = self._specs[d]
                i = spec.index(ch.point[d])
                grid = self._grids[d]
                lo = max([g for g in grid if g < i], default=i)
                hi = min([g for g in grid if g > i], default=i)
                if self._objective == "time":
                    # Filling a budget, every step up may pay once the other domains moved
                    # (a GPU clock is worthless at the lowest memory clock, not at the top):
                    # sweep all the way up again; the cap guard stops the climb.
                    hi = len(spec.available_hz) - 1
                span[d] = list(range(lo, hi + 1))
            self._begin_pass(ch.point, span)
            return self._center
        self._model = model
        self._chosen = ch.point
        self._stage = "verify"
        return ch.point

    def _after_verify(self) -> OperatingPoint | None:
        assert self._model is not None and self._chosen is not None
        m = self._corrected(self._chosen) or Measurement.combine(self._samples[self._chosen])
        ref = self._model.slowdown_reference_s
        over = m.seconds / (ref * (1 + self._slowdown)) if self._objective == "energy" else 0.0
        cap_broken = self._cap is not None and m.power_w > self._cap
        if (over > 1.0 or cap_broken) and self._verify_tries < 3:
            self._verify_tries += 1
            # The miss is evidence off the axes: refit the cross terms on it before choosing again.
            self._model = fit_coupling(self._model, self._measured())
            if over > 1.0:
                self._effective_slowdown = max(0.0, self._effective_slowdown - (over - 1.0) * (1 + self._slowdown) - 0.005)
            bias = max(0.0, m.power_w - self._model.predict(self._chosen).power_w) if cap_broken else 0.0
            ch = choose(self._model, slowdown=self._effective_slowdown, power_cap_w=self._cap, power_bias_w=bias,
                        objective=self._objective, conservative=self._cap is not None)
            ch = self._safe(ch, self._model)
            if ch.point != self._chosen and ch.point not in self._samples:
                self._chosen = ch.point
                return ch.point
        # Whatever the model predicted, keep the best point actually *measured* within the
        # bounds, over every pass (centres, axis points and verified choices all count).
        best, best_m = self._best_measured(ref)
        if best is None:
            best, best_m = self._chosen, m
        self._model = replace(fit_coupling(self._model, self._measured()), best=best, best_measured=best_m)
        self._done = True
        return None

    # -- drift ----------------------------------------------------------------------

    def _drift(self, seq: float) -> tuple[float, float]:
        """How far the board has drifted (seconds, watts of a unit) by measurement ``seq``.

        Each pass's centre, measured again after every axis, gives the drift within the
        pass; passes are chained at their boundaries, the last pass's drift extrapolated at
        its final slope to the next pass's first centre sample (the board keeps warming
        while the new centre is set up).
        """
        off_t = off_p = 0.0
        segments = []
        for k, (start, centre) in enumerate(self._pass_log):
            end = self._pass_log[k + 1][0] if k + 1 < len(self._pass_log) else self._measurements
            log = [(q, m) for q, m in zip(self._seq_of.get(centre, ()), self._samples.get(centre, ()), strict=True)
                   if start <= q < end]
            if log:
                segments.append(log)
        for k, log in enumerate(segments):
            base = log[0][1]

            def rel(q: float, log: list[tuple[int, Measurement]] = log, base: Measurement = base) -> tuple[float, float]:
                if q <= log[0][0]:
                    m = log[0][1]
                elif q >= log[-1][0]:
                    m = log[-1][1]
                else:
                    m = log[-1][1]
                    for (q0, m0), (q1, m1) in itertools.pairwise(log):
                        if q0 <= q <= q1:
                            w = (q - q0) / (q1 - q0) if q1 > q0 else 0.0
                            m = Measurement(m0.seconds + w * (m1.seconds - m0.seconds), m0.power_w + w * (m1.power_w - m0.power_w))
                            break
                return m.seconds - base.seconds, m.power_w - base.power_w

            nxt = segments[k + 1][0][0] if k + 1 < len(segments) else None
            if nxt is None or seq < nxt:
                dt, dp = rel(seq)
                return off_t + dt, off_p + dp
            dt, dp = rel(log[-1][0])
            if len(log) >= 2:
                (q0, m0), (q1, m1) = log[-2], log[-1]
                gap = (nxt - q1) / max(q1 - q0, 1)
                dt += gap * (m1.seconds - m0.seconds)
                dp += gap * (m1.power_w - m0.power_w)
            off_t, off_p = off_t + dt, off_p + dp
        return off_t, off_p

    def _corrected(self, point: OperatingPoint) -> Measurement | None:
        """``point``'s samples, each moved by the drift between when it ran and now (None: none)."""
        pairs = list(zip(self._seq_of.get(point, ()), self._samples.get(point, ()), strict=True))
        if not pairs:
            return None
        # Power only: warming changes leakage, not how long the work takes (a time that
        # changes is the clocks', or a phase boundary's, and correcting it would move every
        # point by what one centre run happened to show).
        _, now_p = self._drift(self._measurements - 1)
        dt = dp = 0.0
        for q, m in pairs:
            dt += m.seconds
            dp += m.power_w - self._drift(q)[1]
        n = len(pairs)
        return Measurement(max(dt / n, 1e-12), max(dp / n + now_p, 0.0))

    def _measured(self) -> list[tuple[OperatingPoint, Measurement]]:
        """Every point measured so far, drift-corrected to now."""
        out = []
        for p in self._samples:
            m = self._corrected(p)
            if m is not None:
                out.append((p, m))
        return out

    def _best_measured(self, ref: float) -> tuple[OperatingPoint | None, Measurement | None]:
        bound = ref * (1 + self._slowdown)
        measured = self._measured()
        in_cap = [(p, m) for p, m in measured if self._cap is None or m.power_w <= self._cap]
        if not in_cap:
            return None, None
        if self._objective == "time":
            fastest = min(m.seconds for _, m in in_cap)
            near = [(p, m) for p, m in in_cap if m.seconds <= fastest * (1 + TIME_TIE)]
            return self._least_energy(near)
        ok = [(p, m) for p, m in in_cap if m.seconds <= bound]
        if ok:
            return self._least_energy(ok)
        return min(in_cap, key=lambda pm: pm[1].seconds)

    def _least_energy(self, pts: list[tuple[OperatingPoint, Measurement]]) -> tuple[OperatingPoint, Measurement]:
        """The least energy; energies within run-to-run noise (0.1 %) go to the lower clocks,
        so a clock that buys nothing (an idle GPU's in a CPU phase) is not left high."""
        e_min = min(m.energy_j for _, m in pts)
        near = [(p, m) for p, m in pts if m.energy_j <= e_min * (1 + _ENERGY_TIE)]

        def height(pm: tuple[OperatingPoint, Measurement]) -> float:
            return sum(self._specs[d].index(hz) / max(len(self._specs[d].available_hz) - 1, 1)
                       for d, hz in pm[0].items() if d in self._specs)

        return min(near, key=lambda pm: (height(pm), pm[1].energy_j))

    def _build_model(self) -> PhaseModel:
        at_center = self._corrected(self._center) or Measurement.combine(self._samples[self._center])
        if self._pass == 0 and self._cap is None:
            # The fastest run at the top clocks: a run slowed by something else (a clock
            # still settling from the point before) must not loosen the bound.
            self._reference = min(m.seconds for m in self._samples[self._center])
        axes: dict[str, Mapping[int, Measurement]] = {}
        for d in self._order:
            axis = {hz: self._corrected(self._center.with_(d, hz)) or m for hz, m in self._axes[d].items()}
            axis[self._center[d]] = at_center
            prev = self._prev_axes.get(d)
            if prev and self._prev_center is not None:
                # Carry the wider earlier sweep over, re-based on this centre (a constant drift cancels).
                c_hz = self._center[d]
                pt = _interp({f: m.seconds for f, m in prev.items()}, c_hz)
                pp = _interp({f: m.power_w for f, m in prev.items()}, c_hz)
                for f, m in prev.items():
                    if f not in axis:
                        axis[f] = Measurement(
                            max(at_center.seconds + m.seconds - pt, 1e-12), max(at_center.power_w + m.power_w - pp, 0.0)
                        )
            axes[d] = MappingProxyType(axis)
        model = PhaseModel(self._center, at_center, MappingProxyType(axes), self._reference)
        return fit_coupling(model, self._measured())

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
