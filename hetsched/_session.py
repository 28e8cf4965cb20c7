"""``Session``: plan a model across devices, compile its stages, serve many requests at once.

The runtime underneath (``hetsched._runtime``): one :class:`BufferPool` per memory
domain, a :class:`TransferEngine` between domains that do not share memory, and a
:class:`Scheduler` with per-device worker threads fed by priority queues (see
``hetsched/_runtime/_scheduler.py`` for the flow of one request).

Zero-copy contract:

* A stage whose outputs have static shapes (after shape inference) and a backend that
  runs in place (:class:`~hetsched.backends.BindableStage`; the CPU backend does, through
  onnxruntime IO binding) writes its outputs straight into pool buffers, and the next
  stage on the same memory domain reads that very memory. Other stages get
  backend-allocated outputs; ``statistics().unbound_stages`` names them and why.
* ``await s.run(feeds)`` returns arrays the caller owns. A stage whose outputs only the
  caller reads then lets the backend allocate them and they are handed over as they are:
  no pool buffer, no copy (onnxruntime hands its allocation to numpy). An output that lives
  in a pool buffer because a stage reads it too (or it crossed a memory domain) is copied
  **exactly once** into a fresh array, in the worker that finished the request, and its
  buffer goes back to the pool right away (``statistics().bytes_copied_to_caller``).
* ``await s.run(feeds, zero_copy=True)`` returns :class:`Outputs`: read-only views of the
  pool memory itself, no copy at all, valid until ``outputs.release()`` (or the end of
  ``with outputs:``). Outputs still unreleased when the session closes are reported as a
  :class:`~hetsched.BufferLeakError` naming the stage that produced them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any

import anyio
import anyio.from_thread
import numpy as np
import onnx
from onnx import numpy_helper

from hetsched.backends import Device, get_backend
from hetsched.backends.cpu import pin_current_thread
from hetsched.policies import DeviceState, PlacementPolicy

from ._planning.costs import STAGE_OVERHEAD_S, CostTable, analytic_node_costs
from ._planning.devices import resolve_devices
from ._errors import BackendError, BufferLeakError, InputError, RuntimeStateError, TransferError
from ._events import Event, EventInfo, HookDispatcher, Priority
from ._planning.graph import GraphIndex
from ._planning.model import ModelSource, load_model
from ._planning.partition import extract_stage
from ._planning.plan import Plan, build_plan, unit_key
from ._runtime._buffers import BufferPool, PoolStatistics, TensorBuffer, pools_for
from ._runtime._domains import MemoryDomain, MemoryKind, Topology
from ._runtime._scheduler import _MISSING, Admission, Scheduler, StageRuntime
from ._stream import ResultStream
from ._runtime._transfer import CopyFn, TransferEngine, TransferInfo, TransferStatistics

__all__ = ["Outputs", "Session", "SessionStatistics", "SyncSession"]


def _np_dtype(elem_type: int) -> np.dtype[Any] | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class SessionStatistics:
    """A snapshot of a :class:`Session` (pool and transfer snapshots included)."""

    requests_started: int
    requests_completed: int
    requests_failed: int
    requests_cancelled: int
    in_flight: int
    stage_runs: int
    stages: int
    devices: int
    max_in_flight: int = 0
    """The admission bound (backpressure): more requests wait before starting."""
    peak_in_flight: int = 0
    """Most requests admitted at once so far (never above ``max_in_flight``)."""
    queued_stages: int = 0
    """Ready stages waiting in device queues now."""
    stage_runs_bound: int = 0
    """Stage runs whose outputs were written straight into pool buffers (IO binding)."""
    stage_runs_unbound: int = 0
    """Stage runs whose outputs the backend allocated (dynamic shapes, unbindable types, a full pool)."""
    stage_runs_to_caller: int = 0
    """Runs of stages whose outputs only the caller reads, who wanted arrays to keep: the backend
    allocated them and they were handed over as they were (no pool buffer, no copy)."""
    unbound_stages: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Stages not run in place, with the reason."""
    wakeups_coalesced: int = 0
    """Finished NORMAL/BACKGROUND requests whose caller was woken together with a later one
    (the workers its next request would start on still had queued work; see README, Runtime)."""
    bytes_copied_to_caller: int = 0
    """Bytes of the one documented copy of each output handed to a caller (0 with ``zero_copy``)."""
    bytes_staged: int = 0
    """Bytes of fed arrays copied into host buffers to be transferred to a domain the host does not share."""
    pools: Mapping[str, PoolStatistics] = field(default_factory=lambda: MappingProxyType({}))
    """One snapshot per memory domain's buffer pool."""
    transfers: TransferStatistics | None = None
    """The transfer engine's snapshot (None before the session opened)."""

    @property
    def bytes_copied_same_domain(self) -> int:
        """Bytes copied from a memory domain to itself, over all pools: 0 when zero-copy holds."""
        return sum(p.bytes_copied_same_domain for p in self.pools.values())


