"""Session.map: results in order, workers admitting requests, batched wake-ups, errors in place,
cancellation without leaks, the general path (request hooks), backpressure."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import (
    Device,
    EventInfo,
    Hooks,
    InputError,
    Outputs,
    Priority,
    ResultStream,
    RuntimeStateError,
    Session,
    StageExecutionError,
)
from hetsched.policies import Pinned

from _models import make_model as _model
from _models import reshape_model

F = TensorProto.FLOAT
PER_CORE = [Device(name="cpus", cpus=(0, 1), options={"workers": "per-core"})]



def _chain() -> onnx.ModelProto:
    """y = exp(-relu(x)) + x over float32 [64]: four nodes, so it can be cut into stages."""
    return _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["n"], name="neg"),
            helper.make_node("Exp", ["n"], ["e"], name="exp"),
            helper.make_node("Add", ["e", "x"], ["y"], name="add"),
        ],
        [helper.make_tensor_value_info("x", F, [64])],
        [helper.make_tensor_value_info("y", F, [64])],
    )


def _expected(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.maximum(x, 0)) + x


def _x(i: int) -> np.ndarray:
    return (np.arange(64, dtype=np.float32) - 32.0) * (0.01 * (i + 1))


def _pipeline(units: Any) -> str:
    return "cpu:0" if units.nodes[0] in ("relu", "neg") else "cpu:1"


async def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait (polling the loop) until ``cond()``; the bound only catches a hang, it times nothing."""
    with anyio.fail_after(60, reason=f"never: {what}"):
        while True:
            if cond():
                return
            await anyio.sleep(0.001)


async def _settle(s: Session) -> None:
    """A stage that was running when its request was dropped returns its buffers when it ends."""
    await _until(lambda: not s.statistics().pools["host"].bytes_in_use, "the dropped requests' buffers returned")
    _assert_clean(s)


class _AheadOfTheWorkers(Hooks):
    """Holds each stage until the stream has a validated input waiting (or its source is done).

    So a worker finishing a stage always finds a next request to admit, whatever the relative
    speed of the event loop and the devices on a loaded machine: what the tests below check
    (workers admit, the loop wakes per batch, the window fills) is then the stream's logic, not
    a race. Never a deadlock: pending at or below half the window wakes the feeder.
    """

    def __init__(self) -> None:
        self.stream: ResultStream | None = None
        self.in_flight: list[int] = []

    def before_stage(self, info: EventInfo) -> None:
        stream = self.stream
        if stream is None:
            return
        give_up = time.monotonic() + 30  # a guard against a hang only; nothing is timed
        while time.monotonic() < give_up:
            st = stream.statistics()
            if st.pending or st.taken == self.total:
                break
            time.sleep(0.0002)
        self.in_flight.append(stream.statistics().in_flight)

    total = -1
    """Items of the source (the wait ends once all were taken)."""


def _assert_clean(s: Session) -> None:
    st = s.statistics()
    assert st.in_flight == 0
    for pool in st.pools.values():
        assert pool.bytes_in_use == 0 and pool.live_buffers == 0
    assert s._core.slots_in_use == 0  # every admission slot given back


# -- results -------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["list", "generator", "async generator"])
async def test_results_come_in_source_order_and_match_the_model(kind: str) -> None:
    n = 300
    xs = [_x(i) for i in range(n)]

    async def agen() -> AsyncIterator[dict[str, np.ndarray]]:
        for x in xs:
            yield {"x": x}

    source: Any = {"list": [{"x": x} for x in xs], "generator": ({"x": x} for x in xs), "async generator": agen()}[kind]
    ahead = _AheadOfTheWorkers()
    ahead.total = n
    async with Session(_chain(), devices=PER_CORE, hooks=[ahead]) as s:
        async with s.map(source) as results:
            assert isinstance(results, ResultStream)
            ahead.stream = results
            got = [out async for out in results]
            st = results.statistics()
        assert len(got) == n
        for x, out in zip(xs, got, strict=True):
            np.testing.assert_allclose(out["y"], _expected(x), rtol=1e-6)
        assert st.worker_admission and st.delivered == st.admitted == st.taken == n
        assert st.admitted_by_workers > n // 4  # workers start requests themselves, not only the loop
        ss = s.statistics()
        assert (ss.requests_started, ss.requests_completed, ss.requests_failed) == (n, n, 0)
        _assert_clean(s)


