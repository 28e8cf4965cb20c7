"""Tensors crossing memory domains through a Session: the transfer engine, its events and preemption."""

from __future__ import annotations

import functools
import threading
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import Device, Event, EventInfo, Hooks, Priority, Session, TransferError
from hetsched._runtime import MemoryDomain, MemoryKind, Topology, TransferInfo, rate_limited_copy
from hetsched.policies import Pinned

F = TensorProto.FLOAT
ROWS, COLS = 512, 512  # 1 MiB of float32 crossing each boundary



def _model() -> onnx.ModelProto:
    """r = relu(x) [host]; n = neg(r) * x [acc]; y = reducesum(n, axis 1) [host]; also returns r."""
    m = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Neg", ["r"], ["n0"], name="neg"),
                helper.make_node("Mul", ["n0", "x"], ["n"], name="mul"),
                helper.make_node("ReduceSum", ["n", "axes"], ["y"], name="sum", keepdims=0),
            ],
            "g",
            [helper.make_tensor_value_info("x", F, [ROWS, COLS])],
            [helper.make_tensor_value_info("y", F, [ROWS]), helper.make_tensor_value_info("r", F, [ROWS, COLS])],
            initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    m.ir_version = 8
    return m


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    r = np.maximum(x, 0)
    return {"y": (-r * x).sum(axis=1), "r": r}


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype(np.float32)


HOST = Device(name="host-cpu", cpus=(0,))
ACC = Device(name="acc", cpus=(1,), memory_domain="acc")
PLACE = Pinned({"relu": "host-cpu", "neg": "acc", "mul": "acc", "sum": "host-cpu"})


class _Log(Hooks):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[EventInfo] = []
        self.first_transfer = threading.Event()

    def _rec(self, info: EventInfo) -> None:
        with self.lock:
            self.events.append(info)
        if info.event is Event.BEFORE_TRANSFER:
            self.first_transfer.set()

    before_transfer = after_transfer = preempted = resumed = _rec

    def of(self, event: Event) -> list[EventInfo]:
        return [e for e in self.events if e.event is event]


@pytest.mark.anyio
async def test_cross_domain_tensors_go_through_the_engine_intact() -> None:
    log = _Log()
    topo = Topology.discrete("host", ["acc"])
    async with Session(_model(), devices=[HOST, ACC], policy=PLACE, max_unit_nodes=1, memory=hetsched.Memory(topology=topo, chunk_bytes=128 << 10),
                       hooks=[log]) as s:
        assert [st.device for st in s.plan.stages] == ["host-cpu", "acc", "host-cpu"]
        outs = []
        async with anyio.create_task_group() as tg:
            for i in range(6):
                async def one(i: int = i) -> None:
                    outs.append((i, await s.run({"x": _x(i)})))
                tg.start_soon(one)
        for i, out in outs:
            for k, v in _expected(_x(i)).items():
                np.testing.assert_allclose(out[k], v, rtol=1e-5, atol=1e-4)
        st = s.statistics()
        # per request: x and r host -> acc (x is a feed: staged into a host buffer first), n acc -> host
        assert st.transfers is not None and st.transfers.transfers == 6 * 3
        assert st.transfers.bytes == 6 * 3 * ROWS * COLS * 4
        assert st.bytes_staged == 6 * ROWS * COLS * 4
        host, acc = st.pools["host"], st.pools["acc"]
        assert acc.bytes_copied[("host", "acc")] == 6 * 2 * ROWS * COLS * 4
        assert host.bytes_copied[("acc", "host")] == 6 * ROWS * COLS * 4
        assert st.bytes_copied_same_domain == 0
        assert host.live_buffers == acc.live_buffers == 0
        assert st.transfers.channels["acc<->host"].chunks == 6 * 3 * 8  # 1 MiB in 128 KiB chunks
    before, after = log.of(Event.BEFORE_TRANSFER), log.of(Event.AFTER_TRANSFER)
    assert len(before) == len(after) == 18
    assert {e.request_id for e in before} == set(range(1, 7))
    assert all(isinstance(e.extra, TransferInfo) and e.nbytes == ROWS * COLS * 4 for e in before)
    assert {e.stage for e in before} == {"feed", s.plan.stages[0].name, s.plan.stages[1].name}


@pytest.mark.anyio
async def test_shared_memory_domains_map_instead_of_copying() -> None:
    topo = Topology.unified("host", ["acc"])
    async with Session(_model(), devices=[HOST, ACC], policy=PLACE, max_unit_nodes=1, memory=hetsched.Memory(topology=topo)) as s:
        out = await s.run({"x": _x(1)})
        np.testing.assert_allclose(out["y"], _expected(_x(1))["y"], rtol=1e-5, atol=1e-4)
        st = s.statistics()
        assert st.transfers is not None and st.transfers.transfers == 0
        assert all(not p.bytes_copied for p in st.pools.values())


