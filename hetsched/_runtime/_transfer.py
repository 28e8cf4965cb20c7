"""The DMA-preemptive transfer engine: moves tensors between memory domains.

How one ``await engine.transfer(buf, "npu", priority=p)`` proceeds::

    if src and dst share DRAM (topology):             # unified-memory SoC, or same domain
        before_transfer; retain(buf); record 0-byte mapping; after_transfer
        return buf                                    # the very same memory
    pin src (extra reference, ACTIVE read hold, tag = channel)
    out = await dst_pool.acquire(...)                 # backpressure in the destination domain
    out ACTIVE (write hold, tag = channel); before_transfer
    wait for the channel (queue ordered by priority, then arrival)
    for each chunk of chunk_bytes:
        if a strictly more urgent transfer waits on the channel:
            preempted                                 # SOFT-SUSPEND: keep offset, hand the channel over
            wait until the channel comes back         # no restart: resumes at the same offset
            resumed
        copy the chunk (in a worker thread, GIL released, unless it is <= inline_bytes);
            to or from a ``cuda`` domain: cudaMemcpyAsync on the priority's CUDA stream, waited for
    hand the channel to the most urgent waiter; out and src back to ALLOCATED; unpin src
    after_transfer; return out                        # caller owns its one reference

Cancellation (an anyio cancel scope around ``transfer``) lands at a chunk boundary
(a chunk already in a worker thread finishes first, so no thread ever writes
into memory that went back to the pool): the destination buffer is released, the
channel handed on, the source unpinned. Lower priority numbers are more urgent
(``Priority.REALTIME = 0`` ... ``BACKGROUND = 3``); equal priorities never preempt
each other, and a preempted transfer keeps its place among equals.

The engine and its transfers live on one event loop; only the copies run in
worker threads (an engine-owned capacity limiter bounds them).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import numpy as np

from .._errors import RuntimeStateError, TransferError
from ._buffers import BufferPool, BufferState, TensorBuffer
from ._cuda_memory import chunk_copy
from ._domains import MemoryDomain, Topology

__all__ = [
    "ChannelStatistics",
    "CopyFn",
    "TransferEngine",
    "TransferHooks",
    "TransferInfo",
    "TransferStatistics",
    "rate_limited_copy",
]

CopyFn = Callable[[np.ndarray[Any, np.dtype[np.uint8]], np.ndarray[Any, np.dtype[np.uint8]]], None]
"""``copy_fn(dst_chunk, src_chunk)``: moves one chunk (1-D uint8 views). Runs in a worker thread."""


def _numpy_copy(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    np.copyto(dst, src)  # releases the GIL for plain dtypes


def rate_limited_copy(
    bytes_per_second: float,
    *,
    copy: CopyFn | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> CopyFn:
    """A ``copy_fn`` that moves bytes no faster than ``bytes_per_second``.

    For a simulated board (the SoC twin): on a host where every domain is host DRAM a copy
    takes the time of a memcpy, not of the board's DMA link; this makes each chunk last as
    long as it would on that link (the worker thread sleeps, so the GIL stays free).

    :raises TransferError: ``bytes_per_second`` is not positive.
    """
    if not bytes_per_second > 0:
        raise TransferError(f"bytes_per_second must be positive, got {bytes_per_second}")
    inner = copy or _numpy_copy

    def copy_at_rate(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
        t0 = clock()
        inner(dst, src)
        left = src.nbytes / bytes_per_second - (clock() - t0)
        if left > 0:
            sleep(left)

    return copy_at_rate


@dataclass(frozen=True, slots=True)
class TransferInfo:
    """What a hook is told about a transfer."""

    src: str
    dst: str
    channel: str | None
    """None for a zero-copy mapping."""
    nbytes: int
    priority: int
    offset: int
    """Bytes already copied (the soft-suspended progress on ``preempted``/``resumed``)."""
    label: str
    mapped: bool


class TransferHooks(Protocol):
    """What the engine reports to (sync, on the loop): each member a callable, or None for an
    event nobody listens to (it then costs nothing). Methods of these names qualify."""

    @property
    def before_transfer(self) -> Callable[[TransferInfo], None] | None: ...
    @property
    def after_transfer(self) -> Callable[[TransferInfo], None] | None: ...
    @property
    def preempted(self) -> Callable[[TransferInfo], None] | None: ...
    @property
    def resumed(self) -> Callable[[TransferInfo], None] | None: ...


@dataclass(frozen=True, slots=True)
class ChannelStatistics:
    """Counters of one transfer channel."""

    name: str
    transfers: int
    """Copies completed on this channel."""
    cancelled: int
    """Transfers that ended before their last byte (cancelled, or the copy failed)."""
    bytes: int
    """Bytes moved (a resumed transfer's bytes are counted once: it never restarts)."""
    chunks: int
    preemptions: int
    resumes: int
    suspended_seconds: float
    """Total time transfers spent soft-suspended after a preemption."""
    queued_seconds: float
    """Total time transfers waited for the channel before their first chunk."""
    busy: bool
    waiting: int
    """Transfers queued or suspended on the channel now."""


@dataclass(frozen=True)
class TransferStatistics:
    """A snapshot of a :class:`TransferEngine`."""

    transfers: int
    """Completed real copies."""
    mappings: int
    """Zero-copy hand-offs between domains sharing DRAM (or within one domain)."""
    bytes: int
    preemptions: int
    suspended_seconds: float
    in_flight: int
    channels: Mapping[str, ChannelStatistics]


class _Transfer:
    __slots__ = ("event", "label", "nbytes", "offset", "priority", "seq")

    def __init__(self, priority: int, seq: int, nbytes: int, label: str) -> None:
        self.priority = priority
        self.seq = seq
        self.nbytes = nbytes
        self.label = label
        self.offset = 0
        self.event: anyio.Event | None = None

    def __lt__(self, other: _Transfer) -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


class _Channel:
    __slots__ = (
        "bytes",
        "cancelled",
        "chunks",
        "name",
        "owner",
        "preemptions",
        "queue",
        "queued",
        "resumes",
        "suspended",
        "transfers",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.owner: _Transfer | None = None
        self.queue: list[_Transfer] = []  # heap: most urgent, then oldest, first
        self.transfers = self.cancelled = self.bytes = self.chunks = 0
        self.preemptions = self.resumes = 0
        self.suspended = self.queued = 0.0

    def hand_over(self) -> None:
        """The owner gives the channel up: the most urgent waiter gets it and is woken."""
        if self.queue:
            nxt = heapq.heappop(self.queue)
            self.owner = nxt
            assert nxt.event is not None
            nxt.event.set()
        else:
            self.owner = None

    async def wait_turn(self, t: _Transfer) -> None:
        """Queue ``t`` and wait until it owns the channel; on cancellation leave no trace."""
        t.event = anyio.Event()
        heapq.heappush(self.queue, t)
        try:
            await t.event.wait()
        except BaseException:
            if self.owner is t:
                self.hand_over()
            elif t in self.queue:
                self.queue.remove(t)
                heapq.heapify(self.queue)
            raise

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(
            name=self.name,
            transfers=self.transfers,
            cancelled=self.cancelled,
            bytes=self.bytes,
            chunks=self.chunks,
            preemptions=self.preemptions,
            resumes=self.resumes,
            suspended_seconds=self.suspended,
            queued_seconds=self.queued,
            busy=self.owner is not None,
            waiting=len(self.queue),
        )


class TransferEngine:
    """Moves tensors between memory domains over prioritised, preemptible channels.

    Use as ``async with TransferEngine(topology, pools) as eng:``; transfers run in the
    calling task (the engine starts no tasks of its own), and leaving the block waits for
    transfers still in flight in other tasks.

    :param topology: which domains share DRAM and which channel links the others.
    :param pools: the buffer pool of each domain, by name (see :func:`pools_for`).
    :param chunk_bytes: copy granularity, i.e. how soon a more urgent transfer gets the channel.
    :param inline_bytes: chunks up to this size are copied on the event loop thread, because
        a worker-thread round trip costs more than the copy.
    :param copy_threads: at most this many chunk copies run in worker threads at once.
    :param copy_fn: moves one chunk; the default is ``numpy.copyto``. A device backend injects
        its own DMA/memcpy here.
    :param hooks: a :class:`TransferHooks`: ``before_transfer``, ``after_transfer``, ``preempted``,
        ``resumed``, each a callable or None (None costs nothing).
    :raises TransferError: ``chunk_bytes`` is not positive or a pool's domain is unknown.
    """

    def __init__(
        self,
        topology: Topology,
        pools: Mapping[str, BufferPool],
        *,
        chunk_bytes: int = 1 << 20,
        inline_bytes: int = 64 << 10,
        copy_threads: int = 2,
        copy_fn: CopyFn | None = None,
        hooks: TransferHooks | None = None,
    ) -> None:
        if chunk_bytes <= 0 or copy_threads <= 0:
            raise TransferError(f"chunk_bytes and copy_threads must be positive, got {chunk_bytes}, {copy_threads}")
        for name, pool in pools.items():
            if topology.domain(name) != pool.domain:
                raise TransferError(f"pool for {name!r} serves domain {pool.domain.name!r}")
        self._topology = topology
        self._pools = dict(pools)
        self.chunk_bytes = chunk_bytes
        self.inline_bytes = inline_bytes
        self._copy_threads = copy_threads
        self._copy = copy_fn or _numpy_copy
        self._on_before = hooks.before_transfer if hooks is not None else None
        self._on_after = hooks.after_transfer if hooks is not None else None
        self._on_preempted = hooks.preempted if hooks is not None else None
        self._on_resumed = hooks.resumed if hooks is not None else None
        self._channels: dict[str, _Channel] = {}
        self._routes: dict[tuple[MemoryDomain, MemoryDomain | str], tuple[MemoryDomain, _Channel | None]] = {}
        self._seq = itertools.count()
        self._limiter: anyio.CapacityLimiter | None = None
        self._open = False
        self._closed = False
        self._in_flight = 0
        self._idle: anyio.Event | None = None
        self._transfers = 0
        self._mappings = 0

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> TransferEngine:
        if self._open or self._closed:
            raise RuntimeStateError("a TransferEngine can be entered only once")
        self._limiter = anyio.CapacityLimiter(self._copy_threads)
        self._open = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        if self._in_flight:
            self._idle = anyio.Event()
            await self._idle.wait()

    def _check_open(self) -> None:
        if not self._open or self._closed:
            raise RuntimeStateError("TransferEngine used outside its 'async with' block")

    # -- transfers ---------------------------------------------------------------------

    async def transfer(
        self,
        src: TensorBuffer,
        dst: MemoryDomain | str,
        *,
        priority: int = 2,
        label: str | None = None,
    ) -> TensorBuffer:
        """Make ``src``'s tensor available in domain ``dst``; returns a buffer the caller owns one reference of.

        When the domains share memory the result is ``src`` itself with one more reference
        (a zero-byte mapping is recorded); otherwise a new ALLOCATED buffer of the destination
        pool holding a copy, tagged with the channel used. ``src`` keeps the caller's
        reference either way. An EVICTED ``src`` is restored first.

        :param priority: smaller is more urgent; a strictly more urgent transfer preempts this
            one at the next chunk boundary.
        :param label: names the destination buffer (default: ``src.label``).
        :raises TransferError: unknown domain, no pool for ``dst``, or the copy failed.
        :raises BufferStateError: ``src`` was released or is held for writing.
        :raises RuntimeStateError: the engine is not entered or already closed.
        """
        self._check_open()
        src_dom = src.domain
        try:
            dst_dom, ch = self._routes[src_dom, dst]
        except KeyError:
            dst_dom, ch = self._route(src_dom, dst)
        lbl = src.label if label is None else label
        if ch is None:
            await anyio.lowlevel.checkpoint()
            src.retain()
            before, after = self._on_before, self._on_after
            info = (TransferInfo(src_dom.name, dst_dom.name, None, src.nbytes, priority, 0, lbl, True)
                    if before is not None or after is not None else None)
            if before is not None and info is not None:
                before(info)
            src.pool.record_copy(src_dom, dst_dom, 0)
            self._mappings += 1
            if after is not None and info is not None:
                after(info)
            return src
        try:
            dst_pool = self._pools[dst_dom.name]
        except KeyError:
            raise TransferError(f"no buffer pool for memory domain {dst_dom.name!r}") from None

        src.retain()  # pinned for the copy even if the caller releases meanwhile
        self._in_flight += 1
        try:
            if src.state is BufferState.EVICTED:
                await src.pool.restore(src)
            spec = (src.dtype, src.shape)
            try:
                out = dst_pool.acquire_nowait(spec, owner=dst_dom.name, tag=ch.name, label=lbl)
            except anyio.WouldBlock:
                out = await dst_pool.acquire(spec, owner=dst_dom.name, tag=ch.name, label=lbl)
            try:
                await self._copy_on(ch, src, out, priority, lbl, src_dom, dst_dom)
            except BaseException:
                out.release()
                raise
            return out
        finally:
            src.release()
            self._in_flight -= 1
            if not self._in_flight and self._idle is not None:
                self._idle.set()

    def _route(self, src_dom: MemoryDomain, dst: MemoryDomain | str) -> tuple[MemoryDomain, _Channel | None]:
        dst_dom = self._topology.domain(dst)
        name = self._topology.channel(src_dom, dst_dom)
        ch = None
        if name is not None:
            ch = self._channels.get(name)
            if ch is None:
                ch = self._channels[name] = _Channel(name)
        self._routes[src_dom, dst] = (dst_dom, ch)
        return dst_dom, ch

    async def _copy_on(
        self,
        ch: _Channel,
        src: TensorBuffer,
        out: TensorBuffer,
        priority: int,
        label: str,
        src_dom: MemoryDomain,
        dst_dom: MemoryDomain,
    ) -> None:
        nbytes = src.nbytes
        t = _Transfer(priority, next(self._seq), nbytes, label)

        def info() -> TransferInfo:
            return TransferInfo(src_dom.name, dst_dom.name, ch.name, nbytes, priority, t.offset, label, False)

        src.activate(tag=ch.name, shared=True)
        try:
            out.activate(owner=dst_dom.name, tag=ch.name)
            try:
                if self._on_before is not None:
                    self._on_before(info())
                if ch.owner is None and not ch.queue:
                    ch.owner = t
                else:
                    t0 = anyio.current_time()
                    await ch.wait_turn(t)
                    ch.queued += anyio.current_time() - t0
                try:
                    await self._run_chunks(ch, t, src, out, info)
                finally:
                    if ch.owner is t:
                        ch.hand_over()
                    if t.offset:
                        out.pool.record_copy(src_dom, dst_dom, t.offset)
                ch.transfers += 1
                self._transfers += 1
                if self._on_after is not None:
                    self._on_after(info())
            except BaseException:
                if t.offset < nbytes:
                    ch.cancelled += 1
                raise
            finally:
                out.deactivate()
        finally:
            src.deactivate()

    async def _run_chunks(
        self,
        ch: _Channel,
        t: _Transfer,
        src: TensorBuffer,
        out: TensorBuffer,
        info: Callable[[], TransferInfo],
    ) -> None:
        n = t.nbytes
        if not n:
            await anyio.lowlevel.checkpoint()
            return
        # both are ACTIVE (held), so neither can be evicted or released under us: use the raw blocks
        sb, ob = src._block, out._block
        assert sb is not None and ob is not None
        copy: Callable[[int, int], None]
        if sb.slab.device is None and ob.slab.device is None:
            s, d, host_copy = sb.data[:n], ob.data[:n], self._copy

            def copy(start: int, end: int) -> None:
                host_copy(d[start:end], s[start:end])
        else:  # a ``cuda`` pool's block on one side: cudaMemcpyAsync on the priority's stream
            copy = chunk_copy(sb.ptr, sb.size, sb.slab.device, ob.ptr, ob.size, ob.slab.device, t.priority)
        chunk = self.chunk_bytes
        while t.offset < n:
            if ch.queue and ch.queue[0].priority < t.priority:
                # soft-suspend: progress (t.offset) and the bound buffers stay as they are
                ch.preemptions += 1
                if self._on_preempted is not None:
                    self._on_preempted(info())
                ch.hand_over()  # to the urgent head; t re-queues below with its original seq
                t0 = anyio.current_time()
                await ch.wait_turn(t)
                ch.suspended += anyio.current_time() - t0
                ch.resumes += 1
                if self._on_resumed is not None:
                    self._on_resumed(info())
                continue
            end = min(t.offset + chunk, n)
            try:
                if end - t.offset <= self.inline_bytes:
                    copy(t.offset, end)
                    await anyio.lowlevel.checkpoint()
                else:
                    await anyio.to_thread.run_sync(copy, t.offset, end, limiter=self._limiter)
            except Exception as exc:
                raise TransferError(
                    f"copying {_label_of(t)} over channel {ch.name!r} failed at byte {t.offset}: {exc}"
                ) from exc
            ch.bytes += end - t.offset
            ch.chunks += 1
            t.offset = end

    # -- introspection -----------------------------------------------------------------------

    def statistics(self) -> TransferStatistics:
        """Counters of the engine and each channel used so far."""
        chans = {name: ch.statistics() for name, ch in self._channels.items()}
        return TransferStatistics(
            transfers=self._transfers,
            mappings=self._mappings,
            bytes=sum(c.bytes for c in chans.values()),
            preemptions=sum(c.preemptions for c in chans.values()),
            suspended_seconds=sum(c.suspended_seconds for c in chans.values()),
            in_flight=self._in_flight,
            channels=MappingProxyType(chans),
        )


def _label_of(t: _Transfer) -> str:
    return repr(t.label) if t.label else f"a {t.nbytes}-byte transfer"
