"""The runtime re-places its sessions on its own (issue 26): once a new session has measured
load, when one detaches, and when the loads drift (``hetsched.Replacement``). The decision is a
pure function of a snapshot and the config (``hetsched/_session/_replace.py``); the runtime
applies it on its clock (a ``VirtualClock`` here)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import Replacement, Runtime, Session
from hetsched._session._replace import (
    PlacementSnapshot,
    PlacementState,
    SessionLoad,
    decide_replacement,
)
from hetsched._session._replan import ReplanKind

from _models import neg_relu_chain


def _load(name: str, at: float, done: int, **share: float) -> SessionLoad:
    return SessionLoad(name, at, done, MappingProxyType(share))


def _snap(now: float, *loads: SessionLoad) -> PlacementSnapshot:
    return PlacementSnapshot(now, loads)


# -- the pure decision -------------------------------------------------------------------------

def test_a_newcomer_re_places_the_others_once_its_load_is_measured() -> None:
    cfg = Replacement(settle_requests=4, settle_s=10.0, min_interval_s=0.0)
    st = PlacementState().with_attach("a")
    st, d = decide_replacement(cfg, st, _snap(1.0, _load("a", 0.0, 9, npu=0.5)))
    assert d is None and st.attached == frozenset()  # alone: nothing to re-place; its load is the baseline
    st = st.with_attach("b")
    st, d = decide_replacement(cfg, st, _snap(2.0, _load("a", 0.0, 20, npu=0.5), _load("b", 1.5, 3, npu=0.9)))
    assert d is None and st.attached == {"b"}  # 3 < 4 requests, 0.5 s < settle_s: not measured yet
    st, d = decide_replacement(cfg, st, _snap(2.5, _load("a", 0.0, 25, npu=0.5), _load("b", 1.5, 4, npu=0.9)))
    assert d is not None and d.trigger.kind is ReplanKind.PLACEMENT
    assert d.skip == {"b"} and "b (4 requests measured) attached" in d.trigger.reason
    assert st.attached == frozenset() and st.last_at == 2.5 and st.baseline["b"] == {"npu": 0.9}


def test_of_newcomers_measured_at_once_only_the_newest_stays_as_placed() -> None:
    cfg = Replacement(settle_requests=1, min_interval_s=0.0)
    st = PlacementState().with_attach("a").with_attach("b")
    st, d = decide_replacement(cfg, st, _snap(1.0, _load("a", 0.0, 1, npu=0.5), _load("b", 0.5, 1, npu=0.5)))
    assert d is not None and d.skip == {"b"}  # a was placed before b existed: it is re-placed
    assert d.trigger.reason == "session(s) a (1 requests measured), b (1 requests measured) attached"


def test_the_settle_time_counts_on_the_runtimes_clock_with_one_request_done() -> None:
    cfg = Replacement(settle_requests=100, settle_s=2.0, min_interval_s=0.0)
    st = PlacementState(baseline=MappingProxyType({"a": {"npu": 0.5}})).with_attach("b")
    _, d = decide_replacement(cfg, st, _snap(3.0, _load("a", 0.0, 5, npu=0.5), _load("b", 0.5, 0)))
    assert d is None  # 2.5 s but nothing measured
    _, d = decide_replacement(cfg, st, _snap(2.0, _load("a", 0.0, 5, npu=0.5), _load("b", 0.5, 1, npu=0.1)))
    assert d is None  # one request, 1.5 s < 2 s
    _, d = decide_replacement(cfg, st, _snap(2.5, _load("a", 0.0, 5, npu=0.5), _load("b", 0.5, 1, npu=0.1)))
    assert d is not None and d.skip == {"b"}


def test_a_detach_re_places_the_rest_and_a_session_gone_before_settling_is_forgotten() -> None:
    cfg = Replacement(min_interval_s=1.0)
    st = PlacementState(baseline=MappingProxyType({"a": {"gpu": 0.3}, "b": {"gpu": 0.6}}), last_at=0.0)
    st = st.with_attach("c").with_detach("c").with_detach("b")
    assert st.attached == frozenset() and st.detached == ("c", "b")
    st2, d = decide_replacement(cfg, st, _snap(0.5, _load("a", 0.0, 9, gpu=0.3)))
    assert d is None and st2.detached == ("c", "b")  # within min_interval_s of the last placement: later
    st3, d = decide_replacement(cfg, st2, _snap(1.0, _load("a", 0.0, 9, gpu=0.3)))
    assert d is not None and d.skip == frozenset() and "c, b detached" in d.trigger.reason
    assert st3.detached == () and st3.last_at == 1.0 and set(st3.baseline) == {"a"}
    # the last session leaving: nothing to re-place
    _, d = decide_replacement(cfg, PlacementState().with_detach("a"), _snap(5.0))
    assert d is None


def test_drift_is_measured_against_the_last_placement_with_hysteresis() -> None:
    cfg = Replacement(drift=0.25, min_interval_s=1.0)
    st = PlacementState(baseline=MappingProxyType({"a": {"npu": 0.4}, "b": {"gpu": 0.2}}), last_at=0.0)
    # small moves sample after sample never add up against the last sample, but do against the baseline
    for now, share in ((1.0, 0.5), (2.0, 0.6)):
        st, d = decide_replacement(cfg, st, _snap(now, _load("a", 0, 1, npu=share), _load("b", 0, 1, gpu=0.2)))
        assert d is None
    st, d = decide_replacement(cfg, st, _snap(3.0, _load("a", 0, 1, npu=0.7), _load("b", 0, 1, gpu=0.2)))
    assert d is not None and "session 'a' busy share on npu 0.40 -> 0.70" in d.trigger.reason
    # a load hovering around the new baseline does not re-place again
    for now, share in ((5.0, 0.6), (6.0, 0.8), (7.0, 0.7)):
        st, d = decide_replacement(cfg, st, _snap(now, _load("a", 0, 1, npu=share), _load("b", 0, 1, gpu=0.2)))
        assert d is None
    # a device a session stopped using counts too; drift=None turns the trigger off
    _, d = decide_replacement(cfg, st, _snap(9.0, _load("a", 0, 1), _load("b", 0, 1, gpu=0.2)))
    assert d is not None and "npu 0.70 -> 0.00" in d.trigger.reason
    _, d = decide_replacement(Replacement(drift=None), st, _snap(9.0, _load("a", 0, 1), _load("b", 0, 1, gpu=0.2)))
    assert d is None


def test_replacement_validates_where_it_is_written() -> None:
    for bad in ({"settle_requests": 0}, {"settle_s": -1.0}, {"drift": 0.0}, {"drift": 1.5},
                {"period_s": 0.0}, {"min_interval_s": float("nan")}, {"settle_requests": True}):
        with pytest.raises(ValueError, match="Replacement"):
            Replacement(**bad)
    with pytest.raises(TypeError, match="replacement"):
        Runtime(replacement="yes")  # type: ignore[arg-type]


# -- the runtime applying it -------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_runtime_re_places_a_session_when_another_attaches_and_when_it_detaches(
        anyio_backend: str) -> None:
    from hetsched._runtime._clock import VirtualClock
    from hetsched.backends import StageHooks
    from hetsched.testing import FakeBackend, FakeStage, fake_device

    @dataclasses.dataclass(frozen=True)
    class _Figures:
        modelled_time_s: float
        modelled_energy_j: float

    class _Timed(FakeStage):
        """A stage that models its own run time (as a twin stage does): 2.5 ms a run on "fast",
        10 ms on "slow" (what the measured costs of a re-plan learn)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.hooks = StageHooks(modelled=self)
            self.runs = 0
            self.seconds = 0.0025 if self.device.name == "fast" else 0.01

        def run(self, feeds: Any, **kw: Any) -> Any:
            self.runs += 1
            return super().run(feeds, **kw)

        def last_run_seconds(self) -> float:
            return self.seconds

        def last_run_energy_j(self) -> float:
            return 0.0

        def statistics(self) -> _Figures:
            return _Figures(self.seconds * self.runs, 0.0)

    class _TimedBackend(FakeBackend):
        def compile(self, model: onnx.ModelProto, device: hetsched.Device, *, name: str) -> Any:
            super().compile(model, device, name=name)
            return _Timed(self, model, device, name)

    clock = VirtualClock()
    x = {"x": np.ones(16, np.float32)}
    # period_s: the monitor never samples on its own here; the test asks at chosen clock times
    cfg = Replacement(settle_requests=10, settle_s=100.0, min_interval_s=1.0, drift=None, period_s=3600.0)
    with _TimedBackend("fake-timed"):
        fast = fake_device("fast", backend="fake-timed", peak_flops=4e10)
        slow = fake_device("slow", backend="fake-timed", peak_flops=1e10)
        # learn_costs=False: its plans price the devices by their peak FLOPs alone (a fake stage's
        # host-measured times would be noise), so only the reservations move it
        async with Runtime(devices=[fast, slow], clock=clock, replacement=cfg) as rt, \
                Session(neg_relu_chain(), runtime=rt, policy="heft", name="app",
                        adaptation=hetsched.Adaptation(learn_costs=False)) as app:
                assert {st.device for st in app.plan.stages} == {"fast"}  # alone: the fast device
                await app.run(x)
                assert await rt.review_placement() is None
                async with Session(neg_relu_chain(), runtime=rt, devices=["fast"], name="pinned") as pinned:
                    for _ in range(9):
                        await pinned.run(x)
                    clock.advance(0.0225)
                    assert await rt.review_placement() is None  # 9 requests: its load is not measured yet
                    await pinned.run(x)
                    clock.advance(0.0025)  # 10 runs x 2.5 ms in 25 ms: "fast" is taken
                    decision = await rt.review_placement()
                    assert decision is not None and decision.skip == {"pinned"}
                    assert {st.device for st in app.plan.stages} == {"slow"}  # re-placed beside it
                    last = app.statistics().replanning.history[-1]
                    assert last.reason.startswith("placement: session(s) pinned (10 requests measured) attached")
                    assert app.statistics().replanning.reasons.get(ReplanKind.PLACEMENT) == 1
                    assert pinned.statistics().replanning.replans == 0  # the newcomer stays as placed
                    np.testing.assert_array_equal((await app.run(x))["y"], np.zeros(16, np.float32))  # -relu(-1)
                clock.advance(0.5)
                assert await rt.review_placement() is None  # within min_interval_s of the last one
                clock.advance(0.6)
                decision = await rt.review_placement()
                assert decision is not None and "pinned detached" in decision.trigger.reason
                assert {st.device for st in app.plan.stages} == {"fast"}  # the fast device is free again
        st = rt.statistics()
    assert len(st.replacements) == 2 and "attached" in st.replacements[0] and "detached" in st.replacements[1]


