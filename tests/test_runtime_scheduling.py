"""The scheduler through a Session: priorities, aging, FIFO, stage-boundary preemption,
pipelining, backpressure, per-core workers and many concurrent requests."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import Device, EventInfo, Hooks, Priority, Session
from hetsched.policies import Pinned

F = TensorProto.FLOAT



def _two_stage() -> onnx.ModelProto:
    """y = -relu(x); the relu node and the neg node can go to different devices. x: float32 [16]."""
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"], name="neg")],
            "g", [helper.make_tensor_value_info("x", F, [16])], [helper.make_tensor_value_info("y", F, [16])]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _x(i: int) -> np.ndarray:
    return np.full(16, float(i) - 3.0, np.float32)


class _Order(Hooks):
    """Records request priorities and the order stages start per device; can hold one device."""

    def __init__(self, hold_device: str | None = None) -> None:
        self.lock = threading.Lock()
        self.priority: dict[int, Priority] = {}
        self.started: dict[str, list[int]] = {}
        self.hold_device = hold_device
        self.entered = threading.Event()
        self.release = threading.Event()
        self.active: dict[str, int] = {}
        self.max_active: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.done: dict[str, int] = {}

    def request_start(self, info: EventInfo) -> None:
        assert info.request_id is not None and info.priority is not None
        self.priority[info.request_id] = info.priority
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def request_end(self, info: EventInfo) -> None:
        self.in_flight -= 1

    def before_stage(self, info: EventInfo) -> None:
        dev = info.device or ""
        with self.lock:
            self.started.setdefault(dev, []).append(info.request_id or 0)
            self.active[dev] = self.active.get(dev, 0) + 1
            self.max_active[dev] = max(self.max_active.get(dev, 0), self.active[dev])
            hold = dev == self.hold_device and not self.entered.is_set()
            if hold:
                self.entered.set()
        if hold:
            self.release.wait(10)

    def after_stage(self, info: EventInfo) -> None:
        with self.lock:
            self.active[info.device or ""] -= 1
            self.done[info.device or ""] = self.done.get(info.device or "", 0) + 1


async def _queue_behind_gate(s: Session, order: _Order, prios: list[Priority], *, queued: int,
                             pause_after: int | None = None, pause_s: float = 0.0) -> None:
    """Block the held device with a first NORMAL request, queue ``prios``, then release."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run, {"x": _x(0)})
        await anyio.to_thread.run_sync(order.entered.wait)
        for i, p in enumerate(prios):
            tg.start_soon(lambda p=p: s.run({"x": _x(1)}, priority=p))
            if pause_after is not None and i == pause_after:
                with anyio.fail_after(5):
                    while s.statistics().queued_stages < i + 1:
                        await anyio.sleep(0.001)
                await anyio.sleep(pause_s)
        with anyio.fail_after(5):
            while s.statistics().queued_stages < queued:
                await anyio.sleep(0.001)
        order.release.set()


P = Priority


@pytest.mark.anyio
async def test_most_urgent_first_fifo_within_a_priority() -> None:
    order = _Order(hold_device="cpu:0")
    prios = [P.BACKGROUND, P.NORMAL, P.HIGH, P.REALTIME, P.HIGH, P.BACKGROUND, P.NORMAL, P.REALTIME]
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[order], aging_s=None) as s:
        await _queue_behind_gate(s, order, prios, queued=len(prios))
    started = order.started["cpu:0"][1:]
    assert len(started) == len(prios)
    # request ids are handed out in admission order, so (priority, id) is the expected order
    assert started == sorted(started, key=lambda rid: (order.priority[rid], rid))
    assert [order.priority[r] for r in started] == sorted(prios)


@pytest.mark.anyio
async def test_without_priorities_requests_start_in_admission_order() -> None:
    order = _Order(hold_device="cpu:0")
    prios = [P.BACKGROUND, P.REALTIME, P.NORMAL, P.HIGH, P.BACKGROUND]
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[order], priorities=False) as s:
        await _queue_behind_gate(s, order, prios, queued=len(prios))
    started = order.started["cpu:0"][1:]
    assert started == sorted(started)


@pytest.mark.anyio
async def test_aging_lets_a_long_waiting_background_request_go_first() -> None:
    # BACKGROUND (3) queued 0.3 s before a REALTIME (0) request: with aging_s = 0.05 it has
    # waited more than 3 * 0.05 s longer and goes first; without aging REALTIME would.
    for aging, expect_first in ((0.05, P.BACKGROUND), (None, P.REALTIME)):
        order = _Order(hold_device="cpu:0")
        async with Session(_two_stage(), devices=["cpu:0"], hooks=[order], aging_s=aging) as s:
            await _queue_behind_gate(s, order, [P.BACKGROUND, P.REALTIME, P.HIGH], queued=3,
                                     pause_after=0, pause_s=0.3)
        started = order.started["cpu:0"][1:]
        assert order.priority[started[0]] is expect_first, (aging, [order.priority[r] for r in started])


