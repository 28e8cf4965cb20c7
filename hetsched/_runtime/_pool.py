"""The per-domain buffer pool: acquiring (with backpressure), returning, eviction, accounting.

See ``_buffers`` for the lifecycle, the memory layout and the budget.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
from numpy.typing import DTypeLike

from .._errors import BufferLeakError, BufferStateError, RuntimeStateError
from ._domains import MemoryDomain, MemoryKind, Topology
from ._memory import _MAX_HOMES, _U8, SLAB_BYTES, Backing, _Block, _open_backing, _Slab, size_class
from ._pool_statistics import LeakedBuffer, PoolStatistics
from ._tensor_buffer import BufferState, TensorBuffer
from ._waiting import _Waiter, _wake

__all__ = ["BufferPool", "pools_for"]

SizeSpec = int | tuple[DTypeLike, Sequence[int]]


class BufferPool:
    """Recycles 64-byte aligned, shareable buffers for one memory domain.

    :param domain: the memory domain (or its name, giving a HOST domain).
    :param capacity_bytes: bound on size-class bytes held by live buffers; None = unbounded.
    :param backing: ``"auto"`` (dma-heap, else memfd, else anonymous) or one of them explicitly.
    :param root: filesystem root under which ``dev/dma_heap`` is looked up (inject a fake tree
        in tests; ``"/"`` on a board). The heap is resolved inside it: one that is a symlink
        leading out of the root, or is not a character device, is never opened (``auto`` falls
        back to memfd and :attr:`backing_note` says why).
    :param dma_heap: which heap under ``dev/dma_heap`` to allocate from (a plain file name).
    :param evict_when_full: when the budget is exhausted, evict idle (ALLOCATED) buffers, oldest
        first, before making the caller wait or raising ``WouldBlock``.
    :raises PlatformError: an explicitly requested backing is unavailable, or ``dma_heap`` is
        not a plain name (has a ``/``, or is ``.``/``..``).
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
            self._specs[size] = spec
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
            nbytes, cls, dtype, shape = self._specs[size]
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
                        return self._new_handle_locked(cls, nbytes, dtype, shape, owner, tag, label)
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
            await waiter.wait()
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
                f"pool {self.domain.name!r} closed with {len(leaked)} buffer(s) still referenced: {desc}",
                labels=[b.label for b in leaked],
            )
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