@pytest.mark.anyio
async def test_a_runtime_without_a_replacement_policy_never_re_places(anyio_backend: str) -> None:
    async with Runtime(devices=["cpu:0"], replacement=None) as rt:
        async with Session(neg_relu_chain(), runtime=rt, name="a") as a, Session(neg_relu_chain(), runtime=rt, name="b"):
            await a.run({"x": np.ones(16, np.float32)})
            assert await rt.review_placement() is None
        assert rt.statistics().replacements == ()


@pytest.mark.anyio
async def test_the_runtimes_placement_monitor_re_places_on_its_own(anyio_backend: str) -> None:
    import anyio

    cfg = Replacement(settle_requests=1, min_interval_s=0.0, drift=None, period_s=0.01)
    x = {"x": np.ones(16, np.float32)}

    def for_b() -> list[str]:
        return [r for r in rt.statistics().replacements if "b (1 requests measured) attached" in r]

    async with Runtime(devices=["cpu:0"], replacement=cfg) as rt, Session(neg_relu_chain(), runtime=rt, name="a") as a:
        await a.run(x)
        async with Session(neg_relu_chain(), runtime=rt, name="b") as b:
            await b.run(x)
            with anyio.fail_after(10):
                while not for_b():  # noqa: ASYNC110 (the monitor's own period decides)
                    await anyio.sleep(0.01)
            assert len(for_b()) == 1  # a's load may have been measured at the same sample: named too
            assert a.statistics().replanning.history[-1].reason == "placement: " + for_b()[0]
            assert all("b (" not in r.reason for r in b.statistics().replanning.history)  # the newcomer stays
            await a.run(x)
    # closed: the monitor stopped with the runtime (its task group joined)
    assert rt.sessions == ()


