"""The worker side of the scheduler: run one stage of a request and account for its outputs.

:class:`StageRunner` is its own object: the :class:`~hetsched._runtime._scheduler.Scheduler`
makes one and hands device workers its :meth:`StageRunner.run_stage`. What the runner needs of
the scheduler is declared by :class:`StageHost` (pushing ready stages, finishing and waking
requests); what it needs of a request's session comes from the request's tenant (hooks, cost
table, failover, per-device busy time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._errors import DeviceFailedError, StageExecutionError
from .._events import Event, EventInfo, Priority
from ._buffers import BufferPool, TensorBuffer
from ._order import late
from ._program import StageIO, StageRuntime, address
from ._requests import Request
from ._workers import DeviceWorkers

if TYPE_CHECKING:
    from ._tenants import Tenant

__all__ = ["StageHost", "StageRunner"]

_LEARN_BATCH = 16
"""Stage times are folded into the cost table 16 at a time: updating a shared table after
every run touches cold memory for tens of microseconds; the moving average is the same."""
_EWMA = 0.1
"""Weight of a new run in a tenant's per-stage estimate (Band's latency estimator: 0.1)."""


class StageHost(Protocol):
    """What the stage runner needs of the scheduler (any thread)."""

    workers: dict[str, DeviceWorkers]
    """Device name -> its workers (empty once they stopped)."""
    priorities: bool

    def push(self, req: Request, st: StageRuntime) -> None:
        """Queue ``st`` of ``req`` on its device's heap, keyed for its tenant's order."""
        ...

    def finish_locked(self, req: Request) -> None:
        """``req``'s last task is done (under ``req.lock``)."""
        ...

    def wake_finished(self, req: Request) -> None:
        """Wake the task of ``req``, which finished without error (may be coalesced)."""
        ...

    def wake(self, req: Request) -> None:
        """Wake the task of ``req`` now (it failed, or the loop has work for it)."""
        ...


def _translate(exc: BaseException, st: StageRuntime, dev: str) -> StageExecutionError:
    """What a backend raised, as the request's error (its own StageExecutionError as it is)."""
    if isinstance(exc, StageExecutionError):
        return exc
    err = StageExecutionError(f"stage {st.name!r} failed on device {dev!r}: {type(exc).__name__}: {exc}",
                              stage=st.name, device=dev)
    err.__cause__ = exc
    return err


def _check_results(results: Any, st: StageRuntime, dev: str) -> StageExecutionError | None:
    """The backend's contract: one value per output name, in order (None or a short list is a bug
    of the backend; it fails this request, not the worker)."""
    n = len(st.output_names)
    try:
        got = len(results)
    except TypeError:
        got = -1
    if got == n and results is not None:
        return None
    what = "None" if results is None else (f"{type(results).__name__}" if got < 0 else f"{got} values")
    return StageExecutionError(
        f"stage {st.name!r} on device {dev!r}: the backend broke its contract: run() returned {what}, "
        f"expected a sequence of {n} value(s) for outputs {list(st.output_names)}", stage=st.name, device=dev)


