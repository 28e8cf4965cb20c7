"""Small ONNX models shared by the runtime tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def neg_relu_chain(n: int = 3) -> onnx.ModelProto:
    """x [16] -> y: Neg, Relu, Neg, ... (``n`` nodes, alternating), float32."""
    nodes = []
    prev = "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node("Neg" if i % 2 == 0 else "Relu", [prev], [out], name=f"op{i}"))
        prev = out
    m = helper.make_model(
        helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def conv_relu_cnn() -> onnx.ModelProto:
    """x [1, 3, 32, 32] -> y [1, 8, 32, 32]: a seeded 3x3 Conv (8 filters) then Relu."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.1, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32, 32])],
                              initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])
