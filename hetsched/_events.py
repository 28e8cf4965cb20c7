"""Runtime events and hooks.

Hooks subclass :class:`Hooks` and override the methods named like the events they
want. Only overridden methods are registered (trio's ``Instrument`` rule), so an
event nobody listens to costs one falsy check on the hot path.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ._compat import StrEnum

__all__ = ["CompileInfo", "Event", "EventInfo", "HookDispatcher", "Hooks", "Priority", "ReplanInfo"]


class Priority(enum.IntEnum):
    """Request priority; smaller is more urgent. Within a priority requests are FIFO."""

    REALTIME = 0
    HIGH = 1
    NORMAL = 2
    BACKGROUND = 3


class Event(StrEnum):
    """Events of a Session, in the order they fire::

        async with Session(model) as s:          # opening (and each re-plan, e.g. Session.profile):
                                                 #   for stage of the plan, in parallel (then for each
                                                 #   unit of a refused stage, alone, as a trial):
                                                 #     BEFORE_COMPILE
                                                 #     device.compile(stage)
                                                 #     AFTER_COMPILE (also after a failing compile,
                                                 #                    with .error set)
                                                 # then SESSION_START (opening only)
            await s.run(feeds)                   # REQUEST_START
                for stage in ready stages (most urgent first, per device):
                    for tensor crossing a memory domain:
                        # BEFORE_TRANSFER
                        copy chunks ...          # PREEMPTED / RESUMED around a higher-priority copy
                        # AFTER_TRANSFER
                    # BEFORE_STAGE
                    outputs = device.run(stage)
                    # AFTER_STAGE                (also after a failing stage, with .error set)
                # REQUEST_END                    (also on failure/cancellation, with .error set)
            # REPLAN                         (whenever a new plan is installed while serving)
        # SESSION_END

    Attributes:
        BEFORE_COMPILE / AFTER_COMPILE: in a compile thread, around one stage's compile for
            its device; ``extra`` is a :class:`hetsched.CompileInfo` (``AFTER_COMPILE``'s
            ``elapsed_s`` is the compile's seconds).
        SESSION_START: the session planned, compiled and started its workers.
        REQUEST_START / REQUEST_END: around one ``run`` call.
        BEFORE_STAGE / AFTER_STAGE: in the device's worker thread, around one stage run;
            ``AFTER_STAGE``'s ``extra`` is a :class:`hetsched.StageIO` (input and output
            addresses, for checking zero-copy hand-offs).
        BEFORE_TRANSFER / AFTER_TRANSFER: around a cross-domain copy, in the event loop;
            ``extra`` is a :class:`hetsched.TransferInfo`.
        PREEMPTED / RESUMED: a low-priority copy was soft-suspended / resumed (``extra`` as above).
            A more urgent *stage* overtaking queued ones at a stage boundary is the scheduler's
            normal order and fires no event.
        REPLAN: a new plan is in place while serving (``Session.replan``, a device heating up or
            failing, measured costs drifting from the plan's); ``extra`` is a
            :class:`hetsched.ReplanInfo` with the reason. Requests admitted from then on use
            it; those in flight finish on the old plan, whose stages close when drained.
        SESSION_END: workers stopped; fires even when the session exits with an error.
    """

    BEFORE_COMPILE = "before_compile"
    AFTER_COMPILE = "after_compile"
    SESSION_START = "session_start"
    REQUEST_START = "request_start"
    BEFORE_TRANSFER = "before_transfer"
    AFTER_TRANSFER = "after_transfer"
    PREEMPTED = "preempted"
    RESUMED = "resumed"
    BEFORE_STAGE = "before_stage"
    AFTER_STAGE = "after_stage"
    REQUEST_END = "request_end"
    REPLAN = "replan"
    SESSION_END = "session_end"

    @property
    def is_before(self) -> bool:
        return self.value.startswith("before_") or self.value.endswith("_start")

    @property
    def is_after(self) -> bool:
        return self.value.startswith("after_") or self.value.endswith("_end")


@dataclass(frozen=True, slots=True)
class EventInfo:
    """What a hook is told. Fields that do not apply to an event are None."""

    event: Event
    time_s: float
    request_id: int | None = None
    priority: Priority | None = None
    stage: str | None = None
    device: str | None = None
    elapsed_s: float | None = None
    nbytes: int | None = None
    error: BaseException | None = None
    extra: Any = None
    energy_j: float | None = None
    """Joules: of this stage run (``AFTER_STAGE``) or of the request's stage runs
    (``REQUEST_END``), where the backends report energy (a twin's modelled figure)."""


@dataclass(frozen=True, slots=True)
class CompileInfo:
    """The ``extra`` of ``BEFORE_COMPILE``/``AFTER_COMPILE``: which compile of how many.

    Compiles come in batches (a plan's stages; the unit trials after a refused stage), each
    compiled concurrently, so their events may interleave and arrive in any order.
    """

    stage: str
    device: str
    index: int
    """This compile's position in its batch, from 0."""
    total: int
    """The compiles in the batch."""
    seconds: float | None = None
    """Seconds the compile took (``AFTER_COMPILE`` only)."""
    cached: bool | None = None
    """The backend found the stage already converted in its cache (``AFTER_COMPILE`` of a
    stage whose ``statistics()`` has ``cached``; None otherwise)."""
    trial: bool = False
    """A unit compiled alone to find whether its device refuses it (not a plan's stage)."""


@dataclass(frozen=True, slots=True)
class ReplanInfo:
    """The ``extra`` of ``REPLAN``: why the session re-planned, and what changed."""

    reason: str
    number: int
    """This plan's number: 0 is the plan made at opening, each re-plan adds one."""
    moved_units: int
    """Units whose device differs from the previous plan's."""
    quarantined: tuple[str, ...] = ()
    """Devices left out of the new plan after repeated failures."""
    seconds: float | None = None
    """Seconds from the decision to re-plan until the new plan was in place (compiles included)."""


class Hooks:
    """Base class of session hooks; each method is a no-op named after an :class:`Event`.

    Hooks on ``BEFORE_STAGE``/``AFTER_STAGE`` run in device worker threads, those on
    ``BEFORE_COMPILE``/``AFTER_COMPILE`` in compile threads (several at once): keep them
    short and thread-safe. The others run in the event loop.
    """

    def before_compile(self, info: EventInfo) -> None: ...
    def after_compile(self, info: EventInfo) -> None: ...
    def session_start(self, info: EventInfo) -> None: ...
    def request_start(self, info: EventInfo) -> None: ...
    def before_transfer(self, info: EventInfo) -> None: ...
    def after_transfer(self, info: EventInfo) -> None: ...
    def preempted(self, info: EventInfo) -> None: ...
    def resumed(self, info: EventInfo) -> None: ...
    def before_stage(self, info: EventInfo) -> None: ...
    def after_stage(self, info: EventInfo) -> None: ...
    def request_end(self, info: EventInfo) -> None: ...
    def replan(self, info: EventInfo) -> None: ...
    def session_end(self, info: EventInfo) -> None: ...


class HookDispatcher:
    """Holds, per event, only the hook methods actually overridden.

    ``dispatcher.listeners[event]`` is a tuple (empty when nobody listens); callers
    check it before building an :class:`EventInfo`. After-events run in reverse
    registration order so hooks unwind like nested context managers.
    """

    def __init__(self, hooks: Iterable[object] = ()):
        self.hooks = list(hooks)
        self.listeners: dict[Event, tuple[Callable[[EventInfo], None], ...]] = {}
        for ev in Event:
            fns: list[Callable[[EventInfo], None]] = []
            for h in self.hooks:
                method = getattr(type(h), ev.value, None)
                if method is None or method is getattr(Hooks, ev.value):
                    continue
                fns.append(getattr(h, ev.value))
            if ev.is_after:
                fns.reverse()
            self.listeners[ev] = tuple(fns)

    def emit(self, info: EventInfo) -> None:
        for fn in self.listeners[info.event]:
            fn(info)
