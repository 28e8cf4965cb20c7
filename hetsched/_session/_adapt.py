"""A serving session's adaptation: re-plans while requests run, failover, closing drained plans.

:class:`Adapter` is owned by a :class:`~hetsched.Session` and lives in its task group
(started in ``__aenter__``, cancelled and joined in ``__aexit__``). It owns:

* ``replan(reason)``: the board is sampled, a plan is built and its stages compiled in a worker
  thread (the event loop never blocks on a policy or a compile), then installed: requests
  admitted from then on use it, requests in flight finish on the old plan (see
  ``hetsched/_runtime/_generation.py``), whose stages close once drained. Re-plans are serialized.
* the monitor task: every ``Replanning.period_s`` it samples device states and measured stage
  costs and re-plans when :func:`hetsched._session._replan.decide_replan` or ``drift_reason`` says so;
* failover: a device the scheduler quarantined (``hetsched/_runtime/_failover.py``) is left out
  of the next plan; when no plan can do without it, it stays and its parked requests start over
  on it (those that already did ``quarantine_after`` times fail).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from hetsched.policies import DeviceState

from .._errors import HetschedError
from .._events import Event, EventInfo, HookDispatcher, ReplanInfo
from .._runtime._failover import Failover
from .._runtime._generation import Generation
from .._runtime._tenants import Tenant
from .._runtime._workers import close_states
from ._replan import (
    ReplanFlags,
    ReplanKind,
    Replanning,
    ReplanStatistics,
    Trigger,
    decide_replan,
    drift_reason,
)

if TYPE_CHECKING:
    from .._planning.plan import Plan

__all__ = ["Adapter"]

PlanFn = Callable[[Sequence[str], Mapping[str, DeviceState], bool], Any]
"""``plan_fn(excluded devices, device states, use measured costs) -> (plan, stages)`` (blocking)."""
InstallFn = Callable[[Any, Any, Callable[[Generation], None]], None]
"""``install(plan, stages, on_drained)`` on the event loop."""
SampleFn = Callable[[], Mapping[str, DeviceState] | None]
"""One sample of the board's device states (blocking); None: the root has no telemetry."""


