"""CPU backend: onnxruntime's CPU execution provider, pinned to the device's cores.

Stages with static output shapes run through onnxruntime's IO binding
(:class:`~hetsched.backends.BindableStage`): inputs are bound by address where they
lie, outputs are written straight into the runtime's pool buffers.

Device options (``Device.options``):

* ``allow_spinning`` (bool): onnxruntime's intra-op spinning (default: onnxruntime's, on).
* ``force_spinning_stop`` (bool, default True): intra-op threads stop spinning as soon
  as a run returns. Spinning *during* a run keeps a stage fast; spinning *after* it
  steals the core from the next stage of a pipeline sharing these cores.
* ``graph_optimization_level`` (an ``ort.GraphOptimizationLevel``).
* ``workers`` (``1`` or ``"per-core"``): one worker running one stage at a time with
  ``len(cpus)`` intra-op threads (default), or one single-threaded worker per core,
  running that many stages (of any requests) at once: throughput over latency.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from hetsched._errors import CompileError, DeviceSpecError, StageExecutionError
from hetsched._onnxruntime import ort_session

from ._base import Backend, BackendHooks, Capabilities, CompiledStage, Device, StageHooks, TensorSpec

__all__ = ["CpuBackend", "CpuStage", "intra_op_affinities"]


def intra_op_affinities(cpus: Sequence[int]) -> str | None:
    """onnxruntime's ``session.intra_op_thread_affinities`` value for these cores.

    onnxruntime numbers processors from **1** (id N is logical CPU N-1) and wants one
    entry per intra-op thread *except* the calling thread, which it does not pin: the
    worker thread that calls ``run`` is pinned separately (to ``cpus[0]``'s set), so the
    entries cover ``cpus[1:]``, one core each, ``;``-separated.
    """
    if len(cpus) <= 1:
        return None
    return ";".join(str(c + 1) for c in cpus[1:])


_ORT_DTYPES: dict[str, np.dtype[Any]] = {
    f"tensor({k})": np.dtype(v)
    for k, v in {
        "float": np.float32, "double": np.float64, "float16": np.float16, "bool": np.bool_,
        "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
        "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    }.items()
}
"""onnxruntime tensor types that have a numpy dtype and can be bound by address."""


def _static_spec(arg: Any) -> TensorSpec | None:
    dtype = _ORT_DTYPES.get(arg.type)
    shape = arg.shape
    if dtype is None or shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        return None
    return dtype, tuple(shape)


def _declared_ranked(model: onnx.ModelProto | None) -> dict[str, bool]:
    """Per graph output of the stage model: does its declared type have a shape (a known rank)?"""
    if model is None:
        return {}
    return {o.name: o.type.WhichOneof("value") == "tensor_type" and o.type.tensor_type.HasField("shape")
            for o in model.graph.output}


def _unbound_reason(inputs: Sequence[Any], outputs: Sequence[Any], ranked: Mapping[str, bool]) -> str | None:
    """Why a stage with these onnxruntime inputs/outputs (``NodeArg``: ``name``, ``type``,
    ``shape``) cannot be IO-bound into fixed-shape buffers, or None when it can.

    ``ranked[name]`` is False for an output whose type the stage model declares without a
    shape: onnxruntime reports such an output's shape as ``[]``, the same as a scalar's, and
    binding it into a scalar buffer fails (with an error logged) on every shape it really has.
    A dimension onnxruntime reports as None or as ONNX's ``unk__N`` is known only when the
    stage runs (NonZero, TopK with k fed, a Reshape to a shape computed from values); a named
    one is a free dimension of the model's inputs.
    """
    for arg in inputs:
        if arg.type not in _ORT_DTYPES:
            return f"input {arg.name!r} has type {arg.type}, which cannot be bound by address"
    if not outputs:
        return "the stage has no outputs"
    for arg in outputs:
        if arg.type not in _ORT_DTYPES:
            return f"output {arg.name!r} has type {arg.type}, which cannot be bound by address"
        shape = arg.shape
        if shape is None or (not shape and not ranked.get(arg.name, True)):
            return f"output {arg.name!r} has a data-dependent shape (not even its rank is known before it runs)"
        for k, d in enumerate(shape):
            if isinstance(d, int) and d >= 0:
                continue
            if isinstance(d, str) and d and not d.startswith("unk__"):
                return (f"output {arg.name!r} has the free dimension {d!r} (dimension {k}); "
                        "Session(shapes=...) fixes it")
            return f"output {arg.name!r} has a data-dependent shape (dimension {k} is known only when it runs)"
    return None


class CpuStage:
    """One ``InferenceSession`` for one stage (a :class:`~hetsched.backends.BindableStage`)."""

    def __init__(self, session: ort.InferenceSession, name: str, device: Device,
                 model: onnx.ModelProto | None = None):
        """``model``: the stage model ``session`` was made from; its declared output types tell an
        output of unknown rank from a scalar (onnxruntime reports both as shape ``[]``)."""
        self._session = session
        self.name = name
        self.device = device
        inputs = session.get_inputs()
        outputs = session.get_outputs()
        self.input_names = tuple(i.name for i in inputs)
        self.output_names = tuple(o.name for o in outputs)
        self._run_options = ort.RunOptions()
        # onnxruntime's run_with_iobinding looks this key up on every call; a missing key costs
        # a C++ exception (~70 us). "0" is its default (no graph capture).
        self._run_options.add_run_config_entry("gpu_graph_id", "0")
        self._bindings = threading.local()  # per worker thread: an IOBinding and what it is bound to
        # onnxruntime's Python run_with_iobinding only adds WebGPU graph-capture bookkeeping on
        # top of this call; on the CPU EP the C++ method alone is the same run, ~15 us cheaper
        raw = getattr(getattr(session, "_sess", None), "run_with_iobinding", None)
        plain = getattr(getattr(session, "_sess", None), "run", None)
        # onnxruntime's Python run() adds graph-capture and name checks to this C++ call;
        # with WebGPU graph capture it must stay on the public path (never on the CPU EP)
        capture = getattr(getattr(session, "_sess", None), "is_webgpu_graph_capture_enabled", None)
        self._raw_plain_run = plain if callable(plain) and not (callable(capture) and capture()) else None
        self._output_list = list(self.output_names)
        probe = session.io_binding()
        self._raw_run = raw if callable(raw) and hasattr(probe, "_iobinding") else None
        self.unbound_reason: str | None = _unbound_reason(inputs, outputs, _declared_ranked(model))
        """Why :meth:`output_specs` is None (the session's ``fallback_reason``), decided at compile
        time so that a dynamic-shape stage is never bound into buffers it would not fit."""
        specs = [_static_spec(o) for o in outputs]
        self._specs: tuple[TensorSpec, ...] | None = (
            None if self.unbound_reason is not None or None in specs
            else tuple(s for s in specs if s is not None)
        )
        self.hooks = StageHooks(in_place=self, unbound_reason=self.unbound_reason)

    @property
    def session(self) -> ort.InferenceSession:
        return self._session

    def _error(self, exc: Exception) -> StageExecutionError:
        err = StageExecutionError(
            f"stage {self.name!r} failed on device {self.device.name!r}: {exc}",
            stage=self.name,
            device=self.device.name,
        )
        err.__cause__ = exc
        return err

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        try:
            raw = self._raw_plain_run
            if raw is not None and len(feeds) == len(self.input_names):
                # every input fed (the session validated names, dtypes and shapes already):
                # the C++ run alone, without the Python wrapper's re-validation of the names
                outputs: list[np.ndarray] = raw(self._output_list, feeds, self._run_options)
            else:
                outputs = self._session.run(None, dict(feeds), self._run_options)
            return outputs
        except Exception as exc:  # onnxruntime raises several unrelated types
            raise self._error(exc) from exc

    def output_specs(self) -> tuple[TensorSpec, ...] | None:
        """Static (dtype, shape) of every output, or None when some input or output cannot be
        bound by address (a sequence/map/optional/string type, or an output shape that is
        symbolic, data-dependent or of unknown rank): :attr:`unbound_reason` says which."""
        return self._specs

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run with inputs bound where they lie and outputs written into ``outputs`` (IO binding).

        Each worker thread keeps one ``IOBinding`` per stage and rebinds a name only when it is
        given another array (identity first, then address, shape and dtype): creating a binding
        and binding every tensor anew costs ~100 us per run with the caches cold after a stage,
        more than all the rest of a stage boundary. The arrays last bound stay referenced until
        the next run on that thread, so the same object always means the same memory (a pool
        block hands out one cached view; a caller's array cannot be freed and its address
        reused meanwhile).
        """
        try:
            cache = self._bindings.__dict__
            io = cache.get("io")
            if io is None:
                io = cache["io"] = self._session.io_binding()
                cache["bound"] = {}
                cache["check"] = True
            bound: dict[str, tuple[np.ndarray, int, tuple[int, ...], np.dtype[Any]]] = cache["bound"]
            names = tuple(feeds)
            if cache.get("names") != names:
                # another set of inputs (an optional one fed or not): nothing stale may stay bound
                io.clear_binding_inputs()
                for n in cache.get("names", ()):
                    bound.pop(n, None)
                cache["names"] = names
            check = cache["check"]
            for name, arr in feeds.items():
                last = bound.get(name)
                if last is not None and last[0] is arr and last[2] == arr.shape:
                    continue  # (a bound array cannot be resized: the reference held here forbids it)
                if not arr.flags.c_contiguous:
                    arr = np.ascontiguousarray(arr)  # onnxruntime reads dense memory
                ptr = arr.__array_interface__["data"][0]
                if last is None or last[1] != ptr or last[2] != arr.shape or last[3] != arr.dtype:
                    io.bind_input(name, "cpu", 0, arr.dtype, arr.shape, ptr)
                    if last is None or last[2] != arr.shape:
                        check = True
                bound[name] = (arr, ptr, arr.shape, arr.dtype)
            for name, out in zip(self.output_names, outputs, strict=False):
                last = bound.get(name)
                if last is not None and last[0] is out and last[2] == out.shape:
                    continue
                ptr = out.__array_interface__["data"][0]
                if last is None or last[1] != ptr or last[2] != out.shape or last[3] != out.dtype:
                    io.bind_output(name, "cpu", 0, out.dtype, out.shape, ptr)
                bound[name] = (out, ptr, out.shape, out.dtype)
            raw = self._raw_run
            if raw is not None:
                raw(io._iobinding, self._run_options)  # what run_with_iobinding does on the CPU EP
            else:
                self._session.run_with_iobinding(io, self._run_options)
            # Shape inference can be wrong where onnxruntime is right (and onnxruntime writes
            # into a bound buffer of the same size without complaint): check the shapes it
            # produced on the first run and whenever an input's shape changed.
            if check:
                for name, out, value in zip(self.output_names, outputs, io.get_outputs(), strict=False):
                    if tuple(value.shape()) != out.shape:
                        raise ValueError(f"output {name!r} has shape {value.shape()}, not the inferred "
                                         f"{list(out.shape)}")
                cache["check"] = False
        except Exception as exc:
            self._bindings.__dict__.clear()  # start from a fresh binding next time
            raise self._error(exc) from exc

    def close(self) -> None:
        # InferenceSession has no close(); dropping the reference frees it.
        self._session = None


class CpuBackend:
    """onnxruntime CPU EP. Options (``Device.options``): ``allow_spinning`` (bool),
    ``graph_optimization_level`` (an ``ort.GraphOptimizationLevel``)."""

    name = "cpu"

    def __init__(self) -> None:
        self.hooks = BackendHooks(workers=self)

    def capabilities(self, device: Device) -> Capabilities:
        # The CPU EP implements (nearly) every standard op; what it lacks fails at compile
        # time with a CompileError naming the stage, exactly as bare onnxruntime would fail.
        return Capabilities.everything()

    def worker_cpus(self, device: Device) -> list[tuple[int, ...]]:
        """The cores each worker thread of ``device`` is pinned to (see the ``workers`` option).

        :raises DeviceSpecError: ``workers`` is neither 1 nor ``"per-core"``.
        """
        workers = device.options.get("workers", 1)
        if workers == 1:
            return [tuple(device.cpus)]
        if workers == "per-core" or workers == len(device.cpus):
            return [(c,) for c in device.cpus] or [()]
        raise DeviceSpecError(f"device {device.name!r}: option workers={workers!r} must be 1 or 'per-core'")

    def session_options(self, device: Device) -> ort.SessionOptions:
        so = ort.SessionOptions()
        per_core = len(self.worker_cpus(device)) > 1
        threads = 1 if per_core else max(1, len(device.cpus))
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        aff = None if per_core else intra_op_affinities(device.cpus)
        if aff is not None:
            so.add_session_config_entry("session.intra_op_thread_affinities", aff)
        spinning = device.options.get("allow_spinning")
        if spinning is not None:
            so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        if threads > 1 and device.options.get("force_spinning_stop", True):
            so.add_session_config_entry("session.force_spinning_stop", "1")
        level = device.options.get("graph_optimization_level")
        if level is not None:
            so.graph_optimization_level = level
        so.log_severity_level = 3
        return so

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        try:
            session = ort_session(
                model.SerializeToString(),
                sess_options=self.session_options(device),
                providers=["CPUExecutionProvider"],
            )
        except Exception as exc:
            raise CompileError(f"onnxruntime could not compile stage {name!r} for {device.name!r}: {exc}") from exc
        return CpuStage(session, name, device, model)


backend_class: type[Any] = CpuBackend
_check: type[Backend] = CpuBackend  # static check that CpuBackend satisfies the protocol
