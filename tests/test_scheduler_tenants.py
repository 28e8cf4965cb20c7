"""One scheduler serving several tenants (sessions): cross-tenant priority order on one
device, least slack / earliest deadline, flagged missed SLOs, aging, weights among equals,
admission limits per tenant and for the runtime, detaching while serving, per-tenant figures.

The scheduler is driven directly with fake stages on a fake accelerator (one worker thread);
each stage run advances a :class:`VirtualClock` by its modelled cost, so admission times,
deadlines and busy time are decided by the test, not by this machine's speed. A *blocker*
request holds the device until the test has queued everything it wants ordered.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import numpy as np
import pytest

from hetsched import Priority, RuntimeStateError
from hetsched._events import HookDispatcher
from hetsched._runtime._buffers import pools_for
from hetsched._runtime._clock import VirtualClock
from hetsched._runtime._domains import Topology
from hetsched._runtime._order import rekey
from hetsched._runtime._program import StageRuntime
from hetsched._runtime._scheduler import Order, Request, Scheduler, Tenant

pytestmark = pytest.mark.anyio

DEV = "npu"


@dataclass
class _Spec:
    id: int
    name: str
    device: str
    deps: tuple[int, ...] = ()
    inputs: tuple[str, ...] = ("x",)


@dataclass
class _Log:
    lock: threading.Lock = field(default_factory=threading.Lock)
    order: list[tuple[str, int]] = field(default_factory=list)
    """(tenant, request id) in the order their stage ran."""
    gate: threading.Event = field(default_factory=threading.Event)
    blocking: threading.Event = field(default_factory=threading.Event)


class _Stage:
    """y = x + 1 on the fake device; records (tenant, id) and advances the clock by ``cost_s``.
    A feed of -1 is the blocker: it waits for the log's gate (and is not recorded)."""

    def __init__(self, tenant: str, log: _Log, clock: VirtualClock, cost_s: float, bound: bool):
        self.tenant = tenant
        self.log = log
        self.clock = clock
        self.cost_s = cost_s
        self.input_names: tuple[str, ...] = ("x",)
        self.output_names: tuple[str, ...] = ("y",)
        self._bound = bound
        if bound:
            self.output_specs = lambda: [(np.float32, (4,))]

    @property
    def hooks(self) -> Any:
        """The optional protocols it declares: running in place when ``bound``."""
        from hetsched.backends._base import StageHooks

        return StageHooks(in_place=cast(Any, self) if self._bound else None)

    def _enter(self, x: np.ndarray) -> None:
        rid = int(x[0])
        if rid < 0:
            self.log.blocking.set()
            assert self.log.gate.wait(10)
        else:
            with self.log.lock:
                self.log.order.append((self.tenant, rid))
        self.clock.advance(self.cost_s)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self._enter(feeds["x"])
        return [feeds["x"] + 1]

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        self._enter(feeds["x"])
        outputs[0][...] = feeds["x"] + 1

    def close(self) -> None:
        pass


@dataclass
class _Dev:
    name: str
    kind: str = "npu"


@dataclass
class _Board:
    sched: Scheduler
    clock: VirtualClock
    log: _Log
    pools: dict[str, Any]
    ids: Any = field(default_factory=lambda: iter(range(1, 1_000_000)))

    def attach(self, name: str, *, cost_s: float = 0.01, bound: bool = False, **kw: Any) -> Tenant:
        tenant = self.sched.attach(name, dispatch=HookDispatcher(), **kw)
        compiled = _Stage(name, self.log, self.clock, cost_s, bound)
        st = StageRuntime(_Spec(0, f"{name}-s0", DEV), compiled, f"{name}-s0", cost_s, "host")
        tenant.set_stages([st], {"y": 0})
        return tenant

    def request(self, tenant: Tenant, priority: Priority, rid: int | None = None, **kw: Any) -> Request:
        rid = next(self.ids) if rid is None else rid
        feeds = {"x": np.full(4, float(rid), np.float32)}
        return tenant.new_request(rid, int(priority), tenant.program(["y"], ["x"]), feeds, **kw)

    async def run(self, tenant: Tenant, req: Request) -> np.ndarray:
        await tenant.execute(req)
        out = dict(tenant.take_outputs(req))
        y: np.ndarray = out["y"]
        return y

    async def queued(self, n: int) -> None:
        """Wait until ``n`` stages are queued (the blocker holds the worker meanwhile)."""
        with anyio.fail_after(10):
            while self.sched.queued() < n:  # noqa: ASYNC110 (a count device worker threads change)
                await anyio.sleep(0.001)


