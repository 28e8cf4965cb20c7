"""The session core: one set of counters for run() callers and streams, the injected clock,
typed error attributes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import BufferLeakError, Device, Event, EventInfo, Hooks, Session
from hetsched._runtime._clock import VirtualClock

from _models import make_model

PER_CORE = [Device(name="cpus", cpus=(0, 1), options={"workers": "per-core"})]


def _chain() -> onnx.ModelProto:
    """y = exp(-relu(x)) + x over float32 [16]."""
    return make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["n"], name="neg"),
            helper.make_node("Exp", ["n"], ["e"], name="exp"),
            helper.make_node("Add", ["e", "x"], ["y"], name="add"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
    )


def _x(i: int) -> np.ndarray:
    return np.linspace(-1.0, 1.0, 16, dtype=np.float32) * (i + 1)


async def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait (polling the loop) until ``cond()``; the bound only catches a hang."""
    with anyio.fail_after(60, reason=f"never: {what}"):
        while True:
            if cond():
                return
            await anyio.sleep(0.001)


class _Hold(Hooks):
    """Holds every stage until released (device worker threads)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def before_stage(self, info: EventInfo) -> None:
        self.release.wait(60)


@pytest.mark.anyio
async def test_run_callers_and_a_stream_count_into_one_in_flight_and_one_peak() -> None:
    hold = _Hold()
    async with Session(_chain(), devices=PER_CORE, hooks=[hold], max_in_flight=6) as s:
        try:
            async with s.map([{"x": _x(i)} for i in range(4)], window=4) as results:
                await _until(lambda: results.statistics().in_flight == 4, "the stream's window admitted")
                outs: list[np.ndarray] = []

                async def caller(i: int) -> None:
                    outs.append((await s.run({"x": _x(10 + i)}))["y"])

                async with anyio.create_task_group() as tg:
                    tg.start_soon(caller, 0)
                    tg.start_soon(caller, 1)
                    await _until(lambda: s.statistics().in_flight == 6, "both callers admitted beside the stream")
                    st = s.statistics()
                    # one count in the core: the stream's requests in flight beside the callers'
                    assert st.peak_in_flight == 6 == st.max_in_flight
                    hold.release.set()
                got = [out["y"] async for out in results]
        finally:
            hold.release.set()
        st = s.statistics()
        assert (st.requests_started, st.requests_completed, st.requests_failed, st.in_flight) == (6, 6, 0, 0)
        assert st.peak_in_flight == 6
        for i, y in enumerate(got):
            np.testing.assert_allclose(y, np.exp(-np.maximum(_x(i), 0)) + _x(i), rtol=1e-6)
        assert len(outs) == 2


@pytest.mark.anyio
async def test_hooks_are_stamped_by_the_injected_clock() -> None:
    clock = VirtualClock(100.0)
    seen: list[tuple[Event, float]] = []

    class Record(Hooks):
        def session_start(self, info: EventInfo) -> None:
            seen.append((info.event, info.time_s))

        def request_start(self, info: EventInfo) -> None:
            seen.append((info.event, info.time_s))

        def request_end(self, info: EventInfo) -> None:
            seen.append((info.event, info.time_s))

    async with Session(_chain(), devices=["cpu:0"], hooks=[Record()], clock=clock) as s:
        await s.run({"x": _x(0)})
        clock.advance(5.0)
        await s.run({"x": _x(1)})
    assert seen == [
        (Event.SESSION_START, 100.0),
        (Event.REQUEST_START, 100.0), (Event.REQUEST_END, 100.0),
        (Event.REQUEST_START, 105.0), (Event.REQUEST_END, 105.0),
    ]


def test_buffer_leak_error_declares_its_attributes() -> None:
    plain = BufferLeakError("pool closed with buffers referenced")
    assert (plain.labels, plain.stages) == ([], [])
    err = BufferLeakError("leak", labels=("stage0:y", None), stages=["stage0"])
    assert err.labels == ["stage0:y", None] and err.stages == ["stage0"]
    assert str(err) == "leak"
