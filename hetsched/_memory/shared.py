"""Where shareable memory lies: the buffer pools' live slabs that have a file descriptor.

A pool registers each memfd / dma-buf slab it maps (:func:`register_shared`) and forgets it
before unmapping it (:func:`forget_shared`); a client of a worker process asks
:func:`locate_shared` for the ``(fd, offset)`` of an array that lies in one, and hands the
worker that instead of a copy. Sorted by start address; a binary search per lookup.
"""

from __future__ import annotations

import bisect
import threading
from typing import Protocol

__all__ = ["SharedSlab", "forget_shared", "locate_shared", "register_shared"]


class SharedSlab(Protocol):
    """A mapped slab: its start address, its size, and its descriptor (-1 once closed)."""

    @property
    def ptr(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def fd(self) -> int: ...


_shared_lock = threading.Lock()
_shared_starts: list[int] = []
_shared_slabs: list[SharedSlab] = []


def register_shared(slab: SharedSlab) -> None:
    """Announce a mapped slab with a descriptor (until :func:`forget_shared`)."""
    with _shared_lock:
        i = bisect.bisect_left(_shared_starts, slab.ptr)
        _shared_starts.insert(i, slab.ptr)
        _shared_slabs.insert(i, slab)


def forget_shared(slab: SharedSlab) -> None:
    """Forget ``slab`` (before it is unmapped); no error when it was not registered."""
    with _shared_lock:
        i = bisect.bisect_left(_shared_starts, slab.ptr)
        while i < len(_shared_slabs) and _shared_starts[i] == slab.ptr:
            if _shared_slabs[i] is slab:
                del _shared_starts[i]
                del _shared_slabs[i]
                return
            i += 1


def locate_shared(address: int, nbytes: int) -> tuple[int, int] | None:
    """``(fd, offset)`` of the ``nbytes`` at ``address`` when they lie inside one live shareable slab.

    Shareable slabs are the memfd and dma-buf ones of the buffer pools (anonymous memory has no
    descriptor). ``None`` when the range is not entirely inside one such slab. The fd stays
    owned by the pool: it is valid only while the slab is mapped (until the pool unmaps it).
    Thread-safe; a binary search over the live slabs.
    """
    with _shared_lock:
        i = bisect.bisect_right(_shared_starts, address) - 1
        if i < 0:
            return None
        slab = _shared_slabs[i]
        offset = address - slab.ptr
        if offset + nbytes > slab.size or slab.fd < 0:
            return None
        return slab.fd, offset
