"""Power bounds the auto-tuner keeps a power cap with: pure functions of what it measured.

Under a power cap every point not measured yet must have a power *bound* (not a
prediction) at least the tuner's explore margin under the cap before it runs: along an
axis the top two points' slope doubled (:func:`axis_power_bound`), and never less than the
phase drawing its dynamic power as much faster as the clock ratio allows (:func:`scaled`);
off the axes (joint probe, next centre) the same from a measured point below it
(:func:`off_axis_bound`). So tuning keeps to the budget, at the price of the last few
percent of it on coarse tables (Orin's EMC steps 665 -> 2133 MHz: no such bound lets that
step be tried at 10 W; the physical bound, :func:`scaled` alone, admits it as a guarded
probe: :meth:`AxisTuner.guarded <hetsched._governor._tuner.AxisTuner.guarded>`).

A unit of work whose clocks were raised as it began runs its first moments at the old
ones: under a budget its mean understates the power it settles at (:func:`settled`).

The bound on effort is here too (:func:`measurement_limit`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from ._model import Measurement, PhaseModel, _interp
from ._points import DomainSpec, OperatingPoint

__all__ = ["axis_power_bound", "lead_in_floor", "measurement_limit", "off_axis_bound", "scaled", "settled"]


def scaled(power_w: float, ratio: float, samples: Mapping[OperatingPoint, Sequence[Measurement]]) -> float:
    """``power_w`` with everything above the least power in ``samples`` (an upper bound on
    the static part) drawn ``ratio`` times faster."""
    floor = min((m.power_w for ms in samples.values() for m in ms), default=0.0)
    floor = min(floor, power_w)
    return floor + (power_w - floor) * ratio


def settled(m: Measurement, lead_s: float, floor_w: float | None) -> Measurement:
    """``m`` with its power raised to a bound on what it draws once its clocks have switched.

    A unit whose clocks were raised as it began ran its first ``lead_s`` (the slowest raised
    domain's transition latency) at the old, lower ones: a 34 ms optimizer step that raises
    the EMC 8 ms late reads a mean a tenth under the power it settles at, and a budget is
    broken by the settled power, not the mean. The lead-in drew at least ``floor_w``
    (:func:`lead_in_floor`), so the rest of the unit drew at most
    ``(E - floor_w * lead_s) / (seconds - lead_s)``. Unchanged without a lead-in, without a
    floor, or when the switch had not landed by the end of the unit.
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


def axis_power_bound(
    axis: Mapping[int, Measurement],
    center_hz: int,
    at_center: Measurement,
    prev: Mapping[int, Measurement] | None,
    hz: int,
    samples: Mapping[OperatingPoint, Sequence[Measurement]],
) -> float:
    """A bound on the power at ``hz`` on one domain's axis.

    ``axis`` is what this pass measured along it, the centre (``center_hz``, measured as
    ``at_center``) not included; ``prev`` an earlier pass's sweep of it (or None).

    Between points this pass measured: interpolated. Above them: extrapolated from the
    top two (or scaled from the centre alone), and never below what the earlier pass's
    sweep, re-based on this centre, shows there (that sweep ran with the other domains
    elsewhere: the shift is separable, the cross terms are not, so it cannot stand alone).
    """
    axis = dict(axis)
    axis[center_hz] = at_center
    rebased: dict[int, float] = {}
    if prev:
        pp = _interp({f: m.power_w for f, m in prev.items()}, center_hz)
        rebased = {f: at_center.power_w + m.power_w - pp for f, m in prev.items()}
    if any(f >= hz for f in axis):
        return _interp({f: m.power_w for f, m in axis.items()}, hz)
    pts = sorted(f for f in axis if f < hz)[-2:]
    f2 = pts[-1]
    p2 = axis[f2].power_w
    # A faster clock may shorten the phase by up to its ratio, the other domains' work
    # then drawn over less time: their share at least that much more.
    bound = scaled(p2, hz / f2, samples)
    if len(pts) == 2:
        f1 = pts[0]
        slope = max((p2 - axis[f1].power_w) / (f2 - f1), 0.0)
        # Power grows faster than linearly above the voltage knee, and a phase mean
        # hides its peaks: twice the slope.
        bound = max(bound, p2 + 2.0 * slope * (hz - f2))
    if rebased and any(f >= hz for f in rebased):
        bound = max(bound, _interp(rebased, hz))
    return bound


def off_axis_bound(
    point: OperatingPoint, samples: Mapping[OperatingPoint, Sequence[Measurement]], model: PhaseModel
) -> float:
    """A bound on the power at ``point`` (inf: none known).

    The model's prediction off its axes is no bound: the least over measured points with
    no clock above ``point``'s, each raised along the model's axes to ``point`` and drawn
    as much faster as the largest clock ratio allows (:func:`scaled`).
    """
    bound = math.inf
    for y, ms in samples.items():
        if not ms or any((y.get(d) or hz) > hz for d, hz in point.items()):
            continue
        p = Measurement.combine(ms).power_w
        ratio = 1.0
        for d, hz in point.items():
            yd = y.get(d)
            if yd is None or yd == hz or d not in model.axes:
                continue
            axis = {f: m.power_w for f, m in model.axes[d].items()}
            p += max(0.0, _interp(axis, hz) - _interp(axis, yd))
            ratio = max(ratio, hz / yd)
        bound = min(bound, scaled(p, ratio, samples))
    return bound


def measurement_limit(specs: Iterable[DomainSpec], levels: int, passes: int, repeats: int) -> int:
    """The most measurements a tune takes: generous room for every pass it may run (centres,
    axes, re-checks, joint probes, two passes more than asked, the verifications), each point
    ``repeats`` times. The tuner that reaches it ends on the best point measured."""
    per_pass = sum(min(levels, len(s.available_hz)) + 1 for s in specs) + 2
    return repeats * ((passes + 2) * per_pass + 4)
