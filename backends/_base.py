"""The backend seam: what a device can run, compiling a stage, running a stage.

A backend is three calls::

    caps = backend.capabilities(device)          # which ops this device can run
    compiled = backend.compile(stage_model, device, name=...)   # once per stage
    outputs = compiled.run(feeds)                # per request, in the device's worker thread

GPU/NPU backends (TensorRT, RKNN) and simulated ones implement the same three
calls; the core never imports an SDK itself.

Everything else is optional, and *declared*, never discovered: a compiled stage's
``hooks`` (a :class:`StageHooks`) and a backend's ``hooks`` (a :class:`BackendHooks`)
name the optional protocols it implements, each field ``None`` where it does not
(:data:`NO_STAGE_HOOKS`, :data:`NO_BACKEND_HOOKS`). The runtime and the session read
those fields; they never look a method up by name (``getattr``) or sniff a type.

A stage's optional protocols:

* :class:`BindableStage` (``hooks.in_place``): the stage runs *in place*: the runtime
  gives it output memory from its buffer pools and it reads inputs where they lie
  (onnxruntime IO binding for the CPU backend), so no tensor is copied between stages
  on one memory domain; ``hooks.unbound_reason`` says, in the backend's words, why a
  stage that could cannot (a data-dependent output shape);
* :class:`WorkerStateStage` (``hooks.worker_state``): the stage keeps state per worker
  thread (one RKNN context per NPU core, one TensorRT execution context per thread):
  the runtime creates it on each worker thread before that thread's first run of the
  stage and passes it to every run there as ``state=``; :class:`WorkerStateProbe`
  (``hooks.state_probe``) tells a dead state from a live one;
* :class:`ModelledStage` (``hooks.modelled``): the stage reports its own time and energy
  per run (a twin stage's modelled board seconds and joules) and in total;
* :class:`CachedCompileStage` (``hooks.compile_cache``): whether compiling it was a cache
  hit; :class:`ProbedStage` (``hooks.accuracy``): its accuracy against fp32 onnxruntime,
  measured at compile time; :class:`ReportingStage` (``hooks.statistics``): any
  ``statistics()`` dataclass, for ``Session.stage_statistics()``.

A backend's optional protocols:

* :class:`ThreadedBackend` (``hooks.workers``): how many stages a device runs at once and
  which cores each worker thread is pinned to (default: one worker on all of
  ``device.cpus``, i.e. one stage at a time);
* ``hooks.slow_compile``: compiling takes seconds (a vendor toolkit): a session compiles
  in the background when asked to;
* :class:`CountingBackend` (``hooks.compile_counters``): conversions, cache hits and
  seconds spent compiling, process-wide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

# numpy and onnx are for annotations only: importing the backends' protocols (the board tools,
# ``hetsched info``) must not import onnx (issue 22).
if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = [
    "NO_BACKEND_HOOKS",
    "NO_STAGE_HOOKS",
    "AccuracyReport",
    "Backend",
    "BackendHooks",
    "BindableStage",
    "CachedCompileStage",
    "Capabilities",
    "CompileCounters",
    "CompiledStage",
    "CountingBackend",
    "Device",
    "DeviceKind",
    "ModelledFigures",
    "ModelledStage",
    "OpRule",
    "ProbedStage",
    "ReportingStage",
    "StageHooks",
    "TensorSpec",
    "ThreadedBackend",
    "WorkerInfo",
    "WorkerStateProbe",
    "WorkerStateStage",
]

DeviceKind = Literal["cpu", "gpu", "npu", "dla"]


@dataclass(frozen=True)
class Device:
    """A place a stage can run: a set of CPU cores, a GPU, an NPU (real or simulated).

    ``peak_flops`` and ``mem_bandwidth`` feed the analytic cost estimate until
    measured costs replace it; ``domain`` is the clock domain the governor controls
    (``"cluster4"``, ``"gpu"``, ...), ``memory_domain`` the memory the device writes.
    """

    name: str
    kind: DeviceKind = "cpu"
    backend: str = "cpu"
    cpus: tuple[int, ...] = ()
    memory_domain: str = "host"
    domain: str | None = None
    capacity: float = 1024.0
    max_freq_khz: int | None = None
    peak_flops: float = 2.0e10
    mem_bandwidth: float = 1.0e10
    options: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class OpRule:
    """One capability rule: an op type (``None`` = any) in a domain, an opset range, input dtypes."""

    op_type: str | None
    domain: str = ""
    since: int = 1
    until: int | None = None
    dtypes: frozenset[int] | None = None
    """Allowed ``TensorProto`` element types of the node's inputs, or None for any."""


