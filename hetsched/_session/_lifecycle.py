"""A session's lifecycle: opening and closing, planning and installing its plans.

:class:`Lifecycle` is one of the parts a :class:`~hetsched.Session` is composed of (the public
calls are in ``hetsched/_session/_session.py``; the core that admits and delivers requests in
``_core``; the board it runs on, a :class:`~hetsched.Runtime`, in ``_runtime``).

Opening: load the model, open a private runtime when the session was given none (the board's
devices, pools, transfer engine and device workers), attach to the runtime (a tenant of its
scheduler), sample the board, plan and compile (``background_compile``: the slow backends'
devices later), start the adapter's task group (re-planning, failover, the trace's sampler).
Closing, on every path: no more admissions, the adapter's tasks (a re-plan under way is
cancelled: no new compile starts), the session's requests drained (the other sessions of the
runtime keep being served), every plan's stages closed, the trace, and a private runtime
(workers, engine, pools: a leak report).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from hetsched.backends import Device, get_backend
from hetsched.policies import DeviceState, PlacementPolicy, get_policy

from .._errors import BufferLeakError, PartitionError, PlacementError, RuntimeStateError
from .._events import Event, HookDispatcher
from .._planning.costs import CostTable
from .._planning.graph import GraphIndex
from .._planning.model import ModelSource
from .._planning.plan import Plan, build_plan
from .._runtime._clock import Clock
from .._runtime._scheduler import StageRuntime
from ._adapt import Adapter
from ._core import SessionCore
from ._feeds import STATIC_SHAPE_BACKENDS, FeedChecker, require_fixed_shapes
from ._options import Adaptation, Memory, Scheduling
from ._replan import ReplanKind
from ._runtime import Runtime
from ._setup import (
    CompileEvents,
    CompileStatistics,
    compile_counters,
    load_index,
    output_sources,
    plan_and_compile,
)
from ._statistics import BoardSampler

if TYPE_CHECKING:
    from .._runtime._tenants import Tenant
    from ._trace import SessionTrace

__all__ = ["Lifecycle"]


class Lifecycle:
    """Opens and closes one session over a runtime (its own or a shared one), and plans,
    compiles and installs its plans. Event-loop only, except the planning functions the
    adapter runs in a worker thread (:meth:`plan_and_compile`, :meth:`sample_states`)."""

    def __init__(self, *, source: ModelSource, devices: Sequence[str | Device] | str | None,
                 policy: PlacementPolicy | str | Callable[..., Any] | None, max_unit_nodes: int | None,
                 root: str | os.PathLike[str], dispatch: HookDispatcher, clock: Clock, core: SessionCore,
                 costs: CostTable, shapes: Mapping[str, Sequence[int]] | None,
                 calibration: Iterable[Mapping[str, Any]] | None, adaptation: Adaptation,
                 runtime: Runtime | None, scheduling: Scheduling, memory: Memory, name: str | None,
                 weight: float, slo_s: float | None, max_in_flight: int, trace: SessionTrace | None,
                 energy: Callable[[], float | None], governor: Any, priority: int,
                 rate_hz: float | None = None):
        self.source = source
        self._device_specs = devices
        self._policy = policy
        self._max_unit_nodes = max_unit_nodes
        self.root = root
        self.dispatch = dispatch
        self.clock = clock
        self.core = core
        self.costs = costs
        self.adaptation = adaptation
        self.shapes = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
        self._calibration_feeds = list(calibration) if calibration is not None else None
        self._calibration: object = None  # the CalibrationSet, built with the model's index
        self._shared = runtime
        self._scheduling = scheduling
        self._memory = memory
        self.name = name
        self._weight = weight
        self._slo_s = slo_s
        self._max_in_flight = max_in_flight
        self.priority = priority
        self.rate_hz = rate_hz  # the offered requests/s the session declared (None: unknown)
        self.trace = trace
        self._energy = energy
        power_budget = adaptation.power_budget_w
        if governor is None and runtime is not None:
            governor = runtime.governor  # the board's
        if power_budget is None and governor is not None:
            from ._governed import power_budget_w

            # a Governor's budget is the board's: the policy's power headroom is measured against it
            power_budget = power_budget_w(governor)
        self._power_budget = power_budget
        self.runtime: Runtime | None = None
        """The runtime in use while open (the shared one, or the private one opened here)."""
        self.tenant: Tenant | None = None
        self.plan: Plan | None = None
        self.index: GraphIndex | None = None
        self.devices: list[Device] = []
        self.stages: list[StageRuntime] = []
        # (unit key, device) -> the backend's message: found by trying, kept for every re-plan
        self.refusals: dict[tuple[str, str], str] = {}
        self.compile_base = CompileStatistics()
        self.adapter: Adapter | None = None
        self._sampler: BoardSampler | None = None
        self._closing = threading.Event()
        """Set when the session starts closing: a re-plan's compile thread starts no new compile."""
        self.opening = False
        self._closed = True
        """Closed (or never opened): a second close (the runtime closed it first) is a no-op."""

    @property
    def private(self) -> bool:
        """The session opened a runtime of its own (it was given none)."""
        return self._shared is None

    # -- opening --------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the session (see the module docstring); on failure everything opened is closed."""
        index, constants = await anyio.to_thread.run_sync(load_index, self.source, self.shapes)
        self.index = index
        self._closing.clear()
        self._closed = False
        runtime = self._shared
        if runtime is None:
            runtime = Runtime._private(devices=self._device_specs, root=self.root, clock=self.clock,
                                       scheduling=self._scheduling, memory=self._memory, dispatch=self.dispatch)
            await runtime.__aenter__()
        elif not runtime.is_open:
            raise RuntimeStateError("the Runtime is not open: attach sessions inside 'async with Runtime(...)'")
        self.runtime = runtime
        try:
            self.devices = self._session_devices(runtime)
            static = [d.name for d in self.devices if d.backend in STATIC_SHAPE_BACKENDS]
            if static:  # before anything runs: free dims reach no stage that needs fixed shapes
                require_fixed_shapes(index, f"stages on {', '.join(static)}")
            self.compile_base = compile_counters(self.devices)
            if self.trace is not None:
                await anyio.to_thread.run_sync(self.trace.open, [d.name for d in self.devices])
            self.name, self.tenant = runtime.attach(
                self.name, dispatch=self.dispatch, costs=self.costs, learn_costs=self.adaptation.learn_costs,
                weight=self._weight, max_in_flight=self._max_in_flight, slo_s=self._slo_s, energy=self._energy,
                closer=self.close_attached, priority=self.priority, replan=self._replan_for_runtime,
                rate_hz=self.rate_hz, expected=self._expected_seconds)
            self.adapter = Adapter(config=self.adaptation.replanning, scheduler=self.tenant, dispatch=self.dispatch,
                                   plan_fn=self.plan_and_compile, install=self.install, sample=self.sample_states,
                                   perf=self.clock.perf_counter)
            adapter = self.adapter
            states = await anyio.to_thread.run_sync(adapter.initial_states)
            deferred = await self._opening_plan()
            self.core.open(self.tenant, FeedChecker(index), index.graph_outputs, constants)
            await adapter.start(monitor=bool(states))
            if self.trace is not None and self.trace.wants_task:
                adapter.start_task(self.trace.sample_forever)
            if deferred:
                adapter.plan_in_background(f"background compile: {', '.join(deferred)} ready")
        except BaseException as exc:
            self.core.close()
            self._closed = True
            with anyio.CancelScope(shield=True):
                await self._shutdown(exc)
            raise

    def _session_devices(self, runtime: Runtime) -> list[Device]:
        """The devices the session plans over: the runtime's, or those of them it names.

        :raises DeviceSpecError: a named device is not one of the runtime's.
        """
        board = runtime.devices
        if self._shared is None or self._device_specs is None:
            return board
        from .._errors import DeviceSpecError

        specs = [self._device_specs] if isinstance(self._device_specs, str) else list(self._device_specs)
        by_name = {d.name: d for d in board}
        out: list[Device] = []
        for spec in specs:
            name = spec.name if isinstance(spec, Device) else str(spec)
            if name not in by_name:
                raise DeviceSpecError(f"device {name!r} is not one of the runtime's devices {sorted(by_name)}: "
                                      "a session attached to a Runtime plans over the runtime's devices")
            out.append(by_name[name])
        return out

    async def _opening_plan(self) -> list[str]:
        """Plan and compile at opening; returns the devices left for a background plan (with
        ``background_compile``: those whose backend compiles slowly, when the others can run
        the whole model)."""
        deferred = ([d.name for d in self.devices if get_backend(d.backend).hooks.slow_compile]
                    if self.adaptation.background_compile else [])
        if deferred and len(deferred) < len(self.devices):
            try:
                await self.replan_now(excluded=deferred)
                return deferred
            except (PartitionError, PlacementError):
                pass  # the other devices cannot run it all: plan with every device now
        await self.replan_now()
        return []

    async def replan_now(self, *, use_costs: bool = False, excluded: Sequence[str] = ()) -> None:
        """Plan, compile and install at once (the opening plan; no REPLAN event)."""
        adapter = self.adapter
        assert adapter is not None
        plan, stages, _ = await adapter.plan_without_quarantined(excluded, use_costs)
        self.install(plan, stages, adapter.on_drained)

    # -- closing --------------------------------------------------------------------------

    async def close(self, exc: BaseException | None) -> BufferLeakError | None:
        """Close the session (see the module docstring); returns a private runtime's leak report.
        Idempotent: the runtime may have closed it already (``__aexit__`` after the runtime's)."""
        if self._closed:
            return None
        self._closed = True
        self.core.close()
        self._closing.set()
        try:
            # the adapter's task group was entered outside any shield: it exits here, before
            # the shielded part (its tasks are cancelled; a re-plan's compile thread starts no
            # new compile and finishes the one under way)
            if self.adapter is not None:
                await self.adapter.stop()
        finally:
            with anyio.CancelScope(shield=True):
                leak = await self._shutdown(exc)
                self.core.emit(Event.SESSION_END, error=exc or leak)
        return leak

    async def close_attached(self) -> None:
        """The runtime is closing with this session still attached: close it now (the session's own
        ``__aexit__`` later finds it closed)."""
        await self.close(None)

    async def _shutdown(self, exc: BaseException | None) -> BufferLeakError | None:
        """Stop re-planning, drain the session's requests, close its stages and a private
        runtime; the trace is closed last."""
        try:
            return await self._stop_all()
        finally:
            if self.trace is not None:
                await anyio.to_thread.run_sync(self.trace.close, exc)

    async def _stop_all(self) -> BufferLeakError | None:
        adapter, runtime, tenant = self.adapter, self.runtime, self.tenant
        if adapter is not None:
            await adapter.stop()  # a no-op when close() stopped it already
        leak: BufferLeakError | None = None
        if runtime is not None and self.private:
            await runtime.stop_workers()  # queued requests (tasks outside the block) fail, as they always did
        if tenant is not None:
            if adapter is not None and adapter.failover is not None:
                # parked by a failure while closing: no plan will come for them now
                tenant.fail_parked(adapter.failover.drain())
            if runtime is not None:
                await runtime.detach(tenant)
        self._close_stages()
        if runtime is not None and self.private:
            self.runtime = None
            leak = await runtime.aclose()
        return leak

    def _close_stages(self) -> None:
        """Close every plan's stages (no request of the session runs any more)."""
        tenant, adapter = self.tenant, self.adapter
        if tenant is not None and adapter is not None:
            for gen in tenant.live_generations():
                adapter.close_generation(gen)
        elif self.stages:
            for st in self.stages:
                st.compiled.close()
        self.stages = []

    # -- planning (the adapter's functions) ---------------------------------------------------

    def sample_states(self) -> Mapping[str, DeviceState] | None:
        """One sample of the board's device states (blocking; see :class:`BoardSampler`)."""
        runtime = self.runtime
        if runtime is not None:  # the board's one telemetry reader
            return runtime.sample_states(self.devices, power_budget_w=self._power_budget)
        if self._sampler is None:
            self._sampler = BoardSampler(self.root, power_budget_w=self._power_budget)
        return self._sampler.sample(self.devices)

    def _expected_seconds(self) -> dict[str, float]:
        """Per device, the expected seconds one request of the installed plan spends there
        (:meth:`Plan.stage_costs`; empty before the first plan): what the runtime reserves for
        this session before its load is measured. Any thread."""
        plan = self.plan
        if plan is None:
            return {}
        out: dict[str, float] = {}
        for sid, sec in plan.stage_costs().items():
            dev = plan.stages[sid].device
            out[dev] = out.get(dev, 0.0) + sec
        return out

    def plan_and_compile(self, excluded: Sequence[str], sampled: Mapping[str, DeviceState],
                         use_costs: bool) -> tuple[Plan, list[StageRuntime]]:
        """Plan over the devices not ``excluded`` and compile the stages (blocking: a thread).

        :raises RuntimeStateError: the session started closing (no compile starts after that).
        """
        index = self.index
        assert index is not None
        policy = get_policy(self._policy)
        devices = [d for d in self.devices if d.name not in set(excluded)]
        states = {**sampled, **self.adaptation.device_states}

        runtime = self.runtime
        # joint placement: the load the runtime's other sessions put on the devices, as plain data
        reservations = runtime.reservations(except_session=self.name) if runtime is not None else ()

        def build(refused: Mapping[tuple[str, str], str]) -> Plan:
            return build_plan(index, devices, policy, max_unit_nodes=self._max_unit_nodes, refused=refused,
                              device_states=states, costs=self.costs if use_costs else None,
                              reservations=reservations, priority=self.priority, slo_s=self._slo_s,
                              rate_hz=self.rate_hz)

        if self._calibration_feeds is not None and self._calibration is None:
            from .._rknn.calibrate import CalibrationSet

            self._calibration = CalibrationSet(index.model, self._calibration_feeds)
        return plan_and_compile(index, build, self.refusals, shapes=self.shapes, calibration=self._calibration,
                                events=CompileEvents(self.dispatch, self.clock, cancel=self._closing))

    def install(self, plan: Plan, stages: list[StageRuntime], on_drained: Callable[[Any], None]) -> None:
        """Make ``plan`` the one new requests use (event loop)."""
        tenant, runtime = self.tenant, self.runtime
        assert tenant is not None and runtime is not None
        self.plan, self.stages = plan, stages
        source = output_sources(plan)
        gen = tenant.set_stages(stages, source, on_drained)
        gen.plan = plan
        self.core.set_stages(stages, source, runtime.topology, runtime.host,
                             domains=[d.memory_domain for d in self.devices])

    async def _replan_for_runtime(self, reason: str) -> Plan:
        """``Runtime.replace``: re-place this session (its adapter's re-plan, with measured costs)."""
        adapter = self.adapter
        if adapter is None or not self.core.is_open:
            raise RuntimeStateError("the session is not open")
        plan: Plan = await adapter.replan(reason, kind=ReplanKind.PLACEMENT, use_costs=True)
        return plan

    def require_index(self) -> GraphIndex:
        if self.index is None:
            raise RuntimeStateError("Session is not open: use 'async with Session(...)'")
        return self.index
