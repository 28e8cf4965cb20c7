"""cuda-python's CUDA runtime, lazily: loading it, its errors, and the pools' host mappings.

Shared by the runtime's ``cuda`` memory domain (``hetsched._runtime._cuda_memory``) and the
TensorRT backend, which both sit above this module; it imports nothing of theirs.

**Not run on a GPU by this project's CI**; written against the CUDA Runtime API reference
(https://docs.nvidia.com/cuda/cuda-runtime-api/) and cuda-python's bindings, whose calls return
``(cudaError_t, *values)`` the way NVIDIA/TensorRT ``samples/python/common_runtime.py`` unpacks
them (``cuda_call``). cuda-python is imported at the first use, never at import time:
``cuda.bindings.runtime`` (cuda-python 12.8 and later, 13.x), else ``cuda.cudart`` (older).

What is here:

* :func:`load_cudart`, :func:`cuda_call`, :class:`CudaError`, :func:`device_lost`: the module, a
  call's result, its errors, and which errors mean the device is gone;
* :data:`HOST_MAPPINGS`: the buffer pools' host mappings (memfd / dma-buf / anonymous slabs),
  each registered with CUDA at most once (``cudaHostRegister``, ``Portable``, plus ``Mapped``
  on an integrated GPU so that ``cudaHostGetDevicePointer`` gives the address the GPU uses)
  and unregistered (``cudaHostUnregister``) when its pool unmaps it. This is how a Jetson's GPU
  reads and writes the runtime's pool buffers in place.
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass
from typing import Any

from hetsched._errors import BackendError, BackendUnavailableError

__all__ = [
    "HOST_MAPPINGS",
    "INSTALL_HINT",
    "CudaError",
    "HostMappings",
    "cuda_call",
    "cuda_flag",
    "device_lost",
    "load_cudart",
]

log = logging.getLogger("hetsched.backends")

INSTALL_HINT = ("pip install 'hetsched[jetson-cuda12]' (cuda-python 12.x, for JetPack 6's CUDA 12; "
                "'hetsched[jetson-cuda13]' for CUDA 13): cuda-python must match the board's CUDA major version")

# CUDA Runtime API, enum cudaError: after these the CUDA context is unusable ("the process must be
# terminated and relaunched") or there is no device to use; any other error is about one call.
_DEVICE_LOST = frozenset({
    "cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorHardwareStackError",
    "cudaErrorIllegalInstruction", "cudaErrorMisalignedAddress", "cudaErrorInvalidAddressSpace",
    "cudaErrorInvalidPc", "cudaErrorECCUncorrectable", "cudaErrorNoDevice", "cudaErrorDevicesUnavailable",
    "cudaErrorInsufficientDriver", "cudaErrorSystemNotReady", "cudaErrorCudartUnloading",
})

# Flag values from the CUDA Runtime API's headers, used where a cuda-python build does not
# export the constant under its C name.
_HOST_REGISTER_PORTABLE = 0x01
_HOST_REGISTER_MAPPED = 0x02


class CudaError(BackendError):
    """A CUDA runtime call returned an error; ``call`` names the call, ``name`` its ``cudaError_t``."""

    def __init__(self, call: str, name: str) -> None:
        super().__init__(f"{call} failed: {name}")
        self.call = call
        self.name = name


def device_lost(name: str) -> bool:
    """Whether the CUDA error ``name`` means the device (or its context) is gone, not just this call."""
    return name in _DEVICE_LOST


def load_cudart() -> Any:
    """cuda-python's runtime module (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.8).

    :raises BackendUnavailableError: cuda-python is not installed (an ``ImportError`` too); the
        message names the extra that installs it.
    """
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[import-not-found]
        except ImportError as exc:
            raise BackendUnavailableError(f"CUDA memory needs cuda-python (module 'cuda.bindings.runtime' or "
                                          f"'cuda.cudart'), which is not installed: {INSTALL_HINT}") from exc
    return runtime


def cuda_call(cudart: Any, result: Any, call: str) -> Any:
    """The value(s) of a cuda-python call's ``(err, *values)``: None, one value, or a tuple.

    :raises CudaError: ``err`` is not ``cudaSuccess`` (the message names ``call`` and the error).
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", None) or str(err)
        raise CudaError(call, str(name))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def cuda_flag(cudart: Any, name: str, value: int) -> int:
    """The flag constant ``name`` of ``cudart``, or ``value`` (the C header's) where a cuda-python
    build does not export it under its C name."""
    return int(getattr(cudart, name, value))


