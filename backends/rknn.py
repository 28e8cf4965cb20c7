"""RKNN backend: stages on the RK3588 NPU, converted by Rockchip's rknn-toolkit2.

Here (x86-64, or any host without an NPU) every stage is converted by the toolkit and run by
its **simulator** (the NPU's fp16 / int8 numerics), in a worker process started with the
toolkit's own Python (``hetsched setup rknn``; ``HETSCHED_RKNN_PYTHON``), tensors passed
through shared memory. On a twin root the twin still supplies modelled time, power and heat:
the stage is wrapped like ``backends/sim.py`` wraps its CPU stages. On a board
(rknn-toolkit-lite2 importable as ``rknnlite.api``, extra ``hetsched[rknn]``) the converted
``.rknn`` file from the compile cache runs in-process on the NPU cores.

``compile``: prepare the stage (``hetsched._rknn.prepare``: opset 13, Dropout/Identity folded,
static shapes), look it up in the content-addressed cache (``hetsched._rknn.cache``), convert it
where the cache has no verdict. A stage the toolkit refused before raises the same
:class:`~hetsched.CompileError` at once. A cached success counts as a cache hit (no
conversion) but, in the simulator, still builds the stage once more: the simulator cannot run
a loaded ``.rknn``.

Device options (``Device.options``, set by ``resolve_devices`` for ``npu``, ``npu:N``, ``npu:0-2``):
``target`` ("rk3588"), ``core_mask`` (RKNNLite's ``NPU_CORE_*`` value, :data:`NPU_CORE_AUTO`
for ``npu``), ``float_dtype`` ("float16"), ``quantize`` (bool; INT8 w8a8, default: whether
``calibration`` is set) with ``calibration`` (a ``hetsched._rknn.calibrate.CalibrationSet``, set
by ``Session(calibration=...)``: the stage's dataset is computed from it) or ``dataset`` (a
toolkit dataset file), ``quantized_dtype`` / ``quantized_algorithm``, ``shapes`` (fixed free
dims, ``{input: (d0, ...)}``), ``cache_dir``, ``workers`` (``"per-core"``: one worker per NPU
core, the default for ``npu``; ``1``), ``progress`` (called ``(stage, cached, seconds)`` per compile).

Quantized stages still take and return float tensors: the simulator (and lite2 by default)
quantize inputs and dequantize outputs at the stage's edges. Each compile measures the
stage's accuracy against fp32 onnxruntime (``hetsched._rknn.accuracy``), kept in the cache verdict and
reused by a cache hit. On a board the
``.rknn`` comes from the manifest ``hetsched compile --out DIR`` wrote (``HETSCHED_RKNN_CACHE=DIR``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from hetsched._errors import (
    CompileError,
    DeviceFailedError,
    DeviceSpecError,
    HetschedError,
    StageExecutionError,
    ToolkitWorkerError,
)
from hetsched._planning.fold import restore_control_flow_dims
from hetsched._rknn.accuracy import StageAccuracy, compile_time_accuracy
from hetsched._rknn.cache import CompileCache, Verdict, calibration_hash, default_cache_dir, stage_key
from hetsched._rknn.env import toolkit_unavailable_reason
from hetsched._rknn.prepare import io_specs, prepare_stage
from hetsched._rknn.processes import Prebuilt, ToolkitProcesses

from ._base import BackendHooks, Capabilities, CompiledStage, Device, StageHooks, TensorSpec, WorkerInfo
from ._rknn_lite import NPU_CORE_AUTO, NPU_CORES, core_mask_for
from .sim import OP_SETS, SimStage

__all__ = [
    "NPU_CORES",
    "NPU_CORE_AUTO",
    "RknnBackend",
    "RknnBackendStatistics",
    "RknnStage",
    "RknnStageStatistics",
    "core_mask",
    "rknn_capabilities",
    "toolkit_unavailable_reason",
]

PROBE_PASSED = "probe_passed"
"""Key in a cached verdict's accuracy: the stage passed its compile-time probe run
(``backends._probe``) when it was stored. A cache hit whose ``.rknn`` verifies against the
sha256 its verdict recorded then skips the probe run (the toolkit simulator still rebuilds the
stage from ONNX: it cannot run a loaded ``.rknn``)."""


# Listed unsupported by the op-support document yet converted and run correctly by the
# toolkit (../shared/reference/accelerators.md §1): the list is only a first guess.
_CONVERTS_ANYWAY = ("Sum", "Einsum", "TopK", "Abs", "Neg", "Reciprocal")


def rknn_capabilities() -> Capabilities:
    """First guess of what the NPU runs: the twin's RKNN op set plus ops measured to convert."""
    base = OP_SETS["rknn"]
    dtypes = base.allow[0].dtypes if base.allow else None
    extra = Capabilities.ops(_CONVERTS_ANYWAY, dtypes=dtypes)
    return Capabilities(allow=base.allow + extra.allow, deny=base.deny)


