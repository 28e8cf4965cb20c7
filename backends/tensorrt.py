"""TensorRT backend: stages on an NVIDIA GPU (``gpu:0``) or a Jetson Orin DLA core (``dla:0``, ``dla:1``).

**Not run on a GPU by this project's CI**: no machine it tests on has TensorRT. The code follows
NVIDIA's documented Python API and samples (sources in ``_tensorrt_build`` and ``_tensorrt_run``);
what is tested here is everything that needs no GPU (version and precision rules, profiles, the
parser's support answer, cache keys, the order of the documented calls against a recording
stand-in, error messages).

Needs the ``tensorrt`` Python bindings (10.x or 11.x) and cuda-python: on Jetson TensorRT comes
with JetPack (its ``python3-libnvinfer`` package in the system Python; a venv sees it with
``--system-site-packages``), never from PyPI (a source-only stub there), and cuda-python of the
board's CUDA major version, ``pip install 'hetsched[jetson-cuda12]'`` on JetPack 6. Both import
lazily, at the first compile.

``compile``: the parser's ``supports_model_v2`` says which nodes TensorRT takes; a stage with any
it does not take raises :class:`~hetsched.CompileError` naming them and why (the planner then
tries units alone and places the refused ones elsewhere). The engine is looked up in (or built
into) a content-addressed cache (``_tensorrt_cache``), keyed by everything that makes an engine
non-portable. Each device worker thread gets its own execution context and CUDA stream
(:meth:`TensorRtStage.worker_state`).

A stage whose engine has static output shapes is a :class:`~hetsched.backends.BindableStage`:
the runtime hands it pool buffers for its outputs (``run_into``). On a Jetson (integrated GPU)
the GPU then reads its inputs and writes its outputs in those pool buffers themselves, with no
copy between a CPU stage and a GPU stage (``_tensorrt_run``; the pool mappings are registered
with ``cudaHostRegister`` once and unregistered when the pool unmaps them). On a discrete GPU
the tensors are copied between those (pinned) pool buffers and device memory on the worker's
stream.

Device options (``Device.options``): ``device_id`` (CUDA device, default 0), ``dla_core`` (default:
the ``N`` of a ``dla:N`` device of kind ``"dla"``), ``precision`` (``"fp32"``, ``"fp16"``,
``"int8"``; default ``"fp32"`` on the GPU, ``"fp16"`` on DLA), ``workspace`` (bytes),
``shapes`` (fixed free dims, ``{input: (d0, ...)}``, set by ``Session(shapes=...)``), ``profiles``
(``{input: (min, opt, max)}``, GPU only), ``cache_dir``, ``progress`` (called ``(stage, cached,
seconds)`` per compile).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

from hetsched._errors import (
    BackendUnavailableError,
    CompileError,
    DeviceFailedError,
    DeviceSpecError,
    StageExecutionError,
)
from hetsched._planning.fold import restore_control_flow_dims

from ._base import BackendHooks, Capabilities, CompiledStage, Device, StageHooks, TensorSpec, WorkerInfo
from ._tensorrt_build import bake_static_shapes, build_serialized_engine, build_settings, parse_version
from ._tensorrt_cache import EngineCache, default_engine_cache_dir, engine_cache_key
from ._tensorrt_run import (
    CudaError,
    EngineHandle,
    GpuInfo,
    WorkerContext,
    cuda_call,
    device_lost,
    gpu_info,
    load_cudart,
)

_T = TypeVar("_T")

__all__ = [
    "INSTALL_HINT",
    "TensorRtBackend",
    "TensorRtBackendStatistics",
    "TensorRtStage",
    "TensorRtStageStatistics",
    "load_tensorrt",
    "tensorrt_unavailable_reason",
]

INSTALL_HINT = ("on Jetson TensorRT comes with JetPack (apt install python3-libnvinfer; a venv needs "
                "--system-site-packages), not from PyPI; cuda-python must match the board's CUDA major: "
                "pip install 'hetsched[jetson-cuda12]' on JetPack 6 (CUDA 12), 'hetsched[jetson-cuda13]' on CUDA 13")


def load_tensorrt() -> tuple[Any, Any]:
    """The ``tensorrt`` module and cuda-python's runtime module.

    :raises BackendUnavailableError: either is not installed (the message names which and how to
        install it).
    """
    try:
        import tensorrt as trt  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BackendUnavailableError(f"the tensorrt backend needs TensorRT's Python bindings (module "
                                      f"'tensorrt'), which are not installed: {INSTALL_HINT}") from exc
    try:
        cudart = load_cudart()
    except BackendUnavailableError as exc:
        raise BackendUnavailableError(f"the tensorrt backend needs cuda-python (module 'cuda.bindings'), which is "
                                      f"not installed: {INSTALL_HINT}") from exc
    return trt, cudart


def tensorrt_unavailable_reason(device_id: int = 0) -> str | None:
    """Why stages cannot run here with TensorRT (no bindings, no cuda-python, no CUDA GPU), or None."""
    try:
        _, cudart = load_tensorrt()
        gpu_info(cudart, device_id)
    except BackendUnavailableError as exc:
        return str(exc)
    except CudaError as exc:
        return f"no usable CUDA GPU {device_id}: {exc}"
    return None


def dla_core_of(device: Device) -> int | None:
    """The DLA core a device targets: ``options["dla_core"]``, else ``N`` of ``dla:N`` for a device of
    kind ``"dla"``; None for a GPU.

    :raises DeviceSpecError: a ``dla`` device whose core cannot be told.
    """
    given = device.options.get("dla_core")
    if given is not None:
        return int(given)
    if device.kind != "dla":
        return None
    _, _, tail = device.name.partition(":")
    if not tail.isdigit():
        raise DeviceSpecError(f"device {device.name!r}: a DLA device needs a core (name it dla:N or give the "
                              "dla_core option)")
    return int(tail)


@dataclass(frozen=True)
class TensorRtBackendStatistics:
    conversions: int
    """Engines built (refusals included)."""
    cache_hits: int
    """Compiles answered by the engine cache."""
    refusals_cached: int
    """Of ``cache_hits``, stored refusals (raised at once)."""
    seconds: float
    """Seconds spent building engines."""


@dataclass(frozen=True)
class TensorRtStageStatistics:
    runs: int
    run_seconds: float
    contexts: int
    """Execution contexts created (one per worker thread, restarts included)."""
    bound_tensors: int
    """Inputs and outputs the GPU used in place, in a pool buffer (integrated GPU), over the live contexts."""
    pinned_tensors: int
    """Inputs and outputs copied straight between a pool buffer and device memory (discrete GPU)."""
    staged_tensors: int
    """Inputs and outputs copied through a context's own staging buffers, over the live contexts."""
    cached: bool
    cache_key: str
    precision: str
    dla_core: int | None


