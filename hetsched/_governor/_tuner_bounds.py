"""Power bounds the auto-tuner keeps a power cap with: pure functions of what it measured.

Under a power cap every point not measured yet must have a power *bound* (not a
prediction) at least the tuner's explore margin under the cap before it runs: along an
axis the top two points' slope doubled (:func:`axis_power_bound`), and never less than the
phase drawing its dynamic power as much faster as the clock ratio allows (:func:`scaled`);
off the axes (joint probe, next centre) the same from a measured point below it
(:func:`off_axis_bound`). So tuning keeps to the budget, at the price of the last few
percent of it on coarse tables (a step of a sparse table, such as a memory clock that more
than triples, that no slope bound admits near the cap); the physical bound, :func:`scaled`
alone, admits such a step as a guarded probe (:mod:`._tuner_budget`).

The bound on effort is here too (:func:`measurement_limit`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from ._model import Measurement, PhaseModel, _interp
from ._points import DomainSpec, OperatingPoint

__all__ = ["axis_power_bound", "measurement_limit", "off_axis_bound", "scaled"]


def scaled(power_w: float, ratio: float, samples: Mapping[OperatingPoint, Sequence[Measurement]]) -> float:
    """``power_w`` with everything above the least power in ``samples`` (an upper bound on
    the static part) drawn ``ratio`` times faster."""
    floor = min((m.power_w for ms in samples.values() for m in ms), default=0.0)
    floor = min(floor, power_w)
    return floor + (power_w - floor) * ratio


def axis_power_bound(
    axis: Mapping[int, Measurement],
    center_hz: int,
    at_center: Measurement,
    prev: Mapping[int, Measurement] | None,
    hz: int,
    samples: Mapping[OperatingPoint, Sequence[Measurement]],
    slope_factor: float = 2.0,
) -> float:
    """A bound on the power at ``hz`` on one domain's axis.

    ``axis`` is what this pass measured along it, the centre (``center_hz``, measured as
    ``at_center``) not included; ``prev`` an earlier pass's sweep of it (or None).

    Between points this pass measured: interpolated. Above them: extrapolated from the
    top two with their slope times ``slope_factor`` (:attr:`TunerConfig.slope_factor
    <._tuner_config.TunerConfig.slope_factor>`), or scaled from the centre alone, and never below what the earlier pass's
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
        # hides its peaks: a steeper slope than the last step's.
        bound = max(bound, p2 + slope_factor * slope * (hz - f2))
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


def measurement_limit(specs: Iterable[DomainSpec], levels: int, passes: int, repeats: int, *,
                      spare_passes: int = 2, spare_runs: int = 4) -> int:
    """The most measurements a tune takes: room for every pass it may run (centres, axes,
    re-checks, joint probes, ``spare_passes`` passes more than asked, ``spare_runs`` for the
    verifications), each point ``repeats`` times. The tuner that reaches it ends on the best
    point measured."""
    per_pass = sum(min(levels, len(s.available_hz)) + 1 for s in specs) + 2
    return repeats * ((passes + spare_passes) * per_pass + spare_runs)