def core_mask(cores: Sequence[int]) -> int:
    """The ``NPU_CORE_*`` mask of these cores (``()`` -> :data:`NPU_CORE_AUTO`)."""
    mask = 0
    for c in cores:
        mask |= 1 << c
    return mask


@dataclass(frozen=True)
class RknnBackendStatistics:
    conversions: int
    """Stages converted by the toolkit (refusals included)."""
    cache_hits: int
    """Compiles answered by the compile cache (no conversion)."""
    refusals_cached: int
    """Of ``cache_hits``, stored refusals (raised at once)."""
    seconds: float
    """Toolkit time spent converting."""


@dataclass(frozen=True)
class RknnStageStatistics:
    runs: int
    run_seconds: float
    """Wall time inside the toolkit's runs (simulator or NPU), all contexts."""
    core_masks: tuple[int, ...]
    """The core mask each worker context was given, by worker index (``-1``: none yet)."""
    contexts_started: int
    """Toolkit contexts built for workers other than the compile-time one (restarts included)."""
    cached: bool
    """Whether compiling this stage was a cache hit."""
    cache_key: str
    precision: str
    """``"float16"`` (the toolkit's float dtype as configured) or ``"int8"`` (w8a8, calibrated)."""
    accuracy: StageAccuracy | None
    """Against fp32 onnxruntime on the stage's calibration samples (else seeded random inputs),
    measured at compile time; None on the board (no reference run there)."""


@dataclass
class _Context:
    """One toolkit context of a stage: a worker process and the stage built in it."""

    proc: Any
    handle: int
    mask: int
    index: int


