"""``hetsched.Runtime``: one board, several sessions (issue 26), through the public surface.

Attaching and detaching while another session serves loses nothing; closing a session leaves
the others serving; the device workers are the runtime's, however many sessions attach; the
board's energy is split by busy time and sums to the total; the runtime's governor restores
the clocks when the runtime closes with sessions still attached; the option objects validate.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import onnx
import pytest

import hetsched
from hetsched import Adaptation, Memory, Priority, Runtime, RuntimeStateError, Scheduling, Session
from hetsched.lowlevel import SystemClock
from hetsched.testing import dvfs_knobs

from _models import conv_relu_cnn, neg_relu_chain

pytestmark = pytest.mark.anyio


def _expected(x: np.ndarray, n: int = 3) -> np.ndarray:
    for i in range(n):
        x = -x if i % 2 == 0 else np.maximum(x, 0)
    return x


def _worker_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("hetsched-") and "compile" not in t.name)


async def test_worker_threads_are_the_runtimes_whatever_the_number_of_sessions(anyio_backend: str) -> None:
    before = _worker_threads()
    async with Runtime(devices=["cpu:0", "cpu:1"]) as rt:
        board = _worker_threads() - before
        assert board == rt.worker_threads() >= 1
        async with (
            Session(neg_relu_chain(), runtime=rt, max_unit_nodes=1) as a,
            Session(neg_relu_chain(), runtime=rt, max_unit_nodes=1) as b,
            Session(neg_relu_chain(), runtime=rt, max_unit_nodes=1) as c,
        ):
            x = np.arange(16, dtype=np.float32) - 8
            for s in (a, b, c):
                np.testing.assert_array_equal((await s.run({"x": x}))["y"], _expected(x))
            assert _worker_threads() - before == board  # three sessions, one set of workers
            assert rt.statistics().worker_threads == board
            assert set(rt.sessions) == {a.name, b.name, c.name} and len(rt.sessions) == 3
    assert _worker_threads() == before  # every worker joined


async def test_attach_and_detach_while_another_session_serves_loses_nothing(anyio_backend: str) -> None:
    x = np.arange(16, dtype=np.float32) - 8
    want = _expected(x)
    served: list[int] = []
    async with Runtime(devices=["cpu:0", "cpu:1"]) as rt:
        async with Session(neg_relu_chain(), runtime=rt, max_unit_nodes=1, name="steady") as steady:
            stop = anyio.Event()
            more = anyio.Event()
            target = [1 << 30]

            async def serve() -> None:
                while not stop.is_set():
                    out = await steady.run({"x": x}, priority=Priority.BACKGROUND)
                    np.testing.assert_array_equal(out["y"], want)
                    served.append(1)
                    if len(served) >= target[0]:
                        more.set()
                    await anyio.lowlevel.checkpoint()

            async with anyio.create_task_group() as tg:
                tg.start_soon(serve)
                for round_ in range(3):  # sessions come and go while `steady` serves
                    async with Session(neg_relu_chain(), runtime=rt, max_unit_nodes=1, name="visitor") as visitor:
                        async def urgent(v: Session = visitor) -> None:
                            np.testing.assert_array_equal((await v.run({"x": x}, priority=Priority.HIGH))["y"], want)

                        async with anyio.create_task_group() as inner:
                            for _ in range(8):
                                inner.start_soon(urgent)
                        v = visitor.statistics()
                        assert v.requests_completed == 8 and v.requests_failed == 0
                    assert visitor.statistics().in_flight == 0
                    assert steady.statistics().requests_failed == 0, round_
                    with pytest.raises(RuntimeStateError):
                        await visitor.run({"x": x})  # closed: refused, the others unaffected
                # `steady` keeps serving after the last visitor left
                more = anyio.Event()
                target[0] = len(served) + 5
                await more.wait()
                stop.set()
            st = steady.statistics()
            assert st.requests_completed == len(served) and st.requests_failed == 0
            assert st.requests_cancelled == 0 and st.in_flight == 0
        shares = {s.name: s for s in rt.statistics().sessions}
        # every visitor attached under a name of its own; all detached now, with all requests done
        assert set(shares) == {"steady", "visitor", "visitor#2", "visitor#3"}
        assert all(not s.attached and s.requests == s.completed for s in shares.values())
    # the runtime closed its pools without a leak report: every buffer of every session came back


async def test_closing_the_runtime_closes_sessions_still_attached(anyio_backend: str) -> None:
    class _Ends(hetsched.Hooks):
        ended = 0

        def session_end(self, info: hetsched.EventInfo) -> None:
            self.ended += 1

    ends = _Ends()
    x = np.ones(16, np.float32)
    rt = Runtime(devices=["cpu:0"])
    s = Session(neg_relu_chain(), runtime=rt, hooks=[ends])
    async with rt:
        await s.__aenter__()
        await s.run({"x": x})
    # the runtime closed the session first: it refuses requests, its stages are closed
    with pytest.raises(RuntimeStateError):
        await s.run({"x": x})
    assert s.statistics().requests_completed == 1
    assert rt.sessions == ()
    await s.__aexit__(None, None, None)  # a late exit is harmless: closed once
    assert ends.ended == 1


async def test_per_session_energy_is_split_from_the_boards_and_sums_to_it(
        tmp_path: Path, anyio_backend: str) -> None:
    twin = hetsched.LiveTwin("rk3588", tmp_path, noise=False)
    twin.advance(0.0)
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    no_replan = Adaptation(replanning=None)
    async with Runtime(root=tmp_path, devices=["gpu"]) as rt:  # the twin's GPU: modelled time and energy
        async with Session(conv_relu_cnn(), runtime=rt, adaptation=no_replan, name="a") as a, \
                   Session(conv_relu_cnn(), runtime=rt, adaptation=no_replan, name="b") as b:
            for _ in range(6):
                await a.run({"x": x})
            for _ in range(2):
                await b.run({"x": x})
            ea, eb = a.statistics().energy_j, b.statistics().energy_j
        st = rt.statistics()
    assert ea is not None and eb is not None and ea > 0 and eb > 0
    assert st.energy_source == "modelled"
    assert st.energy_j == pytest.approx(ea + eb, rel=1e-9)
    assert set(st.energy_split_j) == {"a", "b"}
    assert sum(st.energy_split_j.values()) == pytest.approx(st.energy_j, rel=1e-9)
    shares = {s.name: s for s in st.sessions}
    assert shares["a"].busy_share + shares["b"].busy_share == pytest.approx(1.0)
    # split by busy time: a ran three times as many requests as b on the one device
    assert shares["a"].busy_share > shares["b"].busy_share > 0
    assert set(st.busy_s) == {"gpu"}
    assert st.busy_s["gpu"] == pytest.approx(sum(sum(s.busy_s.values()) for s in st.sessions))


async def test_the_runtimes_governor_restores_clocks_when_it_closes_with_sessions_attached(
        tmp_path: Path, anyio_backend: str) -> None:
    from hetsched._governor._sysfs import SysfsPort
    from hetsched._twin.live import LiveTwin

    class Clock:
        t = 1000.0

        def __call__(self) -> float:
            return self.t

    twin = LiveTwin("rk3588", tmp_path, noise=False)
    root = twin.write_once()
    clock = Clock()

    def sleep(s: float) -> None:
        clock.t += s
        twin.advance(0.0)

    before = dvfs_knobs(root)
    gov = hetsched.Governor(port=SysfsPort(root, clock=clock, sleep=sleep), clock=clock, autotune=False,
                            handle_signals=False, tick_period_s=0)
    x = np.ones(16, np.float32)
    rt = Runtime(root=root, devices=["cpu:0"], governor=gov)
    a = Session(neg_relu_chain(), runtime=rt, name="a")
    b = Session(neg_relu_chain(), runtime=rt, name="b")
    async with rt:
        await a.__aenter__()
        await b.__aenter__()
        for _ in range(4):  # both sessions' requests drive the one governor's phases
            await a.run({"x": x})
            await b.run({"x": x})
        for phase in (hetsched.Phase.INFER, hetsched.Phase.IDLE, hetsched.Phase.INFER):
            gov.on_phase(phase)
            clock.t += 0.5
            twin.advance(0.5)
        during = dvfs_knobs(root)
        assert rt.sessions == ("a", "b")  # still attached when the runtime closes
    twin.advance(0.0)
    assert gov.statistics().writes > 0 and during != before, "the governor never changed a clock"
    assert dvfs_knobs(root) == before
    assert gov.statistics().restored
    for s in (a, b):
        with pytest.raises(RuntimeStateError):
            await s.run({"x": x})


async def test_a_session_on_a_runtime_refuses_what_belongs_to_the_runtime(anyio_backend: str) -> None:
    async with Runtime(devices=["cpu:0"]) as rt:
        with pytest.raises(ValueError, match="scheduling"):
            Session(neg_relu_chain(), runtime=rt, scheduling=Scheduling(aging_s=1.0))
        with pytest.raises(ValueError, match="memory"):
            Session(neg_relu_chain(), runtime=rt, memory=Memory(chunk_bytes=4096))
        with pytest.raises(ValueError, match="governor"):
            Session(neg_relu_chain(), runtime=rt, governor=object())
        with pytest.raises(ValueError, match="clock"):
            Session(neg_relu_chain(), runtime=rt, clock=SystemClock())
        with pytest.raises(hetsched.DeviceSpecError, match="cpu:1"):
            async with Session(neg_relu_chain(), runtime=rt, devices=["cpu:1"]):
                pass
        # the failed attach left nothing behind: another session attaches and serves
        async with Session(neg_relu_chain(), runtime=rt) as s:
            out = await s.run({"x": np.ones(16, np.float32)})
            np.testing.assert_array_equal(out["y"], _expected(np.ones(16, np.float32)))


async def test_a_session_needs_an_open_runtime(anyio_backend: str) -> None:
    rt = Runtime(devices=["cpu:0"])
    with pytest.raises(RuntimeStateError, match="Runtime"):
        async with Session(neg_relu_chain(), runtime=rt):
            pass


def test_option_objects_validate_where_they_are_written() -> None:
    with pytest.raises(ValueError, match="aging_s"):
        Scheduling(aging_s=0)
    with pytest.raises(ValueError, match="priorities"):
        Scheduling(priorities=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Order"):
        Scheduling(order="edf")  # type: ignore[arg-type]
    assert Scheduling(order=hetsched.Order.EARLIEST_DEADLINE).order is hetsched.Order.EARLIEST_DEADLINE
    with pytest.raises(ValueError, match="chunk_bytes"):
        Memory(chunk_bytes=0)
    with pytest.raises(ValueError, match="pool_capacity_bytes"):
        Memory(pool_capacity_bytes=-1)
    with pytest.raises(TypeError, match="Replanning"):
        Adaptation(replanning=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power_budget_w"):
        Adaptation(power_budget_w=float("nan"))
    with pytest.raises(ValueError, match="max_in_flight"):
        Runtime(max_in_flight=0)
    with pytest.raises(ValueError, match="slo_s"):
        Session(neg_relu_chain(), slo_s=0)
    with pytest.raises(ValueError, match="weight"):
        Session(neg_relu_chain(), weight=-1)
    mem = Memory(pool_capacity_bytes={"host": 1 << 20})
    with pytest.raises(TypeError):
        mem.pool_capacity_bytes["host"] = 0  # type: ignore[index]  # frozen all the way down
    with pytest.raises(AttributeError):
        mem.chunk_bytes = 1  # type: ignore[misc]


async def test_run_takes_a_per_request_slo_and_counts_it(anyio_backend: str) -> None:
    x = np.ones(16, np.float32)
    async with Session(neg_relu_chain(), devices=["cpu:0"], slo_s=60.0) as s:
        for _ in range(3):
            await s.run({"x": x})  # the session's SLO: met
        await s.run({"x": x}, slo_s=None)  # no SLO for this one
        with pytest.raises(ValueError, match="slo_s"):
            await s.run({"x": x}, slo_s=-1.0)
        st = s.statistics()
    assert st.slo_s == 60.0
    assert st.slo_met == 3 and st.slo_missed == 0
    assert st.requests_completed == 4


async def test_a_replan_under_way_is_abandoned_when_the_session_closes(anyio_backend: str) -> None:
    """Issue 24: a re-plan that outlived serving kept a closing session alive while it compiled
    every stage; now no compile starts once the session closes (the ones under way finish)."""
    from hetsched.backends import BackendHooks
    from hetsched.policies import Pinned
    from hetsched.testing import FakeBackend, fake_device

    gate = threading.Event()
    held: list[str] = []

    class Slow(FakeBackend):
        def compile(self, model: onnx.ModelProto, device: hetsched.Device, *, name: str) -> Any:
            held.append(name)
            gate.wait(30)
            return super().compile(model, device, name=name)

    # units alternate between the two devices where the slow one is offered: many stages
    policy = Pinned(lambda u: "slowdev" if "slowdev" in u.candidates and u.id % 2 == 0 else "quickdev")
    with FakeBackend("fake-quickc"), Slow("fake-slowc") as slow:
        slow.hooks = BackendHooks(slow_compile=True)
        devices = [fake_device("quickdev", backend="fake-quickc"), fake_device("slowdev", backend="fake-slowc")]
        s = Session(neg_relu_chain(12), devices=devices, max_unit_nodes=1, policy=policy,
                    adaptation=Adaptation(background_compile=True, replanning=None))
        x = np.arange(16, dtype=np.float32) - 8
        async with s:
            # the opening plan serves at once without the slow device; its plan compiles in the background
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], _expected(x, 12))
            while not held:  # noqa: ASYNC110 (a compile thread appends: no event to wait on)
                await anyio.sleep(0.001)

            def release_once_closing() -> None:
                while s._core.is_open:
                    threading.Event().wait(0.001)
                gate.set()

            threading.Thread(target=release_once_closing, daemon=True).start()
        slow_stages = 6  # units 0, 2, ..., 10 of the 12
        # only the compiles already under way when the session closed ran (at most one per core)
        assert 0 < len(held) < slow_stages
        assert s.statistics().replanning.replans == 0


async def test_a_session_is_placed_knowing_the_load_the_others_put_on_the_board(anyio_backend: str) -> None:
    """Joint placement: the runtime hands a new session's policy the other sessions' busy shares
    (``PlacementProblem.reservations``): a device another session keeps busy costs more."""
    from hetsched._runtime._clock import VirtualClock
    from hetsched.backends import StageHooks
    from hetsched.testing import FakeBackend, FakeStage, fake_device

    @dataclasses.dataclass(frozen=True)
    class _Figures:
        modelled_time_s: float
        modelled_energy_j: float

    class _Timed(FakeStage):
        """A stage that models its own run time (as a twin stage does): 10 ms a run."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.hooks = StageHooks(modelled=self)
            self.runs = 0

        def run(self, feeds: Any, **kw: Any) -> Any:
            self.runs += 1
            return super().run(feeds, **kw)

        def last_run_seconds(self) -> float:
            return 0.01

        def last_run_energy_j(self) -> float:
            return 0.0

        def statistics(self) -> _Figures:
            return _Figures(0.01 * self.runs, 0.0)

    class _TimedBackend(FakeBackend):
        def compile(self, model: onnx.ModelProto, device: hetsched.Device, *, name: str) -> Any:
            super().compile(model, device, name=name)
            return _Timed(self, model, device, name)

    seen: list[tuple[Any, ...]] = []

    def spy(problem: hetsched.PlacementProblem) -> hetsched.Placement | Mapping[int, str]:
        seen.append(problem.reservations)
        return hetsched.policies.get_policy("heft").place(problem)

    clock = VirtualClock()
    with _TimedBackend("fake-timed"):
        fast = fake_device("fast", backend="fake-timed", peak_flops=4e10)
        slow = fake_device("slow", backend="fake-timed", peak_flops=1e10)
        async with Runtime(devices=[fast, slow], clock=clock) as rt:
            async with Session(neg_relu_chain(), runtime=rt, devices=["fast"], name="busy") as busy:
                for _ in range(20):
                    await busy.run({"x": np.ones(16, np.float32)})
                clock.advance(0.2)  # 20 runs x 10 ms of device time in 0.2 s: "fast" is taken
                (res,) = rt.reservations(except_session="other")
                assert res.session == "busy" and res.busy_share == {"fast": pytest.approx(1.0)}
                async with Session(neg_relu_chain(), runtime=rt, policy=spy, name="other") as other:
                    assert [r.session for r in seen[-1]] == ["busy"]
                    assert {st.device for st in other.plan.stages} == {"slow"}
            # alone on the board, the same model goes to the fast device
            async with Session(neg_relu_chain(), runtime=rt, policy="heft", name="alone") as alone:
                assert {st.device for st in alone.plan.stages} == {"fast"}


async def test_the_runtime_wide_admission_limit_spans_its_sessions(anyio_backend: str) -> None:
    class _Concurrency(hetsched.Hooks):
        def __init__(self) -> None:
            self.now = 0
            self.peak = 0

        def request_start(self, info: hetsched.EventInfo) -> None:
            self.now += 1
            self.peak = max(self.peak, self.now)

        def request_end(self, info: hetsched.EventInfo) -> None:
            self.now -= 1

    seen = _Concurrency()  # REQUEST_START/END run on the event loop, between taking and giving back a slot
    x = np.ones(16, np.float32)
    async with Runtime(devices=["cpu:0"], max_in_flight=2) as rt:
        async with Session(neg_relu_chain(), runtime=rt, hooks=[seen], max_in_flight=8) as a, \
                   Session(neg_relu_chain(), runtime=rt, hooks=[seen], max_in_flight=8) as b:
            async with anyio.create_task_group() as tg:
                for s in (a, b) * 10:
                    tg.start_soon(s.run, {"x": x})
            assert rt.statistics().max_in_flight == 2
        assert a.statistics().requests_completed == b.statistics().requests_completed == 10
    assert seen.peak == 2  # each session alone would have admitted 8
