"""Partition edge cases on hand-built ONNX graphs: units, stages, extraction, execution."""

from __future__ import annotations

import random
from collections.abc import Sequence

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import PartitionError, Session, resolve_devices
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import load_model
from hetsched._planning.partition import constant_nodes, compute_units, extract_stage
from hetsched._planning.plan import Plan, build_plan
from hetsched.backends import Capabilities
from hetsched.policies import Pinned, RandomPolicy

DEVICES = ["cpu:0", "cpu:1", "cpu:0-1"]
F = TensorProto.FLOAT


def _vi(name: str, shape: Sequence[int] | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, *, inits=(), functions=(), extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", 17), *extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _alternating(devs: Sequence[str]) -> Pinned:
    return Pinned(lambda u: devs[u.id % len(devs)])


def _plan(model: onnx.ModelProto, policy, *, max_unit_nodes: int | None = 1,
          capabilities=None, devices=DEVICES) -> tuple[GraphIndex, Plan]:
    index = GraphIndex(load_model(model))
    plan = build_plan(index, resolve_devices(devices), policy, max_unit_nodes=max_unit_nodes,
                      capabilities=capabilities)
    return index, plan


async def _session_outputs(model: onnx.ModelProto, feeds, policy, max_unit_nodes=1) -> tuple[list, Plan]:
    async with Session(model, devices=DEVICES, policy=policy, max_unit_nodes=max_unit_nodes) as s:
        out = await s.run(None, feeds)
        return out, s.plan


def _run_all_policies(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, min_stages: int = 2) -> None:
    """Run the model through a Session with one node per unit under several placements; compare with ORT."""
    expected = _ort(model, feeds)
    policies = [_alternating(DEVICES), _alternating(DEVICES[::-1]), RandomPolicy(0), RandomPolicy(1),
                RandomPolicy(2), "heft", "power-thermal"]
    max_stages = 0
    for pol in policies:
        got, plan = anyio.run(_session_outputs, model, feeds, pol)
        max_stages = max(max_stages, len(plan.stages))
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    assert max_stages >= min_stages, "the placements never split the graph: the test would prove nothing"


# -- nested graphs reading outer-scope values ---------------------------------------------------


def _if_model() -> onnx.ModelProto:
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["a", "w"], ["t"])], "then", [], [_vi("t", [2, 3])])
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["a", "x"], ["e0"]), helper.make_node("Add", ["e0", "b"], ["e"])],
        "else", [], [_vi("e", [2, 3])])
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"], name="add"),
        helper.make_node("Neg", ["x"], ["b"], name="neg"),
        helper.make_node("If", ["cond"], ["r"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    w = helper.make_tensor("w", F, [2, 3], [0.5, -1.0, 2.0, 3.0, -0.25, 1.5])
    return _model(nodes, [_vi("x", [2, 3]), _vi("cond", [], TensorProto.BOOL)], [_vi("y", [2, 3])], inits=[w])


def test_graph_index_counts_outer_scope_reads_as_inputs_of_the_if_node() -> None:
    index = GraphIndex(_if_model())
    if_ref = next(n for n in index.nodes if n.op_type == "If")
    assert set(if_ref.inputs) == {"cond", "a", "w", "x", "b"}
    add, neg = (next(n.index for n in index.nodes if n.name == nm) for nm in ("add", "neg"))
    assert set(index.preds[if_ref.index]) == {add, neg}


@pytest.mark.parametrize("cond", [True, False])
def test_if_body_reads_outer_scope_values_across_stages(cond: bool) -> None:
    model = _if_model()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    feeds = {"x": x, "cond": np.array(cond)}
    # The If node on its own stage: outer values produced elsewhere must be its stage inputs.
    index, plan = _plan(model, Pinned({"if": "cpu:1"}, default="cpu:0"))
    if_id = next(n.index for n in index.nodes if n.op_type == "If")
    (if_stage,) = [s for s in plan.stages if if_id in s.nodes]
    assert if_stage.device == "cpu:1"
    assert {"a", "b", "x", "cond"} <= set(if_stage.inputs)
    sub = extract_stage(index, if_stage)
    onnx.checker.check_model(sub)
    assert [i.name for i in sub.graph.initializer] == ["w"]
    _run_all_policies(model, feeds)


def _loop_model() -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Add", ["v_in", "a"], ["v_out"]),
            helper.make_node("Mul", ["v_out", "k"], ["scan_out"]),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL), _vi("v_in", [3])],
        [_vi("c_out", [], TensorProto.BOOL), _vi("v_out", [3]), _vi("scan_out", [3])],
    )
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["a"], name="sig"),
        helper.make_node("Abs", ["x"], ["v0"], name="abs"),
        helper.make_node("Loop", ["trip", "", "v0"], ["v_final", "scans"], name="loop", body=body),
        helper.make_node("Tanh", ["v_final"], ["y"], name="tanh"),
    ]
    k = helper.make_tensor("k", F, [3], [1.0, -2.0, 0.5])
    return _model(nodes, [_vi("x", [3]), _vi("trip", [], TensorProto.INT64)],
                  [_vi("y", [3]), _vi("scans", [None, 3])], inits=[k])


