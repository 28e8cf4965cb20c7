"""The runtime's zero-copy buffers through a Session: pointer identity, lifecycle, leaks, outputs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import BufferLeakError, EventInfo, Hooks, RuntimeStateError, Session, StageExecutionError
from hetsched._runtime import BufferState
from hetsched._runtime._scheduler import StageIO
from hetsched._session._delivery import Outputs
from hetsched.policies import Pinned

from _models import make_model as _model
from _models import reshape_model

F = TensorProto.FLOAT
DEVICES = ["cpu:0", "cpu:1", "cpu:0-1"]



def _chain() -> onnx.ModelProto:
    """y = exp(-relu(x) * w) + x; r = relu(x) is also an output; x: float32 [4, 8]. A diamond: x feeds two stages."""
    w = helper.make_tensor("w", F, [8], np.linspace(0.1, 2.0, 8).astype(np.float32).tolist())
    return _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["n"], name="neg"),
            helper.make_node("Mul", ["n", "w"], ["m"], name="mul"),
            helper.make_node("Exp", ["m"], ["e"], name="exp"),
            helper.make_node("Add", ["e", "x"], ["y"], name="add"),
        ],
        [helper.make_tensor_value_info("x", F, [4, 8])],
        [helper.make_tensor_value_info("y", F, [4, 8]), helper.make_tensor_value_info("r", F, [4, 8])],
        [w],
    )


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    r = np.maximum(x, 0)
    return {"y": np.exp(-r * np.linspace(0.1, 2.0, 8).astype(np.float32)) + x, "r": r}


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


def _alternate(u: Any) -> str:
    return DEVICES[u.id % 3]


class _Trace(Hooks):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.io: dict[int, dict[str, StageIO]] = {}

    def after_stage(self, info: EventInfo) -> None:
        assert isinstance(info.extra, StageIO)
        with self.lock:
            self.io.setdefault(info.request_id or 0, {})[info.stage or ""] = info.extra


def _live(s: Session) -> int:
    return sum(p.live_buffers for p in s.statistics().pools.values())


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    def own() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if not t.name.startswith(("AnyIO worker thread", "Trio thread"))}

    before = own()
    yield
    leaked = {t for t in own() - before if t.is_alive()}
    assert not leaked, sorted(t.name for t in leaked)


# -- pointer identity ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_consumers_read_the_very_memory_their_producer_wrote() -> None:
    trace = _Trace()
    async with Session(_chain(), devices=DEVICES, policy=Pinned(_alternate), max_unit_nodes=1, hooks=[trace]) as s:
        stages = s.plan.stages
        assert len(stages) == 5
        for i in range(8):
            out = await s.run({"x": _x(i)})
            for k, v in _expected(_x(i)).items():
                np.testing.assert_allclose(out[k], v, rtol=1e-6)
        st = s.statistics()
        # the last stage's output only the caller reads: handed over as the backend allocated it
        assert (st.stage_runs_bound, st.stage_runs_to_caller, st.stage_runs_unbound) == (8 * 4, 8, 0)
        assert not st.unbound_stages
        assert st.bytes_copied_same_domain == 0
        producer = {o: sp.name for sp in stages for o in sp.outputs}
        edges = [(producer[v], sp.name, v) for sp in stages for v in sp.inputs if v in producer]
        assert len(edges) == 4
        pool = s.pools["host"]
        for per_stage in trace.io.values():
            assert set(per_stage) == {sp.name for sp in stages}
            for prod, cons, value in edges:
                addr = per_stage[prod].outputs[value]
                assert addr == per_stage[cons].inputs[value], (prod, cons, value)
                assert addr % 64 == 0  # the pool's alignment
            # the fed input is read where the caller put it, by every stage that reads it
            assert len({per_stage[sp.name].inputs["x"] for sp in stages if "x" in sp.inputs}) == 1
        ps = pool.statistics()
        assert ps.reuse_rate > 0.5 and ps.live_buffers == 0 and ps.bytes_in_use == 0


@pytest.mark.anyio
async def test_plain_run_copies_each_output_exactly_once_and_zero_copy_not_at_all() -> None:
    trace = _Trace()
    async with Session(_chain(), devices=DEVICES, policy=Pinned(_alternate), max_unit_nodes=1, hooks=[trace]) as s:
        x = _x(3)
        plain = await s.run({"x": x})
        st = s.statistics()
        # r lives in a pool buffer (a later stage reads it too): copied out exactly once;
        # y is read by the caller only: the array the backend wrote, handed over, no copy
        assert st.bytes_copied_to_caller == plain["r"].nbytes
        assert all(a.flags.writeable for a in plain.values()) and plain["r"].flags.owndata
        assert _live(s) == 0
        rid = max(trace.io)
        written = {v: io.outputs[v] for io in trace.io[rid].values() for v in io.outputs}
        assert plain["r"].ctypes.data != written["r"]  # a fresh array, not the pool's memory
        assert plain["y"].ctypes.data == written["y"]  # the very array the last stage wrote
        assert not any(b.label.endswith(":y") for b in s.pools["host"].leaks())

        out = await s.run(None, {"x": x}, zero_copy=True)
        assert isinstance(out, Outputs) and list(out) == ["y", "r"]
        rid = max(trace.io)
        written = {v: io.outputs[v] for io in trace.io[rid].values() for v in io.outputs}
        for name in ("y", "r"):
            assert out[name].ctypes.data == written[name]  # the memory the last stage wrote
            assert not out[name].flags.writeable
            np.testing.assert_allclose(out[name], plain[name])
        assert [b.state for b in out.buffers] == [BufferState.ALLOCATED] * 2
        assert s.statistics().bytes_copied_to_caller == st.bytes_copied_to_caller  # nothing more copied
        assert _live(s) == 2
        kept = out.copy()
        out.release()
        out.release()  # idempotent
        assert out.released and _live(s) == 0
        with pytest.raises(RuntimeStateError, match="released"):
            out["y"]
        np.testing.assert_allclose(kept["y"], plain["y"])
        with await s.run({"x": x}, zero_copy=True) as out2:
            assert _live(s) == 2
            np.testing.assert_allclose(out2["r"], plain["r"])
        assert _live(s) == 0


@pytest.mark.anyio
async def test_unreleased_zero_copy_outputs_are_a_leak_naming_the_stage(no_leaked_threads: None) -> None:
    with pytest.raises(BufferLeakError) as info:
        async with Session(_chain(), devices=DEVICES, policy=Pinned(_alternate), max_unit_nodes=1) as s:
            producer = {o: sp.name for sp in s.plan.stages for o in sp.outputs}
            out = await s.run(["y"], {"x": _x()}, zero_copy=True)
    assert producer["y"] in str(info.value)
    assert info.value.stages == [producer["y"]]
    assert info.value.labels == [f"{producer['y']}:y"]
    out.release()  # still safe after the session closed: the memory is unmapped now


@pytest.mark.anyio
async def test_an_error_inside_the_block_is_not_masked_by_the_leak_it_causes() -> None:
    with pytest.raises(KeyError):
        async with Session(_chain(), devices=DEVICES) as s:
            out = await s.run({"x": _x()}, zero_copy=True)
            raise KeyError("boom")
    out.release()


# -- lifecycle under cancellation and failure -------------------------------------------------------


class _Gate(Hooks):
    """Blocks the stage named ``stage`` of the first request reaching it until released."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.entered = threading.Event()
        self.release = threading.Event()
        self.ran: list[tuple[int | None, str | None]] = []
        self._first = True
        self._lock = threading.Lock()

    def before_stage(self, info: EventInfo) -> None:
        with self._lock:
            hold = info.stage == self.stage and self._first
            if hold:
                self._first = False
        if hold:
            self.entered.set()
            self.release.wait(10)

    def after_stage(self, info: EventInfo) -> None:
        with self._lock:
            self.ran.append((info.request_id, info.stage))