def _board(**kw: Any) -> _Board:
    clock = VirtualClock()
    topology = Topology.host_only()
    pools = pools_for(topology)
    sched = Scheduler(pools=pools, topology=topology, host="host", engine=None, clock=clock, **kw)
    sched.start([_Dev(DEV)], lambda dev: [()])
    return _Board(sched, clock, _Log(), pools)


async def _close(board: _Board) -> None:
    for w in board.sched.stop():
        await anyio.to_thread.run_sync(w.join)
    for pool in board.pools.values():
        pool.close()  # raises BufferLeakError if a buffer was left referenced


@pytest.fixture
async def board() -> AsyncIterator[_Board]:
    b = _board(aging_s=0.01)
    try:
        yield b
    finally:
        b.log.gate.set()
        await _close(b)


async def _serve_in_order(board: _Board, jobs: list[tuple[Tenant, Request]], blocker: tuple[Tenant, Request]) -> None:
    """Run ``blocker`` first, queue ``jobs`` behind it, then let everything run."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(board.run, *blocker)
        await anyio.to_thread.run_sync(board.log.blocking.wait, 10)
        for n, (tenant, req) in enumerate(jobs, 1):
            tg.start_soon(board.run, tenant, req)
            await board.queued(n)  # one at a time: equal keys keep the order they were pushed in
        board.log.gate.set()


# -- priority across tenants ------------------------------------------------------------------

@pytest.mark.parametrize("priorities", [True, False])
async def test_a_high_request_of_one_tenant_overtakes_queued_background_stages_of_another(
        priorities: bool) -> None:
    board = _board(aging_s=0.5, priorities=priorities)
    try:
        a, b = board.attach("A"), board.attach("B")
        jobs = [(a, board.request(a, Priority.BACKGROUND, rid)) for rid in (1, 2, 3, 4)]
        jobs.append((b, board.request(b, Priority.HIGH, 5)))
        await _serve_in_order(board, jobs, (a, board.request(a, Priority.BACKGROUND, -1)))
        if priorities:
            assert board.log.order == [("B", 5), ("A", 1), ("A", 2), ("A", 3), ("A", 4)]
        else:  # FIFO: admission order, whatever the class
            assert board.log.order == [("A", 1), ("A", 2), ("A", 3), ("A", 4), ("B", 5)]
    finally:
        board.log.gate.set()
        await _close(board)


# -- deadlines ------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [Order.LEAST_SLACK, Order.EARLIEST_DEADLINE])
async def test_within_a_class_least_slack_or_earliest_deadline_first(order: Order) -> None:
    """X: 50 ms stages, SLO 100 ms (latest start 50 ms); Y: 1 ms stages, SLO 60 ms (latest
    start 59 ms). Least slack serves X first, earliest deadline Y first; a request without SLO
    admitted at the same time goes before both (its deadline is its admission)."""
    board = _board(aging_s=0.5, order=order)
    try:
        x, y = board.attach("X", cost_s=0.05), board.attach("Y", cost_s=0.001)
        z = board.attach("Z", cost_s=0.0)
        jobs = [(y, board.request(y, Priority.NORMAL, 1, slo_s=0.06)),
                (x, board.request(x, Priority.NORMAL, 2, slo_s=0.1)),
                (y, board.request(y, Priority.NORMAL, 3, slo_s=None))]
        await _serve_in_order(board, jobs, (z, board.request(z, Priority.NORMAL, -1)))
        first = [("Y", 3)]
        assert board.log.order == first + ([("X", 2), ("Y", 1)] if order is Order.LEAST_SLACK
                                           else [("Y", 1), ("X", 2)])
        # either way both made it here: nothing was flagged
        assert (x.statistics().slo_met, y.statistics().slo_met, y.statistics().slo_flagged) == (1, 1, 0)
    finally:
        board.log.gate.set()
        await _close(board)


async def test_a_request_that_cannot_meet_its_slo_is_flagged_served_after_the_others_and_counted() -> None:
    """The blocker holds the device 20 ms. ``a`` (SLO 25 ms, 10 ms stage: latest start 15 ms)
    is found late when popped at 20 ms: flagged, queued again behind ``b`` (SLO 100 ms),
    which still can make it; neither is dropped. ``c`` is late from its admission on (SLO
    5 ms for a 10 ms stage) and goes after ``b`` although it came first (flagged ones keep the
    order they were flagged in). Without the flag ``a`` would run before ``b`` and ``c`` first."""
    board = _board(aging_s=0.5)
    try:
        await _flagged(board)
    finally:
        board.log.gate.set()
        await _close(board)


async def _flagged(board: _Board) -> None:
    t = board.attach("T", cost_s=0.01)
    blocker_tenant = board.attach("Blocker", cost_s=0.02)
    c = board.request(t, Priority.NORMAL, 3, slo_s=0.005)
    a = board.request(t, Priority.NORMAL, 1, slo_s=0.025)
    b = board.request(t, Priority.NORMAL, 2, slo_s=0.1)
    assert c.flagged and not a.flagged and not b.flagged
    await _serve_in_order(board, [(t, c), (t, a), (t, b)],
                          (blocker_tenant, board.request(blocker_tenant, Priority.NORMAL, -1)))
    assert board.log.order == [("T", 2), ("T", 3), ("T", 1)]
    assert a.flagged and not b.flagged
    stats = t.statistics()
    assert (stats.completed, stats.slo_requests, stats.slo_met, stats.slo_missed, stats.slo_flagged) == (3, 3, 1, 2, 2)
    assert stats.in_flight == 0


class _Branch:
    """One stage of a small DAG: copies its one input to its one output, costing ``cost_s``."""

    def __init__(self, name: str, inp: str, out: str, clock: VirtualClock, cost_s: float, ran: list[str]):
        self.name = name
        self.input_names: tuple[str, ...] = (inp,)
        self.output_names: tuple[str, ...] = (out,)
        self.clock, self.cost_s, self.ran = clock, cost_s, ran

    @property
    def hooks(self) -> Any:
        from hetsched.backends._base import StageHooks

        return StageHooks()

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.ran.append(self.name)
        self.clock.advance(self.cost_s)
        return [next(iter(feeds.values()))]

    def close(self) -> None:
        pass


async def test_each_stage_is_keyed_by_the_longest_path_left_after_it(board: _Board) -> None:
    """s0 (10 ms) feeds s1 (5 ms) and s2 (20 ms): what is left from s0 is 30 ms, from s1 5 ms,
    from s2 20 ms. Both become ready together (s1 pushed first); s2, with less slack, runs first."""
    t = board.sched.attach("T", dispatch=HookDispatcher())
    ran: list[str] = []
    specs = [(_Spec(0, "s0", DEV, (), ("x",)), "x", "a", 0.01), (_Spec(1, "s1", DEV, (0,), ("a",)), "a", "b", 0.005),
             (_Spec(2, "s2", DEV, (0,), ("a",)), "a", "c", 0.02)]
    stages = [StageRuntime(spec, _Branch(spec.name, i, o, board.clock, c, ran), spec.name, c, "host")
              for spec, i, o, c in specs]
    t.set_stages(stages, {"a": 0, "b": 1, "c": 2})
    req = t.new_request(1, int(Priority.NORMAL), t.program(["b", "c"], ["x"]), {"x": np.zeros(4, np.float32)},
                        slo_s=1.0)
    step = int(Priority.NORMAL) * 0.01
    assert dict(req.rem or {}) == {0: pytest.approx(0.03), 1: pytest.approx(0.005), 2: pytest.approx(0.02)}
    assert req.key == pytest.approx(1.0 - 0.03 + step)
    rekey(t, req, stages[1])
    assert req.key == pytest.approx(1.0 - 0.005 + step)
    await t.execute(req)
    assert set(dict(t.take_outputs(req))) == {"b", "c"}
    assert ran == ["s0", "s2", "s1"]
    assert t.statistics().slo_met == 1


# -- aging ------------------------------------------------------------------------------------------

async def test_aging_lets_a_waiting_background_request_of_one_tenant_pass_newer_high_ones(board: _Board) -> None:
    """aging_s = 10 ms: a BACKGROUND request (class 3) admitted at 0 has key 30 ms; HIGH
    requests (class 1) admitted every 6 ms have keys 10, 16, 22, 28, 34, ...: the four
    admitted before 20 ms go first, then the BACKGROUND one, then the rest: never starved."""
    bg, hi = board.attach("bg", cost_s=0.0), board.attach("hi", cost_s=0.0)
    blocker = board.request(bg, Priority.BACKGROUND, -1)
    jobs = [(bg, board.request(bg, Priority.BACKGROUND, 100))]
    for i in range(8):
        jobs.append((hi, board.request(hi, Priority.HIGH, i)))
        board.clock.advance(0.006)
    await _serve_in_order(board, jobs, (bg, blocker))
    assert board.log.order.index(("bg", 100)) == 4
    assert [r for _, r in board.log.order if r != 100] == list(range(8))


async def test_without_aging_background_waits_for_every_queued_high_request() -> None:
    board = _board(aging_s=None)
    try:
        bg, hi = board.attach("bg", cost_s=0.0), board.attach("hi", cost_s=0.0)
        blocker = board.request(bg, Priority.BACKGROUND, -1)
        jobs = [(bg, board.request(bg, Priority.BACKGROUND, 100))]
        for i in range(8):
            jobs.append((hi, board.request(hi, Priority.HIGH, i)))
            board.clock.advance(0.005)
        await _serve_in_order(board, jobs, (bg, blocker))
        assert board.log.order[-1] == ("bg", 100)
    finally:
        board.log.gate.set()
        await _close(board)


# -- fairness among equals --------------------------------------------------------------------------

@pytest.mark.parametrize(("weights", "expected"), [((3.0, 1.0), (6, 2)), ((1.0, 1.0), (4, 4))])
async def test_weights_share_the_device_among_equal_requests_of_backlogged_tenants(
        board: _Board, weights: tuple[float, float], expected: tuple[int, int]) -> None:
    """Two tenants queue 8 NORMAL requests each (no SLO, 10 ms stages), interleaved: of the
    first 8 served, weights 3:1 give A 6 and B 2; equal weights 4 and 4."""
    blocker_tenant = board.attach("C", cost_s=0.0, weight=1e-9)
    a = board.attach("A", cost_s=0.01, weight=weights[0])
    b = board.attach("B", cost_s=0.01, weight=weights[1])
    jobs: list[tuple[Tenant, Request]] = []
    blocker = board.request(blocker_tenant, Priority.NORMAL, -1)
    for i in range(8):
        jobs.append((a, board.request(a, Priority.NORMAL, i)))
        jobs.append((b, board.request(b, Priority.NORMAL, 100 + i)))
    await _serve_in_order(board, jobs, (blocker_tenant, blocker))
    first = [name for name, _ in board.log.order[:8]]
    assert (first.count("A"), first.count("B")) == expected
    # each tenant's own requests stay in admission order
    assert [r for n, r in board.log.order if n == "A"] == list(range(8))
    assert [r for n, r in board.log.order if n == "B"] == [100 + i for i in range(8)]


async def test_fair_tags_are_kept_per_class_so_a_tenants_bulk_never_delays_its_urgent_requests(
        board: _Board) -> None:
    """A queues 8 BACKGROUND requests (its BACKGROUND fair tags run 160 ms ahead), B one; A's HIGH
    request admitted at the same instant still goes before every BACKGROUND one (aging_s 10 ms)."""
    blocker_tenant = board.attach("C", cost_s=0.0, weight=1e-9)
    a, b = board.attach("A", cost_s=0.01), board.attach("B", cost_s=0.01)
    jobs = [(a, board.request(a, Priority.BACKGROUND, i)) for i in range(8)]
    jobs.append((b, board.request(b, Priority.BACKGROUND, 100)))
    jobs.append((a, board.request(a, Priority.HIGH, 50)))
    await _serve_in_order(board, jobs, (blocker_tenant, board.request(blocker_tenant, Priority.NORMAL, -1)))
    assert board.log.order[0] == ("A", 50)


async def test_a_tenant_left_alone_keeps_its_own_order_after_the_other_detaches(board: _Board) -> None:
    """A's queued requests carry fair tags 10-40 ms ahead (B was attached); once B detaches,
    A's next request still queues behind them (it leaves plain admission order only when caught up)."""
    a, b = board.attach("A", cost_s=0.01), board.attach("B", cost_s=0.01)
    blocker = board.request(a, Priority.NORMAL, -1)
    jobs = [(a, board.request(a, Priority.NORMAL, i)) for i in range(4)]
    await board.sched.detach(b)
    assert not board.sched.shared
    jobs.append((a, board.request(a, Priority.NORMAL, 4)))
    await _serve_in_order(board, jobs, (a, blocker))
    assert board.log.order == [("A", i) for i in range(5)]
    board.clock.advance(1.0)  # caught up: plain admission order again
    late = board.request(a, Priority.NORMAL, 5)
    assert late.key == pytest.approx(board.clock.monotonic() + int(Priority.NORMAL) * 0.01)
    assert not a.finish_tags
    await board.run(a, late)