class RknnStage:
    """A stage converted by rknn-toolkit2, run by its simulator in worker processes.

    A :class:`~hetsched.backends.BindableStage` (the worker process writes outputs in place) and a
    :class:`~hetsched.backends.WorkerStateStage`: one toolkit context per device worker thread.
    Worker 0 uses the context built at compile time; the others' contexts start building in
    background threads at compile time (:meth:`prebuild`), each in its own process.
    """

    def __init__(self, backend: RknnBackend, name: str, device: Device, request: Any, compiled: _Context,
                 specs: tuple[list[str], list[TensorSpec], list[str], list[TensorSpec]], *, cached: bool,
                 key: str, rknn_path: Path, precision: str, model_sha256: str):
        self._backend = backend
        self.name = name
        self.device = device
        self.request = request
        self.rknn_path = rknn_path
        in_names, self._in_specs, out_names, self._out_specs = specs
        self.input_names = tuple(in_names)
        self.output_names = tuple(out_names)
        self._compiled: _Context | None = compiled
        self._lock = threading.Lock()
        self._runs = 0
        self._seconds = 0.0
        self._masks: dict[int, int] = {}
        self._started = 0
        self._cached = cached
        self._key = key
        self._live: set[int] = set()  # ids of contexts handed to workers and not closed
        self.precision = precision
        self.model_sha256 = model_sha256
        self.accuracy: StageAccuracy | None = None
        self._prebuilt: Prebuilt[_Context] | None = None
        self.proven = False
        """Whether the stage passed its compile-time probe run (``backends._probe``)."""
        self.hooks = StageHooks(in_place=self, worker_state=self, state_probe=self, compile_cache=self,
                                accuracy=self, statistics=self)

    def prebuild(self, workers: int) -> None:
        """Start building the contexts of workers ``1 .. workers - 1`` in background threads, so
        that the first request reaching one finds it ready (:meth:`close` stops and reaps them)."""
        if workers > 1 and self._prebuilt is None:
            self._prebuilt = Prebuilt(range(1, workers), self._new_context, self._drop, name=self.name)

    def _error(self, exc: BaseException) -> StageExecutionError:
        # a worker process that died is the device failing (failover re-places the stage);
        # anything else the toolkit said is about this run
        # a stage that passed its probe run and now fails in the toolkit is the device failing too
        dead = isinstance(exc, ToolkitWorkerError) and ("failed to run" not in str(exc) or self.proven)
        cls = DeviceFailedError if dead else StageExecutionError
        err = cls(f"stage {self.name!r} failed on device {self.device.name!r}: {exc}",
                  stage=self.name, device=self.device.name)
        err.__cause__ = exc
        return err

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self._out_specs)

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        outputs = [np.empty(shape, dtype) for dtype, shape in self._out_specs]
        self.run_into(feeds, outputs, state=state)
        return outputs

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray], state: object = None) -> None:
        ctx = state if isinstance(state, _Context) else self._compiled
        try:
            if ctx is None:
                raise RuntimeError("the stage is closed")
            inputs = []
            for name, (dtype, shape) in zip(self.input_names, self._in_specs, strict=True):
                arr = np.ascontiguousarray(feeds[name], dtype=dtype)
                if arr.shape != shape:
                    raise ValueError(f"input {name!r} has shape {list(arr.shape)}; the converted stage takes "
                                     f"{list(shape)}")
                inputs.append(arr)
            t0 = time.perf_counter()
            ctx.proc.run(ctx.handle, inputs, outputs)
            dt = time.perf_counter() - t0
        except Exception as exc:  # the worker's and numpy's errors alike fail this run only
            raise self._error(exc) from exc
        with self._lock:
            self._runs += 1
            self._seconds += dt

    def worker_state(self, worker: WorkerInfo) -> _Context:
        """The toolkit context of worker ``worker.index``: the compile-time one for worker 0 while
        its process lives, else a new process with the stage built in it.

        :raises StageExecutionError: the process could not start or the build failed.
        """
        mask = core_mask_for(self.device, worker.index, len(self._backend.worker_cpus(self.device)))
        compiled = self._compiled
        ctx: _Context | None = None
        if worker.index == 0 and compiled is not None and compiled.proc.alive and id(compiled) not in self._live:
            ctx = compiled
        else:
            try:
                prebuilt = self._prebuilt
                ctx = prebuilt.take(worker.index) if prebuilt is not None else None
                if ctx is not None and not ctx.proc.alive:  # its process died since: build anew
                    self._drop(ctx)
                    ctx = None
                if ctx is None:
                    ctx = self._new_context(worker.index)
            except HetschedError as exc:
                raise self._error(exc) from exc
            if ctx is None:
                raise self._error(RuntimeError("the stage is closed"))
        ctx.mask = mask
        with self._lock:
            self._masks[worker.index] = mask
            self._live.add(id(ctx))
        return ctx

    def worker_state_alive(self, state: object) -> bool:
        """Whether a worker's context can still run: its toolkit process lives. One that died
        (killed, crashed) is closed by the worker and :meth:`worker_state` builds a new one in
        a new process before the next run (issue 23: one crash costs the runs in it)."""
        return not isinstance(state, _Context) or state.proc.alive

    def _new_context(self, index: int, stop: threading.Event | None = None) -> _Context | None:
        """The stage built in worker ``index``'s process (None once ``stop`` is set).

        :raises CompileError: the build failed (the toolkit's message).
        :raises ToolkitWorkerError: the process could not start or died.
        """
        proc = self._backend._processes.acquire(self.device.name, index)
        try:
            if stop is not None and stop.is_set():
                self._backend._processes.release(proc)
                return None
            handle, result = proc.build(self.request)
        except BaseException:
            self._backend._processes.release(proc)
            raise
        if handle is None or not result.ok:
            self._backend._processes.release(proc)
            raise CompileError(result.message)
        with self._lock:
            self._started += 1
        return _Context(proc, handle, NPU_CORE_AUTO, index)

    def close_worker_state(self, state: object) -> None:
        if not isinstance(state, _Context):
            return
        with self._lock:
            self._live.discard(id(state))
        if state is self._compiled:
            return  # kept for plain runs; closed with the stage
        self._drop(state)

    def _drop(self, ctx: _Context) -> None:
        try:
            if ctx.proc.alive:
                ctx.proc.release(ctx.handle)
        except HetschedError:
            pass  # a dead process holds nothing any more
        finally:
            self._backend._processes.release(ctx.proc)

    def statistics(self) -> RknnStageStatistics:
        with self._lock:
            top = max(self._masks, default=-1)
            masks = tuple(self._masks.get(i, -1) for i in range(top + 1))
            return RknnStageStatistics(self._runs, self._seconds, masks, self._started, self._cached, self._key,
                                       self.precision, self.accuracy)

    def io_specs(self) -> tuple[tuple[str, TensorSpec], ...]:
        """(name, (dtype, shape)) of the inputs, then the outputs: what the stage takes and returns
        (float tensors for an INT8 stage too: the toolkit quantizes and dequantizes at its edges)."""
        return tuple(zip(self.input_names + self.output_names, self._in_specs + self._out_specs, strict=True))

    def close(self) -> None:
        prebuilt, self._prebuilt = self._prebuilt, None
        if prebuilt is not None:
            prebuilt.close()
        compiled, self._compiled = self._compiled, None
        if compiled is not None:
            self._drop(compiled)


