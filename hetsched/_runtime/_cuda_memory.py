"""The runtime's ``cuda`` memory domain: ``cudaMalloc`` slabs and prioritised chunked copies.

The pool of a ``cuda`` (or ``cuda:N``) memory domain, a discrete GPU's memory, maps its slabs
here (:class:`DeviceMemory`, through :class:`CudaBacking`), and the transfer engine moves their
bytes with :func:`chunk_copy`. cuda-python itself, its errors and the pools' host mappings are
one layer down (``hetsched._memory.cuda``), shared with the TensorRT backend.

**Not run on a GPU by this project's CI** (see ``hetsched._memory.cuda``).

* :class:`PriorityStreams` and :class:`CudaCopier`: host<->device copies on streams made with
  ``cudaStreamCreateWithPriority`` from ``cudaDeviceGetStreamPriorityRange``. CUDA documents
  that stream priorities order *kernels* only, not memory copies
  (``cuStreamCreateWithPriority``: "Stream priorities have no effect on host-to-device and
  device-to-host memory operations"), so a HIGH copy overtakes a BACKGROUND one because the
  transfer engine copies in chunks and hands the channel over at chunk boundaries, not because
  of the stream.
* :class:`DeviceMemory`: one ``cudaMalloc`` allocation, a slab of the ``cuda`` domain's pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._memory import cuda
from .._memory.cuda import HOST_MAPPINGS, CudaError, cuda_call, cuda_flag

__all__ = [
    "CudaBacking",
    "CudaCopier",
    "DeviceMemory",
    "PriorityStreams",
    "chunk_copy",
    "cuda_device_of",
    "stream_priority",
]

_STREAM_NON_BLOCKING = 0x01
"""``cudaStreamNonBlocking`` from the CUDA Runtime API's headers (where cuda-python lacks the name)."""


# -- streams and copies ---------------------------------------------------------------------------


def stream_priority(level: int, least: int, greatest: int) -> int:
    """The CUDA stream priority for a runtime priority ``level`` (``Priority``: 0 REALTIME ... 3
    BACKGROUND) in the device's range (``cudaDeviceGetStreamPriorityRange``: lower numbers are
    more urgent, ``greatest <= least``): REALTIME and HIGH get ``greatest``, BACKGROUND
    ``least``, NORMAL the middle, rounded towards ``least``."""
    if level <= 1:
        return greatest
    if level >= 3:
        return least
    return least - (least - greatest) // 2


class PriorityStreams:
    """One non-blocking CUDA stream per runtime priority level on one device, made at first use.

    :raises CudaError: (from :meth:`stream_for`) the range query or the stream creation failed.
    """

    def __init__(self, cudart: Any, device_id: int = 0) -> None:
        self._cudart = cudart
        self.device_id = device_id
        self._lock = threading.Lock()
        self._range: tuple[int, int] | None = None
        self._streams: dict[int, Any] = {}

    def priority_of(self, level: int) -> int:
        c = self._cudart
        if self._range is None:
            least, greatest = cuda_call(c, c.cudaDeviceGetStreamPriorityRange(), "cudaDeviceGetStreamPriorityRange")
            self._range = (int(least), int(greatest))
        return stream_priority(level, *self._range)

    def stream_for(self, level: int) -> Any:
        key = max(0, min(3, int(level)))
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                c = self._cudart
                cuda_call(c, c.cudaSetDevice(self.device_id), "cudaSetDevice")
                flags = cuda_flag(c, "cudaStreamNonBlocking", _STREAM_NON_BLOCKING)
                stream = cuda_call(c, c.cudaStreamCreateWithPriority(flags, self.priority_of(key)),
                                   "cudaStreamCreateWithPriority")
                self._streams[key] = stream
            return stream

    def close(self) -> None:
        """Destroy the streams (errors ignored: the device may be gone)."""
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for s in streams:
            self._cudart.cudaStreamDestroy(s)


