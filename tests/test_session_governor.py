"""A Session given a governor tells it the inference phases itself."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import Phase

pytestmark = pytest.mark.anyio


class Recorder:
    def __init__(self) -> None:
        self.phases: list[Phase] = []
        self._lock = threading.Lock()

    def on_phase(self, phase: Phase) -> None:
        with self._lock:
            self.phases.append(phase)


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="a"), helper.make_node("Neg", ["r"], ["y"], name="b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


async def test_one_request_walks_the_inference_phases() -> None:
    rec = Recorder()
    async with hetsched.Session(_model(), devices=["cpu:0"], governor=rec) as s:
        await s.run({"x": np.ones(8, np.float32)})
    assert rec.phases[0] == Phase.PREPROCESS
    assert Phase.INFER in rec.phases
    assert rec.phases[-2:] == [Phase.POSTPROCESS, Phase.IDLE]


async def test_idle_only_when_nothing_is_in_flight() -> None:
    import anyio

    rec = Recorder()
    async with hetsched.Session(_model(), devices=["cpu:0", "cpu:1"], policy="random:3", max_unit_nodes=1,
                                governor=rec) as s, anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(s.run, {"x": np.ones(8, np.float32)})
    assert rec.phases[-1] == Phase.IDLE
    assert rec.phases.count(Phase.IDLE) <= rec.phases.count(Phase.PREPROCESS)
