"""Device workers: the threads that run stages, one heap of queued stages per worker group.

Each worker thread knows who it is (:class:`WorkerInfo`: its device, its index among the
device's threads, the cores it is pinned to) and keeps the per-worker state of the stages it
runs that ask for one (a backend's ``worker_state`` hook: one RKNN context per NPU core, one
TensorRT execution context per thread), created on the thread before the stage's first run
there and closed on the thread when the worker stops. A state found dead (the stage's
``worker_state_alive`` says so, or a run on it raised ``DeviceFailedError``) is closed and
built anew before the next run: one crashed toolkit process costs the runs in it, not the
worker.
"""

from __future__ import annotations

import contextlib
import heapq
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hetsched.backends._base import WorkerInfo

from .._errors import RuntimeStateError
from .._platform.affinity import pin_current_thread

if TYPE_CHECKING:
    from ._program import StageRuntime
    from ._requests import Request

__all__ = ["DeviceWorkers", "WorkerHost", "WorkerInfo", "close_states"]

_NO_STATE: Any = object()


class WorkerHost(Protocol):
    """What the workers need of the scheduler (read on every pop: plain attributes)."""

    @property
    def _seq(self) -> Iterator[int]: ...

    _deferred: list[Request]
    """Finished requests whose wake-up is deferred; while not empty, a worker calls
    :meth:`flush_deferred` after each pop and each stage."""

    def run_stage(self, req: Request, st: StageRuntime, worker: DeviceWorkers) -> None: ...

    def flush_deferred(self) -> None: ...

    def state_renewed(self) -> None:
        """A worker dropped a dead per-worker state (counted in the session's statistics)."""
        ...




def _alive(st: StageRuntime, state: object) -> bool:
    """``st.state_alive(state)``; a hook that raises cannot vouch for the state: dead."""
    probe = st.state_alive
    if probe is None:
        return True
    try:
        return bool(probe(state))
    except Exception:
        return False


def close_states(states: Sequence[tuple[StageRuntime, object]]) -> BaseException | None:
    """Close per-worker states with their stages' ``close_worker_state``; the first error."""
    first: BaseException | None = None
    for st, state in states:
        hook = st.hooks.worker_state
        if hook is None:
            continue
        try:
            hook.close_worker_state(state)
        except Exception as exc:
            first = first or exc
    return first


class DeviceWorkers:
    """The worker thread(s) of one device (or of CPU devices on the same cores), fed by one heap.

    The heap is guarded by a plain lock; sleeping workers wait on a ``queue.SimpleQueue`` of
    wake-up tokens, one per pushed stage (a C-level blocking get: a ``threading.Condition``
    costs tens of microseconds of Python per hand-off with the caches cold after a stage).

    """

    def __init__(self, devices: Sequence[str], cpu_sets: Sequence[tuple[int, ...]], scheduler: WorkerHost):
        self.devices = tuple(devices)
        self.name = "+".join(devices)
        self._scheduler = scheduler
        self._heap: list[tuple[float, int, Request, StageRuntime]] = []
        self._lock = threading.Lock()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._seq = scheduler._seq
        self._stopping = False
        self._local = threading.local()
        self.infos = tuple(WorkerInfo(self.name, i, tuple(cpus), self.devices) for i, cpus in enumerate(cpu_sets))
        self._all_states: list[dict[StageRuntime, object]] = [{} for _ in self.infos]
        """Per thread, its per-worker stage states (each thread uses its own; the lock guards
        taking a drained plan's states from another thread)."""
        self._states_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._main, args=(info,), name=f"hetsched-{self.name}"
                             + (f"-{info.index}" if len(cpu_sets) > 1 else ""), daemon=True)
            for info in self.infos
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

    def state_for(self, st: StageRuntime) -> object:
        """This worker thread's state for stage ``st`` (worker thread only), created on first use
        by the stage's declared ``hooks.worker_state.worker_state(info)``, and created anew when the one it had is dead
        (``worker_state_alive`` says so, or :meth:`renew_state` dropped it after a device
        failure): a crashed device context costs the runs that were in it, not the worker.

        :raises Exception: whatever ``worker_state`` raised (the run fails; the next run of the
            stage on this thread tries again).
        """
        states: dict[StageRuntime, object] = self._local.states
        state = states.get(st, _NO_STATE)
        if state is not _NO_STATE:
            if st.state_alive is None or _alive(st, state):
                return state
            self._drop_state(st)
        hook = st.hooks.worker_state
        if hook is None:  # the scheduler asks only for stages that declared per-worker state
            raise RuntimeStateError(f"stage {st.name!r} keeps no per-worker state")
        state = hook.worker_state(self._local.info)
        with self._states_lock:
            states[st] = state
        return state

    def renew_state(self, st: StageRuntime) -> None:
        """A run of ``st`` on this worker thread failed with
        :class:`~hetsched.DeviceFailedError`: drop its state unless the stage says it still
        works (``worker_state_alive``); the next run builds a new one (worker thread only)."""
        states: dict[StageRuntime, object] = self._local.states
        state = states.get(st, _NO_STATE)
        if state is _NO_STATE:
            return
        if st.state_alive is not None and _alive(st, state):
            return
        self._drop_state(st)

    def prepare_state(self, st: StageRuntime) -> None:
        """Build this thread's state of ``st`` now if it has none (worker thread): after a device
        failure dropped it, or its build failed, so that no request waits on the build or fails
        with it. A failure here is no request's: the next run of ``st`` meets it."""
        if st in self._local.states:
            return
        with contextlib.suppress(Exception):
            self.state_for(st)

    def _drop_state(self, st: StageRuntime) -> None:
        """Forget and close this thread's state of ``st`` (a dead context; worker thread only).
        Closing it may fail (its process is gone): that is no run's error."""
        states: dict[StageRuntime, object] = self._local.states
        with self._states_lock:
            state = states.pop(st, _NO_STATE)
        if state is not _NO_STATE:
            close_states([(st, state)])
            self._scheduler.state_renewed()

    def take_states(self, stages: Sequence[StageRuntime]) -> list[tuple[StageRuntime, object]]:
        """Remove and return every thread's states of ``stages`` (any thread), for the owner to
        close: the stages of a drained plan, which no thread runs any more."""
        wanted = set(stages)
        out: list[tuple[StageRuntime, object]] = []
        with self._states_lock:
            for states in self._all_states:
                for st in [s for s in states if s in wanted]:
                    out.append((st, states.pop(st)))
        return out

    def _close_states(self) -> None:
        """Close this thread's per-worker states (worker thread, as it stops).

        :raises Exception: the first error a ``close_worker_state`` raised, after every state
            was closed (reported by ``threading.excepthook``; the other workers stop normally).
        """
        states: dict[StageRuntime, object] = self._local.states
        with self._states_lock:
            left = list(states.items())
            states.clear()
        first = close_states(left)
        if first is not None:
            raise first

    def _main(self, info: WorkerInfo) -> None:
        pin_current_thread(info.cpus)
        self._local.info = info
        self._local.states = self._all_states[info.index]
        try:
            self._serve()
        finally:
            self._close_states()

    def _serve(self) -> None:
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
