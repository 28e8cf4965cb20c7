"""The scheduler across sessions, through the public surface: two ``Session`` s on one
``hetsched.Runtime`` share its device worker and its heap (asyncio and trio).

A hook on the first stage holds the one device until the test has queued what it wants
ordered, so the order checked follows from the test's own steps, not from timing.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import EventInfo, Hooks, Priority, Runtime, Session

pytestmark = pytest.mark.anyio


def _model() -> onnx.ModelProto:
    m = helper.make_model(
        helper.make_graph([helper.make_node("Neg", ["x"], ["y"], name="neg")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


class _Board:
    """What ran, in order, across sessions; the first stage to start holds the device."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: list[tuple[str, float]] = []
        """(session, tag) as callers got their answers."""
        self.stages: list[tuple[str, int]] = []
        """(session, request id) as their stages started."""
        self.entered = threading.Event()
        self.release = threading.Event()


class _Rec(Hooks):
    def __init__(self, name: str, board: _Board):
        self.name = name
        self.board = board

    def before_stage(self, info: EventInfo) -> None:
        b = self.board
        with b.lock:
            b.stages.append((self.name, info.request_id or 0))
            first = not b.entered.is_set()
            b.entered.set()
        if first:
            assert b.release.wait(10)


def _feeds(tag: float) -> dict[str, np.ndarray]:
    return {"x": np.full(8, tag, np.float32)}


async def _until(cond: Any) -> None:
    with anyio.fail_after(10):
        while not cond():  # noqa: ASYNC110 (polls counts that device worker threads change)
            await anyio.sleep(0.001)


async def test_a_high_request_of_session_b_overtakes_queued_background_requests_of_session_a() -> None:
    board = _Board()
    async with (
        Runtime(devices=["cpu:0"]) as rt,
        Session(_model(), runtime=rt, name="A", hooks=[_Rec("A", board)]) as a,
        Session(_model(), runtime=rt, name="B", hooks=[_Rec("B", board)]) as b,
    ):

        async def run(s: Session, tag: float, priority: Priority) -> None:
            out = await s.run(_feeds(tag), priority=priority)
            with board.lock:
                board.order.append((str(s.name), tag))
            assert np.array_equal(out["y"], -_feeds(tag)["x"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, a, 0.0, Priority.NORMAL)
            await anyio.to_thread.run_sync(board.entered.wait, 10)
            for i in range(1, 4):
                tg.start_soon(run, a, float(i), Priority.BACKGROUND)
                await _until(lambda i=i: rt.statistics().queued_stages >= i)
            tg.start_soon(run, b, 10.0, Priority.HIGH)
            await _until(lambda: rt.statistics().queued_stages >= 4)
            board.release.set()
    # the HIGH request of B ran right after the one holding the device, before A's queued ones
    assert board.stages == [("A", 1), ("B", 1), ("A", 2), ("A", 3), ("A", 4)]
    assert sorted(board.order) == [("A", 0.0), ("A", 1.0), ("A", 2.0), ("A", 3.0), ("B", 10.0)]


async def test_closing_one_session_while_both_serve_drains_only_its_requests() -> None:
    """A closes while its requests (and B's) are queued behind the held device: every request
    of A is answered, B keeps serving after A is gone, and the runtime closes with no buffer
    left referenced (it would raise BufferLeakError)."""
    board = _Board()
    answered: dict[str, list[float]] = {"A": [], "B": []}
    async with (
        Runtime(devices=["cpu:0"]) as rt,
        Session(_model(), runtime=rt, name="B", hooks=[_Rec("B", board)]) as b,
    ):
        close_now, closed = anyio.Event(), anyio.Event()

        async def serve_a(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            async with Session(_model(), runtime=rt, name="A", hooks=[_Rec("A", board)]) as a:
                task_status.started(a)
                await close_now.wait()
            closed.set()

        async def run(s: Session, tag: float) -> None:
            out = await s.run(_feeds(tag))
            assert np.array_equal(out["y"], -_feeds(tag)["x"])
            answered[str(s.name)].append(tag)

        async with anyio.create_task_group() as tg:
            a = await tg.start(serve_a)
            tg.start_soon(run, b, -1.0)
            await anyio.to_thread.run_sync(board.entered.wait, 10)
            for i in range(6):
                tg.start_soon(run, a, float(i))
                tg.start_soon(run, b, float(100 + i))
                await _until(lambda i=i: rt.statistics().queued_stages >= 2 * i + 2)
            close_now.set()
            await anyio.wait_all_tasks_blocked()
            assert not closed.is_set()  # A's requests are still queued: its close waits for them
            board.release.set()
            await closed.wait()
            assert sorted(answered["A"]) == [float(i) for i in range(6)]
            assert rt.sessions == ("B",)
            for i in range(6, 9):
                tg.start_soon(run, b, float(100 + i))
        assert len(answered["B"]) == 10