@pytest.mark.anyio
async def test_preemption_point_is_the_stage_boundary() -> None:
    """BACKGROUND requests' second stages are ready and queued on cpu:1 first; a HIGH request
    arriving later still starts its second stage there before all of them."""
    order = _Order(hold_device="cpu:1")
    pol = Pinned({"relu": "cpu:0", "neg": "cpu:1"})
    async with Session(_two_stage(), devices=["cpu:0", "cpu:1"], policy=pol, max_unit_nodes=1, hooks=[order]) as s:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.run, {"x": _x(0)})
            await anyio.to_thread.run_sync(order.entered.wait)
            for i in range(4):
                tg.start_soon(lambda i=i: s.run({"x": _x(i)}, priority=P.BACKGROUND))
            with anyio.fail_after(5):
                while order.done.get("cpu:0", 0) < 5 or s.statistics().queued_stages < 4:
                    await anyio.sleep(0.001)  # all their relus ran; their negs wait on cpu:1
            tg.start_soon(lambda: s.run({"x": _x(9)}, priority=P.HIGH))
            with anyio.fail_after(5):
                while order.done.get("cpu:0", 0) < 6 or s.statistics().queued_stages < 5:
                    await anyio.sleep(0.001)
            order.release.set()
    on_b = order.started["cpu:1"][1:]
    assert order.priority[on_b[0]] is P.HIGH
    assert [order.priority[r] for r in on_b[1:]] == [P.BACKGROUND] * 4
    assert on_b[1:] == sorted(on_b[1:])
    on_a = order.started["cpu:0"]
    assert order.priority[on_a[-1]] is P.HIGH  # it arrived last at cpu:0


@pytest.mark.anyio
async def test_stages_of_different_requests_overlap_on_different_devices() -> None:
    order = _Order()
    model = _two_stage()
    pol = Pinned({"relu": "cpu:0", "neg": "cpu:1"})
    busy: dict[str, list[tuple[float, float]]] = {"cpu:0": [], "cpu:1": []}

    class Spans(Hooks):
        def __init__(self) -> None:
            self.t: dict[tuple[int, str], float] = {}
            self.lock = threading.Lock()

        def before_stage(self, info: EventInfo) -> None:
            time.sleep(0.02)  # make each stage last long enough to see overlap
            with self.lock:
                self.t[(info.request_id or 0, info.device or "")] = time.perf_counter()

        def after_stage(self, info: EventInfo) -> None:
            with self.lock:
                key = (info.request_id or 0, info.device or "")
                busy[key[1]].append((self.t[key] - 0.02, time.perf_counter()))

    async with Session(model, devices=["cpu:0", "cpu:1"], policy=pol, max_unit_nodes=1,
                       hooks=[order, Spans()]) as s:
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(s.run, {"x": _x(i)})
    # each device ran one stage at a time ...
    assert order.max_active == {"cpu:0": 1, "cpu:1": 1}
    # ... while the other device worked on another request's stage at the same time
    overlap = sum(1 for a0, a1 in busy["cpu:0"] for b0, b1 in busy["cpu:1"] if a0 < b1 and b0 < a1)
    assert overlap >= 3


@pytest.mark.anyio
async def test_never_more_than_max_in_flight_admitted() -> None:
    order = _Order()
    async with Session(_two_stage(), devices=["cpu:0", "cpu:1"], policy="random:2", max_unit_nodes=1,
                       hooks=[order], max_in_flight=3) as s:
        results: list[Any] = [None] * 200

        async def one(i: int) -> None:
            results[i] = await s.run({"x": _x(i)}, priority=P(i % 4))

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
            await anyio.sleep(0)
            assert s.statistics().in_flight <= 3
        st = s.statistics()
    assert order.max_in_flight == 3 == st.peak_in_flight == st.max_in_flight
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r["y"], -np.maximum(_x(i), 0))


