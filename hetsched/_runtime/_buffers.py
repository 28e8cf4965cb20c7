"""Zero-copy tensor buffers and the per-domain pool that recycles them (the import point).

The parts: ``_memory`` (size classes, slabs, blocks), ``_tensor_buffer`` (the handle),
``_pool`` (the pool), ``_pool_statistics`` (what it reports).

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

from ._memory import ALIGNMENT, SLAB_BYTES, size_class
from ._pool import BufferPool, pools_for
from ._pool_statistics import LeakedBuffer, PoolStatistics
from ._tensor_buffer import BufferState, SharedHandle, TensorBuffer

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