async def test_a_streams_request_made_ahead_is_charged_its_fair_share_once_when_admitted(board: _Board) -> None:
    a, _b = board.attach("A", cost_s=0.01), board.attach("B", cost_s=0.01)
    program = a.program(["y"], ["x"])
    ahead = [a.new_request(i, int(Priority.NORMAL), program, {"x": np.zeros(4, np.float32)}, waiter=None)
             for i in range(2)]
    assert not a.finish_tags  # made ahead: nothing charged yet
    for req in ahead:
        a.admit(req)
    step = int(Priority.NORMAL) * 0.01
    assert [r.key for r in ahead] == [pytest.approx(0.0 + step), pytest.approx(0.01 + step)]
    for req in ahead:  # never pushed: closing them lets the tenant go
        with req.lock:
            req.closed = True
            req.finalize_locked()
    assert a.statistics().in_flight == 0


async def test_shares_are_among_the_tenants_of_one_class(board: _Board) -> None:
    """Three BACKGROUND tenants with requests in flight take no share of the NORMAL class: the
    NORMAL tenant's fair tags advance by its own cost per request, as if alone in its class."""
    bgs = [board.attach(f"bg{i}", cost_s=0.01) for i in range(3)]
    for t in bgs:
        board.request(t, Priority.BACKGROUND)
    a = board.attach("A", cost_s=0.01)
    reqs = [board.request(a, Priority.NORMAL, i) for i in range(3)]
    step = int(Priority.NORMAL) * 0.01
    assert [r.key for r in reqs] == [pytest.approx(0.0 + step), pytest.approx(0.01 + step),
                                     pytest.approx(0.02 + step)]
    b = board.attach("B", cost_s=0.01)  # a second NORMAL tenant: now each gets half the class
    board.request(b, Priority.NORMAL, 10)
    assert board.request(a, Priority.NORMAL, 3).key == pytest.approx(0.03 + step)
    assert board.request(a, Priority.NORMAL, 4).key == pytest.approx(0.05 + step)
    for t in (*bgs, a, b):  # never pushed: close them so that the tenants let go
        with t._lock:
            left = list(t._requests)
        for req in left:
            with req.lock:
                req.closed = True
                req.finalize_locked()


