"""When a serving session re-plans: the triggers (pure decisions) and their configuration.

The session's monitor task samples the board every ``Replanning.period_s`` and asks
:func:`decide_replan` whether the plan in use still fits it::

    states now (DeviceState per device, from telemetry)  ┐
    the flags at the last plan (hot devices, tight power) ├─> decide_replan ─> (flags, reason | None)
    measured stage costs vs the plan's estimates          ┘

Each trigger has hysteresis, so a board hovering at a threshold does not re-plan at every
sample: a device becomes *hot* when its temperature headroom falls below ``temp_low`` and
cool again only above ``temp_high``; power is *tight* below ``power_low`` and loose again
above ``power_high``. A flag flipping either way re-plans (a cooled device may take its
work back). Measured stage times drifting from the plan's estimates by more than
``drift_factor`` (either way, once each stage has ``drift_min_runs`` runs) re-plan with the
measured costs. Re-plans are at least ``min_interval_s`` apart. Device failures re-plan at
once (see ``hetsched/_runtime/_failover.py``), as does ``await session.replan(reason=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hetsched.policies import DeviceState

from .._compat import StrEnum
from .._events import ReplanInfo

__all__ = ["ReplanFlags", "ReplanKind", "ReplanStatistics", "Replanning", "Trigger", "decide_replan", "drift_reason"]


@dataclass(frozen=True)
class Replanning:
    """How a session adapts its plan while serving (``Session(replanning=...)``; None = never).

    Headrooms are the fractions of :class:`hetsched.policies.DeviceState` (1 = cool / idle).
    """

    period_s: float = 0.5
    """Seconds between two samples of the board (the monitor runs only on a root with telemetry)."""
    temp_low: float = 0.10
    temp_high: float = 0.25
    power_low: float = 0.05
    power_high: float = 0.15
    drift_factor: float = 1.5
    drift_min_runs: int = 32
    drift_grace_s: float = 5.0
    """Seconds from the session's start (by its clock) before drift may re-plan: the first runs
    include warm-up (a toolkit context starting, caches filling, a governor raising clocks), not
    a board that changed."""
    min_interval_s: float = 2.0
    quarantine_after: int = 3
    """Consecutive failed stage runs that take a device out of the plan (see the failover)."""

    def __post_init__(self) -> None:
        if not (self.period_s > 0 and math.isfinite(self.period_s)):
            raise ValueError(f"Replanning.period_s must be a positive number, got {self.period_s!r}")
        for lo, hi, name in ((self.temp_low, self.temp_high, "temp"), (self.power_low, self.power_high, "power")):
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError(f"Replanning.{name}_low/{name}_high must satisfy 0 <= low <= high <= 1, "
                                 f"got {lo!r} / {hi!r}")
        if not self.drift_factor > 1.0:
            raise ValueError(f"Replanning.drift_factor must be > 1, got {self.drift_factor!r}")
        if self.quarantine_after < 1:
            raise ValueError(f"Replanning.quarantine_after must be >= 1, got {self.quarantine_after!r}")
        if not (self.drift_grace_s >= 0 and math.isfinite(self.drift_grace_s)):
            raise ValueError(f"Replanning.drift_grace_s must be a finite number >= 0, got {self.drift_grace_s!r}")
        if self.min_interval_s < 0:
            raise ValueError(f"Replanning.min_interval_s must be >= 0, got {self.min_interval_s!r}")


class ReplanKind(StrEnum):
    """What made a session re-plan (the keys of :attr:`ReplanStatistics.reasons`). Each trigger
    names its kind; nothing is inferred from a reason's text."""

    REQUESTED = "requested"
    """``Session.replan()`` (or ``Runtime.replace()``'s caller)."""
    THERMAL = "thermal"
    POWER = "power"
    DRIFT = "drift"
    """A stage's measured time left its estimate (``Replanning.drift_factor``)."""
    FAILURE = "failure"
    """A device was quarantined after repeated failures."""
    PROFILE = "profile"
    """``Session.profile()`` measured every unit."""
    PLACEMENT = "placement"
    """``Runtime.replace()``: joint placement with the other sessions' load."""
    BACKGROUND_COMPILE = "background compile"
    """The devices left out of the opening plan (``Adaptation.background_compile``) are ready."""


@dataclass(frozen=True)
class Trigger:
    """Why to re-plan: the kind (for counting) and a sentence (for humans)."""

    kind: ReplanKind
    reason: str