@pytest.mark.anyio
async def test_a_fast_source_wakes_the_loop_once_per_batch_not_per_request() -> None:
    n = 400
    ahead = _AheadOfTheWorkers()
    ahead.total = n
    async with (
        Session(_chain(), devices=PER_CORE, hooks=[ahead]) as s,
        s.map(({"x": _x(i)} for i in range(n)), window=8) as results,
    ):
        ahead.stream = results
        count = 0
        async for _ in results:
            count += 1
        st = results.statistics()
    assert count == n
    # one wake-up per request would be >= n; batches of window // 2 = 4 give ~n / 4
    assert st.loop_wakeups < n / 2, st


@pytest.mark.anyio
async def test_pipelined_stages_zero_copy_outputs_in_order() -> None:
    n = 120
    async with Session(_chain(), devices=["cpu:0", "cpu:1"], policy=Pinned(_pipeline), max_unit_nodes=1) as s:
        assert len(s.plan.stages) == 2
        async with s.map(({"x": _x(i)} for i in range(n)), zero_copy=True) as results:
            i = 0
            async for out in results:
                assert isinstance(out, Outputs)
                with out:
                    np.testing.assert_allclose(out["y"], _expected(_x(i)), rtol=1e-6)
                i += 1
        assert i == n
        assert s.statistics().bytes_copied_same_domain == 0
        _assert_clean(s)


@pytest.mark.anyio
async def test_a_source_slower_than_the_devices_gets_each_result_at_once() -> None:
    # Lock-step: the source yields item k only once the consumer has result k-1. Holding a
    # result back for a batch would deadlock here (caught by fail_after).
    got_previous = anyio.Event()
    got_previous.set()
    n = 40

    async def source() -> AsyncIterator[dict[str, np.ndarray]]:
        nonlocal got_previous
        for i in range(n):
            await got_previous.wait()
            got_previous = anyio.Event()
            yield {"x": _x(i)}

    async with Session(_chain(), devices=PER_CORE) as s:
        with anyio.fail_after(60):
            async with s.map(source(), window=8) as results:
                i = 0
                async for out in results:
                    np.testing.assert_allclose(out["y"], _expected(_x(i)), rtol=1e-6)
                    i += 1
                    got_previous.set()
        assert i == n


@pytest.mark.anyio
async def test_window_bounds_the_requests_in_flight() -> None:
    ahead = _AheadOfTheWorkers()
    ahead.total = 200
    async with (
        Session(_chain(), devices=PER_CORE, hooks=[ahead]) as s,
        s.map(({"x": _x(i)} for i in range(200)), window=3) as results,
    ):
        ahead.stream = results
        async for _ in results:
            pass
        assert results.statistics().window == 3
    seen = ahead.in_flight
    assert seen and max(seen) <= 3
    assert max(seen) >= 2  # the window was used, not one at a time


@pytest.mark.anyio
async def test_stream_requests_carry_the_stream_priority() -> None:
    prios: set[Priority] = set()

    class Watch(Hooks):
        def before_stage(self, info: EventInfo) -> None:
            assert info.priority is not None
            prios.add(info.priority)

    async with (
        Session(_chain(), devices=PER_CORE, hooks=[Watch()]) as s,
        s.map([{"x": _x(i)} for i in range(20)], priority=Priority.BACKGROUND) as results,
    ):
        async for _ in results:
            pass
    assert prios == {Priority.BACKGROUND}


@pytest.mark.anyio
async def test_a_slow_consumer_holds_the_stream_back_and_it_still_completes() -> None:
    # Results not yet taken are bounded (a second window); with every place taken by
    # results nothing runs, so taking one must start the next request (no worker will).
    n, window = 60, 4
    undelivered: list[int] = []
    async with Session(_chain(), devices=PER_CORE) as s:
        async with s.map(({"x": _x(i)} for i in range(n)), window=window) as results:

            def ahead() -> int:
                st = results.statistics()
                return st.admitted - st.delivered

            i = 0
            async for out in results:
                np.testing.assert_allclose(out["y"], _expected(_x(i)), rtol=1e-6)
                i += 1
                if i % 10 == 0 and i + 2 * window <= n:  # now and then the devices get far ahead
                    await _until(lambda: ahead() >= 2 * window, "the devices 2 windows ahead of the consumer")
                    await anyio.sleep(0.01)  # and could go further if nothing held them back
                else:
                    await anyio.sleep(0.002)
                undelivered.append(ahead())
        assert i == n
        assert max(undelivered) <= 2 * window
        assert max(undelivered) == 2 * window  # the bound was reached: the stream was held back
        _assert_clean(s)