# -- the pools' host mappings -------------------------------------------------------------------


@dataclass
class _Mapping:
    base: int
    size: int
    cudart: Any = None
    """The runtime module it was registered through (None: not registered)."""
    device: int = 0
    """``cudaHostGetDevicePointer`` of ``base`` (0: registered without ``Mapped``)."""
    mapped: bool = False
    refused: str = ""
    """Why CUDA refused to register it (then it is not asked again; its users copy instead)."""


class HostMappings:
    """The buffer pools' live host mappings and their CUDA registrations (process-wide, thread-safe).

    The runtime's pools :meth:`add` every slab they map and :meth:`remove` it before unmapping;
    a backend asks :meth:`device_address` for memory it wants the GPU to use in place. A
    mapping is registered at its first such request and unregistered at :meth:`remove`, so no
    registration outlives its memory, and memory that is not a pool's is never registered
    (its lifetime is not known here).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._maps: list[_Mapping] = []

    def add(self, base: int, size: int) -> None:
        with self._lock:
            i = bisect.bisect_left(self._starts, base)
            self._starts.insert(i, base)
            self._maps.insert(i, _Mapping(base, size))

    def remove(self, base: int, size: int) -> None:
        """Forget the mapping at ``base``, unregistering it first when it was registered.

        An unregistration error is not raised: the memory is being unmapped either way, and
        after a lost device CUDA answers every call with the same error.
        """
        with self._lock:
            i = bisect.bisect_left(self._starts, base)
            while i < len(self._maps) and self._starts[i] == base:
                m = self._maps[i]
                if m.size == size:
                    del self._starts[i]
                    del self._maps[i]
                    break
                i += 1
            else:
                return
        if m.cudart is not None:
            m.cudart.cudaHostUnregister(m.base)

    def _find_locked(self, address: int, nbytes: int) -> _Mapping | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        m = self._maps[i]
        return m if address + nbytes <= m.base + m.size else None

    def contains(self, address: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at ``address`` lie inside one live pool mapping."""
        with self._lock:
            return self._find_locked(address, nbytes) is not None

    def device_address(self, cudart: Any, address: int, nbytes: int, *, mapped: bool) -> int | None:
        """The address a CUDA device uses for ``nbytes`` at ``address`` (``mapped``: an integrated GPU
        reading host memory in place), registering their mapping once; with ``mapped=False`` the
        mapping is only pinned (faster DMA) and the host address itself is returned.

        None when they are not inside one pool mapping, or when CUDA refused to register it
        (``cudaHostRegister`` / ``cudaHostGetDevicePointer`` failed: logged once as a
        ``hetsched.backends`` warning, a half-made registration undone, and not tried again for
        that mapping): the caller then copies through memory of its own, which also brings out a
        CUDA failure that is not about this memory.
        """
        with self._lock:
            m = self._find_locked(address, nbytes)
            if m is None or m.refused:
                return None
            if m.cudart is None or (mapped and not m.mapped):
                try:
                    self._register_locked(cudart, m, mapped)
                except CudaError as exc:
                    m.refused = str(exc)
                    log.warning("pool memory at %#x (%d bytes) is copied, not used in place: %s", m.base, m.size, exc)
                    return None
            return (m.device if m.mapped else m.base) + (address - m.base)

    @staticmethod
    def _register_locked(cudart: Any, m: _Mapping, mapped: bool) -> None:
        if m.cudart is not None:  # pinned before, now wanted mapped: register again with the flag
            m.cudart.cudaHostUnregister(m.base)
            m.cudart = None
        flags = cuda_flag(cudart, "cudaHostRegisterPortable", _HOST_REGISTER_PORTABLE)
        if mapped:
            flags |= cuda_flag(cudart, "cudaHostRegisterMapped", _HOST_REGISTER_MAPPED)
        cuda_call(cudart, cudart.cudaHostRegister(m.base, m.size, flags), "cudaHostRegister")
        device = 0
        if mapped:
            try:
                device = int(cuda_call(cudart, cudart.cudaHostGetDevicePointer(m.base, 0), "cudaHostGetDevicePointer"))
            except BaseException:
                cudart.cudaHostUnregister(m.base)
                raise
        m.cudart, m.device, m.mapped = cudart, device, mapped

    def registered(self) -> int:
        """How many mappings are registered with CUDA now."""
        with self._lock:
            return sum(1 for m in self._maps if m.cudart is not None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._maps)


HOST_MAPPINGS = HostMappings()
"""The process's pool mappings (``hetsched._runtime._memory`` adds and removes its slabs here)."""
