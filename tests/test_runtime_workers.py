"""Worker identity and per-worker backend state (a stage's ``worker_state`` hook).

A fake backend wraps the CPU backend's stages and keeps one state object per worker thread,
as an RKNN backend keeps one context per NPU core: the state must be created once per worker
on that worker's own thread, handed to every run on that thread, and closed on that thread
when the session closes, also after a run failed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import Device, Session, StageExecutionError
from hetsched._runtime._scheduler import WorkerInfo
from hetsched.backends import (
    BackendHooks,
    Capabilities,
    CompiledStage,
    StageHooks,
    register_backend,
    unregister_backend,
)
from hetsched.backends.cpu import CpuBackend

F = TensorProto.FLOAT
_FAIL = 666.0


def _model() -> onnx.ModelProto:
    m = helper.make_model(
        helper.make_graph([helper.make_node("Neg", ["x"], ["y"], name="neg")], "g",
                          [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, [4])]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@dataclass
class _State:
    worker: WorkerInfo
    thread: int
    runs: list[int] = field(default_factory=list)
    closed_on: int | None = None


@dataclass
class _Log:
    lock: threading.Lock = field(default_factory=threading.Lock)
    created: list[_State] = field(default_factory=list)
    closed: list[_State] = field(default_factory=list)
    runs: list[tuple[int, _State]] = field(default_factory=list)
    """(thread that ran, state it was given)"""
    both_workers: threading.Barrier = field(default_factory=lambda: threading.Barrier(2))


class _StatefulStage:
    def __init__(self, inner: Any, log: _Log, bindable: bool):
        self._inner = inner
        self._log = log
        self.input_names = inner.input_names
        self.output_names = inner.output_names
        # declared, as a backend declares them: bindable only when asked
        self.hooks = StageHooks(in_place=self if bindable else None, worker_state=self)  # type: ignore[arg-type]
        if bindable:
            self.output_specs = inner.output_specs

    def worker_state(self, worker: WorkerInfo) -> _State:
        state = _State(worker, threading.get_ident())
        with self._log.lock:
            self._log.created.append(state)
        return state

    def close_worker_state(self, state: _State) -> None:
        state.closed_on = threading.get_ident()
        with self._log.lock:
            self._log.closed.append(state)

    def _enter(self, feeds: Mapping[str, np.ndarray], state: _State) -> None:
        me = threading.get_ident()
        with self._log.lock:
            self._log.runs.append((me, state))
            first_two = len(self._log.runs) <= 2
        state.runs.append(me)
        if first_two:
            self._log.both_workers.wait(10)  # the first two runs overlap: both workers take part
        if float(feeds["x"][0]) == _FAIL:
            raise StageExecutionError("the fake NPU rejected this input", stage="neg", device="npu0")

    def run(self, feeds: Mapping[str, np.ndarray], *, state: _State) -> list[np.ndarray]:
        self._enter(feeds, state)
        return self._inner.run(feeds)

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray], *, state: _State) -> None:
        self._enter(feeds, state)
        self._inner.run_into(feeds, outputs)

    def close(self) -> None:
        self._inner.close()


class _StatefulBackend:
    """Two unpinned workers per device; every stage keeps per-worker state."""

    def __init__(self, log: _Log, bindable: bool):
        self.name = "stateful-test"
        self.hooks = BackendHooks(workers=self)
        self._cpu = CpuBackend()
        self._log = log
        self._bindable = bindable

    def capabilities(self, device: Device) -> Capabilities:
        return Capabilities.everything()

    def worker_cpus(self, device: Device) -> list[tuple[int, ...]]:
        return [(), ()]

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        inner = self._cpu.compile(model, Device(name="cpu-inner", cpus=()), name=name)
        return _StatefulStage(inner, self._log, self._bindable)  # type: ignore[return-value]


@pytest.fixture(params=[False, True], ids=["run", "run_into"])
def log(request: pytest.FixtureRequest) -> Iterator[_Log]:
    log = _Log()
    register_backend("stateful-test", _StatefulBackend(log, bool(request.param)))
    try:
        yield log
    finally:
        unregister_backend("stateful-test")


def _x(i: float) -> np.ndarray:
    return np.full(4, float(i), np.float32)


@pytest.mark.anyio
async def test_per_worker_state_is_made_on_its_worker_used_by_its_runs_and_closed_there(
        log: _Log, anyio_backend: str) -> None:
    npu = Device(name="npu0", kind="npu", backend="stateful-test", cpus=())
    async with Session(_model(), devices=[npu]) as s:
        async def one(i: int) -> None:
            # zero-copy outputs stay pool buffers: a bindable stage runs in place (run_into)
            out = await s.run({"x": _x(i)}, zero_copy=bool(i % 2))
            assert not isinstance(out, list)  # names given: a mapping, plain or zero-copy
            try:
                np.testing.assert_array_equal(out["y"], -_x(i))
            finally:
                close = getattr(out, "release", None)  # a zero-copy result holds pool buffers
                if close is not None:
                    close()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(one, i)
            with pytest.raises(StageExecutionError, match="rejected"):
                await s.run({"x": _x(_FAIL)})
            await s.run({"x": _x(1)})  # the worker that failed goes on with the same state
        assert not log.closed  # nothing closed while the session is open
    # one state per worker (both took part: the first two runs overlapped), each made on
    # the thread that then ran with it, for the worker it names
    assert len(log.created) == 2
    assert sorted(st.worker.index for st in log.created) == [0, 1]
    assert {st.worker.device for st in log.created} == {"npu0"}
    assert all(st.worker.cpus == () and st.worker.devices == ("npu0",) for st in log.created)
    assert len({st.thread for st in log.created}) == 2
    assert len(log.runs) == 42
    for thread, state in log.runs:
        assert state.thread == thread  # each run got its own worker's state
    # closed once each, on its own worker thread, when the session closed
    assert sorted(map(id, log.closed)) == sorted(map(id, log.created))
    assert all(st.closed_on == st.thread for st in log.closed)


@pytest.mark.anyio
async def test_a_failing_worker_state_fails_the_run_and_is_retried(anyio_backend: str) -> None:
    class Flaky(_StatefulStage):
        calls = 0

        def worker_state(self, worker: WorkerInfo) -> _State:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise OSError("NPU core busy")
            return super().worker_state(worker)

    class Backend(_StatefulBackend):
        def worker_cpus(self, device: Device) -> list[tuple[int, ...]]:
            return [()]

        def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
            inner = self._cpu.compile(model, Device(name="cpu-inner", cpus=()), name=name)
            return Flaky(inner, self._log, False)  # type: ignore[return-value]

    log = _Log(both_workers=threading.Barrier(1))
    register_backend("stateful-test", Backend(log, False))
    try:
        npu = Device(name="npu0", kind="npu", backend="stateful-test", cpus=())
        async with Session(_model(), devices=[npu]) as s:
            with anyio.fail_after(30):
                with pytest.raises(StageExecutionError, match="NPU core busy"):
                    await s.run({"x": _x(2)})
                out = await s.run({"x": _x(3)})
        np.testing.assert_array_equal(out["y"], -_x(3))
        assert Flaky.calls == 2 and len(log.created) == 1 and len(log.closed) == 1
    finally:
        unregister_backend("stateful-test")


def test_worker_info_is_frozen() -> None:
    info = WorkerInfo("npu0", 1, (4, 5), ("npu0",))
    with pytest.raises(AttributeError):
        info.index = 2  # type: ignore[misc]
    assert info == WorkerInfo("npu0", 1, (4, 5), ("npu0",))