@pytest.mark.anyio
async def test_cancellation_returns_every_buffer_and_drops_pending_stages(no_leaked_threads: None) -> None:
    async with Session(_chain(), devices=DEVICES, policy=Pinned(_alternate), max_unit_nodes=1) as probe:
        middle = probe.plan.stages[2].name
    gate = _Gate(middle)
    async with Session(_chain(), devices=DEVICES, policy=Pinned(_alternate), max_unit_nodes=1, hooks=[gate]) as s:
        pool = s.pools["host"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.run, {"x": _x()})
            await anyio.to_thread.run_sync(gate.entered.wait)
            # stages 0 and 1 ran: their outputs are referenced by the held stage and later ones
            held = {b.label for b in pool.leaks()}
            assert len(held) >= 2 and all(b.refcount > 0 for b in pool.leaks())
            tg.cancel_scope.cancel()
        st = s.statistics()
        assert (st.requests_cancelled, st.in_flight) == (1, 0)
        # the held stage still reads its inputs: nothing may go back to the pool before it ends
        assert {b.label for b in pool.leaks()} == held
        gate.release.set()
        with anyio.fail_after(10):
            while _live(s):  # noqa: ASYNC110 -- polls what worker threads change (no event to wait on); bounded by fail_after
                await anyio.sleep(0.01)
        assert [st_name for _, st_name in gate.ran] == [sp.name for sp in s.plan.stages[:3]]
        assert pool.leaks() == ()
        out = await s.run({"x": _x(1)})
        np.testing.assert_allclose(out["y"], _expected(_x(1))["y"], rtol=1e-6)
        assert _live(s) == 0


@pytest.mark.anyio
async def test_a_failing_stage_releases_its_requests_buffers(no_leaked_threads: None) -> None:
    pol = Pinned({"abs": "cpu:0", "reshape": "cpu:1", "relu": "cpu:0-1"})
    x = np.arange(6, dtype=np.float32) - 3
    async with Session(reshape_model(), devices=DEVICES, policy=pol, max_unit_nodes=1) as s:
        st = s.statistics()
        # abs has a static output (pool buffer); reshape/relu shapes depend on data
        assert set(st.unbound_stages) == {sp.name for sp in s.plan.stages if sp.device != "cpu:0"}
        assert all("data-dependent shape" in why for why in st.unbound_stages.values())
        results: list[Any] = []

        async def one(i: int) -> None:
            shape = np.array([2, 3] if i % 2 else [4, 4], np.int64)
            try:
                results.append(await s.run({"x": x, "s": shape}))
            except StageExecutionError as exc:
                results.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
        failed = [r for r in results if isinstance(r, StageExecutionError)]
        assert len(failed) == 20 and all(e.device == "cpu:1" for e in failed)
        assert s.statistics().requests_completed == 20
        assert _live(s) == 0
        assert s.pools["host"].statistics().acquisitions == 40  # abs ran for every request


