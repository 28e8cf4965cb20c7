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
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np

from .._errors import RuntimeStateError, StageExecutionError
from .._events import Event, EventInfo, HookDispatcher, Priority
from ._buffers import BufferPool, TensorBuffer
from ._domains import Topology
from ._transfer import TransferEngine

__all__ = ["Admission", "DeviceWorkers", "Program", "Request", "Scheduler", "StageIO", "StageRuntime"]

_NEW = object()
_NO_AGING = 1.0e9  # seconds: larger than any admission-time difference, so priority always wins

_LEARN_BATCH = 16
"""Stage times are folded into the cost table 16 at a time: updating a shared table after
every run touches cold memory for tens of microseconds; the moving average is the same."""


@dataclass(frozen=True, slots=True)
class StageIO:
    """Where a stage read and wrote its tensors: ``EventInfo.extra`` of ``AFTER_STAGE``.

    Built only when someone listens to ``AFTER_STAGE``. With zero-copy, a consumer's input
    address equals its producer's output address (the very same pool buffer).
    """

    inputs: Mapping[str, int]
    """Input name -> address of the first byte read."""
    outputs: Mapping[str, int]
    """Output name -> address of the first byte written (empty when the stage failed)."""
    bound: bool
    """True when the outputs were written straight into pool buffers (IO binding)."""


def _address(obj: Any) -> int:
    if type(obj) is TensorBuffer:
        return obj.ptr
    try:
        return int(obj.__array_interface__["data"][0])
    except (AttributeError, KeyError, TypeError):
        return 0  # not an array (a sequence, a map): no single address


class StageRuntime:
    """A compiled stage as the scheduler runs it."""

    __slots__ = (
        "analytic_s",
        "bound",
        "compiled",
        "device",
        "domain",
        "fallback_reason",
        "input_names",
        "key",
        "labels",
        "name",
        "output_names",
        "sid",
        "samples",
        "spec",
        "specs",
    )

    def __init__(self, spec: Any, compiled: Any, key: str, analytic_s: float, domain: str):
        self.spec = spec
        self.sid: int = spec.id
        self.name: str = spec.name
        self.device: str = spec.device
        self.compiled = compiled
        self.key = key
        self.analytic_s = analytic_s
        self.domain = domain
        self.input_names = frozenset(compiled.input_names)
        self.output_names = tuple(compiled.output_names)
        self.labels = tuple(f"{spec.name}:{o}" for o in self.output_names)
        specs_fn = getattr(compiled, "output_specs", None)
        specs = specs_fn() if specs_fn is not None and hasattr(compiled, "run_into") else None
        self.specs: tuple[tuple[np.dtype[Any], tuple[int, ...]], ...] | None = (
            tuple((np.dtype(d), tuple(s)) for d, s in specs) if specs is not None else None
        )
        self.bound = self.specs is not None
        self.samples: list[float] = []  # run times not yet folded into the cost table
        self.fallback_reason: str | None = (
            None if self.bound else
            "the backend cannot run it in place" if specs_fn is None else
            "dynamic output shapes or types that cannot be bound"
        )


class Program:
    """What one kind of request (its wanted outputs and fed inputs) does, computed once.

    ``inputs[sid]``: (input name, key into the request's values) per stage input, where the
    key is the value's name when the stage reads it where it was produced (or fed), and
    ``(name, domain)`` for the copy the transfer engine made in the stage's domain.
    ``outs[sid]``: per output (index, name, references, consumer stages on shared memory,
    domains it must be transferred to). ``xfers[(name, domain)]``: (references, consumers)
    of a transferred copy.
    """

    __slots__ = ("direct", "feed_xfers", "has_transfers", "initial", "inputs", "missing0", "n_tasks", "outs",
                 "stages", "wanted", "xfers")

    def __init__(self) -> None:
        self.stages: tuple[StageRuntime, ...] = ()
        self.initial: tuple[StageRuntime, ...] = ()
        self.missing0: list[int] = []
        self.inputs: dict[int, tuple[tuple[str, Any], ...]] = {}
        self.outs: dict[int, tuple[tuple[int, str, int, tuple[int, ...], tuple[str, ...]], ...]] = {}
        self.xfers: dict[tuple[str, str], tuple[int, tuple[int, ...]]] = {}
        self.feed_xfers: tuple[tuple[str, str], ...] = ()
        self.wanted: tuple[tuple[str, Any], ...] = ()
        self.n_tasks = 0
        self.has_transfers = False
        self.direct: frozenset[int] = frozenset()
        """Stages whose outputs only the caller reads (on memory the host shares): when the caller
        wants arrays it keeps, the backend allocates them and they are handed over as they are."""


