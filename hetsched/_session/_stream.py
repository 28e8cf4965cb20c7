"""Streams of requests: ``Session.map``, whose device workers admit the next request themselves.

A caller awaiting ``run()`` once per request costs the event loop two round trips per
request (admit, then wake the caller), each a preemption of a busy worker when every core
runs stages. A stream knows its next requests in advance, so the loop only has to keep a
queue of validated inputs topped up and hand results over, a batch at a time::

    async with session.map(frames) as results:       # frames: an iterable or async iterable of feeds
        async for out in results:                     # in input order
            use(out)

    feeder task (event loop)            worker thread, on finishing a stream request
    ------------------------            ----------------------------------------------
    take items from the source          under the stream's lock:
    validate them (InputError), build       admit pending requests while fewer than ``window``
      their requests                          run and fewer than ``2 * window`` are not yet
    append to pending (at most                taken by the consumer (push their first stages)
      ``window``); admit as the worker      wake the loop only when it has something to do:
      does; sleep while pending is full       the feeder, pending down to half of ``window``;
                                              the consumer, ``window // 2`` results ready in
    consumer (``async for``)                  order, or nothing queued behind them (a source
    take every ready result in order;         slower than the devices gets each result at
      admit itself only when fewer than       once), or nothing left running, or a failure
      ``window // 2`` run (a consumer that
      fell behind held the stream back)

So with a fast source the loop wakes about once per ``window // 2`` requests instead of
twice per request, and a result waits at most until that batch is complete. ``run()``
remains the call for latency: a single request never waits for others. Results not yet
taken are bounded by a second ``window`` (backpressure on a slow consumer) rather than
sharing the first: ready results would otherwise take the places of running requests and
leave the workers short of queued work, and the loop would wake more often per request
(``benchmarks/throughput.py`` measures it).

Everything a stream does to the session goes through the session core (``hetsched/_session/_core.py``:
admission slots, feed checks, request submission, delivery, counters); the scheduler tells
the stream of each finished request through :meth:`ResultStream.request_finished`.

Requests with cross-domain transfers (their transfers are driven by the event loop) and
sessions with ``REQUEST_START``/``REQUEST_END`` hooks (which run on the loop, e.g. the
governor's) take the general path: the stream then runs up to ``window`` ordinary requests
at once, with the same ordering, bounds and error rules.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from .._errors import InputError, RuntimeStateError
from .._runtime._scheduler import Request
from ._core import SessionCore
from ._delivery import Outputs

__all__ = ["ResultStream", "StreamStatistics"]


@dataclass(frozen=True)
class StreamStatistics:
    """A snapshot of a :class:`ResultStream`."""

    window: int
    """Requests of this stream in flight at most (session admission slots it holds)."""
    taken: int
    """Items taken from the source and validated."""
    admitted: int
    """Requests started."""
    admitted_by_workers: int
    """Of those, started by a device worker as it finished the previous one (no event-loop round trip)."""
    delivered: int
    """Results handed to the consumer."""
    failed: int
    """Requests that failed (the stream raised the first failure and stopped)."""
    in_flight: int
    """Requests started and not yet finished."""
    pending: int
    """Validated inputs waiting to be admitted."""
    loop_wakeups: int
    """Times a worker woke the event loop for this stream (the feeder, the consumer or both)."""
    worker_admission: bool
    """True: workers admit requests (the fast path); False: the general path (see the module)."""


class _Job:
    """One request of the general path: a task in the stream's task group runs it."""

    __slots__ = ("closed", "done", "error", "result")

    def __init__(self) -> None:
        self.done = False
        self.closed = False
        self.error: BaseException | None = None
        self.result: dict[str, Any] | Outputs | None = None
        """What ``run()`` returns: a dict owning its arrays, or zero-copy :class:`Outputs`."""


def _release_untaken(result: dict[str, Any] | Outputs | None) -> None:
    """A result nobody will take: zero-copy :class:`Outputs` give their pool buffers back (a dict
    owns its arrays: nothing to give back)."""
    if type(result) is Outputs:
        result.release()


