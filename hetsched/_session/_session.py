"""``Session``: plan a model across devices, compile its stages, serve many requests at once.

The runtime underneath (``hetsched._runtime``): one :class:`BufferPool` per memory
domain, a :class:`TransferEngine` between domains that do not share memory, and a
:class:`Scheduler` with per-device worker threads fed by priority queues (see
``hetsched/_runtime/_scheduler.py`` for the flow of one request).

What lives where: the Session wires (this module: lifecycle, planning and re-planning,
statistics, the public calls); everything a request goes through once the session is open is
the session core (``hetsched/_session/_core.py``), shared by ``run()`` and ``map()`` streams
(``hetsched/_session/_stream.py``); feed checks, delivery and its zero-copy contract, profiling, setup
helpers and :class:`~hetsched.SyncSession` have their own modules (``_feeds``, ``_delivery``,
``_profiling``, ``_setup``, ``_sync``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, overload

import anyio
import numpy as np
import onnx

from hetsched.backends import Device

from .._errors import RuntimeStateError
from .._events import Priority
from .._planning.costs import CostTable
from .._planning.plan import Plan
from .._runtime._buffers import BufferPool
from .._runtime._domains import Topology
from ._core import priority_value
from ._delivery import Outputs
from ._feeds import random_feeds
from ._lifecycle import SessionBase
from ._profiling import profile_units
from ._replan import ReplanStatistics
from ._setup import (
    compile_counters,
)
from ._statistics import SessionStatistics, energy_fields
from ._stream import ResultStream

if TYPE_CHECKING:
    pass

__all__ = ["Session", "SessionStatistics"]


class Session(SessionBase):
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
    :param trace: write a Chrome trace event JSON file here (opens in Perfetto's UI and
        chrome://tracing; see ``hetsched/_session/_trace.py``): a slice per stage run on its device's worker
        thread, requests, transfers per channel, governor phases, re-plans, and counters for every
        clock, thermal zone and rail of ``root`` sampled every 0.1 s. Written incrementally (bounded
        memory) and closed on every exit path; with a trace on, ``map()`` streams take the general
        path (the trace listens to ``REQUEST_START``/``REQUEST_END``). None: no trace hook is registered.
    :raises ModelError: the model could not be loaded (on ``__aenter__``), or a calibration feed
        misses a graph input.
    :raises PartitionError, PlacementError, DeviceSpecError, CompileError: planning failed.
    :raises TransferError: a device's memory domain is not in ``topology``.
    :raises BufferLeakError: on exit, pool buffers were still referenced (unreleased
        :class:`Outputs`); the message names the stages that produced them.
    """

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
            worker_states_renewed=sch.states_renewed if sch is not None else 0,
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
        return ResultStream(self._core, source, priority=priority_value(priority), window=window,
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
        await self._stop_workers()
        await self._replan(use_costs=True)
        self._start_workers()
        return self.costs
