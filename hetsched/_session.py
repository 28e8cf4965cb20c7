"""``Session``: plan a model across devices, compile its stages, serve requests."""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np
import onnx
from onnx import numpy_helper

from hetsched.backends import CompiledStage, Device, get_backend
from hetsched.backends.cpu import pin_current_thread
from hetsched.policies import DeviceState, PlacementPolicy

from ._costs import STAGE_OVERHEAD_S, CostTable, analytic_node_costs
from ._devices import resolve_devices
from ._errors import BackendError, InputError, RuntimeStateError, StageExecutionError
from ._events import Event, EventInfo, HookDispatcher, Priority
from ._graph import GraphIndex
from ._model import ModelSource, load_model
from ._partition import StageSpec, extract_stage
from ._plan import Plan, build_plan, unit_key

__all__ = ["Session", "SessionStatistics", "SyncSession"]



def _np_dtype(elem_type: int) -> np.dtype[Any] | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class SessionStatistics:
    requests_started: int
    requests_completed: int
    requests_failed: int
    requests_cancelled: int
    in_flight: int
    stage_runs: int
    stages: int
    devices: int


class _Job:
    __slots__ = ("stage", "feeds", "done", "cancelled", "request_id", "priority")

    def __init__(self, stage: _CompiledStage, feeds: dict[str, Any], done: Callable[[Any, BaseException | None], None],
                 request_id: int, priority: int):
        self.stage = stage
        self.feeds = feeds
        self.done = done
        self.cancelled = False
        self.request_id = request_id
        self.priority = priority


class _CompiledStage:
    __slots__ = ("spec", "compiled", "key", "analytic_s", "input_names", "output_names")

    def __init__(self, spec: StageSpec, compiled: CompiledStage, key: str, analytic_s: float):
        self.spec = spec
        self.compiled = compiled
        self.key = key
        self.analytic_s = analytic_s
        self.input_names = frozenset(compiled.input_names)
        self.output_names = tuple(compiled.output_names)


class _DeviceWorker:
    """A dedicated, core-pinned thread running one device's stages, most urgent first."""

    def __init__(self, device: Device, session: Session):
        self.device = device
        self._session = session
        self._heap: list[tuple[int, int, _Job]] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._stopping = False
        self._token = anyio.lowlevel.current_token()
        self._thread = threading.Thread(target=self._main, name=f"hetsched-{device.name}", daemon=True)
        self.runs = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: _Job) -> None:
        with self._cv:
            heapq.heappush(self._heap, (job.priority, next(self._seq), job))
            self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def join(self) -> None:
        self._thread.join()

    def _main(self) -> None:
        pin_current_thread(self.device.cpus)
        session = self._session
        listeners = session._dispatch.listeners
        before = listeners[Event.BEFORE_STAGE]
        after = listeners[Event.AFTER_STAGE]
        costs = session.costs
        learn = session._learn_costs
        while True:
            with self._cv:
                while not self._heap and not self._stopping:
                    self._cv.wait()
                if not self._heap:
                    return
                _, _, job = heapq.heappop(self._heap)
            if job.cancelled:
                continue
            stage = job.stage
            if before:
                session._emit_sync(before, EventInfo(Event.BEFORE_STAGE, time.perf_counter(), job.request_id,
                                                     Priority(job.priority), stage.spec.name, self.device.name))
            t0 = time.perf_counter()
            err: BaseException | None = None
            result: Any = None
            try:
                result = stage.compiled.run(job.feeds)
            except StageExecutionError as exc:
                err = exc
            except Exception as exc:  # a backend that did not translate its error
                err = StageExecutionError(
                    f"stage {stage.spec.name!r} failed on device {self.device.name!r}: {exc}",
                    stage=stage.spec.name, device=self.device.name,
                )
                err.__cause__ = exc
            elapsed = time.perf_counter() - t0
            self.runs += 1
            if err is None and learn:
                costs.update(stage.key, self.device.name, elapsed, analytic_s=stage.analytic_s)
            if after:
                session._emit_sync(after, EventInfo(Event.AFTER_STAGE, time.perf_counter(), job.request_id,
                                                    Priority(job.priority), stage.spec.name, self.device.name,
                                                    elapsed_s=elapsed, error=err))
            try:
                anyio.from_thread.run_sync(job.done, result, err, token=self._token)
            except RuntimeError:
                # The event loop is gone (interpreter shutdown); nothing is waiting.
                return


