"""ncnn backend: stages on a GPU through Tencent's ncnn over Vulkan (the RK3588's Mali-G610).

``compile`` prepares the stage (``hetsched._rknn.prepare``: opset raised to 13, Dropout/Identity
folded, static shapes from the plan), refuses up front what pnnx converts wrongly without saying
so (:func:`~hetsched.backends._ncnn_convert.silent_failure`: batch other than 1, non-float32
tensors, AveragePool with asymmetric pads, Softmax at opset < 13 on rank > 2), looks the stage up
in the content-verified cache (:mod:`hetsched.backends._ncnn_cache`), converts it with pnnx where
the cache has nothing, loads it into an ``ncnn.Net`` with Vulkan compute on the device's Vulkan
device, and **probes** it through the contract every accelerator stage goes through
(:func:`backends._probe.probe_stage`): the stage runs on seeded random inputs and is compared with fp32
onnxruntime (output count, shapes, cosine); below :data:`~hetsched.backends._ncnn_convert.COSINE_FLOOR` (per precision) it is
refused with the figures, as pnnx's and ncnn's own failures are (pnnx's last lines, the layers it
left unconverted). Refusals are cached too; the session's planner then re-plans without the
refused units (capabilities by trying, as for the NPU).

Inputs and outputs map by position (ONNX input ``i`` is ncnn's ``in{i}``, output ``j`` is
``out{j}``). Inputs wrap the caller's (pool) memory in an ``ncnn.Mat`` without a host copy when
they are C-contiguous float32 and already in ncnn's layout (one channel a multiple of 16 bytes;
else one copy into ncnn's layout, counted); ncnn uploads them to the device. Each output is
copied once from ncnn's Mat into the pool buffer the runtime gives (counted).

pnnx infers which axis is the batch from the ops it sees; a stage whose first ops do not fix it
(a Concat or Softmax over the raw inputs, no Conv before them) gets its axes off by one and is
refused by the probe (measured on squeezenet partitions), then placed elsewhere.

Device options: ``precision`` (``"fp32"``, the default, or ``"fp16"``: ncnn's fp16 storage and
arithmetic where the device has them), ``vulkan_device`` (ncnn's GPU index; default ncnn's
default device), ``shapes`` (fixed free dims), ``cache_dir``, ``num_threads``. On a twin root
(``profile_domain`` in the options) ncnn computes on this host's Vulkan device (lavapipe in CI)
and the twin models the Mali's time, power and heat, as for the NPU with Rockchip's simulator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from hetsched._errors import BackendUnavailableError, CompileError, DeviceSpecError, StageExecutionError
from hetsched._planning.fold import restore_control_flow_dims
from hetsched._rknn.accuracy import StageAccuracy, random_samples
from hetsched._rknn.prepare import io_specs, prepare_stage

from ._base import BackendHooks, Capabilities, CompiledStage, Device, StageHooks, TensorSpec
from ._ncnn_cache import CacheStatistics, NcnnCache, NcnnEntry, default_cache_dir, stage_key
from ._ncnn_convert import (
    COSINE_FLOOR,
    NCNN_OPS,
    VulkanInfo,
    convert,
    import_ncnn,
    ncnn_unavailable_reason,
    silent_failure,
    versions,
    vulkan_devices,
)
from ._probe import ProbeConfig, probe_stage
from .sim import SimStage

__all__ = [
    "NCNN_PROBE",
    "PROBE_SAMPLES",
    "NcnnBackend",
    "NcnnBackendStatistics",
    "NcnnStage",
    "NcnnStageStatistics",
    "ncnn_capabilities",
    "ncnn_unavailable_reason",
    "vulkan_devices",
]

PROBE_SAMPLES = 2
"""Seeded random samples each converted stage runs at compile time against onnxruntime."""

_PROBE_PRECISION = {"fp32": "float32", "fp16": "float16"}
NCNN_PROBE = ProbeConfig(min_cosine={_PROBE_PRECISION[k]: v for k, v in COSINE_FLOOR.items()})
"""The probe contract's floors for ncnn stages: :data:`~hetsched.backends._ncnn_convert.COSINE_FLOOR`
(stricter than the NPU's: ncnn computes in the precision asked for, pnnx's silent mistakes are
what the probe must catch)."""

_PRECISIONS = ("fp32", "fp16")
_FP16_OPTS = ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic", "use_bf16_storage", "use_bf16_packed")


def ncnn_capabilities() -> Capabilities:
    """First guess of what ncnn runs (float tensors); the compile-time probe decides per stage."""
    return Capabilities.ops(NCNN_OPS, dtypes=[onnx.TensorProto.FLOAT])


@dataclass(frozen=True)
class NcnnStageStatistics:
    runs: int
    run_seconds: float
    """Wall time inside ncnn (upload, compute, download), all runs."""
    cached: bool
    """Whether the converted stage came from the cache (no pnnx run)."""
    cache_key: str
    precision: str
    vulkan_device: str
    accuracy: StageAccuracy | None
    """The compile-time probe against fp32 onnxruntime."""
    input_copies: int
    """Inputs copied before ncnn read them (not C-contiguous float32); the others were wrapped in place."""
    output_copies: int
    """Outputs copied from ncnn's Mat into the caller's (pool) memory: one per output per run."""


@dataclass(frozen=True)
class NcnnBackendStatistics:
    cache: CacheStatistics
    probes: int
    """Converted stages run against onnxruntime at compile time."""
    refused: int
    """Stages refused (screened, pnnx/ncnn failures, probe below the floor), cached refusals included."""


class NcnnStage:
    """A stage converted by pnnx, run by ncnn on a Vulkan device (a :class:`~hetsched.backends.BindableStage`)."""

    def __init__(self, name: str, device: Device, net: Any, ncnn: Any, specs: tuple[list[str], list[TensorSpec],
                 list[str], list[TensorSpec]], *, weights: bytes, cached: bool, key: str, precision: str,
                 vulkan: VulkanInfo):
        self.name = name
        self.device = device
        in_names, self._in_specs, out_names, self._out_specs = specs
        self.input_names = tuple(in_names)
        self.output_names = tuple(out_names)
        self._net: Any = net
        self._ncnn = ncnn
        self._weights = weights  # ncnn's load_model_mem may reference these bytes: kept alive with the net
        self._ncnn_in = [f"in{i}" for i in range(len(in_names))]
        self._ncnn_out = [f"out{i}" for i in range(len(out_names))]
        self._lock = threading.Lock()
        self._runs = 0
        self._seconds = 0.0
        self._in_copies = 0
        self._out_copies = 0
        self._cached = cached
        self._key = key
        self.precision = precision
        self.vulkan = vulkan
        self.accuracy: StageAccuracy | None = None
        self.hooks = StageHooks(in_place=self, compile_cache=self, accuracy=self, statistics=self)

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self._out_specs)

    def io_specs(self) -> tuple[tuple[str, TensorSpec], ...]:
        return tuple(zip(self.input_names + self.output_names, self._in_specs + self._out_specs, strict=True))

    def _error(self, exc: BaseException) -> StageExecutionError:
        err = StageExecutionError(f"stage {self.name!r} failed on device {self.device.name!r} (ncnn): {exc}",
                                  stage=self.name, device=self.device.name)
        err.__cause__ = exc
        return err

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        outputs = [np.empty(shape, dtype) for dtype, shape in self._out_specs]
        self.run_into(feeds, outputs)
        return outputs

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray], state: object = None) -> None:
        ncnn = self._ncnn
        copies = 0
        try:
            with self._lock:
                net = self._net
                if net is None:
                    raise RuntimeError("the stage is closed")
                held = []
                for name, (_dtype, shape) in zip(self.input_names, self._in_specs, strict=True):
                    arr = feeds[name]
                    if tuple(arr.shape) != shape:
                        raise ValueError(f"input {name!r} has shape {list(arr.shape)}; the converted stage takes "
                                         f"{list(shape)}")
                    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
                        arr = np.ascontiguousarray(arr, dtype=np.float32)
                        copies += 1
                    held.append(arr.reshape(shape[1:]) if len(shape) > 1 else arr)  # a view: ncnn has no batch axis
                t0 = time.perf_counter()
                ex = net.create_extractor()
                try:
                    for blob, arr in zip(self._ncnn_in, held, strict=True):
                        mat = ncnn.Mat(arr)  # wraps arr's memory
                        if not _aligned(arr.shape):
                            # ncnn's layers read channels at cstep = w*h*(d) rounded up to 16 bytes; a wrapped
                            # array's channels lie packed: one copy into ncnn's own layout
                            mat = mat.clone()
                            copies += 1
                        if ex.input(blob, mat) != 0:
                            raise RuntimeError(f"ncnn refused input {blob}")
                    for blob, dst in zip(self._ncnn_out, outputs, strict=True):
                        ret, mat = ex.extract(blob)
                        if ret != 0:
                            raise RuntimeError(f"ncnn extract({blob}) returned {ret}")
                        src = np.asarray(mat)  # ncnn's layout (channel stride cstep): a view
                        if src.size != dst.size:
                            raise ValueError(f"output {blob} has {src.size} elements from ncnn (shape "
                                             f"{list(src.shape)}); the stage's ONNX output is {list(dst.shape)}")
                        np.copyto(dst.reshape(src.shape), src, casting="same_kind")  # the one copy
                finally:
                    del ex
                dt = time.perf_counter() - t0
                self._runs += 1
                self._seconds += dt
                self._in_copies += copies
                self._out_copies += len(outputs)
        except StageExecutionError:
            raise
        except Exception as exc:  # ncnn's and numpy's errors alike fail this run only
            raise self._error(exc) from exc

    def statistics(self) -> NcnnStageStatistics:
        with self._lock:
            return NcnnStageStatistics(self._runs, self._seconds, self._cached, self._key, self.precision,
                                       self.vulkan.name, self.accuracy, self._in_copies, self._out_copies)

    def close(self) -> None:
        with self._lock:
            net, self._net = self._net, None
        if net is not None:
            net.clear()


class _TwinNcnnStage(SimStage):
    """An :class:`NcnnStage` on a twin device: ncnn computes on the host's Vulkan device, the twin
    models the Mali's time and energy."""

    def __init__(self, inner: NcnnStage, name: str, device: Device, flops: float, nbytes: float):
        super().__init__(inner, name, device, flops, nbytes)
        self.ncnn = inner

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return self.ncnn.output_specs()

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        # one run in flight on the shared twin board (the twin's GPU shared between sessions)
        return self._timed(lambda: self.ncnn.run(feeds))

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Any, state: object = None) -> None:
        self._timed(lambda: self.ncnn.run_into(feeds, outputs))