@pytest.mark.anyio
async def test_cancelled_while_waiting_for_admission_gives_its_slot_back() -> None:
    order = _Order(hold_device="cpu:0")
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[order], max_in_flight=1) as s:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.run, {"x": _x(0)})
            await anyio.to_thread.run_sync(order.entered.wait)
            with anyio.move_on_after(0.05) as scope:
                await s.run({"x": _x(1)})  # waits for admission behind the held request
            assert scope.cancelled_caught
            order.release.set()
        out = await s.run({"x": _x(2)})
        np.testing.assert_array_equal(out["y"], -np.maximum(_x(2), 0))
        assert s.statistics().requests_started == 2


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_thousands_of_concurrent_requests(anyio_backend: str) -> None:
    n = 3000
    w = np.linspace(-1, 1, 16).astype(np.float32)
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Mul", ["r", "w"], ["m"], name="mul"),
             helper.make_node("Neg", ["m"], ["n"], name="neg"), helper.make_node("Add", ["n", "x"], ["y"], name="add")],
            "g", [helper.make_tensor_value_info("x", F, [16])], [helper.make_tensor_value_info("y", F, [16])],
            initializer=[helper.make_tensor("w", F, [16], w.tolist())]),
        opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((n, 16)).astype(np.float32)
    results: list[Any] = [None] * n
    async with Session(m, devices=["cpu:0", "cpu:1", "cpu:0-1"], policy="random:7", max_unit_nodes=1,
                       max_in_flight=512) as s:
        assert len(s.plan.stages) >= 3

        async def one(i: int) -> None:
            results[i] = await s.run({"x": xs[i]}, priority=P(i % 4))

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        st = s.statistics()
        assert (st.requests_completed, st.requests_failed, st.in_flight) == (n, 0, 0)
        assert st.stage_runs == n * len(s.plan.stages)
        assert sum(p.live_buffers for p in st.pools.values()) == 0
    expected = -np.maximum(xs, 0) * w + xs
    np.testing.assert_allclose(np.stack([r["y"] for r in results]), expected, rtol=1e-6)


@pytest.mark.anyio
async def test_per_core_workers_run_several_stages_of_one_device_at_once() -> None:
    order = _Order()
    gate = threading.Barrier(2, timeout=10)

    class Meet(Hooks):
        def before_stage(self, info: EventInfo) -> None:
            gate.wait()  # only returns once two stages are running on the device at once

    dev = Device(name="cpus", cpus=(0, 1), options={"workers": "per-core"})
    async with Session(_two_stage(), devices=[dev], hooks=[order, Meet()]) as s:
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(s.run, {"x": _x(i)})
    assert order.max_active["cpus"] == 2
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("hetsched-") for n in names)


@pytest.mark.anyio
async def test_cpu_devices_on_the_same_cores_share_one_worker() -> None:
    threads: set[str] = set()

    class Where(Hooks):
        def before_stage(self, info: EventInfo) -> None:
            threads.add(threading.current_thread().name)

    a, b = Device(name="a", cpus=(0,)), Device(name="b", cpus=(0,))
    async with Session(_two_stage(), devices=[a, b], policy=Pinned({"relu": "a", "neg": "b"}), max_unit_nodes=1,
                       hooks=[Where()]) as s:
        assert [st.device for st in s.plan.stages] == ["a", "b"]
        out = await s.run({"x": _x(5)})
        assert s.statistics().devices == 2
    np.testing.assert_array_equal(out["y"], -np.maximum(_x(5), 0))
    assert threads == {"hetsched-a+b"}


