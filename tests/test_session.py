"""Session: bad inputs, onnxruntime-compatible calls, failures, cancellation, concurrency, hooks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import (
    CostTable,
    Event,
    EventInfo,
    Hooks,
    InputError,
    InvalidModelError,
    ModelFormatError,
    ModelNotFoundError,
    RuntimeStateError,
    Session,
    StageExecutionError,
    SyncSession,
)
from hetsched._events import HookDispatcher
from hetsched._planning.plan import unit_key
from hetsched.policies import Pinned

from _models import make_model as _model
from _models import reshape_model

DEVICES = ["cpu:0", "cpu:1", "cpu:0-1"]
F = TensorProto.FLOAT



def _vi(name: str, shape: Any, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _small() -> onnx.ModelProto:
    """y = exp(-relu(x) * w) + x, z = relu(x); x: float32 [2, 3]."""
    w = helper.make_tensor("w", F, [3], [0.5, 1.0, 2.0])
    return _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["n"], name="neg"),
            helper.make_node("Mul", ["n", "w"], ["m"], name="mul"),
            helper.make_node("Exp", ["m"], ["e"], name="exp"),
            helper.make_node("Add", ["e", "x"], ["y"], name="add"),
        ],
        [_vi("x", [2, 3])],
        [_vi("y", [2, 3]), _vi("r", [2, 3])],
        [w],
    )


def _expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r = np.maximum(x, 0)
    return np.exp(-r * np.array([0.5, 1.0, 2.0], np.float32)) + x, r


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)


def _own_threads() -> set[threading.Thread]:
    """Threads that are not the async libraries' reusable worker pools."""
    return {t for t in threading.enumerate() if not t.name.startswith(("AnyIO worker thread", "Trio thread"))}


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    before = _own_threads()
    yield
    leaked = {t for t in _own_threads() - before if t.is_alive()}
    assert not leaked, f"threads left running: {sorted(t.name for t in leaked)}"


# -- loading errors ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_missing_file(tmp_path: Path, no_leaked_threads: None) -> None:
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelNotFoundError, match=r"nope\.onnx") as info:
        async with Session(path, devices=DEVICES):
            pass
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.anyio
async def test_an_embedded_model_name_opens_like_the_cli_s() -> None:
    # the CLI's model names (the light_* models the onnx wheel ships) work for a Session too
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    if not path.is_file():
        pytest.skip("this onnx wheel does not ship light_squeezenet.onnx")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = ref.get_inputs()[0]
    x = np.random.default_rng(3).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
    async with Session("light_squeezenet", devices=["cpu:0"]) as s:
        assert [i.name for i in s.get_inputs()] == [inp.name]
        (got,) = await s.run(None, {inp.name: x})
    (want,) = ref.run(None, {inp.name: x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ModelNotFoundError, match="no_such_model"):
        async with Session("light_no_such_model", devices=["cpu:0"]):
            pass


@pytest.mark.anyio
@pytest.mark.parametrize("data", [b"this is not an onnx model at all \xff\xfe", b"", b"\x08\x07"])
async def test_not_onnx_bytes(tmp_path: Path, data: bytes, no_leaked_threads: None) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(data)
    with pytest.raises(ModelFormatError, match=r"junk\.onnx"):
        async with Session(path, devices=DEVICES):
            pass
    with pytest.raises(ModelFormatError):
        async with Session(data, devices=DEVICES):
            pass


@pytest.mark.anyio
async def test_invalid_graph(tmp_path: Path, no_leaked_threads: None) -> None:
    # A node reading a value nothing defines.
    bad = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["nowhere"], ["y"])], "g", [_vi("x", [2])], [_vi("y", [2])]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "bad.onnx"
    path.write_bytes(bad.SerializeToString())
    with pytest.raises(InvalidModelError, match=r"bad\.onnx.*nowhere"):
        async with Session(path, devices=DEVICES):
            pass
    with pytest.raises(InvalidModelError, match="not a valid ONNX graph"):
        async with Session(bad, devices=DEVICES):
            pass


