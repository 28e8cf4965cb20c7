"""Pipelined multi-request scheduling across sessions: device workers, one priority heap per
device shared by every tenant, aging, deadlines, request state.

One :class:`Scheduler` serves the board: it owns the device workers and their heaps; each
session is a :class:`~hetsched._runtime._tenants.Tenant` of it (``attach``/``detach`` while
serving), with its own plans, admission limit, weight, default SLO and statistics. The order
of the stages on a heap (priority class, aging, least slack or earliest deadline, flagged
misses, weighted fair tags among tenants) is drawn in ``_order``'s docstring.

How one request flows (its bookkeeping is done under the request's lock by whichever
thread finishes something, so a chain of stages never goes back to the event loop)::

    await session.run(feeds, priority=p)               # event loop
        program = programs[wanted outputs, feed names]  # precomputed: needed stages, who reads what where
        key = p * aging_s + admitted_at (or its latest start, with an SLO; see _order)
        push every stage whose inputs are all ready onto its device's heap
        await the request's event                       # one wake-up per request, not one per stage
    device worker thread (pinned to its cores), forever:
        pop the smallest key                            # preemption point = the stage boundary
        outputs = fresh pool buffers (IO binding) or backend-allocated arrays
        run the stage; release one reference of each input buffer
        each output gets one reference per consumer (+1 for the caller); none -> back to the pool
        a consumer on memory the producer's domain shares is ready when its last input is
        a consumer in another domain: the event loop moves the tensor (TransferEngine, priority p)
        the request's last task done (or a failure) -> wake the request's task

Aging: a request's key is its admission time plus ``priority * aging_s`` seconds, so a
BACKGROUND request (3) that has waited ``3 * aging_s`` longer than a new REALTIME one (0)
goes first: urgent work overtakes bulk work, and bulk work never starves. Without
aging the class gap is 1e9 s (priority always wins); with priorities off the key is the
admission time. Because a request without SLO keeps its admission key, its later stages go
before the first stages of newer requests of the same priority: the pipeline drains in order.

The program compilation lives in ``_program``, request state in ``_requests``, the device
worker threads in ``_workers``, the worker side of a stage run in ``_stage_run`` (its own
object, :class:`StageRunner`, over the :class:`StageHost` protocol this class implements),
tenants in ``_tenants``, the order of the heaps in ``_order``; this module is the import
point for all of them.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np

from .._errors import RuntimeStateError
from .._events import HookDispatcher, Priority
from ._buffers import BufferPool, TensorBuffer
from ._clock import Clock, SystemClock
from ._domains import Topology
from ._loops import current_loop_adapter
from ._order import Order, rekey
from ._program import Program, StageIO, StageRuntime, build_program
from ._requests import MISSING, Admission, CompletionSink, PriorityAdmission, Request
from ._stage_run import StageHost, StageRunner
from ._tenants import SchedulerStatistics, Tenant, TenantStatistics
from ._transfer import TransferEngine
from ._workers import DeviceWorkers, WorkerInfo

__all__ = ["Admission", "CompletionSink", "DeviceWorkers", "Order", "Program", "Request", "Scheduler",
           "SchedulerStatistics", "StageHost", "StageIO", "StageRunner", "StageRuntime", "Tenant",
           "TenantStatistics", "WorkerInfo", "build_program"]

_MISSING = MISSING  # the name the session and the stream import
_NO_AGING = 1.0e9  # seconds: larger than any admission-time difference, so priority always wins
_COALESCE_FROM = int(Priority.NORMAL)
"""Requests at least this patient (NORMAL, BACKGROUND) may have their wake-up coalesced."""
_DEFER_FRACTION = 0.1
"""A deferred wake-up waits at most this fraction of the request's time in the system..."""
_DEFER_MIN_S = 0.0005
"""...or this long, whichever is more."""


