"""Request state and admission: one request in flight, and how many may be at once.

:class:`Admission` bounds one tenant's requests (first come first served);
:class:`PriorityAdmission` bounds the runtime's as a whole, handing a freed slot to the most
urgent waiter (priority class, then arrival).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ._buffers import TensorBuffer
from ._program import Program

if TYPE_CHECKING:
    from ._tenants import Tenant

__all__ = ["MISSING", "Admission", "CompletionSink", "PriorityAdmission", "Request"]

MISSING: Any = object()
"""A wanted value nobody produced (``Request`` values lookup default)."""


class CompletionSink(Protocol):
    """Told when a request finishes (or fails) instead of waking a waiting task (a stream)."""

    def request_finished(self, req: Request) -> None:
        """``req`` is done or closed. Called from any thread (a device worker's included);
        must not block."""
        ...


class Admission:
    """At most ``limit`` requests admitted at once; the others wait, first come first served.

    Event-loop only. Admission with room left costs no event-loop round trip (an anyio
    ``Semaphore`` checkpoints on the way in), which matters at a few microseconds a request.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.active = 0
        self._waiters: deque[anyio.Event] = deque()

    def try_acquire(self) -> bool:
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait for a slot (a checkpoint only when it has to wait)."""
        if self.try_acquire():
            return
        ev = anyio.Event()
        self._waiters.append(ev)
        try:
            await ev.wait()
        except BaseException:
            try:
                self._waiters.remove(ev)
            except ValueError:
                self.release()  # the slot was handed to us already: pass it on
            raise

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # hand the slot over; ``active`` stays counted
        else:
            self.active -= 1

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class PriorityAdmission:
    """At most ``limit`` requests admitted at once across every tenant; a freed slot goes to
    the most urgent waiter: the smallest key, which the tenant makes as the heaps' are made
    (``arrival + priority * aging_s``: class first, aged, so a BACKGROUND waiter is never
    starved), first come among equal keys. Event-loop only."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {limit}")
        self.limit = limit
        self.active = 0
        self._waiters: list[tuple[float, int, anyio.Event]] = []
        self._seq = itertools.count()

    def try_acquire(self) -> bool:
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return True
        return False

    async def acquire(self, key: float) -> None:
        """Wait for a slot, served by ``key`` (smaller first; a checkpoint only when it has to wait)."""
        if self.try_acquire():
            return
        entry = (key, next(self._seq), anyio.Event())
        heapq.heappush(self._waiters, entry)
        try:
            await entry[2].wait()
        except BaseException:
            try:
                self._waiters.remove(entry)
            except ValueError:
                self.release()  # the slot was handed to us already: pass it on
            else:
                heapq.heapify(self._waiters)
            raise

    def release(self) -> None:
        if self._waiters:
            heapq.heappop(self._waiters)[2].set()  # hand the slot over; ``active`` stays counted
        else:
            self.active -= 1

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class Request:
    """One request in flight: its values, readiness counters and the references it owes."""

    __slots__ = (
        "admitted",
        "closed",
        "copy_out",
        "deadline",
        "done",
        "ended",
        "energy_j",
        "error",
        "event",
        "feeds",
        "finished_at",
        "flagged",
        "gen",
        "key",
        "lock",
        "missing",
        "owed",
        "parked",
        "priority",
        "program",
        "rem",
        "remaining",
        "result",
        "retries",
        "rid",
        "running",
        "sink",
        "tenant",
        "vals",
        "work",
    )

    def __init__(self, rid: int, priority: int, key: float, program: Program, feeds: Mapping[str, Any], waiter: Any,
                 copy_out: bool = True, tenant: Tenant | None = None):
        self.rid = rid
        self.priority = priority
        self.key = key
        """The heap key of its next pushed stage: smaller runs first (see ``_tenants``)."""
        self.tenant = tenant
        """The tenant (session) it belongs to; None for a bare request (tests)."""
        self.admitted = key
        """``clock.monotonic()`` at admission."""
        self.deadline: float | None = None
        """``admitted + slo_s``: a scheduling deadline, never a cancellation; None: no SLO."""
        self.rem: Mapping[int, float] | None = None
        """Per stage id, the estimated seconds from that stage's start to the request's end
        (its longest path of remaining stages); set for requests with a deadline."""
        self.flagged = False
        """It can no longer meet its deadline (estimated): served after those that still can."""
        self.finished_at: float | None = None
        """``clock.monotonic()`` when its last task finished (requests with a deadline)."""
        self.ended = False
        """Finalized for good: counted in its tenant's statistics."""
        self.program = program
        self.feeds = feeds
        """The request's own inputs, kept for a re-submission after a device failure."""
        gen = program.generation
        if gen is not None:
            gen.hold()
        self.gen: Any = gen
        """The plan generation this request holds until it is finalized (``_generation``)."""
        self.parked = False
        """Closed for a re-submission (a device failed one of its stages): not finished yet."""
        self.retries = 0
        self.energy_j = 0.0
        """Joules its stage runs spent, where their backends report energy."""
        self.vals: dict[Any, Any] = dict(feeds)
        self.missing = list(program.missing0)
        self.owed: dict[TensorBuffer, int] = {}
        self.lock = threading.Lock()
        self.running = 0
        self.remaining = program.n_tasks
        self.closed = False
        self.done = program.n_tasks == 0
        self.error: BaseException | None = None
        self.work: list[tuple[str, str]] = []
        self.event = waiter  # the loop module's waiter (see _loops): None for a sink's requests
        self.copy_out = copy_out
        self.result: list[tuple[str, Any]] | None = None
        self.sink: CompletionSink | None = None
        """Told when the request finishes instead of a waiting task (the stream that admitted it)."""

    def drop_locked(self, buf: TensorBuffer, n: int = 1) -> None:
        """Release ``n`` of the references this request owes on ``buf`` (none twice)."""
        owed = self.owed.get(buf)
        if not owed:
            return
        n = min(n, owed)
        if owed == n:
            del self.owed[buf]
        else:
            self.owed[buf] = owed - n
        for _ in range(n):
            buf.release()

    def finalize_locked(self) -> None:
        """Release every reference still owed (the request is closed and nothing of it runs);
        unless it waits for a re-submission, it lets go of its plan generation."""
        owed, self.owed = self.owed, {}
        for buf, n in owed.items():
            for _ in range(n):
                buf.release()
        if self.parked:
            return
        gen = self.gen
        if gen is not None:
            self.gen = None
            gen.leave()
        if not self.ended:
            self.ended = True
            tenant = self.tenant
            if tenant is not None:
                tenant.request_ended(self)

    def rebind_locked(self, program: Program) -> None:
        """Start over on ``program`` (a newer plan's) from the original feeds; the request must be
        closed with nothing of it running and nothing owed (see :meth:`finalize_locked`)."""
        old, new = self.gen, program.generation
        if new is not None and new is not old:
            new.hold()
        self.gen = new
        if old is not None and old is not new:
            old.leave()
        self.program = program
        self.vals = dict(self.feeds)
        self.missing = list(program.missing0)
        self.remaining = program.n_tasks
        self.done = program.n_tasks == 0
        self.error = None
        self.work = []
        self.result = None
        self.parked = False
        self.closed = False

