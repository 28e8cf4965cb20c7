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

The board warms while it is tuned: the centre is measured again after each axis, and the
drift it shows is removed from every measurement before points are compared (the book of
samples and that correction: :mod:`._tuner_book`).

Under a power cap the first centre is the lowest point and axes are swept upwards; a point
not measured yet runs only if its power *bound* is ``_EXPLORE_MARGIN`` under the cap
(:mod:`._tuner_bounds`), or, with ``guarded``, if its physical bound fits the measured cap:
then as a *guarded probe* its driver watches (:meth:`AxisTuner.guarded`, :meth:`AxisTuner.reject`;
Orin's EMC 665 -> 2133 MHz at 10 W, which no slope bound admits; :mod:`._tuner_probes`). The
power a driver hands over is a bound on what the unit settled at once its raised clocks
landed, not its mean (:func:`~hetsched._governor._tuner_bounds.settled`).

Effort is bounded: the measurement that reaches :attr:`AxisTuner.measurement_limit` ends the
tuning on the best point measured (:meth:`AxisTuner.finish`, also what a driver calls when
the tuning has taken too many occurrences, :meth:`PhaseTuning.propose
<hetsched._governor._tuning.PhaseTuning.propose>`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from .._errors import GovernorError
from ._model import TIME_TIE, Choice, Measurement, Objective, PhaseModel, _interp, choose, fit_coupling
from ._points import DomainSpec, OperatingPoint
from ._tuner_book import SampleBook, best_measured
from ._tuner_bounds import axis_power_bound, measurement_limit, off_axis_bound, scaled
from ._tuner_probes import faster_trade, joint_probe, physically_fits
from ._tuner_seam import TunerSettings, TunerStatistics

__all__ = ["AxisTuner", "TunerStatistics", "axis_tuner"]


_BUDGET_PASSES = 3
"""At least this many passes under a power budget (they stop early once the centre stays)."""
_EXPLORE_MARGIN = 0.05
"""Under a cap, a point not measured yet is tried only if its power bound is this far under it
(bounds from neighbours off the axes are not tight; a phase's mean hides its peaks)."""
_CENTRE_TIE = 0.03
"""Filling a budget, measured points within this of the fastest count as equally fast when the
next centre falls back to one (the least energy among them); the final choice uses ``TIME_TIE``."""
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
        guarded: bool = False,
        max_measurements: int | None = None,
        measured_cap_w: float | None = None,
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
        # What a point's *measured* power may reach (the budget less its measured margin):
        # the cap above is for bounds and predictions of points not measured yet.
        self._measured_cap = power_cap_w if power_cap_w is None or measured_cap_w is None else max(
            power_cap_w, measured_cap_w)
        # A power budget is a constraint to fill: under one, the fastest point that fits.
        self._objective: Objective = objective or ("energy" if power_cap_w is None else "time")
        self._levels = levels
        # Filling a budget moves the bottleneck from domain to domain as clocks rise (the GPU
        # first, then the CPUs it waited on): a pass per move, while the centre still moves.
        self._passes = passes if self._objective == "energy" else max(passes, _BUDGET_PASSES)
        self._repeats = repeats
        self._pass = 0
        self._book = SampleBook()
        self._samples = self._book.samples
        self._reference: float | None = None
        self._prev_axes: dict[str, dict[int, Measurement]] = {}
        self._prev_center: OperatingPoint | None = None
        self._grids: dict[str, list[int]] = {}
        self._verify_tries = 0
        self._fallback: OperatingPoint | None = None
        """The pass's own choice while a watched one (:meth:`_watched_choice`) is verified."""
        self._extra_passes = 0
        self._done = False
        self._chosen: OperatingPoint | None = None
        self._model: PhaseModel | None = None
        self._last_model: PhaseModel | None = None
        self._cut_short = False
        self._limit = max_measurements or measurement_limit(self._specs.values(), levels, self._passes, repeats)
        self._guarded_ok = guarded and power_cap_w is not None
        self._guarded: set[OperatingPoint] = set()
        self._rejected: dict[OperatingPoint, float] = {}
        if power_cap_w is None:
            start = OperatingPoint.of({d: s.max_hz for d, s in self._specs.items()})
        else:
            start = OperatingPoint.of({d: s.min_hz for d, s in self._specs.items()})
        self._begin_pass(start, {d: list(range(len(s.available_hz))) for d, s in self._specs.items()})

    # -- plan -----------------------------------------------------------------

    def _begin_pass(self, center: OperatingPoint, span: Mapping[str, list[int]]) -> None:
        self._center = center
        self._pass_start = self._book.count
        self._book.begin_pass(center)
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
                point = self._center.with_(d, hz)
                if point in self._rejected:
                    up.clear()
                    break
                if self._cap is not None and self._extrapolated_power(d, hz) > self._cap * (1 - _EXPLORE_MARGIN):
                    if not self._guardable(d, hz):
                        up.clear()
                        break
                    self._guarded.add(point)
                up.pop(0)
                return point
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

    def _guardable(self, d: str, hz: int) -> bool:
        """Whether ``hz`` on ``d``'s axis may run as a guarded probe (see :meth:`guarded`):
        :func:`~._tuner_probes.physically_fits` the measured cap."""
        if not self._guarded_ok or self._cap is None or not self._samples.get(self._center):
            return False
        axis = {f: m for f, m in self._axes[d].items() if f < hz}
        axis[self._center[d]] = Measurement.combine(self._samples[self._center])
        cap = self._cap if self._measured_cap is None else self._measured_cap
        return physically_fits(axis, hz, cap, self._samples)

    def guarded(self, point: OperatingPoint) -> bool:
        """Whether ``point`` is a *guarded probe*: a step up an axis whose slope bound is over
        the cap's margin though its physical bound fits (Orin's EMC 665 -> 2133 MHz at 10 W),
        or the last pass's faster trade. Its driver must watch the power while it runs and
        call :meth:`reject` as soon as a reading is over the cap. A probe stays guarded for
        every repeat: one whose run measured over the cap is dropped at once (:meth:`record`),
        as a phase shorter than a telemetry period hides its peak from the readings."""
        return point in self._guarded

    def reject(self, point: OperatingPoint, power_w: float) -> None:
        """The driver stopped a guarded probe at ``point``: ``power_w`` was read over the cap.
        It is never proposed again, nor anything above it on its axis in this pass."""
        self._rejected[point] = power_w
        self._guarded.discard(point)
        for d, up, _down, _rechecked in self._pending:
            if point == self._center.with_(d, point[d]):
                up.clear()
        if self._current == point:
            self._current = None

    @property
    def center(self) -> OperatingPoint:
        """The centre of the pass in progress (measured first in every pass)."""
        return self._center

    def _joint_probe(self) -> OperatingPoint | None:
        """The pass's joint probe (:func:`~._tuner_probes.joint_probe`), or None."""
        limit = None if self._cap is None else self._cap * (1 - _EXPLORE_MARGIN)
        return joint_probe(self._center, Measurement.combine(self._samples[self._center]), self._axes,
                           self._order, limit, self._samples)

    def _extrapolated_power(self, d: str, hz: int) -> float:
        """A bound on the power at ``hz`` on ``d``'s axis (:func:`axis_power_bound`)."""
        if not self._samples.get(self._center):
            return 0.0
        at_center = Measurement.combine(self._samples[self._center])
        return axis_power_bound(self._axes[d], self._center[d], at_center, self._prev_axes.get(d), hz, self._samples)

    def _safe(self, ch: Choice, model: PhaseModel, tie: float = TIME_TIE) -> Choice:
        """``ch``, or under a cap the best point measured so far if ``ch`` is not safe to run
        (its :func:`off_axis_bound` is over the cap)."""
        if self._cap is None or ch.point in self._samples:
            return ch
        if off_axis_bound(ch.point, self._samples, model) <= self._cap:
            return ch
        # The next centre: a point with room under the prediction cap, for its sweeps up.
        best, best_m = self._best_measured(model.slowdown_reference_s, cap=self._cap, tie=tie)
        if best is None or best_m is None:
            return ch
        return Choice(best, best_m, True, True)

    def _scaled(self, power_w: float, ratio: float) -> float:
        return scaled(power_w, ratio, self._samples)

    def _end_pass(self) -> OperatingPoint | None:
        model = self._build_model()
        self._pass += 1
        # The next point runs before it is measured: under a cap, judged by the higher of the
        # two power models until the points off the axes have fitted the cross terms.
        # A centre that falls back to a measured point (the model's choice not safe to run) is
        # the least energy among those near the fastest (_CENTRE_TIE), not the fastest alone:
        # a clock that buys 2 % but spends the headroom (a GPU step while the memory clock is
        # the bottleneck) would leave no room to sweep.
        last = self._pass >= self._passes
        ch = choose(model, slowdown=self._effective_slowdown, power_cap_w=self._cap, objective=self._objective,
                    conservative=self._cap is not None)
        ch = self._safe(ch, model, TIME_TIE if last else _CENTRE_TIE)
        self._prev_axes = {d: dict(a) for d, a in model.axes.items()}
        self._prev_center = model.center
        self._last_model = model
        probe = self._probe
        if probe is not None and self._samples.get(probe) and self._extra_passes < _EXTRA_PASSES:
            pm = Measurement.combine(self._samples[probe])
            if pm.seconds < min(ch.predicted.seconds, model.at_center.seconds) * (1 - 0.01) and (
                self._measured_cap is None or pm.power_w <= self._measured_cap
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
        self._chosen = self._watched_choice(model, ch).point
        self._stage = "verify"
        return self._chosen

    def _watched_choice(self, model: PhaseModel, ch: Choice) -> Choice:
        """``ch``, or with guarded probes a faster trade verified as a guarded probe
        (:func:`~._tuner_probes.faster_trade`), ``ch`` kept to verify if it does not fit."""
        if not self._guarded_ok or self._measured_cap is None or self._objective != "time":
            return ch
        wide = faster_trade(model, ch, slowdown=self._effective_slowdown, measured_cap_w=self._measured_cap,
                            tried=set(self._samples) | set(self._rejected))
        if wide is None:
            return ch
        self._guarded.add(wide.point)
        self._fallback = ch.point
        return wide

    def _after_verify(self) -> OperatingPoint | None:
        assert self._model is not None and self._chosen is not None
        fallback, self._fallback = self._fallback, None
        if fallback is not None:
            ms = self._samples.get(self._chosen)
            cap = self._measured_cap
            if not ms or (cap is not None and Measurement.combine(ms).power_w > cap):
                # The watched choice did not fit: verify the pass's own choice as usual.
                self._chosen = fallback
                if fallback not in self._samples:
                    return fallback
        if not self._samples.get(self._chosen):
            # A watched choice stopped over the budget before it measured anything.
            best, best_m = self._best_measured(self._model.slowdown_reference_s)
            if best is None or best_m is None:
                best, best_m = min(self._book.measured(), key=lambda pm: pm[1].power_w)
            self._model = replace(fit_coupling(self._model, self._book.measured()), best=best, best_measured=best_m)
            self._done = True
            return None
        m = self._book.corrected(self._chosen) or Measurement.combine(self._samples[self._chosen])
        ref = self._model.slowdown_reference_s
        over = m.seconds / (ref * (1 + self._slowdown)) if self._objective == "energy" else 0.0
        cap_broken = self._measured_cap is not None and m.power_w > self._measured_cap
        if (over > 1.0 or cap_broken) and self._verify_tries < 3:
            self._verify_tries += 1
            # The miss is evidence off the axes: refit the cross terms on it before choosing again.
            self._model = fit_coupling(self._model, self._book.measured())
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
        self._model = replace(fit_coupling(self._model, self._book.measured()), best=best, best_measured=best_m)
        self._done = True
        return None

    def _best_measured(self, ref: float, cap: float | None = None,
                       tie: float = TIME_TIE) -> tuple[OperatingPoint | None, Measurement | None]:
        return best_measured(self._book.measured(), ref=ref, slowdown=self._slowdown,
                             cap=self._measured_cap if cap is None else cap, tie=tie,
                             objective=self._objective, specs=self._specs)

    def _build_model(self) -> PhaseModel:
        at_center = self._book.corrected(self._center) or Measurement.combine(self._samples[self._center])
        if self._pass == 0 and self._cap is None:
            # The fastest run at the top clocks: a run slowed by something else (a clock
            # still settling from the point before) must not loosen the bound.
            self._reference = min(m.seconds for m in self._samples[self._center])
        axes: dict[str, Mapping[int, Measurement]] = {}
        for d in self._order:
            axis = {hz: self._book.corrected(self._center.with_(d, hz)) or m for hz, m in self._axes[d].items()}
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
        return fit_coupling(model, self._book.measured())

    # -- measurements -------------------------------------------------------------

    def record(self, point: OperatingPoint, measurement: Measurement) -> None:
        """One unit of work measured at ``point`` (points not asked for are ignored); the
        :attr:`measurement_limit`-th ends the tuning (:meth:`finish`)."""
        if self._done:
            return
        self._book.add(point, measurement)
        if self._book.count >= self._limit:
            self.finish()
            return
        if point in self._guarded and self._measured_cap is not None and measurement.power_w > self._measured_cap:
            # A guarded probe whose run measured over the cap is not run again: the
            # measurement stays (the model learns the step does not fit).
            self.reject(point, measurement.power_w)
        if self._stage == "center" and point == self._center:
            self._stage = "axes"
        elif point != self._center:
            for d in self._order:
                if point == self._center.with_(d, point[d]) and point[d] != self._center[d]:
                    if len(self._samples[point]) >= 1:
                        self._axes[d][point[d]] = Measurement.combine(self._samples[point])
                    break

    # -- effort bound ----------------------------------------------------------------

    @property
    def measurement_limit(self) -> int:
        """The most measurements this tuner takes: the one that reaches it ends the tuning."""
        return self._limit

    def finish(self) -> bool:
        """End the tuning now with the best point measured so far (the effort bound).

        The model is the latest one the measurements give (the pass in progress, else the
        last finished pass's); its ``best`` is the best point measured within the bounds,
        or the least power measured if none is within the cap. Returns False, and leaves
        the tuner as it was, when there is nothing to build on (no pass centre measured).
        """
        if self._done:
            return True
        if self._samples.get(self._center):
            model = self._build_model()
        elif self._model is not None:
            model = self._model
        elif self._last_model is not None:
            model = self._last_model
        else:
            return False
        measured = self._book.measured()
        best, best_m = self._best_measured(model.slowdown_reference_s)
        if best is None or best_m is None:
            best, best_m = min(measured, key=lambda pm: pm[1].power_w)
        self._model = replace(fit_coupling(model, measured), best=best, best_measured=best_m)
        self._chosen = best
        self._cut_short = True
        self._done = True
        return True

    def measured(self) -> list[tuple[OperatingPoint, Measurement]]:
        """Every point measured so far, with what it measured (not drift-corrected)."""
        return [(p, Measurement.combine(ms)) for p, ms in self._samples.items() if ms]

    @property
    def cut_short(self) -> bool:
        """Ended by :meth:`finish` rather than by converging."""
        return self._cut_short

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
            measurements=self._book.count, points=len(self._samples), passes_done=self._pass, done=self._done,
            measurement_limit=self._limit, cut_short=self._cut_short,
        )


def axis_tuner(domains: Mapping[str, DomainSpec], tune: Sequence[str], settings: TunerSettings) -> AxisTuner:
    """The :class:`~._tuner_seam.TunerFactory` :class:`~._tuning.PhaseTuning` uses by default."""
    return AxisTuner(
        domains,
        tune,
        slowdown=settings.slowdown,
        power_cap_w=settings.power_cap_w,
        levels=settings.levels,
        passes=settings.passes,
        repeats=settings.repeats,
        guarded=settings.guarded,
        measured_cap_w=settings.measured_cap_w,
    )