@dataclass(frozen=True)
class Capabilities:
    """What a device can run. ``allow`` rules are checked first, then ``deny`` removes."""

    allow: tuple[OpRule, ...]
    deny: tuple[OpRule, ...] = ()

    @classmethod
    def everything(cls) -> Capabilities:
        return cls(allow=(OpRule(None, domain="*"),))

    @classmethod
    def ops(cls, op_types: Iterable[str], *, domain: str = "", since: int = 1, until: int | None = None,
            dtypes: Iterable[int] | None = None) -> Capabilities:
        dt = frozenset(dtypes) if dtypes is not None else None
        return cls(allow=tuple(OpRule(o, domain, since, until, dt) for o in sorted(set(op_types))))

    def supports(self, op_type: str, domain: str, opset: int, input_dtypes: Sequence[int | None] = ()) -> bool:
        return self._match(self.allow, op_type, domain, opset, input_dtypes) and not self._match(
            self.deny, op_type, domain, opset, input_dtypes
        )

    @staticmethod
    def _match(rules: tuple[OpRule, ...], op_type: str, domain: str, opset: int,
               input_dtypes: Sequence[int | None]) -> bool:
        for r in rules:
            if r.op_type is not None and r.op_type != op_type:
                continue
            if r.domain != "*" and r.domain != domain:
                continue
            if opset < r.since or (r.until is not None and opset > r.until):
                continue
            if r.dtypes is not None and any(d is not None and d not in r.dtypes for d in input_dtypes):
                continue
            return True
        return False


class CompiledStage(Protocol):
    """A stage compiled for one device. ``run`` is called from the device's worker thread."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    @property
    def hooks(self) -> StageHooks:
        """The optional protocols this stage implements (:data:`NO_STAGE_HOOKS`: none)."""
        ...

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run the stage; returns outputs in ``output_names`` order.

        Raises :class:`hetsched.StageExecutionError` (with the cause chained) on failure.
        """
        ...

    def close(self) -> None: ...


TensorSpec: TypeAlias = "tuple[np.dtype[Any], tuple[int, ...]]"
"""A tensor's element type and (static) shape."""


@runtime_checkable  # tests check a backend's stage against it; the runtime reads ``hooks.in_place``
class BindableStage(Protocol):
    """Optional (``hooks.in_place``): a compiled stage that reads inputs in place and writes
    into memory it is given.

    The runtime calls :meth:`output_specs` once after compiling; when it returns specs it
    acquires, for every run whose outputs another stage (or a zero-copy caller) reads, one
    pool buffer per output and calls :meth:`run_into` with views of them, so the stage's
    results land directly in runtime-owned (shareable, 64-byte aligned) memory and the next
    stage on the same memory domain reads that very memory. :meth:`CompiledStage.run` stays
    required: it serves runs whose outputs only a caller keeping plain arrays reads, and
    runs when a pool is full.
    """

    def output_specs(self) -> Sequence[TensorSpec] | None:
        """Per output (in ``output_names`` order) its dtype and static shape; None when any output's
        shape is only known at run time or some input/output cannot be bound (then the runtime
        calls :meth:`CompiledStage.run` and the backend allocates the outputs)."""
        ...

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run the stage reading ``feeds`` where they lie and writing output ``i`` into ``outputs[i]``
        (C-contiguous arrays of exactly the dtype/shape :meth:`output_specs` gave).

        Raises :class:`hetsched.StageExecutionError` (with the cause chained) on failure,
        including when the run's actual output shapes differ from the specs; the runtime then
        retries once through :meth:`CompiledStage.run` and stops binding this stage.
        """
        ...


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """Who a device worker thread is; handed to a stage's ``worker_state`` hook.

    Room for more of what a worker owns (an NPU core, a CUDA stream) as backends need it.
    """

    device: str
    """The worker's name: its device, or the devices sharing it joined by ``+``."""
    index: int
    """Which of the device's worker threads (``0 .. concurrency - 1``)."""
    cpus: tuple[int, ...]
    """The cores the thread is pinned to (empty: not pinned)."""
    devices: tuple[str, ...] = ()
    """Every device whose stages this worker runs (CPU devices on the same cores share one)."""


class WorkerStateStage(Protocol):
    """Optional (``hooks.worker_state``): a compiled stage that keeps state per device worker thread.

    Only a stage that declares it has its runs called with ``state=``: ``run(feeds, state=s)``
    and, for a :class:`BindableStage`, ``run_into(feeds, outputs, state=s)``.

    A state can die (the device context's process killed): a run on it that raises
    :class:`~hetsched.DeviceFailedError` makes the worker close it (``close_worker_state``) and
    call ``worker_state`` again before its next run. A stage that can tell a dead state also
    declares a :class:`WorkerStateProbe` (``hooks.state_probe``).
    """

    def worker_state(self, worker: WorkerInfo) -> object:
        """Make this stage's state for one worker thread (``worker``: a :class:`WorkerInfo` with
        ``device``, ``index``, ``cpus``), called once on that thread before its first run of
        the stage. An exception fails that run; the next run on that thread calls it again."""
        ...

    def close_worker_state(self, state: object) -> None:
        """Release ``state``, called on its worker thread when the worker stops (the session
        closes or re-plans), also after failed runs. An exception is reported by
        ``threading.excepthook`` once the worker's other states are closed."""
        ...