class Outputs(Mapping[str, np.ndarray]):
    """A request's outputs as read-only views of pool memory (``run(..., zero_copy=True)``).

    ::

        with await s.run(feeds, zero_copy=True) as out:
            top5 = np.argsort(out["prob"][0])[-5:]      # reads the memory the last stage wrote
        # the buffers are back in the pool here: views taken above must not be used any more

    Iteration follows the requested output order, so ``list(out.values())`` is
    onnxruntime's list form. Arrays that were not pool-backed (a fed input passed through,
    a constant, a backend-allocated output) are included as they are. ``release()`` is
    idempotent and thread-safe; afterwards indexing raises :class:`RuntimeStateError`.
    """

    __slots__ = ("_arrays", "_buffers", "_lock")

    def __init__(self, arrays: dict[str, np.ndarray], buffers: list[TensorBuffer]):
        self._arrays: dict[str, np.ndarray] | None = arrays
        self._buffers = buffers
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> np.ndarray:
        arrays = self._arrays
        if arrays is None:
            raise RuntimeStateError("these outputs were released; their memory is back in the pool")
        return arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays or {})

    def __len__(self) -> int:
        return len(self._arrays or {})

    @property
    def released(self) -> bool:
        return self._arrays is None

    @property
    def buffers(self) -> tuple[TensorBuffer, ...]:
        """The pool buffers behind the views (for ``ptr``/``export()``), until released."""
        return tuple(self._buffers)

    def copy(self) -> dict[str, np.ndarray]:
        """Arrays that own their memory (one copy each), valid after :meth:`release`."""
        return {k: np.array(v, copy=True) for k, v in self.items()}

    def release(self) -> None:
        """Give the buffers back to their pools (views become invalid)."""
        with self._lock:
            bufs, self._buffers, self._arrays = self._buffers, [], None
        for b in bufs:
            b.release()

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        if self._arrays is None:
            return "<Outputs released>"
        return f"<Outputs {list(self._arrays)} zero-copy, {len(self._buffers)} pool buffer(s)>"


class _TransferEvents:
    """Adapts the engine's transfer callbacks to session hooks; an event nobody listens to
    is None here, so the engine skips it for free."""

    def __init__(self, dispatch: HookDispatcher):
        self.before_transfer = self._forward(Event.BEFORE_TRANSFER, dispatch)
        self.after_transfer = self._forward(Event.AFTER_TRANSFER, dispatch)
        self.preempted = self._forward(Event.PREEMPTED, dispatch)
        self.resumed = self._forward(Event.RESUMED, dispatch)

    @staticmethod
    def _forward(event: Event, dispatch: HookDispatcher) -> Callable[[TransferInfo], None] | None:
        fns = dispatch.listeners[event]
        if not fns:
            return None

        def forward(t: TransferInfo) -> None:
            # labels are "<stage>:<value>-><domain>#<request id>" (see Scheduler._transfer)
            head, _, rid = t.label.rpartition("#")
            stage = head.split(":", 1)[0] if head else None
            info = EventInfo(event, time.perf_counter(), int(rid) if rid.isdigit() else None,
                             Priority(t.priority) if 0 <= t.priority <= 3 else None, stage, None,
                             nbytes=t.nbytes, extra=t)
            for fn in fns:
                fn(info)

        return forward


_PRIORITIES = frozenset(int(p) for p in Priority)


