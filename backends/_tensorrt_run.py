"""Running a TensorRT engine: one execution context and one CUDA stream per device worker thread.

Written against the documented APIs only; nothing in this project's CI has run it on a GPU.

* TensorRT (NVIDIA/TensorRT ``samples/python/common_runtime.py``): ``trt.Runtime``,
  ``runtime.DLA_core = n`` **before** ``deserialize_cuda_engine`` (the core an engine runs on is
  fixed when it is deserialized), ``engine.create_execution_context()``,
  ``context.set_input_shape``, ``context.set_tensor_address``, ``context.execute_async_v3(stream)``.
* CUDA through cuda-python (``cuda.bindings.runtime``, ``cuda.cudart`` before 12.8; each call
  returns ``(cudaError_t, *values)``): ``cudaStreamCreate``, ``cudaMallocHost``,
  ``cudaHostGetDevicePointer``, ``cudaMalloc``, ``cudaMemcpyAsync``, ``cudaStreamSynchronize``
  (CUDA Runtime API, https://docs.nvidia.com/cuda/cuda-runtime-api/).

Memory: on an integrated GPU (Jetson: ``cudaDeviceProp.integrated``; CPU and GPU share DRAM) each
tensor lives in pinned host memory that the GPU addresses directly (``cudaMallocHost`` then
``cudaHostGetDevicePointer``): no host<->device copies, only the copy between the caller's arrays
and those pinned buffers. The runtime's pool buffers (memfd-backed) are not handed to the GPU
as they are: making them GPU-addressable would need ``cudaHostRegister`` on each, which the
reference this backend follows does not cover, so it is left out. On a discrete GPU tensors
live in ``cudaMalloc`` memory, copied with ``cudaMemcpyAsync`` through pinned staging buffers on
the worker's stream.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CudaError", "EngineHandle", "GpuInfo", "WorkerContext", "cuda_call", "device_lost", "gpu_info",
           "load_cudart"]

# CUDA Runtime API, enum cudaError: after these the CUDA context is unusable ("the process must be
# terminated and relaunched") or there is no device to use; any other error is about one call.
_DEVICE_LOST = frozenset({
    "cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorHardwareStackError",
    "cudaErrorIllegalInstruction", "cudaErrorMisalignedAddress", "cudaErrorInvalidAddressSpace",
    "cudaErrorInvalidPc", "cudaErrorECCUncorrectable", "cudaErrorNoDevice", "cudaErrorDevicesUnavailable",
    "cudaErrorInsufficientDriver", "cudaErrorSystemNotReady", "cudaErrorCudartUnloading",
})


class CudaError(RuntimeError):
    """A cuda-python call returned an error; ``name`` is its ``cudaError_t`` name."""

    def __init__(self, call: str, name: str) -> None:
        super().__init__(f"{call} failed: {name}")
        self.call = call
        self.name = name


def device_lost(name: str) -> bool:
    """Whether the CUDA error ``name`` means the device (or its context) is gone, not just this run."""
    return name in _DEVICE_LOST


def load_cudart() -> Any:
    """cuda-python's runtime module (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.8).

    :raises ImportError: cuda-python is not installed.
    """
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found]
    except ImportError:
        from cuda import cudart as runtime  # type: ignore[import-not-found]
    return runtime


def cuda_call(cudart: Any, result: Any, call: str) -> Any:
    """The value(s) of a cuda-python call's ``(err, *values)``; None, one value, or a tuple.

    :raises CudaError: ``err`` is not ``cudaSuccess``.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", None) or str(err)
        raise CudaError(call, str(name))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class GpuInfo:
    """What the engine cache key needs to know of a GPU, and how its memory is shared."""

    name: str
    compute_capability: tuple[int, int]
    cuda_version: int
    """``cudaRuntimeGetVersion`` (1000 * major + 10 * minor)."""
    driver_version: int
    """``cudaDriverGetVersion``."""
    integrated: bool
    """An integrated GPU sharing DRAM with the CPU (Jetson)."""


