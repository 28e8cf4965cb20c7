"""Zero-copy tensor buffers and the per-domain pool that recycles them.

Lifecycle of one :class:`TensorBuffer` (the handle a stage or a transfer holds)::

    pool.acquire[_nowait]() ──> ALLOCATED ── activate() ──> ACTIVE ── deactivate() ──> ALLOCATED
                                ALLOCATED ── pool.evict() ──> EVICTED ── next use / restore ──> ALLOCATED
          last release() in ALLOCATED/EVICTED ──> RELEASED   (the memory goes back to the pool)
          last release() while ACTIVE          ──> deferred: RELEASED at the final deactivate()

Anything else (activating a released buffer, evicting an active one, releasing
below zero, ...) raises :class:`~hetsched.BufferStateError` naming the buffer's
label and the transition.

Memory. Each pool maps its memory in *slabs* of shareable memory: a dma-buf
from ``<root>/dev/dma_heap/<heap>`` where that exists and works, else a memfd
(``os.memfd_create``), else anonymous memory. A slab is carved into equal
blocks of one *size class*; freed blocks go to a per-class free list and are
handed out again without any system call. Size classes: multiples of 64 bytes
up to 256 B, then four classes per power of two (``2**k * {1, 1.25, 1.5, 1.75}``),
so at most 25 % is wasted and every block starts on a 64-byte boundary (slabs
are page aligned, classes are multiples of 64). Classes below 256 KiB share a
256 KiB slab; larger ones get a slab each.

Budget. ``capacity_bytes`` bounds the size-class bytes held by live buffers.
``acquire_nowait`` raises :class:`anyio.WouldBlock` beyond it; ``acquire``
waits, first come first served, until releases make room (backpressure).
Cached free blocks are not counted; :meth:`BufferPool.trim` unmaps idle slabs.

Threads. Reference counts, state and the free lists are guarded by one lock per
pool, so buffers may be released from worker threads; a release from a thread
other than the waiting task's event loop wakes that task through the loop's
thread-safe scheduler.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import anyio
import anyio.lowlevel
import numpy as np
from numpy.typing import DTypeLike

from .._errors import BufferLeakError, BufferStateError, PlatformError, RuntimeStateError
from ._domains import MemoryDomain, MemoryKind, Topology

__all__ = [
    "ALIGNMENT",
    "SLAB_BYTES",
    "BufferPool",
    "BufferState",
    "LeakedBuffer",
    "PoolStatistics",
    "SharedHandle",
    "TensorBuffer",
    "pools_for",
    "size_class",
]

ALIGNMENT = 64
"""Every buffer's data starts on a multiple of this many bytes (a cache line)."""

SLAB_BYTES = 256 * 1024
"""Size of the shared slab that small size classes are carved from."""

_MAX_HOMES = 4096
"""Labels whose last block a pool remembers (see BufferPool._pop_free_locked)."""

_U8 = np.dtype(np.uint8)

Backing = Literal["auto", "dma-heap", "memfd", "anonymous"]


def size_class(nbytes: int) -> int:
    """The block size a request of ``nbytes`` is served from (see the module docstring)."""
    if nbytes <= 256:
        return 64 if nbytes <= 64 else (nbytes + 63) & ~63
    step = 1 << ((nbytes - 1).bit_length() - 3)  # a quarter of the power of two below nbytes
    return (nbytes + step - 1) & ~(step - 1)


class BufferState(StrEnum):
    """Lifecycle state of a :class:`TensorBuffer` (transitions in the module docstring)."""

    ALLOCATED = "allocated"
    """Holds memory (and possibly a reserved channel tag); nobody is writing or moving it."""
    ACTIVE = "active"
    """Being produced by a stage or moved by a transfer; holds its channel. Cannot be evicted."""
    EVICTED = "evicted"
    """Memory returned to the pool under pressure, data parked in host heap, channel tag dropped."""
    RELEASED = "released"
    """The last reference was released; the memory is back in the pool's free list."""


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

    def __init__(self, heap: Path) -> None:
        self._heap_fd = os.open(heap, os.O_RDWR | os.O_CLOEXEC)

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


_BackingImpl = _MemfdBacking | _DmaHeapBacking | _AnonymousBacking