@pytest.mark.anyio
async def test_an_urgent_transfer_preempts_a_bulk_one_at_a_chunk_boundary() -> None:
    log = _Log()
    topo = Topology.discrete("host", ["acc"])
    # 1 MiB at 16 MiB/s: ~60 ms per tensor, 64 KiB chunks of ~4 ms
    copy = rate_limited_copy(16 << 20)
    async with Session(_model(), devices=[HOST, ACC], policy=PLACE, max_unit_nodes=1, memory=hetsched.Memory(topology=topo, chunk_bytes=64 << 10, copy_fn=copy), hooks=[log]) as s:
        done: list[tuple[Priority, int]] = []
        results: dict[Priority, Any] = {}

        async def one(p: Priority, seed: int) -> None:
            results[p] = await s.run({"x": _x(seed)}, priority=p)
            done.append((p, seed))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, Priority.BACKGROUND, 1)
            await anyio.to_thread.run_sync(log.first_transfer.wait)
            await anyio.sleep(0.01)
            tg.start_soon(one, Priority.HIGH, 2)
        st = s.statistics()
        assert st.transfers is not None and st.transfers.preemptions >= 1
        ch = st.transfers.channels["acc<->host"]
        assert ch.resumes == ch.preemptions and ch.suspended_seconds > 0
        assert ch.bytes == 2 * 3 * ROWS * COLS * 4  # nothing restarted: every byte moved once
    # the bytes arrived intact on both sides of the preemption
    np.testing.assert_allclose(results[Priority.BACKGROUND]["y"], _expected(_x(1))["y"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(results[Priority.HIGH]["y"], _expected(_x(2))["y"], rtol=1e-5, atol=1e-4)
    assert done[0][0] is Priority.HIGH
    pre, res = log.of(Event.PREEMPTED), log.of(Event.RESUMED)
    assert pre and len(pre) == len(res)
    assert {e.priority for e in pre} == {Priority.BACKGROUND}
    assert all(0 < e.extra.offset < e.extra.nbytes for e in pre)  # suspended mid-tensor, kept its progress


@pytest.mark.anyio
async def test_priorities_off_means_no_transfer_preemption() -> None:
    topo = Topology.discrete("host", ["acc"])
    async with Session(_model(), devices=[HOST, ACC], policy=PLACE, max_unit_nodes=1, memory=hetsched.Memory(topology=topo, chunk_bytes=64 << 10, copy_fn=rate_limited_copy(64 << 20)), scheduling=hetsched.Scheduling(priorities=False)) as s:
        async with anyio.create_task_group() as tg:
            for i, p in enumerate([Priority.BACKGROUND, Priority.HIGH, Priority.REALTIME]):
                tg.start_soon(functools.partial(s.run, {"x": _x(i)}, priority=p))
        st = s.statistics()
        assert st.transfers is not None and st.transfers.preemptions == 0 and st.transfers.transfers == 9


@pytest.mark.anyio
async def test_cancelling_a_request_mid_transfer_returns_its_buffers() -> None:
    log = _Log()
    topo = Topology.discrete("host", ["acc"])
    async with Session(_model(), devices=[HOST, ACC], policy=PLACE, max_unit_nodes=1, memory=hetsched.Memory(topology=topo, chunk_bytes=64 << 10, copy_fn=rate_limited_copy(8 << 20)), hooks=[log]) as s:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.run, {"x": _x(0)})
            await anyio.to_thread.run_sync(log.first_transfer.wait)
            await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        st = s.statistics()
        assert st.requests_cancelled == 1
        assert st.transfers is not None and st.transfers.channels["acc<->host"].cancelled >= 1
        with anyio.fail_after(10):
            while any(p.live_buffers for p in s.statistics().pools.values()):  # noqa: ASYNC110 -- polls what worker threads change (no event to wait on); bounded by fail_after
                await anyio.sleep(0.01)
        out = await s.run({"x": _x(3)})
        np.testing.assert_allclose(out["y"], _expected(_x(3))["y"], rtol=1e-5, atol=1e-4)


@pytest.mark.anyio
async def test_a_failing_copy_fails_only_its_request() -> None:
    calls = {"n": 0}
    lock = threading.Lock()

    def flaky(dst: np.ndarray, src: np.ndarray) -> None:
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n == 3:
            raise OSError("DMA descriptor error")
        np.copyto(dst, src)

    topo = Topology.discrete("host", ["acc"])
    async with Session(_model(), devices=[HOST, ACC], policy=PLACE, max_unit_nodes=1, memory=hetsched.Memory(topology=topo, chunk_bytes=1 << 20, copy_fn=flaky)) as s:
        with pytest.raises(TransferError, match="DMA descriptor error"):
            for i in range(3):
                await s.run({"x": _x(i)})
        out = await s.run({"x": _x(5)})
        np.testing.assert_allclose(out["y"], _expected(_x(5))["y"], rtol=1e-5, atol=1e-4)
        st = s.statistics()
        assert st.requests_failed == 1
        assert all(p.live_buffers == 0 for p in st.pools.values())


@pytest.mark.anyio
async def test_a_device_domain_missing_from_the_topology_is_named() -> None:
    with pytest.raises(TransferError, match=r"'acc'.*memory domain 'acc'"):
        async with Session(_model(), devices=[HOST, ACC], memory=hetsched.Memory(topology=Topology.host_only())):
            pass


def test_topology_domains_for_twin_like_devices_default_to_shared() -> None:
    async def main() -> None:
        a = Device(name="gpu", cpus=(0,), memory_domain="dram")
        async with Session(_model(), devices=[HOST, a], policy=Pinned({"relu": "gpu"}, default="host-cpu"), max_unit_nodes=1) as s:
            topo = s.topology
            assert topo.shares_memory("host", "dram")
            assert {d.name for d in topo.domains} == {"host", "dram"}
            assert topo.domain("dram") == MemoryDomain("dram", MemoryKind.DEVICE)
            out = await s.run({"x": _x(0)})
            np.testing.assert_allclose(out["r"], _expected(_x(0))["r"])

    anyio.run(main)
