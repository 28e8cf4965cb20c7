"""``ort-gpu`` backend: onnxruntime's TensorRT and CUDA execution providers (onnxruntime-gpu).

An alternative to the native ``tensorrt`` backend for users who prefer onnxruntime: each stage
becomes one ``InferenceSession`` with the providers ``[("TensorrtExecutionProvider", {...}),
("CUDAExecutionProvider", {...})]``. The TensorRT EP takes the subgraphs TensorRT supports, the
CUDA EP the rest. The session option ``session.disable_cpu_ep_fallback = "1"`` is always set: by
default onnxruntime-gpu on a host where the GPU providers cannot run says so in a warning and
silently runs the whole stage on the CPU (accelerators reference §3, measured); with the option
session creation fails, and :func:`fallback_error` turns that failure into a
:class:`~hetsched.CompileError` naming the stage, its operators and the providers.

Nothing in this project's CI has run this backend on a GPU: it follows onnxruntime's documented
TensorRT / CUDA EP options (https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html,
https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html) and is tested without one.

Device options (``Device.options``, set by the resolver for ``gpu:ort`` / ``dla:N:ort``):

* ``device_id`` (int, default 0): the CUDA device.
* ``dla_core`` (int): run on that DLA core (``trt_dla_enable``, ``trt_dla_core``); a device of
  kind ``dla`` without it uses core 0. Layers the DLA cannot take fall back to the GPU.
* ``precision`` (``"fp32"``, ``"fp16"``, ``"int8"``; default fp32 on the GPU, fp16 on a DLA,
  which has no fp32). ``int8`` needs a model with Q/DQ nodes or a calibration table.

Engines are cached (``trt_engine_cache_enable``) under :func:`default_cache_dir`, one folder per
GPU or DLA core and precision: onnxruntime's engine file names do not include the DLA core, and
its TensorRT EP deserializes a cached engine without setting the DLA core, so a cached DLA
engine always runs on core 0 (microsoft/onnxruntime#26680); the native ``tensorrt`` backend
sets ``runtime.DLA_core`` and is the one to use for ``dla:1``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from hetsched._errors import BackendUnavailableError, CompileError, DeviceSpecError
from hetsched._onnxruntime import ort_session

from ._base import Backend, BackendHooks, Capabilities, CompiledStage, Device
from .cpu import CpuStage

__all__ = [
    "CUDA_EP",
    "INSTALL_HINT",
    "PRECISIONS",
    "TRT_EP",
    "OrtGpuBackend",
    "OrtGpuStatistics",
    "default_cache_dir",
    "device_precision",
    "fallback_error",
    "is_fallback_disabled_error",
    "provider_options",
]

TRT_EP = "TensorrtExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
PRECISIONS = ("fp32", "fp16", "int8")

INSTALL_HINT = (
    "pip install 'hetsched[ort-gpu]' (onnxruntime-gpu; it replaces the CPU-only onnxruntime module). "
    "PyPI has no aarch64 onnxruntime-gpu wheel: on Jetson install the wheel for your JetPack from "
    "NVIDIA's Jetson Zoo / JetPack index (https://elinux.org/Jetson_Zoo#ONNX_Runtime)"
)

# onnxruntime's InferenceSession (inference_session.cc) when nodes are left for the CPU EP and
# session.disable_cpu_ep_fallback is "1"; raised in Python as
# "[ONNXRuntimeError] : 1 : FAIL : This session contains graph nodes ...".
_FALLBACK_RE = re.compile(r"assigned to the default CPU EP, but fallback to CPU EP has been explicitly disabled")
_MAX_OPS_NAMED = 12


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hetsched/ort-trt-engines`` (``~/.cache/...`` when XDG_CACHE_HOME is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hetsched" / "ort-trt-engines"


def _int_option(device: Device, key: str, default: int | None) -> int | None:
    value = device.options.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeviceSpecError(f"device {device.name!r}: option {key}={value!r} must be a non-negative int")
    return value


def _dla_core(device: Device) -> int | None:
    return _int_option(device, "dla_core", 0 if device.kind == "dla" else None)


def device_precision(device: Device) -> str:
    """The device's ``precision`` option (default fp16 on a DLA core, fp32 elsewhere)."""
    return str(device.options.get("precision", "fp16" if _dla_core(device) is not None else "fp32"))


