"""Buffer pool and tensor buffer lifecycle (hetsched._runtime._buffers)."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest

from hetsched import BufferLeakError, BufferStateError, PlatformError, RuntimeStateError
from hetsched._runtime import (
    ALIGNMENT,
    SLAB_BYTES,
    BufferPool,
    BufferState,
    MemoryDomain,
    MemoryKind,
    TensorBuffer,
    Topology,
    pools_for,
    size_class,
)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[BufferPool]:
    # An empty fake root: no dma-heap, so the memfd path is what gets exercised.
    p = BufferPool(MemoryDomain("host", MemoryKind.HOST), root=tmp_path)
    yield p
    p.close()


def test_size_classes_are_aligned_bounded_and_monotonic() -> None:
    prev = 0
    for n in [*range(0, 5000), *(int(x) for x in np.geomspace(5000, 1 << 30, 400))]:
        c = size_class(n)
        assert c >= max(n, 1) and c % ALIGNMENT == 0
        assert c >= prev
        prev = c
        if n > 256:
            assert c <= n * 1.25 + 1  # at most a quarter wasted


def test_buffers_are_64_byte_aligned_and_views_alias_ptr(pool: BufferPool) -> None:
    bufs = [pool.acquire_nowait(n, label=f"b{n}") for n in (1, 3, 63, 64, 65, 200, 257, 1000, 70_000, SLAB_BYTES + 5)]
    for b in bufs:
        assert b.ptr % 64 == 0
        assert b.array().ctypes.data == b.ptr
        assert b.array().nbytes == b.nbytes
    for b in bufs:
        b.release()
    assert pool.statistics().live_buffers == 0


def test_memfd_backing_is_shared_memory(pool: BufferPool) -> None:
    assert pool.backing == "memfd"
    b = pool.acquire_nowait((np.int32, (4, 8)), label="shared")
    h = b.export()
    assert os.readlink(f"/proc/self/fd/{h.fd}").startswith("/memfd:hetsched:host")
    b.array()[:] = np.arange(32, dtype=np.int32).reshape(4, 8)
    # what the fd shows (as another process or a driver would see it) is what we wrote ...
    assert os.pread(h.fd, h.nbytes, h.offset) == b.array().tobytes()
    # ... and writes through the fd land in our view: same memory, no copy
    os.pwrite(h.fd, np.full(32, 7, np.int32).tobytes(), h.offset)
    assert (b.array() == 7).all()
    b.release()


def test_fake_dma_heap_falls_back_to_memfd(tmp_path: Path) -> None:
    heap = tmp_path / "dev" / "dma_heap"
    heap.mkdir(parents=True)
    (heap / "system").write_bytes(b"")  # a regular file: the ioctl fails like a broken heap
    with BufferPool("host", root=tmp_path) as p:
        assert p.backing == "memfd"
        assert "unusable" in (p.backing_note or "")
        p.acquire_nowait(100).release()
    with pytest.raises(PlatformError, match="dma-buf heap"):
        BufferPool("host", root=tmp_path, backing="dma-heap")
    with BufferPool("host", root=tmp_path, backing="anonymous") as p:
        b = p.acquire_nowait(10)
        assert b.export().fd == -1 and b.ptr % 64 == 0
        b.release()


def test_reuse_by_size_class(pool: BufferPool) -> None:
    a = pool.acquire_nowait(1000)
    ptr = a.ptr
    a.release()
    b = pool.acquire_nowait(1010)  # same class (1024)
    assert b.ptr == ptr and b.size_class == size_class(1000) == 1024
    c = pool.acquire_nowait(2000)  # another class: another block
    assert c.ptr != ptr
    st = pool.statistics()
    assert (st.acquisitions, st.reuses) == (3, 1)
    assert st.reuse_rate == pytest.approx(1 / 3)
    b.release()
    c.release()
    for _ in range(5):
        pool.acquire_nowait(1024).release()
    st = pool.statistics()
    assert st.reuses == 6 and st.live_buffers == 0 and st.bytes_in_use == 0
    # a handle is fresh per acquisition: a stale one cannot touch the recycled memory
    with pytest.raises(BufferStateError, match="released"):
        b.array()


def test_a_label_gets_back_the_block_it_had_when_that_block_is_free(pool: BufferPool) -> None:
    a = pool.acquire_nowait(1000, label="stage0:x")
    b = pool.acquire_nowait(1000, label="stage1:y")
    pa, pb = a.ptr, b.ptr
    a.release()
    b.release()  # free list [a, b]: the most recently freed would go first
    again_a = pool.acquire_nowait(1000, label="stage0:x")
    again_b = pool.acquire_nowait(1000, label="stage1:y")
    assert (again_a.ptr, again_b.ptr) == (pa, pb)  # each stage output keeps its address
    again_a.release()
    other = pool.acquire_nowait(1000, label="stage2:z")  # no home yet: the most recently freed
    assert other.ptr == pa
    taken = pool.acquire_nowait(1000, label="stage0:x")  # its block is taken: another one, now its home
    p_taken = taken.ptr
    assert p_taken not in (pa, pb)
    for buf in (again_b, other, taken):
        buf.release()
    last = pool.acquire_nowait(1000, label="stage0:x")
    assert last.ptr == p_taken
    last.release()
    st = pool.statistics()
    assert st.live_buffers == 0 and st.reuses >= 4


def test_homes_of_trimmed_slabs_are_forgotten(pool: BufferPool) -> None:
    pool.acquire_nowait(5000, label="s:out").release()
    assert pool.trim() > 0
    buf = pool.acquire_nowait(5000, label="s:out")  # a new slab; the old home is gone, not reused
    buf.array(np.uint8)[:] = 7
    assert int(buf.array(np.uint8).sum()) == 7 * buf.nbytes
    buf.release()
    assert pool.statistics().live_buffers == 0


def test_typed_views_without_copy(pool: BufferPool) -> None:
    b = pool.acquire_nowait((np.float32, (2, 3)), label="t")
    assert b.array().shape == (2, 3) and b.array().dtype == np.float32
    b.array()[1, 2] = 1.5
    raw = b.array(np.uint8)
    assert raw.shape == (24,) and raw.ctypes.data == b.ptr
    assert b.array(np.float32, (6,))[5] == 1.5
    with pytest.raises(BufferStateError, match="needs"):
        b.array(np.float64, (100,))
    b.release()


def test_bad_sizes_are_refused(pool: BufferPool) -> None:
    with pytest.raises(BufferStateError):
        pool.acquire_nowait(-1)
    with pytest.raises(BufferStateError):
        pool.acquire_nowait(("not-a-dtype", (2,)))
    with pytest.raises(BufferStateError):
        pool.acquire_nowait((np.float32, (2, -3)))
    empty = pool.acquire_nowait((np.float32, (0, 5)))
    assert empty.array().shape == (0, 5)
    empty.release()


def test_same_domain_handoff_shares_the_pointer(pool: BufferPool) -> None:
    out = pool.acquire_nowait((np.float32, (16,)), owner="cpu0", label="stage0:out")
    with out.hold(owner="cpu0"):
        out.array()[:] = np.arange(16)
    consumers = 2
    out.retain(consumers)
    out.release()  # the producer is done
    seen = [(out.ptr, out.array().copy()) for _ in range(consumers)]
    assert all(p == seen[0][0] for p, _ in seen)
    assert all((a == np.arange(16)).all() for _, a in seen)
    out.release()
    assert out.state is BufferState.ALLOCATED and pool.statistics().live_buffers == 1
    out.release()  # the last consumer (mypy keeps the state narrowed by the assert above: hence the ignores)
    assert out.state is BufferState.RELEASED and pool.statistics().live_buffers == 0  # type: ignore[comparison-overlap]


def test_refcount_below_zero_and_use_after_release(pool: BufferPool) -> None:
    b = pool.acquire_nowait(8, label="x")
    assert b.refcount == 1
    b.release()
    with pytest.raises(BufferStateError, match="below zero"):
        b.release()
    with pytest.raises(BufferStateError, match="retain"):
        b.retain()
    with pytest.raises(BufferStateError):
        b.activate()
    with pytest.raises(BufferStateError):
        _ = b.ptr
    c = pool.acquire_nowait(8)
    with pytest.raises(BufferStateError, match="bad count"):
        c.retain(0)
    with c:  # the context manager drops the reference
        pass
    assert c.state is BufferState.RELEASED


def test_legal_lifecycle(pool: BufferPool) -> None:
    b = pool.acquire_nowait((np.int64, (4,)), owner="host", label="life")
    assert b.state is BufferState.ALLOCATED
    b.activate(owner="npu", tag="dma0")
    assert (b.state, b.owner, b.tag) == (BufferState.ACTIVE, "npu", "dma0")
    b.array()[:] = [1, 2, 3, 4]
    b.deactivate()
    assert b.state is BufferState.ALLOCATED and b.tag == "dma0"
    # read holds may overlap (one buffer feeding two transfers)
    b.activate(shared=True)
    b.activate(shared=True)
    b.deactivate()
    assert b.state is BufferState.ACTIVE  # type: ignore[comparison-overlap]  # narrowed above, changed since
    b.deactivate()
    assert b.state is BufferState.ALLOCATED
    freed = pool.evict(b)
    assert freed == b.size_class
    assert (b.state, b.tag) == (BufferState.EVICTED, None)
    assert pool.statistics().bytes_in_use == 0
    assert list(b.array()) == [1, 2, 3, 4]  # next use restores the data
    assert b.state is BufferState.ALLOCATED
    b.release()
    st = pool.statistics()
    assert (st.evictions, st.restores, st.live_buffers) == (1, 1, 0)


def _active(pool: BufferPool) -> TensorBuffer:
    b = pool.acquire_nowait(16, label="active-one")
    b.activate()
    return b


def _evicted(pool: BufferPool) -> TensorBuffer:
    b = pool.acquire_nowait(16, label="evicted-one")
    pool.evict(b)
    return b


def _released(pool: BufferPool) -> TensorBuffer:
    b = pool.acquire_nowait(16, label="released-one")
    b.release()
    return b


@pytest.mark.parametrize(
    ("make", "action", "words"),
    [
        (_active, lambda p, b: p.evict(b), "active -> evicted"),
        (_active, lambda p, b: b.activate(), "active -> active"),
        (_active, lambda p, b: b.activate(shared=True), "held for writing"),
        (_evicted, lambda p, b: p.evict(b), "evicted -> evicted"),
        (_evicted, lambda p, b: b.deactivate(), "evicted -> allocated"),
        (lambda p: p.acquire_nowait(16, label="plain"), lambda p, b: b.deactivate(), "allocated -> allocated"),
        (lambda p: p.acquire_nowait(16, label="plain"), lambda p, b: p.restore_nowait(b), "restore"),
        (_released, lambda p, b: p.evict(b), "released -> evicted"),
        (_released, lambda p, b: b.activate(), "released -> active"),
    ],
)
def test_illegal_transitions_raise(pool: BufferPool, make: Callable[[BufferPool], TensorBuffer],
                                   action: Callable[[BufferPool, TensorBuffer], object], words: str) -> None:
    b = make(pool)
    before = b.state
    with pytest.raises(BufferStateError, match=words):
        action(pool, b)
    assert b.state is before  # nothing changed
    if b.state is BufferState.ACTIVE:
        b.deactivate()
    if b.refcount:
        b.release()
    assert pool.leaks() == ()


def test_release_while_active_is_deferred(pool: BufferPool) -> None:
    b = pool.acquire_nowait(4096, label="dma-in-flight")
    b.activate(tag="ch")
    b.release()
    assert b.refcount == 0 and b.state is BufferState.ACTIVE
    assert pool.statistics().live_buffers == 1  # memory still owned by the in-flight copy
    b.deactivate()
    assert b.state is BufferState.RELEASED  # type: ignore[comparison-overlap]  # narrowed above, changed since
    st = pool.statistics()
    assert st.live_buffers == 0 and st.bytes_in_use == 0


def test_evict_idle_skips_active_and_goes_oldest_first(tmp_path: Path) -> None:
    with BufferPool("host", root=tmp_path) as p:
        old, busy, young = (p.acquire_nowait(1024, label=n) for n in ("old", "busy", "young"))
        busy.activate()
        assert p.evict_idle(1) == 1024
        assert old.state is BufferState.EVICTED and young.state is BufferState.ALLOCATED
        assert p.evict_idle(10_000) == 1024  # only young is left to evict
        assert busy.state is BufferState.ACTIVE
        busy.deactivate()
        for b in (old, busy, young):
            b.release()


def test_budget_nowait_and_eviction_under_pressure(tmp_path: Path) -> None:
    with BufferPool("host", capacity_bytes=4096, root=tmp_path) as p:
        a = p.acquire_nowait(4096)
        with pytest.raises(anyio.WouldBlock):
            p.acquire_nowait(64)
        with pytest.raises(BufferStateError, match="never fit"):
            p.acquire_nowait(8192)
        a.release()
        p.acquire_nowait(64).release()
    with BufferPool("host", capacity_bytes=4096, root=tmp_path, evict_when_full=True) as p:
        idle = p.acquire_nowait(2048, label="idle")
        idle.array()[:] = 9
        busy = p.acquire_nowait(2048, label="busy")
        busy.activate()
        c = p.acquire_nowait(2048)  # evicts "idle", the busy one stays
        assert idle.state is BufferState.EVICTED and busy.state is BufferState.ACTIVE
        c.activate()
        with pytest.raises(anyio.WouldBlock):
            p.acquire_nowait(2048)  # nothing idle is left to evict
        with pytest.raises(anyio.WouldBlock):
            idle.array()  # restoring needs room too
        c.deactivate()
        c.release()
        assert (idle.array() == 9).all()
        busy.deactivate()
        for b in (idle, busy):
            b.release()


@pytest.mark.anyio
async def test_acquire_waits_for_release(tmp_path: Path) -> None:
    with BufferPool("host", capacity_bytes=8192, root=tmp_path) as p:
        held = p.acquire_nowait(8192, label="big")
        got = []

        async def want() -> None:
            got.append(await p.acquire(4096, label="waiter"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(want)
            await anyio.wait_all_tasks_blocked()
            assert got == [] and p.statistics().waiting == 1
            held.release()
        assert len(got) == 1 and p.statistics().waiting == 0
        got[0].release()
        assert p.statistics().bytes_in_use == 0


@pytest.mark.anyio
async def test_waiters_are_served_first_come_first_served(tmp_path: Path) -> None:
    with BufferPool("host", capacity_bytes=8192, root=tmp_path) as p:
        a = p.acquire_nowait(4096)
        b = p.acquire_nowait(4096)
        order: list[str] = []
        bufs = []

        async def want(n: int, name: str) -> None:
            buf = await p.acquire(n, label=name)
            order.append(name)
            bufs.append(buf)

        async with anyio.create_task_group() as tg:
            tg.start_soon(want, 8192, "big")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(want, 64, "small")
            await anyio.wait_all_tasks_blocked()
            a.release()  # room for "small" but it must not overtake "big"
            await anyio.wait_all_tasks_blocked()
            assert order == []
            with pytest.raises(anyio.WouldBlock):
                p.acquire_nowait(64)  # newcomers queue behind waiters too
            b.release()
            await anyio.wait_all_tasks_blocked()
            assert order == ["big"]
            bufs[0].release()
        assert order == ["big", "small"]
        bufs[1].release()
        assert p.statistics().bytes_in_use == 0


@pytest.mark.anyio
async def test_cancelled_waiter_leaves_nothing_behind(tmp_path: Path) -> None:
    with BufferPool("host", capacity_bytes=4096, root=tmp_path) as p:
        held = p.acquire_nowait(4096)
        with anyio.move_on_after(0.01) as scope:
            await p.acquire(4096)
        assert scope.cancelled_caught
        st = p.statistics()
        assert (st.waiting, st.bytes_in_use, st.live_buffers) == (0, 4096, 1)
        # granted and cancelled in the same step: the grant must be handed back
        async with anyio.create_task_group() as tg:
            inner = anyio.CancelScope()

            async def waiter() -> None:
                with inner:
                    (await p.acquire(4096)).release()

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            held.release()
            inner.cancel()
        st = p.statistics()
        assert (st.waiting, st.bytes_in_use, st.live_buffers) == (0, 0, 0)
        p.acquire_nowait(4096).release()


@pytest.mark.anyio
async def test_release_from_worker_thread_wakes_waiter(tmp_path: Path) -> None:
    with BufferPool("host", capacity_bytes=4096, root=tmp_path) as p:
        held = p.acquire_nowait(4096)
        async with anyio.create_task_group() as tg:

            async def release_later() -> None:
                await anyio.wait_all_tasks_blocked()
                await anyio.to_thread.run_sync(held.release)

            tg.start_soon(release_later)
            with anyio.fail_after(10):
                got = await p.acquire(4096)
        got.release()
        assert p.statistics().live_buffers == 0


def test_refcount_is_exact_under_threads(pool: BufferPool) -> None:
    b = pool.acquire_nowait(64, label="hot")
    n_threads, rounds = 8, 2000

    def hammer() -> None:
        for _ in range(rounds):
            b.retain()
            b.release()
        b.retain()

    threads = [threading.Thread(target=hammer) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.refcount == 1 + n_threads
    for _ in range(n_threads + 1):
        b.release()
    assert pool.statistics().live_buffers == 0


def test_close_reports_leaks_by_label(tmp_path: Path) -> None:
    p = BufferPool("host", root=tmp_path)
    p.acquire_nowait(100, label="stage2:logits")
    kept = p.acquire_nowait(100, label="stage0:conv_out")
    kept.activate()
    p.acquire_nowait(100, label="fine").release()
    assert [lk.label for lk in p.leaks()] == ["stage2:logits", "stage0:conv_out"]
    assert p.leaks()[1].state is BufferState.ACTIVE
    with pytest.raises(BufferLeakError, match=r"stage2:logits.*stage0:conv_out") as info:
        p.close()
    assert info.value.labels == ["stage2:logits", "stage0:conv_out"]
    p.close()  # idempotent, no second report
    with pytest.raises(RuntimeStateError):
        p.acquire_nowait(10)
    # a late release of a leaked buffer still works and gives the memory back
    kept.deactivate()
    kept.release()
    assert p.statistics().live_buffers == 1


@pytest.mark.anyio
async def test_close_fails_waiters(tmp_path: Path) -> None:
    p = BufferPool("host", capacity_bytes=4096, root=tmp_path)
    held = p.acquire_nowait(4096, label="held")
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await p.acquire(64)
        except RuntimeStateError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(BufferLeakError, match="held"):
            p.close()
    assert len(errors) == 1
    held.release()


def test_statistics_snapshot_and_copy_accounting(pool: BufferPool) -> None:
    pool.record_copy("host", "npu", 1000)
    pool.record_copy("host", "npu", 24)
    pool.record_copy(MemoryDomain("host"), MemoryDomain("gpu", MemoryKind.DEVICE), 0)
    st = pool.statistics()
    assert st.bytes_copied == {("host", "npu"): 1024}
    assert st.copies == {("host", "npu"): 2}
    assert st.mappings == {("host", "gpu"): 1}
    assert st.bytes_copied_same_domain == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.live_buffers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        st.bytes_copied[("a", "b")] = 1  # type: ignore[index]
    pool.record_copy("host", "host", 8)
    assert pool.statistics().bytes_copied_same_domain == 8


def test_trim_and_close_give_memory_back(pool: BufferPool) -> None:
    bufs = [pool.acquire_nowait(n) for n in (100, 5000, SLAB_BYTES * 2)]
    assert pool.statistics().bytes_allocated >= SLAB_BYTES * 2
    keep = bufs.pop(0)
    for b in bufs:
        b.release()
    assert pool.trim() >= SLAB_BYTES * 2
    st = pool.statistics()
    assert st.bytes_allocated == SLAB_BYTES // 128 * 128  # only the slab of the live 128-byte class
    keep.release()
    pool.trim()
    assert pool.statistics().bytes_allocated == 0


def test_pools_for_topology(tmp_path: Path) -> None:
    topo = Topology.unified(devices=("gpu", "npu"), private=[("npu_sram", MemoryKind.SRAM)])
    pools = pools_for(topo, capacity_bytes={"npu_sram": 1 << 20}, root=tmp_path)
    try:
        assert set(pools) == {"host", "gpu", "npu", "npu_sram"}
        assert pools["npu_sram"].capacity_bytes == 1 << 20 and pools["host"].capacity_bytes is None
        assert pools["npu_sram"].domain.kind is MemoryKind.SRAM
    finally:
        for p in pools.values():
            p.close()


def test_onnxruntime_writes_straight_into_pool_buffers(pool: BufferPool) -> None:
    """The stage-runner pattern: IO binding on pool pointers, no copy on either side."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    inp = pool.acquire_nowait((np.float32, (2, 3)), label="stage0:x")
    inp.array()[:] = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    out = pool.acquire_nowait((np.float32, (2, 3)), owner="cpu", label="stage0:y")
    io = sess.io_binding()
    io.bind_input("x", "cpu", 0, np.float32, list(inp.shape), inp.ptr)
    io.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ptr)
    with out.hold(owner="cpu"):
        sess.run_with_iobinding(io)
    assert io.get_outputs()[0].data_ptr() == out.ptr  # ORT wrote into our memory
    assert (out.array() == np.array([[0, 2, 0], [4, 0, 6]], np.float32)).all()
    inp.release()
    out.release()