def _open_backing(
    kind: Backing, root: str | os.PathLike[str], heap: str, label: str
) -> tuple[_BackingImpl, str | None]:
    """Pick the backing; returns it and, when ``auto`` fell back, why."""
    why: str | None = None
    if kind in ("auto", "dma-heap"):
        path = Path(root, "dev", "dma_heap", heap)
        if path.exists():
            backing: _DmaHeapBacking | None = None
            try:
                backing = _DmaHeapBacking(path)
                fd, mm = backing.map(mmap.PAGESIZE)  # probe: a fake or broken heap fails here
                mm.close()
                os.close(fd)
                return backing, None
            except OSError as exc:
                if backing is not None:
                    backing.close()
                why = f"dma-heap {path} unusable ({exc.strerror or exc})"
        else:
            why = f"no dma-heap at {path}"
        if kind == "dma-heap":
            raise PlatformError(f"cannot allocate from a dma-buf heap: {why}")
    if kind in ("auto", "memfd") and hasattr(os, "memfd_create"):
        return _MemfdBacking(label), why
    if kind == "memfd":
        raise PlatformError("os.memfd_create is not available on this platform")
    return _AnonymousBacking(), why or "memfd_create unavailable"


class _Slab:
    __slots__ = ("base", "carved", "fd", "in_use", "mm", "ptr", "size")

    def __init__(self, fd: int, mm: mmap.mmap, size: int) -> None:
        self.fd = fd
        self.mm = mm
        self.size = size
        self.base: np.ndarray[Any, np.dtype[np.uint8]] | None = np.frombuffer(mm, dtype=_U8)
        self.ptr = self.base.ctypes.data
        self.carved = 0
        self.in_use = 0

    def unmap(self) -> None:
        self.base = None
        try:
            self.mm.close()
        except BufferError:
            # Someone still holds a numpy view: the mapping lives on until that view dies.
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Block:
    __slots__ = ("data", "free", "offset", "ptr", "size", "slab", "views")

    def __init__(self, slab: _Slab, offset: int, size: int) -> None:
        assert slab.base is not None
        self.free = False
        """In its size class's free list now."""
        self.slab = slab
        self.offset = offset
        self.size = size
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


# -- the handle -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedHandle:
    """How another process or a driver can map a buffer: ``mmap(fd, ...)`` at ``offset``.

    ``fd`` is -1 for anonymous (unshareable) memory. The fd belongs to the pool; dup it to keep it.
    """

    fd: int
    offset: int
    nbytes: int
    backing: str


