"""Session setup: what ``Session.__aenter__`` and each re-plan build before requests can run.

Loading the model (and the graph outputs that are constants), the default memory topology,
compiling a plan's stages for their devices (concurrently, and finding by trying which units
a backend refuses: :func:`plan_and_compile`, firing the compile events), where each graph
output comes from, the session's compile counters, and the adapter from the transfer engine's
callbacks to the session's hooks.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from onnx import numpy_helper

from hetsched.backends import CompiledStage, Device, get_backend

from .._compat import add_note
from .._errors import CompileError, RuntimeStateError, TransferError
from .._events import CompileInfo, Event, EventInfo, HookDispatcher, Priority
from .._planning.costs import analytic_node_costs, device_seconds
from .._planning.fold import fold_shape_arithmetic, shape_boundaries
from .._planning.graph import GraphIndex
from .._planning.model import ModelSource, load_model, with_input_shapes
from .._planning.partition import StageSpec, UnitDraft, extract_stage, merge_stages
from .._planning.plan import Plan, unit_key
from .._runtime._clock import Clock
from .._runtime._domains import MemoryDomain, MemoryKind, Topology
from .._runtime._scheduler import StageRuntime
from .._runtime._transfer import TransferInfo

__all__ = [
    "CompileEvents",
    "CompileStatistics",
    "TransferEvents",
    "compile_counters",
    "compile_stages",
    "load_index",
    "make_topology",
    "output_sources",
    "plan_and_compile",
    "shape_refusals",
]

Refusals = MutableMapping[tuple[str, str], str]
"""``{(unit_key, device name): the backend's message}``: what :func:`plan_and_compile` found."""

_T = TypeVar("_T")


def load_index(source: ModelSource, shapes: Mapping[str, Sequence[int]] | None = None,
               ) -> tuple[GraphIndex, dict[str, Any]]:
    """The model's graph index and its graph outputs that are initializers (as arrays).

    Blocking (reads and checks the model). A str that is no file may name an embedded model
    (see :func:`hetsched.load_model`). ``shapes`` fixes free input dimensions before planning
    (see :func:`hetsched._planning.model.with_input_shapes`); then the shape arithmetic that is
    constant at those shapes is folded (:func:`hetsched._planning.fold.fold_shape_arithmetic`).

    :raises ModelError: the model could not be loaded.
    :raises InputError: ``shapes`` names no input or contradicts the model.
    """
    model = load_model(source)
    if shapes:
        model = with_input_shapes(model, shapes)
    model, _ = fold_shape_arithmetic(model)  # shape arithmetic never crosses a stage boundary
    index = GraphIndex(model)
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer
                 if init.name in index.graph_outputs}
    return index, constants


def make_topology(topology: Topology | None, devices: Sequence[Device]) -> tuple[Topology, str]:
    """The topology to use and the name of its host domain (feeds and outputs live there).

    Default (``topology`` None): the host and every device's ``memory_domain`` share memory.

    :raises TransferError: a device's memory domain is not in ``topology``, or it has no host domain.
    """
    if topology is None:
        names = list(dict.fromkeys(["host", *(d.memory_domain for d in devices)]))
        doms = [MemoryDomain("host", MemoryKind.HOST)] + [MemoryDomain(n, MemoryKind.DEVICE) for n in names[1:]]
        return Topology(doms, shared=[names]), "host"
    known = {d.name for d in topology.domains}
    for dev in devices:
        if dev.memory_domain not in known:
            raise TransferError(f"device {dev.name!r} writes memory domain {dev.memory_domain!r}, which the "
                                f"topology lacks (it has {sorted(known)})")
    if "host" in known:
        return topology, "host"
    host = next((d.name for d in topology.domains if d.kind is MemoryKind.HOST), None)
    if host is None:
        raise TransferError(f"the topology has no host memory domain for feeds and outputs: {topology!r}")
    return topology, host


