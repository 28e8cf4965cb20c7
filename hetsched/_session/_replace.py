"""When a :class:`~hetsched.Runtime` re-places its sessions: the policy and its pure decision.

A session is placed knowing the load the sessions already attached put on each device
(:meth:`Runtime.reservations`). The sessions placed before it did not know its load, and a
session that leaves frees what it held; the sessions' loads also change while they serve.
The runtime's placement monitor samples a :class:`PlacementSnapshot` every
``Replacement.period_s`` and asks :func:`decide_replacement` whether to re-place::

    a session attached and has measured load (its first ``settle_requests``, or ``settle_s``)  ┐
    a session detached                                                                        ├─> re-place
    the reservations drifted more than ``drift`` from those at the last placement             ┘

Hysteresis as in ``_replan.py``: the reservations are compared against those *at the last
placement* (not the last sample), so a load hovering near the threshold does not re-place at
every sample, and two re-placements are at least ``min_interval_s`` apart on the runtime's
clock. A re-placement after an attach leaves out the newcomer (it was placed knowing the others);
the others are re-placed knowing its measured load (of several newcomers measured at once, only the
newest is left out). All times are the runtime's clock's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ._replan import ReplanKind, Trigger

__all__ = ["PlacementSnapshot", "PlacementState", "Replacement", "ReplacementDecision", "SessionLoad",
           "decide_replacement"]


@dataclass(frozen=True)
class Replacement:
    """When the runtime re-places its attached sessions (``Runtime(replacement=...)``; None: never,
    only ``await rt.replace(...)``).

    ::

        hetsched.Runtime(root="/", replacement=hetsched.Replacement(settle_requests=8, drift=0.2))
    """

    on_attach: bool = True
    """Re-place the other sessions once a newly attached one has measured load."""
    on_detach: bool = True
    """Re-place the remaining sessions when one detaches (what it held is free)."""
    settle_requests: int = 16
    """A new session's load counts as measured after this many completed requests ..."""
    settle_s: float = 2.0
    """... or this many runtime-clock seconds after it attached (with at least one completed)."""
    drift: float | None = 0.25
    """Re-place when a session's busy share on a device moved more than this (absolute, 0..1)
    from its share at the last placement; None: no drift trigger."""
    min_interval_s: float = 2.0
    """Runtime-clock seconds between two re-placements (attach, detach or drift)."""
    period_s: float = 0.5
    """Seconds between two samples of the sessions' loads by the runtime's placement monitor."""

    def __post_init__(self) -> None:
        if isinstance(self.settle_requests, bool) or not isinstance(self.settle_requests, int) \
                or self.settle_requests < 1:
            raise ValueError(f"Replacement.settle_requests must be an int >= 1, got {self.settle_requests!r}")
        for name in ("settle_s", "min_interval_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"Replacement.{name} must be a finite number of seconds >= 0, got {v!r}")
        if isinstance(self.period_s, bool) or not isinstance(self.period_s, (int, float)) \
                or not (math.isfinite(self.period_s) and self.period_s > 0):
            raise ValueError(f"Replacement.period_s must be a positive number of seconds, got {self.period_s!r}")
        if self.drift is not None and (isinstance(self.drift, bool) or not isinstance(self.drift, (int, float))
                                       or not 0 < self.drift <= 1):
            raise ValueError(f"Replacement.drift must be in (0, 1] or None, got {self.drift!r}")


@dataclass(frozen=True)
class SessionLoad:
    """One attached session in a :class:`PlacementSnapshot`."""

    name: str
    attached_at: float
    completed: int
    busy_share: Mapping[str, float]
    """Per device, the share of the runtime's time its stages kept the device busy (its
    :class:`~hetsched.policies.Reservation`'s)."""


@dataclass(frozen=True)
class PlacementSnapshot:
    """What :func:`decide_replacement` reads: the runtime clock's time and the attached sessions."""

    now: float
    sessions: tuple[SessionLoad, ...]


@dataclass(frozen=True)
class PlacementState:
    """The decision's memory: the loads at the last placement, when it was, and the attaches and
    detaches not yet acted on."""

    baseline: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: MappingProxyType({}))
    last_at: float | None = None
    attached: frozenset[str] = frozenset()
    """Sessions attached since the last placement, waiting for their measured load."""
    detached: tuple[str, ...] = ()
    """Sessions detached since the last placement."""

    def with_attach(self, name: str) -> PlacementState:
        return PlacementState(self.baseline, self.last_at, self.attached | {name}, self.detached)

    def with_detach(self, name: str) -> PlacementState:
        return PlacementState(self.baseline, self.last_at, self.attached - {name}, (*self.detached, name))