def build_program(
    stages: Sequence[StageRuntime],
    output_source: Mapping[str, int | None],
    wanted: Sequence[str],
    fed: Sequence[str],
    topology: Topology,
    host: str,
) -> Program:
    """Precompute the bookkeeping of requests asking ``wanted`` with inputs ``fed``."""
    needed: set[int] = set()
    stack = [output_source[n] for n in wanted if output_source.get(n) is not None]
    while stack:
        sid = stack.pop()
        if sid is None or sid in needed:
            continue
        needed.add(sid)
        stack.extend(stages[sid].spec.deps)
    prog = Program()
    prog.stages = tuple(s for s in stages if s.sid in needed)
    fed_set = set(fed)
    shares = topology.shares_memory
    missing = [0] * len(stages)
    # consumers[name] = [(sid, domain)], the caller as sid -1 in the host domain
    consumers: dict[str, list[tuple[int, str]]] = {}
    for st in prog.stages:
        ins: list[tuple[str, Any]] = []
        for name in st.spec.inputs:
            if name not in st.input_names:
                continue
            src = output_source.get(name)
            if src is None or src not in needed:
                if name not in fed_set:
                    continue  # an optional input nobody fed: the stage model's own default applies
                if shares(host, st.domain):
                    ins.append((name, name))
                    continue
                src_domain = host
            else:
                src_domain = stages[src].domain
            consumers.setdefault(name, []).append((st.sid, st.domain))
            ins.append((name, name if shares(src_domain, st.domain) else (name, st.domain)))
            missing[st.sid] += 1
        prog.inputs[st.sid] = tuple(ins)
    for name in dict.fromkeys(wanted):
        src = output_source.get(name)
        if src is not None and src in needed:
            consumers.setdefault(name, []).append((-1, host))
    n_xfers = 0
    feed_xfers: list[tuple[str, str]] = []
    for name in fed:
        remote: dict[str, list[int]] = {}
        for sid, dom in consumers.get(name, ()):
            if sid >= 0 and not shares(host, dom):
                remote.setdefault(dom, []).append(sid)
        for dom, sids in remote.items():
            prog.xfers[(name, dom)] = (len(sids), tuple(sids))
            feed_xfers.append((name, dom))
            n_xfers += 1
    direct: set[int] = set()
    for st in prog.stages:
        outs = []
        if all(sid < 0 and shares(st.domain, dom) for name in st.output_names for sid, dom in consumers.get(name, ())):
            direct.add(st.sid)
        for i, name in enumerate(st.output_names):
            same: list[int] = []
            refs = 0
            remote = {}
            for sid, dom in consumers.get(name, ()):
                if shares(st.domain, dom):
                    refs += 1
                    if sid >= 0:
                        same.append(sid)
                else:
                    remote.setdefault(dom, []).append(sid)
            for dom, sids in remote.items():
                refs += 1  # the transfer's read of the source
                prog.xfers[(name, dom)] = (len(sids), tuple(s for s in sids if s >= 0))
                n_xfers += 1
            outs.append((i, name, refs, tuple(same), tuple(remote)))
        prog.outs[st.sid] = tuple(outs)
    wanted_keys = []
    for name in dict.fromkeys(wanted):
        src = output_source.get(name)
        if src is not None and src in needed and not shares(stages[src].domain, host):
            wanted_keys.append((name, (name, host)))
        else:
            wanted_keys.append((name, name))
    prog.wanted = tuple(wanted_keys)
    prog.missing0 = missing
    prog.initial = tuple(s for s in prog.stages if missing[s.sid] == 0)
    prog.feed_xfers = tuple(feed_xfers)
    prog.n_tasks = len(prog.stages) + n_xfers
    prog.has_transfers = n_xfers > 0
    prog.direct = frozenset(direct)
    return prog