def test_loop_body_reads_outer_scope_value() -> None:
    model = _loop_model()
    index, plan = _plan(model, Pinned({"loop": "cpu:0-1"}, default="cpu:0"))
    loop_id = next(n.index for n in index.nodes if n.op_type == "Loop")
    (loop_stage,) = [s for s in plan.stages if loop_id in s.nodes]
    assert loop_stage.device == "cpu:0-1"
    assert {"a", "v0", "trip"} <= set(loop_stage.inputs)
    sub = extract_stage(index, loop_stage)
    assert {i.name for i in sub.graph.initializer} == {"k"}
    feeds = {"x": np.array([0.5, -1.0, 2.0], np.float32), "trip": np.array(4, np.int64)}
    _run_all_policies(model, feeds)


@pytest.mark.xfail(strict=True, reason=(
    "ONNX shape inference gives the Loop output 'v_final' a type without a shape; extract_stage copies it "
    "into the stage's graph outputs and onnx.checker requires a shape on graph inputs/outputs "
    "(onnxruntime accepts the model, so execution works)"))
def test_extracted_loop_stage_passes_the_checker() -> None:
    index, plan = _plan(_loop_model(), Pinned({"loop": "cpu:0-1"}, default="cpu:0"))
    for s in plan.stages:
        onnx.checker.check_model(extract_stage(index, s))


# -- boundary values ------------------------------------------------------------------------------


def test_shared_initializers_each_stage_carries_only_what_it_uses() -> None:
    w = helper.make_tensor("W", F, [3, 3], np.linspace(-1, 1, 9).astype(np.float32).tolist())
    b1 = helper.make_tensor("B1", F, [3], [0.1, 0.2, 0.3])
    b2 = helper.make_tensor("B2", F, [3], [1.0, 2.0, 3.0])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "B1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "W"], ["m2"], name="mm2"),
        helper.make_node("Add", ["m2", "B2"], ["y"], name="add2"),
    ]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])], inits=[w, b1, b2])
    index, plan = _plan(model, Pinned({"mm1": "cpu:0", "add1": "cpu:0", "relu": "cpu:1",
                                       "mm2": "cpu:0-1", "add2": "cpu:0-1"}))
    assert [s.device for s in plan.stages] == ["cpu:0", "cpu:1", "cpu:0-1"]
    inits = []
    for s in plan.stages:
        sub = extract_stage(index, s)
        onnx.checker.check_model(sub)
        inits.append(sorted(i.name for i in sub.graph.initializer))
        # Initializers are not stage inputs (they are not fed across the boundary).
        assert not {"W", "B1", "B2"} & set(s.inputs)
    assert inits == [["B1", "W"], [], ["B2", "W"]]
    _run_all_policies(model, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})