class TensorRtStage:
    """A stage as a TensorRT engine; a :class:`~hetsched.backends.WorkerStateStage` (one execution
    context and CUDA stream per worker thread) and a :class:`~hetsched.backends.BindableStage`
    when its output shapes are static. The engine is deserialized once, at the first call that
    needs it (``output_specs`` or a worker's first run), with ``runtime.DLA_core`` set first on DLA."""

    def __init__(self, trt: Any, cudart: Any, logger: Any, blob: bytes, *, name: str, device: Device,
                 device_id: int, gpu: GpuInfo, dla_core: int | None, precision: str, key: str, cached: bool,
                 input_names: Sequence[str], output_names: Sequence[str]) -> None:
        self._trt, self._cudart, self._logger, self._blob = trt, cudart, logger, blob
        self.name = name
        self.device = device
        self._device_id = device_id
        self._gpu = gpu
        self.dla_core = dla_core
        self.precision = precision
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self._key, self._cached = key, cached
        self._lock = threading.Lock()
        self._handle: EngineHandle | None = None
        self._fallback: WorkerContext | None = None
        self._live: dict[int, WorkerContext] = {}
        self._runs = 0
        self._seconds = 0.0
        self._contexts = 0
        self._closed = False
        self.hooks = StageHooks(in_place=self, worker_state=self, compile_cache=self, statistics=self)

    def _error(self, exc: BaseException) -> StageExecutionError:
        lost = isinstance(exc, CudaError) and device_lost(exc.name)
        cls = DeviceFailedError if lost else StageExecutionError
        err = cls(f"stage {self.name!r} failed on device {self.device.name!r}: {exc}", stage=self.name,
                  device=self.device.name)
        err.__cause__ = exc
        return err

    def _engine(self) -> EngineHandle:
        with self._lock:
            if self._closed:
                raise RuntimeError("the stage is closed")
            if self._handle is None:
                cuda_call(self._cudart, self._cudart.cudaSetDevice(self._device_id), "cudaSetDevice")
                self._handle = EngineHandle(self._trt, self._logger, self._blob, self.dla_core)
            return self._handle

    def worker_state(self, worker: WorkerInfo) -> WorkerContext:
        """A new execution context and CUDA stream for this worker thread.

        :raises StageExecutionError: the engine could not be deserialized or the context not made
            (:class:`~hetsched.DeviceFailedError` when CUDA says the device is gone).
        """
        try:
            ctx = WorkerContext(self._cudart, self._engine(), self._device_id, self._gpu.integrated)
        except Exception as exc:  # TensorRT raises RuntimeError/TypeError, CUDA a CudaError
            raise self._error(exc) from exc
        with self._lock:
            self._contexts += 1
            self._live[id(ctx)] = ctx
        return ctx

    def close_worker_state(self, state: object) -> None:
        if isinstance(state, WorkerContext):
            with self._lock:
                self._live.pop(id(state), None)
            state.close()

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        """Run on this worker's context (``state``), else on a context of the stage's own.

        :raises StageExecutionError: a bad feed, TensorRT refused the run, or a CUDA error
            (:class:`~hetsched.DeviceFailedError` when the device is lost).
        """
        return self._timed(state, lambda ctx: ctx.run(feeds))

    def output_specs(self) -> list[TensorSpec] | None:
        """Dtype and shape of each output when the engine's output shapes are static, else None
        (outputs of a profile-range engine are sized at run time). Loads the engine.

        :raises StageExecutionError: the engine cannot be deserialized
            (:class:`~hetsched.DeviceFailedError` when CUDA says the device is gone).
        """
        try:
            h = self._engine()
            shapes = {n: tuple(int(d) for d in h.engine.get_tensor_shape(n)) for n in h.outputs}
        except Exception as exc:  # TensorRT raises RuntimeError/TypeError, CUDA a CudaError
            raise self._error(exc) from exc
        if any(d < 0 for s in shapes.values() for d in s):
            return None
        return [(h.dtypes[n], shapes[n]) for n in self.output_names]

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray], state: object = None) -> None:
        """Run writing output ``i`` into ``outputs[i]`` (in place on an integrated GPU when it is a
        pool buffer: the GPU writes it, nothing is copied).

        :raises StageExecutionError: as :meth:`run`, also when an output's shape is not ``outputs[i]``'s.
        """
        self._timed(state, lambda ctx: ctx.run(feeds, outputs))

    def _timed(self, state: object, call: Callable[[WorkerContext], _T]) -> _T:
        """``call`` on the worker's context (this stage's own without one), counted and timed;
        any failure but a StageExecutionError translated into one."""
        t0 = time.perf_counter()
        try:
            ctx = state if isinstance(state, WorkerContext) else self._own_context()
            out = call(ctx)
        except StageExecutionError:
            raise
        except Exception as exc:  # numpy, TensorRT and CUDA failures alike fail this run
            raise self._error(exc) from exc
        with self._lock:
            self._runs += 1
            self._seconds += time.perf_counter() - t0
        return out

    def _own_context(self) -> WorkerContext:
        with self._lock:
            ctx = self._fallback
        if ctx is None:
            ctx = WorkerContext(self._cudart, self._engine(), self._device_id, self._gpu.integrated)
            with self._lock:
                self._fallback, self._contexts = ctx, self._contexts + 1
        return ctx

    def io_specs(self) -> tuple[tuple[str, TensorSpec], ...] | None:
        """Names, dtypes and shapes of the inputs then outputs once the engine is loaded (else None)."""
        h = self._handle
        if h is None:
            return None
        return tuple((n, (h.dtypes[n], tuple(int(d) for d in h.engine.get_tensor_shape(n))))
                     for n in (*h.inputs, *h.outputs))

    def statistics(self) -> TensorRtStageStatistics:
        with self._lock:
            ctxs = [*self._live.values(), *([self._fallback] if self._fallback is not None else [])]
            return TensorRtStageStatistics(self._runs, self._seconds, self._contexts, sum(c.bound for c in ctxs),
                                           sum(c.pinned for c in ctxs), sum(c.staged for c in ctxs), self._cached, self._key, self.precision,
                                           self.dla_core)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ctx, self._fallback = self._fallback, None
            self._handle = None
        if ctx is not None:
            ctx.close()