class _TwinRknnStage(SimStage):
    """An :class:`RknnStage` on a twin device: the toolkit computes, the twin models time and energy."""

    def __init__(self, inner: RknnStage, name: str, device: Device, flops: float, nbytes: float):
        super().__init__(inner, name, device, flops, nbytes)
        self.rknn = inner
        # the twin's modelled figures are this stage's; its cache hit and accuracy the toolkit's
        self.hooks = dataclasses.replace(self.hooks, worker_state=self, state_probe=self, compile_cache=inner,
                                         accuracy=inner)

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        # one run in flight on the shared twin board: two sessions on the twin's NPU share its cores
        return self._timed(lambda: self.rknn.run(feeds, state=state))

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Any, state: object = None) -> None:
        self._timed(lambda: self.rknn.run_into(feeds, outputs, state=state))

    def worker_state(self, worker: WorkerInfo) -> object:
        return self.rknn.worker_state(worker)

    def worker_state_alive(self, state: object) -> bool:
        return self.rknn.worker_state_alive(state)

    def close_worker_state(self, state: object) -> None:
        self.rknn.close_worker_state(state)


def _costs(model: onnx.ModelProto) -> tuple[float, float]:
    from hetsched._planning.costs import analytic_node_costs
    from hetsched._planning.graph import GraphIndex

    costs = analytic_node_costs(GraphIndex(model))
    return sum(c.flops for c in costs), sum(c.bytes for c in costs)


def _on_board(device: Device) -> bool:
    """A real board: an aarch64 host and a device not on a twin root."""
    return platform.machine().lower() in ("aarch64", "arm64") and "profile_domain" not in device.options


def _load_lite() -> Any:
    from ._rknn_lite import load_lite

    return load_lite()