@pytest.mark.anyio
async def test_a_session_opened_after_another_sees_its_plan_before_either_has_run(anyio_backend: str) -> None:
    # Runtime.reservations: the installed plan's expected load, before any request is measured: a
    # closed loop (no rate_hz) is elastic on the devices its plan uses; a declared rate reserves
    # rate x the plan's seconds there. Two closed loops of one class opened one after the other
    # spread over the board's two devices; a light open-loop session does not push anyone away.
    from hetsched._runtime._clock import VirtualClock
    from hetsched.testing import FakeBackend, fake_device

    def _matmul() -> onnx.ModelProto:  # 2 x 256^3 FLOPs: 0.84 ms on "fast", 3.4 ms on "slow"
        w = helper.make_tensor("w", TensorProto.FLOAT, [256, 256], np.ones(256 * 256, np.float32))
        m = helper.make_model(helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])], initializer=[w]),
            opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    learn = hetsched.Adaptation(learn_costs=False)
    with FakeBackend("fake-plan"):
        fast = fake_device("fast", backend="fake-plan", peak_flops=4e10)
        slow = fake_device("slow", backend="fake-plan", peak_flops=1e10)
        async with Runtime(devices=[fast, slow], clock=VirtualClock(), replacement=None) as rt, \
                Session(_matmul(), runtime=rt, policy="heft", name="light", rate_hz=10.0, adaptation=learn) as light:
            assert {st.device for st in light.plan.stages} == {"fast"}
            (res,) = rt.reservations()
            per_request = sum(light.plan.stage_costs().values())
            assert not res.elastic and res.busy_share["fast"] == pytest.approx(10.0 * per_request)
            async with Session(_matmul(), runtime=rt, policy="heft", name="a", adaptation=learn) as a, \
                    Session(_matmul(), runtime=rt, policy="heft", name="b", adaptation=learn) as b:
                assert {st.device for st in a.plan.stages} == {"fast"}  # 10 req/s leave it room
                assert {st.device for st in b.plan.stages} == {"slow"}  # a keeps "fast" busy
                by_name = {r.session: r for r in rt.reservations()}
                assert by_name["a"].elastic and dict(by_name["a"].busy_share) == {"fast": 1.0}
                assert by_name["b"].elastic and dict(by_name["b"].busy_share) == {"slow": 1.0}
                assert a.statistics().requests_completed == b.statistics().requests_completed == 0
