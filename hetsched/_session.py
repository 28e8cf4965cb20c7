"""``Session``: plan a model across devices, compile its stages, serve many requests at once.

The runtime underneath (``hetsched._runtime``): one :class:`BufferPool` per memory
domain, a :class:`TransferEngine` between domains that do not share memory, and a
:class:`Scheduler` with per-device worker threads fed by priority queues (see
``hetsched/_runtime/_scheduler.py`` for the flow of one request).

What lives where: the Session wires (this module: lifecycle, planning and re-planning,
statistics, the public calls); everything a request goes through once the session is open is
the session core (``hetsched/_core.py``), shared by ``run()`` and ``map()`` streams
(``hetsched/_stream.py``); feed checks, delivery and its zero-copy contract, profiling, setup
helpers and :class:`~hetsched.SyncSession` have their own modules (``_feeds``, ``_delivery``,
``_profiling``, ``_setup``, ``_sync``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any, Literal, overload

import anyio
import numpy as np
import onnx

from hetsched.backends import Device, get_backend
from hetsched.policies import DeviceState, PlacementPolicy, get_policy

from ._adapt import Adapter
from ._core import SessionCore, priority_value
from ._delivery import Outputs
from ._errors import BufferLeakError, PartitionError, PlacementError, RuntimeStateError
from ._events import Event, HookDispatcher, Priority
from ._feeds import FeedChecker, random_feeds
from ._planning.costs import CostTable
from ._planning.devices import resolve_devices
from ._planning.graph import GraphIndex
from ._planning.model import ModelSource
from ._planning.plan import Plan, build_plan
from ._profiling import profile_units
from ._replan import Replanning, ReplanStatistics
from ._runtime._buffers import BufferPool, pools_for
from ._runtime._clock import Clock, SystemClock
from ._runtime._domains import Topology
from ._runtime._scheduler import Scheduler, StageRuntime
from ._runtime._transfer import CopyFn, TransferEngine
from ._session_stats import BoardSampler, SessionStatistics, energy_fields
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
from ._stream import ResultStream

__all__ = ["Session", "SessionStatistics"]


class Session:
    """Run an ONNX model across devices, many requests at once.

    ::

        async with hetsched.Session("model.onnx", devices=["cpu:0", "cpu:1"], policy="heft") as s:
            outputs = await s.run({"x": x})                         # {name: array}, owned by the caller
            y, = await s.run(None, {"x": x})                        # onnxruntime's form: list in output order
            urgent = await s.run({"x": x}, priority=hetsched.Priority.HIGH)
            with await s.run({"x": x}, zero_copy=True) as out:      # views of pool memory, no copy
                use(out["y"])
            print(s.plan.table())

    Requests run concurrently: stages of different requests run at the same time on
    different devices (pipelining); each device runs one stage at a time (unless its
    backend gives it more workers, e.g. ``Device(..., options={"workers": "per-core"})``)
    and always starts the most urgent ready stage next (the preemption point is the stage
    boundary; see ``hetsched/_runtime/_scheduler.py`` for priorities and aging). At most
    ``max_in_flight`` requests are admitted at once; the rest wait their turn. Cancelling a
    ``run`` (an anyio cancel scope) drops its queued stages and returns its buffers to the
    pools as soon as a stage of it that is already running ends; a failing stage fails only
    its own request.

    Hooks: ``BEFORE_STAGE``/``AFTER_STAGE`` run in the device's worker thread (``AFTER_STAGE``
    carries ``extra=StageIO``: the addresses each input was read from and each output written
    to); ``BEFORE_TRANSFER``/``AFTER_TRANSFER``/``PREEMPTED``/``RESUMED`` run on the event loop
    with ``extra=TransferInfo`` and ``stage`` = the producing stage (``"feed"`` for an input).

    Everything the session starts (device threads, transfers) is stopped and joined when
    the ``async with`` block exits, also on error or cancellation.

    :param model: a path, bytes, an ``onnx.ModelProto`` or the name of an embedded model
        (``"light_squeezenet"``, as the CLI accepts; see :func:`hetsched.load_model`).
    :param devices: device specs or :class:`Device` objects (default: the host's CPU clusters).
    :param policy: a policy object, function or name (default ``PowerThermalWeighted()``).
    :param max_unit_nodes: cut unit subgraphs to at most this many nodes (1 = one node each).
    :param root: the filesystem root for hardware discovery and ``dev/dma_heap`` (a twin's root in tests).
    :param hooks: objects with :class:`Hooks` methods.
    :param governor: a DVFS governor (anything with ``on_phase``, e.g. an entered
        :class:`hetsched.Governor`): the session then emits PREPROCESS / INFER /
        POSTPROCESS / IDLE itself (see :class:`hetsched.GovernorHooks`).
    :param device_states: utilisation / headroom per device fed to the policy.
    :param costs: a :class:`CostTable` of measured costs (one is created otherwise).
    :param max_in_flight: requests admitted at once; more wait (backpressure).
    :param learn_costs: fold every stage run's time into :attr:`costs` (in batches of 16 runs per
        stage, and whatever is left when the workers stop).
    :param topology: the memory domains and which share DRAM. Default: the host and every
        device's ``memory_domain`` share memory (a unified-memory SoC, or this host), so no
        tensor is ever copied between stages. With domains that do not share memory, tensors
        crossing them go through the transfer engine at the request's priority.
    :param priorities: False = plain FIFO by admission (for comparison); priorities are then
        ignored by the device queues and by the transfer channels.
    :param aging_s: seconds of waiting worth one priority level (a BACKGROUND request that waited
        ``3 * aging_s`` longer than a REALTIME one goes first); None = no aging.
    :param chunk_bytes: transfer granularity, i.e. how soon an urgent copy takes a busy channel.
    :param copy_fn: the transfer engine's chunk copy (e.g. ``rate_limited_copy`` to model a board link).
    :param pool_capacity_bytes: bound on the bytes each memory domain's pool holds (one value for
        all, or per domain name; default unbounded). A stage that finds its pool full does not
        wait: that run writes into backend-allocated outputs instead (``stage_runs_unbound``); a
        transfer into a full domain waits for room (backpressure).
    :param clock: the clock the runtime reads for admission times (FIFO order and aging), the
        deadline of a coalesced wake-up, stage timings and hook timestamps (default: the
        system's; a test passes a ``VirtualClock`` (``hetsched/_runtime/_clock.py``) and advances it
        by hand, so nothing it checks depends on how fast the machine is).
    :param shapes: ``{input name: dims}`` fixing free dimensions for backends that need static
        shapes (passed to each compile in the device's options under ``"shapes"``).
    :param replanning: how the session adapts while serving (:class:`hetsched.Replanning`: board
        sampling period, thermal/power thresholds with hysteresis, cost drift factor, failures
        that quarantine a device); None: the plan made at opening stays (and a failing stage
        fails its request, nothing is retried).
    :param power_budget_w: the board power the policy's ``power_headroom`` is measured against
        (rails where measured, the SoC model where estimated); default: the governor's
        ``power_budget_w`` when a governor is given, else no budget (headroom 1).
    :param background_compile: open fast: devices whose backend compiles slowly (the RKNN
        toolkit starts a process and converts or reloads each stage) are left out of the opening
        plan when the other devices can run the whole model, so the session serves at once; the
        plan with every device is compiled in the background and switched to when ready
        (``Event.REPLAN``, reason ``"background compile: ..."``; :meth:`wait_planned` waits for it).
    :param calibration: feed dicts for the model's graph inputs (an iterable, read once here, at
        most 64 used): NPU stages are quantized to INT8 (w8a8) and calibrated with the tensors
        their upstream stages produce for these feeds (computed on the host by onnxruntime); each
        NPU stage's accuracy against fp32 onnxruntime is measured on them (``statistics()`` of the
        stage). Without it NPU stages stay fp16.
    :raises ModelError: the model could not be loaded (on ``__aenter__``), or a calibration feed
        misses a graph input.
    :raises PartitionError, PlacementError, DeviceSpecError, CompileError: planning failed.
    :raises TransferError: a device's memory domain is not in ``topology``.
    :raises BufferLeakError: on exit, pool buffers were still referenced (unreleased
        :class:`Outputs`); the message names the stages that produced them.
    """

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
        self._dispatch = HookDispatcher(hooks)
        self._clock: Clock = clock if clock is not None else SystemClock()
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

    async def __aenter__(self) -> Session:
        if self._core.is_open or self._opening:
            raise RuntimeStateError("Session is already open (or being opened by another task)")
        self._opening = True
        try:
            return await self._open()
        finally:
            self._opening = False

    async def _open(self) -> Session:
        index, constants = await anyio.to_thread.run_sync(load_index, self._source, self._shapes)
        self._index = index
        self._devices = list(resolve_devices(self._device_specs, root=self._root))
        self._topology, self._host = make_topology(self._topology_arg, self._devices)
        self._retired_runs = 0
        self._compile_base = compile_counters(self._devices)
        try:
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

    async def _shutdown(self, exc: BaseException | None) -> BufferLeakError | None:
        """Stop re-planning, the workers, close stages, the engine and the pools; returns the
        pools' leak report."""
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
            from ._rknn.calibrate import CalibrationSet

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
        quarantined = adapter.failover.quarantined if adapter.failover is not None else ()
        plan, stages = await adapter.plan_in_thread((*quarantined, *excluded), adapter.states, use_costs)
        self._install(plan, stages, adapter.on_drained)

    async def wait_planned(self) -> Plan:
        """Wait until the plan compiled in the background (``background_compile``) is in place,
        or failed (the opening plan then stays), and return the plan in use.

        :raises RuntimeStateError: the session is not open.
        """
        self._core.require_open("wait_planned()")
        assert self._adapter is not None
        await self._adapter.wait_background()
        return self.plan

    async def replan(self, *, reason: str = "requested", use_costs: bool = True) -> Plan:
        """Re-place the model now, while serving: sample the board, plan (in a worker thread),
        compile the new stages in the background, then switch (see ``hetsched/_adapt.py``).

        Requests admitted after the switch use the new plan; those in flight finish on the
        old one, whose stages close once drained. Fires :attr:`Event.REPLAN` with ``reason``.

        :param use_costs: plan with the costs measured so far (the cost table), not only the
            analytic model.
        :raises RuntimeStateError: the session is not open.
        :raises PlacementError, PartitionError, CompileError: no plan could be made; the plan in
            place keeps serving.
        """
        self._core.require_open("replan()")
        assert self._adapter is not None
        plan: Plan = await self._adapter.replan(reason, use_costs=use_costs)
        return plan

    # -- public API -------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The current plan: stages, placement and the score terms that decided it."""
        if self._plan is None:
            raise RuntimeStateError("Session.plan is available inside 'async with Session(...)'")
        return self._plan

    @property
    def devices(self) -> list[Device]:
        return list(self._devices)

    @property
    def topology(self) -> Topology:
        """The memory domains in use and which of them share memory."""
        if self._topology is None:
            raise RuntimeStateError("Session.topology is available inside 'async with Session(...)'")
        return self._topology

    @property
    def pools(self) -> Mapping[str, BufferPool]:
        """The buffer pool of each memory domain, by domain name."""
        return MappingProxyType(self._pools)

    def get_inputs(self) -> list[onnx.ValueInfoProto]:
        """Inputs that must be fed (graph inputs without an initializer), as onnxruntime lists them."""
        index = self._require_index()
        return [index.value_info[n] for n in index.required_inputs]

    def get_outputs(self) -> list[onnx.ValueInfoProto]:
        index = self._require_index()
        return list(index.graph.output)

    def _require_index(self) -> GraphIndex:
        if self._index is None:
            raise RuntimeStateError("Session is not open: use 'async with Session(...)'")
        return self._index

    def stage_statistics(self) -> dict[str, Any]:
        """Per stage name, what its compiled stage reports (its backend's frozen ``statistics()``
        dataclass: a twin stage's modelled time and energy, an NPU stage's precision, accuracy
        and core masks, ...), or None for a backend that reports nothing.

        :raises RuntimeStateError: the session is not open.
        """
        self._require_index()
        out: dict[str, Any] = {}
        for st in self._stages:
            stats = getattr(st.compiled, "statistics", None)
            out[st.spec.name] = stats() if callable(stats) else None
        return out

    def statistics(self) -> SessionStatistics:
        """A snapshot of requests, stage runs, the pools and the transfer engine."""
        sch = self._scheduler
        core = self._core
        return SessionStatistics(
            requests_started=core.started,
            requests_completed=core.completed,
            requests_failed=core.failed,
            requests_cancelled=core.cancelled,
            in_flight=core.in_flight,
            stage_runs=self._retired_runs + (sum(w.runs for w in sch.unique_workers()) if sch is not None else 0),
            stages=len(self._stages),
            devices=len(sch.workers) if sch is not None else 0,
            max_in_flight=core.max_in_flight,
            peak_in_flight=core.peak_in_flight,
            queued_stages=sch.queued() if sch is not None else 0,
            stage_runs_bound=sch.stage_runs_bound if sch is not None else 0,
            stage_runs_unbound=sch.stage_runs_unbound if sch is not None else 0,
            stage_runs_to_caller=sch.stage_runs_to_caller if sch is not None else 0,
            wakeups_coalesced=sch.wakeups_coalesced if sch is not None else 0,
            unbound_stages=MappingProxyType({st.name: st.fallback_reason or "" for st in self._stages
                                             if not st.bound}),
            bytes_copied_to_caller=core.bytes_copied + (sch.bytes_to_caller if sch is not None else 0),
            bytes_staged=sch.bytes_staged if sch is not None else 0,
            pools=MappingProxyType({name: p.statistics() for name, p in self._pools.items()}),
            transfers=self._engine.statistics() if self._engine is not None else None,
            compile=compile_counters(self._devices, since=self._compile_base, refused=len(self._refusals)),
            **(self._adapter.board_figures(self._stages) if self._adapter is not None
               else energy_fields(None, self._stages, 0.0, {})),
            replanning=self._adapter.statistics() if self._adapter is not None else ReplanStatistics(),
            failover=(self._adapter.failover.statistics()
                      if self._adapter is not None and self._adapter.failover is not None else None),
            allocation_failures=sch.allocation_failures if sch is not None else 0,
        )

    @overload
    async def run(self, feeds: Mapping[str, Any], *, output_names: Sequence[str] | None = None,
                  priority: Priority | int = ..., zero_copy: Literal[False] = False) -> dict[str, np.ndarray]: ...

    @overload
    async def run(self, feeds: Mapping[str, Any], *, output_names: Sequence[str] | None = None,
                  priority: Priority | int = ..., zero_copy: Literal[True]) -> Outputs: ...

    @overload
    async def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
                  priority: Priority | int = ..., zero_copy: Literal[False] = False) -> list[np.ndarray]: ...

    @overload
    async def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
                  priority: Priority | int = ..., zero_copy: Literal[True]) -> Outputs: ...

    @overload
    async def run(self, *args: Any, priority: Priority | int = ..., zero_copy: bool = ...,
                  **kwargs: Any) -> dict[str, np.ndarray] | list[np.ndarray] | Outputs: ...

    async def run(self, *args: Any, priority: Priority | int = Priority.NORMAL, zero_copy: bool = False,
                  **kwargs: Any) -> dict[str, np.ndarray] | list[np.ndarray] | Outputs:
        """Run one request.

        ``await s.run(feeds)`` returns ``{output name: array}`` (``output_names=`` picks
        some, in that order); ``await s.run(output_names, input_feed)`` (onnxruntime's form;
        ``None`` = all outputs) returns a list in ``output_names`` order. The arrays are the
        caller's: each pool-backed output was copied exactly once out of the pool.

        With ``zero_copy=True`` either form returns :class:`Outputs` (in the requested
        order): read-only views of the pool memory the stages wrote, valid until
        ``release()``; nothing is copied.

        :param priority: :class:`Priority` (or its int); more urgent requests' stages start
            first on every device and their transfers preempt less urgent ones.
        :raises InputError: unknown or missing input, wrong dtype or shape (names the input).
        :raises StageExecutionError: a stage failed (names stage and device); other
            requests are unaffected.
        :raises TransferError: moving a tensor between memory domains failed.
        :raises RuntimeStateError: the session is not open.
        :raises ValueError: ``priority`` is not a :class:`Priority`.
        :raises TypeError: neither calling form.
        """
        if len(args) == 1 and not kwargs:  # the common form, parsed without the generic path
            feeds, output_names, ort_form = args[0], None, False
        elif len(args) == 2 or "input_feed" in kwargs:
            output_names = kwargs.pop("output_names", args[0] if args else None)
            feeds = kwargs.pop("input_feed", args[1] if len(args) > 1 else None)
            ort_form = True
        else:
            if len(args) != 1 and "feeds" not in kwargs:
                raise TypeError("run() takes feeds, or (output_names, input_feed)")
            feeds = kwargs.pop("feeds", args[0] if args else None)
            output_names = kwargs.pop("output_names", None)
            ort_form = False
        if kwargs:
            raise TypeError(f"run() got unexpected keyword arguments {sorted(kwargs)}")
        core = self._core
        core.require_open("run()")
        checked = core.check_feeds(feeds)
        wanted = core.wanted(output_names)
        prio = priority_value(priority)
        await core.acquire()
        try:
            result = await core.execute(checked, wanted, prio, zero_copy)
        finally:
            core.release()
        if ort_form and not zero_copy:
            return [result[n] for n in wanted]
        return result

    def map(self, source: Iterable[Mapping[str, Any]] | AsyncIterable[Mapping[str, Any]], *,
            priority: Priority | int = Priority.NORMAL, window: int | None = None, zero_copy: bool = False,
            output_names: Sequence[str] | None = None) -> ResultStream:
        """Run a stream of requests, one per item of ``source``; results come in source order.

        ::

            async with s.map(frames) as results:       # an iterable or async iterable of feeds
                async for out in results:
                    use(out)

        The device workers admit the stream's next request as they finish one, and the event
        loop is woken about once per ``window // 2`` results (see ``hetsched/_stream.py``):
        the way to push a stream through at full throughput. Each result is what
        ``run(feeds, priority=priority, zero_copy=zero_copy)`` returns. ``run()`` stays the
        call for latency: a stream's result may wait until its batch is complete.

        :param window: most requests of the stream running at once (default: eight per
            worker thread, at most ``max_in_flight``); it holds that many of the session's
            admission slots while open (at least one, the rest as far as free when it opens).
            At most ``window`` more finished results wait for the consumer: a consumer that
            falls behind holds the stream back.
        :param output_names: the outputs wanted (default: all).
        :raises RuntimeStateError: the session is not open (on entering the stream).
        :raises InputError: ``source`` is not an iterable; an unknown output name (on entering);
            an invalid item (in its place, while iterating).
        :raises ValueError: ``priority`` is not a :class:`Priority`, ``window`` is not positive.
        """
        return ResultStream(self._core, source, priority=priority_value(priority), window=window,
                            zero_copy=zero_copy, output_names=output_names)

    async def profile(self, feeds: Mapping[str, Any] | None = None, *, repeats: int = 3) -> CostTable:
        """Measure every unit on every capable device, then re-plan with the measurements.

        Units run one at a time in topological order on each device (with ``feeds`` or
        random inputs of the right types); the median of ``repeats`` runs goes into
        :attr:`costs` under the unit's key (see ``hetsched/_profiling.py``). Returns the cost table.

        :raises RuntimeStateError: the session is not open.
        :raises InputError: invalid ``feeds``, or none given and an input is not a tensor.
        """
        core = self._core
        if not core.is_open:
            raise RuntimeStateError("Session.profile() needs an open session")
        index = self._require_index()
        plan = self.plan
        checked = core.check_feeds(feeds) if feeds is not None else random_feeds(index)
        await anyio.to_thread.run_sync(profile_units, index, plan, checked, repeats, self.costs)
        await self._stop_workers()
        await self._replan(use_costs=True)
        self._start_workers()
        return self.costs