def test_input_that_is_also_a_graph_output() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"], name="neg")]
    model = _model(nodes, [_vi("x", [4])], [_vi("y", [4]), _vi("x", [4])])
    feeds = {"x": np.array([-1.0, 0.0, 2.0, -3.5], np.float32)}
    index, plan = _plan(model, _alternating(DEVICES))
    assert all("x" not in s.outputs for s in plan.stages)
    got, _ = anyio.run(_session_outputs, model, feeds, _alternating(DEVICES))
    np.testing.assert_array_equal(got[1], feeds["x"])
    np.testing.assert_array_equal(got[0], -np.maximum(feeds["x"], 0))
    _run_all_policies(model, feeds)


def test_value_consumed_by_three_stages() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="pa"),
        helper.make_node("Neg", ["a"], ["b"], name="cb"),
        helper.make_node("Exp", ["a"], ["c"], name="cc"),
        helper.make_node("Add", ["a", "c"], ["d"], name="cd"),
        helper.make_node("Sum", ["b", "c", "d"], ["y"], name="sum"),
    ]
    model = _model(nodes, [_vi("x", [5])], [_vi("y", [5])])
    pol = Pinned({"pa": "cpu:0", "cb": "cpu:1", "cc": "cpu:0-1", "cd": "cpu:1", "sum": "cpu:0"})
    index, plan = _plan(model, pol)
    readers = [s for s in plan.stages if "a" in s.inputs]
    assert len(readers) == 3
    (producer,) = [s for s in plan.stages if "a" in s.outputs]
    assert all(producer.id in s.deps for s in readers)
    feeds = {"x": np.linspace(-2, 2, 5).astype(np.float32)}
    got, _ = anyio.run(_session_outputs, model, feeds, pol)
    np.testing.assert_allclose(got[0], _ort(model, feeds)[0], rtol=1e-6)
    _run_all_policies(model, feeds)


def test_value_both_stage_output_and_graph_output() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Mul", ["a", "b"], ["y"], name="mul"),
    ]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3]), _vi("a", [3])])
    pol = Pinned({"relu": "cpu:0"}, default="cpu:1")
    index, plan = _plan(model, pol)
    first, second = plan.stages
    assert first.outputs == ("a",)
    assert "a" in second.inputs and "a" not in second.outputs
    feeds = {"x": np.array([-1.0, 2.0, 3.0], np.float32)}
    got, _ = anyio.run(_session_outputs, model, feeds, pol)
    np.testing.assert_array_equal(got[1], np.maximum(feeds["x"], 0))
    _run_all_policies(model, feeds)


def test_model_local_functions_go_only_to_stages_calling_them() -> None:
    fn = helper.make_function(
        "local", "AddMul", ["p", "q"], ["o"],
        [helper.make_node("Add", ["p", "q"], ["s"]), helper.make_node("Mul", ["s", "q"], ["o"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )
    unused = helper.make_function(
        "local", "Unused", ["p"], ["o"], [helper.make_node("Neg", ["p"], ["o"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("AddMul", ["a", "x"], ["b"], name="call", domain="local"),
        helper.make_node("Tanh", ["b"], ["y"], name="tanh"),
    ]
    model = _model(nodes, [_vi("x", [4])], [_vi("y", [4])], functions=[fn, unused],
                   extra_opsets=[helper.make_opsetid("local", 1)])
    index, plan = _plan(model, _alternating(DEVICES))
    assert len(plan.stages) == 3
    funcs = []
    for s in plan.stages:
        sub = extract_stage(index, s)
        onnx.checker.check_model(sub)
        assert {o.domain for o in sub.opset_import} >= {"", "local"}
        funcs.append([f.name for f in sub.functions])
    assert funcs == [[], ["AddMul"], []]
    _run_all_policies(model, {"x": np.array([-1.0, 0.5, 2.0, -0.25], np.float32)})


def test_constant_feeding_two_stages_is_rematerialized() -> None:
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const",
                         value=helper.make_tensor("cv", F, [3], [1.0, 2.0, 3.0])),
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "c"], ["y"], name="mul"),
    ]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3])])
    index, plan = _plan(model, Pinned({"const": "cpu:0", "add": "cpu:1", "mul": "cpu:0-1"}))
    const_id = next(n.index for n in index.nodes if n.op_type == "Constant")
    assert all("c" not in s.inputs for s in plan.stages)
    assert sum(const_id in s.rematerialized for s in plan.stages) == 2
    _run_all_policies(model, {"x": np.array([1.0, -2.0, 0.5], np.float32)})


