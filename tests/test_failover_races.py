"""Failover races (issue 23, items 1 and 3): a re-plan that began before a device failed never
brings the dead device back, and a device worker whose per-worker context died builds a new one
instead of failing every later run. Both event loops; fake backends only (the real toolkit's
process kill is in test_rknn_session.py)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import DeviceFailedError, Replanning, Session
from hetsched._runtime._failover import Failover
from hetsched.backends import (
    BackendHooks,
    Capabilities,
    Device,
    StageHooks,
    WorkerInfo,
    register_backend,
    unregister_backend,
)
from hetsched.policies import Placement
from hetsched.testing import FakeBackend, fake_device


def _chain(n: int = 3) -> onnx.ModelProto:
    """x -> Neg -> Abs -> Neg ... (n nodes)."""
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


def _x(i: int) -> np.ndarray:
    return np.array([i, -i, 0.5 * i, -0.25 * i], np.float32)


# -- item 1: a re-plan begun before a quarantine ------------------------------------------------


class _SlowWhenArmed:
    """Prefers device "a" whenever it may use it; while armed, its next plan waits in the
    planning thread until the test releases it (a slow policy: the race window held open)."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def place(self, problem: Any) -> Placement:
        self.calls += 1
        if self.armed:
            self.armed = False
            self.entered.set()
            self.release.wait(30)
        return Placement({u.id: "a" if "a" in u.candidates else "b" for u in problem.units}, "slow")


@pytest.mark.anyio
async def test_a_replan_begun_before_a_device_failed_never_brings_it_back(anyio_backend: str) -> None:
    """An explicit replan() whose policy is still working when device "a" fails: its plan
    (computed with "a") must not be installed as it is, nor release the parked requests onto
    "a"; they all finish on "b"."""
    policy = _SlowWhenArmed()
    n = 24
    with FakeBackend("fake-race") as fb:
        devices = [fake_device("a", backend="fake-race", peak_flops=1e13),
                   fake_device("b", backend="fake-race", peak_flops=1e10)]
        async with Session(_chain(), devices=devices, policy=policy, max_in_flight=64,
                           adaptation=hetsched.Adaptation(replanning=Replanning(quarantine_after=2))) as s:
            assert {st.device for st in s.plan.stages} == {"a"}
            results: dict[int, np.ndarray] = {}
            errors: list[BaseException] = []
            replanned: list[Any] = []

            async def one(i: int) -> None:
                try:
                    results[i] = (await s.run({"x": _x(i)}))["y"]
                except DeviceFailedError as exc:
                    errors.append(exc)

            async def explicit_replan() -> None:
                replanned.append(await s.replan(reason="explicit, begun before the failure"))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    policy.armed = True
                    tg.start_soon(explicit_replan)
                    await anyio.to_thread.run_sync(policy.entered.wait, 30)
                    fb.fail_device("a")  # "a" dies while the plan that still uses it is being made
                    for i in range(n):
                        tg.start_soon(one, i)
                    # every request failed on "a" and waits, parked, for a plan without it
                    while True:
                        fo = s.statistics().failover
                        assert fo is not None
                        if fo.quarantined == ("a",) and fo.parked + len(results) + len(errors) == n:
                            break
                        await anyio.sleep(0.01)
                    assert fo.parked > 0
                    policy.release.set()
            stats = s.statistics()
            assert not errors, errors[:3]
            assert sorted(results) == list(range(n))
            for i, y in results.items():
                np.testing.assert_array_equal(y, _expected(_x(i)))
            assert stats.requests_failed == 0 and stats.requests_completed == n
            assert stats.failover is not None and stats.failover.quarantined == ("a",)
            assert {st.device for st in s.plan.stages} == {"b"}
            # the explicit re-plan returns the plan it installed: one without the dead device
            (plan,) = replanned
            assert set(plan.placement.assignment.values()) == {"b"}
            # a plan using "a" was never current after "a" was quarantined: no run on "a"
            # restarted on it (each request failed there at most once)
            runs_on_a = sum(1 for c in fb.calls if c.device == "a")
            assert stats.failover.failures["a"] == runs_on_a <= 2 * n


def test_a_plan_still_using_a_quarantined_device_releases_no_parked_request() -> None:
    asked: list[str] = []
    fo = Failover(1, lambda device, reason: asked.append(device))

    class _Req:
        retries = 0

    req = _Req()
    assert fo.on_failure(req, "a", DeviceFailedError("boom", stage="s", device="a"))
    assert asked == ["a"]
    assert not fo.take(req)  # parked: the plan without "a" is coming
    assert fo.installed(frozenset({"a", "b"})) == []  # a plan made before the quarantine
    assert fo.statistics().parked == 1
    assert not fo.settled("a")
    assert fo.installed(frozenset({"b"})) == [req]
    assert fo.settled("a") and fo.statistics().parked == 0