def _aligned(shape: tuple[int, ...]) -> bool:
    """Whether a C-contiguous float32 array of this (batch-less) shape has ncnn's own layout: up to
    2-D always; 3-D (c, h, w) and 4-D (c, d, h, w) when one channel is a multiple of 16 bytes."""
    return len(shape) <= 2 or (int(np.prod(shape[1:])) * 4) % 16 == 0


def _costs(model: onnx.ModelProto) -> tuple[float, float]:
    from hetsched._planning.costs import analytic_node_costs
    from hetsched._planning.graph import GraphIndex

    costs = analytic_node_costs(GraphIndex(model))
    return sum(c.flops for c in costs), sum(c.bytes for c in costs)


class NcnnBackend:
    """GPU stages through ncnn over Vulkan (``Device.backend == "ncnn"``); see the module docstring."""

    name = "ncnn"
    slow_compile = True
    """A first compile converts with pnnx and builds Vulkan pipelines: seconds."""

    def __init__(self) -> None:
        self.hooks = BackendHooks(slow_compile=self.slow_compile)
        self._lock = threading.Lock()
        self._caches: dict[str, NcnnCache] = {}
        self._probes = 0
        self._refused = 0

    def capabilities(self, device: Device) -> Capabilities:
        return ncnn_capabilities()

    def _cache(self, device: Device) -> NcnnCache:
        directory = default_cache_dir(device.options)
        with self._lock:
            cache = self._caches.get(str(directory))
            if cache is None:
                cache = self._caches[str(directory)] = NcnnCache(directory)
            return cache

    def statistics(self) -> NcnnBackendStatistics:
        with self._lock:
            stats = [c.statistics() for c in self._caches.values()]
            probes, refused = self._probes, self._refused
        total = CacheStatistics(sum(s.conversions for s in stats), sum(s.cache_hits for s in stats),
                                    sum(s.refusals_cached for s in stats), sum(s.seconds for s in stats),
                                    sum(s.rejected for s in stats))
        return NcnnBackendStatistics(total, probes, refused)

    def _refuse(self, device: Device, message: str) -> CompileError:
        with self._lock:
            self._refused += 1
        return CompileError(f"{device}: ncnn: {message}")

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        """Prepare, screen, look up or convert, load and probe the stage (see the module docstring).

        :raises CompileError: the stage is one pnnx converts wrongly, pnnx or ncnn failed, or the
            probe disagreed with onnxruntime (now or in the cached verdict).
        :raises BackendUnavailableError: ncnn, pnnx or a Vulkan device is missing.
        :raises DeviceSpecError: a bad ``precision`` or ``vulkan_device`` option.
        """
        opts = device.options
        precision = str(opts.get("precision", "fp32"))
        if precision not in _PRECISIONS:
            raise DeviceSpecError(f"device {device.name!r}: precision={precision!r} must be 'fp32' or 'fp16'")
        ncnn = import_ncnn()
        vk = self._vulkan(device)
        try:
            # the fixed dims a control-flow stage declares free for onnxruntime: the converter needs them
            prepared = prepare_stage(restore_control_flow_dims(model), opts.get("shapes"))
        except CompileError as exc:
            raise self._refuse(device, str(exc)) from exc
        reason = silent_failure(prepared)
        if reason is not None:
            raise self._refuse(device, f"{reason} (refused before conversion: pnnx would convert it wrongly "
                                       "without an error)")
        data = prepared.SerializeToString()
        specs = io_specs(prepared)
        pnnx_version, ncnn_version = versions()
        key = stage_key(data, pnnx_version=pnnx_version, ncnn_version=ncnn_version, precision=precision)
        cache = self._cache(device)
        entry = cache.lookup(key)
        if entry is not None and not entry.ok:
            raise self._refuse(device, entry.message)
        cached = entry is not None
        if entry is None:
            try:
                conv = convert(data, [s for _dt, s in specs[1]], fp16=precision == "fp16")
            except CompileError as exc:
                cache.store(key, NcnnEntry(False, str(exc), 0.0))
                raise self._refuse(device, str(exc)) from exc
            entry = NcnnEntry(True, conv.log_tail, conv.seconds, conv.param, conv.bin)
        net = self._load(ncnn, entry, vk.index, precision, opts)
        if isinstance(net, str):
            cache.store(key, NcnnEntry(False, net, entry.seconds))
            raise self._refuse(device, net)
        stage = NcnnStage(name, device, net, ncnn, specs, weights=entry.bin, cached=cached, key=key,
                          precision=precision, vulkan=vk)
        try:
            try:
                stage.accuracy = self._probe(stage, data, entry, vk)
            except CompileError as exc:
                msg = str(exc).removeprefix(f"{device.name}: ")
                if not cached:
                    cache.store(key, NcnnEntry(False, msg, entry.seconds))
                raise self._refuse(device, msg) from exc
            if not cached or entry.accuracy is None:
                cache.store(key, NcnnEntry(True, entry.message, entry.seconds, entry.param, entry.bin,
                                           {**stage.accuracy.to_json(), "source": stage.accuracy.source,
                                            "vulkan_device": vk.name}), conversion=not cached)
        except BaseException:
            stage.close()
            raise
        if "profile_domain" in opts:
            flops, nbytes = _costs(prepared)
            return _TwinNcnnStage(stage, name, device, flops, nbytes)
        return stage

    @staticmethod
    def _vulkan(device: Device) -> VulkanInfo:
        devs = vulkan_devices()
        if not devs:
            raise BackendUnavailableError(f"device {device.name!r}: {ncnn_unavailable_reason() or 'no Vulkan device'}")
        index = device.options.get("vulkan_device")
        if index is None:
            index = int(import_ncnn().get_default_gpu_index())
        if not isinstance(index, int) or not 0 <= index < len(devs):
            raise DeviceSpecError(f"device {device.name!r}: vulkan_device={index!r}; ncnn finds "
                                  f"{len(devs)} Vulkan device(s): {', '.join(d.describe() for d in devs)}")
        return devs[index]

    @staticmethod
    def _load(ncnn: Any, entry: NcnnEntry, index: int, precision: str, opts: Mapping[str, Any]) -> Any:
        """An ``ncnn.Net`` with the stage loaded for Vulkan device ``index``, or ncnn's refusal (a str)."""
        net = ncnn.Net()
        net.opt.use_vulkan_compute = True
        net.opt.num_threads = int(opts.get("num_threads", 1))
        if precision == "fp32":
            for k in _FP16_OPTS:
                setattr(net.opt, k, False)
        net.set_vulkan_device(index)
        try:
            ret = net.load_param_mem(entry.param.decode("utf-8", errors="replace"))
            if ret != 0:
                net.clear()
                hint = "\n".join(ln for ln in entry.message.splitlines() if ln.startswith(("ignore ", "todo ")))
                return (f"ncnn could not load pnnx's graph (load_param returned {ret}); a layer pnnx left "
                        f"unconverted or unknown to ncnn{': ' + hint if hint else ''}")
            net.load_model_mem(entry.bin)
        except Exception as exc:  # ncnn's bindings raise plain RuntimeErrors
            net.clear()
            return f"ncnn could not load the converted stage: {exc}"
        return net

    def _probe(self, stage: NcnnStage, data: bytes, entry: NcnnEntry, vk: VulkanInfo) -> StageAccuracy:
        """The stage proves itself (:func:`backends._probe.probe_stage`, the contract every
        accelerator stage goes through): :data:`PROBE_SAMPLES` seeded random samples against fp32
        onnxruntime at ncnn's floors (:data:`NCNN_PROBE`); onnxruntime must run the stage (pnnx
        can convert wrongly without an error, so no reference is no verdict). The cached figures
        stand when they were measured on this Vulkan device (the cache entry is content-verified).

        :raises CompileError: ncnn failed to run it, it disagreed, or there is no reference.
        """
        acc = entry.accuracy
        if acc is not None and acc.get("vulkan_device") == vk.name:
            stored = StageAccuracy.from_json(acc)
            if stored is not None:
                return stored
        with self._lock:
            self._probes += 1
        in_specs = [spec for _n, spec in stage.io_specs()[: len(stage.input_names)]]
        names = list(stage.input_names)
        res = probe_stage(lambda xs: stage.run(dict(zip(names, xs, strict=True))), data, names, in_specs,
                          precision=_PROBE_PRECISION[stage.precision], device=stage.device.name,
                          samples=random_samples(in_specs, PROBE_SAMPLES), require_reference=True, config=NCNN_PROBE)
        return StageAccuracy(res.min_cosine, res.max_rel_error, res.samples, "random")


backend_class = NcnnBackend
