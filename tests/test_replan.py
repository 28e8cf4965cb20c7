"""Re-placement while serving and failover (issue 12): no request lost or duplicated, old plans
closed once drained, a failing device quarantined and its requests retried on the new plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import (
    DeviceFailedError,
    Event,
    Hooks,
    ReplanInfo,
    Replanning,
    RuntimeStateError,
    Session,
    StageExecutionError,
)
from hetsched.backends import NO_BACKEND_HOOKS, NO_STAGE_HOOKS, BackendHooks
from hetsched.policies import Pinned
from hetsched.testing import FakeBackend, fake_device


def _chain(n: int = 3) -> onnx.ModelProto:
    """x -> Neg -> Abs -> Neg ... : n nodes, each its own unit with max_unit_nodes=1."""
    ops = ["Neg", "Abs"]
    nodes = []
    prev = "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node(ops[i % 2], [prev], [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


def _expected(x: np.ndarray, n: int = 3) -> np.ndarray:
    v = x
    for i in range(n):
        v = -v if i % 2 == 0 else np.abs(v)
    return v


class _Switch:
    """A pure policy whose mapping the test flips between re-plans (units by node name)."""

    def __init__(self, device: str):
        self.device = device

    def place(self, problem: Any) -> Any:
        return Pinned(lambda _unit: self.device).place(problem)


class _Recorder(Hooks):
    def __init__(self) -> None:
        self.replans: list[ReplanInfo] = []
        self.stage_energy: list[float | None] = []

    def replan(self, info: Any) -> None:
        self.replans.append(info.extra)


def _x(i: int) -> np.ndarray:
    return np.array([i, -i, 0.5 * i, -0.25 * i], np.float32)


@pytest.mark.anyio
async def test_replans_while_a_stream_runs_lose_nothing_keep_order_and_close_old_plans(anyio_backend: str) -> None:
    policy = _Switch("a")
    rec = _Recorder()
    n = 3000
    with FakeBackend("fake-rp") as fb:
        devices = [fake_device("a", backend="fake-rp"), fake_device("b", backend="fake-rp")]
        async with Session(_chain(), devices=devices, policy=policy, max_unit_nodes=1, hooks=[rec],
                           max_in_flight=256) as s:
            got: list[np.ndarray] = []

            async def replans() -> None:
                for k in range(6):
                    await anyio.sleep(0.005)
                    policy.device = "b" if k % 2 == 0 else "a"
                    plan = await s.replan(reason=f"test {k}")
                    assert set(plan.placement.assignment.values()) == {policy.device}

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(replans)
                    async with s.map({"x": _x(i)} for i in range(n)) as results:
                        async for out in results:
                            got.append(out["y"])
            stats = s.statistics()
            assert stats.replanning.replans == 6
            assert stats.replanning.last_reason == "test 5"
            assert stats.replanning.reasons == {"requested": 6}
            assert stats.requests_completed == n and stats.requests_failed == 0
            # both devices served requests: the switches happened mid-stream
            assert {c.device for c in fb.calls} == {"a", "b"}
            compiled_before_close = len(fb.compiled)
        # every plan's stages closed exactly once: the retired ones when drained, the last at exit
        assert sorted(fb.closed) == sorted(fb.compiled[:compiled_before_close])
    assert len(got) == n
    for i, y in enumerate(got):  # in source order, each exactly once
        np.testing.assert_array_equal(y, _expected(_x(i)))
    assert [r.number for r in rec.replans] == [1, 2, 3, 4, 5, 6]
    assert all(r.moved_units == 3 for r in rec.replans)


@pytest.mark.anyio
async def test_replans_with_thousands_of_run_calls_in_flight(anyio_backend: str) -> None:
    policy = _Switch("a")
    with FakeBackend("fake-rp2") as fb:
        devices = [fake_device("a", backend="fake-rp2"), fake_device("b", backend="fake-rp2")]
        async with Session(_chain(), devices=devices, policy=policy, max_unit_nodes=1,
                           max_in_flight=4096) as s:
            results: dict[int, np.ndarray] = {}

            async def one(i: int) -> None:
                out = await s.run({"x": _x(i)})
                assert i not in results
                results[i] = out["y"]

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for i in range(2000):
                        tg.start_soon(one, i)
                        if i in (500, 1200):
                            policy.device = "b" if policy.device == "a" else "a"
                            tg.start_soon(s.replan)
            assert s.statistics().replanning.replans == 2
            assert s.statistics().in_flight == 0
        assert len(fb.closed) == len(fb.compiled)
    assert sorted(results) == list(range(2000))
    for i, y in results.items():
        np.testing.assert_array_equal(y, _expected(_x(i)))


@pytest.mark.anyio
async def test_a_device_failing_for_good_is_quarantined_and_its_requests_retried(anyio_backend: str) -> None:
    rec = _Recorder()
    n = 1500
    with FakeBackend("fake-fo") as fb:
        # "a" is preferred (faster); "b" can run everything too
        devices = [fake_device("a", backend="fake-fo", peak_flops=1e13),
                   fake_device("b", backend="fake-fo", peak_flops=1e10)]
        async with Session(_chain(), devices=devices, hooks=[rec], max_in_flight=128,
                           adaptation=hetsched.Adaptation(replanning=Replanning(quarantine_after=3))) as s:
            assert set(s.plan.placement.assignment.values()) == {"a"}
            got: list[np.ndarray] = []

            def source() -> Any:
                for i in range(n):
                    if i == 300:
                        fb.fail_device("a")  # from now on every run on "a" raises DeviceFailedError
                    yield {"x": _x(i)}

            with anyio.fail_after(120):
                async with s.map(source()) as results:
                    async for out in results:
                        got.append(out["y"])
            stats = s.statistics()
            assert stats.requests_completed == n and stats.requests_failed == 0
            assert stats.failover is not None
            assert stats.failover.quarantined == ("a",)
            assert stats.failover.resubmitted >= 1
            assert stats.failover.failures["a"] >= 3
            assert set(s.plan.placement.assignment.values()) == {"b"}
            assert stats.replanning.reasons.get("failure") == 1
    assert len(got) == n
    for i, y in enumerate(got):
        np.testing.assert_array_equal(y, _expected(_x(i)))
    assert rec.replans[-1].quarantined == ("a",)
    assert "failed 3 stage runs in a row" in rec.replans[-1].reason


@pytest.mark.anyio
async def test_a_failing_device_nothing_can_replace_fails_its_requests_without_hanging(anyio_backend: str) -> None:
    with FakeBackend("fake-fo1") as fb:
        async with Session(_chain(), devices=[fake_device("a", backend="fake-fo1")],
                           adaptation=hetsched.Adaptation(replanning=Replanning(quarantine_after=2))) as s:
            fb.fail_device("a")
            with anyio.fail_after(30):
                for _ in range(3):
                    with pytest.raises(DeviceFailedError, match="made to fail"):
                        await s.run({"x": _x(1)})
            stats = s.statistics()
            assert stats.failover is not None
            assert stats.failover.unreplaceable == ("a",)
            assert stats.failover.quarantined == ()
            assert stats.replanning.failed == 1
            assert stats.requests_failed == 3


@pytest.mark.anyio
async def test_without_replanning_a_device_failure_fails_the_request_once(anyio_backend: str) -> None:
    with FakeBackend("fake-fo2") as fb:
        async with Session(_chain(), devices=[fake_device("a", backend="fake-fo2")], adaptation=hetsched.Adaptation(replanning=None)) as s:
            fb.fail_device("a")
            with pytest.raises(DeviceFailedError):
                await s.run({"x": _x(1)})
            assert len(fb.calls) == 1  # not retried
            assert s.statistics().failover is None


class _Breaking:
    """A backend whose stage breaks its contract in the way the feed asks."""

    name = "breaking"
    hooks = NO_BACKEND_HOOKS

    def capabilities(self, device: Any) -> Any:
        from hetsched.backends import Capabilities

        return Capabilities.everything()

    def compile(self, model: onnx.ModelProto, device: Any, *, name: str) -> Any:
        outer = self

        class Stage:
            input_names = ("x",)
            output_names = ("y",)
            hooks = NO_STAGE_HOOKS

            def run(self, feeds: Mapping[str, np.ndarray]) -> Any:
                outer.runs += 1
                how = int(feeds["x"][0])
                if how == 1:
                    return [feeds["x"], feeds["x"]]  # too many outputs
                if how == 2:
                    return None
                if how == 3:
                    raise KeyboardInterrupt
                if how == 4:
                    raise SystemExit(3)
                if how == 5:
                    return []
                return [-feeds["x"]]

            def close(self) -> None:
                pass

        return Stage()

    runs = 0


@pytest.mark.anyio
@pytest.mark.parametrize(("how", "match"), [(1, "returned 2 values"), (2, "returned None"),
                                            (3, "KeyboardInterrupt"), (4, "SystemExit"), (5, "returned 0 values")])
async def test_a_backend_breaking_its_contract_fails_that_request_and_its_worker_survives(
        anyio_backend: str, how: int, match: str) -> None:
    from hetsched.backends import register_backend, unregister_backend

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"], name="neg")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]), opset_imports=[helper.make_operatorsetid("", 17)])
    register_backend("breaking", _Breaking())
    try:
        async with Session(model, devices=[fake_device("brk", backend="breaking")]) as s:
            with anyio.fail_after(30):
                with pytest.raises(StageExecutionError, match=match) as info:
                    await s.run({"x": np.full(4, how, np.float32)})
                assert info.value.stage is not None and info.value.device == "brk"
                # the same worker goes on serving
                for _ in range(3):
                    out = await s.run({"x": np.full(4, 7, np.float32)})
                    np.testing.assert_array_equal(out["y"], np.full(4, -7, np.float32))
    finally:
        unregister_backend("breaking")


@pytest.mark.anyio
async def test_two_tasks_entering_one_session_at_once_one_is_refused(anyio_backend: str) -> None:
    with FakeBackend("fake-enter"):
        s = Session(_chain(), devices=[fake_device("a", backend="fake-enter")])
        errors: list[BaseException] = []

        async def enter() -> None:
            try:
                async with s:
                    await s.run({"x": _x(1)})
                    await anyio.sleep(0.05)
            except RuntimeStateError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(enter)
            tg.start_soon(enter)
        assert len(errors) == 1
        assert "already open" in str(errors[0])
        # and the session opens again afterwards, nothing left over from the refused entry
        async with s:
            await s.run({"x": _x(2)})


def test_a_session_used_from_another_threads_loop_says_so() -> None:
    import threading

    with FakeBackend("fake-loop"):
        s = Session(_chain(), devices=[fake_device("a", backend="fake-loop")])
        seen: list[BaseException] = []

        async def other() -> None:
            try:
                await s.run({"x": _x(1)})
            except BaseException as exc:
                seen.append(exc)

        async def main() -> None:
            async with s:
                t = threading.Thread(target=lambda: anyio.run(other))
                t.start()
                await anyio.to_thread.run_sync(t.join)

        anyio.run(main)
    assert len(seen) == 1 and isinstance(seen[0], RuntimeStateError)
    assert "another thread" in str(seen[0])


@pytest.mark.anyio
async def test_a_replan_event_and_replan_outside_the_session(anyio_backend: str) -> None:
    rec = _Recorder()
    with FakeBackend("fake-ev"):
        s = Session(_chain(), devices=[fake_device("a", backend="fake-ev")], hooks=[rec])
        with pytest.raises(RuntimeStateError):
            await s.replan()
        async with s:
            await s.replan(reason="because")
        assert [r.reason for r in rec.replans] == ["because"]
        assert rec.replans[0].moved_units == 0
        assert Event.REPLAN.value == "replan"


def test_replanning_rejects_bad_thresholds() -> None:
    with pytest.raises(ValueError, match="temp_low"):
        Replanning(temp_low=0.5, temp_high=0.2)
    with pytest.raises(ValueError, match="drift_factor"):
        Replanning(drift_factor=1.0)
    with pytest.raises(ValueError, match="quarantine_after"):
        Replanning(quarantine_after=0)
    with pytest.raises(TypeError, match="Replanning"):
        Session(_chain(), adaptation=hetsched.Adaptation(replanning=0.5))  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_an_allocation_failure_runs_unbound_once_leaks_nothing_and_keeps_the_stage_bound(
        anyio_backend: str) -> None:
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t"], name="neg"), helper.make_node("Abs", ["t"], ["y"], name="abs")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]), opset_imports=[helper.make_operatorsetid("", 17)])
    async with Session(model, devices=["cpu:0", "cpu:0-1"], max_unit_nodes=1,
                       policy=Pinned({"neg": "cpu:0", "abs": "cpu:0-1"})) as s:
        pool = s.pools["host"]
        real = pool.acquire_nowait
        calls = {"n": 0}

        def flaky(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise MemoryError("mmap failed (made to fail by the test)")
            return real(*args, **kwargs)

        pool.acquire_nowait = flaky  # type: ignore[method-assign]
        for i in range(4):
            out = await s.run({"x": _x(i)}, zero_copy=True)
            with out:
                np.testing.assert_array_equal(out["y"], np.abs(_x(i)))
        stats = s.statistics()
        assert stats.allocation_failures == 1
        assert dict(stats.unbound_stages) == {}  # a transient failure demotes nothing
        assert stats.stage_runs_bound >= 6
        assert stats.stage_runs_unbound == 1
    # and every buffer came back: closing raised no BufferLeakError


@pytest.mark.anyio
async def test_background_compile_serves_at_once_then_switches_to_the_slow_devices_plan(anyio_backend: str) -> None:
    rec = _Recorder()
    with FakeBackend("fake-quick") as quick, FakeBackend("fake-slow") as slow:
        slow.hooks = BackendHooks(slow_compile=True)  # as the RKNN backend declares
        devices = [fake_device("cpuish", backend="fake-quick", peak_flops=1e9),
                   fake_device("npuish", backend="fake-slow", peak_flops=1e13)]
        async with Session(_chain(), devices=devices, hooks=[rec], adaptation=hetsched.Adaptation(background_compile=True)) as s:
            # the opening plan leaves the slow backend's device out, and serves at once
            out = await s.run({"x": _x(3)})
            np.testing.assert_array_equal(out["y"], _expected(_x(3)))
            with anyio.fail_after(30):
                plan = await s.wait_planned()
            assert {st.device for st in plan.stages} == {"npuish"}
            out = await s.run({"x": _x(4)})
            np.testing.assert_array_equal(out["y"], _expected(_x(4)))
        assert {c.device for c in quick.calls} == {"cpuish"} and {c.device for c in slow.calls} == {"npuish"}
        assert [r.reason for r in rec.replans] == ["background compile: npuish ready"]
        # with only slow devices there is nothing to open on first: the plan is made at once
        async with Session(_chain(), devices=[devices[1]], adaptation=hetsched.Adaptation(background_compile=True)) as s:
            assert {st.device for st in s.plan.stages} == {"npuish"}
            assert (await s.wait_planned()) is s.plan


@pytest.mark.anyio
async def test_statistics_name_every_replan_and_count_kinds_not_prose(anyio_backend: str) -> None:
    """Issue 24: the statistics name each re-plan (a run's summary can list them); the kind a
    re-plan is counted under is what triggered it, never parsed out of its reason's text."""
    with FakeBackend("fake-hist"):
        devices = [fake_device("a", backend="fake-hist"), fake_device("b", backend="fake-hist")]
        async with Session(_chain(), devices=devices) as s:
            for reason in ("first", "thermal: not really", "third"):
                await s.replan(reason=reason)
            await s.profile({"x": _x(1)}, repeats=1)
            stats = s.statistics().replanning
    assert [r.reason for r in stats.history] == ["first", "thermal: not really", "third",
                                                 "profile: measured every unit"]
    assert [r.number for r in stats.history] == [1, 2, 3, 4]
    assert all(r.seconds is not None and r.seconds >= 0 for r in stats.history)
    assert stats.reasons == {"requested": 3, "profile": 1}  # "thermal: ..." was asked for, not measured
    assert stats.replans == 4 and stats.errors == ()