async def test_a_tenant_alone_keeps_admission_order(board: _Board) -> None:
    a = board.attach("A", cost_s=0.01)
    blocker = board.request(a, Priority.NORMAL, -1)
    jobs = [(a, board.request(a, Priority.NORMAL, i)) for i in range(5)]
    assert [r.key for _, r in jobs] == [blocker.key] * 5  # admitted at one virtual instant: FIFO by sequence
    await _serve_in_order(board, jobs, (a, blocker))
    assert board.log.order == [("A", i) for i in range(5)]


# -- admission --------------------------------------------------------------------------------------

async def test_per_tenant_limit_holds_its_own_requests_only(board: _Board) -> None:
    a = board.attach("A", max_in_flight=2)
    b = board.attach("B")
    await a.acquire(int(Priority.NORMAL))
    await a.acquire(int(Priority.NORMAL))
    assert not a.try_acquire()
    assert b.try_acquire()  # another tenant is not held back by A's limit
    got = anyio.Event()

    async def third() -> None:
        await a.acquire(int(Priority.NORMAL))
        got.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(third)
        await anyio.wait_all_tasks_blocked()
        assert not got.is_set()
        a.release()
        await got.wait()
    assert a.slots_in_use == 2
    a.release(2)
    b.release()


async def test_the_runtime_limit_hands_a_freed_slot_to_the_most_urgent_waiter() -> None:
    board = _board(aging_s=0.5, max_in_flight=3)
    try:
        a, b = board.attach("A"), board.attach("B")
        await a.acquire(int(Priority.NORMAL))
        await a.acquire(int(Priority.NORMAL))
        await b.acquire(int(Priority.NORMAL))
        assert not b.try_acquire() and not a.try_acquire()
        got: list[str] = []

        async def wait(tenant: Tenant, priority: Priority) -> None:
            await tenant.acquire(int(priority))
            got.append(tenant.name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, a, Priority.BACKGROUND)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(wait, b, Priority.HIGH)
            await anyio.wait_all_tasks_blocked()
            stats = board.sched.statistics()
            assert (stats.admitted, stats.waiting, stats.max_in_flight) == (3, 2, 3)
            a.release()  # the HIGH waiter of B goes first, though A's BACKGROUND one came first
            await anyio.wait_all_tasks_blocked()
            assert got == ["B"]
            b.release()
        assert got == ["B", "A"]
    finally:
        await _close(board)