# -- errors in place -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_invalid_item_raises_in_its_place_after_the_earlier_results() -> None:
    items: list[Any] = [{"x": _x(i)} for i in range(5)] + [{"x": np.zeros(3, np.float32)}] + [{"x": _x(9)}]
    async with Session(_chain(), devices=PER_CORE) as s:
        async with s.map(items) as results:
            got = []
            with pytest.raises(InputError, match=r"item 5: input 'x': expected shape \[64\]"):
                async for out in results:
                    got.append(out)
            assert len(got) == 5
            with pytest.raises(StopAsyncIteration):
                await results.__anext__()
        _assert_clean(s)


@pytest.mark.anyio
async def test_the_source_s_own_error_is_re_raised_in_its_place() -> None:
    def source() -> Iterator[dict[str, np.ndarray]]:
        yield {"x": _x(0)}
        yield {"x": _x(1)}
        raise KeyError("camera unplugged")

    async with Session(_chain(), devices=PER_CORE) as s:
        got = []
        with pytest.raises(KeyError, match="camera unplugged"):
            async with s.map(source()) as results:
                async for out in results:
                    got.append(out)
        assert len(got) == 2
        _assert_clean(s)


@pytest.mark.anyio
async def test_a_failing_request_raises_in_its_place_and_the_session_goes_on() -> None:
    pol = Pinned({"abs": "cpu:0", "reshape": "cpu:1", "relu": "cpu:0"})
    x = np.arange(6, dtype=np.float32) - 3
    good, bad = np.array([2, 3], np.int64), np.array([4, 4], np.int64)
    items = [{"x": x, "s": bad if i == 7 else good} for i in range(30)]
    async with Session(reshape_model(), devices=["cpu:0", "cpu:1"], policy=pol, max_unit_nodes=1) as s:
        got = []
        async with s.map(items) as results:
            with pytest.raises(StageExecutionError) as info:
                async for out in results:
                    got.append(out)
            with pytest.raises(StopAsyncIteration):
                await results.__anext__()
        assert len(got) == 7
        assert info.value.device == "cpu:1" and "reshape" in str(info.value)
        for out in got:
            np.testing.assert_array_equal(out["y"], np.abs(x).reshape(2, 3))
        ss = s.statistics()
        assert ss.requests_failed == 1
        assert ss.requests_started == ss.requests_completed + ss.requests_failed + ss.requests_cancelled
        out = await s.run({"x": x, "s": np.array([3, 2], np.int64)})
        np.testing.assert_array_equal(out["y"], np.abs(x).reshape(3, 2))
        await _settle(s)


# -- leaving early, cancellation -------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("zero_copy", [False, True])
async def test_leaving_the_block_early_drops_the_rest_without_leaks(zero_copy: bool) -> None:
    async with Session(_chain(), devices=["cpu:0", "cpu:1"], policy=Pinned(_pipeline), max_unit_nodes=1) as s:
        async with s.map(({"x": _x(i)} for i in range(10_000)), zero_copy=zero_copy) as results:
            async for out in results:
                if zero_copy:
                    out.release()
                break
            taken = results.statistics().taken
        assert taken < 100  # the source was not drained
        ss = s.statistics()
        assert ss.requests_started == ss.requests_completed + ss.requests_cancelled
        with pytest.raises(StopAsyncIteration):
            await results.__anext__()
        await _settle(s)
        assert (await s.run({"x": _x(1)}))["y"].shape == (64,)


@pytest.mark.anyio
async def test_cancelling_the_consumer_leaks_nothing() -> None:
    async with Session(_chain(), devices=["cpu:0", "cpu:1"], policy=Pinned(_pipeline), max_unit_nodes=1) as s:
        for deadline in (0.0, 0.002, 0.01, 0.03):
            delivered = 0
            with anyio.move_on_after(deadline):
                async with s.map(({"x": _x(i)} for i in range(100_000)), zero_copy=True) as results:
                    async for out in results:
                        out.release()
                        delivered += 1
            await _settle(s)
        st = s.statistics()
        assert st.requests_failed == 0


# -- the general path ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_request_hooks_take_the_general_path_with_the_same_results() -> None:
    starts: list[int] = []

    class Requests(Hooks):
        def request_start(self, info: EventInfo) -> None:
            assert info.request_id is not None
            starts.append(info.request_id)

    n = 60
    async with Session(_chain(), devices=PER_CORE, hooks=[Requests()]) as s:
        async with s.map([{"x": _x(i)} for i in range(n)], window=4) as results:
            got = [out async for out in results]
            st = results.statistics()
        assert not st.worker_admission and st.admitted_by_workers == 0
        assert len(starts) == n
        for i, out in enumerate(got):
            np.testing.assert_allclose(out["y"], _expected(_x(i)), rtol=1e-6)
        _assert_clean(s)