# -- capabilities and units -----------------------------------------------------------------------


def _chain(ops: Sequence[str], width: int = 4) -> onnx.ModelProto:
    nodes = []
    prev = "x"
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"v{i}"
        nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}_{op}"))
        prev = out
    return _model(nodes, [_vi("x", [width])], [_vi("y", [width])])


def test_unsupported_everywhere_lists_op_types_and_devices() -> None:
    model = _chain(["Relu", "Exp", "Neg", "Sin", "Exp"])
    caps = {"cpu:0": Capabilities.ops(["Relu"]), "cpu:1": Capabilities.ops(["Relu", "Neg"])}
    index = GraphIndex(load_model(model))
    with pytest.raises(PartitionError) as info:
        build_plan(index, resolve_devices(["cpu:0", "cpu:1"]), "heft", capabilities=caps)
    err = info.value
    assert err.op_types == ["Exp", "Sin"]
    assert err.devices == ["cpu:0", "cpu:1"]
    assert "Exp" in str(err) and "Sin" in str(err) and "cpu:0" in str(err) and "cpu:1" in str(err)
    assert "Relu" not in str(err).split("devices")[0]


def test_unsupported_op_in_custom_domain_is_named_with_its_domain() -> None:
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [_vi("x", [2])], [_vi("y", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.example", 1)])
    index = GraphIndex(model)
    caps = {"cpu:0": Capabilities.ops(["Relu"])}
    with pytest.raises(PartitionError, match="com.example::Frobnicate"):
        compute_units(index, ["cpu:0"], caps)


def test_units_are_maximal_connected_runs_with_the_same_capable_set() -> None:
    # cpu:1 runs only Relu/Neg: masks along the chain are {0,1},{0,1},{0},{0,1},{0,1},{0}.
    model = _chain(["Relu", "Neg", "Exp", "Relu", "Neg", "Sin"])
    index = GraphIndex(load_model(model))
    caps = {"cpu:0": Capabilities.everything(), "cpu:1": Capabilities.ops(["Relu", "Neg"])}
    units = compute_units(index, ["cpu:0", "cpu:1"], caps)
    assert [len(u.nodes) for u in units] == [2, 1, 2, 1]
    assert [u.mask for u in units] == [0b11, 0b01, 0b11, 0b01]
    # Through build_plan, a policy may only use cpu:1 for the Relu/Neg units.
    plan = build_plan(index, resolve_devices(["cpu:0", "cpu:1"]), Pinned(lambda u: u.candidates[-1]),
                      capabilities=caps)
    assert [u.candidates for u in plan.units] == [("cpu:0", "cpu:1"), ("cpu:0",)] * 2
    assert [s.device for s in plan.stages] == ["cpu:1", "cpu:0", "cpu:1", "cpu:0"]


def test_same_mask_but_unconnected_nodes_are_separate_units() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),
        helper.make_node("Neg", ["x"], ["b"], name="b"),
        helper.make_node("Exp", ["a"], ["c"], name="c"),
    ]
    model = _model(nodes, [_vi("x", [2])], [_vi("b", [2]), _vi("c", [2])])
    index = GraphIndex(load_model(model))
    units = compute_units(index, ["cpu:0"], {"cpu:0": Capabilities.everything()})
    assert sorted(sorted(index.nodes[n].name for n in u.nodes) for u in units) == [["a", "c"], ["b"]]