class ResultStream(AsyncIterator[Any]):
    """Results of ``Session.map(source)``, in the order of the source's items.

    Use it as ``async with session.map(source) as results: async for out in results: ...``;
    the ``async with`` block owns everything the stream starts: leaving it (also on error
    or cancellation) stops taking items, drops the requests not yet run and returns their
    buffers, and gives back the session's admission slots.

    Each result is what ``run(feeds)`` would return: ``{output name: array}`` (arrays the
    caller keeps), or :class:`~hetsched.Outputs` with ``zero_copy=True`` (release each).

    Errors surface at the position they belong to: an item that is not valid feeds raises
    :class:`~hetsched.InputError` after the results of the items before it; a failing
    request raises its :class:`~hetsched.StageExecutionError` in its place; an exception
    raised by the source itself is re-raised there. The stream ends after raising.
    """

    def __init__(self, core: SessionCore, source: Iterable[Any] | AsyncIterable[Any], *, priority: int,
                 window: int | None, zero_copy: bool, output_names: Sequence[str] | None):
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive int or None, got {window!r}")
        if not isinstance(source, (Iterable, AsyncIterable)) or isinstance(source, (dict, str, bytes)):
            raise InputError(f"map() takes an iterable or async iterable of feeds, got {type(source).__name__}")
        self._core = core
        self._source = source
        self._priority = priority
        self._window_arg = window
        self._zero_copy = zero_copy
        self._output_names = None if output_names is None else list(output_names)
        self._lock = threading.Lock()
        self._pending: deque[Any] = deque()
        """Validated inputs not admitted yet: Requests (fast path) or feeds (general path)."""
        self._order: deque[Any] = deque()
        self._window = 0
        self._cap = 0
        self._low = 0
        self._batch = 1
        self._in_flight = 0
        self._closing = False
        self._entered = False
        self._ended = False
        self._source_done = False
        self._source_error: BaseException | None = None
        self._fast = False
        self._posted = False
        self._consumer_waiter: Any = None
        self._feeder_waiter: Any = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._slots = 0
        self._taken = 0
        self._admitted = 0
        self._by_workers = 0
        self._delivered = 0
        self._failed = 0
        self._loop_wakeups = 0
        self._folded_admitted = 0
        self._wanted: tuple[str, ...] = ()

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> ResultStream:
        if self._entered:
            raise RuntimeStateError("a ResultStream can be entered once")
        core = self._core
        core.require_open("map()")
        self._wanted = core.wanted(self._output_names)
        threads = core.worker_threads()
        want = self._window_arg if self._window_arg is not None else max(2, 8 * threads)
        want = min(want, core.max_in_flight)
        await core.acquire(self._priority)  # one slot waited for; more only if free now (two streams never deadlock)
        self._slots = 1
        while self._slots < want and core.try_acquire():
            self._slots += 1
        self._window = self._slots
        self._low = self._window // 2
        # finished results waiting for the consumer are bounded too (a slow consumer holds the
        # stream back), by a second window: one shared bound would let ready results take
        # the places of running requests and leave workers short of queued work
        self._cap = 2 * self._window
        self._batch = max(1, self._window // 2)
        self._fast = core.workers_admit()
        self._entered = True
        core.register(self)
        try:
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            self._tg.start_soon(self._feed)
        except BaseException:
            self._tg = None
            self._release()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        tg, self._tg = self._tg, None
        try:
            self._close()
            if tg is not None:
                # the stream's own tasks (the feeder, general-path requests) never raise: they
                # are only cancelled here; the block's exception propagates as it is, ungrouped
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
            return None
        finally:
            self._release()

    def _release(self) -> None:
        self._fold()
        core = self._core
        core.unregister(self)
        slots, self._slots = self._slots, 0
        core.release(slots)

    def _close(self) -> None:
        """Stop admitting; close every request not yet delivered (buffers back to the pools)."""
        with self._lock:
            self._closing = True
            self._ended = True
            pending, self._pending = self._pending, deque()
            order, self._order = self._order, deque()
        for item in pending:
            if type(item) is Request:
                with item.lock:  # never admitted: it only lets go of its plan
                    item.closed = True
                    item.finalize_locked()
        dropped = 0
        for item in order:
            if type(item) is Request:
                dropped += 1
                with item.lock:
                    item.closed = True
                    if item.running == 0:
                        item.finalize_locked()
            else:
                item.closed = True  # its task is cancelled with the task group
                _release_untaken(item.result)
        if dropped:
            # admitted, never handed over (the general path's runs count themselves)
            self._core.fold(cancelled=dropped)

    def _fold(self, *, completed: int = 0, failed: int = 0) -> None:
        """Account this stream's admissions (and a result just handed over) to the core (event loop)."""
        with self._lock:
            n = self._admitted - self._folded_admitted
            self._folded_admitted = self._admitted
        self._core.fold(started=n, completed=completed, failed=failed)

    # -- the source side (event loop) -------------------------------------------------------

    async def _feed(self) -> None:
        try:
            src = self._source
            if isinstance(src, AsyncIterable):
                async for item in src:
                    if not await self._put(item):
                        return
            else:
                for item in src:
                    if not await self._put(item):
                        return
        except Exception as exc:  # the source's own error or an invalid item: raised in its place
            self._source_error = exc
        finally:
            with self._lock:
                self._source_done = True
            self._wake_here(consumer=True)

    async def _put(self, item: Any) -> bool:
        """Validate ``item`` and queue it; False once the stream is closing."""
        core = self._core
        try:
            feeds = core.check_feeds(item)
        except InputError as exc:
            raise InputError(f"map() item {self._taken}: {exc}") from None
        self._taken += 1
        entry: Any = feeds
        if self._fast:
            # the fast path's requests are built here, on the loop (warm, a batch at a time), so
            # a worker admitting one only stamps its admission time: after a long stage its
            # caches are cold and every object it touches costs
            entry = core.new_request(feeds, self._wanted, self._priority, self._zero_copy, self)
        while True:
            with self._lock:
                if self._closing:
                    return False
                if len(self._pending) < self._window:
                    self._pending.append(entry)
                    break
                self._feeder_waiter = waiter = core.new_waiter()
            await core.wait_on(waiter)
        if self._fast:
            with self._lock:
                admitted = self._admit_locked()
            for req in admitted:
                core.push(req)
        else:
            while True:
                with self._lock:
                    if self._closing:
                        return False
                    if self._in_flight < self._window and len(self._order) < self._cap and not self._failed:
                        feeds = self._pending.popleft()
                        job = _Job()
                        self._order.append(job)
                        self._in_flight += 1
                        self._admitted += 1
                        break
                    self._feeder_waiter = waiter = core.new_waiter()
                await core.wait_on(waiter)
            assert self._tg is not None
            self._tg.start_soon(self._run_job, job, feeds)
        return True

    def _admit_locked(self) -> list[Request]:
        """Admit pending inputs while fewer than ``window`` run (under the stream's lock)."""
        out: list[Request] = []
        pending = self._pending
        admit = self._core.admit
        gen = self._core.generation
        while (pending and self._in_flight < self._window and len(self._order) < self._cap and not self._closing
               and not self._failed):
            req = pending.popleft()
            if req.program.generation is not gen and gen is not None:
                # built before a re-plan: admitted after the switch, it runs on the new plan
                with req.lock:
                    req.rebind_locked(gen.program(self._wanted, req.program.fed))
            admit(req)  # admitted now: FIFO, aging and its deadline count from here
            self._order.append(req)
            self._in_flight += 1
            self._admitted += 1
            out.append(req)
        return out

    async def _run_job(self, job: _Job, feeds: dict[str, Any]) -> None:
        try:
            job.result = await self._core.execute(feeds, self._wanted, self._priority, self._zero_copy)
        except Exception as exc:
            job.error = exc
        job.done = True
        with self._lock:
            self._in_flight -= 1
            if job.error is not None:
                self._failed += 1
            if job.closed:
                _release_untaken(job.result)  # the stream closed while it ran: nobody will take it
        self._wake_here(feeder=True, consumer=True)

    # -- the worker side ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests of this stream started and not yet finished."""
        return self._in_flight

    def request_finished(self, req: Request) -> None:
        """``req`` finished or failed (a worker thread, or the loop on abort): the scheduler's
        ``CompletionSink`` call (``hetsched/_runtime/_scheduler.py``). Admits the next requests;
        never blocks."""
        with self._lock:
            self._in_flight -= 1
            if req.error is not None:
                self._failed += 1
            admitted = self._admit_locked()
            self._by_workers += len(admitted)
            wake = self._needs_loop_locked()
            if wake:
                self._posted = True
        core = self._core
        for nxt in admitted:
            core.push(nxt)
        if wake:
            with contextlib.suppress(RuntimeError):  # the event loop is gone (interpreter shutdown): nobody waits
                core.call_soon_threadsafe(self._on_wake)

    def _needs_loop_locked(self) -> bool:
        if self._posted:
            return False
        if self._feeder_waiter is not None and len(self._pending) <= self._low:
            return True
        if self._consumer_waiter is None or not self._order:
            return False
        head = self._order[0]
        if not (head.done or head.closed):
            return False
        if head.error is not None or not self._pending or not self._in_flight:
            return True
        for ready, r in enumerate(self._order, 1):
            if not (r.done or r.closed):
                return False
            if ready >= self._batch:
                return True
        return False

    def _on_wake(self) -> None:
        """Posted by a worker: on the event loop, wake whoever waits (the feeder, the consumer)."""
        with self._lock:
            self._posted = False
            self._loop_wakeups += 1
        self._wake_here(feeder=True, consumer=True)

    def _wake_here(self, *, feeder: bool = False, consumer: bool = False) -> None:
        """Wake the feeder and/or the consumer if they wait (event-loop thread)."""
        with self._lock:
            waiters = (self._feeder_waiter if feeder else None, self._consumer_waiter if consumer else None)
            if feeder:
                self._feeder_waiter = None
            if consumer:
                self._consumer_waiter = None
        for w in waiters:
            if w is not None:
                self._core.set_waiter(w)

    # -- the consumer side -------------------------------------------------------------------

    def __aiter__(self) -> ResultStream:
        return self

    async def __anext__(self) -> Any:
        """The next result in source order.

        :raises StopAsyncIteration: the source is exhausted and every result was handed over,
            or the stream raised an error before.
        :raises InputError: an item is not valid feeds (names the item's index and the input).
        :raises StageExecutionError: the request of this item failed (names stage and device).
        :raises RuntimeStateError: used outside its ``async with`` block.
        """
        if not self._entered or self._tg is None:
            if self._ended:
                raise StopAsyncIteration
            raise RuntimeStateError("iterate a ResultStream inside 'async with session.map(...) as results'")
        core = self._core
        while True:
            admitted: list[Request] | None = None
            with self._lock:
                if self._ended:
                    raise StopAsyncIteration
                order = self._order
                if order and (order[0].done or order[0].closed):
                    head = order.popleft()
                    # Workers admit as they finish; with few requests left running (a slow
                    # consumer held the window full of results) nobody else would.
                    if self._fast and self._pending and self._in_flight < self._batch:
                        admitted = self._admit_locked()
                    break
                if self._fast and self._pending and self._in_flight < self._batch and len(order) < self._cap:
                    admitted = self._admit_locked()  # too few running to count on their workers
                elif not order and not self._pending and self._source_done:
                    error = self._source_error
                    self._source_error = None
                    self._ended = True
                    if error is not None:
                        raise error
                    raise StopAsyncIteration
                if not admitted:
                    self._consumer_waiter = waiter = core.new_waiter()
            if admitted:
                for req in admitted:
                    core.push(req)
                continue
            await core.wait_on(waiter)
        if admitted:
            for req in admitted:
                core.push(req)
        if not self._fast:
            self._wake_here(feeder=True)  # a place in the window is free
        fast = type(head) is Request  # a general-path job was counted by the run that ran it
        if head.error is not None:
            self._fold(failed=int(fast))
            self._close()
            raise head.error
        self._delivered += 1
        self._fold(completed=int(fast))
        if fast:
            return core.deliver(head, self._zero_copy)
        return head.result

    def statistics(self) -> StreamStatistics:
        with self._lock:
            return StreamStatistics(
                window=self._window, taken=self._taken, admitted=self._admitted,
                admitted_by_workers=self._by_workers, delivered=self._delivered, failed=self._failed,
                in_flight=self._in_flight, pending=len(self._pending), loop_wakeups=self._loop_wakeups,
                worker_admission=self._fast,
            )