@dataclass(frozen=True)
class ReplanFlags:
    """The trigger state at the last plan: which devices were hot, whether power was tight."""

    hot: frozenset[str] = frozenset()
    power_tight: bool = False


@dataclass(frozen=True)
class ReplanStatistics:
    """Re-plans of a session (part of :class:`hetsched.SessionStatistics`)."""

    replans: int = 0
    """Plans installed while serving (the opening plan not counted)."""
    last_reason: str | None = None
    reasons: Mapping[str, int] = field(default_factory=dict)
    """Re-plans per trigger kind (a :class:`ReplanKind`, a ``str``: ``"requested"``, ``"thermal"``,
    ``"power"``, ``"drift"``, ``"failure"``, ``"profile"``, ``"placement"``, ``"background compile"``)."""
    failed: int = 0
    """Re-plans that found no plan (the previous plan stayed in place)."""
    last_error: str | None = None
    history: tuple[ReplanInfo, ...] = ()
    """Every re-plan installed, in order: its reason, number, units moved, devices left out and
    seconds (what ``REPLAN`` hooks were told), so a run's summary can name each one."""
    errors: tuple[str, ...] = ()
    """Every re-plan that found no plan, as ``"<reason>: <error>"``, in order."""


def decide_replan(config: Replanning, flags: ReplanFlags, states: Mapping[str, DeviceState],
                  used: frozenset[str] | None = None) -> tuple[ReplanFlags, Trigger | None]:
    """The flags for ``states`` and the trigger to re-plan (None: keep the plan).

    ``used``: the devices the plan runs stages on; a device becoming hot re-plans only if
    the plan uses it, a device cooling down always (it may take work back). Pure.
    """
    hot = set(flags.hot)
    heated: list[str] = []
    cooled: list[str] = []
    for name, st in states.items():
        if name in hot:
            if st.temp_headroom > config.temp_high:
                hot.discard(name)
                cooled.append(name)
        elif st.temp_headroom < config.temp_low:
            hot.add(name)
            if used is None or name in used:
                heated.append(name)
    power = min((st.power_headroom for st in states.values()), default=1.0)
    tight = flags.power_tight
    power_reason = None
    if tight and power > config.power_high:
        tight = False
        power_reason = f"power: headroom back to {power:.2f} (above {config.power_high:.2f})"
    elif not tight and power < config.power_low:
        tight = True
        power_reason = f"power: headroom {power:.2f} below {config.power_low:.2f}"
    new = ReplanFlags(frozenset(hot), tight)
    if heated:
        detail = ", ".join(f"{n} {states[n].temp_headroom:.2f}" for n in sorted(heated))
        return new, Trigger(ReplanKind.THERMAL,
                            f"thermal: temperature headroom below {config.temp_low:.2f} on {detail}")
    if cooled:
        detail = ", ".join(f"{n} {states[n].temp_headroom:.2f}" for n in sorted(cooled))
        return new, Trigger(ReplanKind.THERMAL,
                            f"thermal: temperature headroom back above {config.temp_high:.2f} on {detail}")
    return new, Trigger(ReplanKind.POWER, power_reason) if power_reason is not None else None


def drift_reason(config: Replanning, estimates: Mapping[str, float], measured: Mapping[str, tuple[float, int]],
                 elapsed_s: float | None = None) -> str | None:
    """A reason to re-plan when a stage's measured time (seconds, runs) left its estimate by
    more than ``drift_factor`` either way, once it ran ``drift_min_runs`` times and (when
    ``elapsed_s``, the seconds since the session started, is given) ``drift_grace_s`` passed. Pure."""
    if elapsed_s is not None and elapsed_s < config.drift_grace_s:
        return None
    worst: tuple[float, str, float, float] | None = None
    for name, est in estimates.items():
        got = measured.get(name)
        if got is None or got[1] < config.drift_min_runs or not est > 0 or not got[0] > 0:
            continue
        ratio = got[0] / est
        off = max(ratio, 1.0 / ratio)
        if off > config.drift_factor and (worst is None or off > worst[0]):
            worst = (off, name, got[0], est)
    if worst is None:
        return None
    _, name, got_s, est_s = worst
    return (f"drift: stage {name!r} measured {got_s * 1e3:.3g} ms per run against {est_s * 1e3:.3g} ms "
            f"planned (more than {config.drift_factor:g}x off)")
