"""The scheduler through a Session: priorities, aging, FIFO, stage-boundary preemption,
pipelining, backpressure, per-core workers and many concurrent requests."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import Device, EventInfo, Hooks, Priority, Session
from hetsched._runtime._clock import VirtualClock
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


class _Gate(Hooks):
    """Holds every stage at its start until the test grants it a permit (or opens the gate).

    Tests that use it decide when each stage runs, so what they check follows from the order
    of their own steps, not from how long anything takes on a busy machine.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._permits = 0
        self._open = False
        self.entered = 0
        """Stages that reached the gate (started, or waiting to)."""

    def before_stage(self, info: EventInfo) -> None:
        with self._cond:
            self.entered += 1
            # bounded: a test that fails before opening the gate must not hang the session's close
            if not self._cond.wait_for(lambda: self._open or self._permits > 0, timeout=30):
                raise RuntimeError("the test never released this stage")
            if not self._open:
                self._permits -= 1

    def grant(self, n: int = 1) -> None:
        """Let ``n`` more stages run."""
        with self._cond:
            self._permits += n
            self._cond.notify_all()

    def open(self) -> None:
        """Let every stage run from now on."""
        with self._cond:
            self._open = True
            self._cond.notify_all()


async def _until(cond: Any, what: str, *, within_s: float = 10.0) -> None:
    """Wait (polling the event loop) until ``cond()``; fails the test after ``within_s``."""
    with anyio.fail_after(within_s):
        while not cond():  # noqa: ASYNC110 -- polls what worker threads change (no event to wait on); bounded by fail_after
            await anyio.sleep(0.001)


async def _start_in_order(tg: Any, s: Session, fn: Any, indices: range) -> None:
    """Start ``fn(i)`` for each index, each admitted before the next starts (trio runs new
    tasks in no fixed order; the tests that number requests need their admission order)."""
    for i in indices:
        base = s.statistics().requests_started
        tg.start_soon(fn, i)
        await _until(lambda base=base: s.statistics().requests_started > base, f"request {i} admitted")


async def _let_the_loop_run(iterations: int = 20) -> None:
    """Give the event loop a few iterations: a wake-up already posted to it would be delivered."""
    for _ in range(iterations):
        await anyio.lowlevel.checkpoint()


