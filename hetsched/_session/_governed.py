"""Session hooks that drive a DVFS governor from what the Session is doing.

``Session(model, governor=gov)`` installs :class:`GovernorHooks`, which tells the
governor the inference phase at each event::

    REQUEST_START                  -> PREPROCESS   (feeds validated and staged)
    BEFORE_STAGE                   -> INFER        (a stage starts on a device)
    AFTER_STAGE, last one running  -> POSTPROCESS  (outputs collected, handed back)
    REQUEST_END, none in flight    -> IDLE

Application code brackets its own pre/post-processing with
``with governor.phase(Phase.PREPROCESS): ...``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from .._events import EventInfo, Hooks

if TYPE_CHECKING:
    from .._governor import Governor, GovernorEngine, Phase

__all__ = ["DWELL_S", "GovernorHooks", "SessionGovernor", "power_budget_w"]

DWELL_S = 0.25
"""Shortest phase a Session-driven governor switches clocks for: at most about four writes per
domain per second, however fast requests come (a 30 fps loop's 33 ms frames hold one point)."""


class SessionGovernor(Protocol):
    """The seam between a session and a governor: what the session layer reads of one.

    :class:`hetsched.Governor` implements it; so may an object of the caller's. What only a
    :class:`hetsched.Governor` has (its engine: the dwell, the clock targets a trace shows; its
    power budget) is read from that class, never looked up by name on another object.
    """

    def on_phase(self, phase: Phase) -> None:
        """The program enters ``phase`` (thread-safe: stage hooks run in device worker threads)."""
        ...

    @property
    def current_phase(self) -> Phase | None:
        """The phase the governor is in (None: none yet); a session's trace reads it back. A
        governor without it still drives clocks (only :meth:`on_phase` is called); a trace then
        has no phase slices for it (the read fails and is skipped, as a closing governor's is)."""
        ...


def power_budget_w(governor: Governor | SessionGovernor) -> float | None:
    """The power budget of a :class:`hetsched.Governor` (the board's); None for another governor."""
    from .._governor import Governor

    return governor.config.power_budget_w if isinstance(governor, Governor) else None


class GovernorHooks(Hooks):
    """Maps Session events to governor phases (see the module docstring).

    ``governor`` is a :class:`SessionGovernor`: ``on_phase(phase)`` (thread-safe: stage
    hooks run in device worker threads), e.g. :class:`hetsched.Governor`. These hooks are how
    a session's trace finds the governors whose phases it traces (:attr:`governor`,
    :attr:`engine`): a hook of the caller's holding a governor is not one of them.

    A Session's phases come once per request, many a second, so a :class:`hetsched.Governor`
    whose engine has no dwell of its own gets ``dwell_s``: phases shorter than that switch no
    clock and the loop's longest working phase (INFER) sets them for the whole request loop
    (``GovernorEngine.dwell_s``). None leaves it as it is.
    """

    def __init__(self, governor: Governor | SessionGovernor, *, dwell_s: float | None = DWELL_S):
        from .._governor import Governor, Phase

        self.governor: SessionGovernor = governor
        self.engine: GovernorEngine | None = governor.engine if isinstance(governor, Governor) else None
        """The engine of a :class:`hetsched.Governor` (its dwell, the clock targets a trace shows);
        None for another governor."""
        if dwell_s is not None and self.engine is not None and self.engine.dwell_s is None:
            self.engine.dwell_s = dwell_s
        self._phase = Phase
        self._lock = threading.Lock()
        self._requests = 0
        self._stages = 0

    def request_start(self, info: EventInfo) -> None:
        with self._lock:
            self._requests += 1
            first = self._requests == 1 and self._stages == 0
        if first:
            self.governor.on_phase(self._phase.PREPROCESS)

    def before_stage(self, info: EventInfo) -> None:
        with self._lock:
            self._stages += 1
        self.governor.on_phase(self._phase.INFER)

    def after_stage(self, info: EventInfo) -> None:
        with self._lock:
            self._stages -= 1
            last = self._stages == 0
        if last:
            self.governor.on_phase(self._phase.POSTPROCESS)

    def request_end(self, info: EventInfo) -> None:
        with self._lock:
            self._requests -= 1
            idle = self._requests == 0 and self._stages == 0
        if idle:
            self.governor.on_phase(self._phase.IDLE)