class Adapter:
    """See the module docstring. Event-loop only, except :meth:`on_device_failed` and
    :meth:`on_drained` (any thread)."""

    def __init__(self, *, config: Replanning | None, scheduler: Tenant, dispatch: HookDispatcher,
                 plan_fn: PlanFn, install: InstallFn, sample: SampleFn, perf: Callable[[], float]):
        self.config = config
        self._scheduler = scheduler
        self._dispatch = dispatch
        self._plan_fn = plan_fn
        self._install = install
        self._sample = sample
        self._perf = perf
        self._tg: anyio.abc.TaskGroup | None = None
        self._background: anyio.Event | None = None
        self._send: MemoryObjectSendStream[tuple[Callable[..., Any], tuple[Any, ...]]] | None = None
        self._lock = anyio.Lock()
        self._flags = ReplanFlags()
        self._states: Mapping[str, DeviceState] = {}
        self._last_replan = -float("inf")
        self._replans = 0
        self._number = 0
        self._reasons: dict[str, int] = {}
        self._last_reason: str | None = None
        self._failed = 0
        self._last_error: str | None = None
        self._history: list[ReplanInfo] = []
        self._errors: list[str] = []
        self._closed_gens: set[int] = set()
        self._close_lock = threading.Lock()
        self._retired_energy = 0.0
        self._retired_busy: dict[str, float] = {}
        self.failover: Failover | None = None
        if config is not None:
            self.failover = Failover(config.quarantine_after, self.on_device_failed)
        scheduler.failover = self.failover

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, *, monitor: bool) -> None:
        """Enter the task group (in the session's ``__aenter__``, after the first plan)."""
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        send, recv = anyio.create_memory_object_stream[tuple[Callable[..., Any], tuple[Any, ...]]](math.inf)
        self._send = send
        tg.start_soon(self._spawner, recv, tg)
        if monitor and self.config is not None:
            tg.start_soon(self._monitor)

    def start_task(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``fn()`` in the adapter's task group (after :meth:`start`): cancelled and joined
        by :meth:`stop`, like the monitor (a session trace's sampler)."""
        assert self._tg is not None
        self._tg.start_soon(fn)

    def plan_in_background(self, reason: str) -> None:
        """Re-plan now in the adapter's task group (the devices left out of the opening plan
        joining); :meth:`wait_background` waits for it. A failure leaves the plan in place."""
        done = self._background = anyio.Event()
        tg = self._tg
        assert tg is not None

        async def run() -> None:
            try:
                await self.replan(reason, kind=ReplanKind.BACKGROUND_COMPILE)
            except HetschedError:
                pass  # counted in statistics(); the opening plan keeps serving
            finally:
                done.set()

        tg.start_soon(run)

    async def wait_background(self) -> None:
        """Until a background re-plan started by :meth:`plan_in_background` ended (at once if none)."""
        if self._background is not None:
            await self._background.wait()

    async def stop(self) -> None:
        """Cancel the monitor and any re-plan in progress, and join them (shielded by the caller)."""
        tg, self._tg = self._tg, None
        send, self._send = self._send, None
        if send is not None:
            send.close()
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        if self.failover is not None:
            self._scheduler.fail_parked(self.failover.drain())

    def initial_states(self) -> Mapping[str, DeviceState]:
        """Sample the board for the opening plan (blocking; run in a thread)."""
        states = self._sample() if self.config is not None else None
        self._states = dict(states or {})
        if states and self.config is not None:
            self._flags, _ = decide_replan(self.config, ReplanFlags(), states)
        return self._states

    # -- re-planning --------------------------------------------------------------------------

    async def replan(self, reason: str, *, kind: ReplanKind = ReplanKind.REQUESTED, use_costs: bool = False,
                     sample: bool = True) -> Any:
        """Build, compile and install a new plan (see the module docstring); returns it.

        :raises PlacementError, PartitionError, CompileError: no plan could be made (the
            previous one stays in place).
        """
        async with self._lock:
            return await self._replan_locked(reason, kind, use_costs=use_costs, sample=sample)

    async def _replan_locked(self, reason: str, kind: ReplanKind, *, use_costs: bool = False,
                             sample: bool = True) -> Any:
        t0 = self._perf()
        if sample and self.config is not None:
            states = await anyio.to_thread.run_sync(self._sample)
            if states:
                self._states = dict(states)
                self._flags, _ = decide_replan(self.config, self._flags, states)
        try:
            plan, stages, excluded = await self.plan_without_quarantined((), use_costs)
        except HetschedError as exc:
            self._failed += 1
            self._last_error = f"{reason}: {exc}"
            self._errors.append(self._last_error)
            raise
        old = self._scheduler.generation
        old_plan = old.plan if old is not None else None
        old_assignment = dict(old_plan.placement.assignment) if old_plan is not None else {}
        self._install(plan, stages, self.on_drained)
        moved = sum(1 for u, d in plan.placement.assignment.items() if old_assignment.get(u) not in (None, d))
        self._number += 1
        self._replans += 1
        self._reasons[kind] = self._reasons.get(kind, 0) + 1
        self._last_reason = reason
        self._last_replan = self._perf()
        record = ReplanInfo(reason, self._number, moved, tuple(excluded), self._perf() - t0)
        self._history.append(record)
        listeners = self._dispatch.listeners[Event.REPLAN]
        if listeners:
            info = EventInfo(Event.REPLAN, self._perf(), extra=record)
            for fn in listeners:
                fn(info)
        return plan

    async def plan_without_quarantined(self, excluded: Sequence[str], use_costs: bool,
                                       ) -> tuple[Any, Any, tuple[str, ...]]:
        """A plan (and its compiled stages) over the devices neither in ``excluded`` nor
        quarantined, and the devices it left out.

        A device may be quarantined while the plan is being made (its stages fail in the worker
        threads meanwhile): a plan that comes back using one is closed and made again without
        it, so a re-plan that began before a device failed (``replan()``, the monitor,
        ``background_compile``'s switch) never brings the dead device back. When no plan can do
        without it, the plan made first is returned: the quarantine's own re-plan finds the
        same and fails the requests it parked (``Failover.failed``).

        :raises PlacementError, PartitionError, CompileError: no plan could be made.
        """
        first: tuple[Any, Any, tuple[str, ...]] | None = None
        try:
            while True:
                quarantined = self.failover.quarantined if self.failover is not None else ()
                out = tuple(dict.fromkeys((*quarantined, *excluded)))
                try:
                    plan, stages = await self.plan_in_thread(out, self._states, use_costs)
                except HetschedError:
                    if first is None:
                        raise
                    made, first = first, None
                    return made
                late = set(self.failover.quarantined if self.failover is not None else ()) - set(out)
                if not any(st.device in late for st in stages):
                    if first is not None:
                        for st in first[1]:
                            st.compiled.close()
                        first = None
                    return plan, stages, out
                if first is None:
                    first = (plan, stages, out)
                else:
                    for st in stages:
                        st.compiled.close()
        except BaseException:
            if first is not None:  # cancelled meanwhile: nobody will install it
                for st in first[1]:
                    st.compiled.close()
            raise

    async def plan_in_thread(self, excluded: Sequence[str], states: Mapping[str, DeviceState],
                             use_costs: bool) -> tuple[Any, Any]:
        """``plan_fn`` in a worker thread; stages it compiled for a caller that was cancelled
        meanwhile (the session closing) are closed, not leaked."""
        made: list[tuple[Any, Any]] = []

        def work() -> tuple[Any, Any]:
            result: tuple[Any, Any] = self._plan_fn(excluded, states, use_costs)
            made.append(result)
            return result

        try:
            return await anyio.to_thread.run_sync(work)
        except BaseException:
            if made:  # the thread finished, its caller was cancelled: nobody will install these
                for st in made[0][1]:
                    st.compiled.close()
            raise

    def statistics(self) -> ReplanStatistics:
        return ReplanStatistics(self._replans, self._last_reason, dict(self._reasons), self._failed,
                                self._last_error, tuple(self._history), tuple(self._errors))

    @property
    def states(self) -> Mapping[str, DeviceState]:
        """The device states the current plan was made with."""
        return self._states

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of the adapter's group (any thread; dropped once stopped).

        Through a stream read by a task of the group: a task can be started only from inside
        the event loop's tasks, and a callback posted from a thread runs outside any task."""
        send = self._send
        if send is None:
            return
        item = (fn, args)
        sch = self._scheduler.scheduler
        try:
            if threading.get_ident() == sch._loop_thread:
                send.send_nowait(item)
            else:
                sch.call_soon_threadsafe(self._send_soon, item)
        except (RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # stopped, or the event loop is gone (interpreter shutdown)

    def _send_soon(self, item: tuple[Callable[..., Any], tuple[Any, ...]]) -> None:
        send = self._send
        if send is not None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                send.send_nowait(item)

    async def _spawner(self, recv: MemoryObjectReceiveStream[tuple[Callable[..., Any], tuple[Any, ...]]],
                       tg: anyio.abc.TaskGroup) -> None:
        async with recv:
            async for fn, args in recv:
                tg.start_soon(fn, *args)

    # -- failover -------------------------------------------------------------------------

    def on_device_failed(self, device: str, reason: str) -> None:
        """The scheduler quarantined ``device`` (any thread): re-plan without it."""
        self._post(self._replan_without, device, reason)

    async def _replan_without(self, device: str, reason: str) -> None:
        try:
            async with self._lock:
                if self.failover is not None and self.failover.settled(device):
                    return  # a re-plan under way when it failed made its plan without it already
                await self._replan_locked(f"failure: {reason}", ReplanKind.FAILURE, sample=False)
        except HetschedError:
            assert self.failover is not None
            fail, again = self.failover.failed(device)
            self._scheduler.fail_parked(fail)
            for req in again:  # the device stays: they start over on it (a new context, maybe)
                self._scheduler.restart(req, counted=True)

    # -- closing drained plans ----------------------------------------------------------------

    def on_drained(self, gen: Generation) -> None:
        """A retired plan has no request left (any thread): close its stages in a thread."""
        self._post(self._close_generation_task, gen)

    async def _close_generation_task(self, gen: Generation) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.close_generation, gen)

    def close_generation(self, gen: Generation) -> None:
        """Close a plan's per-worker states and stages, once (blocking; any thread)."""
        with self._close_lock:
            if gen.number in self._closed_gens:
                return
            self._closed_gens.add(gen.number)
        for w in self._scheduler.unique_workers():
            close_states(w.take_states(gen.stages))
        with self._close_lock:
            # its runs' figures move to the retired totals and the generation stops being live in
            # one step, so a statistics() snapshot counts them once (see board_figures)
            for st in gen.stages:
                modelled = st.hooks.modelled
                if modelled is None:
                    continue
                snap = modelled.statistics()
                self._retired_energy += float(snap.modelled_energy_j)
                self._retired_busy[st.device] = self._retired_busy.get(st.device, 0.0) + float(snap.modelled_time_s)
            self._scheduler.forget(gen)
        for st in gen.stages:
            st.compiled.close()

    def board_figures(self, current: Sequence[Any]) -> dict[str, Any]:
        """The energy and busy-time fields of ``SessionStatistics`` (see
        ``hetsched._session._statistics.energy_fields``), consistent with plans closing meanwhile."""
        from ._statistics import energy_fields

        with self._close_lock:
            return energy_fields(self._scheduler, current, self._retired_energy, dict(self._retired_busy))

    # -- the monitor ------------------------------------------------------------------------

    async def _monitor(self) -> None:
        config = self.config
        assert config is not None
        started = self._perf()
        while True:
            await anyio.sleep(config.period_s)
            if self._lock.locked() or self._perf() - self._last_replan < config.min_interval_s:
                continue
            states = await anyio.to_thread.run_sync(self._sample)
            trigger: Trigger | None = None
            if states:
                used = frozenset(st.device for st in self._scheduler.stages)
                self._flags, trigger = decide_replan(config, self._flags, states, used)
            use_costs = False
            if trigger is None:
                drift = drift_reason(config, *self._drift_inputs(), elapsed_s=self._perf() - started)
                trigger = Trigger(ReplanKind.DRIFT, drift) if drift is not None else None
                use_costs = trigger is not None
            if trigger is None:
                continue
            with contextlib.suppress(HetschedError):  # counted in statistics(); the plan in place keeps serving
                await self.replan(trigger.reason, kind=trigger.kind, use_costs=use_costs)

    def _drift_inputs(self) -> tuple[dict[str, float], dict[str, tuple[float, int]]]:
        """Per stage of the current plan: the plan's estimate, and (measured seconds, runs)."""
        gen = self._scheduler.generation
        plan: Plan | None = gen.plan if gen is not None else None  # the plan the lifecycle installed with it
        planned = plan.stage_costs() if plan is not None else {}
        est: dict[str, float] = {}
        got: dict[str, tuple[float, int]] = {}
        costs = self._scheduler.costs
        for st in self._scheduler.stages:
            if st.sid in planned:
                est[st.name] = float(planned[st.sid])
            seconds = costs.get(st.key, st.device)
            if seconds is not None:
                got[st.name] = (float(seconds), st.learned)
        return est, got
