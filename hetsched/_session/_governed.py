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
from typing import Any

from .._events import EventInfo, Hooks

__all__ = ["DWELL_S", "GovernorHooks"]

DWELL_S = 0.25
"""Shortest phase a Session-driven governor switches clocks for: at most about four writes per
domain per second, however fast requests come (a 30 fps loop's 33 ms frames hold one point)."""


class GovernorHooks(Hooks):
    """Maps Session events to governor phases (see the module docstring).

    ``governor`` needs ``on_phase(phase)`` (thread-safe: stage hooks run in device
    worker threads), e.g. :class:`hetsched.Governor`.

    A Session's phases come once per request, many a second, so a governor with an engine
    (:class:`hetsched.Governor`) that has no dwell of its own gets ``dwell_s``: phases
    shorter than that switch no clock and the loop's longest working phase (INFER) sets
    them for the whole request loop (``GovernorEngine.dwell_s``). None leaves it as it is.
    """

    def __init__(self, governor: Any, *, dwell_s: float | None = DWELL_S):
        from .._governor import Phase

        self.governor = governor
        engine = getattr(governor, "engine", None)
        if dwell_s is not None and engine is not None and getattr(engine, "dwell_s", 0.0) is None:
            engine.dwell_s = dwell_s
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
