"""Filling a power budget to its edge: the optional strategy on top of the axis tuner.

:class:`~._tuner.AxisTuner` alone keeps every point it has not measured a margin under the
cap by a power *bound* (:mod:`._tuner_bounds`). On a sparse clock table that bound refuses
whole steps that would fit (a memory clock that more than triples in one step: no slope
bound admits it near the cap), and tuning leaves part of the budget unused. With
:class:`BudgetFilling` (``GovernorConfig.guarded_probes``, on by default) it also:

* runs **guarded probes**: a step up an axis whose slope bound is over the margin but whose
  *physical* bound (:func:`~._tuner_probes.physically_fits`) fits the measured cap. Its
  driver watches the power while it runs and calls :meth:`Tuner.reject
  <hetsched._governor._tuner_seam.Tuner.reject>` at the first reading over the cap; a probe
  whose run measured over the cap is not run again (:meth:`BudgetFilling.over_cap`);
* verifies a **watched choice** at the end: a **faster trade** the model predicts within
  the measured cap (:func:`~._tuner_probes.faster_trade`: a lower clock on one domain for a
  higher one on another, the two axes measured but never together), run as a guarded probe,
  the pass's own choice verified instead if it does not fit (:meth:`BudgetFilling.after_verify`).

The driver's half is the **settled lead-in** (:func:`settled`, :func:`lead_in_floor`): a unit
whose clocks were raised as it began ran its first moments at the old ones, so its mean power
understates what it settles at; :class:`~._tuning.PhaseTuning` hands the tuner the bound on
the settled power instead.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from ._model import Choice, Measurement, Objective, PhaseModel
from ._points import OperatingPoint
from ._tuner_probes import faster_trade, physically_fits

__all__ = ["BudgetFilling", "lead_in_floor", "settled"]


class BudgetFilling:
    """The guarded probes and the watched choice of one tuner under a budget (see the module
    docstring). ``measured_cap_w``: what a point's *measured* power may reach."""

    def __init__(self, measured_cap_w: float, objective: Objective, *, time_tie: float) -> None:
        self.measured_cap_w = measured_cap_w
        self._objective = objective
        self._time_tie = time_tie
        self._guarded: set[OperatingPoint] = set()
        self._fallback: OperatingPoint | None = None
        """The pass's own choice while a watched one is verified."""

    def admit(self, center: OperatingPoint, domain: str, hz: int, axis: Mapping[int, Measurement],
              samples: Mapping[OperatingPoint, Sequence[Measurement]]) -> bool:
        """Whether ``hz``, a step up ``domain``'s axis from ``center`` that its slope bound
        refuses, runs as a guarded probe: its physical bound from what this pass measured
        along ``axis`` below it (the centre included) fits the measured cap. An admitted
        point is :meth:`guarded` from now on."""
        at_center = samples.get(center)
        if not at_center:
            return False
        below = {f: m for f, m in axis.items() if f < hz}
        below[center[domain]] = Measurement.combine(at_center)
        if not physically_fits(below, hz, self.measured_cap_w, samples):
            return False
        self._guarded.add(center.with_(domain, hz))
        return True

    def guarded(self, point: OperatingPoint) -> bool:
        """Whether ``point`` runs watched (see :meth:`AxisTuner.guarded
        <hetsched._governor._tuner.AxisTuner.guarded>`)."""
        return point in self._guarded

    def discard(self, point: OperatingPoint) -> None:
        """``point`` was rejected: it is no longer watched (it never runs again)."""
        self._guarded.discard(point)

    def over_cap(self, point: OperatingPoint, measurement: Measurement) -> bool:
        """Whether a guarded probe's run measured over the cap (the tuner then rejects it; the
        measurement stays, so the model learns that the step does not fit)."""
        return point in self._guarded and measurement.power_w > self.measured_cap_w

    def watched_choice(self, model: PhaseModel, ch: Choice, *, slowdown: float,
                       tried: Collection[OperatingPoint]) -> Choice:
        """The point to verify at the end: ``ch``, or a faster trade (not ``tried`` yet) run as a
        guarded probe, ``ch`` kept to verify if the trade does not fit."""
        if self._objective != "time":
            return ch
        wide = faster_trade(model, ch, slowdown=slowdown, measured_cap_w=self.measured_cap_w, tried=tried,
                            tie=self._time_tie)
        if wide is None:
            return ch
        self._guarded.add(wide.point)
        self._fallback = ch.point
        return wide

    def after_verify(self, chosen: OperatingPoint,
                     samples: Mapping[OperatingPoint, Sequence[Measurement]]) -> OperatingPoint:
        """The point to judge now that ``chosen`` ran: ``chosen``, or the pass's own choice if
        ``chosen`` was a watched choice that did not fit (stopped, or measured over the cap).
        Once only: the fallback is then spent."""
        fallback, self._fallback = self._fallback, None
        if fallback is None:
            return chosen
        ms = samples.get(chosen)
        if not ms or Measurement.combine(ms).power_w > self.measured_cap_w:
            return fallback
        return chosen


def settled(m: Measurement, lead_s: float, floor_w: float | None) -> Measurement:
    """``m`` with its power raised to a bound on what it draws once its clocks have switched.

    A unit whose clocks were raised as it began ran its first ``lead_s`` (the slowest raised
    domain's transition latency) at the old, lower ones: its mean understates the power it
    settles at, by the share of the unit the lead-in took, and a budget is broken by the
    settled power, not the mean. The lead-in drew at least ``floor_w`` (:func:`lead_in_floor`),
    so the rest of the unit drew at most ``(E - floor_w * lead_s) / (seconds - lead_s)``.
    Unchanged without a lead-in, without a floor, or when the switch had not landed by the end
    of the unit.
    """
    if lead_s <= 0 or floor_w is None or m.seconds <= lead_s:
        return m
    rest = (m.energy_j - min(floor_w, m.power_w) * lead_s) / (m.seconds - lead_s)
    return Measurement(m.seconds, max(m.power_w, rest))


def lead_in_floor(measured: Iterable[tuple[OperatingPoint, Measurement]], lead_in: OperatingPoint) -> float | None:
    """A lower bound on the phase's power during a lead-in at ``lead_in`` (every raised domain
    still at its old clock): the most power measured at a point with no clock above
    ``lead_in``'s (the same work at lower clocks draws no more), None if none is known."""
    best: float | None = None
    for y, m in measured:
        if all(hz <= (lead_in.get(d) or hz) for d, hz in y.items()):
            best = m.power_w if best is None else max(best, m.power_w)
    return best