# -- item 3: a per-worker context that dies ----------------------------------------------------


class _Context:
    """A per-worker device context, like one RKNN toolkit process: once dead, it stays dead."""

    def __init__(self, number: int, worker: int):
        self.number = number
        self.worker = worker
        self.dead = False
        self.closed = False


class _ContextStage:
    """Runs ``-x`` with a per-worker context; a run on a dead context raises DeviceFailedError
    (as a call to a killed toolkit process does)."""

    def __init__(self, backend: _ContextBackend, name: str, device: Device):
        self._backend = backend
        self.name = name
        self.device = device
        self.input_names: tuple[str, ...] = ("x",)
        self.output_names: tuple[str, ...] = ("y",)
        self.hooks = StageHooks(worker_state=self)

    def worker_state(self, worker: WorkerInfo) -> _Context:
        return self._backend.new_context(worker.index)

    def close_worker_state(self, state: object) -> None:
        assert isinstance(state, _Context)
        state.closed = True

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        assert isinstance(state, _Context)
        b = self._backend
        with b.lock:
            b.runs += 1
            crash = b.runs in b.crash_at
        if crash:
            state.dead = True  # the context dies under this very run
        if state.dead:
            raise DeviceFailedError(f"context {state.number} of {self.device.name!r} died",
                                    stage=self.name, device=self.device.name)
        return [-np.asarray(feeds["x"])]

    def close(self) -> None:
        pass


class _CheckedContextStage(_ContextStage):
    """One that can tell a dead context (as the RKNN stage asks whether its process lives)."""

    def __init__(self, backend: _ContextBackend, name: str, device: Device):
        super().__init__(backend, name, device)
        self.hooks = StageHooks(worker_state=self, state_probe=self)

    def worker_state_alive(self, state: object) -> bool:
        return not (isinstance(state, _Context) and state.dead)


class _ContextBackend:
    def __init__(self, name: str, workers: int, *, liveness_hook: bool = True):
        self.name = name
        self.workers = workers
        self.liveness_hook = liveness_hook
        self.lock = threading.Lock()
        self.contexts: list[_Context] = []
        self.runs = 0
        self.crash_at: set[int] = set()
        self.hooks = BackendHooks(workers=self)

    def new_context(self, worker: int) -> _Context:
        with self.lock:
            ctx = _Context(len(self.contexts), worker)
            self.contexts.append(ctx)
        return ctx

    def capabilities(self, device: Device) -> Capabilities:
        return Capabilities.everything()

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> _ContextStage:
        return (_CheckedContextStage if self.liveness_hook else _ContextStage)(self, name, device)

    def worker_cpus(self, device: Device) -> list[tuple[int, ...]]:
        return [() for _ in range(self.workers)]


def _neg() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"], name="neg")], "neg",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


@pytest.mark.anyio
@pytest.mark.parametrize("hook", [True, False], ids=["liveness-hook", "no-hook"])
async def test_a_worker_whose_context_died_builds_a_new_one(anyio_backend: str, hook: bool) -> None:
    """No fallback device, one worker: its context dies under a run. That run (in flight) costs
    one failure and starts over; every later request succeeds on a new context, and the dead
    one is closed. Today's code failed every later run on the dead context."""
    be = _ContextBackend("ctx-fake", 1, liveness_hook=hook)
    register_backend(be.name, be)
    try:
        async with Session(_neg(), devices=[fake_device("npu", backend=be.name, kind="npu")]) as s:
            with anyio.fail_after(30):
                for i in range(5):
                    np.testing.assert_array_equal((await s.run({"x": _x(i)}))["y"], -_x(i))
                be.crash_at = {be.runs + 1}
                for i in range(20):
                    np.testing.assert_array_equal((await s.run({"x": _x(i)}))["y"], -_x(i))
            stats = s.statistics()
            assert stats.requests_failed == 0 and stats.requests_completed == 25
            assert stats.failover is not None
            assert stats.failover.failures == {"npu": 1}  # the run in flight, nothing more
            assert stats.failover.quarantined == () and stats.failover.unreplaceable == ()
            assert len(be.contexts) == 2 and stats.worker_states_renewed == 1
            first, second = be.contexts
            assert first.dead and first.closed and not second.dead
    finally:
        unregister_backend(be.name)
    assert be.contexts[1].closed  # closed with the session


