"""Shape arithmetic that stays dynamic (a free batch dim, not folded) never crosses a stage
boundary: it goes with the stage that reads it (issue 24)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import Session, load_model, resolve_devices
from hetsched._planning.fold import fold_shape_arithmetic, shape_boundaries
from hetsched._planning.graph import GraphIndex
from hetsched._planning.partition import extract_stage, shape_nodes
from hetsched._planning.plan import Plan, build_plan
from hetsched.policies import Pinned, Unit

F, I64 = TensorProto.FLOAT, TensorProto.INT64
DEVICES = ["cpu:0", "cpu:1", "cpu:0-1"]
SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Concat", "Mul", "Cast", "Div"}


def _flatten_net() -> onnx.ModelProto:
    """``y = Reshape(Relu(x), [batch, -1])`` and ``z = Tanh(x) / float(batch)``, with ``batch``
    read from ``Shape(h)`` at run time (the batch dim is free: nothing to fold)."""
    c = [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("axes", I64, [1], [0]),
         helper.make_tensor("minus1", I64, [1], [-1]), helper.make_tensor("one", I64, [], [1])]
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Shape", ["h"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0, name="gather"),  # 0-d int64
        helper.make_node("Mul", ["b", "one"], ["b1"], name="mul_b"),  # 0-d int64
        helper.make_node("Unsqueeze", ["b1", "axes"], ["b2"], name="unsqueeze"),  # [1] int64
        helper.make_node("Concat", ["b2", "minus1"], ["target"], axis=0, name="concat"),  # [2] int64
        helper.make_node("Reshape", ["h", "target"], ["y"], name="reshape"),
        helper.make_node("Cast", ["b1"], ["bf"], to=F, name="cast"),  # 0-d float
        helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
        helper.make_node("Div", ["t", "bf"], ["z"], name="div"),
    ]
    graph = helper.make_graph(
        nodes, "flatten", [helper.make_tensor_value_info("x", F, ["batch", 4, 3])],
        [helper.make_tensor_value_info("y", F, ["batch", 12]), helper.make_tensor_value_info("z", F, ["batch", 4, 3])],
        initializer=c,
    )
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _split_shape_from_data(unit: Unit) -> str:
    """Shape arithmetic (and the Cast of the batch) on ``cpu:1``, everything else on ``cpu:0``:
    the worst case, every shape value read across a device boundary."""
    return "cpu:1" if set(unit.op_types) <= SHAPE_OPS - {"Div"} else "cpu:0"


def _plans(index: GraphIndex) -> list[Plan]:
    devices = resolve_devices(DEVICES, available_cpus=[0, 1])
    return [build_plan(index, devices, policy, max_unit_nodes=1)
            for policy in (Pinned(_split_shape_from_data), Pinned(lambda u: DEVICES[u.id % 3]),
                           "power-thermal", "heft", "random:1", "random:2")]


def test_the_model_keeps_its_shape_arithmetic_at_a_free_batch_dim() -> None:
    model = _flatten_net()
    folded, stats = fold_shape_arithmetic(model)
    assert stats.folded == 0
    assert {n.op_type for n in folded.graph.node} >= {"Shape", "Gather", "Concat"}


@pytest.mark.parametrize("k", range(6))
def test_no_stage_hands_shape_arithmetic_to_another(k: int) -> None:
    index = GraphIndex(fold_shape_arithmetic(_flatten_net())[0])
    plan = _plans(index)[k]
    assert shape_boundaries(index, plan.stages, plan.graph_outputs) == []
    for stage in plan.stages:
        onnx.checker.check_model(extract_stage(index, stage), full_check=True)


def test_the_pinned_split_really_puts_shape_nodes_on_another_device() -> None:
    index = GraphIndex(_flatten_net())
    plan = _plans(index)[0]
    where = {index.nodes[n].name: s.device for s in plan.stages for n in s.nodes}
    assert where["relu"] == "cpu:0" and where["reshape"] == "cpu:0"
    # the shape nodes are computed where they are read (rematerialized), not on cpu:1
    reshape_stage = next(s for s in plan.stages if any(index.nodes[n].name == "reshape" for n in s.nodes))
    remat = {index.nodes[n].name for n in reshape_stage.rematerialized}
    assert {"shape", "gather", "mul_b", "unsqueeze", "concat"} <= remat | {index.nodes[n].name for n in reshape_stage.nodes}


@pytest.mark.anyio
@pytest.mark.parametrize("batch", [1, 3])
async def test_a_split_plan_matches_onnxruntime_at_any_batch(batch: int) -> None:
    model = _flatten_net()
    x = np.random.default_rng(batch).standard_normal((batch, 4, 3)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    async with Session(model, devices=DEVICES, policy=Pinned(_split_shape_from_data), max_unit_nodes=1) as s:
        got = await s.run({"x": x})
        assert len({st.device for st in s.plan.stages}) >= 1
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-6)
    np.testing.assert_allclose(got["z"], want[1], rtol=1e-6)


def test_shape_nodes_are_the_integer_and_0d_arithmetic_on_shapes() -> None:
    index = GraphIndex(_flatten_net())
    shape = shape_nodes(index)
    names = {index.nodes[n].name for n, s in enumerate(shape) if s}
    assert names == {"shape", "gather", "mul_b", "unsqueeze", "concat", "cast"}
