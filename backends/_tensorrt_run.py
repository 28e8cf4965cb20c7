"""Running a TensorRT engine: one execution context and one CUDA stream per device worker thread.

Written against the documented APIs only; nothing in this project's CI has run it on a GPU.

* TensorRT (NVIDIA/TensorRT ``samples/python/common_runtime.py``): ``trt.Runtime``,
  ``runtime.DLA_core = n`` **before** ``deserialize_cuda_engine`` (the core an engine runs on is
  fixed when it is deserialized), ``engine.create_execution_context()``,
  ``context.set_input_shape``, ``context.set_tensor_address``, ``context.execute_async_v3(stream)``.
* CUDA through cuda-python (``hetsched._memory.cuda``; each call returns ``(cudaError_t, *values)``):
  ``cudaStreamCreate``, ``cudaMallocHost``, ``cudaHostGetDevicePointer``, ``cudaMalloc``,
  ``cudaMemcpyAsync``, ``cudaStreamSynchronize`` (CUDA Runtime API,
  https://docs.nvidia.com/cuda/cuda-runtime-api/). The stream goes to ``execute_async_v3`` as
  ``stream_handle=`` the ``cudaStream_t`` that ``cudaStreamCreate`` returned, exactly as
  ``common_runtime.do_inference`` passes it.

Memory on an integrated GPU (Jetson: ``cudaDeviceProp.integrated``; CPU and GPU share DRAM):
a tensor that lies in one of the runtime's pool buffers is used **in place**: its pool mapping
is registered once (``cudaHostRegister`` with ``Portable | Mapped``, through
``hetsched._memory.cuda.HOST_MAPPINGS``, unregistered when the pool unmaps it) and the address
``cudaHostGetDevicePointer`` gives is bound with ``set_tensor_address``; nothing is copied,
the CPU stage before and the GPU stage after share the bytes, as on the RK3588. Other tensors
(a caller's arrays, unaligned views) are copied into the context's own pinned buffers
(``cudaMallocHost`` + ``cudaHostGetDevicePointer``). On a discrete GPU tensors live in
``cudaMalloc`` memory, copied with ``cudaMemcpyAsync`` on the worker's stream: straight from
and into a pool buffer (its mapping registered once, pinned, not mapped), else through the
context's pinned staging buffers.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetsched._memory.cuda import HOST_MAPPINGS, CudaError, cuda_call, device_lost, load_cudart

__all__ = ["TENSOR_ALIGNMENT", "CudaError", "EngineHandle", "GpuInfo", "WorkerContext", "cuda_call", "device_lost",
           "gpu_info", "load_cudart"]

TENSOR_ALIGNMENT = 256
"""Bytes a tensor address bound in place must be aligned to (the alignment the TensorRT API
reference asks of ``setTensorAddress`` pointers); a pool view not so aligned is copied instead."""

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
        self.bound = 0
        """Tensors bound in place (a pool buffer the GPU reads or writes itself), over all runs."""
        self.pinned = 0
        """Tensors copied straight between a pinned pool buffer and device memory (discrete GPU)."""
        self.staged = 0
        """Tensors that went through this context's own staging buffers."""
        self._device_only: dict[str, tuple[int, int]] = {}
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

    def _pool_address(self, arr: np.ndarray) -> int | None:
        """Where the GPU side may use ``arr`` without this context's staging buffer, when it lies in a
        pool mapping (C-contiguous): on an integrated GPU the device address to bind (the mapping is
        registered mapped; the address must be aligned), on a discrete one its host address, pinned,
        to copy from or into directly. None otherwise."""
        if not arr.flags.c_contiguous or arr.nbytes == 0:
            return None
        address = int(arr.ctypes.data)
        if self._integrated and address % TENSOR_ALIGNMENT:
            return None
        return HOST_MAPPINGS.device_address(self._cudart, address, arr.nbytes, mapped=self._integrated)

    def _device(self, name: str, nbytes: int) -> int:
        """A device-only buffer (discrete GPU) for a tensor copied straight from or into a pool buffer."""
        held = self._device_only.get(name)
        if held is not None and held[1] >= nbytes:
            return held[0]
        if held is not None:
            self._cudart.cudaFree(held[0])
            del self._device_only[name]
        c = self._cudart
        ptr = int(cuda_call(c, c.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        self._device_only[name] = (ptr, max(nbytes, 1))
        return ptr

    def _memcpy(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        c = self._cudart
        kind = c.cudaMemcpyKind.cudaMemcpyHostToDevice if to_device else c.cudaMemcpyKind.cudaMemcpyDeviceToHost
        cuda_call(c, c.cudaMemcpyAsync(dst, src, nbytes, kind, self.stream), "cudaMemcpyAsync")

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Run once: inputs bound in place or copied in; outputs returned (copies), or written into
        ``outputs`` (by the GPU itself where they are pool buffers on an integrated GPU).

        :raises CudaError: a CUDA call failed. :raises RuntimeError: TensorRT refused a shape or the run,
            or an output's shape is not the one ``outputs`` has. :raises KeyError: an input is missing.
        """
        h, ctx = self._handle, self.context
        for name in h.inputs:
            arr = np.ascontiguousarray(feeds[name], dtype=h.dtypes[name])
            if not ctx.set_input_shape(name, arr.shape):
                raise RuntimeError(f"TensorRT refused shape {list(arr.shape)} for input {name!r} (outside the "
                                   "engine's optimization profile?)")
            pool = self._pool_address(arr)
            if pool is None:
                buf = self._buffer(name, arr.nbytes)
                np.copyto(self._view(buf, arr.dtype, arr.shape), arr)
                self._copy(buf, arr.nbytes, to_device=True)
                address = buf.device
                self.staged += 1
            elif self._integrated:
                address = pool
                self.bound += 1
            else:
                address = self._device(name, arr.nbytes)
                self._memcpy(address, pool, arr.nbytes, to_device=True)
                self.pinned += 1
            ctx.set_tensor_address(name, address)
        plans: list[tuple[tuple[int, ...], int, int | None]] = []  # shape, bytes, pool address (None: staged)
        for i, name in enumerate(h.outputs):
            shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
            nbytes = int(np.prod(shape, dtype=np.int64)) * h.dtypes[name].itemsize
            pool = None
            if outputs is not None:
                if tuple(outputs[i].shape) != shape:
                    raise RuntimeError(f"output {name!r} has shape {list(shape)}, expected {list(outputs[i].shape)}")
                if outputs[i].dtype == h.dtypes[name]:
                    pool = self._pool_address(outputs[i])
            if pool is None:
                target = self._buffer(name, nbytes).device
                self.staged += 1
            elif self._integrated:
                target = pool
                self.bound += 1
            else:
                target = self._device(name, nbytes)
                self.pinned += 1
            ctx.set_tensor_address(name, target)
            plans.append((shape, nbytes, pool))
        if not ctx.execute_async_v3(stream_handle=self.stream):
            raise RuntimeError("execute_async_v3 failed (TensorRT's logger has the reason)")
        for name, (_, nbytes, pool) in zip(h.outputs, plans, strict=True):
            if pool is None:
                self._copy(self._buffers[name], nbytes, to_device=False)
            elif not self._integrated:
                self._memcpy(pool, self._device_only[name][0], nbytes, to_device=False)
        c = self._cudart
        cuda_call(c, c.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        results = []
        for i, (name, (shape, _, pool)) in enumerate(zip(h.outputs, plans, strict=True)):
            if pool is not None:
                continue
            view = self._view(self._buffers[name], h.dtypes[name], shape)
            if outputs is not None:
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
        for ptr, _ in self._device_only.values():
            self._cudart.cudaFree(ptr)
        self._device_only.clear()
        self.context = None
        stream, self.stream = self.stream, None
        if stream is not None:
            self._cudart.cudaStreamDestroy(stream)