async def test_a_background_waiter_for_a_runtime_slot_ages_past_newer_high_ones() -> None:
    """aging_s 0.5: a BACKGROUND caller waiting since 0 (key 1.5) goes before a HIGH one
    arriving at 2 s (key 2.5): the runtime's admission never starves a class either."""
    board = _board(aging_s=0.5, max_in_flight=1)
    try:
        a, b = board.attach("A"), board.attach("B")
        await a.acquire(int(Priority.NORMAL))
        got: list[str] = []

        async def wait(tenant: Tenant, priority: Priority) -> None:
            await tenant.acquire(int(priority))
            got.append(tenant.name)
            tenant.release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, b, Priority.BACKGROUND)
            await anyio.wait_all_tasks_blocked()
            board.clock.advance(2.0)
            tg.start_soon(wait, a, Priority.HIGH)
            await anyio.wait_all_tasks_blocked()
            a.release()
        assert got == ["B", "A"]
    finally:
        await _close(board)


async def test_a_cancelled_waiter_passes_its_runtime_slot_on() -> None:
    board = _board(aging_s=0.5, max_in_flight=1)
    try:
        a = board.attach("A", max_in_flight=5)
        await a.acquire(int(Priority.NORMAL))
        with anyio.move_on_after(0.01):
            await a.acquire(int(Priority.NORMAL))
        assert a.slots_in_use == 1  # the cancelled caller gave its tenant slot back
        a.release()
        assert a.try_acquire()
        a.release()
    finally:
        await _close(board)


