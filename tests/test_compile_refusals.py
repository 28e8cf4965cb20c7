"""Capabilities by trying: a backend that refuses units at compile time although its
capabilities claim them; the session finds the units, re-plans them elsewhere and says why."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetsched
from hetsched._errors import BackendUnavailableError, CompileError, PartitionError
from hetsched._session._setup import CompileStatistics
from hetsched.backends import BackendHooks, Device
from hetsched.policies import PlacementProblem
from hetsched.testing import FakeBackend, FakeStage, fake_device

pytestmark = pytest.mark.anyio


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w2")
    b = numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("Abs", ["h2"], ["h3"], name="abs"),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"], name="mm2"),
        helper.make_node("Neg", ["h4"], ["h5"], name="neg"),
        helper.make_node("Add", ["h5", "b"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w1, w2, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@dataclass(frozen=True)
class _Stats:
    conversions: int
    cache_hits: int
    seconds: float


class Refuser(FakeBackend):
    """Claims every op but refuses, at compile time, stages with a refused op type or with
    more than ``max_nodes`` nodes (a stage that fails only as a whole)."""

    def __init__(self, name: str, *, refuse_ops: frozenset[str] = frozenset(), max_nodes: int | None = None,
                 broken: bool = False):
        super().__init__(name)
        self.refuse_ops = refuse_ops
        self.max_nodes = max_nodes
        self.broken = broken
        self.attempts: list[tuple[str, tuple[str, ...]]] = []
        self.shapes_seen: list[object] = []
        self._mu = threading.Lock()
        self.hooks = BackendHooks(compile_counters=self)  # declared: it counts its conversions

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> FakeStage:
        ops = tuple(n.op_type for n in model.graph.node)
        with self._mu:
            self.attempts.append((device.name, ops))
            self.shapes_seen.append(device.options.get("shapes"))
        if self.broken:
            raise BackendUnavailableError(f"{device.name}: the toolkit is not installed")
        bad = sorted(set(ops) & self.refuse_ops)
        if bad:
            raise CompileError(f"{device.name}: toolkit says op {bad[0]} is not supported (stage {name})")
        if self.max_nodes is not None and len(ops) > self.max_nodes:
            raise CompileError(f"{device.name}: toolkit ran out of SRAM for {len(ops)} nodes")
        return super().compile(model, device, name=name)

    def statistics(self) -> _Stats:
        with self._mu:
            return _Stats(len(self.attempts), 0, 0.25 * len(self.attempts))


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def prefer_acc(problem: PlacementProblem) -> dict[int, str]:
    """Every unit on ``acc`` where it is offered, else on the CPU."""
    return {u.id: "acc" if "acc" in u.candidates else "cpu:0" for u in problem.units}


def _acc(name: str = "acc", backend: str = "refuser") -> Device:
    return fake_device(name, backend=backend, kind="npu", peak_flops=1e15, mem_bandwidth=1e13)


async def test_refused_unit_goes_to_the_cpu_with_its_reason() -> None:
    model = _model()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    with Refuser("refuser", refuse_ops=frozenset({"Abs"})) as backend:
        async with hetsched.Session(model, devices=["cpu:0", _acc()], policy=prefer_acc, max_unit_nodes=1,
                                    shapes={"x": [2, 8]}) as s:
            plan = s.plan
            placed = {plan.units[u].nodes[0]: plan.placement.assignment[u] for u in plan.placement.assignment}
            # only the refused pair left the accelerator: the units that compiled there stay
            assert placed == {"mm1": "acc", "relu": "acc", "abs": "cpu:0", "mm2": "acc", "neg": "acc", "add": "acc"}
            assert [st.device for st in plan.stages] == ["acc", "cpu:0", "acc"]
            assert [(r.device, plan.units[r.unit].op_types) for r in plan.refused] == [("acc", ("Abs",))]
            assert "acc" not in plan.units[plan.refused[0].unit].candidates
            js = plan.to_json()
            assert [(r["unit"], r["device"]) for r in js["refused"]] == [(plan.refused[0].unit, "acc")]
            assert js["refused"][0]["reason"].startswith("acc: toolkit says op Abs is not supported (stage ")
            assert {st["backend"] for st in js["stages"]} == {"cpu", "refuser"}
            assert all(isinstance(st["flops"], float) and st["flops"] >= 0 for st in js["stages"])
            assert sum(st["flops"] for st in js["stages"]) > 0
            table = plan.table()
            assert "refused" in table and "not on acc" in table and "Abs is not supported" in table
            out = await s.run({"x": x})
            np.testing.assert_allclose(out["y"], _reference(model, x), rtol=1e-5, atol=1e-5)
            stats = s.statistics().compile
            assert stats.refused == 1
            assert stats.conversions == len(backend.attempts) and stats.seconds == pytest.approx(
                0.25 * len(backend.attempts))
            assert all(shp == {"x": (2, 8)} for shp in backend.shapes_seen)

            tried = len(backend.attempts)
            await s.profile({"x": x})
            assert [(r.device, s.plan.units[r.unit].op_types) for r in s.plan.refused] == [("acc", ("Abs",))]
            assert not any("Abs" in ops for _, ops in backend.attempts[tried:]), "a refusal was tried again"
            out = await s.run({"x": x})
            np.testing.assert_allclose(out["y"], _reference(model, x), rtol=1e-5, atol=1e-5)


async def test_unit_refused_everywhere_names_every_reason() -> None:
    with Refuser("refuser", refuse_ops=frozenset({"Abs"})), Refuser("refuser2", refuse_ops=frozenset({"Abs"})), \
            pytest.raises(PartitionError) as err:
        async with hetsched.Session(_model(), devices=[_acc("a1"), _acc("a2", "refuser2")],
                                    max_unit_nodes=1):
            pass
    msg = str(err.value)
    assert "a1: a1: toolkit says op Abs" in msg and "a2: a2: toolkit says op Abs" in msg
    assert err.value.op_types == ["Abs"] and sorted(err.value.devices) == ["a1", "a2"]


async def test_a_stage_that_fails_only_as_a_whole_moves_entirely() -> None:
    model = _model()
    x = np.ones((2, 8), np.float32)
    with Refuser("refuser", max_nodes=2) as backend:
        async with hetsched.Session(model, devices=["cpu:0", _acc()], policy=prefer_acc, max_unit_nodes=1) as s:
            # each unit alone compiles on acc; the stage of all of them did not
            assert len(backend.attempts) >= 1 + len(s.plan.units)
            refused = s.plan.refused
            assert refused and all(r.device == "acc" and "ran out of SRAM" in r.reason for r in refused)
            assert all("acc" not in s.plan.units[r.unit].candidates for r in refused)
            assert len(refused) == len(s.plan.units)  # the whole failed stage leaves acc, bounded in one round
            assert all(st.device == "cpu:0" for st in s.plan.stages)
            np.testing.assert_allclose((await s.run({"x": x}))["y"], _reference(model, x), rtol=1e-5, atol=1e-5)


async def test_other_backend_errors_are_raised_not_refused() -> None:
    with Refuser("refuser", broken=True), pytest.raises(BackendUnavailableError, match="not installed"):
        async with hetsched.Session(_model(), devices=["cpu:0", _acc()], policy="heft", max_unit_nodes=1):
            pass


async def test_without_refusals_the_plan_json_has_an_empty_list() -> None:
    async with hetsched.Session(_model(), devices=["cpu:0"]) as s:
        js = s.plan.to_json()
        assert js["refused"] == [] and "refused" not in s.plan.table()
        assert [st["backend"] for st in js["stages"]] == ["cpu"]
        assert js["stages"][0]["flops"] == pytest.approx(sum(u.flops for u in s.plan.units))
        assert js["stages"][0]["flops"] >= 2 * (2 * 8 * 8) * 2  # at least the two MatMuls' multiply-adds
        assert s.statistics().compile == CompileStatistics()


class _Gate(FakeBackend):
    """Each compile waits until ``parties`` compiles run at once (fails if they run one by one)."""

    def __init__(self, name: str, parties: int):
        super().__init__(name)
        self.barrier = threading.Barrier(parties, timeout=30)

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> FakeStage:
        self.barrier.wait()
        return super().compile(model, device, name=name)


def alternate(problem: PlacementProblem) -> dict[int, str]:
    """Units alternate between the devices ``a1`` and ``a2`` (one stage per unit)."""
    return {u.id: ("a1", "a2")[i % 2] for i, u in enumerate(problem.units)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores to compile in parallel")
async def test_stages_of_one_plan_compile_concurrently() -> None:
    with _Gate("gate", 2):
        async with hetsched.Session(_model(), devices=[_acc("a1", "gate"), _acc("a2", "gate")], policy=alternate,
                                    max_unit_nodes=3) as s:
            assert len(s.plan.stages) == 2
            out = await s.run({"x": np.ones((2, 8), np.float32)})
            np.testing.assert_allclose(out["y"], _reference(_model(), np.ones((2, 8), np.float32)), rtol=1e-5)


async def test_every_compile_error_is_reported() -> None:
    with Refuser("refuser", broken=True), Refuser("refuser2", broken=True), \
            pytest.raises(BackendUnavailableError) as err:
        async with hetsched.Session(_model(), devices=[_acc("a1"), _acc("a2", "refuser2")], policy=alternate,
                                    max_unit_nodes=3):
            pass
    told = str(err.value) + " ".join(getattr(err.value, "__notes__", []))
    assert "a1: the toolkit is not installed" in told and "a2: the toolkit is not installed" in told
