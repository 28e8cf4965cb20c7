"""What a buffer pool reports: its statistics and the buffers still referenced at close."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._tensor_buffer import BufferState

__all__ = ["LeakedBuffer", "PoolStatistics"]

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