class _Slow(Hooks):
    """Makes every stage take ``seconds`` longer, so queues build up behind one worker."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def before_stage(self, info: EventInfo) -> None:
        time.sleep(self.seconds)


@pytest.mark.anyio
async def test_completions_are_coalesced_while_every_worker_has_queued_work(anyio_backend: str) -> None:
    n = 24
    results: list[Any] = [None] * n
    # cpu:1 runs nothing of this plan: an idle device the callers could not feed anyway does
    # not stop the coalescing (their next requests start on cpu:0, which has queued work)
    async with Session(_two_stage(), devices=["cpu:0", "cpu:1"], policy=Pinned("cpu:0"), hooks=[_Slow(0.002)],
                       max_in_flight=n) as s:
        assert {st.device for st in s.plan.stages} == {"cpu:0"}
        for i in range(3):  # one at a time: nothing is ever queued behind them, nothing deferred
            await s.run({"x": _x(i)})
        assert s.statistics().wakeups_coalesced == 0

        async def one(i: int) -> None:
            results[i] = await s.run({"x": _x(i)})

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        st = s.statistics()
        assert st.wakeups_coalesced > 0
        assert (st.requests_completed, st.in_flight) == (n + 3, 0)  # none stranded
        assert sum(p.live_buffers for p in st.pools.values()) == 0
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], -np.maximum(_x(i), 0))


@pytest.mark.anyio
async def test_high_priority_completion_wakes_its_caller_at_once(anyio_backend: str) -> None:
    # A HIGH request's stage is held while 12 BACKGROUND requests queue behind it on the one
    # worker (20 ms stages). Deferred, its wake-up would wait for the next stage to end
    # (~20 ms); HIGH's caller wakes right away, the BACKGROUND ones are coalesced.
    order = _Order(hold_device="cpu:0")
    ends: dict[Priority, list[float]] = {}

    class StageEnds(Hooks):
        def after_stage(self, info: EventInfo) -> None:
            assert info.priority is not None
            ends.setdefault(info.priority, []).append(time.perf_counter())

    async with Session(_two_stage(), devices=["cpu:0"], hooks=[order, _Slow(0.02), StageEnds()],
                       max_in_flight=32) as s:
        woke: dict[str, tuple[float, int]] = {}

        async def tagged(tag: str, i: int, prio: Priority) -> None:
            await s.run({"x": _x(i)}, priority=prio)
            woke.setdefault(tag, (time.perf_counter(), s.statistics().queued_stages))

        async with anyio.create_task_group() as tg:
            tg.start_soon(tagged, "high", 99, Priority.HIGH)
            await anyio.to_thread.run_sync(order.entered.wait, 10)  # the worker holds HIGH's stage
            for i in range(12):
                tg.start_soon(tagged, "background", i, Priority.BACKGROUND)
            while s.statistics().queued_stages < 12:
                await anyio.sleep(0.001)
            order.release.set()
        high_woke, queued = woke["high"]
        assert queued >= 6  # woken while the queue was still deep...
        assert high_woke - ends[Priority.HIGH][0] < 0.01  # ...and not held back for the next stage
        assert s.statistics().wakeups_coalesced > 0  # while BACKGROUND wake-ups were coalesced


@pytest.mark.anyio
async def test_deferred_wake_ups_still_flow_while_a_stream_keeps_the_queue_deep(anyio_backend: str) -> None:
    # New requests arrive faster than cpu:0 serves them, so its queue never runs short until
    # the stream stops. Deferral is bounded by a fraction of each request's time in the
    # system: the first caller is woken a stage or two after its request finished, not when
    # the stream has drained.
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[_Slow(0.004)], max_in_flight=64) as s:
        runs_when_first_woke: list[int] = []

        async def one(i: int) -> None:
            await s.run({"x": _x(i)})
            if i == 0:
                runs_when_first_woke.append(s.statistics().stage_runs)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
            for i in range(8, 40):
                await anyio.sleep(0.003)
                tg.start_soon(one, i)
        st = s.statistics()
        assert st.requests_completed == 40 and st.wakeups_coalesced > 0
        assert runs_when_first_woke and runs_when_first_woke[0] <= 8


@pytest.mark.anyio
async def test_coalescing_judges_the_workers_the_next_requests_start_on() -> None:
    # A pipeline: relu on cpu:0 (slow, deep queue), neg on cpu:1. Requests finish on cpu:1;
    # their callers' next requests start on cpu:0. Deep queue there: deferral is free.
    # Once cpu:0 has no queued stage left, every finished request wakes its caller at once.
    class SlowOn(Hooks):
        def before_stage(self, info: EventInfo) -> None:
            if info.device == "cpu:0":
                time.sleep(0.003)

    placement = Pinned(lambda u: "cpu:0" if "relu" in u.nodes else "cpu:1")
    async with Session(_two_stage(), devices=["cpu:0", "cpu:1"], policy=placement, hooks=[SlowOn()],
                       max_unit_nodes=1, max_in_flight=16) as s:
        assert [st.device for st in s.plan.stages] == ["cpu:0", "cpu:1"]
        queued_at_wake: list[int] = []

        async def one(i: int) -> None:
            await s.run({"x": _x(i)})
            queued_at_wake.append(s.statistics().queued_stages)

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(one, i)
        assert len(queued_at_wake) == 16
        assert s.statistics().wakeups_coalesced > 0
        # the last requests finish with cpu:0's queue empty: woken one by one, not held back
        assert queued_at_wake[-1] == 0


@pytest.mark.anyio
async def test_callers_cancelled_while_their_wake_up_is_deferred_leak_nothing(anyio_backend: str) -> None:
    import random

    rng = random.Random(0)
    outcomes = {"done": 0, "cancelled": 0}
    async with Session(_two_stage(), devices=["cpu:0", "cpu:1"], max_unit_nodes=1, max_in_flight=32,
                       hooks=[_Slow(0.0005)]) as s:
        async def one(i: int) -> None:
            with anyio.move_on_after(rng.uniform(0.0, 0.3)) as scope:
                if i % 2:
                    out = await s.run({"x": _x(i)}, zero_copy=True)
                    with out:
                        np.testing.assert_array_equal(out["y"], -np.maximum(_x(i), 0))
                else:
                    out = await s.run({"x": _x(i)})
                    np.testing.assert_array_equal(out["y"], -np.maximum(_x(i), 0))
                outcomes["done"] += 1
            if scope.cancelled_caught:
                outcomes["cancelled"] += 1

        async with anyio.create_task_group() as tg:
            for i in range(600):
                tg.start_soon(one, i)
        st = s.statistics()
        assert outcomes["done"] > 0 and outcomes["cancelled"] > 0 and st.wakeups_coalesced > 0
        assert st.in_flight == 0
        assert sum(p.live_buffers for p in st.pools.values()) == 0
    # and the session closed without a leak report (it would have raised BufferLeakError)
