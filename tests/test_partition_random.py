"""Partition property test: random DAGs under random placements make valid stages that compute the same."""

from __future__ import annotations

import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import resolve_devices
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import load_model
from hetsched._planning.partition import constant_nodes, extract_stage, shape_nodes
from hetsched._planning.plan import Plan, build_plan
from hetsched.backends import Capabilities
from hetsched.policies import Pinned, PlacementPolicy, RandomPolicy

from _partition_models import (
    F,
    alternating,
    onnx_model,
    run_ort,
    vi,
)

# -- property: random DAGs, random placements --------------------------------------------------


def _random_dag(rng: random.Random, n: int) -> onnx.ModelProto:
    unary = ["Relu", "Neg", "Tanh", "Sigmoid", "Abs"]
    binary = ["Add", "Mul", "Sub", "Max"]
    values = ["x0", "x1"]
    nodes = []
    consumed: set[str] = set()
    for i in range(n):
        out = f"v{i}"
        r = rng.random()
        if r < 0.1:
            vals = [round(rng.uniform(-1, 1), 3) for _ in range(4)]
            nodes.append(helper.make_node("Constant", [], [out], name=f"n{i}",
                                          value=helper.make_tensor(f"c{i}", F, [4], vals)))
        elif r < 0.5:
            src = rng.choice(values[-6:] if rng.random() < 0.7 else values)
            nodes.append(helper.make_node(rng.choice(unary), [src], [out], name=f"n{i}"))
            consumed.add(src)
        else:
            a, b = rng.choice(values), rng.choice(values[-4:])
            nodes.append(helper.make_node(rng.choice(binary), [a, b], [out], name=f"n{i}"))
            consumed.update((a, b))
        values.append(out)
    # Every sink is a graph output, plus one random intermediate value.
    outs = [v for v in values[2:] if v not in consumed]
    extra = rng.choice(values[2:])
    if extra not in outs:
        outs.append(extra)
    return onnx_model(nodes, [vi("x0", [4]), vi("x1", [4])], [vi(o, [4]) for o in outs])


def _stage_graph_is_acyclic(plan: Plan) -> bool:
    indeg = {s.id: len(s.deps) for s in plan.stages}
    succs: dict[int, list[int]] = {s.id: [] for s in plan.stages}
    for s in plan.stages:
        for d in s.deps:
            succs[d].append(s.id)
    ready = [k for k, v in indeg.items() if v == 0]
    seen = 0
    while ready:
        k = ready.pop()
        seen += 1
        for t in succs[k]:
            indeg[t] -= 1
            if indeg[t] == 0:
                ready.append(t)
    return seen == len(plan.stages)


@pytest.mark.parametrize("seed", range(24))
def test_random_dags_make_acyclic_valid_stages_that_compute_the_same(seed: int) -> None:
    rng = random.Random(seed)
    model = _random_dag(rng, rng.randint(5, 40))
    index = GraphIndex(load_model(model))
    names = ["cpu:0", "cpu:1", "cpu:0-1"]
    caps = {"cpu:0": Capabilities.everything(), "cpu:1": Capabilities.everything(),
            "cpu:0-1": Capabilities.ops(["Relu", "Add", "Constant", "Neg", "Mul"])}
    max_unit = rng.choice([1, 1, 2, 3, None])
    choices: list[PlacementPolicy | str] = [RandomPolicy(seed), "heft", "power-thermal", alternating(names)]
    policy = rng.choice(choices)
    if isinstance(policy, Pinned):
        policy = Pinned(lambda u: u.candidates[u.id % len(u.candidates)])
    plan = build_plan(index, resolve_devices(names), policy, max_unit_nodes=max_unit, capabilities=caps)

    assert _stage_graph_is_acyclic(plan)
    # Stage ids are a topological order (stages are intervals of one): deps come first.
    assert all(d < s.id for s in plan.stages for d in s.deps)
    counts = [0] * len(index.nodes)
    for s in plan.stages:
        for nid in s.nodes:
            counts[nid] += 1
    remat = {n for s in plan.stages for n in s.rematerialized}
    for nid, c in enumerate(counts):
        if c == 0:
            # Only a constant-computing node (or shape arithmetic) whose stage was dropped as
            # dead: it lives on where rematerialized.
            assert (constant_nodes(index)[nid] or shape_nodes(index)[nid]) and nid in remat
        else:
            assert c == 1
    for s in plan.stages:
        for u in s.units:
            assert plan.placement.assignment[u] == s.device
    # Every unit is on a capable device.
    for unit in plan.units:
        assert plan.placement.assignment[unit.id] in unit.candidates

    # Extract and run stage by stage in id order; compare with the whole model.
    feeds = {"x0": np.array([0.5, -1.5, 2.0, -0.25], np.float32),
             "x1": np.array([-1.0, 0.75, 0.1, 3.0], np.float32)}
    values = dict(feeds)
    for s in plan.stages:
        sub = extract_stage(index, s)
        onnx.checker.check_model(sub)
        assert [i.name for i in sub.graph.input] == list(s.inputs)
        assert [o.name for o in sub.graph.output] == list(s.outputs)
        out = run_ort(sub, {k: values[k] for k in s.inputs})
        values.update(zip(s.outputs, out, strict=True))
    expected = run_ort(model, feeds)
    for name, e in zip(index.graph_outputs, expected, strict=True):
        np.testing.assert_allclose(values[name], e, rtol=1e-6, atol=1e-6)


def test_constant_subgraphs_are_recomputed_where_they_are_read() -> None:
    """A weight computed from initializers (ConstantOfShape, then Mul) is folded into the
    consuming stage instead of crossing a boundary as a run-time input."""
    from onnx import helper, numpy_helper

    shape = numpy_helper.from_array(np.array([4, 4], np.int64), "wshape")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    nodes = [
        helper.make_node("ConstantOfShape", ["wshape"], ["w0"], name="w0",
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
        helper.make_node("Mul", ["w0", "scale"], ["w"], name="w"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="mm"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [shape, scale])
    model = load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    index = GraphIndex(model)
    assert constant_nodes(index) == [True, True, False, False]
    pins = {"w0": "cpu:0", "w": "cpu:1", "relu": "cpu:0", "mm": "cpu:1"}
    plan = build_plan(index, resolve_devices(["cpu:0", "cpu:1"]), Pinned(pins), max_unit_nodes=1)
    mm_stage = next(s for s in plan.stages if 3 in s.nodes)
    assert set(mm_stage.rematerialized) >= {0, 1} or 1 in mm_stage.nodes
    assert "w" not in mm_stage.inputs  # the weight is not fed across the boundary
    stage_model = extract_stage(index, mm_stage)
    onnx.checker.check_model(stage_model)
    assert {i.name for i in stage_model.graph.input} == {"r"}
    x = np.array([[1, -2, 3, -4], [0.5, 0.5, -1, 2]], np.float32)
    want = np.maximum(x, 0) @ np.full((4, 4), 1.0, np.float32)

    got = ort.InferenceSession(stage_model.SerializeToString()).run(None, {"r": np.maximum(x, 0)})[0]
    np.testing.assert_allclose(got, want)