class Admission:
    """At most ``limit`` requests admitted at once; the others wait, first come first served.

    Event-loop only. Admission with room left costs no event-loop round trip (an anyio
    ``Semaphore`` checkpoints on the way in), which matters at a few microseconds a request.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.active = 0
        self.peak = 0
        self._waiters: deque[anyio.Event] = deque()

    def try_acquire(self) -> bool:
        if self.active < self.limit and not self._waiters:
            self.active += 1
            if self.active > self.peak:
                self.peak = self.active
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


class Request:
    """One request in flight: its values, readiness counters and the references it owes."""

    __slots__ = ("closed", "copy_out", "done", "error", "event", "key", "lock", "missing", "owed", "priority",
                 "program", "remaining", "result", "rid", "running", "stream", "vals", "work")

    def __init__(self, rid: int, priority: int, key: float, program: Program, feeds: Mapping[str, Any], waiter: Any,
                 copy_out: bool = True):
        self.rid = rid
        self.priority = priority
        self.key = key
        self.program = program
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
        self.event = waiter  # an asyncio future or an anyio Event: see Scheduler._new_waiter
        self.copy_out = copy_out
        self.result: list[tuple[str, Any]] | None = None
        self.stream: Any = None
        """The :class:`~hetsched.ResultStream` that admitted it (told instead of a waiting task)."""

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
        """Release every reference still owed (the request is closed and nothing of it runs)."""
        owed, self.owed = self.owed, {}
        for buf, n in owed.items():
            for _ in range(n):
                buf.release()


class DeviceWorkers:
    """The worker thread(s) of one device (or of CPU devices on the same cores), fed by one heap.

    The heap is guarded by a plain lock; sleeping workers wait on a ``queue.SimpleQueue`` of
    wake-up tokens, one per pushed stage (a C-level blocking get: a ``threading.Condition``
    costs tens of microseconds of Python per hand-off with the caches cold after a stage).
    """

    def __init__(self, devices: Sequence[str], cpu_sets: Sequence[tuple[int, ...]], scheduler: Scheduler):
        self.devices = tuple(devices)
        self.name = "+".join(devices)
        self._scheduler = scheduler
        self._heap: list[tuple[float, int, Request, StageRuntime]] = []
        self._lock = threading.Lock()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._seq = scheduler._seq
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._main, args=(cpus,), name=f"hetsched-{self.name}"
                             + (f"-{i}" if len(cpu_sets) > 1 else ""), daemon=True)
            for i, cpus in enumerate(cpu_sets)
        ]
        self.runs = 0

    @property
    def concurrency(self) -> int:
        return len(self._threads)

    @property
    def queued(self) -> int:
        return len(self._heap)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def push(self, req: Request, st: StageRuntime) -> None:
        with self._lock:
            heapq.heappush(self._heap, (req.key, next(self._seq), req, st))
        self._tokens.put(True)

    def stop(self) -> None:
        self._stopping = True
        for _ in self._threads:
            self._tokens.put(False)

    def drain(self) -> list[Request]:
        """After :meth:`join`: the requests whose stages were still queued (never to run now)."""
        with self._lock:
            left, self._heap = self._heap, []
        return list({id(r): r for _, _, r, _ in left}.values())

    def join(self) -> None:
        for t in self._threads:
            t.join()

    def _main(self, cpus: tuple[int, ...]) -> None:
        from hetsched.backends.cpu import pin_current_thread

        pin_current_thread(cpus)
        sched = self._scheduler
        run = sched.run_stage
        lock = self._lock
        heap = self._heap
        pop = heapq.heappop
        get = self._tokens.get
        while True:
            if not get() or self._stopping:
                return  # stages still queued are failed by the scheduler (see Scheduler.abort)
            with lock:
                # one token per pushed stage, so the heap is not empty; the most urgent goes first
                _, _, req, st = pop(heap)
            if sched._deferred:
                sched.flush_deferred()  # this queue may have run short: refill it meanwhile
            run(req, st, self)
            if sched._deferred:
                sched.flush_deferred()


class Scheduler:
    """Runs requests through the compiled stages on the device workers.

    Owned by a :class:`~hetsched.Session`; all of its public methods except
    :meth:`run_stage` run on the session's event loop.
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
        self._programs: dict[tuple[tuple[str, ...], tuple[str, ...]], Program] = {}
        self._output_source: Mapping[str, int | None] = {}
        self._loop_thread = threading.get_ident()
        native = anyio.lowlevel.current_token().native_token
        # asyncio: loop.call_soon_threadsafe; trio: TrioToken.run_sync_soon. Neither blocks the worker.
        self._call_soon: Callable[..., object] = (
            getattr(native, "call_soon_threadsafe", None) or native.run_sync_soon
        )
        self._asyncio = hasattr(native, "create_future")
        self._new_waiter: Callable[[], Any] = native.create_future if self._asyncio else anyio.Event
        self._lock = threading.Lock()
        # Completion coalescing (see _wake_finished): finished requests whose callers have
        # not been woken yet.
        self._deferred: list[Request] = []
        self._deferred_entry: dict[int, DeviceWorkers] = {}
        """The workers the deferred callers' next requests would start on."""
        self._deferred_until = 0.0
        """``time.monotonic()`` by which the deferred wake-ups are delivered in any case."""
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

    def set_stages(self, stages: list[StageRuntime], output_source: Mapping[str, int | None]) -> None:
        self.stages = stages
        self._output_source = output_source
        self._programs.clear()

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
        key = (tuple(wanted), tuple(fed))
        prog = self._programs.get(key)
        if prog is None:
            if len(self._programs) > 256:  # bounded: a model has few (outputs, inputs) combinations
                self._programs.clear()
            prog = self._programs[key] = build_program(self.stages, self._output_source, wanted, fed,
                                                       self.topology, self.host)
        return prog

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
                while True:  # one wake-up: the last stage done, or a failure
                    if self._asyncio:
                        await req.event
                    else:
                        await req.event.wait()
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
        return Request(rid, priority, time.monotonic() + priority * self._step, program, feeds,
                       self._new_waiter() if waiter is _NEW else waiter, copy_out)

    # Waking the request's task. On asyncio a bare future is used: resolving one is the
    # cheapest cross-thread wake-up asyncio has (an anyio Event adds layers that cost tens of
    # microseconds with the caches cold after a stage); other backends use an anyio Event.

    def set_waiter(self, waiter: Any) -> None:
        """Resolve a waiter made by ``_new_waiter`` (event-loop thread; idempotent)."""
        if self._asyncio:
            if not waiter.done():
                waiter.set_result(None)
        else:
            waiter.set()

    async def wait_on(self, waiter: Any) -> None:
        """Wait until ``waiter`` (made by ``_new_waiter``) is resolved."""
        if self._asyncio:
            await waiter
        else:
            await waiter.wait()

    async def _wait(self, req: Request) -> None:
        await self.wait_on(req.event)
        req.event = self._new_waiter()

    def _fire(self, req: Request) -> None:
        """Wake ``req``'s task (event-loop thread only)."""
        if req.stream is not None:
            req.stream._finished(req)
            return
        self.set_waiter(req.event)

    def _wake(self, req: Request) -> None:
        """Wake ``req``'s task from any thread."""
        if req.stream is not None:
            req.stream._finished(req)  # thread-safe; admits the stream's next request
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
        tells its stream instead.
        """
        if req.stream is not None:
            req.stream._finished(req)
            return
        if req.priority >= _COALESCE_FROM and self._coalescing:
            workers = self.workers
            entry = [workers[st.device] for st in req.program.initial if st.device in workers]
            if self._busy(entry):
                now = time.monotonic()
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
        if self._busy(list(self._deferred_entry.values())) and time.monotonic() < self._deferred_until:
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
                    ready.append(self.stages[sid])
            req.remaining -= 1
            if not req.remaining:
                self._finish_locked(req)
                self._fire(req)
        for st in ready:
            self.workers[st.device].push(req, st)

    # -- the worker side -------------------------------------------------------------------

    def run_stage(self, req: Request, st: StageRuntime, worker: DeviceWorkers) -> None:
        """Run one stage of ``req`` in a device worker thread and account for its outputs.

        Whatever goes wrong here (the stage, a hook, the runtime) fails this request only:
        the worker thread keeps serving the others.
        """
        inputs = req.program.inputs[st.sid]
        feeds: dict[str, Any] = {}
        err: BaseException | None = None
        with req.lock:
            if req.closed:
                return  # cancelled or failed meanwhile: the stage is dropped, never run
            req.running += 1
            vals = req.vals
            try:
                for name, key in inputs:
                    obj = vals[key]
                    feeds[name] = obj.array() if type(obj) is TensorBuffer else obj
            except BaseException as exc:
                err = exc
        dev = st.device
        listeners = self._dispatch.listeners
        before = listeners[Event.BEFORE_STAGE]
        if before and err is None:
            try:
                info = EventInfo(Event.BEFORE_STAGE, time.perf_counter(), req.rid, Priority(req.priority), st.name,
                                 dev)
                for fn in before:
                    fn(info)
            except BaseException as exc:
                err = exc
        results: list[Any] | None = None
        # outputs only the caller reads, as arrays it keeps: the backend's own allocation is
        # handed over as it is (no pool buffer, no copy); otherwise into fresh pool buffers
        direct = req.copy_out and st.sid in req.program.direct
        bound = st.bound and not direct
        elapsed = 0.0
        if err is None:
            t0 = time.perf_counter()
            try:
                results = self._run_bound(st, feeds, dev) if bound else None
                if results is None:
                    bound = False
                    results = st.compiled.run(feeds)
            except StageExecutionError as exc:
                err = exc
            except Exception as exc:  # a backend that did not translate its error
                err = StageExecutionError(f"stage {st.name!r} failed on device {dev!r}: {exc}", stage=st.name,
                                          device=dev)
                err.__cause__ = exc
            if err is not None and bound:
                # The in-place run failed: when the backend's own allocation works, its static
                # output specs were wrong for this data; stop binding the stage.
                try:
                    results = st.compiled.run(feeds)
                except Exception:
                    pass  # a real failure: report the first error
                else:
                    err = None
                    bound = st.bound = False
                    st.fallback_reason = "actual output shapes differed from the inferred ones"
            elapsed = time.perf_counter() - t0
            learned: list[float] | None = None
            with self._lock:
                worker.runs += 1
                if err is None:
                    if bound:
                        self.stage_runs_bound += 1
                    elif direct and st.bound:
                        self.stage_runs_to_caller += 1
                    else:
                        self.stage_runs_unbound += 1
                    if self._learn:
                        st.samples.append(elapsed)
                        if len(st.samples) >= _LEARN_BATCH:
                            learned, st.samples = st.samples, []
            if learned:
                self._learn_from(st, learned)
        after = listeners[Event.AFTER_STAGE]
        if after:
            try:
                io = StageIO({k: _address(v) for k, v in feeds.items()},
                             {k: _address(v) for k, v in zip(st.output_names, results or ())}, bound)
                info = EventInfo(Event.AFTER_STAGE, time.perf_counter(), req.rid, Priority(req.priority), st.name,
                                 dev, elapsed_s=elapsed, error=err, extra=io)
                for fn in after:
                    fn(info)
            except BaseException as exc:
                err = err or exc
        self._complete(req, st, results, err, inputs)

    def _learn_from(self, st: StageRuntime, samples: list[float]) -> None:
        for elapsed in samples:  # the same moving average as one update per run, just later
            self._costs.update(st.key, st.device, elapsed, analytic_s=st.analytic_s)

    def flush_costs(self) -> None:
        """Fold the stage times not yet learned into the cost table (see ``_LEARN_BATCH``)."""
        for st in self.stages:
            with self._lock:
                samples, st.samples = st.samples, []
            if samples:
                self._learn_from(st, samples)

    def _run_bound(self, st: StageRuntime, feeds: dict[str, Any], dev: str) -> list[Any] | None:
        """Run ``st`` writing into fresh pool buffers; None when the pool has no room now
        (a capacity bound): then this run falls back to backend-allocated outputs."""
        pool = self.pools[st.domain]
        specs = st.specs
        assert specs is not None
        outs: list[TensorBuffer] = []
        try:
            for spec, label in zip(specs, st.labels):
                outs.append(pool.acquire_nowait(spec, owner=dev, label=label))
        except anyio.WouldBlock:
            for b in outs:
                b.release()
            return None
        try:
            arrays = [b.array() for b in outs]
            for b in outs:
                b.activate(owner=dev)  # ACTIVE while the stage writes it
            try:
                st.compiled.run_into(feeds, arrays)
            finally:
                for b in outs:
                    b.deactivate()
        except BaseException:
            for b in outs:
                b.release()
            raise
        return outs

    def _complete(self, req: Request, st: StageRuntime, results: list[Any] | None, err: BaseException | None,
                  inputs: tuple[tuple[str, Any], ...]) -> None:
        ready: list[StageRuntime] = []
        notify = finished = False
        with req.lock:
            req.running -= 1
            vals = req.vals
            for _, key in inputs:
                obj = vals[key]
                if type(obj) is TensorBuffer:
                    req.drop_locked(obj)
            if err is not None and not req.closed:
                req.error = err
                req.closed = True
                notify = True
            if req.closed:
                if results is not None:
                    for obj in results:
                        if type(obj) is TensorBuffer:
                            obj.release()
                if not req.running:
                    req.finalize_locked()
            else:
                assert results is not None
                missing = req.missing
                stages = self.stages
                for i, name, refs, same, remote in req.program.outs[st.sid]:
                    obj = results[i]
                    if type(obj) is TensorBuffer:
                        if not refs:
                            obj.release()  # nobody in this request reads it
                            continue
                        if refs > 1:
                            obj.retain(refs - 1)
                        req.owed[obj] = refs
                    vals[name] = obj
                    for sid in same:
                        missing[sid] -= 1
                        if not missing[sid]:
                            ready.append(stages[sid])
                    if remote:
                        req.work.extend((name, d) for d in remote)
                        notify = True
                req.remaining -= 1
                if not req.remaining:
                    self._finish_locked(req)
                    finished = not notify
                    notify = True
        for nxt in ready:
            self.workers[nxt.device].push(req, nxt)
        if finished:
            self._wake_finished(req)
        elif notify:
            self._wake(req)

    # -- introspection -------------------------------------------------------------------

    def queued(self) -> int:
        return sum(w.queued for w in self.unique_workers())


_MISSING = object()
_COALESCE_FROM = int(Priority.NORMAL)
"""Requests at least this patient (NORMAL, BACKGROUND) may have their wake-up coalesced."""
_DEFER_FRACTION = 0.1
"""A deferred wake-up waits at most this fraction of the request's time in the system..."""
_DEFER_MIN_S = 0.0005
"""...or this long, whichever is more."""