class WorkerStateProbe(Protocol):
    """Optional (``hooks.state_probe``, with ``hooks.worker_state``): tells whether a worker's
    state still works (its context's process lives).

    Asked before each run: a dead state is replaced before it fails a run, and a state it
    calls alive is kept after a :class:`~hetsched.DeviceFailedError`. Without it a state is
    assumed alive until a run on it raises :class:`~hetsched.DeviceFailedError`.
    """

    def worker_state_alive(self, state: object) -> bool: ...


class ModelledFigures(Protocol):
    """A modelled stage's totals over its runs so far."""

    @property
    def modelled_time_s(self) -> float: ...

    @property
    def modelled_energy_j(self) -> float: ...


class ModelledStage(Protocol):
    """Optional (``hooks.modelled``): a stage that knows its own time and energy per run (a twin
    stage's modelled board seconds and joules, a board's measured ones).

    The runtime learns :meth:`last_run_seconds` as the stage's cost instead of the host's wall
    time; a session sums :meth:`statistics`' totals into its energy and busy figures.
    """

    def last_run_seconds(self) -> float:
        """Seconds of the run that just ended in the calling thread."""
        ...

    def last_run_energy_j(self) -> float:
        """Joules of the run that just ended in the calling thread."""
        ...

    def statistics(self) -> ModelledFigures: ...


class CompileCacheFigures(Protocol):
    @property
    def cached(self) -> bool:
        """Whether compiling the stage was a compile-cache hit."""
        ...


class CachedCompileStage(Protocol):
    """Optional (``hooks.compile_cache``): a stage built through a compile cache."""

    def statistics(self) -> CompileCacheFigures: ...


class AccuracyReport(Protocol):
    """A stage's accuracy against fp32 onnxruntime, as plain data."""

    def to_json(self) -> Mapping[str, Any]: ...


class AccuracyFigures(Protocol):
    @property
    def accuracy(self) -> AccuracyReport | None:
        """Measured at compile time (None: not measured, e.g. on the board)."""
        ...


class ProbedStage(Protocol):
    """Optional (``hooks.accuracy``): a stage whose accuracy was measured when it compiled."""

    def statistics(self) -> AccuracyFigures: ...


class ReportingStage(Protocol):
    """Optional (``hooks.statistics``): a stage with counters of its own (a frozen dataclass)."""

    def statistics(self) -> object: ...


@dataclass(frozen=True, slots=True)
class StageHooks:
    """The optional protocols a compiled stage implements, declared: each field is the object
    implementing it (the stage itself, or the accelerator stage a twin stage wraps), or None.

    Declared once when the stage is built; the runtime reads it when it sets the stage up.
    """

    in_place: BindableStage | None = None
    unbound_reason: str | None = None
    """Why a stage that is not ``in_place`` cannot run in place, in the backend's own words
    (which output, and why), or None."""
    worker_state: WorkerStateStage | None = None
    state_probe: WorkerStateProbe | None = None
    modelled: ModelledStage | None = None
    compile_cache: CachedCompileStage | None = None
    accuracy: ProbedStage | None = None
    statistics: ReportingStage | None = None


NO_STAGE_HOOKS = StageHooks()
"""A stage with none of the optional protocols: three calls, nothing else."""


class ThreadedBackend(Protocol):
    """Optional (``hooks.workers``): a backend whose devices run several stages at once."""

    def worker_cpus(self, device: Device) -> Sequence[tuple[int, ...]]:
        """One entry per worker thread of the device (the cores it is pinned to); the
        device runs that many stages at once. Default: ``[device.cpus]``."""
        ...


class CompileCounters(Protocol):
    @property
    def conversions(self) -> int: ...

    @property
    def cache_hits(self) -> int: ...

    @property
    def seconds(self) -> float: ...


class CountingBackend(Protocol):
    """Optional (``hooks.compile_counters``): a backend counting its conversions (process-wide)."""

    def statistics(self) -> CompileCounters: ...


@dataclass(frozen=True, slots=True)
class BackendHooks:
    """The optional protocols a backend implements, declared (each field None or False where not)."""

    workers: ThreadedBackend | None = None
    slow_compile: bool = False
    """Compiling takes seconds (a vendor toolkit's conversion): ``background_compile=True``
    sessions compile its stages while serving on the others."""
    compile_counters: CountingBackend | None = None


NO_BACKEND_HOOKS = BackendHooks()
"""A backend with none of the optional protocols."""


class Backend(Protocol):
    """Compile and run stages on devices of one kind."""

    name: str

    @property
    def hooks(self) -> BackendHooks:
        """The optional protocols this backend implements (:data:`NO_BACKEND_HOOKS`: none)."""
        ...

    def capabilities(self, device: Device) -> Capabilities: ...

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        """Compile a standalone stage model. Raises :class:`hetsched.CompileError`."""
        ...