class TensorBuffer:
    """A reference-counted handle on pool memory holding one tensor.

    Obtained from :meth:`BufferPool.acquire` / :meth:`BufferPool.acquire_nowait` with one
    reference. :meth:`retain` adds one per extra consumer, :meth:`release` drops one; the last
    release returns the memory to the pool (deferred until :meth:`deactivate` if the buffer is
    ACTIVE). Views returned by :meth:`array` alias the pool memory: they are valid until the
    buffer is released or evicted.

    Attributes ``owner`` (who may write it now) and ``tag`` (the transfer channel it is bound to)
    are plain data, updated by :meth:`activate` and by the transfer engine.
    """

    __slots__ = (
        "__weakref__",
        "_block",
        "_exclusive",
        "_holds",
        "_parked",
        "_pool",
        "_refs",
        "_state",
        "_view",
        "dtype",
        "label",
        "nbytes",
        "owner",
        "shape",
        "size_class",
        "tag",
    )

    def __init__(
        self,
        pool: BufferPool,
        block: _Block,
        nbytes: int,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        owner: str,
        tag: str | None,
        label: str,
    ) -> None:
        self._pool = pool
        self._block: _Block | None = block
        self.nbytes = nbytes
        self.size_class = block.size
        self.dtype = dtype
        self.shape = shape
        self.owner = owner
        self.tag = tag
        self.label = label
        self._refs = 1
        self._state = BufferState.ALLOCATED
        self._holds = 0
        self._exclusive = False
        self._parked: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._view: np.ndarray[Any, Any] | None = None

    # -- introspection -----------------------------------------------------

    @property
    def pool(self) -> BufferPool:
        """The pool (and so the memory domain) this buffer belongs to."""
        return self._pool

    @property
    def domain(self) -> MemoryDomain:
        """The memory domain the data lives in."""
        return self._pool.domain

    @property
    def state(self) -> BufferState:
        """Current lifecycle state."""
        return self._state

    @property
    def refcount(self) -> int:
        """Current number of references (0 once released, or while a deferred release waits)."""
        return self._refs

    @property
    def ptr(self) -> int:
        """Address of the first byte (64-byte aligned), for ``io_binding.bind_output(..., ptr)``.

        An EVICTED buffer is restored first (the address may differ from before the eviction).

        :raises BufferStateError: the buffer was released.
        :raises anyio.WouldBlock: restoring an evicted buffer would exceed the pool's budget.
        """
        block = self._block
        if block is None:
            block = self._restore_for_use()
        return block.ptr

    def export(self) -> SharedHandle:
        """The fd/offset another process or a device driver can map this buffer's memory through.

        :raises BufferStateError: the buffer was released (an evicted one is restored first).
        """
        block = self._block or self._restore_for_use()
        return SharedHandle(block.slab.fd, block.offset, self.nbytes, self._pool.backing)

    def array(self, dtype: DTypeLike | None = None, shape: Sequence[int] | None = None) -> np.ndarray[Any, Any]:
        """A numpy view (no copy) of the data, as the acquired dtype/shape or as given.

        With only ``dtype`` the view is one-dimensional over the tensor's bytes.

        :raises BufferStateError: the buffer was released, or the view would not fit its memory.
        :raises anyio.WouldBlock: restoring an evicted buffer would exceed the pool's budget.
        """
        block = self._block
        if block is None:
            block = self._restore_for_use()
        if dtype is None and shape is None:
            v = self._view
            if v is None:
                v = self._view = block.view(self.dtype, self.shape, self.nbytes)
            return v
        dt = self.dtype if dtype is None else np.dtype(dtype)
        shp = (self.nbytes // dt.itemsize,) if shape is None else tuple(int(s) for s in shape)
        need = math.prod(shp) * dt.itemsize
        if need > block.size or any(s < 0 for s in shp):
            raise BufferStateError(
                f"buffer {self.label!r}: a {dt} view of shape {shp} needs {need} bytes, "
                f"the buffer has {block.size}"
            )
        return block.data[:need].view(dt).reshape(shp)

    def _restore_for_use(self) -> _Block:
        if self._state is BufferState.EVICTED:
            self._pool.restore_nowait(self)
            if self._block is not None:
                return self._block
        raise BufferStateError(f"buffer {self.label!r} in pool {self._pool.domain.name!r} was released")

    # -- references ------------------------------------------------------------

    def retain(self, n: int = 1) -> TensorBuffer:
        """Add ``n`` references (one per extra consumer); returns ``self``.

        :raises BufferStateError: the buffer was already released (use after free), or ``n < 1``.
        """
        with self._pool._lock:
            if self._refs <= 0 or n < 1:
                raise BufferStateError(
                    f"cannot retain buffer {self.label!r}: "
                    + (f"bad count {n}" if n < 1 else f"it is {self._state.value} with no references")
                )
            self._refs += n
        return self

    def release(self) -> None:
        """Drop one reference; the last one returns the memory to the pool.

        If the buffer is ACTIVE the return is deferred to its final :meth:`deactivate`.
        Safe to call from worker threads.

        :raises BufferStateError: the reference count would go below zero.
        """
        pool = self._pool
        with pool._lock:
            if self._refs <= 0:
                raise BufferStateError(
                    f"buffer {self.label!r} released more often than retained (refcount below zero)"
                )
            refs = self._refs = self._refs - 1
            if refs or self._state is BufferState.ACTIVE:
                return
            wakes = pool._free_locked(self)
        if wakes:
            _wake(wakes)

    def __enter__(self) -> TensorBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- lifecycle -------------------------------------------------------------

    def activate(self, *, owner: str | None = None, tag: str | None = None, shared: bool = False) -> None:
        """ALLOCATED -> ACTIVE: a stage is about to write it, or a transfer to move it.

        ``shared=True`` is a read hold (a transfer reading its source): several read holds may
        overlap, but not with a write hold. An EVICTED buffer is restored first.

        :raises BufferStateError: the buffer is released, or already ACTIVE in a conflicting way.
        :raises anyio.WouldBlock: restoring an evicted buffer would exceed the pool's budget.
        """
        if self._state is BufferState.EVICTED:
            self._pool.restore_nowait(self)
        with self._pool._lock:
            st = self._state
            if st is BufferState.ALLOCATED and self._refs > 0:
                self._state = BufferState.ACTIVE
                self._exclusive = not shared
            elif st is BufferState.ACTIVE and shared and not self._exclusive:
                pass
            else:
                what = "write" if not shared else "read"
                raise BufferStateError(
                    f"buffer {self.label!r}: illegal transition {st.value} -> active ({what} hold)"
                    + (" while it is held for writing" if st is BufferState.ACTIVE else "")
                )
            self._holds += 1
            if owner is not None:
                self.owner = owner
            if tag is not None:
                self.tag = tag

    def deactivate(self) -> None:
        """Drop one hold; at the last one ACTIVE -> ALLOCATED (or RELEASED if a release was deferred).

        :raises BufferStateError: the buffer is not ACTIVE.
        """
        pool = self._pool
        with pool._lock:
            if self._state is not BufferState.ACTIVE:
                raise BufferStateError(
                    f"buffer {self.label!r}: illegal transition {self._state.value} -> allocated (not active)"
                )
            self._holds -= 1
            if self._holds:
                return
            self._state = BufferState.ALLOCATED
            if self._refs:
                return
            wakes = pool._free_locked(self)
        if wakes:
            _wake(wakes)

    @contextmanager
    def hold(self, *, owner: str | None = None, tag: str | None = None, shared: bool = False) -> Iterator[TensorBuffer]:
        """``with buf.hold(owner="npu"):`` = :meth:`activate` ... :meth:`deactivate`."""
        self.activate(owner=owner, tag=tag, shared=shared)
        try:
            yield self
        finally:
            self.deactivate()

    def __repr__(self) -> str:
        return (
            f"<TensorBuffer {self.label!r} {self.dtype}{list(self.shape)} in {self._pool.domain.name!r} "
            f"{self._state.value} refs={self._refs} owner={self.owner!r} tag={self.tag!r}>"
        )


# -- waiting ------------------------------------------------------------------------


class _Waiter:
    __slots__ = ("call", "closed", "event", "granted", "nbytes", "thread")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.event = anyio.Event()
        self.granted = False
        self.closed = False
        self.thread = threading.get_ident()
        native = anyio.lowlevel.current_token().native_token
        # asyncio: the loop's call_soon_threadsafe; trio: TrioToken.run_sync_soon
        self.call: Callable[[Callable[[], object]], object] = getattr(native, "call_soon_threadsafe", None) or native.run_sync_soon


def _wake(waiters: Iterable[_Waiter]) -> None:
    me = threading.get_ident()
    for w in waiters:
        if w.thread == me:
            w.event.set()
        else:
            try:
                w.call(w.event.set)
            except RuntimeError:
                pass  # that event loop has ended; nobody is waiting any more


# -- statistics ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeakedBuffer:
    """A buffer still referenced (reported by :meth:`BufferPool.leaks` and at close)."""

    label: str
    nbytes: int
    refcount: int
    state: BufferState
    owner: str


@dataclass(frozen=True)
class PoolStatistics:
    """A snapshot of one pool. Byte counts of live memory are in size-class bytes."""

    domain: str
    backing: str
    """``"dma-heap"``, ``"memfd"`` or ``"anonymous"``."""
    capacity_bytes: int | None
    bytes_allocated: int
    """Bytes mapped from the OS (live blocks plus cached free ones)."""
    bytes_in_use: int
    """Size-class bytes held by live buffers (and by granted waiters)."""
    peak_bytes_in_use: int
    live_buffers: int
    acquisitions: int
    reuses: int
    """Acquisitions served from a free list without touching the OS or carving a slab."""
    waiting: int
    """Tasks blocked in :meth:`BufferPool.acquire` / :meth:`BufferPool.restore`."""
    evictions: int
    restores: int
    bytes_evicted: int
    bytes_copied: Mapping[tuple[str, str], int]
    """Bytes copied per ``(src, dst)`` domain pair, as reported through ``record_copy``."""
    copies: Mapping[tuple[str, str], int]
    """Number of real copies per pair (``record_copy`` with ``nbytes > 0``)."""
    mappings: Mapping[tuple[str, str], int]
    """Zero-copy hand-offs per pair (``record_copy`` with ``nbytes == 0``)."""

    @property
    def reuse_rate(self) -> float:
        """reuses / acquisitions (0.0 before the first acquisition)."""
        return self.reuses / self.acquisitions if self.acquisitions else 0.0

    @property
    def bytes_copied_same_domain(self) -> int:
        """Bytes copied from a domain to itself: 0 when zero-copy holds."""
        return sum(n for (s, d), n in self.bytes_copied.items() if s == d)


# -- the pool -----------------------------------------------------------------------

SizeSpec = int | tuple[DTypeLike, Sequence[int]]


class BufferPool:
    """Recycles 64-byte aligned, shareable buffers for one memory domain.

    :param domain: the memory domain (or its name, giving a HOST domain).
    :param capacity_bytes: bound on size-class bytes held by live buffers; None = unbounded.
    :param backing: ``"auto"`` (dma-heap, else memfd, else anonymous) or one of them explicitly.
    :param root: filesystem root under which ``dev/dma_heap`` is looked up (inject a fake tree
        in tests; ``"/"`` on a board).
    :param dma_heap: which heap under ``dev/dma_heap`` to allocate from.
    :param evict_when_full: when the budget is exhausted, evict idle (ALLOCATED) buffers, oldest
        first, before making the caller wait or raising ``WouldBlock``.
    :raises PlatformError: an explicitly requested backing is unavailable.
    :raises BufferStateError: ``capacity_bytes`` is not positive.

    Also a context manager: leaving ``with`` calls :meth:`close`.
    """

    def __init__(
        self,
        domain: MemoryDomain | str,
        *,
        capacity_bytes: int | None = None,
        backing: Backing = "auto",
        root: str | os.PathLike[str] = "/",
        dma_heap: str = "system",
        evict_when_full: bool = False,
    ) -> None:
        self.domain = domain if isinstance(domain, MemoryDomain) else MemoryDomain(domain, MemoryKind.HOST)
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise BufferStateError(f"pool {self.domain.name!r}: capacity_bytes must be positive, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.evict_when_full = evict_when_full
        self._backing, self.backing_note = _open_backing(backing, root, dma_heap, self.domain.name)
        self.backing: str = self._backing.name
        self._lock = threading.Lock()
        self._free: dict[int, list[_Block]] = {}
        self._home: dict[str, _Block] = {}
        """label -> the block it was last given (see _pop_free_locked)."""
        self._carving: dict[int, _Slab] = {}
        self._slabs: set[_Slab] = set()
        self._live: dict[TensorBuffer, None] = {}  # insertion-ordered: oldest first for eviction
        self._waiters: deque[_Waiter] = deque()
        self._specs: dict[object, tuple[int, int, np.dtype[Any], tuple[int, ...]]] = {}
        self._closed = False
        self._in_use = 0
        self._peak = 0
        self._mapped = 0
        self._acquisitions = 0
        self._reuses = 0
        self._evictions = 0
        self._restores = 0
        self._bytes_evicted = 0
        self._bytes_copied: dict[tuple[str, str], int] = {}
        self._copies: dict[tuple[str, str], int] = {}
        self._mappings: dict[tuple[str, str], int] = {}

    # -- acquiring -------------------------------------------------------------

    @staticmethod
    def _parse(size: SizeSpec) -> tuple[int, np.dtype[Any], tuple[int, ...]]:
        if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
            n = int(size)
            if n < 0:
                raise BufferStateError(f"cannot allocate a negative number of bytes ({n})")
            return n, _U8, (n,)
        try:
            dtype_like, shape_like = size  # type: ignore[misc]
            dtype = np.dtype(dtype_like)
            shape = tuple(int(s) for s in shape_like)
        except (TypeError, ValueError) as exc:
            raise BufferStateError(f"expected nbytes or (dtype, shape), got {size!r}") from exc
        if any(s < 0 for s in shape) or dtype.itemsize == 0:
            raise BufferStateError(f"bad tensor shape/dtype {shape}/{dtype}")
        return math.prod(shape) * dtype.itemsize, dtype, shape

    def _spec(self, size: SizeSpec) -> tuple[int, int, np.dtype[Any], tuple[int, ...]]:
        nbytes, dtype, shape = self._parse(size)
        spec = (nbytes, size_class(nbytes), dtype, shape)
        try:
            if len(self._specs) >= 4096:  # bounded: shapes of one model are few
                self._specs.clear()
            self._specs[size] = spec  # type: ignore[index]
        except TypeError:
            pass  # unhashable (a list shape): parsed every time
        return spec

    def _check_fits(self, cls: int) -> None:
        if self._closed:
            raise RuntimeStateError(f"buffer pool {self.domain.name!r} is closed")
        if self.capacity_bytes is not None and cls > self.capacity_bytes:
            raise BufferStateError(
                f"a {cls}-byte buffer can never fit pool {self.domain.name!r} (capacity {self.capacity_bytes} bytes)"
            )

    def _has_room_locked(self, cls: int) -> bool:
        cap = self.capacity_bytes
        return cap is None or (not self._waiters and self._in_use + cls <= cap)

    def acquire_nowait(
        self, size: SizeSpec, /, *, owner: str | None = None, tag: str | None = None, label: str = ""
    ) -> TensorBuffer:
        """A buffer for ``size`` (nbytes, or ``(dtype, shape)``) with one reference, ALLOCATED.

        :param owner: who may write it (default: the domain's name).
        :param tag: a transfer channel to bind it to, if already known.
        :param label: names the buffer in errors and leak reports (the stage that produced it).
        :raises anyio.WouldBlock: the budget is exhausted (or others are already waiting).
        :raises BufferStateError: bad size, or larger than the whole capacity.
        :raises RuntimeStateError: the pool is closed.
        """
        try:
            nbytes, cls, dtype, shape = self._specs[size]  # type: ignore[index]
        except (KeyError, TypeError):
            nbytes, cls, dtype, shape = self._spec(size)
        for attempt in (0, 1):
            with self._lock:
                if self._closed or (self.capacity_bytes is not None and cls > self.capacity_bytes):
                    self._check_fits(cls)
                cap = self.capacity_bytes
                if cap is None or (not self._waiters and self._in_use + cls <= cap):
                    self._in_use += cls
                    free = self._free.get(cls)
                    if free:  # the hot path: a recycled block, no system call
                        block = self._pop_free_locked(free, label)
                        self._acquisitions += 1
                        self._reuses += 1
                        block.slab.in_use += 1
                        if self._in_use > self._peak:
                            self._peak = self._in_use
                    else:
                        try:
                            block = self._take_block_locked(cls, label)
                        except BaseException:
                            self._in_use -= cls
                            raise
                    buf = TensorBuffer(self, block, nbytes, dtype, shape, owner or self.domain.name, tag, label)
                    self._live[buf] = None
                    return buf
            if attempt or not self.evict_when_full or self._waiters:
                break
            assert cap is not None
            self.evict_idle(self._in_use + cls - cap)
        raise anyio.WouldBlock

    async def acquire(
        self, size: SizeSpec, /, *, owner: str | None = None, tag: str | None = None, label: str = ""
    ) -> TensorBuffer:
        """Like :meth:`acquire_nowait` but waits (FIFO) for room instead of raising ``WouldBlock``.

        A checkpoint. Cancellation while waiting leaves nothing behind.

        :raises BufferStateError: bad size, or larger than the whole capacity.
        :raises RuntimeStateError: the pool is or gets closed.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            buf = self.acquire_nowait(size, owner=owner, tag=tag, label=label)
        except anyio.WouldBlock:
            pass
        else:
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return buf
        nbytes, dtype, shape = self._parse(size)
        cls = size_class(nbytes)
        await self._reserve(cls)
        with self._lock:
            return self._new_handle_locked(cls, nbytes, dtype, shape, owner, tag, label)

    async def _reserve(self, cls: int) -> None:
        """Wait until ``cls`` bytes are granted (counted in ``_in_use``) to the caller."""
        waiter = _Waiter(cls)
        with self._lock:
            self._check_fits(cls)
            if self._has_room_locked(cls):
                self._in_use += cls
                return
            self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            with self._lock:
                if waiter.granted:
                    self._in_use -= cls
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                wakes = self._grant_locked()
            _wake(wakes)
            raise
        if waiter.closed:
            raise RuntimeStateError(f"buffer pool {self.domain.name!r} closed while waiting for memory")

    def _grant_locked(self) -> list[_Waiter]:
        cap = self.capacity_bytes
        granted: list[_Waiter] = []
        while self._waiters and (cap is None or self._in_use + self._waiters[0].nbytes <= cap):
            w = self._waiters.popleft()
            w.granted = True
            self._in_use += w.nbytes
            granted.append(w)
        return granted

    def _pop_free_locked(self, free: list[_Block], label: str) -> _Block:
        """A block from a non-empty free list: the one ``label`` had last time if it is free.

        A stage output written to the same block request after request lets the backend keep
        its bindings (onnxruntime IO binding rebinds a name only for a new address: ~15 us per
        tensor with the caches cold), for the producing stage and every consumer alike.
        """
        home = self._home.get(label) if label else None
        if home is not None and home.free and home.size == free[0].size:
            if free[-1] is home:
                free.pop()
            else:
                free.remove(home)
            block = home
        else:
            block = free.pop()
            if label:
                self._remember_home_locked(label, block)
        block.free = False
        return block

    def _remember_home_locked(self, label: str, block: _Block) -> None:
        if len(self._home) >= _MAX_HOMES:  # labels naming one request each must not pile up
            self._home.clear()
        self._home[label] = block

    def _take_block_locked(self, cls: int, label: str = "") -> _Block:
        self._acquisitions += 1
        free = self._free.get(cls)
        if free:
            block = self._pop_free_locked(free, label)
            self._reuses += 1
        else:
            slab = self._carving.get(cls)
            if slab is None or slab.carved + cls > slab.size:
                slab_size = cls if cls >= SLAB_BYTES else (SLAB_BYTES // cls) * cls
                try:
                    fd, mm = self._backing.map(slab_size)
                except (OSError, ValueError) as exc:
                    self._acquisitions -= 1
                    raise BufferStateError(
                        f"pool {self.domain.name!r}: could not map {slab_size} bytes of {self.backing} memory: {exc}"
                    ) from exc
                slab = _Slab(fd, mm, slab_size)
                self._slabs.add(slab)
                self._carving[cls] = slab
                self._mapped += slab_size
            block = _Block(slab, slab.carved, cls)
            slab.carved += cls
            if label:
                self._remember_home_locked(label, block)
        block.slab.in_use += 1
        if self._in_use > self._peak:
            self._peak = self._in_use
        return block

    def _new_handle_locked(
        self,
        cls: int,
        nbytes: int,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        owner: str | None,
        tag: str | None,
        label: str,
    ) -> TensorBuffer:
        try:
            block = self._take_block_locked(cls, label)
        except BaseException:
            self._in_use -= cls
            raise
        buf = TensorBuffer(self, block, nbytes, dtype, shape, owner or self.domain.name, tag, label)
        self._live[buf] = None
        return buf

    # -- returning ---------------------------------------------------------------

    def _return_block_locked(self, block: _Block) -> None:
        slab = block.slab
        slab.in_use -= 1
        if not self._closed:
            block.free = True
            self._free.setdefault(block.size, []).append(block)
        elif slab.in_use == 0:
            self._unmap_locked(slab)

    def _unmap_locked(self, slab: _Slab) -> None:
        self._slabs.discard(slab)
        self._mapped -= slab.size
        slab.unmap()

    def _free_locked(self, buf: TensorBuffer) -> list[_Waiter]:
        buf._state = BufferState.RELEASED
        buf._view = None
        buf._parked = None
        self._live.pop(buf, None)
        block = buf._block
        if block is None:  # evicted: its memory went back already
            return []
        buf._block = None
        self._return_block_locked(block)
        self._in_use -= block.size
        return self._grant_locked() if self._waiters else []

    # -- memory pressure ---------------------------------------------------------------

    def evict(self, buf: TensorBuffer) -> int:
        """ALLOCATED -> EVICTED: park the data in host heap, give the memory back, drop the tag.

        Views taken before are invalid afterwards; the next :meth:`TensorBuffer.array`,
        ``.ptr`` or :meth:`TensorBuffer.activate` restores the buffer. Returns the bytes freed.

        :raises BufferStateError: the buffer is not ALLOCATED (ACTIVE ones hold their channel and
            cannot be evicted) or belongs to another pool.
        """
        with self._lock:
            freed = self._evict_locked(buf)
            wakes = self._grant_locked() if self._waiters else []
        _wake(wakes)
        return freed

    def _evict_locked(self, buf: TensorBuffer) -> int:
        if buf._pool is not self:
            raise BufferStateError(f"buffer {buf.label!r} belongs to pool {buf._pool.domain.name!r}, not {self.domain.name!r}")
        if buf._state is not BufferState.ALLOCATED or buf._block is None:
            raise BufferStateError(f"buffer {buf.label!r}: illegal transition {buf._state.value} -> evicted")
        block = buf._block
        buf._parked = block.data[: buf.nbytes].copy()
        buf._block = None
        buf._view = None
        buf.tag = None
        buf._state = BufferState.EVICTED
        self._return_block_locked(block)
        self._in_use -= block.size
        self._evictions += 1
        self._bytes_evicted += buf.nbytes
        return block.size

    def evict_idle(self, nbytes: int) -> int:
        """Evict idle (ALLOCATED) buffers, oldest first, until ``nbytes`` are freed; returns bytes freed."""
        freed = 0
        with self._lock:
            for buf in list(self._live):
                if freed >= nbytes:
                    break
                if buf._state is BufferState.ALLOCATED and buf._block is not None:
                    freed += self._evict_locked(buf)
            wakes = self._grant_locked() if self._waiters else []
        _wake(wakes)
        return freed

    def restore_nowait(self, buf: TensorBuffer) -> None:
        """EVICTED -> ALLOCATED: take memory again and copy the parked data back.

        :raises BufferStateError: the buffer is not EVICTED or belongs to another pool.
        :raises anyio.WouldBlock: the budget has no room for it now.
        :raises RuntimeStateError: the pool is closed.
        """
        with self._lock:
            self._check_restorable(buf)
            self._check_fits(buf.size_class)
            if not self._has_room_locked(buf.size_class):
                raise anyio.WouldBlock
            self._in_use += buf.size_class
            self._restore_locked(buf)

    async def restore(self, buf: TensorBuffer) -> None:
        """Like :meth:`restore_nowait` but waits for room. A no-op unless the buffer is EVICTED."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if buf._state is not BufferState.EVICTED:
            return
        await self._reserve(buf.size_class)
        with self._lock:
            if buf._pool is self and buf._state is BufferState.EVICTED:
                self._restore_locked(buf)
                return
            # restored (or released) by someone else while we waited: hand the grant back
            self._in_use -= buf.size_class
            wakes = self._grant_locked()
        _wake(wakes)

    def _check_restorable(self, buf: TensorBuffer) -> None:
        if buf._pool is not self or buf._state is not BufferState.EVICTED:
            raise BufferStateError(f"buffer {buf.label!r}: illegal transition {buf._state.value} -> allocated (restore)")

    def _restore_locked(self, buf: TensorBuffer) -> None:
        try:
            block = self._take_block_locked(buf.size_class)
        except BaseException:
            self._in_use -= buf.size_class
            raise
        assert buf._parked is not None
        block.data[: buf.nbytes] = buf._parked
        buf._parked = None
        buf._block = block
        buf._state = BufferState.ALLOCATED
        self._restores += 1

    # -- accounting ----------------------------------------------------------------

    def record_copy(self, src: MemoryDomain | str, dst: MemoryDomain | str, nbytes: int) -> None:
        """Account a copy of ``nbytes`` from ``src`` to ``dst``; ``nbytes == 0`` records a zero-copy mapping."""
        key = (str(src), str(dst))
        with self._lock:
            if nbytes:
                self._bytes_copied[key] = self._bytes_copied.get(key, 0) + nbytes
                self._copies[key] = self._copies.get(key, 0) + 1
            else:
                self._mappings[key] = self._mappings.get(key, 0) + 1

    def statistics(self) -> PoolStatistics:
        """A consistent snapshot of the pool's counters."""
        with self._lock:
            return PoolStatistics(
                domain=self.domain.name,
                backing=self.backing,
                capacity_bytes=self.capacity_bytes,
                bytes_allocated=self._mapped,
                bytes_in_use=self._in_use,
                peak_bytes_in_use=self._peak,
                live_buffers=len(self._live),
                acquisitions=self._acquisitions,
                reuses=self._reuses,
                waiting=len(self._waiters),
                evictions=self._evictions,
                restores=self._restores,
                bytes_evicted=self._bytes_evicted,
                bytes_copied=MappingProxyType(dict(self._bytes_copied)),
                copies=MappingProxyType(dict(self._copies)),
                mappings=MappingProxyType(dict(self._mappings)),
            )

    def leaks(self) -> tuple[LeakedBuffer, ...]:
        """Buffers still referenced, oldest first (no exception; see :meth:`close`)."""
        with self._lock:
            return tuple(
                LeakedBuffer(b.label, b.nbytes, b._refs, b._state, b.owner) for b in self._live if b._refs > 0
            )

    # -- shutdown ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def trim(self) -> int:
        """Unmap slabs none of whose blocks is in use; returns the bytes given back to the OS."""
        with self._lock:
            return self._trim_locked()

    def _trim_locked(self) -> int:
        idle = {s for s in self._slabs if s.in_use == 0}
        if not idle:
            return 0
        for cls, blocks in self._free.items():
            for b in blocks:
                if b.slab in idle:
                    b.free = False
            self._free[cls] = [b for b in blocks if b.slab not in idle]
        self._home = {k: b for k, b in self._home.items() if b.slab not in idle}
        for cls, slab in list(self._carving.items()):
            if slab in idle:
                del self._carving[cls]
        released = 0
        for slab in idle:
            released += slab.size
            self._unmap_locked(slab)
        return released

    def close(self) -> None:
        """Give memory back, fail waiting tasks, and report buffers still referenced.

        Idempotent. Leaked buffers stay usable; their memory is unmapped at their last release.

        :raises BufferLeakError: buffers were still referenced; the message names their labels
            and the exception's ``labels`` attribute lists them.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiters = list(self._waiters)
            self._waiters.clear()
            for w in waiters:
                w.closed = True
            for blocks in self._free.values():
                for b in blocks:
                    b.free = False
            self._free.clear()
            self._home.clear()
            self._carving.clear()
            for slab in [s for s in self._slabs if s.in_use == 0]:
                self._unmap_locked(slab)
            leaked = [b for b in self._live if b._refs > 0]
        _wake(waiters)
        self._backing.close()  # only the heap fd; mapped slabs do not need it
        if leaked:
            desc = ", ".join(f"{b.label or '<unlabelled>'!r} ({b.nbytes} B, refs={b._refs}, {b._state.value})" for b in leaked)
            err = BufferLeakError(
                f"pool {self.domain.name!r} closed with {len(leaked)} buffer(s) still referenced: {desc}"
            )
            err.labels = [b.label for b in leaked]  # type: ignore[attr-defined]
            raise err

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            self.close()
        except BufferLeakError:
            if exc_type is None:
                raise
            # the error already propagating is the cause; leaked buffers are its consequence

    def __repr__(self) -> str:
        return f"<BufferPool {self.domain.name!r} {self.backing} in_use={self._in_use} live={len(self._live)}>"


def pools_for(
    topology: Topology,
    *,
    capacity_bytes: int | Mapping[str, int | None] | None = None,
    **kwargs: Any,
) -> dict[str, BufferPool]:
    """One :class:`BufferPool` per domain of ``topology``, keyed by domain name.

    ``capacity_bytes`` is one bound for all, or a mapping by domain name; other keyword
    arguments go to every pool (``root=``, ``backing=``, ...).
    """
    pools: dict[str, BufferPool] = {}
    for d in topology.domains:
        cap = capacity_bytes.get(d.name) if isinstance(capacity_bytes, Mapping) else capacity_bytes
        pools[d.name] = BufferPool(d, capacity_bytes=cap, **kwargs)
    return pools
