"""The wiring under :class:`~hetsched.Session`: its state, opening and closing, planning and
installing plans (the public calls are in ``hetsched/_session/_session.py``).

Opening: load the model, resolve the devices, make the pools, the transfer engine and the
scheduler, sample the board, plan and compile (``background_compile``: the slow backends'
devices later), start the device workers and the adapter's task group (re-planning,
failover, the trace's sampler). Closing, on every path: the adapter's tasks, the workers,
every plan's stages, the engine, the pools (a leak report), the trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from hetsched.backends import Device, get_backend
from hetsched.policies import DeviceState, PlacementPolicy, get_policy

from .._compat import Self
from .._errors import BufferLeakError, PartitionError, PlacementError, RuntimeStateError
from .._events import Event, HookDispatcher
from .._planning.costs import CostTable
from .._planning.devices import resolve_devices
from .._planning.graph import GraphIndex
from .._planning.model import ModelSource
from .._planning.plan import Plan, build_plan
from .._runtime._buffers import BufferPool, pools_for
from .._runtime._clock import Clock, SystemClock
from .._runtime._domains import Topology
from .._runtime._scheduler import Scheduler, StageRuntime
from .._runtime._transfer import CopyFn, TransferEngine
from ._adapt import Adapter
from ._core import SessionCore
from ._feeds import STATIC_SHAPE_BACKENDS, FeedChecker, require_fixed_shapes
from ._replan import Replanning
from ._setup import (
    CompileEvents,
    CompileStatistics,
    TransferEvents,
    compile_counters,
    load_index,
    make_topology,
    output_sources,
    plan_and_compile,
)
from ._statistics import BoardSampler

if TYPE_CHECKING:
    from ._trace import SessionTrace

__all__ = ["SessionBase"]


class SessionBase:
    """A session's state and lifecycle; :class:`hetsched.Session` documents the parameters."""

    def __init__(
        self,
        model: ModelSource,
        *,
        devices: Sequence[str | Device] | str | None = None,
        policy: PlacementPolicy | str | Callable[..., Any] | None = None,
        max_unit_nodes: int | None = None,
        root: str | os.PathLike[str] = "/",
        hooks: Sequence[object] = (),
        governor: Any = None,
        device_states: Mapping[str, DeviceState] | None = None,
        costs: CostTable | None = None,
        max_in_flight: int = 64,
        learn_costs: bool = True,
        topology: Topology | None = None,
        priorities: bool = True,
        aging_s: float | None = 0.5,
        chunk_bytes: int = 1 << 20,
        copy_fn: CopyFn | None = None,
        pool_capacity_bytes: int | Mapping[str, int | None] | None = None,
        clock: Clock | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        calibration: Iterable[Mapping[str, Any]] | None = None,
        replanning: Replanning | None = Replanning(),  # noqa: B008 (a frozen dataclass: one shared value)
        power_budget_w: float | None = None,
        background_compile: bool = False,
        trace: str | os.PathLike[str] | None = None,
    ):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if aging_s is not None and not aging_s > 0:
            raise ValueError(f"aging_s must be positive or None, got {aging_s}")
        self._source = model
        self._device_specs = devices
        self._policy = policy
        self._max_unit_nodes = max_unit_nodes
        self._root = root
        if governor is not None:
            from ._governed import GovernorHooks

            hooks = [*hooks, GovernorHooks(governor)]
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._trace: SessionTrace | None = None
        if trace is not None:
            from ._trace import SessionTrace

            self._trace = SessionTrace(trace, clock=self._clock, root=root)
            hooks = self._trace.wrap_hooks(hooks)
        self._dispatch = HookDispatcher(hooks)
        self._device_states = dict(device_states or {})
        self.costs = costs if costs is not None else CostTable()
        self._learn_costs = learn_costs
        self._topology_arg = topology
        self._priorities = priorities
        self._aging_s = aging_s
        self._chunk_bytes = chunk_bytes
        self._copy_fn = copy_fn
        self._pool_capacity = pool_capacity_bytes
        self._core = SessionCore(self._dispatch, self._clock, max_in_flight)
        self._plan: Plan | None = None
        self._index: GraphIndex | None = None
        self._devices: list[Device] = []
        self._stages: list[StageRuntime] = []
        self._scheduler: Scheduler | None = None
        self._engine: TransferEngine | None = None
        self._pools: dict[str, BufferPool] = {}
        self._topology: Topology | None = None
        self._host = "host"
        self._retired_runs = 0
        self._shapes = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
        self._calibration_feeds = list(calibration) if calibration is not None else None
        self._calibration: object = None  # the CalibrationSet, built with the model's index
        # (unit key, device) -> the backend's message: found by trying, kept for every re-plan
        self._refusals: dict[tuple[str, str], str] = {}
        self._compile_base = CompileStatistics()
        if replanning is not None and not isinstance(replanning, Replanning):
            raise TypeError(f"replanning must be a hetsched.Replanning or None, got {type(replanning).__name__}")
        self._replanning = replanning
        if power_budget_w is None and governor is not None:
            # the governor's budget is the board's: the policy's power headroom is measured against it
            power_budget_w = getattr(getattr(governor, "config", None), "power_budget_w", None)
        self._power_budget = power_budget_w
        self._background_compile = background_compile
        self._adapter: Adapter | None = None
        self._sampler: BoardSampler | None = None
        self._opening = False

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._core.is_open or self._opening:
            raise RuntimeStateError("Session is already open (or being opened by another task)")
        self._opening = True
        try:
            return await self._open()
        finally:
            self._opening = False

    async def _open(self) -> Self:
        index, constants = await anyio.to_thread.run_sync(load_index, self._source, self._shapes)
        self._index = index
        self._devices = list(resolve_devices(self._device_specs, root=self._root))
        static = [d.name for d in self._devices if d.backend in STATIC_SHAPE_BACKENDS]
        if static:  # before anything runs: free dims reach no stage that needs fixed shapes
            require_fixed_shapes(index, f"stages on {', '.join(static)}")
        self._topology, self._host = make_topology(self._topology_arg, self._devices)
        self._retired_runs = 0
        self._compile_base = compile_counters(self._devices)
        try:
            if self._trace is not None:
                await anyio.to_thread.run_sync(self._trace.open, [d.name for d in self._devices])
            self._pools = pools_for(self._topology, capacity_bytes=self._pool_capacity, root=self._root)
            # a custom copy (a DMA wait, a modelled link) may block: never run it on the event loop
            inline = {} if self._copy_fn is None else {"inline_bytes": 0}
            self._engine = TransferEngine(self._topology, self._pools, chunk_bytes=self._chunk_bytes,
                                          copy_fn=self._copy_fn,
                                          hooks=TransferEvents(self._dispatch, self._clock), **inline)
            await self._engine.__aenter__()
            self._scheduler = Scheduler(
                pools=self._pools, topology=self._topology, host=self._host, engine=self._engine,
                dispatch=self._dispatch, costs=self.costs, learn_costs=self._learn_costs,
                priorities=self._priorities, aging_s=self._aging_s, clock=self._clock,
            )
            self._adapter = Adapter(config=self._replanning, scheduler=self._scheduler, dispatch=self._dispatch,
                                    plan_fn=self._plan_and_compile, install=self._install,
                                    sample=self._sample_states, perf=self._clock.perf_counter)
            adapter = self._adapter
            states = await anyio.to_thread.run_sync(adapter.initial_states)
            deferred = await self._opening_plan()
            self._core.open(self._scheduler, FeedChecker(index), index.graph_outputs, constants)
            self._start_workers()
            await adapter.start(monitor=bool(states))
            if self._trace is not None and self._trace.wants_task:
                adapter.start_task(self._trace.sample_forever)
            if deferred:
                adapter.plan_in_background(f"background compile: {', '.join(deferred)} ready")
        except BaseException as exc:
            self._core.close()
            with anyio.CancelScope(shield=True):
                await self._shutdown(exc)
            raise
        self._core.emit(Event.SESSION_START)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._core.close()
        try:
            # the adapter's task group was entered outside any shield: it exits here, before
            # the shielded part (its tasks are cancelled; a re-plan's compile thread finishes)
            if self._adapter is not None:
                await self._adapter.stop()
        finally:
            with anyio.CancelScope(shield=True):
                leak = await self._shutdown(exc)
                self._core.emit(Event.SESSION_END, error=exc or leak)
        if leak is not None and exc is None:
            raise leak
        if exc is None and self._trace is not None and self._trace.failure is not None:
            raise self._trace.failure  # a full disk: every request was answered, the trace is cut (issue 23)

    async def _shutdown(self, exc: BaseException | None) -> BufferLeakError | None:
        """Stop re-planning, the workers, close stages, the engine and the pools; returns the
        pools' leak report."""
        try:
            return await self._stop_all()
        finally:
            if self._trace is not None:
                await anyio.to_thread.run_sync(self._trace.close, exc)

    async def _stop_all(self) -> BufferLeakError | None:
        """:meth:`_shutdown` but the trace, which is closed after everything else stopped."""
        adapter = self._adapter
        if adapter is not None:
            await adapter.stop()  # a no-op when __aexit__ stopped it already
        await self._stop_workers()
        if adapter is not None and adapter.failover is not None and self._scheduler is not None:
            # parked by a failure while the workers stopped: no plan will come for them now
            self._scheduler.fail_parked(adapter.failover.drain())
        self._close_stages()
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.__aexit__(None, None, None)
        leaks: list[BufferLeakError] = []
        for pool in self._pools.values():
            try:
                pool.close()
            except BufferLeakError as err:
                leaks.append(err)
        if not leaks:
            return None
        labels = [lbl for e in leaks for lbl in e.labels]
        stages = sorted({lbl.split(":", 1)[0] for lbl in labels if lbl is not None})
        return BufferLeakError(f"session closed with buffers still referenced, produced by stage(s) {stages}: "
                               + "; ".join(str(e) for e in leaks), labels=labels, stages=stages)

    def _start_workers(self) -> None:
        assert self._plan is not None and self._scheduler is not None

        def worker_cpus(dev: Device) -> Sequence[tuple[int, ...]]:
            fn = getattr(get_backend(dev.backend), "worker_cpus", None)
            return fn(dev) if fn is not None else [tuple(dev.cpus)]

        self._scheduler.start(self._devices, worker_cpus)

    async def _stop_workers(self) -> None:
        if self._scheduler is None:
            return
        workers = self._scheduler.stop()
        for w in workers:
            await anyio.to_thread.run_sync(w.join)
            self._retired_runs += w.runs
        self._scheduler.flush_costs()
        self._scheduler.fire_deferred()
        for w in workers:
            # requests still queued (run from tasks outside the session's block, or during a
            # re-plan) fail instead of waiting forever
            self._scheduler.abort(w.drain(), RuntimeStateError("the session stopped its device workers"))

    def _close_stages(self) -> None:
        """Close every plan's stages (the workers have stopped; they closed their own states)."""
        sch, adapter = self._scheduler, self._adapter
        if sch is not None and adapter is not None:
            for gen in sch.live_generations():
                adapter.close_generation(gen)
        elif self._stages:
            for st in self._stages:
                st.compiled.close()
        self._stages = []

    def _sample_states(self) -> Mapping[str, DeviceState] | None:
        """One sample of the board's device states (blocking; see :class:`BoardSampler`)."""
        if self._sampler is None:
            self._sampler = BoardSampler(self._root, power_budget_w=self._power_budget)
        return self._sampler.sample(self._devices)

    def _plan_and_compile(self, excluded: Sequence[str], sampled: Mapping[str, DeviceState],
                          use_costs: bool) -> tuple[Plan, list[StageRuntime]]:
        """Plan over the devices not ``excluded`` and compile the stages (blocking: a thread)."""
        index = self._index
        assert index is not None
        policy = get_policy(self._policy)
        devices = [d for d in self._devices if d.name not in set(excluded)]
        states = {**sampled, **self._device_states}

        def build(refused: Mapping[tuple[str, str], str]) -> Plan:
            return build_plan(index, devices, policy, max_unit_nodes=self._max_unit_nodes, refused=refused,
                              device_states=states, costs=self.costs if use_costs else None)

        if self._calibration_feeds is not None and self._calibration is None:
            from .._rknn.calibrate import CalibrationSet

            self._calibration = CalibrationSet(index.model, self._calibration_feeds)
        return plan_and_compile(index, build, self._refusals, shapes=self._shapes, calibration=self._calibration,
                                events=CompileEvents(self._dispatch, self._clock))

    def _install(self, plan: Plan, stages: list[StageRuntime], on_drained: Callable[[Any], None]) -> None:
        """Make ``plan`` the one new requests use (event loop)."""
        assert self._scheduler is not None and self._topology is not None
        self._plan, self._stages = plan, stages
        source = output_sources(plan)
        gen = self._scheduler.set_stages(stages, source, on_drained)
        gen.plan = plan
        self._core.set_stages(stages, source, self._topology, self._host,
                              domains=[d.memory_domain for d in self._devices])

    async def _opening_plan(self) -> list[str]:
        """Plan and compile at opening; returns the devices left for a background plan (with
        ``background_compile``: those whose backend compiles slowly, when the others can run
        the whole model)."""
        deferred = [d.name for d in self._devices
                    if getattr(get_backend(d.backend), "slow_compile", False)] if self._background_compile else []
        if deferred and len(deferred) < len(self._devices):
            try:
                await self._replan(excluded=deferred)
                return deferred
            except (PartitionError, PlacementError):
                pass  # the other devices cannot run it all: plan with every device now
        await self._replan()
        return []

    async def _replan(self, *, use_costs: bool = False, excluded: Sequence[str] = ()) -> None:
        """The opening plan, or (``profile``) a re-plan with the workers stopped."""
        adapter = self._adapter
        assert adapter is not None
        plan, stages, _ = await adapter.plan_without_quarantined(excluded, use_costs)
        self._install(plan, stages, adapter.on_drained)

    def _require_index(self) -> GraphIndex:
        if self._index is None:
            raise RuntimeStateError("Session is not open: use 'async with Session(...)'")
        return self._index

