"""Backing memory of the buffer pools: size classes, shareable slabs, blocks.

Each pool maps its memory in *slabs* of shareable memory: a dma-buf from
``<root>/dev/dma_heap/<heap>`` where that exists and works, else a memfd
(``os.memfd_create``), else anonymous memory. A slab is carved into equal blocks of one
*size class* (see :func:`size_class`). See ``_buffers`` for the whole design.

Every host slab is announced to ``hetsched._memory.cuda.HOST_MAPPINGS`` while it is mapped,
so a GPU backend may register it with CUDA (``cudaHostRegister``) and use it in place; it is
unregistered there before the slab is unmapped. A slab with a descriptor is also announced to
``hetsched._memory.shared`` (``locate_shared``: a toolkit's worker process is handed
``(fd, offset)``). The pool of the ``cuda`` memory domain (``cuda`` or ``cuda:N``, a discrete
GPU's memory) maps its slabs with ``cudaMalloc`` instead (backing ``"cuda"``,
``_cuda_memory``): such blocks have a device address and no host view.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import stat
import struct
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np

from .._errors import PathOutsideRootError, PlatformError, SysfsError, TransferError
from .._memory.cuda import HOST_MAPPINGS
from .._memory.shared import forget_shared, register_shared
from .._platform._fs import SysfsRoot
from ._cuda_memory import CudaBacking, DeviceMemory, cuda_device_of

__all__ = ["ALIGNMENT", "SLAB_BYTES", "size_class"]

ALIGNMENT = 64
"""Every buffer's data starts on a multiple of this many bytes (a cache line)."""

SLAB_BYTES = 256 * 1024
"""Size of the shared slab that small size classes are carved from."""

_MAX_HOMES = 4096
"""Labels whose last block a pool remembers (see BufferPool._pop_free_locked)."""

_U8 = np.dtype(np.uint8)

Backing = Literal["auto", "dma-heap", "memfd", "anonymous", "cuda"]


def size_class(nbytes: int) -> int:
    """The block size a request of ``nbytes`` is served from (see the module docstring)."""
    if nbytes <= 256:
        return 64 if nbytes <= 64 else (nbytes + 63) & ~63
    step = 1 << ((nbytes - 1).bit_length() - 3)  # a quarter of the power of two below nbytes
    return (nbytes + step - 1) & ~(step - 1)



# -- backing memory -------------------------------------------------------------

# struct dma_heap_allocation_data { __u64 len; __u32 fd; __u32 fd_flags; __u64 heap_flags; }
_DMA_HEAP_DATA = struct.Struct("=QIIQ")
# _IOWR('H', 0, struct dma_heap_allocation_data)
_DMA_HEAP_IOCTL_ALLOC = (3 << 30) | (_DMA_HEAP_DATA.size << 16) | (ord("H") << 8) | 0