@pytest.mark.anyio
async def test_general_path_errors_and_early_exit() -> None:
    class Requests(Hooks):
        def request_end(self, info: EventInfo) -> None:
            pass

    items: list[Any] = [{"x": _x(i)} for i in range(6)] + [{"y": _x(0)}]
    async with Session(_chain(), devices=PER_CORE, hooks=[Requests()]) as s:
        async with s.map(items) as results:
            got = []
            with pytest.raises(InputError, match="item 6: unknown input name"):
                async for out in results:
                    got.append(out)
        assert len(got) == 6
        async with s.map(({"x": _x(i)} for i in range(1000)), zero_copy=True) as results:
            async for out in results:
                out.release()
                break
        await _settle(s)


# -- streams alongside other callers ----------------------------------------------------------------


@pytest.mark.anyio
async def test_two_streams_and_run_callers_share_a_small_session() -> None:
    async with Session(_chain(), devices=PER_CORE, max_in_flight=4) as s:
        outs: dict[str, list[Any]] = {"a": [], "b": [], "run": []}

        async def stream(key: str, offset: int) -> None:
            async with s.map({"x": _x(offset + i)} for i in range(80)) as results:
                async for out in results:
                    outs[key].append(out["y"])

        async def caller() -> None:
            for i in range(20):
                outs["run"].append((i, (await s.run({"x": _x(i)}))["y"]))

        with anyio.fail_after(60):  # a guard against a hang only
            async with anyio.create_task_group() as tg:
                tg.start_soon(stream, "a", 0)
                tg.start_soon(stream, "b", 1000)
                tg.start_soon(caller)
        for i, y in enumerate(outs["a"]):
            np.testing.assert_allclose(y, _expected(_x(i)), rtol=1e-6)
        for i, y in enumerate(outs["b"]):
            np.testing.assert_allclose(y, _expected(_x(1000 + i)), rtol=1e-6)
        assert len(outs["a"]) == len(outs["b"]) == 80 and len(outs["run"]) == 20
        _assert_clean(s)


# -- misuse ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_misuse_is_named() -> None:
    s = Session(_chain(), devices=PER_CORE)
    with pytest.raises(RuntimeStateError, match="not open"):
        async with s.map([{"x": _x(0)}]):
            pass
    async with s:
        with pytest.raises(InputError, match="iterable"):
            s.map(42)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="iterable"):
            s.map({"x": _x(0)})  # type: ignore[dict-item]  # one feeds mapping, not a stream of them
        with pytest.raises(ValueError, match="window"):
            s.map([], window=0)
        with pytest.raises(ValueError, match="not a valid Priority"):
            s.map([], priority=9)
        with pytest.raises(InputError, match="unknown output name 'nope'"):
            async with s.map([], output_names=["nope"]):
                pass
        results = s.map([{"x": _x(0)}])
        with pytest.raises(RuntimeStateError, match="async with"):
            await results.__anext__()
        async with s.map([]) as empty:
            assert [o async for o in empty] == []
        async with s.map([{"x": _x(2)}], output_names=["y"]) as one:
            assert [list(o) async for o in one] == [["y"]]
        _assert_clean(s)


def test_no_thread_outlives_the_session() -> None:
    before = {t for t in threading.enumerate()}

    async def main() -> None:
        async with Session(_chain(), devices=PER_CORE) as s, s.map({"x": _x(i)} for i in range(50)) as results:
            async for _ in results:
                pass

    anyio.run(main)
    left = {t for t in threading.enumerate() if t.is_alive()} - before
    assert not [t for t in left if t.name.startswith("hetsched")]


def test_sync_session_map() -> None:
    from hetsched import SyncSession

    with SyncSession(_chain(), devices=PER_CORE) as s:
        with s.map({"x": _x(i)} for i in range(50)) as results:
            got = [out["y"] for out in results]
        assert len(got) == 50
        for i, y in enumerate(got):
            np.testing.assert_allclose(y, _expected(_x(i)), rtol=1e-6)
        with pytest.raises(InputError, match="item 2"), s.map([{"x": _x(0)}, {"x": _x(1)}, {"x": "nope"}]) as results:
            assert len([out for out in results]) == 2
        assert s.statistics().in_flight == 0
    with pytest.raises(RuntimeStateError, match="not open"), s.map([]):
        pass
    with pytest.raises(RuntimeStateError, match="not open"):
        s.run({"x": _x(0)})