def _is_ort_form(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    if len(args) == 2:
        return True
    if "input_feed" in kwargs:
        return True
    return False


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

    :param model: a path, bytes or ``onnx.ModelProto``.
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
    :raises ModelError: the model could not be loaded (on ``__aenter__``).
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
        self._device_states = dict(device_states or {})
        self.costs = costs if costs is not None else CostTable()
        self._learn_costs = learn_costs
        self._max_in_flight = max_in_flight
        self._topology_arg = topology
        self._priorities = priorities
        self._aging_s = aging_s
        self._chunk_bytes = chunk_bytes
        self._copy_fn = copy_fn
        self._pool_capacity = pool_capacity_bytes
        self._plan: Plan | None = None
        self._index: GraphIndex | None = None
        self._stages: list[StageRuntime] = []
        self._scheduler: Scheduler | None = None
        self._engine: TransferEngine | None = None
        self._pools: dict[str, BufferPool] = {}
        self._topology: Topology | None = None
        self._host = "host"
        self._open = False
        self._limiter: Admission | None = None
        self._ids = itertools.count(1)
        self._stats = {"started": 0, "completed": 0, "failed": 0, "cancelled": 0}
        self._in_flight = 0
        self._peak_in_flight = 0
        self._constants: dict[str, Any] = {}
        self._output_source: dict[str, int | None] = {}
        self._retired_runs = 0
        self._feed_specs: dict[str, Any] = {}
        self._required: tuple[str, ...] = ()
        self._all_outputs: tuple[str, ...] = ()
        self._streams: set[ResultStream] = set()

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        if self._open:
            raise RuntimeStateError("Session is already open")
        self._index = await anyio.to_thread.run_sync(self._load)
        self._feed_specs = self._feed_specs_for(self._index)
        self._all_outputs = tuple(self._index.graph_outputs)
        self._required = tuple(self._index.required_inputs)
        self._devices = resolve_devices(self._device_specs, root=self._root)
        self._topology, self._host = self._make_topology(self._devices)
        self._retired_runs = 0
        try:
            self._pools = pools_for(self._topology, capacity_bytes=self._pool_capacity, root=self._root)
            # a custom copy (a DMA wait, a modelled link) may block: never run it on the event loop
            inline = {} if self._copy_fn is None else {"inline_bytes": 0}
            self._engine = TransferEngine(self._topology, self._pools, chunk_bytes=self._chunk_bytes,
                                          copy_fn=self._copy_fn, hooks=_TransferEvents(self._dispatch), **inline)
            await self._engine.__aenter__()
            self._scheduler = Scheduler(
                pools=self._pools, topology=self._topology, host=self._host, engine=self._engine,
                dispatch=self._dispatch, costs=self.costs, learn_costs=self._learn_costs,
                priorities=self._priorities, aging_s=self._aging_s,
            )
            await self._replan()
            self._limiter = Admission(self._max_in_flight)
            self._start_workers()
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._shutdown(exc)
            raise
        self._open = True
        self._emit(Event.SESSION_START)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        with anyio.CancelScope(shield=True):
            self._open = False
            leak = await self._shutdown(exc)
            self._emit(Event.SESSION_END, error=exc or leak)
        if leak is not None and exc is None:
            raise leak

    async def _shutdown(self, exc: BaseException | None) -> BufferLeakError | None:
        """Stop workers, close stages, the engine and the pools; returns the pools' leak report."""
        await self._stop_workers()
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
        labels = [lbl for e in leaks for lbl in getattr(e, "labels", [])]
        stages = sorted({lbl.split(":", 1)[0] for lbl in labels})
        err = BufferLeakError(f"session closed with buffers still referenced, produced by stage(s) {stages}: "
                              + "; ".join(str(e) for e in leaks))
        err.labels = labels  # type: ignore[attr-defined]
        err.stages = stages  # type: ignore[attr-defined]
        return err

    def _make_topology(self, devices: Sequence[Device]) -> tuple[Topology, str]:
        topo = self._topology_arg
        if topo is None:
            names = list(dict.fromkeys(["host", *(d.memory_domain for d in devices)]))
            doms = [MemoryDomain("host", MemoryKind.HOST)] + [MemoryDomain(n, MemoryKind.DEVICE) for n in names[1:]]
            return Topology(doms, shared=[names]), "host"
        known = {d.name for d in topo.domains}
        for dev in devices:
            if dev.memory_domain not in known:
                raise TransferError(f"device {dev.name!r} writes memory domain {dev.memory_domain!r}, which the "
                                    f"topology lacks (it has {sorted(known)})")
        if "host" in known:
            return topo, "host"
        host = next((d.name for d in topo.domains if d.kind is MemoryKind.HOST), None)
        if host is None:
            raise TransferError(f"the topology has no host memory domain for feeds and outputs: {topo!r}")
        return topo, host

    def _load(self) -> GraphIndex:
        model = load_model(self._source)
        index = GraphIndex(model)
        for init in model.graph.initializer:
            if init.name in index.graph_outputs:
                self._constants[init.name] = numpy_helper.to_array(init)
        return index

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
        for st in self._stages:
            st.compiled.close()
        self._stages = []

    async def _replan(self, *, use_costs: bool = False) -> None:
        index = self._index
        assert index is not None
        plan = build_plan(index, self._devices, self._policy, max_unit_nodes=self._max_unit_nodes,
                          device_states=self._device_states, costs=self.costs if use_costs else None)
        stages = await anyio.to_thread.run_sync(self._compile, index, plan)
        old = self._stages
        self._plan, self._stages = plan, stages
        for st in old:
            st.compiled.close()
        self._output_source = self._output_sources(plan)
        assert self._scheduler is not None
        self._scheduler.set_stages(stages, self._output_source)

    def _compile(self, index: GraphIndex, plan: Plan) -> list[StageRuntime]:
        by_name = {d.name: d for d in plan.devices}
        node_costs = analytic_node_costs(index)
        out: list[StageRuntime] = []
        try:
            for spec in plan.stages:
                dev = by_name[spec.device]
                model = extract_stage(index, spec)
                compiled = get_backend(dev.backend).compile(model, dev, name=spec.name)
                flops = sum(node_costs[n].flops for n in spec.nodes)
                nbytes = sum(node_costs[n].bytes for n in spec.nodes)
                est = max(flops / dev.peak_flops, nbytes / dev.mem_bandwidth) + STAGE_OVERHEAD_S
                out.append(StageRuntime(spec, compiled, unit_key(index, spec.nodes), est, dev.memory_domain))
        except BaseException:
            for st in out:
                st.compiled.close()
            raise
        return out

    def _output_sources(self, plan: Plan) -> dict[str, int | None]:
        src: dict[str, int | None] = {}
        for s in plan.stages:
            for o in s.outputs:
                src[o] = s.id
        for o in plan.graph_outputs:
            src.setdefault(o, None)  # a graph input or an initializer passed through
        return src

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

    def statistics(self) -> SessionStatistics:
        """A snapshot of requests, stage runs, the pools and the transfer engine."""
        sch = self._scheduler
        workers = sch.workers if sch is not None else {}
        return SessionStatistics(
            requests_started=self._stats["started"],
            requests_completed=self._stats["completed"],
            requests_failed=self._stats["failed"],
            requests_cancelled=self._stats["cancelled"],
            in_flight=self._in_flight + sum(st._in_flight for st in self._streams),
            stage_runs=self._retired_runs + (sum(w.runs for w in sch.unique_workers()) if sch is not None else 0),
            stages=len(self._stages),
            devices=len(workers),
            max_in_flight=self._max_in_flight,
            peak_in_flight=self._peak_in_flight,
            queued_stages=sch.queued() if sch is not None else 0,
            stage_runs_bound=sch.stage_runs_bound if sch is not None else 0,
            stage_runs_unbound=sch.stage_runs_unbound if sch is not None else 0,
            stage_runs_to_caller=sch.stage_runs_to_caller if sch is not None else 0,
            wakeups_coalesced=sch.wakeups_coalesced if sch is not None else 0,
            unbound_stages=MappingProxyType({st.name: st.fallback_reason or "" for st in self._stages
                                             if not st.bound}),
            bytes_copied_to_caller=sch.bytes_to_caller if sch is not None else 0,
            bytes_staged=sch.bytes_staged if sch is not None else 0,
            pools=MappingProxyType({name: p.statistics() for name, p in self._pools.items()}),
            transfers=self._engine.statistics() if self._engine is not None else None,
        )

    async def run(self, *args: Any, priority: Priority | int = Priority.NORMAL, zero_copy: bool = False,
                  **kwargs: Any) -> Any:
        """Run one request.

        ``await s.run(feeds)`` returns ``{output name: array}``;
        ``await s.run(output_names, input_feed)`` (onnxruntime's form; ``None`` = all
        outputs) returns a list in ``output_names`` order. The arrays are the caller's:
        each pool-backed output was copied exactly once out of the pool.

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
        """
        if len(args) == 1 and not kwargs:  # the common form, parsed without the generic path
            feeds, output_names, ort_form = args[0], None, False
        elif _is_ort_form(args, kwargs):
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
        if not self._open or self._limiter is None:
            raise RuntimeStateError("Session is not open: use 'async with Session(...)' before run()")
        feeds = self._check_feeds(feeds)
        if output_names is None:
            wanted: Sequence[str] = self._all_outputs
        else:
            wanted = list(output_names)
            source = self._output_source
            for name in wanted:
                if name not in source:
                    raise InputError(f"unknown output name {name!r}; the model's outputs are "
                                     f"{self._require_index().graph_outputs}")
        prio = int(priority if priority in _PRIORITIES else Priority(priority))
        limiter = self._limiter
        if not limiter.try_acquire():
            await limiter.acquire()
        try:
            result = await self._execute(feeds, wanted, prio, zero_copy)
        finally:
            limiter.release()
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
        prio = int(priority if priority in _PRIORITIES else Priority(priority))
        return ResultStream(self, source, priority=prio, window=window, zero_copy=zero_copy,
                            output_names=output_names)

    def _feed_specs_for(self, index: GraphIndex) -> dict[str, tuple[np.dtype[Any] | None, tuple[int | None, ...] | None,
                                                                   list[Any]] | None]:
        """Per graph input: (dtype, fixed dims (None = any), shape as displayed), None for non-tensors."""
        specs: dict[str, Any] = {}
        for name in index.graph_inputs:
            t = index.value_info[name].type
            if t.WhichOneof("value") != "tensor_type":
                specs[name] = None
                continue
            expected = _np_dtype(t.tensor_type.elem_type)
            dims: tuple[int | None, ...] | None = None
            shown: list[Any] = []
            if t.tensor_type.HasField("shape"):
                ds = t.tensor_type.shape.dim
                dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in ds)
                shown = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in ds]
            specs[name] = (expected, dims, shown)
        return specs

    def _check_feeds(self, feeds: Any) -> dict[str, Any]:
        index = self._require_index()
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")
        specs = self._feed_specs
        if len(feeds) < len(self._required) or any(k not in specs for k in feeds):
            unknown = [k for k in feeds if k not in specs]
            if unknown:
                raise InputError(f"unknown input name(s) {unknown}; the model's inputs are {index.required_inputs}")
        missing = [n for n in self._required if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model's inputs are {index.required_inputs}")
        out: dict[str, Any] = {}
        for name, value in feeds.items():
            spec = specs[name]
            if spec is None:
                out[name] = value  # sequences, maps, optionals: passed through as onnxruntime does
                continue
            arr = value if type(value) is np.ndarray else np.asarray(value)
            expected, dims, shown = spec
            if expected is not None and arr.dtype != expected and not (
                expected.kind in "OSU" and arr.dtype.kind in "OSU"
            ):
                raise InputError(f"input {name!r}: expected dtype {expected}, got {arr.dtype}")
            if dims is not None:
                shape = arr.shape
                if len(dims) != len(shape):
                    raise InputError(f"input {name!r}: expected shape {shown} (rank {len(dims)}), "
                                     f"got {list(shape)} (rank {arr.ndim})")
                for axis, (d, n) in enumerate(zip(dims, shape)):
                    if d is not None and d != n:
                        raise InputError(f"input {name!r}: expected shape {shown}, got {list(shape)} "
                                         f"(axis {axis}: {d} != {n})")
            out[name] = arr
        return out

    def _emit(self, event: Event, **fields: Any) -> None:
        listeners = self._dispatch.listeners[event]
        if listeners:
            info = EventInfo(event, time.perf_counter(), **fields)
            for fn in listeners:
                fn(info)

    async def _execute(self, feeds: dict[str, Any], wanted: Sequence[str], priority: int,
                       zero_copy: bool) -> Any:
        rid = next(self._ids)
        stats = self._stats
        stats["started"] += 1
        self._in_flight += 1
        if self._in_flight > self._peak_in_flight:
            self._peak_in_flight = self._in_flight
        if self._dispatch.listeners[Event.REQUEST_START]:
            self._emit(Event.REQUEST_START, request_id=rid, priority=Priority(priority))
        error: BaseException | None = None
        sch = self._scheduler
        assert sch is not None
        try:
            req = sch.new_request(rid, priority, sch.program(wanted, tuple(feeds)), feeds, copy_out=not zero_copy)
            await sch.execute(req)
            result = self._deliver(sch, sch.take_outputs(req), zero_copy)
            stats["completed"] += 1
            return result
        except anyio.get_cancelled_exc_class() as exc:
            stats["cancelled"] += 1
            error = exc
            raise
        except BaseException as exc:
            stats["failed"] += 1
            error = exc
            raise
        finally:
            self._in_flight -= 1
            if self._dispatch.listeners[Event.REQUEST_END]:
                self._emit(Event.REQUEST_END, request_id=rid, priority=Priority(priority), error=error)

    def _deliver(self, sch: Scheduler, pairs: list[tuple[str, Any]], zero_copy: bool) -> Any:
        """Hand the wanted values over: one copy out of the pool each, or zero-copy views."""
        missing = [n for n, obj in pairs if obj is _MISSING and n not in self._constants]
        if missing:
            for _, obj in pairs:
                if type(obj) is TensorBuffer:
                    obj.release()
            raise InputError(f"output {missing[0]!r} is an optional input that was not fed")
        out: dict[str, Any] = {}
        if zero_copy:
            bufs: list[TensorBuffer] = []
            for name, obj in pairs:
                if type(obj) is TensorBuffer:
                    view = obj.array().view()
                    view.flags.writeable = False
                    out[name] = view
                    bufs.append(obj)
                else:
                    out[name] = self._constants[name] if obj is _MISSING else obj
            return Outputs(out, bufs)
        copied = 0
        for name, obj in pairs:
            if type(obj) is TensorBuffer:
                arr = obj.array().copy()  # the one documented copy; the buffer goes back to the pool
                obj.release()
                copied += arr.nbytes
                out[name] = arr
            else:
                out[name] = self._constants[name] if obj is _MISSING else obj
        if copied:
            with sch._lock:
                sch.bytes_to_caller += copied
        return out

    async def profile(self, feeds: Mapping[str, Any] | None = None, *, repeats: int = 3) -> CostTable:
        """Measure every unit on every capable device, then re-plan with the measurements.

        Units run one at a time in topological order on each device (with ``feeds`` or
        random inputs of the right types); the median of ``repeats`` runs goes into
        :attr:`costs` under the unit's key. Returns the cost table.
        """
        if not self._open:
            raise RuntimeStateError("Session.profile() needs an open session")
        index = self._require_index()
        plan = self.plan
        feeds = self._check_feeds(feeds) if feeds is not None else _random_feeds(index)
        await anyio.to_thread.run_sync(self._profile_units, index, plan, feeds, repeats)
        await self._stop_workers()
        await self._replan(use_costs=True)
        self._start_workers()
        return self.costs

    def _profile_units(self, index: GraphIndex, plan: Plan, feeds: dict[str, Any], repeats: int) -> None:
        from ._planning.partition import merge_stages  # local: profiling only

        by_name = {d.name: d for d in plan.devices}
        node_of_name = {n.name: n.index for n in index.nodes}
        drafts_nodes = [tuple(node_of_name[n] for n in u.nodes) for u in plan.units]
        for dev_name in by_name:
            dev = by_name[dev_name]
            if any(dev_name not in u.candidates for u in plan.units):
                continue
            from ._planning.partition import UnitDraft

            drafts = [UnitDraft(u.id, drafts_nodes[u.id], 1) for u in plan.units]
            # One stage per unit: give each unit a distinct pseudo-device so nothing merges.
            assignment = {u.id: f"u{u.id}" for u in plan.units}
            specs = merge_stages(index, drafts, assignment, [u.preds for u in plan.units],
                                 [u.succs for u in plan.units])
            values = dict(feeds)
            prev = pin_current_thread(dev.cpus)
            try:
                for spec in specs:
                    compiled = get_backend(dev.backend).compile(extract_stage(index, spec), dev, name=spec.name)
                    try:
                        stage_feeds = {n: values[n] for n in spec.inputs if n in values}
                        times = []
                        out: list[Any] = []
                        for _ in range(max(1, repeats)):
                            t0 = time.perf_counter()
                            out = compiled.run(stage_feeds)
                            times.append(time.perf_counter() - t0)
                        for name, v in zip(compiled.output_names, out):
                            values[name] = v
                        times.sort()
                        uid = spec.units[0]
                        self.costs.update(unit_key(index, drafts_nodes[uid]), dev_name, times[len(times) // 2])
                    finally:
                        compiled.close()
            except BackendError:
                continue
            finally:
                if prev is not None:
                    os.sched_setaffinity(0, prev)


def _random_feeds(index: GraphIndex) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name in index.required_inputs:
        t = index.value_info[name].type
        if t.WhichOneof("value") != "tensor_type":
            raise InputError(f"input {name!r} is not a tensor: pass feeds to profile()")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in t.tensor_type.shape.dim]
        dt = _np_dtype(t.tensor_type.elem_type) or np.dtype(np.float32)
        if dt.kind == "f":
            out[name] = rng.standard_normal(dims).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, dims).astype(dt)
        else:
            out[name] = rng.integers(0, 4, dims).astype(dt)
    return out


class SyncSession:
    """A blocking facade over :class:`Session` for non-async applications.

    ::

        with hetsched.SyncSession("model.onnx", devices=["cpu:0", "cpu:1"]) as s:
            outputs = s.run({"x": x})

    An event loop runs in a helper thread owned by the ``with`` block.
    """

    def __init__(self, model: ModelSource, *, backend: str = "asyncio", **kwargs: Any):
        self._session = Session(model, **kwargs)
        self._backend = backend
        self._portal_cm: Any = None
        self._portal: Any = None
        self._ctx: Any = None

    def __enter__(self) -> SyncSession:
        self._portal_cm = anyio.from_thread.start_blocking_portal(self._backend)
        self._portal = self._portal_cm.__enter__()
        try:
            self._ctx = self._portal.wrap_async_context_manager(self._session)
            self._ctx.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._ctx.__exit__(*exc)
        finally:
            self._portal = None  # later calls raise RuntimeStateError, not the portal's RuntimeError
            self._portal_cm.__exit__(None, None, None)

    @property
    def plan(self) -> Plan:
        return self._session.plan

    @property
    def session(self) -> Session:
        return self._session

    def _require_portal(self) -> Any:
        if self._portal is None:
            raise RuntimeStateError("SyncSession is not open: use 'with SyncSession(...)'")
        return self._portal

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`Session.run`, blocking (``priority=`` and ``zero_copy=`` as there)."""
        return self._require_portal().call(lambda: self._session.run(*args, **kwargs))

    def profile(self, feeds: Mapping[str, Any] | None = None, *, repeats: int = 3) -> CostTable:
        """:meth:`Session.profile`, blocking.

        :raises RuntimeStateError: the SyncSession is not open.
        """
        return self._require_portal().call(lambda: self._session.profile(feeds, repeats=repeats))

    @contextlib.contextmanager
    def map(self, source: Iterable[Mapping[str, Any]], **kwargs: Any) -> Iterator[Iterator[Any]]:
        """:meth:`Session.map`, blocking (same keywords)::

            with s.map(frames) as results:
                for out in results:
                    use(out)

        ``source`` is iterated on the session's event-loop thread.

        :raises RuntimeStateError: the SyncSession is not open.
        """
        portal = self._require_portal()
        stream = self._session.map(source, **kwargs)

        def results() -> Iterator[Any]:
            while True:
                try:
                    yield portal.call(stream.__anext__)
                except StopAsyncIteration:
                    return

        with portal.wrap_async_context_manager(stream):
            yield results()

    def statistics(self) -> SessionStatistics:
        return self._session.statistics()