def gpu_info(cudart: Any, device_id: int) -> GpuInfo:
    """Ask CUDA about GPU ``device_id``.

    :raises CudaError: CUDA cannot answer (no driver, no device, ...).
    """
    count = cuda_call(cudart, cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
    if not 0 <= device_id < int(count):
        raise CudaError(f"cudaGetDeviceProperties({device_id})", f"no such GPU ({count} found)")
    props = cuda_call(cudart, cudart.cudaGetDeviceProperties(device_id), "cudaGetDeviceProperties")
    raw = props.name
    name = raw.split(b"\0")[0].decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return GpuInfo(name, (int(props.major), int(props.minor)),
                   int(cuda_call(cudart, cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")),
                   int(cuda_call(cudart, cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")),
                   bool(props.integrated))


class EngineHandle:
    """A runtime and the engine deserialized by it (shared by a stage's worker contexts)."""

    def __init__(self, trt: Any, logger: Any, blob: bytes, dla_core: int | None) -> None:
        self.trt = trt
        self.runtime = trt.Runtime(logger)
        if dla_core is not None:
            self.runtime.DLA_core = dla_core  # must precede deserialization
        self.engine = self.runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise RuntimeError("deserialize_cuda_engine returned None (an engine from another TensorRT version "
                               "or GPU?)")
        names = [self.engine.get_tensor_name(i) for i in range(int(self.engine.num_io_tensors))]
        inp = trt.TensorIOMode.INPUT
        self.inputs = tuple(n for n in names if self.engine.get_tensor_mode(n) == inp)
        self.outputs = tuple(n for n in names if self.engine.get_tensor_mode(n) != inp)
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}


@dataclass
class _Buffer:
    host: int
    device: int
    nbytes: int


class WorkerContext:
    """One worker thread's execution context, stream and tensor memory (call from that thread)."""

    def __init__(self, cudart: Any, handle: EngineHandle, device_id: int, integrated: bool) -> None:
        self._cudart = cudart
        self._handle = handle
        self._integrated = integrated
        self._buffers: dict[str, _Buffer] = {}
        cuda_call(cudart, cudart.cudaSetDevice(device_id), "cudaSetDevice")
        self.stream = cuda_call(cudart, cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.context = handle.engine.create_execution_context()
        if self.context is None:
            self.close()
            raise RuntimeError("create_execution_context returned None (out of device memory?)")

    def _buffer(self, name: str, nbytes: int) -> _Buffer:
        buf = self._buffers.get(name)
        if buf is not None and buf.nbytes >= nbytes:
            return buf
        if buf is not None:
            self._free(buf)
            del self._buffers[name]
        c = self._cudart
        size = max(nbytes, 1)
        host = int(cuda_call(c, c.cudaMallocHost(size), "cudaMallocHost"))
        try:
            if self._integrated:
                device = int(cuda_call(c, c.cudaHostGetDevicePointer(host, 0), "cudaHostGetDevicePointer"))
            else:
                device = int(cuda_call(c, c.cudaMalloc(size), "cudaMalloc"))
        except BaseException:
            c.cudaFreeHost(host)
            raise
        buf = self._buffers[name] = _Buffer(host, device, size)
        return buf

    def _view(self, buf: _Buffer, dtype: np.dtype[Any], shape: Sequence[int]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        raw = (ctypes.c_byte * (count * dtype.itemsize)).from_address(buf.host)
        return np.frombuffer(memoryview(raw), dtype=dtype, count=count).reshape(tuple(shape))

    def _copy(self, buf: _Buffer, nbytes: int, to_device: bool) -> None:
        if self._integrated or nbytes == 0:
            return
        c = self._cudart
        kind = c.cudaMemcpyKind.cudaMemcpyHostToDevice if to_device else c.cudaMemcpyKind.cudaMemcpyDeviceToHost
        dst, src = (buf.device, buf.host) if to_device else (buf.host, buf.device)
        cuda_call(c, c.cudaMemcpyAsync(dst, src, nbytes, kind, self.stream), "cudaMemcpyAsync")

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Run once: inputs copied in, outputs returned (copies), or written into ``outputs``.

        :raises CudaError: a CUDA call failed. :raises RuntimeError: TensorRT refused a shape or the run.
        :raises KeyError: an input is missing from ``feeds``.
        """
        h, ctx = self._handle, self.context
        for name in h.inputs:
            arr = np.ascontiguousarray(feeds[name], dtype=h.dtypes[name])
            if not ctx.set_input_shape(name, arr.shape):
                raise RuntimeError(f"TensorRT refused shape {list(arr.shape)} for input {name!r} (outside the "
                                   "engine's optimization profile?)")
            buf = self._buffer(name, arr.nbytes)
            np.copyto(self._view(buf, arr.dtype, arr.shape), arr)
            self._copy(buf, arr.nbytes, to_device=True)
            ctx.set_tensor_address(name, buf.device)
        shapes = []
        for name in h.outputs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
            buf = self._buffer(name, int(np.prod(shape, dtype=np.int64)) * h.dtypes[name].itemsize)
            ctx.set_tensor_address(name, buf.device)
            shapes.append(shape)
        if not ctx.execute_async_v3(self.stream):
            raise RuntimeError("execute_async_v3 failed (TensorRT's logger has the reason)")
        results = []
        for name, shape in zip(h.outputs, shapes, strict=True):
            buf = self._buffers[name]
            self._copy(buf, int(np.prod(shape, dtype=np.int64)) * h.dtypes[name].itemsize, to_device=False)
        c = self._cudart
        cuda_call(c, c.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        for i, (name, shape) in enumerate(zip(h.outputs, shapes, strict=True)):
            view = self._view(self._buffers[name], h.dtypes[name], shape)
            if outputs is not None:
                if outputs[i].shape != shape:
                    raise RuntimeError(f"output {name!r} has shape {list(shape)}, expected {list(outputs[i].shape)}")
                np.copyto(outputs[i], view)
            else:
                results.append(view.copy())
        return results

    def _free(self, buf: _Buffer) -> None:
        c = self._cudart
        if not self._integrated:
            c.cudaFree(buf.device)
        c.cudaFreeHost(buf.host)

    def close(self) -> None:
        """Free the memory and the stream (errors ignored: the device may be gone)."""
        for buf in self._buffers.values():
            self._free(buf)
        self._buffers.clear()
        self.context = None
        stream, self.stream = self.stream, None
        if stream is not None:
            self._cudart.cudaStreamDestroy(stream)
