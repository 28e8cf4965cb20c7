"""The injected clock: the system one costs nothing, the virtual one moves only when told."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import EventInfo, Hooks, Session
from hetsched._runtime._clock import Clock, SystemClock, VirtualClock


def test_system_clock_reads_the_process_clocks_themselves() -> None:
    # the scheduler binds clock.monotonic once: with the system clock that must be the builtin,
    # so injecting a clock adds no call on the hot path
    clock = SystemClock()
    assert clock.monotonic is time.monotonic
    assert clock.perf_counter is time.perf_counter
    assert isinstance(clock, Clock)


def test_virtual_clock_moves_only_when_advanced() -> None:
    clock = VirtualClock(5.0)
    assert isinstance(clock, Clock)
    assert clock.monotonic() == clock.perf_counter() == 5.0
    assert clock.advance(0.25) == 5.25
    assert clock.monotonic() == clock.perf_counter() == 5.25
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1.0)
    assert clock.monotonic() == 5.25


def test_virtual_clock_advanced_from_many_threads_loses_nothing() -> None:
    clock = VirtualClock()

    def work() -> None:
        for _ in range(1000):
            clock.advance(1.0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.monotonic() == 4000.0


def _neg() -> onnx.ModelProto:
    m = helper.make_model(
        helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.anyio
async def test_stage_hooks_are_stamped_and_timed_by_the_sessions_clock(anyio_backend: str) -> None:
    seen: list[EventInfo] = []

    class Stamps(Hooks):
        def before_stage(self, info: EventInfo) -> None:
            seen.append(info)

        def after_stage(self, info: EventInfo) -> None:
            seen.append(info)

    clock = VirtualClock(1000.0)
    async with Session(_neg(), devices=["cpu:0"], hooks=[Stamps()], clock=clock) as s:
        out = await s.run({"x": np.ones(4, np.float32)})
        clock.advance(7.0)
        await s.run({"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(out["y"], -np.ones(4, np.float32))
    assert [i.time_s for i in seen] == [1000.0, 1000.0, 1007.0, 1007.0]
    assert [i.elapsed_s for i in seen[1::2]] == [0.0, 0.0]  # no virtual time passed during the runs