class Scheduler:
    """Runs every tenant's requests through their compiled stages on the board's device workers.

    Owned by the board's runtime; every session is a tenant of it (:meth:`attach`); all of its public methods run on the event loop that was running when
    it was made (it binds that loop's module of :mod:`._loops`), except those said to run on
    any thread. ``clock`` (default: the system's) is read for admission times, deadlines,
    coalescing deadlines and stage timings.

    :param priorities: order by priority class, deadline and fairness (False: FIFO, admission order).
    :param aging_s: seconds of waiting worth one priority class (None: no aging).
    :param order: how requests with an SLO order within a class.
    :param max_in_flight: requests admitted at once across every tenant (None: no limit).
    :raises UnsupportedEventLoopError: the running event loop is neither asyncio nor trio.
    """

    def __init__(
        self,
        *,
        pools: Mapping[str, BufferPool],
        topology: Topology,
        host: str,
        engine: TransferEngine | None,
        priorities: bool = True,
        aging_s: float | None = 0.5,
        clock: Clock | None = None,
        order: Order = Order.LEAST_SLACK,
        max_in_flight: int | None = None,
    ):
        if not isinstance(order, Order):
            raise TypeError(f"order must be a hetsched Order, got {order!r}")
        self.pools = dict(pools)
        self.topology = topology
        self.host = host
        self.engine = engine
        self.priorities = priorities
        self.aging_s = aging_s
        self.order = order
        self.step = (aging_s if aging_s is not None else _NO_AGING) if priorities else 0.0
        """Seconds of key per priority class (0 in FIFO mode)."""
        self._seq = itertools.count()
        self.workers: dict[str, DeviceWorkers] = {}
        self._tenants: list[Tenant] = []
        self._gone: list[Tenant] = []
        self.shared = False
        """Several tenants attached (and priorities on): requests without SLO get fair tags."""
        self.fair_lock = threading.Lock()
        self.max_slo = 0.0
        """The largest SLO any request has had (how far back a flagged request goes)."""
        self.admission = PriorityAdmission(max_in_flight) if max_in_flight is not None else None
        """The runtime-wide admission limit (None: none); tenants acquire through it."""
        self._loop_thread = threading.get_ident()
        self.clock: Clock = clock if clock is not None else SystemClock()
        # bound once: with the SystemClock these are time.monotonic / time.perf_counter themselves
        self.monotonic: Callable[[], float] = self.clock.monotonic
        self._monotonic = self.monotonic
        self._perf = self.clock.perf_counter
        self.runner = StageRunner(self, pools, self._perf)
        self.run_stage = self.runner.run_stage
        """Run one stage of a request (device worker threads; see :class:`StageRunner`)."""
        loop = current_loop_adapter()
        self._loop = loop
        self.new_waiter: Callable[[], Any] = loop.new_waiter
        """A one-shot waiter of the running loop (event-loop thread; see :meth:`set_waiter`)."""
        self.call_soon_threadsafe: Callable[..., object] = loop.current_call_soon()
        """``call_soon_threadsafe(fn, *args)``: run ``fn(*args)`` on the event loop soon (any
        thread; never blocks; raises ``RuntimeError`` once the loop is gone)."""
        self._call_soon = self.call_soon_threadsafe
        self._new_waiter = self.new_waiter
        self._set = loop.set_waiter
        self._await = loop.wait
        self._lock = threading.Lock()
        # Completion coalescing (see wake_finished): finished requests whose callers have
        # not been woken yet.
        self._deferred: list[Request] = []
        self._deferred_entry: dict[int, DeviceWorkers] = {}
        """The workers the deferred callers' next requests would start on."""
        self._deferred_until = 0.0
        """``clock.monotonic()`` by which the deferred wake-ups are delivered in any case."""
        self._coalescing = False
        self._stopped = False
        self.wakeups_coalesced = 0
        self.bytes_to_caller = 0
        self.bytes_staged = 0

    # -- tenants -------------------------------------------------------------------------

    def attach(self, name: str, *, dispatch: HookDispatcher, costs: Any = None, learn_costs: bool = False,
               weight: float = 1.0, max_in_flight: int | None = None, slo_s: float | None = None) -> Tenant:
        """A new tenant (a session) served from now on, alongside the others (event loop).

        :param weight: its share among equals (same class, no SLO) against other tenants.
        :param max_in_flight: its own admission limit (None: only the runtime's).
        :param slo_s: the default SLO of its requests (None: none).
        :raises ValueError: a bad weight, limit or SLO, or a name already attached.
        """
        if any(t.name == name for t in self._tenants):
            raise ValueError(f"a tenant named {name!r} is already attached")
        tenant = Tenant(self, name, dispatch=dispatch, costs=costs, learn_costs=learn_costs, weight=weight,
                        max_in_flight=max_in_flight, slo_s=slo_s)
        with self.fair_lock:
            self._tenants = [*self._tenants, tenant]
            self.shared = self.priorities and len(self._tenants) > 1
            if self.shared:
                for t in self._tenants:
                    t.tracks = True
        return tenant

    async def detach(self, tenant: Tenant) -> TenantStatistics:
        """See :meth:`Tenant.detach`: the tenant's requests drain, the others keep running."""
        if tenant.scheduler is not self:
            raise ValueError(f"{tenant!r} is not a tenant of this scheduler")
        return await tenant.detach()

    def forget_tenant(self, tenant: Tenant) -> None:
        """``tenant`` has drained: no longer attached (its statistics stay in :meth:`statistics`)."""
        with self.fair_lock:
            if tenant in self._tenants:
                self._tenants = [t for t in self._tenants if t is not tenant]
                self._gone.append(tenant)
            self.shared = self.priorities and len(self._tenants) > 1

    @property
    def loop_thread(self) -> int:
        """The thread id of the event loop the scheduler runs on."""
        return self._loop_thread

    @property
    def stopped(self) -> bool:
        """The device workers were started and have been stopped."""
        return self._stopped

    def tenants(self) -> tuple[Tenant, ...]:
        """The attached tenants, in attachment order (any thread)."""
        return tuple(self._tenants)

    def saw_slo(self, slo: float) -> None:
        if slo > self.max_slo:
            self.max_slo = slo

    def demotion(self) -> float:
        """Seconds a flagged request's key goes back (see ``_tenants``)."""
        return max(self.max_slo, self.step / 2)

    def statistics(self) -> SchedulerStatistics:
        """Per-tenant figures and the board's busy time (any thread)."""
        tenants = tuple(t.statistics() for t in (*self._tenants, *self._gone))
        busy: dict[str, float] = {}
        for ts in tenants:
            for dev, sec in ts.busy_s.items():
                busy[dev] = busy.get(dev, 0.0) + sec
        adm = self.admission
        return SchedulerStatistics(
            tenants=tenants, busy_s=MappingProxyType(busy), admitted=adm.active if adm is not None else 0,
            waiting=adm.waiting if adm is not None else 0, max_in_flight=adm.limit if adm is not None else None,
            queued_stages=self.queued(), order=self.order, priorities=self.priorities)

    def admission_key(self, priority: int) -> float:
        """The heap key of a request without SLO of ``priority`` admitted now, with a single
        tenant (any thread; :meth:`Tenant.admit` keys a request in every case)."""
        return self._monotonic() + priority * self.step

    # -- counters kept by the stage runner ---------------------------------------------------

    @property
    def stage_runs_bound(self) -> int:
        return self.runner.stage_runs_bound

    @property
    def stage_runs_unbound(self) -> int:
        return self.runner.stage_runs_unbound

    @property
    def stage_runs_to_caller(self) -> int:
        return self.runner.stage_runs_to_caller

    @property
    def allocation_failures(self) -> int:
        return self.runner.allocation_failures

    @property
    def states_renewed(self) -> int:
        return self.runner.states_renewed

    def state_renewed(self) -> None:
        """A worker dropped a dead per-worker state (worker thread)."""
        self.runner.state_renewed()

    # -- workers -------------------------------------------------------------------------

    def start(self, devices: Sequence[Any], worker_cpus: Callable[[Any], Sequence[tuple[int, ...]]]) -> None:
        """Start the device workers. CPU devices pinned to exactly the same cores share their
        worker(s): those cores run one stage at a time anyway, and one heap lets the most urgent
        stage of either device go first with no thread hand-off between them."""
        shared: dict[tuple[tuple[int, ...], ...], list[Any]] = {}
        groups: list[list[Any]] = []
        for dev in devices:
            cpu_sets = tuple(tuple(c) for c in worker_cpus(dev))
            if dev.kind == "cpu" and all(cpu_sets):
                group = shared.get(cpu_sets)
                if group is not None:
                    group.append(dev)
                    continue
                shared[cpu_sets] = group = [dev]
            else:
                group = [dev]
            groups.append(group)
        for group in groups:
            w = DeviceWorkers([d.name for d in group], worker_cpus(group[0]), self)
            for d in group:
                self.workers[d.name] = w
        for w in self.unique_workers():
            w.start()
        self._coalescing = True

    def abort(self, requests: Sequence[Request], error: BaseException) -> None:
        """Fail requests whose queued stages will never run (the workers stopped). Event loop only."""
        for req in requests:
            with req.lock:
                if req.closed:
                    continue
                req.error = error
                req.closed = True
                if not req.running:
                    req.finalize_locked()
            self._fire(req)

    def unique_workers(self) -> list[DeviceWorkers]:
        return list({id(w): w for w in self.workers.values()}.values())

    def stop(self) -> list[DeviceWorkers]:
        workers = self.unique_workers()
        for w in workers:
            w.stop()
        self._coalescing = False  # nothing is deferred from now on
        self._stopped = True
        self.workers = {}
        self.fire_deferred()
        return workers

    def fire_deferred(self) -> None:
        """Wake every caller whose wake-up is still deferred (event-loop thread; after the
        workers have stopped, this catches one deferred while they were being stopped)."""
        for req in self._take_deferred():
            self._fire(req)

    # -- the event-loop side -----------------------------------------------------------

    async def execute(self, req: Request) -> None:
        """Run ``req`` to completion; raises the first stage/transfer error. On any exit the
        request is closed and, once no stage of it runs any more, its references released."""
        prog = req.program
        try:
            self.push_initial(req)
            if prog.has_transfers:
                req.work.extend(prog.feed_xfers)
                async with anyio.create_task_group() as tg:
                    while True:
                        with req.lock:
                            work, req.work = req.work, []
                            finished = req.done or req.closed
                        for item in work:
                            tg.start_soon(self._transfer, req, item)
                        if finished:
                            if req.error is not None:
                                tg.cancel_scope.cancel()
                            break
                        await self._wait(req)
            elif req.done:
                await anyio.lowlevel.checkpoint()  # nothing to run (passed-through values): still a checkpoint
            else:
                wait = self._await
                while True:  # one wake-up: the last stage done, or a failure
                    await wait(req.event)
                    if req.done or req.closed:
                        break
                    req.event = self._new_waiter()
        except BaseException:
            with req.lock:
                req.closed = True
                if req.running == 0:
                    req.finalize_locked()
            raise
        if req.error is not None:
            with req.lock:
                if req.running == 0:
                    req.finalize_locked()
            raise req.error

    def push_initial(self, req: Request) -> None:
        """Queue ``req``'s first stages (any thread). With the workers stopped (the session is
        closing or re-planning) the request fails instead of waiting for workers that are gone."""
        workers = self.workers
        for st in req.program.initial:
            w = workers.get(st.device)
            if w is None:
                self._workers_gone(req)
                return
            if req.deadline is not None and self.priorities:
                tenant = req.tenant
                assert tenant is not None
                rekey(tenant, req, st)
            w.push(req, st)

    def push(self, req: Request, st: StageRuntime) -> None:
        """Queue ``req``'s ready stage ``st`` on its device's heap (any thread): a request with
        a deadline is keyed for this stage first (its latest start, or flagged; see ``_order``).
        With the workers stopped meanwhile, the request fails (nothing would run the stage)."""
        w = self.workers.get(st.device)
        if w is None:
            self._workers_gone(req)
            return
        if req.deadline is not None and self.priorities:
            tenant = req.tenant
            assert tenant is not None
            rekey(tenant, req, st)
        w.push(req, st)

    def _workers_gone(self, req: Request) -> None:
        """Fail ``req``: the device workers its next stage needs have stopped (any thread)."""
        with req.lock:
            if req.closed:
                return
            req.error = RuntimeStateError("the session stopped its device workers")
            req.closed = True
            if not req.running:
                req.finalize_locked()
        self.wake(req)

    def take_outputs(self, req: Request) -> list[tuple[str, Any]]:
        """The wanted values, closing the request: arrays the caller owns (copied once when the
        request finished) or, without ``copy_out``, buffers carrying the caller's one reference."""
        with req.lock:
            req.closed = True
            out = req.result
            if out is None:
                out = []
                vals = req.vals
                for name, key in req.program.wanted:
                    obj = vals.get(key, _MISSING)
                    if type(obj) is TensorBuffer:
                        n = req.owed.get(obj, 0)
                        if n <= 1:
                            req.owed.pop(obj, None)
                        else:
                            req.owed[obj] = n - 1
                    out.append((name, obj))
            req.finalize_locked()
        return out

    def finish_locked(self, req: Request) -> None:
        """The request's last task is done. With ``copy_out`` the outputs are copied out of the
        pool right here, in the thread that finished (its caches are warm with them), and the
        buffers go back to the pool before the caller's task even wakes up."""
        req.done = True
        if req.deadline is not None:
            req.finished_at = self._monotonic()
        if not req.copy_out:
            return
        out: list[tuple[str, Any]] = []
        copied = 0
        vals = req.vals
        for name, key in req.program.wanted:
            obj = vals.get(key, _MISSING)
            if type(obj) is TensorBuffer:
                arr = obj.array().copy()  # the one documented copy
                copied += arr.nbytes
                req.drop_locked(obj)  # the caller's reference
                obj = arr
            out.append((name, obj))
        req.result = out
        if copied:
            with self._lock:
                self.bytes_to_caller += copied

    # Waking the request's task: the loop module's waiter (on asyncio a bare future, the
    # cheapest cross-thread wake-up asyncio has; see _loops).

    def set_waiter(self, waiter: Any) -> None:
        """Resolve a waiter made by :attr:`new_waiter` (event-loop thread; idempotent)."""
        self._set(waiter)

    def resolve_soon(self, waiter: Any) -> None:
        """Resolve ``waiter`` from any thread (on the event loop, soon)."""
        if threading.get_ident() == self._loop_thread:
            self._set(waiter)
            return
        try:
            self._call_soon(self._set, waiter)
        except RuntimeError:
            pass  # the event loop is gone (interpreter shutdown); nobody waits

    async def wait_on(self, waiter: Any) -> None:
        """Wait until ``waiter`` (made by :attr:`new_waiter`) is resolved."""
        await self._await(waiter)

    async def _wait(self, req: Request) -> None:
        await self._await(req.event)
        req.event = self._new_waiter()

    def _fire(self, req: Request) -> None:
        """Wake ``req``'s task (event-loop thread only)."""
        sink = req.sink
        if sink is not None:
            sink.request_finished(req)
            return
        self._set(req.event)

    def wake(self, req: Request) -> None:
        """Wake ``req``'s task from any thread."""
        sink = req.sink
        if sink is not None:
            sink.request_finished(req)  # thread-safe; a stream admits its next request
            return
        if threading.get_ident() == self._loop_thread:
            self._fire(req)
            return
        try:
            self._call_soon(self._fire, req)
        except RuntimeError:
            pass  # the event loop is gone (interpreter shutdown); nobody waits

    # Completion coalescing, as a NIC coalesces interrupts. Every cross-thread wake-up costs
    # the event loop an epoll return and a self-pipe read, and costs the worker whose core
    # the loop thread lands on a preemption with its caches cold: ~0.1-0.2 ms of CPU per
    # request on a small model with every core busy. A NORMAL or BACKGROUND request that
    # finishes while the workers its caller's next request would start on all have queued
    # stages to go on with gains nothing from waking its caller now (that request would only
    # queue behind them), so the wake-up waits for the next one that has to happen: when one
    # of those workers' queues runs short (checked after every pop, so the callers refill it
    # while it runs what it popped), when a HIGH/REALTIME request finishes, or at the latest
    # once the oldest has waited _DEFER_FRACTION of its time in the system (a stream near
    # saturation keeps queues deep for long: its results must still flow). Then one wake-up
    # delivers them all.

    @staticmethod
    def _busy(workers: Sequence[DeviceWorkers]) -> bool:
        """Each of ``workers`` has a queued stage for every thread of it (unlocked reads: a hint)."""
        for w in workers:
            if len(w._heap) < w.concurrency:
                return False
        return bool(workers)

    def wake_finished(self, req: Request) -> None:
        """Wake the task of ``req``, which finished without error (worker thread).

        The caller's next request most likely runs the same program, so it would start on the
        workers of ``req``'s first stages: while those all have queued work, waking the caller
        now cannot keep any worker from idling, and the wake-up is deferred. A stream's request
        tells its stream (its sink) instead.
        """
        sink = req.sink
        if sink is not None:
            sink.request_finished(req)
            return
        if req.priority >= _COALESCE_FROM and self._coalescing:
            workers = self.workers
            entry = [workers[st.device] for st in req.program.initial if st.device in workers]
            if self._busy(entry):
                now = self._monotonic()
                with self._lock:
                    if not self._deferred:
                        # the first one deferred sets how long the batch may wait: a fraction of
                        # its time in the system so far, so no caller's latency grows by more
                        age = now - req.admitted
                        self._deferred_until = now + max(_DEFER_MIN_S, _DEFER_FRACTION * age)
                    if now < self._deferred_until:
                        self._deferred.append(req)
                        for w in entry:
                            self._deferred_entry[id(w)] = w
                        self.wakeups_coalesced += 1
                        return  # this worker re-checks right after this stage (flush_deferred)
        batch = self._take_deferred()
        if not batch:
            self.wake(req)
            return
        batch.append(req)
        self._post_all(batch)

    def flush_deferred(self) -> None:
        """Deliver the deferred wake-ups once a worker their callers would feed runs short
        (worker thread, after each pop and each stage)."""
        if self._busy(list(self._deferred_entry.values())) and self._monotonic() < self._deferred_until:
            return  # their queues still hold work; a worker checks again after its next pop
        batch = self._take_deferred()
        if batch:
            self._post_all(batch)

    def _take_deferred(self) -> list[Request]:
        with self._lock:
            batch, self._deferred = self._deferred, []
            self._deferred_entry = {}
        return batch

    def _post_all(self, batch: list[Request]) -> None:
        """Wake the tasks of ``batch`` with one event-loop wake-up (any thread)."""
        try:
            self._call_soon(self._fire_all, batch)
        except RuntimeError:
            pass  # the event loop is gone (interpreter shutdown); nobody waits

    def _fire_all(self, batch: list[Request]) -> None:
        for req in batch:
            self._fire(req)

    async def _transfer(self, req: Request, item: tuple[str, str]) -> None:
        name, dst = item
        engine = self.engine
        assert engine is not None
        with req.lock:
            if req.closed:
                return
            src = req.vals[name]
        staged: TensorBuffer | None = None
        if type(src) is not TensorBuffer:
            # a caller's array going to memory the host does not share: stage it in a host
            # buffer first (the engine moves pool buffers only)
            arr = np.ascontiguousarray(src)
            staged = self.pools[self.host].acquire_nowait((arr.dtype, arr.shape), label=f"feed:{name}")
            staged.array()[...] = arr
            with self._lock:
                self.bytes_staged += arr.nbytes
            src_buf = staged
        else:
            src_buf = src
        producer = src_buf.label.split(":", 1)[0] if staged is None else "feed"
        label = f"{producer}:{name}->{dst}#{req.rid}"
        prio = req.priority if self.priorities else int(Priority.NORMAL)
        try:
            out = await engine.transfer(src_buf, dst, priority=prio, label=label)
        except BaseException as exc:
            with req.lock:
                if staged is None:
                    req.drop_locked(src_buf)
                failed = not isinstance(exc, anyio.get_cancelled_exc_class())
                if failed and not req.closed:
                    # fail the request (its task raises this), not the task group
                    req.error = exc
                    req.closed = True
                    self._fire(req)
            if staged is not None:
                staged.release()
            if failed:
                return
            raise
        if staged is not None:
            staged.release()
        ready: list[StageRuntime] = []
        with req.lock:
            if staged is None:
                req.drop_locked(src_buf)  # the transfer's read reference
            if req.closed:
                out.release()
                return
            refs, sids = req.program.xfers[(name, dst)]
            if refs > 1:
                out.retain(refs - 1)
            req.owed[out] = refs
            req.vals[(name, dst)] = out
            missing = req.missing
            for sid in sids:
                missing[sid] -= 1
                if not missing[sid]:
                    ready.append(req.program.by_sid[sid])
            req.remaining -= 1
            if not req.remaining:
                self.finish_locked(req)
                self._fire(req)
        for st in ready:
            self.push(req, st)

    # -- introspection -------------------------------------------------------------------

    def queued(self) -> int:
        return sum(w.queued for w in self.unique_workers())