# -- detaching ------------------------------------------------------------------------------------

async def test_detach_while_serving_drains_only_that_tenant_and_loses_nothing(board: _Board) -> None:
    """A and B serve requests with pool-bound outputs; A detaches while its requests and B's are
    queued: every request of A completes with its result, B keeps being served afterwards, no
    buffer stays referenced (the pools close clean) and A refuses new requests."""
    a = board.attach("A", cost_s=0.001, bound=True)
    b = board.attach("B", cost_s=0.001, bound=True)
    results: dict[tuple[str, int], float] = {}

    async def one(tenant: Tenant, rid: int) -> None:
        y = await board.run(tenant, board.request(tenant, Priority.NORMAL, rid))
        results[(tenant.name, rid)] = float(y[0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(board.run, b, board.request(b, Priority.NORMAL, -1))
        await anyio.to_thread.run_sync(board.log.blocking.wait, 10)
        for rid in range(10):
            tg.start_soon(one, a, rid)
            tg.start_soon(one, b, 100 + rid)
            await board.queued(2 * rid + 2)
        detached = anyio.Event()
        final: list[Any] = []

        async def detach() -> None:
            final.append(await board.sched.detach(a))
            detached.set()

        async def detach_again() -> None:  # a second caller waits for the same drain
            final.append(await a.detach())

        tg.start_soon(detach)
        tg.start_soon(detach_again)
        await anyio.wait_all_tasks_blocked()
        assert not detached.is_set()  # A's requests are still queued: detach waits for them
        with pytest.raises(RuntimeStateError, match="detached"):
            board.request(a, Priority.NORMAL, 999)
        board.log.gate.set()
        await detached.wait()
        for rid in range(10, 15):  # B is served on after A is gone
            tg.start_soon(one, b, 100 + rid)
    assert {k: v for k, v in results.items() if k[0] == "A"} == {("A", r): r + 1.0 for r in range(10)}
    assert len([k for k in results if k[0] == "B"]) == 15
    assert len(final) == 2
    stats = final[0]
    assert (stats.requests, stats.completed, stats.in_flight, stats.detached) == (10, 10, 0, True)
    assert board.sched.tenants() == (b,)
    assert [t.name for t in board.sched.statistics().tenants] == ["B", "A"]
    for pool in board.pools.values():
        assert pool.statistics().live_buffers == 0


async def test_detach_after_the_workers_stopped_fails_what_can_no_longer_run() -> None:
    """A runtime closing with a session attached stops the workers first: detaching then fails
    the tenant's queued requests with RuntimeStateError instead of waiting forever."""
    board = _board(aging_s=0.5)
    a = board.attach("A", cost_s=0.001, bound=True)
    errors: list[BaseException] = []

    async def one(rid: int) -> None:
        try:
            await board.run(a, board.request(a, Priority.NORMAL, rid))
        except RuntimeStateError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, -1)
        await anyio.to_thread.run_sync(board.log.blocking.wait, 10)
        for rid in range(3):
            tg.start_soon(one, rid)
        await board.queued(3)
        workers = board.sched.stop()
        board.log.gate.set()
        for w in workers:
            await anyio.to_thread.run_sync(w.join)
        with anyio.fail_after(10):
            stats = await a.detach()
    assert len(errors) == 3 and stats.in_flight == 0 and stats.failed == 3 and stats.completed == 1
    for pool in board.pools.values():
        pool.close()


async def test_a_request_whose_next_stage_finds_the_workers_stopped_fails_and_lets_go() -> None:
    """s0 runs while the workers are stopped; its consumer s1 has no worker any more: the request
    fails with RuntimeStateError (its caller is woken, its buffers go back), the worker thread lives
    to finish its stop."""
    board = _board(aging_s=0.5)
    t = board.sched.attach("T", dispatch=HookDispatcher())
    held = threading.Event()
    go = threading.Event()

    class _Hold(_Branch):
        def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            held.set()
            assert go.wait(10)
            return super().run(feeds)

    ran: list[str] = []
    s0 = StageRuntime(_Spec(0, "s0", DEV, (), ("x",)), _Hold("s0", "x", "a", board.clock, 0.0, ran), "s0", 0.0,
                      "host")
    s1 = StageRuntime(_Spec(1, "s1", DEV, (0,), ("a",)), _Branch("s1", "a", "b", board.clock, 0.0, ran), "s1", 0.0,
                      "host")
    t.set_stages([s0, s1], {"a": 0, "b": 1})
    req = t.new_request(1, int(Priority.NORMAL), t.program(["b"], ["x"]), {"x": np.zeros(4, np.float32)})
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            errors: list[BaseException] = []

            async def run() -> None:
                try:
                    await t.execute(req)
                except RuntimeStateError as exc:
                    errors.append(exc)

            tg.start_soon(run)
            await anyio.to_thread.run_sync(held.wait, 10)
            workers = board.sched.stop()
            go.set()
            for w in workers:
                await anyio.to_thread.run_sync(w.join)
    assert ran == ["s0"] and len(errors) == 1 and "stopped" in str(errors[0])
    assert t.statistics().in_flight == 0 and t.statistics().failed == 1
    for pool in board.pools.values():
        pool.close()


# -- figures ----------------------------------------------------------------------------------------

async def test_per_tenant_busy_time_per_device_sums_to_the_boards(board: _Board) -> None:
    a, b = board.attach("A", cost_s=0.004), board.attach("B", cost_s=0.001)
    board.log.gate.set()
    for i in range(5):
        await board.run(a, board.request(a, Priority.NORMAL, i))
        await board.run(b, board.request(b, Priority.HIGH, i, slo_s=1.0))
    sa, sb = a.statistics(), b.statistics()
    assert sa.busy_s[DEV] == pytest.approx(0.02) and sb.busy_s[DEV] == pytest.approx(0.005)
    assert (sa.stage_runs, sb.stage_runs, sb.slo_met, sa.slo_requests) == (5, 5, 5, 0)
    total = board.sched.statistics()
    assert total.busy_s[DEV] == pytest.approx(0.025)
    with pytest.raises(AttributeError):
        sa.requests = 0  # type: ignore[misc]  # a frozen snapshot


async def test_bad_tenant_options_are_refused(board: _Board) -> None:
    with pytest.raises(ValueError, match="weight"):
        board.attach("w", weight=0.0)
    with pytest.raises(ValueError, match="max_in_flight"):
        board.attach("m", max_in_flight=0)
    with pytest.raises(ValueError, match="slo_s"):
        board.attach("s", slo_s=-1.0)
    board.attach("dup")
    with pytest.raises(ValueError, match="already attached"):
        board.attach("dup")
