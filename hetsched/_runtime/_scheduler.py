"""Pipelined multi-request scheduling: device workers, priority queues with aging, request state.

How one request flows (its bookkeeping is done under the request's lock by whichever
thread finishes something, so a chain of stages never goes back to the event loop)::

    await session.run(feeds, priority=p)               # event loop
        program = programs[wanted outputs, feed names]  # precomputed: needed stages, who reads what where
        key = admitted_at + p * aging_s                 # smaller starts first; FIFO within a priority
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
aging the key is ``(priority, admission)``; with priorities off it is admission order.
Because the key is the *request's* admission time, a request's later stages go before
the first stages of newer requests of the same priority: the pipeline drains in order.

The program compilation lives in ``_program``, request state in ``_requests``, the device
worker threads in ``_workers``, the worker side of a stage run in ``_stage_run``; this module
is the import point for all of them.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np

from .._errors import RuntimeStateError
from .._events import HookDispatcher, Priority
from ._buffers import BufferPool, TensorBuffer
from ._clock import Clock, SystemClock
from ._domains import Topology
from ._failover import Failover
from ._generation import Generation
from ._loops import current_loop_adapter
from ._program import Program, StageIO, StageRuntime, build_program
from ._requests import MISSING, Admission, CompletionSink, Request
from ._stage_run import StageRunner
from ._transfer import TransferEngine
from ._workers import DeviceWorkers, WorkerInfo

__all__ = ["Admission", "CompletionSink", "DeviceWorkers", "Program", "Request", "Scheduler", "StageIO",
           "StageRuntime", "WorkerInfo", "build_program"]

_MISSING = MISSING  # the name the session and the stream import
_NEW = object()
_NO_AGING = 1.0e9  # seconds: larger than any admission-time difference, so priority always wins
_COALESCE_FROM = int(Priority.NORMAL)
"""Requests at least this patient (NORMAL, BACKGROUND) may have their wake-up coalesced."""
_DEFER_FRACTION = 0.1
"""A deferred wake-up waits at most this fraction of the request's time in the system..."""
_DEFER_MIN_S = 0.0005
"""...or this long, whichever is more."""