@dataclass(frozen=True)
class ReplacementDecision:
    """Re-place every attached session but ``skip``, for ``trigger``."""

    trigger: Trigger
    skip: frozenset[str] = frozenset()


def _shares(snapshot: PlacementSnapshot) -> Mapping[str, Mapping[str, float]]:
    return MappingProxyType({s.name: MappingProxyType(dict(s.busy_share)) for s in snapshot.sessions})


def placed(snapshot: PlacementSnapshot, state: PlacementState) -> PlacementState:
    """The state once a placement of ``snapshot``'s sessions happened (its new baseline)."""
    return PlacementState(_shares(snapshot), snapshot.now, frozenset(), ())


def _drifted(config: Replacement, snapshot: PlacementSnapshot, state: PlacementState,
             ) -> tuple[float, str, str] | None:
    if config.drift is None:
        return None
    worst: tuple[float, str, str] | None = None
    for s in snapshot.sessions:
        before = state.baseline.get(s.name)
        if before is None or s.name in state.attached:
            continue  # a newcomer: the attach trigger's business
        for dev in sorted({*s.busy_share, *before}):
            off = abs(s.busy_share.get(dev, 0.0) - before.get(dev, 0.0))
            if off > config.drift and (worst is None or off > worst[0]):
                worst = (off, s.name, dev)
    return worst


def decide_replacement(config: Replacement, state: PlacementState, snapshot: PlacementSnapshot,
                       ) -> tuple[PlacementState, ReplacementDecision | None]:
    """The next state and whether to re-place (None: keep every plan). Pure.

    Order of the triggers: a detach (what it held is free now), then newcomers whose load is
    measured (every session is re-placed knowing it but the newest of them, which was placed
    knowing all the others), then drift. None within ``min_interval_s`` of the last placement,
    nor with fewer than one session to re-place.
    """
    present = {s.name: s for s in snapshot.sessions}
    state = PlacementState(state.baseline, state.last_at, frozenset(n for n in state.attached if n in present),
                           state.detached)
    if not snapshot.sessions:
        return PlacementState(MappingProxyType({}), state.last_at, frozenset(), ()), None
    if state.last_at is not None and snapshot.now - state.last_at < config.min_interval_s:
        return state, None
    if state.detached and config.on_detach:
        names = ", ".join(state.detached)
        return placed(snapshot, state), ReplacementDecision(
            Trigger(ReplanKind.PLACEMENT, f"session(s) {names} detached"), frozenset())
    if config.on_attach:
        ready = sorted(n for n in state.attached
                       if present[n].completed >= config.settle_requests
                       or (present[n].completed >= 1 and snapshot.now - present[n].attached_at >= config.settle_s))
        if ready:
            # the newest of them was placed knowing every other session: it stays; the others
            # (older sessions, and newcomers placed before it) are re-placed knowing its load
            newest = max(ready, key=lambda n: (present[n].attached_at, n))
            pending = state.attached - set(ready)
            if len(snapshot.sessions) < 2:  # alone on the board: its load is the baseline
                return PlacementState(_shares(snapshot), state.last_at, pending, ()), None
            names = ", ".join(f"{n} ({present[n].completed} requests measured)" for n in ready)
            new = placed(snapshot, state)
            return PlacementState(new.baseline, new.last_at, pending, ()), ReplacementDecision(
                Trigger(ReplanKind.PLACEMENT, f"session(s) {names} attached"), frozenset({newest}))
    if not config.on_detach:
        state = PlacementState(state.baseline, state.last_at, state.attached, ())
    worst = _drifted(config, snapshot, state)
    if worst is not None:
        _, name, dev = worst
        before, now = state.baseline[name].get(dev, 0.0), present[name].busy_share.get(dev, 0.0)
        return placed(snapshot, state), ReplacementDecision(Trigger(
            ReplanKind.PLACEMENT,
            f"load drift: session {name!r} busy share on {dev} {before:.2f} -> {now:.2f} (more than {config.drift:g})"))
    return state, None
