"""``Session``: plan a model across devices, compile its stages, serve many requests at once.

A Session is composed of three parts, none of them a base class of another:

* a :class:`~hetsched.Runtime` (``hetsched/_session/_runtime.py``): the board's devices, device
  workers, pools and transfer engine, shared by every session attached to it (``runtime=``),
  or opened by the session for itself;
* its lifecycle (``hetsched/_session/_lifecycle.py``): opening and closing, planning,
  compiling and installing plans, the adapter that re-plans while serving;
* its core (``hetsched/_session/_core.py``): admission, feed checks, submission, delivery and
  the request counters, shared by ``run()`` and ``map()`` streams (``_stream``).

This module holds the public calls. Feed checks, delivery and its zero-copy contract,
profiling, setup helpers and :class:`~hetsched.SyncSession` have their own modules
(``_feeds``, ``_delivery``, ``_profiling``, ``_setup``, ``_sync``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

import anyio
import numpy as np
import onnx

from hetsched.backends import Device
from hetsched.policies import PlacementPolicy

from .._compat import Self
from .._errors import RuntimeStateError
from .._events import Event, HookDispatcher, Priority
from .._planning.costs import CostTable
from .._planning.graph import GraphIndex
from .._planning.model import ModelSource
from .._planning.plan import Plan
from .._runtime._buffers import BufferPool
from .._runtime._clock import Clock, SystemClock
from .._runtime._domains import Topology
from .._runtime._scheduler import StageRuntime
from .._runtime._tenants import DEFAULT_SLO
from ._core import SessionCore, priority_value
from ._delivery import Outputs
from ._feeds import random_feeds
from ._lifecycle import Lifecycle
from ._options import Adaptation, Memory, Scheduling
from ._profiling import profile_units
from ._replan import ReplanKind
from ._runtime import Runtime
from ._statistics import SessionStatistics, session_statistics
from ._stream import ResultStream

if TYPE_CHECKING:
    from ._trace import SessionTrace

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

    Several models on one board share a :class:`~hetsched.Runtime` (``runtime=rt``): its
    device workers, pools, transfer engine and governor; each device's queue then orders the
    stages of every session's requests (priority class, then deadline: ``slo_s``), and a new
    session is placed knowing the load the others put on the devices. Transfer hooks then go to
    the runtime's ``hooks``. Without ``runtime=`` the session opens a runtime of its own.

    Everything the session starts (device threads, transfers) is stopped and joined when
    the ``async with`` block exits, also on error or cancellation; on a shared runtime, its
    own requests are drained and its own stages closed, and the other sessions keep serving.

    :param model: a path, bytes, an ``onnx.ModelProto`` or the name of an embedded model
        (``"light_squeezenet"``, as the CLI accepts; see :func:`hetsched.load_model`).
    :param devices: device specs or :class:`Device` objects (default: the host's CPU clusters);
        with ``runtime=``, names of the runtime's devices to plan over (default: all of them).
    :param policy: a policy object, function or name (default ``PowerThermalWeighted()``).
    :param root: the filesystem root for hardware discovery and ``dev/dma_heap`` (a twin's root
        in tests; default ``"/"``, or the runtime's).
    :param shapes: ``{input name: dims}`` fixing free dimensions for backends that need static
        shapes (passed to each compile in the device's options under ``"shapes"``).
    :param hooks: objects with :class:`Hooks` methods.
    :param governor: a DVFS governor (anything with ``on_phase``, e.g. an entered
        :class:`hetsched.Governor`): the session then emits PREPROCESS / INFER /
        POSTPROCESS / IDLE itself (see :class:`hetsched.GovernorHooks`). With ``runtime=``,
        give the governor to the runtime instead (one per board).
    :param trace: write a Chrome trace event JSON file here (opens in Perfetto's UI and
        chrome://tracing; see ``hetsched/_session/_trace.py``): a slice per stage run on its device's worker
        thread, requests, transfers per channel, governor phases, re-plans, and counters for every
        clock, thermal zone and rail of ``root`` sampled every 0.1 s. Written incrementally (bounded
        memory) and closed on every exit path; with a trace on, ``map()`` streams take the general
        path (the trace listens to ``REQUEST_START``/``REQUEST_END``). None: no trace hook is registered.
    :param clock: the clock the runtime reads for admission times (FIFO order and aging), the
        deadline of a coalesced wake-up, stage timings and hook timestamps (default: the
        system's, or the runtime's; a test passes a ``VirtualClock``
        (``hetsched/_runtime/_clock.py``) and advances it by hand, so nothing it checks depends on
        how fast the machine is).
    :param max_unit_nodes: cut unit subgraphs to at most this many nodes (1 = one node each).
    :param max_in_flight: the session's requests admitted at once; more wait (backpressure).
    :param costs: a :class:`CostTable` of measured costs (one is created otherwise).
    :param calibration: feed dicts for the model's graph inputs (an iterable, read once here, at
        most 64 used): NPU stages are quantized to INT8 (w8a8) and calibrated with the tensors
        their upstream stages produce for these feeds (computed on the host by onnxruntime); each
        NPU stage's accuracy against fp32 onnxruntime is measured on them (``statistics()`` of the
        stage). Without it NPU stages stay fp16.
    :param runtime: an open :class:`hetsched.Runtime` to attach to (its devices, workers, pools,
        transfer engine and governor are shared with its other sessions). None: the session
        opens a private runtime of its own and closes it with itself.
    :param slo_s: the default SLO of the session's requests, in seconds from admission: a
        scheduling deadline (requests closer to theirs go first within a priority class; one
        that can no longer meet it is flagged and counted), never a cancellation. None: no SLO.
    :param priority: the default :class:`Priority` of the session's requests (``run()`` and
        ``map()`` take their own); joint placement weighs the other sessions' load by it.
    :param rate_hz: the requests per second the session is expected to be offered (an open
        loop: a camera's fps, a classifier's fps x crops per frame); None (default): unknown or
        a closed loop. Given to placement (``build_plan(rate_hz=)``, also at every re-plan and
        re-placement): a model without an SLO whose offered load fits beside the load the
        runtime's more urgent sessions reserve keeps its cheapest device instead of being
        placed for latency away from them. Not a rate limit: requests are never paced by it.
    :param weight: the session's share of the devices against other sessions' requests of the
        same class without SLO (weighted fair queuing; 1.0 each by default).
    :param name: the session's name in the runtime's statistics (default: the model's file
        name, or ``session-N``; made unique).
    :param scheduling: how the device queues order stages (:class:`hetsched.Scheduling`); only
        without ``runtime=`` (a runtime's scheduling is the runtime's).
    :param memory: memory domains, pools and transfers (:class:`hetsched.Memory`); only without
        ``runtime=``.
    :param adaptation: re-planning, the background compile, learned costs, the power budget
        and device states fed to the policy (:class:`hetsched.Adaptation`).
    :raises ValueError: a bad ``max_in_flight``, ``slo_s``, ``rate_hz`` or ``weight``; ``scheduling``,
        ``memory``, ``governor``, ``root`` or ``clock`` given with a ``runtime`` they would contradict.
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
        root: str | os.PathLike[str] | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        hooks: Sequence[object] = (),
        governor: Any = None,
        trace: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        max_unit_nodes: int | None = None,
        max_in_flight: int = 64,
        costs: CostTable | None = None,
        calibration: Iterable[Mapping[str, Any]] | None = None,
        runtime: Runtime | None = None,
        slo_s: float | None = None,
        priority: Priority | int = Priority.NORMAL,
        rate_hz: float | None = None,
        weight: float = 1.0,
        name: str | None = None,
        scheduling: Scheduling | None = None,
        memory: Memory | None = None,
        adaptation: Adaptation = Adaptation(),  # noqa: B008 (frozen: one shared value)
    ):
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if slo_s is not None and not (isinstance(slo_s, (int, float)) and 0 < slo_s < float("inf")):
            raise ValueError(f"slo_s must be a positive number of seconds or None, got {slo_s!r}")
        if rate_hz is not None and (isinstance(rate_hz, bool) or not isinstance(rate_hz, (int, float))
                                    or not 0 < rate_hz < float("inf")):
            raise ValueError(f"rate_hz must be a positive number of requests per second or None, got {rate_hz!r}")
        if not (isinstance(weight, (int, float)) and 0 < weight < float("inf")):
            raise ValueError(f"weight must be a positive number, got {weight!r}")
        if not isinstance(adaptation, Adaptation):
            raise TypeError(f"adaptation must be a hetsched.Adaptation, got {type(adaptation).__name__}")
        for arg, value, kind in (("scheduling", scheduling, Scheduling), ("memory", memory, Memory)):
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"{arg} must be a hetsched.{kind.__name__}, got {type(value).__name__}")
        if runtime is not None:
            if not isinstance(runtime, Runtime):
                raise TypeError(f"runtime must be a hetsched.Runtime, got {type(runtime).__name__}")
            clash = [arg for arg, value in (("scheduling", scheduling), ("memory", memory), ("governor", governor))
                     if value is not None]
            if clash:
                raise ValueError(f"{', '.join(clash)} belong(s) to the Runtime a session attaches to (one per "
                                 "board): give them to hetsched.Runtime(...)")
            if root is not None and os.fspath(root) != os.fspath(runtime.root):
                raise ValueError(f"root {os.fspath(root)!r} is not the runtime's ({os.fspath(runtime.root)!r})")
            if clock is not None and clock is not runtime.clock:
                raise ValueError("clock: a session attached to a Runtime reads the runtime's clock")
            root, clock = runtime.root, runtime.clock
            governor_hooks = runtime.governor_hooks
            if governor_hooks is not None:
                hooks = [*hooks, governor_hooks]
            board_trace = runtime.trace_hooks()  # the runtime's trace: this session's track
            if board_trace is not None:
                hooks = [*hooks, board_trace]
        else:
            root = "/" if root is None else root
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
        self.costs = costs if costs is not None else CostTable()
        self._slo_s = slo_s
        self._priority = priority_value(priority)
        self._core = SessionCore(self._dispatch, self._clock, max_in_flight)
        if name is None and isinstance(model, (str, os.PathLike)):
            name = os.path.basename(os.fspath(model)).removesuffix(".onnx") or None
        self._life = Lifecycle(
            source=model, devices=devices, policy=policy, max_unit_nodes=max_unit_nodes, root=root,
            dispatch=self._dispatch, clock=self._clock, core=self._core, costs=self.costs, shapes=shapes,
            calibration=calibration, adaptation=adaptation, runtime=runtime,
            scheduling=scheduling if scheduling is not None else Scheduling(),
            memory=memory if memory is not None else Memory(), name=name, weight=float(weight), slo_s=slo_s,
            max_in_flight=max_in_flight, trace=self._trace, energy=self._energy_j, governor=governor,
            priority=self._priority, rate_hz=None if rate_hz is None else float(rate_hz))

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        life = self._life
        if self._core.is_open or life.opening:
            raise RuntimeStateError("Session is already open (or being opened by another task)")
        life.opening = True
        try:
            await life.open()
        finally:
            life.opening = False
        self._core.emit(Event.SESSION_START)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        leak = await self._life.close(exc)
        if leak is not None and exc is None:
            raise leak
        trace = self._trace
        if exc is None and trace is not None and trace.failure is not None:
            raise trace.failure  # a full disk: every request was answered, the trace is cut (issue 23)

    @property
    def name(self) -> str | None:
        """The session's name in its runtime's statistics (unique there once open)."""
        return self._life.name

    @property
    def runtime(self) -> Runtime:
        """The runtime the open session runs on (the shared one, or its private one).

        :raises RuntimeStateError: the session is not open.
        """
        rt = self._life.runtime
        if rt is None:
            raise RuntimeStateError("Session.runtime is available inside 'async with Session(...)'")
        return rt

    # the parts other layers read (tests, the CLI's compile report)

    @property
    def _stages(self) -> list[StageRuntime]:
        return self._life.stages

    @property
    def _index(self) -> GraphIndex | None:
        return self._life.index

    def _require_index(self) -> GraphIndex:
        return self._life.require_index()

    def _energy_j(self) -> float | None:
        """Joules of the session's stage runs so far (its statistics' ``energy_j``)."""
        adapter = self._life.adapter
        if adapter is None:
            return None
        energy: float | None = adapter.board_figures(self._life.stages)["energy_j"]
        return energy

    async def wait_planned(self) -> Plan:
        """Wait until the plan compiled in the background (``Adaptation.background_compile``) is
        in place, or failed (the opening plan then stays), and return the plan in use.

        :raises RuntimeStateError: the session is not open.
        """
        self._core.require_open("wait_planned()")
        adapter = self._life.adapter
        assert adapter is not None
        await adapter.wait_background()
        return self.plan

    async def replan(self, *, reason: str = "requested", use_costs: bool = True) -> Plan:
        """Re-place the model now, while serving: sample the board, plan (in a worker thread),
        compile the new stages in the background, then switch (see ``hetsched/_session/_adapt.py``).

        Requests admitted after the switch use the new plan; those in flight finish on the
        old one, whose stages close once drained. Fires :attr:`Event.REPLAN` with ``reason``.

        :param use_costs: plan with the costs measured so far (the cost table), not only the
            analytic model.
        :raises RuntimeStateError: the session is not open.
        :raises PlacementError, PartitionError, CompileError: no plan could be made; the plan in
            place keeps serving.
        """
        self._core.require_open("replan()")
        adapter = self._life.adapter
        assert adapter is not None
        plan: Plan = await adapter.replan(reason, use_costs=use_costs)  # ReplanKind.REQUESTED
        return plan

    # -- public API -------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The current plan: stages, placement and the score terms that decided it."""
        plan = self._life.plan
        if plan is None:
            raise RuntimeStateError("Session.plan is available inside 'async with Session(...)'")
        return plan

    @property
    def devices(self) -> list[Device]:
        """The devices the session plans over."""
        return list(self._life.devices)

    @property
    def topology(self) -> Topology:
        """The memory domains in use and which of them share memory (the runtime's)."""
        rt = self._life.runtime
        if rt is None or not rt.is_open:
            raise RuntimeStateError("Session.topology is available inside 'async with Session(...)'")
        return rt.topology

    @property
    def pools(self) -> Mapping[str, BufferPool]:
        """The buffer pool of each memory domain, by domain name (the runtime's)."""
        rt = self._life.runtime
        return rt.pools if rt is not None else MappingProxyType({})

    def get_inputs(self) -> list[onnx.ValueInfoProto]:
        """Inputs that must be fed (graph inputs without an initializer), as onnxruntime lists them."""
        index = self._require_index()
        return [index.value_info[n] for n in index.required_inputs]

    def get_outputs(self) -> list[onnx.ValueInfoProto]:
        index = self._require_index()
        return list(index.graph.output)

    def stage_statistics(self) -> dict[str, Any]:
        """Per stage name, what its compiled stage reports (its backend's frozen ``statistics()``
        dataclass: a twin stage's modelled time and energy, an NPU stage's precision, accuracy
        and core masks, ...), or None for a backend that reports nothing.

        :raises RuntimeStateError: the session is not open.
        """
        self._require_index()
        out: dict[str, Any] = {}
        for st in self._life.stages:
            reporting = st.hooks.statistics
            out[st.spec.name] = reporting.statistics() if reporting is not None else None
        return out

    def statistics(self) -> SessionStatistics:
        """A snapshot of requests, stage runs, the pools and the transfer engine.

        The stage-run counters of the board (``stage_runs_bound``, ``wakeups_coalesced``, ...)
        and the pools and transfers are the runtime's: with a shared :class:`Runtime` they count
        every session's; the request counters, ``stage_runs``, energy and busy time are this
        session's own.
        """
        return session_statistics(self._life, self._core, self.pools, slo_s=self._slo_s)

    @overload
    async def run(self, feeds: Mapping[str, Any], *, output_names: Sequence[str] | None = None,
                  priority: Priority | int | None = ..., zero_copy: Literal[False] = False,
                  slo_s: float | None = ...) -> dict[str, np.ndarray]: ...

    @overload
    async def run(self, feeds: Mapping[str, Any], *, output_names: Sequence[str] | None = None,
                  priority: Priority | int | None = ..., zero_copy: Literal[True],
                  slo_s: float | None = ...) -> Outputs: ...

    @overload
    async def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
                  priority: Priority | int | None = ..., zero_copy: Literal[False] = False,
                  slo_s: float | None = ...) -> list[np.ndarray]: ...

    @overload
    async def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
                  priority: Priority | int | None = ..., zero_copy: Literal[True],
                  slo_s: float | None = ...) -> Outputs: ...

    @overload
    async def run(self, *args: Any, priority: Priority | int | None = ..., zero_copy: bool = ...,
                  slo_s: float | None = ..., **kwargs: Any) -> dict[str, np.ndarray] | list[np.ndarray] | Outputs: ...

    async def run(self, *args: Any, priority: Priority | int | None = None, zero_copy: bool = False,
                  slo_s: Any = DEFAULT_SLO, **kwargs: Any) -> dict[str, np.ndarray] | list[np.ndarray] | Outputs:
        """Run one request.

        ``await s.run(feeds)`` returns ``{output name: array}`` (``output_names=`` picks
        some, in that order); ``await s.run(output_names, input_feed)`` (onnxruntime's form;
        ``None`` = all outputs) returns a list in ``output_names`` order. The arrays are the
        caller's: each pool-backed output was copied exactly once out of the pool.

        With ``zero_copy=True`` either form returns :class:`Outputs` (in the requested
        order): read-only views of the pool memory the stages wrote, valid until
        ``release()``; nothing is copied.

        :param priority: :class:`Priority` (or its int; default: the session's); more urgent
            requests' stages start first on every device and their transfers preempt less urgent ones.
        :param slo_s: this request's SLO in seconds from admission (default: the session's
            ``slo_s``; None: none): a scheduling deadline, never a cancellation (cancel with an
            anyio scope). A request that cannot meet it any more is flagged, served after those
            that can, and counted in ``statistics().slo_missed``.
        :raises InputError: unknown or missing input, wrong dtype or shape (names the input).
        :raises StageExecutionError: a stage failed (names stage and device); other
            requests are unaffected.
        :raises TransferError: moving a tensor between memory domains failed.
        :raises RuntimeStateError: the session is not open.
        :raises ValueError: ``priority`` is not a :class:`Priority`; ``slo_s`` is not positive.
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
        prio = self._priority if priority is None else priority_value(priority)
        if slo_s is not DEFAULT_SLO and slo_s is not None and not (isinstance(slo_s, (int, float)) and slo_s > 0):
            raise ValueError(f"slo_s must be a positive number of seconds or None, got {slo_s!r}")
        await core.acquire(prio)
        try:
            result = await core.execute(checked, wanted, prio, zero_copy, slo_s)
        finally:
            core.release()
        if ort_form and not zero_copy:
            return [result[n] for n in wanted]
        return result

    def map(self, source: Iterable[Mapping[str, Any]] | AsyncIterable[Mapping[str, Any]], *,
            priority: Priority | int | None = None, window: int | None = None, zero_copy: bool = False,
            output_names: Sequence[str] | None = None) -> ResultStream:
        """Run a stream of requests, one per item of ``source``; results come in source order.

        ::

            async with s.map(frames) as results:       # an iterable or async iterable of feeds
                async for out in results:
                    use(out)

        The device workers admit the stream's next request as they finish one, and the event
        loop is woken about once per ``window // 2`` results (see ``hetsched/_session/_stream.py``):
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
        prio = self._priority if priority is None else priority_value(priority)
        return ResultStream(self._core, source, priority=prio, window=window,
                            zero_copy=zero_copy, output_names=output_names)

    async def profile(self, feeds: Mapping[str, Any] | None = None, *, repeats: int = 3,
                      progress: Callable[[int, int], None] | None = None) -> CostTable:
        """Measure every unit on every capable device, then re-plan with the measurements.

        Units run one at a time in topological order on each device (with ``feeds`` or
        random inputs of the right types); the median of ``repeats`` runs goes into
        :attr:`costs` under the unit's key (see ``hetsched/_session/_profiling.py``). Returns the cost table.
        ``progress(done, total)`` is called from the profiling thread after each unit run.

        :raises RuntimeStateError: the session is not open.
        :raises InputError: invalid ``feeds``, or none given and an input is not a tensor.
        """
        core = self._core
        if not core.is_open:
            raise RuntimeStateError("Session.profile() needs an open session")
        index = self._require_index()
        plan = self.plan
        checked = core.check_feeds(feeds) if feeds is not None else random_feeds(index)
        measure = functools.partial(profile_units, perf_counter=self._clock.perf_counter)
        await anyio.to_thread.run_sync(measure, index, plan, checked, repeats, self.costs, progress)
        # re-placed with the measurements while serving (other sessions of a shared runtime too)
        self._core.require_open("profile()")
        adapter = self._life.adapter
        assert adapter is not None
        await adapter.replan("profile: measured every unit", kind=ReplanKind.PROFILE, use_costs=True)
        return self.costs