@pytest.mark.anyio
async def test_a_context_found_dead_between_runs_is_replaced_before_the_next_run(anyio_backend: str) -> None:
    """A context that died while idle (its process killed between runs) costs no run at all when
    the stage can tell (``worker_state_alive``): the worker replaces it before running."""
    be = _ContextBackend("ctx-fake-idle", 1)
    register_backend(be.name, be)
    try:
        async with Session(_neg(), devices=[fake_device("npu", backend=be.name, kind="npu")]) as s:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for i in range(40):
                        tg.start_soon(s.run, {"x": _x(i)})
                (first,) = be.contexts
                first.dead = True  # the worker's process killed while idle
                async with anyio.create_task_group() as tg:
                    for i in range(40):
                        tg.start_soon(s.run, {"x": _x(i)})
            stats = s.statistics()
            assert stats.requests_failed == 0 and stats.requests_completed == 80
            assert stats.failover is not None and stats.failover.failures == {}  # no run met the dead one
            assert len(be.contexts) == 2 and first.closed and stats.worker_states_renewed == 1
    finally:
        unregister_backend(be.name)
    assert all(c.closed for c in be.contexts)


@pytest.mark.anyio
async def test_two_workers_one_context_dead_the_device_keeps_serving(anyio_backend: str) -> None:
    """Two workers of one device, no fallback: worker 1's context dies in flight under load
    while worker 0 keeps succeeding (which resets the failure streak, so the device is never
    quarantined). Worker 1 must recover: no request fails, and runs after the crash land on
    both workers."""
    be = _ContextBackend("ctx-fake-2", 2, liveness_hook=False)
    register_backend(be.name, be)
    try:
        async with Session(_neg(), devices=[fake_device("npu", backend=be.name, kind="npu")],
                           max_in_flight=64) as s:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for i in range(64):
                        tg.start_soon(s.run, {"x": _x(i)})
                be.crash_at = {be.runs + k for k in (1, 90, 180)}  # 3 crashes, far apart
                for _ in range(5):
                    async with anyio.create_task_group() as tg:
                        for i in range(200):
                            tg.start_soon(s.run, {"x": _x(i)})
            stats = s.statistics()
            assert stats.requests_failed == 0 and stats.requests_completed == 64 + 1000
            assert stats.failover is not None and stats.failover.quarantined == ()
            dead = [c for c in be.contexts if c.dead]
            assert dead and all(c.closed for c in dead)
            assert len(be.contexts) == 2 + len(dead)  # each dead context replaced once
            assert stats.worker_states_renewed == len(dead)
    finally:
        unregister_backend(be.name)


@pytest.mark.anyio
async def test_crashes_on_a_device_nothing_can_replace_still_cost_runs_not_requests(anyio_backend: str) -> None:
    """quarantine_after=1 and no fallback: the first crash quarantines the device, the re-plan
    without it fails, so it stays (irreplaceable). Its parked request and every later crash's
    request start over on it (the worker renews its context) instead of failing; earlier, a
    device once found irreplaceable failed the request of every later crash."""
    be = _ContextBackend("ctx-fake-sole", 1)
    register_backend(be.name, be)
    try:
        async with Session(_neg(), devices=[fake_device("npu", backend=be.name, kind="npu")],
                           adaptation=hetsched.Adaptation(replanning=Replanning(quarantine_after=1))) as s:
            with anyio.fail_after(30):
                for _crash in range(3):
                    be.crash_at = {be.runs + 1}
                    for i in range(5):
                        np.testing.assert_array_equal((await s.run({"x": _x(i)}))["y"], -_x(i))
            stats = s.statistics()
            assert stats.requests_failed == 0 and stats.requests_completed == 15
            assert stats.failover is not None and stats.failover.unreplaceable == ("npu",)
            assert stats.failover.failures == {"npu": 3} and stats.failover.resubmitted == 3
            assert stats.replanning.failed == 1  # one re-plan tried; an irreplaceable device is not quarantined again
            assert len(be.contexts) == 4 and stats.worker_states_renewed == 3
    finally:
        unregister_backend(be.name)


@pytest.mark.anyio
async def test_a_device_failing_for_good_that_nothing_can_replace_fails_each_request_after_bounded_tries(
        anyio_backend: str) -> None:
    with FakeBackend("fake-sole-dead") as fb:
        async with Session(_chain(), devices=[fake_device("a", backend="fake-sole-dead")],
                           adaptation=hetsched.Adaptation(replanning=Replanning(quarantine_after=2))) as s:
            fb.fail_device("a")
            with anyio.fail_after(30):
                for _ in range(3):
                    with pytest.raises(DeviceFailedError, match="made to fail"):
                        await s.run({"x": _x(1)})
            stats = s.statistics()
            assert stats.requests_failed == 3
            assert stats.failover is not None and stats.failover.unreplaceable == ("a",)
            # each request ran 1 + quarantine_after times (its first run and two starts over)
            assert len(fb.calls) == 3 * 3