def _is_ort_form(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    if len(args) == 2:
        return True
    if "input_feed" in kwargs:
        return True
    return False


class Session:
    """Run an ONNX model across devices.

    ::

        async with hetsched.Session("model.onnx", devices=["cpu:0", "cpu:1"], policy="heft") as s:
            outputs = await s.run({"x": x})            # {name: array}
            y, = await s.run(None, {"x": x})           # onnxruntime's form: list in output order
            print(s.plan.table())

    Everything the session starts (device threads, tasks) is stopped and joined when
    the ``async with`` block exits, also on error or cancellation.

    :param model: a path, bytes or ``onnx.ModelProto``.
    :param devices: device specs or :class:`Device` objects (default: the host's CPU clusters).
    :param policy: a policy object, function or name (default ``PowerThermalWeighted()``).
    :param max_unit_nodes: cut unit subgraphs to at most this many nodes (1 = one node each).
    :param root: the filesystem root for hardware discovery (a twin's root in tests).
    :param hooks: objects with :class:`Hooks` methods.
    :param device_states: utilisation / headroom per device fed to the policy.
    :param costs: a :class:`CostTable` of measured costs (one is created otherwise).
    :param max_in_flight: requests admitted at once; more wait (backpressure).
    :raises ModelError: the model could not be loaded (on ``__aenter__``).
    :raises PartitionError, PlacementError, DeviceSpecError, CompileError: planning failed.
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
        device_states: Mapping[str, DeviceState] | None = None,
        costs: CostTable | None = None,
        max_in_flight: int = 64,
        learn_costs: bool = True,
    ):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._source = model
        self._device_specs = devices
        self._policy = policy
        self._max_unit_nodes = max_unit_nodes
        self._root = root
        self._dispatch = HookDispatcher(hooks)
        self._device_states = dict(device_states or {})
        self.costs = costs if costs is not None else CostTable()
        self._learn_costs = learn_costs
        self._max_in_flight = max_in_flight
        self._plan: Plan | None = None
        self._index: GraphIndex | None = None
        self._stages: list[_CompiledStage] = []
        self._workers: dict[str, _DeviceWorker] = {}
        self._open = False
        self._limiter: anyio.Semaphore | None = None
        self._ids = itertools.count(1)
        self._stats = {"started": 0, "completed": 0, "failed": 0, "cancelled": 0}
        self._in_flight = 0
        self._constants: dict[str, Any] = {}

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        if self._open:
            raise RuntimeStateError("Session is already open")
        self._index = await anyio.to_thread.run_sync(self._load)
        self._devices = resolve_devices(self._device_specs, root=self._root)
        await self._replan()
        self._limiter = anyio.Semaphore(self._max_in_flight)
        self._start_workers()
        self._open = True
        self._emit(Event.SESSION_START)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        with anyio.CancelScope(shield=True):
            self._open = False
            await self._stop_workers()
            self._close_stages()
            self._emit(Event.SESSION_END, error=exc)

    def _load(self) -> GraphIndex:
        model = load_model(self._source)
        index = GraphIndex(model)
        for init in model.graph.initializer:
            if init.name in index.graph_outputs:
                self._constants[init.name] = numpy_helper.to_array(init)
        return index

    def _start_workers(self) -> None:
        assert self._plan is not None
        for dev in self._devices:
            w = _DeviceWorker(dev, self)
            w.start()
            self._workers[dev.name] = w

    async def _stop_workers(self) -> None:
        workers = list(self._workers.values())
        for w in workers:
            w.stop()
        for w in workers:
            await anyio.to_thread.run_sync(w.join)
        self._workers.clear()

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

    def _compile(self, index: GraphIndex, plan: Plan) -> list[_CompiledStage]:
        by_name = {d.name: d for d in plan.devices}
        node_costs = analytic_node_costs(index)
        out: list[_CompiledStage] = []
        try:
            for spec in plan.stages:
                dev = by_name[spec.device]
                model = extract_stage(index, spec)
                compiled = get_backend(dev.backend).compile(model, dev, name=spec.name)
                flops = sum(node_costs[n].flops for n in spec.nodes)
                nbytes = sum(node_costs[n].bytes for n in spec.nodes)
                est = max(flops / dev.peak_flops, nbytes / dev.mem_bandwidth) + STAGE_OVERHEAD_S
                out.append(_CompiledStage(spec, compiled, unit_key(index, spec.nodes), est))
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
        return SessionStatistics(
            requests_started=self._stats["started"],
            requests_completed=self._stats["completed"],
            requests_failed=self._stats["failed"],
            requests_cancelled=self._stats["cancelled"],
            in_flight=self._in_flight,
            stage_runs=sum(w.runs for w in self._workers.values()),
            stages=len(self._stages),
            devices=len(self._workers),
        )

    async def run(self, *args: Any, priority: Priority | int = Priority.NORMAL, **kwargs: Any) -> Any:
        """Run one request.

        ``await s.run(feeds)`` returns ``{output name: array}``;
        ``await s.run(output_names, input_feed)`` (onnxruntime's form; ``None`` = all
        outputs) returns a list in ``output_names`` order.

        :raises InputError: unknown or missing input, wrong dtype or shape (names the input).
        :raises StageExecutionError: a stage failed (names stage and device); other
            requests are unaffected.
        :raises RuntimeStateError: the session is not open.
        """
        if _is_ort_form(args, kwargs):
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
        index = self._require_index()
        feeds = self._check_feeds(feeds)
        wanted = list(index.graph_outputs) if output_names is None else list(output_names)
        for name in wanted:
            if name not in self._output_source:
                raise InputError(f"unknown output name {name!r}; the model's outputs are {index.graph_outputs}")
        prio = int(Priority(priority))
        async with self._limiter:
            result = await self._execute(feeds, wanted, prio)
        if ort_form:
            return [result[n] for n in wanted]
        return result

    def _check_feeds(self, feeds: Any) -> dict[str, Any]:
        index = self._require_index()
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")
        known = set(index.graph_inputs)
        unknown = [k for k in feeds if k not in known]
        if unknown:
            raise InputError(f"unknown input name(s) {unknown}; the model's inputs are {index.required_inputs}")
        missing = [n for n in index.required_inputs if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model's inputs are {index.required_inputs}")
        out: dict[str, Any] = {}
        for name, value in feeds.items():
            t = index.value_info[name].type
            if t.WhichOneof("value") != "tensor_type":
                out[name] = value  # sequences, maps, optionals: passed through as onnxruntime does
                continue
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            expected = _np_dtype(t.tensor_type.elem_type)
            if expected is not None and arr.dtype != expected and not (
                expected.kind in "OSU" and arr.dtype.kind in "OSU"
            ):
                raise InputError(f"input {name!r}: expected dtype {expected}, got {arr.dtype}")
            if t.tensor_type.HasField("shape"):
                dims = t.tensor_type.shape.dim
                if len(dims) != arr.ndim:
                    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
                    raise InputError(f"input {name!r}: expected shape {shape} (rank {len(dims)}), "
                                     f"got {list(arr.shape)} (rank {arr.ndim})")
                for axis, (d, n) in enumerate(zip(dims, arr.shape)):
                    if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != n:
                        shape = [x.dim_value if x.HasField("dim_value") else (x.dim_param or "?") for x in dims]
                        raise InputError(f"input {name!r}: expected shape {shape}, got {list(arr.shape)} "
                                         f"(axis {axis}: {d.dim_value} != {n})")
            out[name] = arr
        return out

    def _emit(self, event: Event, **fields: Any) -> None:
        listeners = self._dispatch.listeners[event]
        if listeners:
            info = EventInfo(event, time.perf_counter(), **fields)
            for fn in listeners:
                fn(info)

    def _emit_sync(self, listeners: tuple[Callable[[EventInfo], None], ...], info: EventInfo) -> None:
        for fn in listeners:
            fn(info)

    def _needed_stages(self, wanted: Sequence[str]) -> list[_CompiledStage]:
        needed: set[int] = set()
        stack = [self._output_source[n] for n in wanted if self._output_source.get(n) is not None]
        specs = self._stages
        while stack:
            sid = stack.pop()
            if sid is None or sid in needed:
                continue
            needed.add(sid)
            stack.extend(specs[sid].spec.deps)
        return [s for s in specs if s.spec.id in needed]

    async def _execute(self, feeds: dict[str, Any], wanted: list[str], priority: int) -> dict[str, Any]:
        rid = next(self._ids)
        self._stats["started"] += 1
        self._in_flight += 1
        self._emit(Event.REQUEST_START, request_id=rid, priority=Priority(priority))
        error: BaseException | None = None
        try:
            values = dict(feeds)
            stages = self._needed_stages(wanted)
            if stages:
                await self._run_stages(stages, values, rid, priority)
            result: dict[str, Any] = {}
            for n in wanted:
                if n in values:
                    result[n] = values[n]
                elif n in self._constants:
                    result[n] = self._constants[n]
                else:
                    raise InputError(f"output {n!r} is an optional input that was not fed")
            self._stats["completed"] += 1
            return result
        except anyio.get_cancelled_exc_class() as exc:
            self._stats["cancelled"] += 1
            error = exc
            raise
        except BaseException as exc:
            self._stats["failed"] += 1
            error = exc
            raise
        finally:
            self._in_flight -= 1
            self._emit(Event.REQUEST_END, request_id=rid, priority=Priority(priority), error=error)

    async def _run_stages(self, stages: list[_CompiledStage], values: dict[str, Any], rid: int,
                          priority: int) -> None:
        pending = {s.spec.id: s for s in stages}
        waiting_on = {s.spec.id: len(s.spec.deps) for s in stages}
        dependents: dict[int, list[int]] = {}
        for s in stages:
            for d in s.spec.deps:
                dependents.setdefault(d, []).append(s.spec.id)
        send, recv = anyio.create_memory_object_stream[tuple[int, Any, BaseException | None]](math.inf)
        jobs: list[_Job] = []

        def submit(st: _CompiledStage) -> None:
            sid = st.spec.id

            def done(result: Any, err: BaseException | None) -> None:
                try:
                    send.send_nowait((sid, result, err))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass  # the request was cancelled or failed meanwhile

            feeds = {n: values[n] for n in st.spec.inputs if n in values and n in st.input_names}
            job = _Job(st, feeds, done, rid, priority)
            jobs.append(job)
            self._workers[st.spec.device].submit(job)

        outstanding = 0
        try:
            with send, recv:
                for sid, st in pending.items():
                    if waiting_on[sid] == 0:
                        submit(st)
                        outstanding += 1
                while outstanding:
                    sid, result, err = await recv.receive()
                    outstanding -= 1
                    if err is not None:
                        raise err
                    st = pending[sid]
                    for name, value in zip(st.output_names, result):
                        values[name] = value
                    for dep in dependents.get(sid, ()):
                        if dep in waiting_on:
                            waiting_on[dep] -= 1
                            if waiting_on[dep] == 0:
                                submit(pending[dep])
                                outstanding += 1
        finally:
            for job in jobs:
                job.cancelled = True

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
        from ._partition import merge_stages  # local: profiling only

        by_name = {d.name: d for d in plan.devices}
        node_of_name = {n.name: n.index for n in index.nodes}
        drafts_nodes = [tuple(node_of_name[n] for n in u.nodes) for u in plan.units]
        for dev_name in by_name:
            dev = by_name[dev_name]
            if any(dev_name not in u.candidates for u in plan.units):
                continue
            from ._partition import UnitDraft

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
            self._portal_cm.__exit__(None, None, None)

    @property
    def plan(self) -> Plan:
        return self._session.plan

    @property
    def session(self) -> Session:
        return self._session

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            raise RuntimeStateError("SyncSession is not open: use 'with SyncSession(...)'")
        return self._portal.call(lambda: self._session.run(*args, **kwargs))

    def profile(self, feeds: Mapping[str, Any] | None = None, *, repeats: int = 3) -> CostTable:
        return self._portal.call(lambda: self._session.profile(feeds, repeats=repeats))

    def statistics(self) -> SessionStatistics:
        return self._session.statistics()
