"""The handle: a :class:`TensorBuffer` (one pool block, its state and references) and its
:class:`SharedHandle` (what another process or device maps). See ``_buffers``."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from .._compat import StrEnum
from .._errors import BufferStateError
from ._domains import MemoryDomain
from ._memory import _Block
from ._waiting import _wake

if TYPE_CHECKING:
    from ._pool import BufferPool

__all__ = ["BufferState", "SharedHandle", "TensorBuffer"]


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