class Scheduler(StageRunner):
    """Runs requests through the compiled stages on the device workers.

    Owned by a :class:`~hetsched.Session`; all of its public methods except
    :meth:`run_stage` run on the session's event loop, which must be running when it is made
    (it binds that loop's module of :mod:`._loops`). ``clock`` (default: the system's) is read
    for admission times, coalescing deadlines and stage timings.

    :raises UnsupportedEventLoopError: the running event loop is neither asyncio nor trio.
    """

    def __init__(
        self,
        *,
        pools: Mapping[str, BufferPool],
        topology: Topology,
        host: str,
        engine: TransferEngine | None,
        dispatch: HookDispatcher,
        costs: Any,
        learn_costs: bool,
        priorities: bool,
        aging_s: float | None,
        clock: Clock | None = None,
    ):
        self.pools = dict(pools)
        self.topology = topology
        self.host = host
        self.engine = engine
        self._dispatch = dispatch
        self._costs = costs
        self._learn = learn_costs
        self.priorities = priorities
        self.aging_s = aging_s
        self._step = (aging_s if aging_s is not None else _NO_AGING) if priorities else 0.0
        self._seq = itertools.count()
        self.workers: dict[str, DeviceWorkers] = {}
        self.stages: list[StageRuntime] = []
        self.generation: Generation | None = None
        """The plan new requests use (see ``_generation``)."""
        self._generations = itertools.count()
        self._live: dict[int, Generation] = {}
        """Every generation not closed yet (the current one and retired ones still draining)."""
        self.failover: Failover | None = None
        """Device failure handling (set by the session; None: a failing stage fails its request)."""
        self.allocation_failures = 0
        self.states_renewed = 0
        """Per-worker states dropped as dead and built anew (see ``DeviceWorkers.state_for``)."""
        self._loop_thread = threading.get_ident()
        self.clock: Clock = clock if clock is not None else SystemClock()
        # bound once: with the SystemClock these are time.monotonic / time.perf_counter themselves
        self._monotonic: Callable[[], float] = self.clock.monotonic
        self._perf = self.clock.perf_counter
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
        # Completion coalescing (see _wake_finished): finished requests whose callers have
        # not been woken yet.
        self._deferred: list[Request] = []
        self._deferred_entry: dict[int, DeviceWorkers] = {}
        """The workers the deferred callers' next requests would start on."""
        self._deferred_until = 0.0
        """``clock.monotonic()`` by which the deferred wake-ups are delivered in any case."""
        self._coalescing = False
        self.wakeups_coalesced = 0
        self.stage_runs_bound = 0
        self.stage_runs_unbound = 0
        self.stage_runs_to_caller = 0
        self.bytes_to_caller = 0
        self.bytes_staged = 0

    # -- setup -----------------------------------------------------------------------

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

    def set_stages(self, stages: list[StageRuntime], output_source: Mapping[str, int | None],
                   on_drained: Callable[[Generation], None] | None = None) -> Generation:
        """Install a plan's stages: requests made from now on use them (any admitted before
        finish on theirs). The previous plan retires: ``on_drained(old)`` runs once its last
        request is gone (in that request's thread); the owner closes its stages, then calls
        :meth:`forget` (default: it is just forgotten).
        Requests parked for a plan without a quarantined device start over on this one if it
        leaves out every quarantined device (see ``Failover.installed``)."""
        gen = Generation(next(self._generations), stages, output_source, self.topology, self.host)
        old, self.generation = self.generation, gen
        self.stages = stages
        self._live[gen.number] = gen
        if old is not None:
            self.flush_costs(old.stages)

            old.retire(on_drained if on_drained is not None else self.forget)
        if self.failover is not None:
            for req in self.failover.installed(frozenset(st.device for st in stages)):
                self.restart(req, counted=True)
        return gen

    def live_generations(self) -> list[Generation]:
        """The current plan's generation and the retired ones not closed yet."""
        return list(self._live.values())

    def forget(self, gen: Generation) -> None:
        """``gen``'s stages are closed: it is no longer live (any thread)."""
        self._live.pop(gen.number, None)

    def restart(self, req: Request, counted: bool = False) -> None:
        """Start ``req`` over on the current plan (any thread): it was parked after a device
        failure and nothing of it runs any more. Waits instead while a plan without a
        quarantined device is coming; a request closed meanwhile (cancelled) is let go."""
        failover = self.failover
        with req.lock:
            if req.closed:
                req.parked = False
                req.finalize_locked()
                return
        if failover is not None and not counted and not failover.take(req):
            return  # parked until the new plan is installed (set_stages) or found impossible
        gen = self.generation
        assert gen is not None
        wanted = tuple(name for name, _ in req.program.wanted)
        program = gen.program(wanted, req.program.fed)
        with req.lock:
            if req.closed:
                req.parked = False
                req.finalize_locked()
                return
            req.rebind_locked(program)
            req.retries += 1
        if req.done:
            self._wake(req)
            return
        self.push_initial(req)

    def fail_parked(self, parked: Sequence[tuple[Request, BaseException | None]]) -> None:
        """Fail requests that were waiting to start over (no plan could replace their device,
        or the session is closing); any thread."""
        for req, error in parked:
            with req.lock:
                req.parked = False
                if req.closed:
                    req.finalize_locked()
                    continue
                req.error = error or RuntimeStateError("the session stopped before the request could start over")
                req.closed = True
                req.finalize_locked()
            self._wake(req)

    def stop(self) -> list[DeviceWorkers]:
        workers = self.unique_workers()
        for w in workers:
            w.stop()
        self._coalescing = False  # nothing is deferred from now on
        self.workers = {}
        self.fire_deferred()
        return workers

    def fire_deferred(self) -> None:
        """Wake every caller whose wake-up is still deferred (event-loop thread; after the
        workers have stopped, this catches one deferred while they were being stopped)."""
        for req in self._take_deferred():
            self._fire(req)

    def program(self, wanted: Sequence[str], fed: Sequence[str]) -> Program:
        """The current plan's program for requests asking ``wanted`` with inputs ``fed``."""
        gen = self.generation
        if gen is None:
            raise RuntimeStateError("the scheduler has no stages (no plan installed)")
        return gen.program(wanted, fed)

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
                with req.lock:
                    if req.closed:
                        return
                    req.error = RuntimeStateError("the session stopped its device workers")
                    req.closed = True
                    if not req.running:
                        req.finalize_locked()
                self._wake(req)
                return
            w.push(req, st)

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

    def _finish_locked(self, req: Request) -> None:
        """The request's last task is done. With ``copy_out`` the outputs are copied out of the
        pool right here, in the thread that finished (its caches are warm with them), and the
        buffers go back to the pool before the caller's task even wakes up."""
        req.done = True
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

    def new_request(self, rid: int, priority: int, program: Program, feeds: Mapping[str, Any], *,
                    copy_out: bool = True, waiter: Any = _NEW) -> Request:
        """A request admitted now (any thread; a stream's requests pass ``waiter=None``)."""
        return Request(rid, priority, self._monotonic() + priority * self._step, program, feeds,
                       self._new_waiter() if waiter is _NEW else waiter, copy_out)

    def admission_key(self, priority: int) -> float:
        """The heap key of a request of ``priority`` admitted now (any thread): smaller starts first."""
        return self._monotonic() + priority * self._step

    # Waking the request's task: the loop module's waiter (on asyncio a bare future, the
    # cheapest cross-thread wake-up asyncio has; see _loops).

    def set_waiter(self, waiter: Any) -> None:
        """Resolve a waiter made by :attr:`new_waiter` (event-loop thread; idempotent)."""
        self._set(waiter)

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

    def _wake(self, req: Request) -> None:
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

    def _wake_finished(self, req: Request) -> None:
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
                        age = now - (req.key - req.priority * self._step)
                        self._deferred_until = now + max(_DEFER_MIN_S, _DEFER_FRACTION * age)
                    if now < self._deferred_until:
                        self._deferred.append(req)
                        for w in entry:
                            self._deferred_entry[id(w)] = w
                        self.wakeups_coalesced += 1
                        return  # this worker re-checks right after this stage (flush_deferred)
        batch = self._take_deferred()
        if not batch:
            self._wake(req)
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
                self._finish_locked(req)
                self._fire(req)
        for st in ready:
            self.workers[st.device].push(req, st)

    # -- introspection -------------------------------------------------------------------

    def queued(self) -> int:
        return sum(w.queued for w in self.unique_workers())