# -- feeds ----------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(("feeds", "pattern"), [
    ({"x": _x(), "extra": _x()}, r"unknown input name\(s\) \['extra'\].*\['x'\]"),
    ({"X": _x()}, r"unknown input name\(s\) \['X'\]"),
    ({}, r"missing input\(s\) \['x'\]"),
    ({"x": _x().astype(np.float64)}, r"input 'x': expected dtype float32, got float64"),
    ({"x": _x().reshape(3, 2)}, r"input 'x': expected shape \[2, 3\], got \[3, 2\] \(axis 0: 2 != 3\)"),
    ({"x": _x().reshape(6)}, r"input 'x': expected shape \[2, 3\] \(rank 2\), got \[6\] \(rank 1\)"),
    ([_x()], r"feeds must be a mapping"),
])
async def test_bad_feeds_are_named_and_the_session_keeps_serving(feeds: Any, pattern: str,
                                                                 no_leaked_threads: None) -> None:
    async with Session(_small(), devices=DEVICES, policy=Pinned(lambda u: DEVICES[u.id % 3]),
                       max_unit_nodes=1) as s:
        assert len(s.plan.stages) >= 3
        with pytest.raises(InputError, match=pattern):
            await s.run(feeds)
        with pytest.raises(InputError, match=pattern):
            await s.run(None, feeds)
        x = _x(1)
        out = await s.run({"x": x})
        np.testing.assert_allclose(out["y"], _expected(x)[0], rtol=1e-6)
        st = s.statistics()
        assert (st.requests_started, st.requests_completed, st.requests_failed, st.in_flight) == (1, 1, 0, 0)


@pytest.mark.anyio
async def test_unknown_output_name() -> None:
    async with Session(_small(), devices=DEVICES) as s:
        with pytest.raises(InputError, match=r"unknown output name 'q'.*\['y', 'r'\]"):
            await s.run(["q"], {"x": _x()})


# -- onnxruntime-compatible calls -----------------------------------------------------------


@pytest.mark.anyio
async def test_ort_compatible_run_forms(no_leaked_threads: None) -> None:
    model = _small()
    x = _x(2)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    async with Session(model, devices=DEVICES, max_unit_nodes=1, policy="random:3") as s:
        assert [i.name for i in s.get_inputs()] == [i.name for i in ref.get_inputs()]
        assert [o.name for o in s.get_outputs()] == [o.name for o in ref.get_outputs()]
        got = await s.run(None, {"x": x})
        assert isinstance(got, list) and len(got) == 2
        for g, e in zip(got, ref.run(None, {"x": x}), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-6)
        (r,) = await s.run(["r"], {"x": x})
        np.testing.assert_array_equal(r, ref.run(["r"], {"x": x})[0])
        both = await s.run(output_names=["r", "y"], input_feed={"x": x})
        np.testing.assert_array_equal(both[0], r)
        as_dict = await s.run({"x": x})
        assert set(as_dict) == {"y", "r"}


@pytest.mark.anyio
async def test_run_outside_the_session_is_refused() -> None:
    s = Session(_small(), devices=DEVICES)
    with pytest.raises(RuntimeStateError):
        await s.run({"x": _x()})
    with pytest.raises(RuntimeStateError):
        s.plan  # noqa: B018
    async with s:
        pass
    with pytest.raises(RuntimeStateError):
        await s.run({"x": _x()})


def test_sync_session(no_leaked_threads: None) -> None:
    x = _x(4)
    with SyncSession(_small(), devices=DEVICES, max_unit_nodes=2, policy="heft") as s:
        out = s.run({"x": x})
        np.testing.assert_allclose(out["y"], _expected(x)[0], rtol=1e-6)
        _y, r = s.run(None, {"x": x})
        np.testing.assert_array_equal(r, _expected(x)[1])
        with pytest.raises(InputError, match="'x'"):
            s.run({"x": x.astype(np.int32)})
        assert s.statistics().requests_completed == 2
        assert s.plan.stages
    with pytest.raises(RuntimeStateError):
        SyncSession(_small(), devices=DEVICES).run({"x": x})