@pytest.mark.anyio
async def test_outputs_of_dynamic_shape_stages_are_handed_over_without_a_copy() -> None:
    pol = Pinned({"abs": "cpu:0", "reshape": "cpu:1", "relu": "cpu:1"})
    async with Session(reshape_model(), devices=DEVICES, policy=pol, max_unit_nodes=1) as s:
        out = await s.run({"x": np.arange(6, dtype=np.float32), "s": np.array([3, 2], np.int64)})
        np.testing.assert_array_equal(out["y"], np.arange(6, dtype=np.float32).reshape(3, 2))
        st = s.statistics()
        assert st.bytes_copied_to_caller == 0  # backend-allocated: already the caller's
        assert (st.stage_runs_bound, st.stage_runs_unbound) == (1, 1)


@pytest.mark.anyio
async def test_outputs_match_onnxruntime_with_every_value_crossing_a_boundary() -> None:
    model = _chain()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    async with Session(model, devices=DEVICES, policy="random:5", max_unit_nodes=1) as s:
        for i in range(20):
            x = _x(i)
            got = await s.run(None, {"x": x})
            for g, e in zip(got, ref.run(None, {"x": x}), strict=True):
                np.testing.assert_allclose(g, e, rtol=1e-6)
        assert _live(s) == 0


@pytest.mark.anyio
async def test_a_full_pool_makes_stages_fall_back_instead_of_waiting() -> None:
    # room for two [4, 8] float buffers (128-byte size class) at a time in the host pool
    async with Session(_chain(), devices=DEVICES, policy=Pinned(_alternate), max_unit_nodes=1,
                       memory=hetsched.Memory(pool_capacity_bytes=256)) as s:
        results: list[tuple[int, dict[str, np.ndarray]]] = []

        async def one(i: int) -> None:
            results.append((i, await s.run({"x": _x(i)})))

        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(one, i)
        for i, out in results:
            for k, v in _expected(_x(i)).items():
                np.testing.assert_allclose(out[k], v, rtol=1e-6)
        st = s.statistics()
        pool = st.pools["host"]
        assert pool.capacity_bytes == 256 and pool.peak_bytes_in_use <= 256
        assert st.stage_runs_bound > 0 and st.stage_runs_unbound > 0
        assert st.stage_runs_bound + st.stage_runs_unbound == 30 * 4
        assert st.stage_runs_to_caller == 30
        assert not st.unbound_stages  # a full pool does not stop binding the stage for good
        assert pool.live_buffers == 0


@pytest.mark.anyio
async def test_a_stage_whose_inferred_output_shape_is_wrong_stops_being_bound() -> None:
    """onnx shape inference gives ReduceSum(keepdims=1) over an empty ``axes`` input no shape
    (not even a rank), which onnxruntime reports as ``[]``, a scalar's shape; it produces
    [1, 1, 1]. The CPU backend tells the two apart by the stage model's declared type, so the
    stage is never bound into a scalar buffer: it runs unbound from the start, the reason
    naming the output (the ONNX backend test ``reduce_l2_default_axes_keepdims_example_expanded``)."""
    model = _model(
        [
            helper.make_node("Mul", ["data", "data"], ["sq"], name="square"),
            helper.make_node("ReduceSum", ["sq", "axes"], ["sum"], name="sum", keepdims=1),
            helper.make_node("Sqrt", ["sum"], ["root"], name="sqrt"),
            helper.make_node("Neg", ["root"], ["y"], name="neg"),
        ],
        [helper.make_tensor_value_info("data", F, [3, 2, 2]), helper.make_tensor_value_info("axes", TensorProto.INT64, [0])],
        [helper.make_tensor_value_info("y", F, [1, 1, 1])],
    )
    data = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    feeds = {"data": data, "axes": np.zeros(0, np.int64)}
    pol = Pinned({"square": "cpu:0", "sum": "cpu:1", "sqrt": "cpu:0", "neg": "cpu:1"})
    async with Session(model, devices=DEVICES, policy=pol, max_unit_nodes=1) as s:
        summed = next(sp.name for sp in s.plan.stages if sp.device == "cpu:1" and "sum" in sp.outputs)
        for _ in range(3):
            (y,) = await s.run(None, feeds)
            assert y.shape == (1, 1, 1)
            np.testing.assert_allclose(y, -np.sqrt((data * data).sum(keepdims=True)), rtol=1e-6)
        st = s.statistics()
        assert st.unbound_stages[summed].startswith("output 'sum' has a data-dependent shape")
        assert _live(s) == 0