def test_interleaved_capabilities_keep_same_mask_nodes_together() -> None:
    # Two independent branches alternating between masks: the topological order that
    # prefers the current mask must still yield one unit per branch segment.
    nodes = []
    for br in ("p", "q"):
        prev = "x"
        for i, op in enumerate(["Relu", "Relu", "Exp", "Exp"]):
            out = f"{br}{i}"
            nodes.append(helper.make_node(op, [prev], [out], name=out))
            prev = out
    nodes.append(helper.make_node("Add", ["p3", "q3"], ["y"], name="add"))
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    index = GraphIndex(load_model(model))
    caps = {"cpu:0": Capabilities.everything(), "cpu:1": Capabilities.ops(["Relu"])}
    units = compute_units(index, ["cpu:0", "cpu:1"], caps)
    names = sorted(sorted(index.nodes[n].name for n in u.nodes) for u in units)
    # Relu runs (mask 11) of each branch; the Exp runs of both branches plus Add are one
    # connected run with mask 01.
    assert names == [["add", "p2", "p3", "q2", "q3"], ["p0", "p1"], ["q0", "q1"]]


@pytest.mark.parametrize(("limit", "sizes"), [(None, [10]), (1, [1] * 10), (3, [3, 3, 3, 1]), (10, [10]),
                                             (4, [4, 4, 2])])
def test_max_unit_nodes_cuts_units(limit: int | None, sizes: list[int]) -> None:
    model = _chain(["Relu", "Neg"] * 5)
    index = GraphIndex(load_model(model))
    units = compute_units(index, ["cpu:0"], {"cpu:0": Capabilities.everything()}, max_unit_nodes=limit)
    assert [len(u.nodes) for u in units] == sizes
    assert [n for u in units for n in u.nodes] == list(range(10))


def test_max_unit_nodes_must_be_positive() -> None:
    index = GraphIndex(load_model(_chain(["Relu"])))
    with pytest.raises(ValueError, match="max_unit_nodes"):
        compute_units(index, ["cpu:0"], {"cpu:0": Capabilities.everything()}, max_unit_nodes=0)


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
    return _model(nodes, [_vi("x0", [4]), _vi("x1", [4])], [_vi(o, [4]) for o in outs])


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
    policy = rng.choice([RandomPolicy(seed), "heft", "power-thermal", _alternating(names)])
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
            # Only a constant-computing node whose stage was dropped as dead: it lives on
            # where rematerialized.
            assert constant_nodes(index)[nid] and nid in remat
        else:
            assert c == 1
    for s in plan.stages:
        for u in s.units:
            assert plan.placement.assignment[u] == s.device
    # Every unit is on a capable device.
    for u in plan.units:
        assert plan.placement.assignment[u.id] in u.candidates

    # Extract and run stage by stage in id order; compare with the whole model.
    feeds = {"x0": np.array([0.5, -1.5, 2.0, -0.25], np.float32),
             "x1": np.array([-1.0, 0.75, 0.1, 3.0], np.float32)}
    values = dict(feeds)
    for s in plan.stages:
        sub = extract_stage(index, s)
        onnx.checker.check_model(sub)
        assert [i.name for i in sub.graph.input] == list(s.inputs)
        assert [o.name for o in sub.graph.output] == list(s.outputs)
        out = _ort(sub, {k: values[k] for k in s.inputs})
        values.update(zip(s.outputs, out))
    expected = _ort(model, feeds)
    for name, e in zip(index.graph_outputs, expected):
        np.testing.assert_allclose(values[name], e, rtol=1e-6, atol=1e-6)


def test_constant_subgraphs_are_recomputed_where_they_are_read() -> None:
    """A weight computed from initializers (ConstantOfShape, then Mul) is folded into the
    consuming stage instead of crossing a boundary as a run-time input."""
    from onnx import TensorProto, helper, numpy_helper

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
    import onnxruntime as ort

    got = ort.InferenceSession(stage_model.SerializeToString()).run(None, {"r": np.maximum(x, 0)})[0]
    np.testing.assert_allclose(got, want)