# -- failing stages -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_failing_stage_fails_only_its_request(no_leaked_threads: None) -> None:
    pol = Pinned({"abs": "cpu:0", "reshape": "cpu:1", "relu": "cpu:0-1"})
    x = np.arange(6, dtype=np.float32) - 3
    async with Session(reshape_model(), devices=DEVICES, policy=pol, max_unit_nodes=1) as s:
        reshape_stage = next(st for st in s.plan.stages if st.device == "cpu:1")
        results: dict[int, Any] = {}

        async def one(i: int) -> None:
            shape = np.array([2, 3] if i % 3 else [4, 4], np.int64)
            try:
                results[i] = await s.run({"x": x, "s": shape})
            except StageExecutionError as exc:
                results[i] = exc

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        for i, res in results.items():
            if i % 3:
                np.testing.assert_array_equal(res["y"], np.abs(x).reshape(2, 3))
            else:
                assert isinstance(res, StageExecutionError)
                assert res.stage == reshape_stage.name and res.device == "cpu:1"
                assert reshape_stage.name in str(res) and "cpu:1" in str(res)
                assert res.__cause__ is not None
        st = s.statistics()
        assert (st.requests_completed, st.requests_failed, st.in_flight) == (8, 4, 0)
        out = await s.run({"x": x, "s": np.array([3, 2], np.int64)})
        np.testing.assert_array_equal(out["y"], np.abs(x).reshape(3, 2))


# -- cancellation ----------------------------------------------------------------------------