class StageRunner:
    """Runs stages in device worker threads (see the module docstring); thread-safe.

    :param host: the scheduler (:class:`StageHost`).
    :param pools: the board's buffer pools, by memory domain.
    :param perf: the clock stage runs are timed with (``Clock.perf_counter``).
    """

    def __init__(self, host: StageHost, pools: Mapping[str, BufferPool], perf: Callable[[], float]):
        self._host = host
        self.pools = dict(pools)
        self._perf = perf
        self.lock = threading.Lock()
        """Guards the counters below, the tenants' busy time and stages' samples."""
        self.stage_runs_bound = 0
        self.stage_runs_unbound = 0
        self.stage_runs_to_caller = 0
        self.allocation_failures = 0
        self.states_renewed = 0
        """Per-worker states dropped as dead and built anew (see ``DeviceWorkers.state_for``)."""

    def run_stage(self, req: Request, st: StageRuntime, worker: DeviceWorkers) -> None:
        """Run one stage of ``req`` in a device worker thread and account for its outputs.

        Whatever goes wrong here (the stage, a hook, the runtime) fails this request only:
        the worker thread keeps serving the others.
        """
        tenant = req.tenant
        assert tenant is not None, "a scheduled request belongs to a tenant"
        if (req.deadline is not None and not req.flagged and not req.closed and self._host.priorities
                and late(tenant, req, st, worker)):
            return  # it can no longer meet its deadline: queued again behind those that still can
        inputs = req.program.inputs[st.sid]
        feeds: dict[str, Any] = {}
        err: BaseException | None = None
        device_error = False
        with req.lock:
            if req.closed or req.parked:
                return  # cancelled, failed or starting over meanwhile: the stage is dropped, never run
            req.running += 1
            vals = req.vals
            try:
                for name, key in inputs:
                    obj = vals[key]
                    feeds[name] = obj.array() if type(obj) is TensorBuffer else obj
            except BaseException as exc:
                err = exc
        dev = st.device
        listeners = tenant.dispatch.listeners
        before = listeners[Event.BEFORE_STAGE]
        if before and err is None:
            try:
                info = EventInfo(Event.BEFORE_STAGE, self._perf(), req.rid, Priority(req.priority), st.name,
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
        energy: float | None = None
        if err is None:
            t0 = self._perf()
            try:
                results = self._run_bound(st, feeds, dev, worker) if bound else None
                if results is None:
                    bound = False
                    # only stages declaring worker_state get a state (the others cost one flag)
                    results = (st.compiled.run(feeds, state=worker.state_for(st)) if st.stateful
                               else st.compiled.run(feeds))
            except BaseException as exc:  # KeyboardInterrupt/SystemExit from a backend too: never the worker's
                err = _translate(exc, st, dev)
                device_error = isinstance(err, DeviceFailedError)
            if device_error and st.stateful:
                # the device context this worker holds may be what died (a killed toolkit
                # process): drop it, the next run builds a new one (see DeviceWorkers.state_for)
                worker.renew_state(st)
            if err is not None and bound and not device_error:
                # The in-place run failed: when the backend's own allocation works, its static
                # output specs were wrong for this data; stop binding the stage. (A device
                # failure says nothing about the specs: the request starts over instead.)
                try:
                    results = (st.compiled.run(feeds, state=worker.state_for(st)) if st.stateful
                               else st.compiled.run(feeds))
                except BaseException:
                    pass  # a real failure: report the first error
                else:
                    err = None
                    device_error = False
                    bound = st.bound = False
                    st.fallback_reason = "actual output shapes differed from the inferred ones"
            if err is None and not bound:
                err = _check_results(results, st, dev)
                if err is not None:
                    results = None
            elapsed = self._perf() - t0
            if err is None and st.energy_fn is not None:
                try:
                    energy = float(st.energy_fn())
                except Exception:
                    energy = None  # energy is a report: a backend failing to give it fails no request
            failover = tenant.failover
            if failover is not None and err is None and failover.streak:
                failover.on_success(dev)
            learned: list[float] | None = None
            seconds = elapsed
            if err is None and st.seconds_fn is not None:
                try:
                    seconds = float(st.seconds_fn())
                except Exception:
                    seconds = elapsed  # a report: a backend failing to give it fails no request
            with self.lock:
                worker.runs += 1
                tenant.stage_runs += 1
                busy = tenant.busy
                busy[dev] = busy.get(dev, 0.0) + seconds
                if err is None:
                    if bound:
                        self.stage_runs_bound += 1
                    elif direct and st.bound:
                        self.stage_runs_to_caller += 1
                    else:
                        self.stage_runs_unbound += 1
                    if tenant.tracks:  # estimates feed deadlines and fair tags only
                        est = tenant.estimates
                        old = est.get(st)
                        est[st] = seconds if old is None else old + _EWMA * (seconds - old)
                    if tenant.learn:
                        st.samples.append(seconds)
                        if len(st.samples) >= _LEARN_BATCH:
                            learned, st.samples = st.samples, []
            if learned and tenant.costs is not None:
                tenant.learn_from(st, learned)
        after = listeners[Event.AFTER_STAGE]
        if after:
            try:
                io = StageIO({k: address(v) for k, v in feeds.items()},
                             {k: address(v) for k, v in zip(st.output_names, results or (), strict=False)}, bound)
                info = EventInfo(Event.AFTER_STAGE, self._perf(), req.rid, Priority(req.priority), st.name,
                                 dev, elapsed_s=elapsed, error=err, extra=io, energy_j=energy)
                for fn in after:
                    fn(info)
            except BaseException as exc:
                err = err or exc
        self._complete(req, tenant, st, results, err, inputs, energy, device_error)
        if device_error and st.stateful and st in tenant.stages:
            # the request starts over meanwhile (another worker may take it): this worker builds
            # its new context now, not with the next request waiting on it (or failing with it)
            worker.prepare_state(st)

    def state_renewed(self) -> None:
        """A worker dropped a dead per-worker state (worker thread)."""
        with self.lock:
            self.states_renewed += 1

    def _run_bound(self, st: StageRuntime, feeds: dict[str, Any], dev: str,
                   worker: DeviceWorkers) -> list[Any] | None:
        """Run ``st`` writing into fresh pool buffers; None when the pool has no room now
        (a capacity bound): then this run falls back to backend-allocated outputs."""
        pool = self.pools[st.domain]
        specs = st.specs
        assert specs is not None
        outs: list[TensorBuffer] = []
        try:
            for spec, label in zip(specs, st.labels, strict=True):
                outs.append(pool.acquire_nowait(spec, owner=dev, label=label))
        except Exception as exc:
            # the pool is full (WouldBlock) or could not allocate (an mmap failing, memory
            # running out): this run writes into backend-allocated outputs; the stage stays
            # bound, as the failure says nothing about its shapes
            for b in outs:
                b.release()
            if not isinstance(exc, anyio.WouldBlock):
                with self.lock:
                    self.allocation_failures += 1
            return None
        try:
            arrays = [b.array() for b in outs]
            for b in outs:
                b.activate(owner=dev)  # ACTIVE while the stage writes it
            try:
                if st.stateful:
                    st.compiled.run_into(feeds, arrays, state=worker.state_for(st))
                else:
                    st.compiled.run_into(feeds, arrays)
            finally:
                for b in outs:
                    b.deactivate()
        except BaseException:
            for b in outs:
                b.release()
            raise
        return outs

    def _complete(self, req: Request, tenant: Tenant, st: StageRuntime, results: list[Any] | None,
                  err: BaseException | None, inputs: tuple[tuple[str, Any], ...], energy: float | None = None,
                  device_error: bool = False) -> None:
        host = self._host
        ready: list[StageRuntime] = []
        notify = finished = restart = False
        with req.lock:
            req.running -= 1
            vals = req.vals
            for _, key in inputs:
                obj = vals.get(key)
                if type(obj) is TensorBuffer:
                    req.drop_locked(obj)
            if energy is not None:
                req.energy_j += energy
            if err is not None and not req.closed and not req.parked:
                failover = tenant.failover
                if (device_error and failover is not None and not req.program.has_transfers
                        and failover.on_failure(req, st.device, err)):
                    req.parked = True  # starts over once nothing of it runs (see _failover)
                else:
                    req.error = err
                    req.closed = True
                    notify = True
            if req.closed or req.parked:
                if results is not None:
                    for obj in results:
                        if type(obj) is TensorBuffer:
                            obj.release()
                if not req.running:
                    req.finalize_locked()
                    restart = req.parked
            else:
                assert results is not None
                missing = req.missing
                stages = req.program.by_sid
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
                    host.finish_locked(req)
                    finished = not notify
                    notify = True
        if ready:
            workers = host.workers
            for nxt in ready:
                w = workers.get(nxt.device)
                if w is None or req.deadline is not None:
                    host.push(req, nxt)  # a key to compute, or the workers stopped: the host decides
                else:
                    w.push(req, nxt)  # straight onto the heap
        if restart:
            tenant.restart(req)
        elif finished:
            host.wake_finished(req)
        elif notify:
            host.wake(req)