def provider_options(device: Device, precision: str, cache_dir: str | os.PathLike[str]) -> list[tuple[str, dict[str, Any]]]:
    """The ``providers`` argument of ``InferenceSession`` for ``device``: TensorRT EP first, then CUDA EP.

    Engine and timing caches are on, in ``cache_dir/<gpuN|dlaN>-<precision>`` (onnxruntime creates
    the folder). Values are of the types onnxruntime's documentation shows (ints, bools, strings).

    :raises DeviceSpecError: ``precision`` is not one of :data:`PRECISIONS`, is fp32 on a DLA core
        (the DLA runs fp16 and int8 only), or ``device_id`` / ``dla_core`` is not a non-negative int.
    """
    if precision not in PRECISIONS:
        raise DeviceSpecError(f"device {device.name!r}: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    device_id = _int_option(device, "device_id", 0)
    dla = _dla_core(device)
    if dla is not None and precision == "fp32":
        raise DeviceSpecError(f"device {device.name!r}: a DLA core runs fp16 or int8 only, not fp32 "
                              "(set the device option precision='fp16')")
    target = f"dla{dla}" if dla is not None else f"gpu{device_id}"
    trt: dict[str, Any] = {
        "device_id": device_id,
        "trt_fp16_enable": precision in ("fp16", "int8"),  # int8 with fp16 for the layers int8 cannot take
        "trt_int8_enable": precision == "int8",
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(Path(cache_dir) / f"{target}-{precision}"),
        "trt_timing_cache_enable": True,
    }
    if dla is not None:
        trt["trt_dla_enable"] = True
        trt["trt_dla_core"] = dla
    return [(TRT_EP, trt), (CUDA_EP, {"device_id": device_id})]


def is_fallback_disabled_error(message: str) -> bool:
    """True when ``message`` is onnxruntime's refusal to leave nodes to the CPU EP with fallback disabled."""
    return _FALLBACK_RE.search(message) is not None


def fallback_error(message: str, *, stage: str, device: Device, model: onnx.ModelProto | None,
                   providers: Sequence[str]) -> CompileError | None:
    """A clear :class:`~hetsched.CompileError` for onnxruntime's fallback-disabled failure ``message``
    (None when ``message`` is another error). onnxruntime names no node, so the stage's operators
    are listed: some of them neither GPU provider took (an op they lack, or no usable GPU)."""
    if not is_fallback_disabled_error(message):
        return None
    ops: list[str] = []
    if model is not None:
        for node in model.graph.node:
            op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            if op not in ops:
                ops.append(op)
    named = ", ".join(ops[:_MAX_OPS_NAMED]) + (f" and {len(ops) - _MAX_OPS_NAMED} more" if len(ops) > _MAX_OPS_NAMED else "")
    return CompileError(
        f"stage {stage!r} on {device.name!r}: onnxruntime could place some of its nodes only on the CPU, and "
        f"hetsched disables that silent fallback: neither {' nor '.join(providers)} took them (a GPU they can "
        f"use is missing, or an operator they lack); the stage's operators: {named or 'none'}. Put the stage on "
        f"a CPU device or the 'tensorrt' backend. onnxruntime said: {message}"
    )


@dataclass(frozen=True)
class OrtGpuStatistics:
    """Counters of one :class:`OrtGpuBackend`."""

    compiled: int
    """Stages compiled into a GPU session."""
    fallback_refusals: int
    """Compiles refused because nodes would have run on the CPU."""


class OrtGpuBackend:
    """onnxruntime with the TensorRT and CUDA EPs (see the module docstring for device options).

    :param available_providers: what lists onnxruntime's providers (default
        ``onnxruntime.get_available_providers``; injected by tests).
    :param cache_dir: the engine cache's folder (default :func:`default_cache_dir`).
    """

    name = "ort-gpu"

    def __init__(self, *, available_providers: Callable[[], Sequence[str]] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.hooks = BackendHooks(workers=self)
        self._available = available_providers
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._lock = threading.Lock()
        self._compiled = 0
        self._refused = 0

    @property
    def cache_dir(self) -> Path:
        return self._cache_dir if self._cache_dir is not None else default_cache_dir()

    def capabilities(self, device: Device) -> Capabilities:
        # The CUDA EP takes what the TensorRT EP leaves; what neither takes fails the compile
        # with fallback_error naming the stage, instead of being guessed here.
        return Capabilities.everything()

    def worker_cpus(self, device: Device) -> list[tuple[int, ...]]:
        """One worker thread per GPU / DLA device, not pinned (the GPU does the work)."""
        return [tuple(device.cpus)]

    def providers(self, device: Device) -> list[tuple[str, dict[str, Any]]]:
        """The providers ``compile`` passes for ``device`` (those onnxruntime has).

        :raises BackendUnavailableError: onnxruntime lacks the GPU providers (the message says
            what to install), or lacks the TensorRT EP that a DLA core needs.
        :raises DeviceSpecError: see :func:`provider_options`.
        """
        wanted = provider_options(device, device_precision(device), self.cache_dir)
        available = set(self._available() if self._available is not None else _ort().get_available_providers())
        got = [p for p in wanted if p[0] in available]
        if not got:
            raise BackendUnavailableError(
                f"the ort-gpu backend needs onnxruntime's {TRT_EP} or {CUDA_EP}; this onnxruntime has "
                f"{', '.join(sorted(available)) or 'none'}: {INSTALL_HINT}"
            )
        if _dla_core(device) is not None and got[0][0] != TRT_EP:
            raise BackendUnavailableError(f"device {device.name!r}: a DLA core needs onnxruntime's {TRT_EP}, "
                                          f"which this onnxruntime lacks: {INSTALL_HINT}")
        return got

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        """One GPU ``InferenceSession`` for the stage.

        :raises BackendUnavailableError: see :meth:`providers`.
        :raises CompileError: onnxruntime refused the stage, or would have run nodes of it on the
            CPU (the message lists the stage's operators and the providers).
        """
        providers = self.providers(device)
        ort = _ort()
        so = ort.SessionOptions()
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.log_severity_level = 3
        names = [p[0] for p in providers]
        try:
            session = ort_session(model.SerializeToString(), sess_options=so, providers=providers)
        except Exception as exc:  # onnxruntime raises several unrelated types
            translated = fallback_error(str(exc), stage=name, device=device, model=model, providers=names)
            with self._lock:
                self._refused += translated is not None
            if translated is not None:
                raise translated from exc
            raise CompileError(f"onnxruntime could not compile stage {name!r} for {device.name!r} with "
                               f"{', '.join(names)}: {exc}") from exc
        with self._lock:
            self._compiled += 1
        return CpuStage(session, name, device, model)

    def statistics(self) -> OrtGpuStatistics:
        with self._lock:
            return OrtGpuStatistics(compiled=self._compiled, fallback_refusals=self._refused)


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


backend_class: type[Any] = OrtGpuBackend
_check: type[Backend] = OrtGpuBackend  # static check that OrtGpuBackend satisfies the protocol
