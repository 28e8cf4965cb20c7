"""Memory-domain topology and the DMA-preemptive transfer engine (hetsched._runtime._transfer)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest

from hetsched import BufferStateError, RuntimeStateError, TransferError
from hetsched._runtime import (
    BufferPool,
    BufferState,
    MemoryDomain,
    MemoryKind,
    TensorBuffer,
    Topology,
    TransferEngine,
    TransferInfo,
    pools_for,
    rate_limited_copy,
)

REALTIME, HIGH, NORMAL, BACKGROUND = 0, 1, 2, 3
CH = "gpu<->host"
Discrete = tuple[Topology, dict[str, BufferPool]]
"""The ``discrete`` fixture: a host and a GPU with separate memories, and their pools."""



@pytest.fixture
def discrete(tmp_path: Path) -> Iterator[Discrete]:
    topo = Topology.discrete(devices=("gpu",))
    pools = pools_for(topo, root=tmp_path)
    yield topo, pools
    for p in pools.values():
        p.close()  # raises BufferLeakError if a test leaked


def _filled(pool: BufferPool, n: int, seed: int, label: str = "") -> TensorBuffer:
    b = pool.acquire_nowait((np.uint8, (n,)), label=label or f"src{seed}")
    b.array()[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return b


def _expected(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Recorder:
    """Hooks object recording every event; copy_fn recording (and optionally gating) every chunk."""

    def __init__(self) -> None:
        self.events: list[tuple[str, TransferInfo]] = []
        self.chunks: list[tuple[int, int]] = []  # (src address, length) of each chunk copied
        self.gate = threading.Event()
        self.gate_first = False
        self._lock = threading.Lock()

    def before_transfer(self, info: TransferInfo) -> None:
        self.events.append(("before", info))

    def after_transfer(self, info: TransferInfo) -> None:
        self.events.append(("after", info))

    def preempted(self, info: TransferInfo) -> None:
        self.events.append(("preempted", info))

    def resumed(self, info: TransferInfo) -> None:
        self.events.append(("resumed", info))

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        with self._lock:
            self.chunks.append((src.ctypes.data, src.nbytes))
            first = len(self.chunks) == 1
        if first and self.gate_first and not self.gate.wait(30):
            raise RuntimeError("test gate never opened")
        np.copyto(dst, src)

    def chunks_of(self, buf: TensorBuffer) -> list[tuple[int, int]]:
        """(offset, length) of the chunks copied out of ``buf``, in copy order."""
        lo, hi = buf.ptr, buf.ptr + buf.nbytes
        return [(a - lo, n) for a, n in self.chunks if lo <= a < hi]


def _equals(get: Callable[[], int], want: int) -> Callable[[], bool]:
    """A condition for :func:`_until` that holds once ``get()`` is ``want`` (bound now, not when called)."""
    return lambda: get() == want


async def _until(pred: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not pred():  # noqa: ASYNC110 -- polls what worker threads change (no event to wait on); bounded by fail_after
            await anyio.sleep(0.001)


# -- topology --------------------------------------------------------------------


def test_topology_sharing_is_transitive_and_channels_are_named() -> None:
    topo = Topology(
        [
            MemoryDomain("host"),
            MemoryDomain("gpu", MemoryKind.DEVICE),
            MemoryDomain("npu", MemoryKind.DEVICE),
            MemoryDomain("sram", MemoryKind.SRAM),
            MemoryDomain("dla", MemoryKind.DEVICE),
        ],
        shared=[["host", "gpu"], ["gpu", "npu"]],
        channels={("sram", "npu"): "npu-dma", ("dla", "sram"): "npu-dma"},
    )
    assert topo.shares_memory("host", "npu") and topo.shares_memory("npu", "host")
    assert topo.channel("host", "npu") is None and topo.channel("gpu", "gpu") is None
    assert topo.channel("npu", "sram") == topo.channel("sram", "dla") == "npu-dma"
    assert topo.channel("host", "dla") == topo.channel("dla", "host") == "dla<->host"
    with pytest.raises(TransferError, match="unknown memory domain 'tpu'"):
        topo.shares_memory("host", "tpu")
    with pytest.raises(TransferError, match="twice"):
        Topology([MemoryDomain("host"), MemoryDomain("host")])
    with pytest.raises(TransferError, match="share memory"):
        Topology([MemoryDomain("host"), MemoryDomain("gpu")], shared=[["host", "gpu"]], channels={("host", "gpu"): "x"})
    with pytest.raises(TransferError, match="does not match"):
        topo.domain(MemoryDomain("gpu", MemoryKind.SRAM))


def test_unified_and_discrete_constructors() -> None:
    rk = Topology.unified(devices=("gpu", "npu"), private=[("npu_sram", MemoryKind.SRAM)])
    assert rk.shares_memory("host", "gpu") and rk.shares_memory("gpu", "npu")
    assert not rk.shares_memory("npu", "npu_sram") and rk.channel("npu", "npu_sram") == "npu<->npu_sram"
    pc = Topology.discrete(devices=("gpu",))
    assert not pc.shares_memory("host", "gpu") and pc.channel("gpu", "host") == CH
    assert Topology.host_only().domains == (MemoryDomain("host"),)


# -- map vs copy ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_shared_dram_maps_instead_of_copying(tmp_path: Path) -> None:
    topo = Topology.unified(devices=("npu",))
    pools = pools_for(topo, root=tmp_path)
    rec = Recorder()
    src = _filled(pools["host"], 10_000, 1)
    async with TransferEngine(topo, pools, hooks=rec, copy_fn=rec.copy) as eng:
        out = await eng.transfer(src, "npu", priority=HIGH)
    assert out is src and out.ptr == src.ptr and out.refcount == 2
    assert rec.chunks == []  # not one byte moved
    assert [e for e, _ in rec.events] == ["before", "after"] and rec.events[0][1].mapped
    st = eng.statistics()
    assert (st.mappings, st.transfers, st.bytes) == (1, 0, 0)
    pst = pools["host"].statistics()
    assert pst.mappings == {("host", "npu"): 1} and pst.bytes_copied == {}
    out.release()
    src.release()
    for p in pools.values():
        p.close()


@pytest.mark.anyio
@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 10_000, 3 * 4096 + 17])
async def test_separate_memory_copies_in_chunks(discrete: Discrete, n: int) -> None:
    topo, pools = discrete
    rec = Recorder()
    src = pools["host"].acquire_nowait((np.float32, (n // 4, 1)), label="act")
    src.array()[:] = np.arange(n // 4, dtype=np.float32).reshape(-1, 1)
    async with TransferEngine(topo, pools, chunk_bytes=4096, inline_bytes=1024, copy_fn=rec.copy) as eng:
        out = await eng.transfer(src, "gpu")
    assert out is not src and out.pool is pools["gpu"] and out.ptr != src.ptr
    assert (out.dtype, out.shape, out.label) == (src.dtype, src.shape, "act")
    assert np.array_equal(out.array(), src.array())
    assert (out.state, out.tag, out.owner, out.refcount) == (BufferState.ALLOCATED, CH, "gpu", 1)
    assert (src.state, src.refcount) == (BufferState.ALLOCATED, 1)
    nb = src.nbytes
    assert rec.chunks_of(src) == [(o, min(4096, nb - o)) for o in range(0, nb, 4096)]
    ch = eng.statistics().channels[CH]
    assert (ch.transfers, ch.bytes, ch.busy, ch.waiting) == (1, nb, False, 0)
    assert pools["gpu"].statistics().bytes_copied == ({("host", "gpu"): nb} if nb else {})
    out.release()
    src.release()


# -- preemption -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_high_priority_preempts_background_which_resumes_from_its_offset(discrete: Discrete) -> None:
    topo, pools = discrete
    chunk, big_n, small_n = 64 << 10, 64 * (64 << 10) + 123, 3 * (64 << 10)
    rec = Recorder()
    rec.gate_first = True  # the background's first chunk waits until the HIGH one is queued
    big = _filled(pools["host"], big_n, 1, "bulk")
    small = _filled(pools["host"], small_n, 2, "urgent")
    finished: list[str] = []
    outs: dict[str, TensorBuffer] = {}

    async def go(src: TensorBuffer, prio: int) -> None:
        outs[src.label] = await eng.transfer(src, "gpu", priority=prio)
        finished.append(src.label)

    async with TransferEngine(topo, pools, chunk_bytes=chunk, inline_bytes=0, hooks=rec, copy_fn=rec.copy) as eng:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(go, big, BACKGROUND)
                await _until(lambda: len(rec.chunks) == 1)  # bulk holds the channel, mid-chunk
                tg.start_soon(go, small, HIGH)
                await _until(lambda: eng.statistics().channels[CH].waiting == 1)
                rec.gate.set()
        finally:
            rec.gate.set()

    assert finished == ["urgent", "bulk"]
    assert np.array_equal(outs["bulk"].array(), _expected(big_n, 1))
    assert np.array_equal(outs["urgent"].array(), _expected(small_n, 2))
    # the bulk copy was cut after exactly one chunk, then continued where it stopped:
    bulk_chunks = rec.chunks_of(big)
    assert [o for o, _ in bulk_chunks] == list(range(0, big_n, chunk))  # no offset twice = no restart
    assert sum(n for _, n in bulk_chunks) == big_n
    order = [("bulk" if big.ptr <= a < big.ptr + big_n else "urgent") for a, _ in rec.chunks]
    assert order == ["bulk"] + ["urgent"] * 3 + ["bulk"] * (len(bulk_chunks) - 1)
    pre = [i for e, i in rec.events if e in ("preempted", "resumed")]
    assert [(i.label, i.offset, i.priority) for i in pre] == [("bulk", chunk, BACKGROUND)] * 2
    ch = eng.statistics().channels[CH]
    assert (ch.preemptions, ch.resumes, ch.transfers) == (1, 1, 2)
    assert ch.bytes == big_n + small_n  # counted once: nothing was copied again
    assert ch.suspended_seconds >= 0 and eng.statistics().preemptions == 1
    for b in (*outs.values(), big, small):
        b.release()


@pytest.mark.anyio
async def test_queue_is_priority_then_fifo(discrete: Discrete) -> None:
    topo, pools = discrete
    rec = Recorder()
    rec.gate_first = True
    first = _filled(pools["host"], 8192, 0, "first")
    queued = [(_filled(pools["host"], 8192, i, name), prio) for i, (name, prio) in
              enumerate([("bg", BACKGROUND), ("n1", NORMAL), ("hi", HIGH), ("n2", NORMAL)], start=1)]
    finished: list[str] = []
    outs: list[TensorBuffer] = []

    async def go(src: TensorBuffer, prio: int) -> None:
        outs.append(await eng.transfer(src, "gpu", priority=prio))
        finished.append(src.label)

    async with TransferEngine(topo, pools, chunk_bytes=4096, inline_bytes=0, copy_fn=rec.copy) as eng:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(go, first, REALTIME)  # never preempted: nothing is more urgent
                await _until(lambda: len(rec.chunks) == 1)
                for k, (src, prio) in enumerate(queued, start=1):
                    tg.start_soon(go, src, prio)
                    await _until(_equals(lambda: eng.statistics().channels[CH].waiting, k))
                rec.gate.set()
        finally:
            rec.gate.set()
    assert finished == ["first", "hi", "n1", "n2", "bg"]
    assert eng.statistics().preemptions == 0
    for b in (*outs, first, *(s for s, _ in queued)):
        b.release()


# -- cancellation and failure ---------------------------------------------------------------


@pytest.mark.anyio
async def test_cancel_mid_transfer_frees_destination_and_channel(discrete: Discrete) -> None:
    topo, pools = discrete
    rec = Recorder()
    rec.gate_first = True
    src = _filled(pools["host"], 10 * 4096, 5)
    async with TransferEngine(topo, pools, chunk_bytes=4096, inline_bytes=0, copy_fn=rec.copy) as eng:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def go() -> None:
                with scope:
                    await eng.transfer(src, "gpu", priority=NORMAL)
                    pytest.fail("transfer was not cancelled")

            tg.start_soon(go)
            await _until(lambda: len(rec.chunks) == 1)
            scope.cancel()
            rec.gate.set()  # the chunk in the worker thread finishes, then the cancel lands
        gpu = pools["gpu"].statistics()
        assert (gpu.live_buffers, gpu.bytes_in_use) == (0, 0)
        assert (src.state, src.refcount) == (BufferState.ALLOCATED, 1)
        ch = eng.statistics().channels[CH]
        assert (ch.busy, ch.waiting, ch.cancelled, ch.transfers) == (False, 0, 1, 0)
        assert gpu.bytes_copied == {("host", "gpu"): 4096}  # only what really moved
        out = await eng.transfer(src, "gpu")  # the channel is free again
    assert np.array_equal(out.array(), _expected(src.nbytes, 5))
    out.release()
    src.release()


@pytest.mark.anyio
async def test_cancel_while_soft_suspended(discrete: Discrete) -> None:
    topo, pools = discrete
    rec = Recorder()
    rec.gate_first = True
    big = _filled(pools["host"], 16 * 4096, 1, "bulk")
    small = _filled(pools["host"], 4096, 2, "urgent")
    got: list[TensorBuffer] = []
    bulk_scope = anyio.CancelScope()

    hooks = rec
    hooks.preempted = lambda info: bulk_scope.cancel()  # type: ignore[method-assign]  # cancel while suspended

    async def bulk() -> None:
        with bulk_scope:
            await eng.transfer(big, "gpu", priority=BACKGROUND)

    async def urgent() -> None:
        got.append(await eng.transfer(small, "gpu", priority=HIGH))

    async with TransferEngine(topo, pools, chunk_bytes=4096, inline_bytes=0, hooks=hooks, copy_fn=rec.copy) as eng:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bulk)
                await _until(lambda: len(rec.chunks) == 1)
                tg.start_soon(urgent)
                await _until(lambda: eng.statistics().channels[CH].waiting == 1)
                rec.gate.set()
        finally:
            rec.gate.set()
    assert bulk_scope.cancelled_caught
    assert np.array_equal(got[0].array(), _expected(4096, 2))
    got[0].release()
    st = pools["gpu"].statistics()
    assert (st.live_buffers, st.bytes_in_use) == (0, 0)
    ch = eng.statistics().channels[CH]
    assert (ch.preemptions, ch.cancelled, ch.transfers, ch.busy, ch.waiting) == (1, 1, 1, False, 0)
    assert big.state is BufferState.ALLOCATED and big.refcount == 1
    big.release()
    small.release()


@pytest.mark.anyio
async def test_failing_copy_raises_transfer_error_without_leaks(discrete: Discrete) -> None:
    topo, pools = discrete
    src = _filled(pools["host"], 20_000, 3, "stage1:out")

    def broken(dst: np.ndarray, s: np.ndarray) -> None:
        raise OSError(5, "DMA fault")

    async with TransferEngine(topo, pools, chunk_bytes=4096, inline_bytes=0, copy_fn=broken) as eng:
        with pytest.raises(TransferError, match=r"'stage1:out' over channel 'gpu<->host' failed at byte 0") as info:
            await eng.transfer(src, "gpu")
    assert isinstance(info.value.__cause__, OSError)
    assert pools["gpu"].statistics().live_buffers == 0
    assert (src.state, src.refcount) == (BufferState.ALLOCATED, 1)
    src.release()


@pytest.mark.anyio
async def test_bad_requests(discrete: Discrete) -> None:
    topo, pools = discrete
    src = _filled(pools["host"], 100, 1)
    eng = TransferEngine(topo, pools)
    with pytest.raises(RuntimeStateError):
        await eng.transfer(src, "gpu")
    async with eng:
        with pytest.raises(TransferError, match="unknown memory domain 'npu'"):
            await eng.transfer(src, "npu")
        held = pools["host"].acquire_nowait(64)
        held.activate()  # someone is writing it: cannot be read by a transfer
        with pytest.raises(BufferStateError, match="held for writing"):
            await eng.transfer(held, "gpu")
        held.deactivate()
        held.release()
        with pytest.raises(BufferStateError):
            await eng.transfer(held, "gpu")  # released
    with pytest.raises(RuntimeStateError):
        await eng.transfer(src, "gpu")
    with pytest.raises(TransferError, match="positive"):
        TransferEngine(topo, pools, chunk_bytes=0)
    no_gpu_pool = {"host": pools["host"]}
    async with TransferEngine(topo, no_gpu_pool) as eng2:
        with pytest.raises(TransferError, match="no buffer pool"):
            await eng2.transfer(src, "gpu")
    assert pools["host"].statistics().live_buffers == 1
    src.release()


# -- lifecycle integration -----------------------------------------------------------------


@pytest.mark.anyio
async def test_evicted_source_is_restored_and_states_during_copy(discrete: Discrete) -> None:
    topo, pools = discrete
    src = _filled(pools["host"], 3 * 4096, 9, "parked")
    pools["host"].evict(src)
    seen: list[tuple[BufferState, BufferState, str | None]] = []
    outs: list[TensorBuffer] = []

    def copy(dst: np.ndarray, s: np.ndarray) -> None:
        np.copyto(dst, s)

    class Spy:
        after_transfer = preempted = resumed = None  # declared: nobody listens

        def before_transfer(self, info: TransferInfo) -> None:
            out = pools["gpu"].leaks()[-1]
            seen.append((src.state, out.state, src.tag))

    async with TransferEngine(topo, pools, chunk_bytes=4096, hooks=Spy(), copy_fn=copy) as eng:
        outs.append(await eng.transfer(src, "gpu"))
    assert seen == [(BufferState.ACTIVE, BufferState.ACTIVE, CH)]  # both hold the channel while copying
    assert np.array_equal(outs[0].array(), _expected(src.nbytes, 9))
    assert pools["host"].statistics().restores == 1
    assert (src.state, outs[0].state) == (BufferState.ALLOCATED, BufferState.ALLOCATED)
    outs[0].release()
    src.release()


@pytest.mark.anyio
async def test_destination_budget_applies_backpressure(tmp_path: Path) -> None:
    topo = Topology.discrete(devices=("gpu",))
    pools = pools_for(topo, capacity_bytes={"gpu": 8192}, root=tmp_path)
    srcs = [_filled(pools["host"], 8192, i) for i in range(3)]
    outs: list[TensorBuffer] = []
    async with TransferEngine(topo, pools, chunk_bytes=4096) as eng, anyio.create_task_group() as tg:
        for s in srcs:
            tg.start_soon(_collect, eng, s, outs)
        await _until(lambda: len(outs) == 1)
        await anyio.wait_all_tasks_blocked()
        assert len(outs) == 1 and pools["gpu"].statistics().waiting == 2
        while len(outs) < 3:
            n = len(outs)
            outs[n - 1].release()
            await _until(_equals(lambda: len(outs), n + 1))
    outs[-1].release()
    for s in srcs:
        s.release()
    for p in pools.values():
        p.close()


async def _collect(eng: TransferEngine, src: TensorBuffer, outs: list[TensorBuffer]) -> None:
    out = await eng.transfer(src, "gpu")
    assert np.array_equal(out.array(), src.array())
    outs.append(out)


@pytest.mark.anyio
async def test_many_concurrent_transfers_arrive_intact(discrete: Discrete) -> None:
    topo, pools = discrete
    rng = random.Random(42)
    jobs = [(i, rng.choice([0, 1, 100, 4096, 5000, 70_000, 300_000]), rng.randrange(4)) for i in range(300)]
    srcs = {i: _filled(pools["host"], n, i) for i, n, _ in jobs}
    back: dict[int, TensorBuffer] = {}
    seen: list[str] = []

    class Count:
        before_transfer = preempted = resumed = None  # declared: nobody listens

        def after_transfer(self, info: TransferInfo) -> None:  # the only hook listened to
            seen.append(info.label)

    async def roundtrip(i: int, prio: int) -> None:
        out = await eng.transfer(srcs[i], "gpu", priority=prio)
        try:
            back[i] = await eng.transfer(out, "host", priority=prio)
        finally:
            out.release()

    async with (
        TransferEngine(topo, pools, chunk_bytes=16 << 10, hooks=Count()) as eng,
        anyio.create_task_group() as tg,
    ):
        for i, _, prio in jobs:
            tg.start_soon(roundtrip, i, prio)
    for i, n, _ in jobs:
        assert np.array_equal(back[i].array(), _expected(n, i)), i
        back[i].release()
        srcs[i].release()
    st = eng.statistics()
    total = sum(n for _, n, _ in jobs)
    assert st.transfers == 600 and st.bytes == 2 * total and len(seen) == 600
    assert st.channels[CH].bytes == 2 * total and st.in_flight == 0
    assert pools["gpu"].statistics().bytes_copied == {("host", "gpu"): total}
    assert pools["host"].statistics().bytes_copied == {("gpu", "host"): total}
    for p in pools.values():
        assert p.statistics().live_buffers == 0


@pytest.mark.anyio
async def test_leaving_the_engine_waits_for_transfers_in_other_tasks(discrete: Discrete) -> None:
    topo, pools = discrete
    rec = Recorder()
    rec.gate_first = True
    src = _filled(pools["host"], 4 * 4096, 4)
    outs: list[TensorBuffer] = []
    eng = TransferEngine(topo, pools, chunk_bytes=4096, inline_bytes=0, copy_fn=rec.copy)

    async def open_gate_once_closing() -> None:
        await _until(lambda: eng._closed)
        assert outs == []  # the engine is closing but the transfer is not done yet
        rec.gate.set()

    try:
        async with anyio.create_task_group() as tg:
            async with eng:
                tg.start_soon(_collect_to, eng, src, outs)
                await _until(lambda: len(rec.chunks) == 1)
                tg.start_soon(open_gate_once_closing)
            assert len(outs) == 1 and eng.statistics().in_flight == 0  # __aexit__ waited for it
    finally:
        rec.gate.set()
    outs[0].release()
    src.release()


async def _collect_to(eng: TransferEngine, src: TensorBuffer, outs: list[TensorBuffer]) -> None:
    outs.append(await eng.transfer(src, "gpu"))


def test_rate_limited_copy_paces_each_chunk() -> None:
    now = [10.0]
    slept: list[float] = []

    def fake_copy(dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)
        now[0] += 0.001  # the memcpy itself took 1 ms

    copy = rate_limited_copy(1e6, copy=fake_copy, clock=lambda: now[0], sleep=slept.append)
    a, b = np.arange(4000, dtype=np.uint8), np.zeros(4000, np.uint8)
    copy(b, a)
    assert np.array_equal(a, b)
    assert slept == [pytest.approx(0.003)]  # 4000 B at 1 MB/s = 4 ms, 1 ms already spent
    copy(b[:500], a[:500])  # faster than the link would need: no sleep
    assert len(slept) == 1
    with pytest.raises(TransferError, match="positive"):
        rate_limited_copy(0)
