"""The session core: the one layer between the callers (``Session.run``, ``ResultStream``) and the
scheduler.

A :class:`Session` plans, compiles and wires; everything a request goes through once the
session is open lives here, used the same way by ``run()`` and by streams:

* admission: the session's admission slots (``max_in_flight``; a stream holds a window of them);
* feed checking and output-name checking;
* request submission (``execute`` for ``run()``; ``new_request``/``push`` for a stream's
  requests, which device workers admit themselves);
* delivery (one copy out of the pool, or zero-copy :class:`~hetsched.Outputs`);
* the request counters: started / completed / failed / cancelled, and requests in flight
  with their peak, kept here and nowhere else.

Streams fold their counts in on the event loop (a batch at a time, never per request from a
worker thread), so the counters cost the fast path nothing.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import anyio

from .._errors import InputError, RuntimeStateError
from .._events import Event, EventInfo, HookDispatcher, Priority
from .._runtime._clock import Clock
from .._runtime._domains import Topology
from .._runtime._scheduler import CompletionSink, Request, Scheduler, StageRuntime
from .._runtime._tenants import DEFAULT_SLO, Tenant
from ._delivery import Outputs, deliver
from ._feeds import FeedChecker

__all__ = ["PRIORITIES", "CoreStream", "SessionCore", "priority_value"]

PRIORITIES = frozenset(int(p) for p in Priority)


def priority_value(priority: Priority | int) -> int:
    """``priority`` as the int the scheduler uses.

    :raises ValueError: it is not a :class:`Priority`.
    """
    return int(priority if priority in PRIORITIES else Priority(priority))


class CoreStream(Protocol):
    """What the core reads of a registered stream (for ``in_flight`` and its peak)."""

    @property
    def in_flight(self) -> int: ...


class SessionCore:
    """Admission, feed checks, submission, delivery and request counters of one session.

    Created with its :class:`~hetsched.Session`; :meth:`open` gives it the session's tenant of
    the runtime's scheduler (its plans, its admission limits: the session's ``max_in_flight``,
    then the runtime's), :meth:`set_stages` the stages of each (re-)plan, :meth:`close` ends
    it. Every method runs on the session's event loop except :meth:`push` and :meth:`admit`,
    which device workers call too.
    """

    def __init__(self, dispatch: HookDispatcher, clock: Clock, max_in_flight: int):
        self.dispatch = dispatch
        self.clock = clock
        self.max_in_flight = max_in_flight
        self.started = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.bytes_copied = 0
        """Bytes the core's own delivery copied out of pool buffers (the scheduler counts the rest)."""
        self._running = 0
        """``run()`` requests in flight (a stream counts its own: :attr:`CoreStream.in_flight`)."""
        self._peak = 0
        self._streams: set[CoreStream] = set()
        self._ids = itertools.count(1)
        self._tenant: Tenant | None = None
        self._scheduler: Scheduler | None = None
        """The board's scheduler (the tenant's): its event-loop adapter wakes the loop."""
        self._feeds: FeedChecker | None = None
        self._constants: Mapping[str, Any] = {}
        self._output_source: Mapping[str, int | None] = {}
        self._outputs: tuple[str, ...] = ()
        self._shared_memory = True
        self._open = False

    # -- lifecycle (the Session) ----------------------------------------------------------

    def open(self, tenant: Tenant, feeds: FeedChecker, outputs: Sequence[str],
             constants: Mapping[str, Any]) -> None:
        """The session opened: requests may be admitted from now on."""
        self._tenant = tenant
        self._scheduler = tenant.scheduler
        self._feeds = feeds
        self._outputs = tuple(outputs)
        self._constants = constants
        self._open = True

    def set_stages(self, stages: Sequence[StageRuntime], output_source: Mapping[str, int | None],
                   topology: Topology, host: str, domains: Iterable[str] = ()) -> None:
        """A (re-)plan's stages: where each output comes from, and whether every stage's
        memory domain (and each of ``domains``: those of every device a re-plan may use, so
        that a stream's choice of path holds across re-plans) shares memory with the host (no
        transfers for the loop to drive)."""
        self._output_source = output_source
        domains = {st.domain for st in stages} | {host} | set(domains)
        self._shared_memory = all(topology.shares_memory(a, b) for a in domains for b in domains)

    def close(self) -> None:
        """No more admissions (the session is closing); slots held now can still be given back."""
        self._open = False

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def generation(self) -> Any:
        """The plan generation new requests use (``_runtime._generation``), or None before opening."""
        tenant = self._tenant
        return tenant.generation if tenant is not None else None

    def require_open(self, call: str) -> Tenant:
        """The tenant of the open session.

        :raises RuntimeStateError: the session is not open (the message names ``call``).
        """
        sch, tenant = self._scheduler, self._tenant
        if not self._open or sch is None or tenant is None:
            raise RuntimeStateError(f"Session is not open: use 'async with Session(...)' before {call}")
        if threading.get_ident() != sch._loop_thread:
            raise RuntimeStateError(
                f"{call}: this Session was opened on an event loop in another thread; use it from the "
                "loop that entered 'async with Session(...)' (or a SyncSession from plain threads)")
        return tenant

    # -- checks ---------------------------------------------------------------------------

    def check_feeds(self, feeds: Any) -> dict[str, Any]:
        """See :meth:`FeedChecker.check`.

        :raises InputError: invalid feeds (names the input).
        :raises RuntimeStateError: the session was never opened.
        """
        checker = self._feeds
        if checker is None:
            raise RuntimeStateError("Session is not open: use 'async with Session(...)'")
        return checker.check(feeds)

    def wanted(self, output_names: Iterable[str] | None) -> tuple[str, ...]:
        """The outputs a request returns, in order (None = all the model's outputs).

        :raises InputError: an unknown output name.
        """
        if output_names is None:
            return self._outputs
        wanted = tuple(output_names)
        source = self._output_source
        for name in wanted:
            if name not in source:
                raise InputError(f"unknown output name {name!r}; the model's outputs are {list(self._outputs)}")
        return wanted

    # -- admission ------------------------------------------------------------------------

    async def acquire(self, priority: int = int(Priority.NORMAL)) -> None:
        """One admission slot: the session's (first come first served), then the runtime's
        (the most urgent waiter first); waits only when there is no room.

        :raises RuntimeStateError: the session was never opened, or is closing.
        """
        tenant = self._tenant
        if tenant is None:
            raise RuntimeStateError("Session is not open: use 'async with Session(...)'")
        await tenant.acquire(priority)

    def try_acquire(self) -> bool:
        """One more admission slot if one is free now (never waits)."""
        tenant = self._tenant
        return tenant is not None and tenant.try_acquire()

    def release(self, slots: int = 1) -> None:
        """Give ``slots`` admission slots back."""
        tenant = self._tenant
        if tenant is not None:
            tenant.release(slots)

    @property
    def slots_in_use(self) -> int:
        """Admission slots held now (by ``run()`` callers and open streams)."""
        tenant = self._tenant
        return tenant.slots_in_use if tenant is not None else 0

    def worker_threads(self) -> int:
        """Device worker threads of the open session (at least 1)."""
        sch = self._scheduler
        return (sum(w.concurrency for w in sch.unique_workers()) if sch is not None else 0) or 1

    def workers_admit(self) -> bool:
        """True if a stream's device workers may admit its requests themselves: no tensor
        crosses memory domains (transfers are driven by the loop) and no hook listens to
        ``REQUEST_START``/``REQUEST_END`` (they run on the loop)."""
        listeners = self.dispatch.listeners
        return (self._shared_memory and not listeners[Event.REQUEST_START]
                and not listeners[Event.REQUEST_END])

    # -- run() requests -------------------------------------------------------------------

    async def execute(self, feeds: dict[str, Any], wanted: Sequence[str], priority: int,
                      zero_copy: bool, slo_s: Any = DEFAULT_SLO) -> dict[str, Any] | Outputs:
        """Run one request holding an admission slot the caller acquired; counted here.

        :raises StageExecutionError, TransferError: the request failed.
        :raises InputError: a wanted output is an optional input that was not fed.
        """
        sch = self._tenant
        assert sch is not None
        rid = next(self._ids)
        self.started += 1
        self._running += 1
        self._raise_peak()
        dispatch = self.dispatch
        if dispatch.listeners[Event.REQUEST_START]:
            self.emit(Event.REQUEST_START, request_id=rid, priority=Priority(priority))
        error: BaseException | None = None
        req: Request | None = None
        try:
            req = sch.new_request(rid, priority, sch.program(wanted, tuple(feeds)), feeds, copy_out=not zero_copy,
                                  slo_s=slo_s)
            await sch.execute(req)
            result = self.deliver(req, zero_copy)
            self.completed += 1
            return result
        except anyio.get_cancelled_exc_class() as exc:
            self.cancelled += 1
            error = exc
            raise
        except BaseException as exc:
            self.failed += 1
            error = exc
            raise
        finally:
            self._running -= 1
            if dispatch.listeners[Event.REQUEST_END]:
                self.emit(Event.REQUEST_END, request_id=rid, priority=Priority(priority), error=error,
                          energy_j=req.energy_j if req is not None and req.energy_j else None)

    def deliver(self, req: Request, zero_copy: bool) -> dict[str, Any] | Outputs:
        """Close the finished ``req`` and hand its outputs over (see ``hetsched/_session/_delivery.py``).

        :raises InputError: a wanted output is an optional input that was not fed.
        """
        sch = self._tenant
        assert sch is not None
        result, copied = deliver(sch.take_outputs(req), zero_copy, self._constants)
        if copied:
            self.bytes_copied += copied
        return result

    # -- stream requests ------------------------------------------------------------------

    def new_request(self, feeds: dict[str, Any], wanted: Sequence[str], priority: int, zero_copy: bool,
                    sink: CompletionSink) -> Request:
        """A request for ``sink`` to admit later (:meth:`push`): nobody awaits it, ``sink`` is
        told when it finishes. Counted as started when the sink folds its admissions in."""
        sch = self._tenant
        assert sch is not None
        req = sch.new_request(next(self._ids), priority, sch.program(wanted, tuple(feeds)), feeds,
                              copy_out=not zero_copy, waiter=None)
        req.sink = sink
        return req

    def admit(self, req: Request) -> None:
        """Stamp ``req``'s admission now (any thread): FIFO, aging and its deadline count from here."""
        tenant = self._tenant
        assert tenant is not None
        tenant.admit(req)

    def push(self, req: Request) -> None:
        """Queue an admitted request's first stages (any thread)."""
        sch = self._tenant
        assert sch is not None
        sch.push_initial(req)

    def register(self, stream: CoreStream) -> None:
        self._streams.add(stream)

    def unregister(self, stream: CoreStream) -> None:
        self._streams.discard(stream)

    def fold(self, started: int = 0, completed: int = 0, failed: int = 0, cancelled: int = 0) -> None:
        """Count a stream's requests (event loop) and update the peak in flight."""
        self.started += started
        self.completed += completed
        self.failed += failed
        self.cancelled += cancelled
        self._raise_peak()

    # -- waking the loop (through the scheduler's event-loop adapter) ---------------------

    def new_waiter(self) -> Any:
        sch = self._scheduler
        assert sch is not None
        return sch.new_waiter()

    def set_waiter(self, waiter: Any) -> None:
        sch = self._scheduler
        assert sch is not None
        sch.set_waiter(waiter)

    async def wait_on(self, waiter: Any) -> None:
        sch = self._scheduler
        assert sch is not None
        await sch.wait_on(waiter)

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the event loop soon (any thread; never blocks).

        :raises RuntimeError: the event loop is gone.
        """
        sch = self._scheduler
        assert sch is not None
        sch.call_soon_threadsafe(fn)

    # -- counters -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished: ``run()`` callers' and every open stream's."""
        n = self._running
        for st in self._streams:
            n += st.in_flight
        return n

    @property
    def peak_in_flight(self) -> int:
        """The most requests in flight at once so far (as seen at admissions on the loop)."""
        return self._peak

    def _raise_peak(self) -> None:
        n = self.in_flight if self._streams else self._running
        if n > self._peak:
            self._peak = n

    def emit(self, event: Event, **fields: Any) -> None:
        """Tell the hooks listening to ``event`` (event loop)."""
        listeners = self.dispatch.listeners[event]
        if listeners:
            info = EventInfo(event, self.clock.perf_counter(), **fields)
            for fn in listeners:
                fn(info)
