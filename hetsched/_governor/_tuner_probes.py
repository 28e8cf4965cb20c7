"""The auto-tuner's probes beyond its axes: pure functions of what it measured.

* :func:`joint_probe`: work split over domains that run concurrently (a data loader on two
  CPU clusters) is as slow as the slowest: raising either alone shows nothing, raising both
  does. Coordinate descent cannot see that, so each pass of
  :class:`~hetsched._governor._tuner.AxisTuner` measures one joint point too.
* :func:`physically_fits`: whether a step its slope bound refuses may still run as a guarded
  probe under a budget (used by :mod:`._tuner_budget`).
* :func:`faster_trade`: under a budget, a faster point the model predicts within the measured
  cap, for the last pass to verify under watch (used by :mod:`._tuner_budget`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ._model import TIME_TIE, Choice, Measurement, PhaseModel, choose
from ._points import OperatingPoint
from ._tuner_bounds import scaled

__all__ = ["faster_trade", "joint_probe", "physically_fits"]


def joint_probe(
    center: OperatingPoint,
    at_center: Measurement,
    axes: Mapping[str, Mapping[int, Measurement]],
    order: Sequence[str],
    limit_w: float | None,
    samples: Mapping[OperatingPoint, Sequence[Measurement]],
    flat: float = 0.01,
) -> OperatingPoint | None:
    """The centre with every domain whose own axis bought no time (less than ``flat`` of the
    centre's, :attr:`TunerConfig.joint_flat <._tuner_config.TunerConfig.joint_flat>`) raised together (or None:
    fewer than two such domains, or no joint step whose bound fits ``limit_w``).

    ``axes`` is what the pass measured along each domain (centre not included); ``samples``
    every measurement so far (the least power in it bounds the static part, see
    :func:`~._tuner_bounds.scaled`).
    """
    t0 = at_center.seconds
    flat_top: dict[str, int] = {}
    for d in order:
        higher = [hz for hz in axes[d] if hz > center[d]]
        if higher and min(axes[d][hz].seconds for hz in higher) > t0 * (1 - flat):
            flat_top[d] = max(higher)
    if len(flat_top) < 2:
        return None
    p0 = at_center.power_w
    # Highest joint step first; under a cap the first that fits even if the phase gets as
    # much shorter as the largest clock ratio allows, with every domain's energy per unit
    # of work unchanged (the axes alone cannot show how much the joint move shortens it,
    # and the shorter phase draws the same energy faster).
    levels = {d: sorted(hz for hz in axes[d] if hz > center[d]) for d in flat_top}
    steps = max(len(v) for v in levels.values())
    for k in range(steps, 0, -1):
        point = center
        extra = 0.0
        ratio = 1.0
        for d, hzs in levels.items():
            # The same share of each domain's way up, so they stay in step.
            hz = hzs[max(0, round(k / steps * len(hzs)) - 1)]
            point = point.with_(d, hz)
            extra += axes[d][hz].power_w - p0
            ratio = max(ratio, hz / center[d])
        if limit_w is None or scaled(p0 + extra, ratio, samples) <= limit_w:
            return point
    return None


def physically_fits(axis: Mapping[int, Measurement], hz: int, cap_w: float,
                    samples: Mapping[OperatingPoint, Sequence[Measurement]]) -> bool:
    """Whether ``hz`` fits ``cap_w`` by its physical bound alone: the phase's dynamic power at
    the highest clock of ``axis`` below it (the centre included) drawn as much faster as the
    clock ratio allows (:func:`~._tuner_bounds.scaled`). It leaves out the stepped domain's
    own voltage rise, so a point it admits must run watched."""
    below = max((f for f in axis if f < hz), default=None)
    if below is None:
        return False
    return scaled(axis[below].power_w, hz / below, samples) <= cap_w


def faster_trade(model: PhaseModel, ch: Choice, *, slowdown: float, measured_cap_w: float,
                 tried: Collection[OperatingPoint], tie: float = TIME_TIE) -> Choice | None:
    """A point the model predicts faster than ``ch`` (by more than ``tie``) within the
    measured cap rather than the prediction cap (a trade such as a lower memory clock for a
    higher accelerator one, the two axes measured but never together), not ``tried`` yet;
    None if there is none."""
    wide = choose(model, slowdown=slowdown, power_cap_w=measured_cap_w, objective="time", conservative=True)
    if not wide.within_power or wide.point in tried or wide.predicted.seconds >= ch.predicted.seconds * (1 - tie):
        return None
    return wide