class RknnBackend:
    """Rockchip NPU stages (``Device.backend == "rknn"``); see the module docstring."""

    name = "rknn"
    slow_compile = True
    """A compile starts the toolkit's worker process and converts (or reloads) the stage: seconds,
    so ``Session(background_compile=True)`` opens without this backend's devices first."""

    def __init__(self) -> None:
        self.hooks = BackendHooks(workers=self, slow_compile=self.slow_compile, compile_counters=self)
        self._lock = threading.Lock()
        self._caches: dict[Path, CompileCache] = {}
        self._versions: dict[str, str] = {}
        self._processes = ToolkitProcesses()

    def capabilities(self, device: Device) -> Capabilities:
        return rknn_capabilities()

    def toolkit_versions(self) -> dict[str, str]:
        """``{toolkit Python: rknn-toolkit2 version}`` of the toolkit environments this backend
        started (empty before its first compile)."""
        with self._lock:
            return dict(self._versions)

    def worker_cpus(self, device: Device) -> list[tuple[int, ...]]:
        """One worker per NPU core for ``npu`` (``workers="per-core"``, its default), else one.

        :raises DeviceSpecError: ``workers`` is neither 1 nor ``"per-core"``.
        """
        auto = int(device.options.get("core_mask", NPU_CORE_AUTO)) == NPU_CORE_AUTO
        workers = device.options.get("workers", "per-core" if auto else 1)
        if workers == 1:
            return [tuple(device.cpus)]
        if workers == "per-core" or workers == NPU_CORES:
            return [tuple(device.cpus)] * NPU_CORES
        raise DeviceSpecError(f"device {device.name!r}: option workers={workers!r} must be 1 or 'per-core'")

    def _cache(self, device: Device) -> CompileCache:
        directory = default_cache_dir(device.options)
        with self._lock:
            cache = self._caches.get(directory)
            if cache is None:
                cache = self._caches[directory] = CompileCache(directory)
            return cache

    def statistics(self) -> RknnBackendStatistics:
        with self._lock:
            stats = [c.statistics() for c in self._caches.values()]
        return RknnBackendStatistics(sum(s.conversions for s in stats), sum(s.cache_hits for s in stats),
                                     sum(s.refusals_cached for s in stats), sum(s.seconds for s in stats))

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        """Prepare, look up or convert, and build the stage (see the module docstring).

        :raises CompileError: preparation failed, or the toolkit refused the stage now or before
            (``"{device}: {the toolkit's message}"``).
        :raises BackendUnavailableError: no toolkit environment (``hetsched setup rknn``), or on a
            board without rknn-toolkit-lite2.
        :raises ToolkitWorkerError: the toolkit's worker process died or could not start.
        """
        from hetsched._rknn.client import BuildRequest

        opts = device.options
        try:
            # the fixed dims a control-flow stage declares free for onnxruntime: the converter needs them
            prepared = prepare_stage(restore_control_flow_dims(model), opts.get("shapes"))
        except CompileError as exc:
            raise CompileError(f"{device}: {exc}") from exc
        data = prepared.SerializeToString()
        cache = self._cache(device)
        target = str(opts.get("target", "rk3588"))
        float_dtype = str(opts.get("float_dtype", "float16"))
        calibration = opts.get("calibration")  # a CalibrationSet (Session(calibration=...))
        quantize = bool(opts.get("quantize", calibration is not None))
        precision = "int8" if quantize else float_dtype
        if _on_board(device):
            return self._board_stage(prepared, data, device, name, target,
                                     precision if "quantize" in opts or calibration is not None else None)
        specs = io_specs(prepared)
        q_dtype, q_algo = opts.get("quantized_dtype"), opts.get("quantized_algorithm")
        python = self._python()
        proc = None if python in self._versions else self._processes.acquire(device.name, 0)
        try:
            version = self._versions.setdefault(python, str(proc.toolkit_version if proc else ""))
            dataset, calib = self._dataset(device, cache, calibration, specs[0]) if quantize else (None, None)
            key = stage_key(data, toolkit_version=version, target=target, float_dtype=float_dtype, quantize=quantize,
                            quantized_dtype=q_dtype, quantized_algorithm=q_algo, calibration=calib)
            verdict = cache.lookup(key)
            if verdict is not None and not verdict.ok:
                raise CompileError(f"{device}: {verdict.message}")
            onnx_path = cache.put_model(key, data)
            if proc is None:
                proc = self._processes.acquire(device.name, 0)
            exported = cache.temp_rknn_path(key) if verdict is None else None
            request = BuildRequest(onnx_path=str(onnx_path), target=target, float_dtype=float_dtype, quantize=quantize,
                                   dataset=dataset, quantized_dtype=q_dtype, quantized_algorithm=q_algo)
            t0 = time.perf_counter()
            handle, result = proc.build(dataclasses.replace(request, export_path=str(exported) if exported else None))
            if verdict is None:
                cache.store(key, Verdict(result.ok, result.message, result.seconds, version, target), exported)
            if handle is None or not result.ok:
                raise CompileError(f"{device}: {result.message}")
        except BaseException:
            if proc is not None:
                self._processes.release(proc)
            raise
        stage = RknnStage(self, name, device, request, _Context(proc, handle, NPU_CORE_AUTO, 0), specs,
                          cached=verdict is not None, key=key, rknn_path=cache.rknn_path(key), precision=precision,
                          model_sha256=hashlib.sha256(data).hexdigest())
        try:
            if verdict is not None and verdict.accuracy is not None and verdict.accuracy.get(PROBE_PASSED):
                # a verified cache hit (the .rknn hashes to the sha256 its verdict recorded) of a
                # stage that passed its probe run on these inputs: the proof is in the verdict
                stage.proven = True
            else:
                self._probe(stage, data, specs, precision, calibration, cache, key, version, target)
            if not device.options.get("trial"):  # a refusal trial is closed at once
                stage.prebuild(len(self.worker_cpus(device)))
            stored = StageAccuracy.from_json(verdict.accuracy) if verdict is not None and verdict.accuracy else None
            stage.accuracy = compile_time_accuracy(stage, data, calibration, stored, keyed_calibration=quantize)
            recorded = verdict is not None and verdict.accuracy is not None and verdict.accuracy.get(PROBE_PASSED)
            if stage.accuracy is not None and (stage.accuracy is not stored or not recorded):
                cache.record_accuracy(key, {**dataclasses.asdict(stage.accuracy), PROBE_PASSED: True})
        except BaseException:
            stage.close()
            raise
        progress = opts.get("progress")
        if callable(progress):
            progress(name, verdict is not None, time.perf_counter() - t0)
        if "profile_domain" in opts:
            flops, nbytes = _costs(prepared)
            return _TwinRknnStage(stage, name, device, flops, nbytes)
        return stage

    @staticmethod
    def _probe(stage: RknnStage, data: bytes, specs: tuple[list[str], list[TensorSpec], list[str], list[TensorSpec]],
               precision: str, calibration: Any, cache: CompileCache, key: str, version: str, target: str) -> None:
        """The stage proves itself before it is placed (:func:`backends._probe.probe_stage`): one run
        on probe inputs (its first calibration sample where it has some) against onnxruntime.

        :raises CompileError: it failed or disagreed; stored in the cache as a refusal.
        """
        from ._probe import probe_stage

        names = list(stage.input_names)
        sample = calibration.tensors(names)[0] if calibration is not None else None
        try:
            probe_stage(lambda xs: stage.run(dict(zip(names, xs, strict=True))), data, names, specs[1],
                        precision=precision, device=stage.device.name, inputs=sample)
        except CompileError as exc:
            message = str(exc).removeprefix(f"{stage.device.name}: ")
            cache.store(key, Verdict(False, message, 0.0, version, target), None)
            raise
        stage.proven = True

    @staticmethod
    def _dataset(device: Device, cache: CompileCache, calibration: Any,
                 in_names: Sequence[str]) -> tuple[str, str | None]:
        """The toolkit dataset file of an INT8 stage and the hash its cache key takes.

        :raises CompileError: neither calibration feeds nor a ``dataset`` option.
        """
        if calibration is not None:
            path, digest = calibration.write_dataset(cache.directory, in_names)
            return str(path), digest
        given = device.options.get("dataset")
        if not given:
            raise CompileError(f"{device}: INT8 needs calibration data (Session(calibration=...), "
                               "--calibration DIR, or a dataset option)")
        return str(given), calibration_hash(given)

    def _board_stage(self, prepared: onnx.ModelProto, data: bytes, device: Device, name: str, target: str,
                     precision: str | None) -> CompiledStage:
        """The board path: the ``.rknn`` the manifest of the cache directory names for this stage."""
        from hetsched._rknn.manifest import board_rknn_path

        from ._rknn_lite import LiteStage

        lite = _load_lite()  # before anything else: a missing runtime is the first error
        path = board_rknn_path(self._cache(device).directory, data, target=target, precision=precision)
        specs = io_specs(prepared)
        stage = LiteStage(lite, path, name, device, specs, len(self.worker_cpus(device)))
        try:  # the board's stage proves itself too (the manifest's .rknn against onnxruntime)
            from ._probe import probe_stage

            names = list(stage.input_names)
            probe_stage(lambda xs: stage.run(dict(zip(names, xs, strict=True))), data, names, specs[1],
                        precision=precision or str(device.options.get("float_dtype", "float16")),
                        device=device.name)
        except BaseException:
            stage.close()
            raise
        return stage

    def _python(self) -> str:
        from hetsched._rknn.env import find_toolkit_python

        return find_toolkit_python()







backend_class = RknnBackend