class _MemfdBacking:
    name = "memfd"

    def __init__(self, label: str) -> None:
        self._label = f"hetsched:{label}"

    def map(self, size: int) -> tuple[int, mmap.mmap]:
        fd = os.memfd_create(self._label, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return fd, mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        pass


class _DmaHeapBacking:
    name = "dma-heap"

    def __init__(self, heap_fd: int) -> None:
        self._heap_fd = heap_fd  # owned: see _open_heap

    def map(self, size: int) -> tuple[int, mmap.mmap]:
        req = bytearray(_DMA_HEAP_DATA.pack(size, 0, os.O_RDWR | os.O_CLOEXEC, 0))
        fcntl.ioctl(self._heap_fd, _DMA_HEAP_IOCTL_ALLOC, req, True)
        fd = _DMA_HEAP_DATA.unpack(req)[1]
        try:
            return fd, mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        os.close(self._heap_fd)


class _AnonymousBacking:
    name = "anonymous"

    def map(self, size: int) -> tuple[int, mmap.mmap]:
        return -1, mmap.mmap(-1, size)

    def close(self) -> None:
        pass


_BackingImpl = _MemfdBacking | _DmaHeapBacking | _AnonymousBacking | CudaBacking


def _open_heap(root: str | os.PathLike[str], heap: str) -> tuple[int | None, str]:
    """A descriptor of the dma-buf heap ``<root>/dev/dma_heap/<heap>``, or None and why not.

    The path is resolved inside ``root`` (:class:`~hetsched._platform._fs.SysfsRoot`): a heap
    that is a link leading out of the root is not opened, nor is anything that is not a
    character device (opening a FIFO or a device elsewhere can have side effects of its own).
    The type is checked before the open and again on the descriptor, so a node swapped in
    between is caught; the open does not follow a link.

    Raises:
        PlatformError: ``heap`` is not a plain name (it has a ``/``, or is ``.`` or ``..``).
    """
    if not heap or "/" in heap or "\0" in heap or heap in (".", ".."):
        raise PlatformError(f"dma_heap {heap!r}: not a heap name (a file name under dev/dma_heap)")
    shown = Path(root, "dev", "dma_heap", heap)
    try:
        path = SysfsRoot(root).resolve(f"dev/dma_heap/{heap}")
    except PathOutsideRootError as exc:
        return None, f"dma-heap {shown} not opened: {exc.strerror}"
    except SysfsError:  # the root itself is not a directory
        return None, f"no dma-heap at {shown}"
    try:
        st = os.stat(path.path)
    except OSError:
        return None, f"no dma-heap at {shown}"
    if not stat.S_ISCHR(st.st_mode):
        return None, f"dma-heap {shown} unusable: {_kind(st.st_mode)}, not a character device (not opened)"
    try:
        fd = os.open(path.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        return None, f"dma-heap {shown} unusable ({exc.strerror or exc})"
    again = os.fstat(fd)
    if not stat.S_ISCHR(again.st_mode) or again.st_rdev != st.st_rdev:
        os.close(fd)
        return None, f"dma-heap {shown} unusable: it changed while being opened"
    return fd, ""


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return what
    return "not a device"


def _open_backing(
    kind: Backing, root: str | os.PathLike[str], heap: str, label: str
) -> tuple[_BackingImpl, str | None]:
    """Pick the backing; returns it and, when ``auto`` fell back, why.

    Raises:
        PlatformError: an explicitly requested backing is unavailable (the message says why),
            or ``heap`` is not a plain name.
    """
    why: str | None = None
    device = cuda_device_of(label)
    if kind == "cuda" or (kind == "auto" and device is not None):
        try:
            return CudaBacking(device or 0), None
        except ImportError as exc:  # BackendUnavailableError: no cuda-python
            raise PlatformError(f"memory domain {label!r} is CUDA device memory: {exc}") from exc
    if kind in ("auto", "dma-heap"):
        heap_fd, why = _open_heap(root, heap)
        if heap_fd is not None:
            backing = _DmaHeapBacking(heap_fd)
            try:
                fd, mm = backing.map(mmap.PAGESIZE)  # probe: a fake or broken heap fails here
                mm.close()
                os.close(fd)
                return backing, None
            except OSError as exc:
                backing.close()
                why = f"dma-heap {Path(root, 'dev', 'dma_heap', heap)} unusable ({exc.strerror or exc})"
        if kind == "dma-heap":
            raise PlatformError(f"cannot allocate from a dma-buf heap: {why}")
    if kind in ("auto", "memfd") and hasattr(os, "memfd_create"):
        return _MemfdBacking(label), why
    if kind == "memfd":
        raise PlatformError("os.memfd_create is not available on this platform")
    return _AnonymousBacking(), why or "memfd_create unavailable"


class _DeviceBytes:
    """Stands where a device block's host view would be: any use says why there is none."""

    __slots__ = ("domain",)

    def __init__(self, domain: str) -> None:
        self.domain = domain

    def _refuse(self) -> NoReturn:
        raise TransferError(f"a buffer of memory domain {self.domain!r} lives in GPU memory and has no host view; "
                            "transfer it to a host domain first")

    def __getitem__(self, key: object) -> NoReturn:
        self._refuse()

    def __setitem__(self, key: object, value: object) -> NoReturn:
        self._refuse()


class _Slab:
    __slots__ = ("base", "carved", "device", "fd", "in_use", "mm", "ptr", "size")

    def __init__(self, fd: int, mm: mmap.mmap | DeviceMemory, size: int) -> None:
        self.fd = fd
        self.mm = mm
        self.size = size
        self.carved = 0
        self.in_use = 0
        self.device: DeviceMemory | None = None
        """The ``cudaMalloc`` allocation of a ``cuda`` pool's slab (None: host memory)."""
        self.base: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        if isinstance(mm, DeviceMemory):
            self.device = mm
            self.ptr = mm.ptr
            return
        self.base = np.frombuffer(mm, dtype=_U8)
        self.ptr = self.base.ctypes.data
        HOST_MAPPINGS.add(self.ptr, size)
        if fd >= 0:
            register_shared(self)

    def unmap(self) -> None:
        if isinstance(self.mm, DeviceMemory):
            self.mm.close()
            return
        if self.fd >= 0:
            forget_shared(self)
        HOST_MAPPINGS.remove(self.ptr, self.size)  # unregistered from CUDA before the munmap
        self.base = None
        # BufferError: someone still holds a numpy view; the mapping lives on until that view dies.
        with contextlib.suppress(BufferError):
            self.mm.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Block:
    __slots__ = ("data", "free", "offset", "ptr", "size", "slab", "views")

    def __init__(self, slab: _Slab, offset: int, size: int, domain: str = "") -> None:
        self.free = False
        """In its size class's free list now."""
        self.slab = slab
        self.offset = offset
        self.size = size
        self.data: np.ndarray[Any, np.dtype[np.uint8]] | _DeviceBytes
        if slab.base is None:
            self.data = _DeviceBytes(domain or "cuda")
        else:
            self.data = slab.base[offset : offset + size]
        self.ptr = slab.ptr + offset
        # typed views of this block by (dtype, shape): a recycled block serving the same stage
        # output again hands out the same view instead of building three new array objects
        self.views: dict[tuple[np.dtype[Any], tuple[int, ...]], np.ndarray[Any, Any]] = {}

    def view(self, dtype: np.dtype[Any], shape: tuple[int, ...], nbytes: int) -> np.ndarray[Any, Any]:
        key = (dtype, shape)
        v = self.views.get(key)
        if v is None:
            if len(self.views) >= 8:  # a block serves few shapes; bound the cache anyway
                self.views.clear()
            v = self.views[key] = self.data[:nbytes].view(dtype).reshape(shape)
        return v