class _Gate(Hooks):
    """Holds the first stage of the first request until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.after = 0
        self._first = True
        self._lock = threading.Lock()

    def before_stage(self, info: EventInfo) -> None:
        with self._lock:
            first, self._first = self._first, False
        if first:
            self.entered.set()
            self.release.wait(10)

    def after_stage(self, info: EventInfo) -> None:
        with self._lock:
            self.after += 1


@pytest.mark.anyio
async def test_cancellation_leaves_nothing_running(no_leaked_threads: None) -> None:
    gate = _Gate()
    async with Session(_small(), devices=DEVICES, max_unit_nodes=1, policy=Pinned(lambda u: DEVICES[u.id % 3]),
                       hooks=[gate]) as s:
        n_stages = len(s.plan.stages)
        assert n_stages >= 3
        with anyio.move_on_after(60) as scope:  # a guard against a hang only
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.run, {"x": _x()})
                await anyio.to_thread.run_sync(gate.entered.wait)
                tg.cancel_scope.cancel()
        assert not scope.cancelled_caught
        st = s.statistics()
        assert (st.requests_cancelled, st.requests_completed, st.in_flight) == (1, 0, 0)
        gate.release.set()
        # The held stage finishes; none of the cancelled request's later stages run.
        x = _x(5)
        out = await s.run({"x": x})
        np.testing.assert_allclose(out["y"], _expected(x)[0], rtol=1e-6)
        assert gate.after == 1 + n_stages
        assert s.statistics().stage_runs == 1 + n_stages


@pytest.mark.anyio
async def test_move_on_after_around_run() -> None:
    async with Session(_small(), devices=DEVICES, max_unit_nodes=1) as s:
        with anyio.move_on_after(0) as scope:
            await s.run({"x": _x()})
        assert scope.cancelled_caught
        assert s.statistics().in_flight == 0
        out = await s.run({"x": _x(9)})
        np.testing.assert_allclose(out["y"], _expected(_x(9))[0], rtol=1e-6)


# -- concurrency ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_many_concurrent_requests(no_leaked_threads: None) -> None:
    n = 500
    xs = [_x(i) for i in range(n)]
    results: list[Any] = [None] * n
    async with Session(_small(), devices=DEVICES, max_unit_nodes=1, policy="random:1", max_in_flight=32) as s:

        async def one(i: int) -> None:
            results[i] = await s.run({"x": xs[i]})

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        st = s.statistics()
        assert (st.requests_completed, st.requests_failed, st.in_flight) == (n, 0, 0)
        assert st.stage_runs == n * len(s.plan.stages)
    for x, res in zip(xs, results, strict=True):
        y, r = _expected(x)
        np.testing.assert_allclose(res["y"], y, rtol=1e-6)
        np.testing.assert_array_equal(res["r"], r)


# -- profiling ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_profile_fills_the_cost_table_and_replans() -> None:
    costs = CostTable()
    async with Session(_small(), devices=DEVICES, max_unit_nodes=2, costs=costs) as s:
        before = s.plan
        assert before.problem.cost  # analytic estimates
        table = await s.profile(repeats=2)
        assert table is costs
        after = s.plan
        assert after is not before
        # Every unit measured on every device, and the new plan priced with the measurements.
        assert costs.statistics().entries == len(after.units) * len(DEVICES)
        index = s._index
        assert index is not None
        name_to_id = {ref.name: ref.index for ref in index.nodes}
        for u in after.units:
            key = unit_key(index, [name_to_id[n] for n in u.nodes])
            for d in u.candidates:
                measured = costs.get(key, d)
                assert measured is not None and measured > 0
                assert after.problem.cost[(u.id, d)] == measured
        x = _x(7)
        out = await s.run({"x": x})
        np.testing.assert_allclose(out["y"], _expected(x)[0], rtol=1e-6)


# -- hooks and events ---------------------------------------------------------------------------


class _Recorder(Hooks):
    def __init__(self, tag: str, log: list[tuple[str, Event, str | None]]) -> None:
        self.tag = tag
        self.log = log
        self.lock = threading.Lock()

    def _rec(self, info: EventInfo) -> None:
        with self.lock:
            self.log.append((self.tag, info.event, info.stage))

    session_start = request_start = before_stage = after_stage = request_end = session_end = _rec


class _OnlyRequestStart(Hooks):
    def request_start(self, info: EventInfo) -> None: ...


def test_dispatcher_registers_only_overridden_methods() -> None:
    h = _OnlyRequestStart()
    d = HookDispatcher([h, object()])
    assert d.listeners[Event.REQUEST_START] == (h.request_start,)
    assert all(d.listeners[e] == () for e in Event if e is not Event.REQUEST_START)
    assert all(v == () for v in HookDispatcher([Hooks()]).listeners.values())


def test_after_events_unwind_in_reverse_order() -> None:
    log: list[tuple[str, Event, str | None]] = []
    a, b = _Recorder("a", log), _Recorder("b", log)
    d = HookDispatcher([a, b])
    d.emit(EventInfo(Event.REQUEST_START, 0.0))
    d.emit(EventInfo(Event.REQUEST_END, 0.0))
    assert [t for t, _, _ in log] == ["a", "b", "b", "a"]


@pytest.mark.anyio
async def test_events_fire_in_order() -> None:
    log: list[tuple[str, Event, str | None]] = []
    rec = _Recorder("r", log)
    async with Session(_small(), devices=DEVICES, max_unit_nodes=1, policy=Pinned(lambda u: DEVICES[u.id % 3]),
                       hooks=[rec]) as s:
        stages = [st.name for st in s.plan.stages]
        await s.run({"x": _x()})
    events = [e for _, e, _ in log]
    assert events[0] is Event.SESSION_START and events[-1] is Event.SESSION_END
    assert events[1] is Event.REQUEST_START and events[-2] is Event.REQUEST_END
    middle = log[2:-2]
    assert [e for _, e, _ in middle] == [Event.BEFORE_STAGE, Event.AFTER_STAGE] * len(stages)
    # A chain: stages run in plan order, each bracketed by its before/after.
    assert [st for _, _, st in middle[::2]] == stages


@pytest.mark.anyio
async def test_after_stage_and_request_end_carry_the_error() -> None:
    errors: dict[Event, BaseException | None] = {}

    class Catch(Hooks):
        def after_stage(self, info: EventInfo) -> None:
            if info.error is not None:
                errors[Event.AFTER_STAGE] = info.error

        def request_end(self, info: EventInfo) -> None:
            errors[Event.REQUEST_END] = info.error

    async with Session(reshape_model(), devices=DEVICES, hooks=[Catch()]) as s:
        with pytest.raises(StageExecutionError):
            await s.run({"x": np.zeros(6, np.float32), "s": np.array([5, 5], np.int64)})
    assert isinstance(errors[Event.AFTER_STAGE], StageExecutionError)
    assert errors[Event.REQUEST_END] is errors[Event.AFTER_STAGE]


# -- statistics -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_statistics() -> None:
    async with Session(reshape_model(), devices=DEVICES, max_unit_nodes=1,
                       policy=Pinned(lambda u: DEVICES[u.id % 3])) as s:
        st0 = s.statistics()
        assert (st0.requests_started, st0.stage_runs, st0.stages, st0.devices) == (0, 0, len(s.plan.stages), 3)
        x = np.ones(6, np.float32)
        for _ in range(3):
            await s.run({"x": x, "s": np.array([3, 2], np.int64)})
        with pytest.raises(StageExecutionError):
            await s.run({"x": x, "s": np.array([7, 1], np.int64)})
        st = s.statistics()
        assert (st.requests_started, st.requests_completed, st.requests_failed, st.requests_cancelled) == (4, 3, 1, 0)
        assert st.stage_runs == 3 * len(s.plan.stages) + 2  # the failing request stops at reshape
        with pytest.raises(AttributeError):
            st.requests_started = 0  # type: ignore[misc]
    assert isinstance(st, hetsched.SessionStatistics)