class TensorRtBackend:
    """NVIDIA GPU and DLA stages (``Device.backend == "tensorrt"``); see the module docstring."""

    name = "tensorrt"
    slow_compile = True
    """Building an engine takes seconds to minutes, so ``Session(background_compile=True)`` opens
    without this backend's devices first."""

    def __init__(self) -> None:
        self.hooks = BackendHooks(slow_compile=self.slow_compile, compile_counters=self)
        self._lock = threading.Lock()
        self._caches: dict[Path, EngineCache] = {}

    def capabilities(self, device: Device) -> Capabilities:
        """Everything, as a first guess: what TensorRT really takes is found by trying (``compile``
        raises :class:`~hetsched.CompileError` naming the nodes its parser does not take)."""
        return Capabilities.everything()

    def _cache(self, device: Device) -> EngineCache:
        directory = default_engine_cache_dir(device.options)
        with self._lock:
            cache = self._caches.get(directory)
            if cache is None:
                cache = self._caches[directory] = EngineCache(directory)
            return cache

    def statistics(self) -> TensorRtBackendStatistics:
        with self._lock:
            stats = [c.statistics() for c in self._caches.values()]
        return TensorRtBackendStatistics(sum(s.conversions for s in stats), sum(s.cache_hits for s in stats),
                                         sum(s.refusals_cached for s in stats), sum(s.seconds for s in stats))

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        """Check, look up or build the stage's engine (see the module docstring).

        :raises BackendUnavailableError: no TensorRT bindings, no cuda-python, or no CUDA GPU.
        :raises CompileError: ``"{device}: ..."``: a setting this TensorRT version or DLA cannot do,
            nodes the parser does not take (now or cached from before), or the build failed.
        :raises DeviceSpecError: a DLA device with no core.
        """
        trt, cudart = load_tensorrt()
        opts = device.options
        device_id = int(opts.get("device_id", 0))
        dla_core = dla_core_of(device)
        try:
            gpu = gpu_info(cudart, device_id)
        except CudaError as exc:
            raise BackendUnavailableError(f"{device}: no usable CUDA GPU {device_id} ({exc}); the tensorrt "
                                          "backend needs one") from exc
        try:
            # the fixed dims a control-flow stage declares free for onnxruntime: an engine needs them
            model = restore_control_flow_dims(model)
            settings = build_settings(model, opts, version=parse_version(str(trt.__version__)), dla_core=dla_core)
            prepared, settings = bake_static_shapes(model, settings)
        except CompileError as exc:
            raise CompileError(f"{device}: {exc}") from exc
        data = prepared.SerializeToString()
        key = engine_cache_key(
            data, tensorrt_version=str(trt.__version__), cuda_version=gpu.cuda_version,
            driver_version=gpu.driver_version, gpu_name=gpu.name, compute_capability=gpu.compute_capability,
            dla_core=dla_core, precision=settings.precision,
            profiles=[(p.name, p.min, p.opt, p.max) for p in settings.profiles], workspace=settings.workspace)
        cache = self._cache(device)
        found = cache.lookup(key)
        if isinstance(found, str):
            raise CompileError(f"{device}: {found}")
        logger = trt.Logger(trt.Logger.WARNING)
        t0 = time.perf_counter()
        blob = found
        if blob is None:
            try:
                blob = build_serialized_engine(trt, data, settings, logger, [n.name for n in prepared.graph.node])
            except CompileError as exc:
                cache.store(key, None, str(exc), time.perf_counter() - t0)
                raise CompileError(f"{device}: {exc}") from exc
            except Exception as exc:  # the bindings raise RuntimeError/TypeError; not cached (may be transient)
                raise CompileError(f"{device}: TensorRT failed building stage {name!r}: {exc}") from exc
            cache.store(key, blob, "", time.perf_counter() - t0)
        inits = {t.name for t in prepared.graph.initializer}
        stage = TensorRtStage(
            trt, cudart, logger, blob, name=name, device=device, device_id=device_id, gpu=gpu, dla_core=dla_core,
            precision=settings.precision, key=key, cached=found is not None,
            input_names=[i.name for i in prepared.graph.input if i.name not in inits],
            output_names=[o.name for o in prepared.graph.output])
        try:
            self._probe(stage, prepared, data, settings.precision, device)
        except CompileError as exc:
            stage.close()
            cache.store(key, None, str(exc).removeprefix(f"{device.name}: "), 0.0)  # a cached refusal
            raise
        except BaseException:
            stage.close()
            raise
        progress = opts.get("progress")
        if callable(progress):
            progress(name, found is not None, time.perf_counter() - t0)
        return stage

    @staticmethod
    def _probe(stage: TensorRtStage, prepared: onnx.ModelProto, data: bytes, precision: str, device: Device) -> None:
        """The engine proves itself before it is placed (:func:`backends._probe.probe_stage`, the
        contract of every accelerator stage): one run on seeded probe inputs against fp32
        onnxruntime (count, shapes, cosine floor by precision). An engine of profile ranges (free
        dims left to run time) has no one shape to probe at: it is checked at its first run only.

        :raises CompileError: the run failed or disagreed (the engine is not placed).
        """
        from ._probe import probe_stage

        declared = {i.name: i.type.tensor_type for i in prepared.graph.input}
        names = list(stage.input_names)
        in_specs: list[tuple[np.dtype[Any], tuple[int, ...]]] = []
        for n in names:
            tt = declared.get(n)
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim] if tt is not None else [0]
            if tt is None or any(d <= 0 for d in dims):
                return  # free dims (profile ranges): no static probe shape
            in_specs.append((np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)), tuple(dims)))
        probe_stage(lambda xs: stage.run(dict(zip(names, xs, strict=True))), data, names, in_specs,
                    precision=_PROBE_PRECISION[precision], device=device.name)


_PROBE_PRECISION = {"fp32": "float32", "fp16": "float16", "int8": "int8"}

backend_class = TensorRtBackend
