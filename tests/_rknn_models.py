"""Models shared by the RKNN tests (seeded random weights: activations stay in fp16's range)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def conv_net(seed: int = 0, opset: int = 13) -> onnx.ModelProto:
    """A small seeded-random CNN: conv-relu-pool-conv-relu-gap-flatten-gemm, 10 logits."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)

    inits = [w("w1", 8, 3, 3, 3), w("b1", 8), w("w2", 16, 8, 3, 3), w("b2", 16), w("fc", 10, 16), w("fcb", 10)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, name="fc"),
    ]
    m = helper.make_model(helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, [1, 3, 32, 32])],
                                            [helper.make_tensor_value_info("y", F, [1, 10])], initializer=inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m
