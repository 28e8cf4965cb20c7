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
not measured yet runs only if its power *bound* is :attr:`TunerConfig.explore_margin
<._tuner_config.TunerConfig.explore_margin>` under the cap (:mod:`._tuner_bounds`). With
``guarded``, the budget-filling strategy (:class:`~._tuner_budget.BudgetFilling`) runs on top:
guarded probes its driver watches (:meth:`AxisTuner.guarded`, :meth:`AxisTuner.reject`) and a
watched faster trade at the end. The power a driver hands over is a bound on what the unit
settled at once its raised clocks landed, not its mean (:func:`~._tuner_budget.settled`).

Every constant is a field of :class:`~._tuner_config.TunerConfig`.

Effort is bounded: the measurement that reaches :attr:`AxisTuner.measurement_limit` ends the
tuning on the best point measured (:meth:`AxisTuner.finish`, also what a driver calls when
the tuning has taken too many occurrences, :meth:`PhaseTuning.propose
<hetsched._governor._tuning.PhaseTuning.propose>`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from .._errors import GovernorError
from ._model import Choice, Measurement, Objective, PhaseModel, _interp, choose, fit_coupling
from ._points import DomainSpec, OperatingPoint
from ._tuner_book import SampleBook, best_measured
from ._tuner_bounds import axis_power_bound, measurement_limit, off_axis_bound
from ._tuner_budget import BudgetFilling
from ._tuner_config import TunerConfig
from ._tuner_probes import joint_probe
from ._tuner_seam import TunerSettings, TunerStatistics

__all__ = ["AxisTuner", "Stage", "TunerStatistics", "axis_tuner"]


def _grid(n: int, levels: int) -> list[int]:
    if n <= levels:
        return list(range(n))
    return sorted({round(i * (n - 1) / (levels - 1)) for i in range(levels)})


class Stage(enum.Enum):
    """Where a pass of :class:`AxisTuner` is."""

    CENTRE = "centre"
    """The pass's centre has not been measured yet."""
    AXES = "axes"
    """Sweeping the axes (and the joint probe) around the measured centre."""
    VERIFY = "verify"
    """The passes are over: the chosen point is being verified."""


@dataclass
class _AxisSweep:
    """What is left of one domain's sweep in a pass."""

    domain: str
    up: list[int]
    """Clocks above the centre still to measure, in order."""
    down: list[int]
    """Clocks below the centre still to measure, in order."""
    rechecked: bool = False
    """The centre has been measured again after this axis (the drift meanwhile)."""


@dataclass
class _Pass:
    """One pass: its centre, what it measured along each axis, and what is left to sweep."""

    center: OperatingPoint
    axes: dict[str, dict[int, Measurement]]
    sweeps: list[_AxisSweep]
    stage: Stage = Stage.CENTRE
    probe: OperatingPoint | None = None
    """The pass's joint probe, once proposed."""
    probed: bool = False
    """The joint probe was considered (proposed, or there was none)."""


@dataclass
class _Bounds:
    """What the tuner keeps to: the slowdown bound and, under a budget, the two caps."""

    slowdown: float
    effective_slowdown: float
    """The slowdown bound tightened by each verification that missed it."""
    cap_w: float | None
    """The cap on bounds and predictions of points not measured yet (None: no budget)."""
    measured_cap_w: float | None
    """What a point's *measured* power may reach (the budget less its measured margin)."""
    objective: Objective


@dataclass
class _Progress:
    """How far the tuning has got, across passes."""

    passes: int
    """Passes to run (a joint probe that paid adds one)."""
    done_passes: int = 0
    extra_passes: int = 0
    reference_s: float | None = None
    """The fastest run at the top clocks (the slowdown bound's reference; None under a budget)."""
    prev_axes: dict[str, dict[int, Measurement]] = field(default_factory=dict)
    prev_center: OperatingPoint | None = None
    grids: dict[str, list[int]] = field(default_factory=dict)
    last_model: PhaseModel | None = None
    verify_tries: int = 0
    chosen: OperatingPoint | None = None
    model: PhaseModel | None = None
    done: bool = False
    cut_short: bool = False


class AxisTuner:
    """Coordinate-descent auto-tune of one phase over the domains in ``tune``.

    ``guarded`` (under a ``power_cap_w`` only) adds the budget-filling strategy
    (:class:`~._tuner_budget.BudgetFilling`); ``config`` holds every constant.

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
        config: TunerConfig | None = None,
    ) -> None:
        if not tune:
            raise GovernorError("auto-tune needs at least one domain to sweep")
        unknown = [d for d in tune if d not in domains]
        if unknown:
            raise GovernorError(f"auto-tune: unknown domains {unknown}; known: {sorted(domains)}")
        cfg = config or TunerConfig()
        self._cfg = cfg
        self._specs = {d: domains[d] for d in tune}
        self._order = list(tune)
        # A power budget is a constraint to fill: under one, the fastest point that fits.
        obj: Objective = objective or ("energy" if power_cap_w is None else "time")
        self._bounds = _Bounds(
            slowdown, slowdown, power_cap_w,
            power_cap_w if power_cap_w is None or measured_cap_w is None else max(power_cap_w, measured_cap_w),
            obj,
        )
        self._levels = levels
        self._repeats = repeats
        # Filling a budget moves the bottleneck from domain to domain as clocks rise: a pass
        # per move, while the centre still moves.
        passes = passes if obj == "energy" else max(passes, cfg.budget_passes)
        self._progress = _Progress(passes)
        self._book = SampleBook()
        self._samples = self._book.samples
        self._rejected: dict[OperatingPoint, float] = {}
        self._budget = (BudgetFilling(self._bounds.measured_cap_w, obj, time_tie=cfg.time_tie)
                        if guarded and self._bounds.measured_cap_w is not None else None)
        self._limit = max_measurements or measurement_limit(
            self._specs.values(), levels, passes, repeats, spare_passes=cfg.spare_passes, spare_runs=cfg.spare_runs)
        if power_cap_w is None:
            start = OperatingPoint.of({d: s.max_hz for d, s in self._specs.items()})
        else:
            start = OperatingPoint.of({d: s.min_hz for d, s in self._specs.items()})
        self._current: OperatingPoint | None = None
        self._pass = self._begin_pass(start, {d: list(range(len(s.available_hz))) for d, s in self._specs.items()})

    # -- plan -----------------------------------------------------------------

    def _begin_pass(self, center: OperatingPoint, span: Mapping[str, list[int]]) -> _Pass:
        self._book.begin_pass(center)
        sweeps = []
        for d in self._order:
            spec = self._specs[d]
            c_idx = spec.index(center[d])
            idxs = span[d]
            grid = [idxs[i] for i in _grid(len(idxs), self._levels)]
            self._progress.grids[d] = grid
            up = [spec.available_hz[i] for i in grid if i > c_idx]
            if (self._bounds.cap_w is not None and self._cfg.smallest_step_first
                    and c_idx + 1 < len(spec.available_hz) and (c_idx + 1) in idxs):
                # Under a cap the first step up is the smallest the table has, so the
                # power slope is known (and the overshoot risk tiny) before bigger steps.
                first = spec.available_hz[c_idx + 1]
                up = [first] + [hz for hz in up if hz != first]
            down = [spec.available_hz[i] for i in reversed(grid) if i < c_idx]
            sweeps.append(_AxisSweep(d, up, down))
        self._current = center
        return _Pass(center, {d: {} for d in self._order}, sweeps)

    def propose(self) -> OperatingPoint | None:
        """The next point to run one unit of work at, or None when tuning is done."""
        if self._progress.done:
            return None
        if self._current is not None and len(self._samples.get(self._current, ())) < self._repeats:
            return self._current
        self._current = self._next_point()
        return self._current

    def _next_point(self) -> OperatingPoint | None:
        ps = self._pass
        if ps.stage is Stage.VERIFY:
            return self._after_verify()
        while ps.sweeps:
            sweep = ps.sweeps[0]
            point = self._next_on_axis(sweep)
            if point is not None:
                return point
            if sweep.down:
                return ps.center.with_(sweep.domain, sweep.down.pop(0))
            if not sweep.rechecked and ps.axes[sweep.domain]:
                sweep.rechecked = True
                return ps.center  # the centre again: how far the board drifted meanwhile
            ps.sweeps.pop(0)
        if not ps.probed:
            ps.probed = True
            ps.probe = self._joint_probe()
            if ps.probe is not None:
                return ps.probe
        return self._end_pass()

    def _next_on_axis(self, sweep: _AxisSweep) -> OperatingPoint | None:
        """The next step up ``sweep``'s axis (None: the climb is over). Under a cap a step whose
        bound is not :attr:`~TunerConfig.explore_margin` under it ends the climb, unless the
        budget-filling strategy admits it as a guarded probe."""
        ps = self._pass
        cap = self._bounds.cap_w
        d = sweep.domain
        while sweep.up:
            hz = sweep.up[0]
            point = ps.center.with_(d, hz)
            if point in self._rejected:
                sweep.up.clear()
                return None
            if cap is not None and self._extrapolated_power(d, hz) > cap * (1 - self._cfg.explore_margin) and (
                self._budget is None or not self._budget.admit(ps.center, d, hz, ps.axes[d], self._samples)
            ):
                sweep.up.clear()
                return None
            sweep.up.pop(0)
            return point
        return None

    def guarded(self, point: OperatingPoint) -> bool:
        """Whether ``point`` is a *guarded probe* (:mod:`._tuner_budget`): a step up an axis whose
        slope bound is over the cap's margin though its physical bound fits, or the last pass's
        faster trade. Its driver must watch the power while it runs and call :meth:`reject` as
        soon as a reading is over the cap. A probe stays guarded for every repeat: one whose
        run measured over the cap is dropped at once (:meth:`record`), as a phase shorter than
        a telemetry period hides its peak from the readings. Never without the strategy."""
        return self._budget is not None and self._budget.guarded(point)

    def reject(self, point: OperatingPoint, power_w: float) -> None:
        """The driver stopped a guarded probe at ``point``: ``power_w`` was read over the cap.
        It is never proposed again, nor anything above it on its axis in this pass."""
        self._rejected[point] = power_w
        if self._budget is not None:
            self._budget.discard(point)
        ps = self._pass
        for sweep in ps.sweeps:
            if point == ps.center.with_(sweep.domain, point[sweep.domain]):
                sweep.up.clear()
        if self._current == point:
            self._current = None

    @property
    def center(self) -> OperatingPoint:
        """The centre of the pass in progress (measured first in every pass)."""
        return self._pass.center

    def _at_center(self) -> Measurement:
        return Measurement.combine(self._samples[self._pass.center])

    def _joint_probe(self) -> OperatingPoint | None:
        """The pass's joint probe (:func:`~._tuner_probes.joint_probe`), or None."""
        cap = self._bounds.cap_w
        limit = None if cap is None else cap * (1 - self._cfg.explore_margin)
        ps = self._pass
        return joint_probe(ps.center, self._at_center(), ps.axes, self._order, limit, self._samples,
                           flat=self._cfg.joint_flat)

    def _extrapolated_power(self, d: str, hz: int) -> float:
        """A bound on the power at ``hz`` on ``d``'s axis (:func:`axis_power_bound`)."""
        ps = self._pass
        if not self._samples.get(ps.center):
            return 0.0
        return axis_power_bound(ps.axes[d], ps.center[d], self._at_center(), self._progress.prev_axes.get(d), hz,
                                self._samples, slope_factor=self._cfg.slope_factor)

    def _safe(self, ch: Choice, model: PhaseModel, tie: float) -> Choice:
        """``ch``, or under a cap the best point measured so far if ``ch`` is not safe to run
        (its :func:`off_axis_bound` is over the cap)."""
        cap = self._bounds.cap_w
        if cap is None or ch.point in self._samples:
            return ch
        if off_axis_bound(ch.point, self._samples, model) <= cap:
            return ch
        # The next centre: a point with room under the prediction cap, for its sweeps up.
        best, best_m = self._best_measured(model.slowdown_reference_s, cap=cap, tie=tie)
        if best is None or best_m is None:
            return ch
        return Choice(best, best_m, True, True)

    def _choose(self, model: PhaseModel, power_bias_w: float = 0.0) -> Choice:
        b = self._bounds
        return choose(model, slowdown=b.effective_slowdown, power_cap_w=b.cap_w, power_bias_w=power_bias_w,
                      objective=b.objective, conservative=b.cap_w is not None)

    def _end_pass(self) -> OperatingPoint | None:
        model = self._build_model()
        prog = self._progress
        prog.done_passes += 1
        # The next point runs before it is measured: under a cap, judged by the higher of the
        # two power models until the points off the axes have fitted the cross terms.
        # A centre that falls back to a measured point (the model's choice not safe to run) is
        # the least energy among those near the fastest (centre_tie), not the fastest alone:
        # a clock that buys a little time but spends the headroom would leave no room to sweep.
        last = prog.done_passes >= prog.passes
        ch = self._safe(self._choose(model), model, self._cfg.time_tie if last else self._cfg.centre_tie)
        prog.prev_axes = {d: dict(a) for d, a in model.axes.items()}
        prog.prev_center = model.center
        prog.last_model = model
        ch = self._joint_paid(ch, model)
        if prog.done_passes < prog.passes and ch.point != self._pass.center:
            self._pass = self._begin_pass(ch.point, self._span(ch.point))
            return self._pass.center
        prog.model = model
        if self._budget is not None:
            ch = self._budget.watched_choice(model, ch, slowdown=self._bounds.effective_slowdown,
                                             tried=set(self._samples) | set(self._rejected))
        prog.chosen = ch.point
        self._pass.stage = Stage.VERIFY
        return prog.chosen

    def _joint_paid(self, ch: Choice, model: PhaseModel) -> Choice:
        """``ch``, or the pass's joint probe if it measured faster than both ``ch`` and the centre
        (by :attr:`~TunerConfig.joint_paid`) within the measured cap: the joint move paid where no
        single one did, and the next pass sweeps again from there (an extra pass)."""
        probe = self._pass.probe
        prog = self._progress
        if probe is None or not self._samples.get(probe) or prog.extra_passes >= self._cfg.extra_passes:
            return ch
        pm = Measurement.combine(self._samples[probe])
        cap = self._bounds.measured_cap_w
        if pm.seconds < min(ch.predicted.seconds, model.at_center.seconds) * (1 - self._cfg.joint_paid) and (
            cap is None or pm.power_w <= cap
        ):
            prog.extra_passes += 1
            prog.passes += 1
            return replace(ch, point=probe)
        return ch

    def _span(self, point: OperatingPoint) -> dict[str, list[int]]:
        """The next pass's sweep of each domain around ``point``: between the grid levels next to
        it; filling a budget, all the way up (every step up may pay once the other domains
        moved; the cap guard stops the climb)."""
        span: dict[str, list[int]] = {}
        for d in self._order:
            spec = self._specs[d]
            i = spec.index(point[d])
            grid = self._progress.grids[d]
            lo = max([g for g in grid if g < i], default=i)
            hi = min([g for g in grid if g > i], default=i)
            if self._bounds.objective == "time":
                hi = len(spec.available_hz) - 1
            span[d] = list(range(lo, hi + 1))
        return span

    def _after_verify(self) -> OperatingPoint | None:
        prog = self._progress
        assert prog.model is not None and prog.chosen is not None
        if self._budget is not None:
            judged = self._budget.after_verify(prog.chosen, self._samples)
            if judged != prog.chosen:
                # The watched choice did not fit: verify the pass's own choice as usual.
                prog.chosen = judged
                if judged not in self._samples:
                    return judged
        if not self._samples.get(prog.chosen):
            # A watched choice stopped over the budget before it measured anything.
            self._finish_on_best(prog.model)
            return None
        m = self._book.corrected(prog.chosen) or Measurement.combine(self._samples[prog.chosen])
        ref = prog.model.slowdown_reference_s
        retry = self._verify_miss(m)
        if retry is not None:
            return retry
        # Whatever the model predicted, keep the best point actually *measured* within the
        # bounds, over every pass (centres, axis points and verified choices all count).
        best, best_m = self._best_measured(ref)
        if best is None:
            best, best_m = prog.chosen, m
        prog.model = replace(fit_coupling(prog.model, self._book.measured()), best=best, best_measured=best_m)
        prog.done = True
        return None

    def _verify_miss(self, m: Measurement) -> OperatingPoint | None:
        """If the chosen point, measured as ``m``, missed the slowdown bound or the measured cap
        (at most :attr:`~TunerConfig.verify_tries` times): the point chosen again on the model
        refitted with the miss, the bound tightened by the overshoot (None: judge ``m``)."""
        prog = self._progress
        b = self._bounds
        assert prog.model is not None and prog.chosen is not None
        ref = prog.model.slowdown_reference_s
        over = m.seconds / (ref * (1 + b.slowdown)) if b.objective == "energy" else 0.0
        cap_broken = b.measured_cap_w is not None and m.power_w > b.measured_cap_w
        if not (over > 1.0 or cap_broken) or prog.verify_tries >= self._cfg.verify_tries:
            return None
        prog.verify_tries += 1
        # The miss is evidence off the axes: refit the cross terms on it before choosing again.
        prog.model = fit_coupling(prog.model, self._book.measured())
        if over > 1.0:
            b.effective_slowdown = max(
                0.0, b.effective_slowdown - (over - 1.0) * (1 + b.slowdown) - self._cfg.verify_slack)
        bias = max(0.0, m.power_w - prog.model.predict(prog.chosen).power_w) if cap_broken else 0.0
        ch = self._safe(self._choose(prog.model, bias), prog.model, self._cfg.time_tie)
        if ch.point != prog.chosen and ch.point not in self._samples:
            prog.chosen = ch.point
            return ch.point
        return None

    def _finish_on_best(self, model: PhaseModel) -> None:
        """Done, on the best point measured within the bounds (the least power measured if none
        is within the cap), with the model refitted on every measurement."""
        measured = self._book.measured()
        best, best_m = self._best_measured(model.slowdown_reference_s)
        if best is None or best_m is None:
            best, best_m = min(measured, key=lambda pm: pm[1].power_w)
        self._progress.model = replace(fit_coupling(model, measured), best=best, best_measured=best_m)
        self._progress.done = True

    def _best_measured(self, ref: float, cap: float | None = None,
                       tie: float | None = None) -> tuple[OperatingPoint | None, Measurement | None]:
        b = self._bounds
        return best_measured(self._book.measured(), ref=ref, slowdown=b.slowdown,
                             cap=b.measured_cap_w if cap is None else cap,
                             tie=self._cfg.time_tie if tie is None else tie,
                             objective=b.objective, specs=self._specs, energy_tie=self._cfg.energy_tie)

    def _build_model(self) -> PhaseModel:
        ps = self._pass
        prog = self._progress
        at_center = self._book.corrected(ps.center) or self._at_center()
        if prog.done_passes == 0 and self._bounds.cap_w is None:
            # The fastest run at the top clocks: a run slowed by something else (a clock
            # still settling from the point before) must not loosen the bound.
            prog.reference_s = min(m.seconds for m in self._samples[ps.center])
        axes: dict[str, Mapping[int, Measurement]] = {}
        for d in self._order:
            axis = {hz: self._book.corrected(ps.center.with_(d, hz)) or m for hz, m in ps.axes[d].items()}
            axis[ps.center[d]] = at_center
            prev = prog.prev_axes.get(d)
            if prev and prog.prev_center is not None:
                # Carry the wider earlier sweep over, re-based on this centre (a constant drift cancels).
                c_hz = ps.center[d]
                pt = _interp({f: m.seconds for f, m in prev.items()}, c_hz)
                pp = _interp({f: m.power_w for f, m in prev.items()}, c_hz)
                for f, m in prev.items():
                    if f not in axis:
                        axis[f] = Measurement(
                            max(at_center.seconds + m.seconds - pt, 1e-12), max(at_center.power_w + m.power_w - pp, 0.0)
                        )
            axes[d] = MappingProxyType(axis)
        model = PhaseModel(ps.center, at_center, MappingProxyType(axes), prog.reference_s)
        return fit_coupling(model, self._book.measured())

    # -- measurements -------------------------------------------------------------

    def record(self, point: OperatingPoint, measurement: Measurement) -> None:
        """One unit of work measured at ``point`` (points not asked for are ignored); the
        :attr:`measurement_limit`-th ends the tuning (:meth:`finish`)."""
        if self._progress.done:
            return
        self._book.add(point, measurement)
        if self._book.count >= self._limit:
            self.finish()
            return
        if self._budget is not None and self._budget.over_cap(point, measurement):
            # A guarded probe whose run measured over the cap is not run again: the
            # measurement stays (the model learns the step does not fit).
            self.reject(point, measurement.power_w)
        ps = self._pass
        if ps.stage is Stage.CENTRE and point == ps.center:
            ps.stage = Stage.AXES
        elif point != ps.center:
            for d in self._order:
                if point == ps.center.with_(d, point[d]) and point[d] != ps.center[d]:
                    if len(self._samples[point]) >= 1:
                        ps.axes[d][point[d]] = Measurement.combine(self._samples[point])
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
        prog = self._progress
        if prog.done:
            return True
        if self._samples.get(self._pass.center):
            model = self._build_model()
        elif prog.model is not None:
            model = prog.model
        elif prog.last_model is not None:
            model = prog.last_model
        else:
            return False
        self._finish_on_best(model)
        prog.chosen = prog.model.best if prog.model is not None else None
        prog.cut_short = True
        return True

    def measured(self) -> list[tuple[OperatingPoint, Measurement]]:
        """Every point measured so far, with what it measured (not drift-corrected)."""
        return [(p, Measurement.combine(ms)) for p, ms in self._samples.items() if ms]

    @property
    def cut_short(self) -> bool:
        """Ended by :meth:`finish` rather than by converging."""
        return self._progress.cut_short

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains this tuner sweeps."""
        return tuple(self._order)

    @property
    def done(self) -> bool:
        return self._progress.done

    def model(self) -> PhaseModel | None:
        """The tuned model (with ``best`` set) once done, else None."""
        return self._progress.model if self._progress.done else None

    def statistics(self) -> TunerStatistics:
        prog = self._progress
        return TunerStatistics(
            measurements=self._book.count, points=len(self._samples), passes_done=prog.done_passes, done=prog.done,
            measurement_limit=self._limit, cut_short=prog.cut_short,
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
        max_measurements=settings.max_measurements,
        measured_cap_w=settings.measured_cap_w,
        config=settings.config,
    )