async def _queue_behind_gate(s: Session, order: _Order, prios: list[Priority], *, queued: int,
                             pause_after: int | None = None, clock: VirtualClock | None = None,
                             advance_s: float = 0.0) -> None:
    """Block the held device with a first NORMAL request, queue ``prios``, then release.

    With ``pause_after``, the virtual ``clock`` advances ``advance_s`` once ``prios[pause_after]``
    is queued (the ones after it are admitted that much later)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run, {"x": _x(0)})
        await anyio.to_thread.run_sync(order.entered.wait)
        for i, p in enumerate(prios):
            tg.start_soon(functools.partial(s.run, {"x": _x(1)}, priority=p))
            if pause_after is not None and i == pause_after:
                await _until(lambda i=i: s.statistics().queued_stages >= i + 1, "queued", within_s=5)
                if clock is not None:
                    clock.advance(advance_s)
        await _until(lambda: s.statistics().queued_stages >= queued, "all queued", within_s=5)
        order.release.set()


P = Priority


@pytest.mark.anyio
async def test_most_urgent_first_fifo_within_a_priority() -> None:
    order = _Order(hold_device="cpu:0")
    prios = [P.BACKGROUND, P.NORMAL, P.HIGH, P.REALTIME, P.HIGH, P.BACKGROUND, P.NORMAL, P.REALTIME]
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[order], scheduling=hetsched.Scheduling(aging_s=None)) as s:
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
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[order], scheduling=hetsched.Scheduling(priorities=False)) as s:
        await _queue_behind_gate(s, order, prios, queued=len(prios))
    started = order.started["cpu:0"][1:]
    assert started == sorted(started)


@pytest.mark.anyio
async def test_aging_lets_a_long_waiting_background_request_go_first() -> None:
    # BACKGROUND (3) queued 0.3 s (virtual) before a REALTIME (0) request: with aging_s = 0.05
    # it has waited more than 3 * 0.05 s longer and goes first; without aging REALTIME would,
    # and so it does with aging when BACKGROUND waited only 0.1 s (< 3 * 0.05 s).
    cases = ((0.05, 0.3, P.BACKGROUND), (None, 0.3, P.REALTIME), (0.05, 0.1, P.REALTIME))
    for aging, waited_s, expect_first in cases:
        order = _Order(hold_device="cpu:0")
        clock = VirtualClock()
        async with Session(_two_stage(), devices=["cpu:0"], hooks=[order], scheduling=hetsched.Scheduling(aging_s=aging), clock=clock) as s:
            await _queue_behind_gate(s, order, [P.BACKGROUND, P.REALTIME, P.HIGH], queued=3,
                                     pause_after=0, clock=clock, advance_s=waited_s)
        started = order.started["cpu:0"][1:]
        assert order.priority[started[0]] is expect_first, (aging, [order.priority[r] for r in started])


@pytest.mark.anyio
async def test_preemption_point_is_the_stage_boundary() -> None:
    """BACKGROUND requests' second stages are ready and queued on cpu:1 first; a HIGH request
    arriving later still starts its second stage there before all of them."""
    order = _Order(hold_device="cpu:1")
    pol = Pinned({"relu": "cpu:0", "neg": "cpu:1"})
    async with (
        Session(_two_stage(), devices=["cpu:0", "cpu:1"], policy=pol, max_unit_nodes=1, hooks=[order]) as s,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(s.run, {"x": _x(0)})
        await anyio.to_thread.run_sync(order.entered.wait)
        for i in range(4):
            tg.start_soon(functools.partial(s.run, {"x": _x(i)}, priority=P.BACKGROUND))
        # all their relus ran; their negs wait on cpu:1
        await _until(lambda: order.done.get("cpu:0", 0) >= 5 and s.statistics().queued_stages >= 4, "relus",
                     within_s=5)
        tg.start_soon(lambda: s.run({"x": _x(9)}, priority=P.HIGH))
        await _until(lambda: order.done.get("cpu:0", 0) >= 6 and s.statistics().queued_stages >= 5, "HIGH's relu",
                     within_s=5)
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
                       hooks=[order, Spans()]) as s, anyio.create_task_group() as tg:
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
            await anyio.lowlevel.checkpoint()
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
    async with Session(_two_stage(), devices=[dev], hooks=[order, Meet()]) as s, anyio.create_task_group() as tg:
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
    # worker; then HIGH's stage runs and every later stage stays held at the gate. HIGH's
    # caller must wake while they are held. If HIGH were deferrable like BACKGROUND, its
    # wake-up would wait for the worker's queue to run short (never, while the gate holds it)
    # or for its deadline (the virtual clock does not move): the wait below would fail.
    gate = _Gate()
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[gate], max_in_flight=32, clock=VirtualClock()) as s:
        woke: dict[str, int] = {}

        async def tagged(tag: str, i: int, prio: Priority) -> None:
            await s.run({"x": _x(i)}, priority=prio)
            woke.setdefault(tag, s.statistics().queued_stages)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(tagged, "high", 99, Priority.HIGH)
                await _until(lambda: gate.entered == 1, "the worker holds HIGH's stage")
                for i in range(12):
                    tg.start_soon(tagged, "background", i, Priority.BACKGROUND)
                await _until(lambda: s.statistics().queued_stages == 12, "12 BACKGROUND stages queued")
                gate.grant(1)  # HIGH's stage only
                await _until(lambda: "high" in woke, "HIGH's caller woken while the queue is held")
                assert woke["high"] >= 11  # woken with the queue still deep (one may be at the gate)
                assert "background" not in woke
                gate.open()
        finally:
            gate.open()
        assert s.statistics().wakeups_coalesced > 0  # while BACKGROUND wake-ups were coalesced


@pytest.mark.anyio
async def test_deferred_wake_ups_still_flow_while_a_stream_keeps_the_queue_deep(anyio_backend: str) -> None:
    # New requests keep cpu:0's queue deep, so it never runs short. A finished NORMAL request's
    # wake-up is deferred, but only until a fraction of its time in the system has passed
    # (virtual time here): then the next stage to end delivers it, with the queue still deep.
    # Without that deadline the first caller would wait for the queue to drain (never, while
    # the test keeps feeding it): the bounded wait below would fail.
    clock = VirtualClock()
    gate = _Gate()
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[gate], max_in_flight=64, clock=clock) as s:
        woke: dict[int, int] = {}

        async def one(i: int) -> None:
            await s.run({"x": _x(i)})
            woke[i] = s.statistics().queued_stages

        try:
            async with anyio.create_task_group() as tg:
                await _start_in_order(tg, s, one, range(8))
                await _until(lambda: gate.entered == 1 and s.statistics().queued_stages == 7, "8 requests in")
                gate.grant(1)  # request 0 finishes with 7 stages queued behind it
                await _until(lambda: gate.entered == 2, "the worker took the next stage")
                await _let_the_loop_run()
                assert not woke and s.statistics().wakeups_coalesced == 1  # deferred: queue deep, no deadline yet
                await _start_in_order(tg, s, one, range(8, 12))  # the stream goes on
                await _until(lambda: s.statistics().queued_stages == 10, "the stream's next requests queued")
                await _let_the_loop_run()
                assert not woke  # still deferred: the deadline has not passed in virtual time
                clock.advance(1.0)  # past request 0's deadline
                gate.grant(1)  # request 1 finishes: the deadline has passed, both callers wake
                await _until(lambda: 0 in woke, "request 0's caller woken by its deadline")
                assert woke[0] >= 8  # ...while the queue is still deep
                gate.open()
        finally:
            gate.open()
        st = s.statistics()
        assert st.requests_completed == 12 and st.in_flight == 0
        assert sorted(woke) == list(range(12))


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
    # 16 requests on one worker; the first 8 finish while stages are still queued behind them,
    # so their wake-ups are deferred (the virtual clock keeps every deadline ahead). Four of
    # those callers (two zero-copy, whose outputs are pool buffers owed to them) and two whose
    # stages are still queued are cancelled before anything else runs. Whatever a cancelled
    # request holds must go back to the pool (else live_buffers > 0 and the session's close
    # raises BufferLeakError), and the others still get their results.
    gate = _Gate()
    n = 16
    scopes = [anyio.CancelScope() for _ in range(n)]
    outcome: dict[int, str] = {}
    cancel = (0, 1, 2, 3, 10, 11)
    async with Session(_two_stage(), devices=["cpu:0"], hooks=[gate], max_in_flight=32, clock=VirtualClock()) as s:
        async def one(i: int) -> None:
            with scopes[i]:
                if i % 2:
                    out = await s.run({"x": _x(i)}, zero_copy=True)
                    with out:
                        np.testing.assert_array_equal(out["y"], -np.maximum(_x(i), 0))
                else:
                    out = await s.run({"x": _x(i)})
                    np.testing.assert_array_equal(out["y"], -np.maximum(_x(i), 0))
                outcome[i] = "done"
            if scopes[i].cancelled_caught:
                outcome[i] = "cancelled"

        try:
            async with anyio.create_task_group() as tg:
                await _start_in_order(tg, s, one, range(n))
                await _until(lambda: gate.entered == 1 and s.statistics().queued_stages == n - 1, "all queued")
                gate.grant(8)  # requests 0..7 run and finish; request 8's stage waits at the gate
                await _until(lambda: gate.entered == 9, "requests 0..7 finished")
                await _let_the_loop_run()
                assert s.statistics().wakeups_coalesced == 8 and not outcome  # all 8 deferred
                live = sum(p.live_buffers for p in s.statistics().pools.values())
                assert live > 0  # the zero-copy callers' outputs wait in the pool for them
                for i in cancel:
                    scopes[i].cancel()
                await _until(lambda: len(outcome) == len(cancel), "the cancelled callers returned")
                gate.open()
        finally:
            gate.open()
        st = s.statistics()
        assert st.in_flight == 0
        assert sum(p.live_buffers for p in st.pools.values()) == 0
    assert outcome == {i: "cancelled" if i in cancel else "done" for i in range(n)}
    # and the session closed without a leak report (it would have raised BufferLeakError)
