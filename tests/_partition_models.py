"""Hand-built ONNX graphs and the plan/run helpers the partition tests share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import anyio
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from hetsched import Session, resolve_devices
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import load_model
from hetsched._planning.plan import Plan, build_plan
from hetsched.backends import Capabilities
from hetsched.policies import Pinned, PlacementPolicy, RandomPolicy

DEVICES = ["cpu:0", "cpu:1", "cpu:0-1"]
F = TensorProto.FLOAT


def vi(name: str, shape: Sequence[int | str | None] | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def onnx_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto],
               outputs: Sequence[onnx.ValueInfoProto], *, inits: Iterable[onnx.TensorProto] = (),
               functions: Iterable[onnx.FunctionProto] = (),
               extra_opsets: Iterable[onnx.OperatorSetIdProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", 17), *extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def alternating(devs: Sequence[str]) -> Pinned:
    return Pinned(lambda u: devs[u.id % len(devs)])


def plan_for(model: onnx.ModelProto, policy: PlacementPolicy | str | None, *, max_unit_nodes: int | None = 1,
             capabilities: Mapping[str, Capabilities] | None = None,
             devices: Sequence[str] = DEVICES) -> tuple[GraphIndex, Plan]:
    index = GraphIndex(load_model(model))
    plan = build_plan(index, resolve_devices(devices), policy, max_unit_nodes=max_unit_nodes,
                      capabilities=capabilities)
    return index, plan


async def session_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], policy: PlacementPolicy | str | None,
                          max_unit_nodes: int | None = 1) -> tuple[list, Plan]:
    async with Session(model, devices=DEVICES, policy=policy, max_unit_nodes=max_unit_nodes) as s:
        out = await s.run(None, feeds)
        return out, s.plan


def run_all_policies(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, min_stages: int = 2) -> None:
    """Run the model through a Session with one node per unit under several placements; compare with ORT."""
    expected = run_ort(model, feeds)
    policies: list[PlacementPolicy | str] = [alternating(DEVICES), alternating(DEVICES[::-1]), RandomPolicy(0), RandomPolicy(1),
                RandomPolicy(2), "heft", "power-thermal"]
    max_stages = 0
    for pol in policies:
        got, plan = anyio.run(session_outputs, model, feeds, pol)
        max_stages = max(max_stages, len(plan.stages))
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    assert max_stages >= min_stages, "the placements never split the graph: the test would prove nothing"