class CudaCopier:
    """Copies one chunk at a time on the stream of the copy's priority, and waits for it.

    Waiting (``cudaStreamSynchronize``) before returning is what lets the transfer engine hand
    the channel over at a chunk boundary and release a cancelled copy's buffers: no DMA is in
    flight into memory once :meth:`copy` has returned.
    """

    def __init__(self, cudart: Any, device_id: int = 0) -> None:
        self._cudart = cudart
        self.streams = PriorityStreams(cudart, device_id)
        self.chunks = 0

    def copy(self, dst: int, src: int, nbytes: int, *, to_device: bool, from_device: bool, priority: int) -> None:
        """Copy ``nbytes`` from address ``src`` to ``dst`` (host or device as the flags say).

        :raises CudaError: the copy or the wait failed (it names the call).
        """
        c = self._cudart
        kinds = c.cudaMemcpyKind
        if to_device and from_device:
            kind = kinds.cudaMemcpyDeviceToDevice
        elif to_device:
            kind = kinds.cudaMemcpyHostToDevice
        elif from_device:
            kind = kinds.cudaMemcpyDeviceToHost
        else:
            kind = kinds.cudaMemcpyHostToHost
        stream = self.streams.stream_for(priority)
        cuda_call(c, c.cudaMemcpyAsync(dst, src, nbytes, kind, stream), "cudaMemcpyAsync")
        cuda_call(c, c.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        self.chunks += 1

    def close(self) -> None:
        self.streams.close()


class DeviceMemory:
    """One ``cudaMalloc`` allocation of ``size`` bytes on ``device_id``: a slab of a ``cuda`` pool.

    :raises CudaError: ``cudaSetDevice`` or ``cudaMalloc`` failed.
    """

    def __init__(self, cudart: Any, copier: CudaCopier, device_id: int, size: int) -> None:
        self.cudart = cudart
        self.copier = copier
        self.device_id = device_id
        self.size = size
        cuda_call(cudart, cudart.cudaSetDevice(device_id), "cudaSetDevice")
        self.ptr = int(cuda_call(cudart, cudart.cudaMalloc(size), "cudaMalloc"))
        self.closed = False

    def close(self) -> None:
        """``cudaFree`` (once; an error is not raised, the device may be gone)."""
        if not self.closed:
            self.closed = True
            self.cudart.cudaFree(self.ptr)


def chunk_copy(src: int, src_size: int, src_device: DeviceMemory | None, dst: int, dst_size: int,
               dst_device: DeviceMemory | None, priority: int) -> Callable[[int, int], None]:
    """``copy(start, end)`` moving bytes ``start:end`` of the block at ``src`` to the one at ``dst``
    through CUDA; ``*_device`` is the block's ``cudaMalloc`` slab, None for host memory (one of
    them is not None). Each call runs on the stream of ``priority`` and waits for its copy.

    A host block's pool mapping is pinned once (``cudaHostRegister``) where CUDA allows it;
    where it does not, CUDA copies from pageable memory, only more slowly.
    """
    dev = src_device or dst_device
    if dev is None:
        raise ValueError("chunk_copy needs a device block on one side")
    copier, cudart = dev.copier, dev.cudart
    for address, size, on_device in ((src, src_size, src_device), (dst, dst_size, dst_device)):
        if on_device is None:  # pinned where CUDA lets it; pageable memory is copied too, more slowly
            HOST_MAPPINGS.device_address(cudart, address, size, mapped=False)
    to_device, from_device = dst_device is not None, src_device is not None

    def copy_range(start: int, end: int) -> None:
        copier.copy(dst + start, src + start, end - start, to_device=to_device, from_device=from_device,
                    priority=priority)

    return copy_range


class CudaBacking:
    """Device memory of CUDA device ``device_id`` (``cudaMalloc``), with the copier the transfer
    engine moves its blocks' bytes with.

    :raises BackendUnavailableError: cuda-python is not installed (an ``ImportError``).
    """

    name = "cuda"

    def __init__(self, device_id: int) -> None:
        self._cudart = cuda.load_cudart()
        self.device_id = device_id
        self.copier = CudaCopier(self._cudart, device_id)

    def map(self, size: int) -> tuple[int, DeviceMemory]:
        try:
            return -1, DeviceMemory(self._cudart, self.copier, self.device_id, size)
        except CudaError as exc:
            raise OSError(str(exc)) from exc  # the pool reports mapping failures as OSError

    def close(self) -> None:
        self.copier.close()


def cuda_device_of(domain: str) -> int | None:
    """The CUDA device of a ``cuda`` memory domain's name (``cuda`` -> 0, ``cuda:N`` -> N), else None."""
    head, _, tail = domain.partition(":")
    if head != "cuda" or (tail and not tail.isdigit()):
        return None
    return int(tail) if tail else 0