def _parallel(fn: Callable[[Any], _T], items: Sequence[Any]) -> list[_T | BaseException]:
    """``fn`` over ``items`` on up to one thread per usable core (conversions are slow and
    release the GIL in their native code or worker processes); each result or the exception
    it raised, in order, so no error is lost."""

    def guarded(item: Any) -> _T | BaseException:
        try:
            return fn(item)
        except Exception as exc:  # collected and re-raised by the caller
            return exc

    if len(items) <= 1:
        return [guarded(x) for x in items]
    workers = min(len(items), len(os.sched_getaffinity(0)) or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hetsched-compile") as pool:
        return list(pool.map(guarded, items))


def _with_shapes(dev: Device, shapes: Mapping[str, Sequence[int]] | None, calibration: object = None) -> Device:
    """The device a backend compiles for: ``shapes`` (fixed free dimensions, for backends that
    need static shapes) in a copy of its options under ``"shapes"``, and ``calibration`` (a
    ``hetsched._rknn.calibrate.CalibrationSet``: backends that quantize read it) under ``"calibration"``."""
    extra: dict[str, Any] = {}
    if shapes:
        extra["shapes"] = {k: tuple(v) for k, v in shapes.items()}
    if calibration is not None:
        extra["calibration"] = calibration
    return dataclasses.replace(dev, options={**dev.options, **extra}) if extra else dev


def _compile_one(index: GraphIndex, dev: Device, spec: StageSpec) -> CompiledStage:
    return get_backend(dev.backend).compile(extract_stage(index, spec), dev, name=spec.name)


class CompileEvents:
    """Fires ``BEFORE_COMPILE``/``AFTER_COMPILE`` around each compile, in the compile's thread;
    with nobody listening a compile is called bare (one falsy check)."""

    def __init__(self, dispatch: HookDispatcher, clock: Clock, *, cancel: threading.Event | None = None):
        self._before = dispatch.listeners[Event.BEFORE_COMPILE]
        self._after = dispatch.listeners[Event.AFTER_COMPILE]
        self._clock = clock
        self.cancel = cancel
        """Set: the session is closing, so no further compile starts (one under way finishes)."""

    def check_cancelled(self) -> None:
        """Refuse to start a compile once the session started closing.

        :raises RuntimeStateError: it did (the plan being made is abandoned; its stages are closed).
        """
        if self.cancel is not None and self.cancel.is_set():
            raise RuntimeStateError("the session is closing: the plan being compiled is abandoned")

    def around(self, compile_fn: Callable[[], CompiledStage], info: CompileInfo) -> CompiledStage:
        """``compile_fn()`` between the two events; ``AFTER_COMPILE`` carries its error, if any.

        :raises Exception: what ``compile_fn`` or a hook raised (a stage compiled before an
            ``AFTER_COMPILE`` hook failed is closed first, so it does not leak).
        """
        if not self._before and not self._after:
            return compile_fn()
        now = self._clock.perf_counter
        for fn in self._before:
            fn(EventInfo(Event.BEFORE_COMPILE, now(), stage=info.stage, device=info.device, extra=info))
        t0 = now()
        try:
            compiled = compile_fn()
        except Exception as exc:
            self._fire_after(info, now() - t0, None, exc)
            raise
        try:
            self._fire_after(info, now() - t0, _cached(compiled) if self._after else None, None)
        except BaseException:
            compiled.close()
            raise
        return compiled

    def _fire_after(self, info: CompileInfo, seconds: float, cached: bool | None,
                    error: BaseException | None) -> None:
        if not self._after:
            return
        done = dataclasses.replace(info, seconds=seconds, cached=cached)
        event = EventInfo(Event.AFTER_COMPILE, self._clock.perf_counter(), stage=info.stage, device=info.device,
                          elapsed_s=seconds, error=error, extra=done)
        for fn in self._after:
            fn(event)


def _cached(compiled: CompiledStage) -> bool | None:
    """Whether the compiled stage came out of its backend's compile cache (``hooks.compile_cache``:
    a twin stage declares the accelerator stage it wraps), None where it declares none."""
    cache = compiled.hooks.compile_cache
    return bool(cache.statistics().cached) if cache is not None else None


def _compile_batch(index: GraphIndex, jobs: Sequence[tuple[StageSpec, Device]], events: CompileEvents | None,
                   *, trial: bool = False) -> list[CompiledStage | BaseException]:
    """Each job's stage compiled for its device, concurrently (see :func:`_parallel`), each
    between its compile events when ``events`` is given. A trial (one unit alone, to find what a
    device refuses) is compiled with ``Device.options["trial"] = True``: it is closed right after,
    so a backend should not start what only serving needs (more contexts, warm-up)."""
    total = len(jobs)

    def one(k: int) -> CompiledStage:
        if events is not None:
            events.check_cancelled()
        spec, dev = jobs[k]
        if trial:
            dev = dataclasses.replace(dev, options={**dev.options, "trial": True})
        if events is None:
            return _compile_one(index, dev, spec)
        return events.around(lambda: _compile_one(index, dev, spec),
                             CompileInfo(spec.name, dev.name, k, total, trial=trial))

    return _parallel(one, range(total))


def _raise_collected(errors: Sequence[BaseException]) -> None:
    """Raise the first error; the others go into its notes (none is lost)."""
    first = errors[0]
    for other in errors[1:]:
        add_note(first, f"also: {type(other).__name__}: {other}")
    raise first


def compile_stages(index: GraphIndex, plan: Plan, *, shapes: Mapping[str, Sequence[int]] | None = None,
                   calibration: object = None, events: CompileEvents | None = None) -> list[StageRuntime]:
    """Compile every stage of ``plan`` for its device, concurrently (blocking; on failure the
    stages that compiled are closed), firing ``events`` around each compile.

    :raises CompileError: a backend refused a stage (other failures in the notes).
    :raises BackendError: a backend could not compile at all (e.g. its toolkit is missing).
    """
    stages, failures = _try_compile(index, plan, shapes, calibration, events)
    if failures:
        for st in stages:
            st.compiled.close()
        _raise_collected([exc for _, exc in failures])
    return stages


def _try_compile(index: GraphIndex, plan: Plan, shapes: Mapping[str, Sequence[int]] | None,
                 calibration: object = None, events: CompileEvents | None = None,
                 ) -> tuple[list[StageRuntime], list[tuple[StageSpec, BaseException]]]:
    """The stages that compiled and the (stage, error) of those that did not."""
    by_name = {d.name: _with_shapes(d, shapes, calibration) for d in plan.devices}
    node_costs = analytic_node_costs(index)
    results = _compile_batch(index, [(spec, by_name[spec.device]) for spec in plan.stages], events)
    out: list[StageRuntime] = []
    failures: list[tuple[StageSpec, BaseException]] = []
    for spec, res in zip(plan.stages, results, strict=True):
        if isinstance(res, BaseException):
            failures.append((spec, res))
            continue
        dev = by_name[spec.device]
        flops = sum(node_costs[n].flops for n in spec.nodes)
        nbytes = sum(node_costs[n].bytes for n in spec.nodes)
        est = device_seconds(dev, flops, nbytes)  # the planner's one time model (issue 24)
        # StageRuntime takes the backend's own words on an unbound stage (hooks.unbound_reason)
        out.append(StageRuntime(spec, res, unit_key(index, spec.nodes), est, dev.memory_domain))
    return out, failures


def plan_and_compile(index: GraphIndex, build: Callable[[Mapping[tuple[str, str], str]], Plan],
                     refusals: Refusals, *, shapes: Mapping[str, Sequence[int]] | None = None,
                     calibration: object = None, events: CompileEvents | None = None,
                     ) -> tuple[Plan, list[StageRuntime]]:
    """Plan with ``build(refusals)`` and compile; where a stage raises :class:`CompileError`,
    find the units its device refuses, add them to ``refusals`` and plan again (blocking).
    ``events`` fire around every compile, the unit trials marked ``trial``.

    The failing units are found by compiling each unit of the stage alone on that device;
    the pairs that compile are not refused. If every unit compiles alone (the stage fails
    only as a whole), all of the stage's units are refused on that device, so each round
    refuses at least one new pair and the loop ends: with every stage compiled, or with
    ``build`` raising :class:`PartitionError` for a unit no device is left for.

    :raises PartitionError: a unit every capable device refused (from ``build``).
    :raises BackendError: a failure other than a refused stage (the first; others in its notes).
    """
    while True:
        plan = build(refusals)
        crossing = {k: v for k, v in shape_refusals(index, plan).items() if k not in refusals}
        if crossing:  # no accelerator stage hands on shape arithmetic: its unit goes elsewhere
            refusals.update(crossing)
            continue
        stages, failures = _try_compile(index, plan, shapes, calibration, events)
        if not failures:
            return _with_accuracy(plan, stages), stages
        for st in stages:
            st.compiled.close()
        fatal = [exc for _, exc in failures if not isinstance(exc, CompileError)]
        if fatal:
            _raise_collected(fatal)
        refusals.update(_find_refusals(index, plan, [(s, str(e)) for s, e in failures], shapes, calibration,
                                       events))


def shape_refusals(index: GraphIndex, plan: Plan) -> dict[tuple[str, str], str]:
    """The (unit key, device) pairs of accelerator stages (device kind other than ``"cpu"``)
    whose outputs include shape arithmetic (:func:`hetsched._planning.fold.shape_boundaries`: a
    0-d tensor, an integer tensor computed from a shape) for another stage: the unit producing
    it is refused there. On an index folded at fixed shapes there is none; the check keeps the
    invariant where folding could not (a free dim, an op onnx's reference lacks).
    """
    kinds = {d.name: d.kind for d in plan.devices}
    accel = [s for s in plan.stages if kinds.get(s.device, "cpu") != "cpu"]
    found: dict[tuple[str, str], str] = {}
    if not accel:
        return found
    for b in shape_boundaries(index, accel, plan.graph_outputs):
        spec = next(s for s in accel if s.name == b.stage)
        nid = index.producer[b.value]
        for u in spec.units:
            if nid in plan.unit_nodes[u]:
                found[(unit_key(index, plan.unit_nodes[u]), spec.device)] = (
                    f"its output {b.value!r} is {b.reason}, which a stage on {spec.device} must not hand on")
    return found


def _find_refusals(index: GraphIndex, plan: Plan, failed: Sequence[tuple[StageSpec, str]],
                   shapes: Mapping[str, Sequence[int]] | None, calibration: object = None,
                   events: CompileEvents | None = None) -> dict[tuple[str, str], str]:
    """The (unit key, device) pairs of the failed stages' units that do not compile alone."""
    drafts = [UnitDraft(u.id, plan.unit_nodes[u.id], 1) for u in plan.units]
    assignment = dict(plan.placement.assignment)
    for spec, _ in failed:
        for u in spec.units:
            assignment[u] = f"\0unit{u}"  # a pseudo-device per unit: nothing merges with it
    singles = {s.units[0]: s for s in merge_stages(index, drafts, assignment, [u.preds for u in plan.units],
                                                   [u.succs for u in plan.units])
               if len(s.units) == 1 and s.device.startswith("\0unit")}
    by_name = {d.name: _with_shapes(d, shapes, calibration) for d in plan.devices}
    jobs = [(u, spec.device) for spec, _ in failed for u in spec.units if u in singles]
    results = _compile_batch(index, [(singles[u], by_name[dev]) for u, dev in jobs], events, trial=True)
    found: dict[tuple[str, str], str] = {}
    fatal: list[BaseException] = []
    for (u, dev), res in zip(jobs, results, strict=True):
        if isinstance(res, CompileError):
            found[(unit_key(index, plan.unit_nodes[u]), dev)] = str(res)
        elif isinstance(res, BaseException):
            fatal.append(res)
        else:
            res.close()
    if fatal:
        _raise_collected(fatal)
    for spec, message in failed:
        keys = [unit_key(index, plan.unit_nodes[u]) for u in spec.units]
        if not any((k, spec.device) in found for k in keys):
            # every unit compiles alone: the stage fails as a whole, so none of it stays there
            for k in keys:
                found[(k, spec.device)] = f"in {spec.name} with units {list(spec.units)}: {message}"
    return found


@dataclasses.dataclass(frozen=True)
class CompileStatistics:
    """Compile counters summed over a session's backends that report them in their
    ``statistics()`` (fields ``conversions``, ``cache_hits``, ``seconds``; 0 for the others),
    counted from the session's opening, plus the pairs refused by trying."""

    conversions: int = 0
    """Stages a backend converted (e.g. by a vendor toolkit), not found in its cache."""
    cache_hits: int = 0
    """Stages a backend found already converted in its cache."""
    seconds: float = 0.0
    """Seconds the backends spent converting."""
    refused: int = 0
    """(unit, device) pairs a backend refused, found by trying (they persist for the session)."""


def compile_counters(devices: Iterable[Device], *, since: CompileStatistics | None = None,
                     refused: int = 0) -> CompileStatistics:
    """The sums of ``conversions``, ``cache_hits`` and ``seconds`` over the distinct backends of
    ``devices`` that count them (``hooks.compile_counters``), less those of ``since`` (backend counters are
    process-wide: a session reports the difference since it opened), with ``refused`` pairs."""
    conversions = hits = 0
    seconds = 0.0
    for name in dict.fromkeys(d.backend for d in devices):
        counting = get_backend(name).hooks.compile_counters
        if counting is None:
            continue
        st = counting.statistics()
        conversions += int(st.conversions)
        hits += int(st.cache_hits)
        seconds += float(st.seconds)
    base = since or CompileStatistics()
    return CompileStatistics(conversions - base.conversions, hits - base.cache_hits, seconds - base.seconds,
                             refused)


def output_sources(plan: Plan) -> dict[str, int | None]:
    """For each graph output, the id of the stage producing it (None: a graph input or an
    initializer passed through)."""
    src: dict[str, int | None] = {}
    for s in plan.stages:
        for o in s.outputs:
            src[o] = s.id
    for o in plan.graph_outputs:
        src.setdefault(o, None)
    return src


class TransferEvents:
    """Adapts the engine's transfer callbacks to session hooks; an event nobody listens to
    is None here, so the engine skips it for free."""

    def __init__(self, dispatch: HookDispatcher, clock: Clock):
        self.before_transfer = self._forward(Event.BEFORE_TRANSFER, dispatch, clock)
        self.after_transfer = self._forward(Event.AFTER_TRANSFER, dispatch, clock)
        self.preempted = self._forward(Event.PREEMPTED, dispatch, clock)
        self.resumed = self._forward(Event.RESUMED, dispatch, clock)

    @staticmethod
    def _forward(event: Event, dispatch: HookDispatcher, clock: Clock) -> Callable[[TransferInfo], None] | None:
        fns = dispatch.listeners[event]
        if not fns:
            return None

        def forward(t: TransferInfo) -> None:
            # labels are "<stage>:<value>-><domain>#<request id>" (see Scheduler._transfer)
            head, _, rid = t.label.rpartition("#")
            stage = head.split(":", 1)[0] if head else None
            info = EventInfo(event, clock.perf_counter(), int(rid) if rid.isdigit() else None,
                             Priority(t.priority) if 0 <= t.priority <= 3 else None, stage, None,
                             nbytes=t.nbytes, extra=t)
            for fn in fns:
                fn(info)

        return forward


def _with_accuracy(plan: Plan, stages: Sequence[StageRuntime]) -> Plan:
    """``plan`` carrying the accuracy each compiled stage measured (``hooks.accuracy``: NPU
    stages; a twin stage declares the accelerator stage it wraps), so ``plan.to_json()`` reports it."""
    measured: dict[str, Mapping[str, float | int]] = {}
    for st in stages:
        probed = st.hooks.accuracy
        acc = probed.statistics().accuracy if probed is not None else None
        if acc is not None:
            measured[st.spec.name] = dict(acc.to_json())
    return dataclasses.replace(plan, stage_accuracy=measured) if measured else plan
