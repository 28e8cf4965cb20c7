"""Small ONNX models shared by the runtime tests."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

F = TensorProto.FLOAT


def make_model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    """An opset-17 model of ``nodes``, checked by ``onnx.checker``."""
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=inits or []),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reshape_model() -> onnx.ModelProto:
    """y = relu(reshape(abs(x), s)), x: float32 [6], s: int64 [2] a run-time shape: a bad ``s``
    fails the reshape node (its own stage with ``max_unit_nodes=1``) while abs and relu are fine."""
    return make_model(
        [
            helper.make_node("Abs", ["x"], ["a"], name="abs"),
            helper.make_node("Reshape", ["a", "s"], ["r"], name="reshape"),
            helper.make_node("Relu", ["r"], ["y"], name="relu"),
        ],
        [helper.make_tensor_value_info("x", F, [6]), helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", F, [None, None])],
    )
