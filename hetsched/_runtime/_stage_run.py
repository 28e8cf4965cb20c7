"""The worker side of the scheduler: run one stage of a request and account for its outputs.

:class:`StageRunner` is the part of :class:`~hetsched._runtime._scheduler.Scheduler` that runs
in device worker threads; the scheduler is one (it inherits these methods), so a stage
costs no call through another object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio

from .._errors import DeviceFailedError, StageExecutionError
from .._events import Event, EventInfo, HookDispatcher, Priority
from ._buffers import BufferPool, TensorBuffer
from ._failover import Failover
from ._program import StageIO, StageRuntime, address
from ._requests import Request
from ._workers import DeviceWorkers

__all__ = ["StageRunner"]

_LEARN_BATCH = 16
"""Stage times are folded into the cost table 16 at a time: updating a shared table after
every run touches cold memory for tens of microseconds; the moving average is the same."""


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
    """Runs stages in worker threads (a base of the Scheduler, which sets these attributes)."""

    pools: dict[str, BufferPool]
    stages: list[StageRuntime]
    workers: dict[str, DeviceWorkers]
    _dispatch: HookDispatcher
    _costs: Any
    _learn: bool
    _lock: threading.Lock
    _perf: Callable[[], float]
    stage_runs_bound: int
    stage_runs_unbound: int
    stage_runs_to_caller: int
    allocation_failures: int
    states_renewed: int

    failover: Failover | None

    # implemented by the Scheduler
    def restart(self, req: Request) -> None:
        raise NotImplementedError

    def _finish_locked(self, req: Request) -> None:
        raise NotImplementedError

    def _wake_finished(self, req: Request) -> None:
        raise NotImplementedError

    def _wake(self, req: Request) -> None:
        raise NotImplementedError

    def run_stage(self, req: Request, st: StageRuntime, worker: DeviceWorkers) -> None:
        """Run one stage of ``req`` in a device worker thread and account for its outputs.

        Whatever goes wrong here (the stage, a hook, the runtime) fails this request only:
        the worker thread keeps serving the others.
        """
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
        listeners = self._dispatch.listeners
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
            failover = self.failover
            if failover is not None and err is None and failover.streak:
                failover.on_success(dev)
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
                        st.samples.append(elapsed if st.seconds_fn is None else st.seconds_fn())
                        if len(st.samples) >= _LEARN_BATCH:
                            learned, st.samples = st.samples, []
            if learned:
                self._learn_from(st, learned)
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
        self._complete(req, st, results, err, inputs, energy, device_error)
        if device_error and st.stateful and st in self.stages:
            # the request starts over meanwhile (another worker may take it): this worker builds
            # its new context now, not with the next request waiting on it (or failing with it)
            worker.prepare_state(st)

    def state_renewed(self) -> None:
        """A worker dropped a dead per-worker state (worker thread)."""
        with self._lock:
            self.states_renewed += 1

    def _learn_from(self, st: StageRuntime, samples: list[float]) -> None:
        st.learned += len(samples)
        for elapsed in samples:  # the same moving average as one update per run, just later
            self._costs.update(st.key, st.device, elapsed, analytic_s=st.analytic_s)

    def flush_costs(self, stages: list[StageRuntime] | None = None) -> None:
        """Fold the stage times not yet learned into the cost table (see ``_LEARN_BATCH``);
        ``stages`` default to the current plan's."""
        for st in self.stages if stages is None else stages:
            with self._lock:
                samples, st.samples = st.samples, []
            if samples:
                self._learn_from(st, samples)

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
                with self._lock:
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

    def _complete(self, req: Request, st: StageRuntime, results: list[Any] | None, err: BaseException | None,
                  inputs: tuple[tuple[str, Any], ...], energy: float | None = None,
                  device_error: bool = False) -> None:
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
                failover = self.failover
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
                    self._finish_locked(req)
                    finished = not notify
                    notify = True
        for nxt in ready:
            self.workers[nxt.device].push(req, nxt)
        if restart:
            self.restart(req)
        elif finished:
            self._wake_finished(req)
        elif notify:
            self._wake(req)

