"""Models for tests and benchmarks of accelerator backends."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from hetsched._planning.model import ModelSource, load_model

__all__ = ["with_seeded_weights"]


def with_seeded_weights(model: ModelSource, seed: int = 0) -> onnx.ModelProto:
    """``model`` with every weight made by ``ConstantOfShape`` replaced by seeded random initializers.

    The light models shipped in the onnx wheel (``light_resnet50``, ``light_squeezenet``, ...)
    build their weights with ``ConstantOfShape``: constant weights make activations overflow
    fp16 (an NPU's precision) and outputs independent of the input, so accuracy checks on them
    mean nothing. Weights become He-scaled normal values (``sqrt(2 / fan_in)``), 1-D tensors
    (biases, batch-norm statistics) small positive values, so activations stay in fp16's range.

    :param model: a path, an embedded model name (``"light_resnet50"``) or a ``ModelProto``.
    :raises ModelError: ``model`` cannot be loaded (see :func:`hetsched.load_model`).
    """
    m = onnx.ModelProto()
    m.CopyFrom(load_model(model))
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    keep: list[onnx.NodeProto] = []
    new: list[onnx.TensorProto] = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[n.input[0]])
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
            if fan_in:
                arr = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
            else:  # biases, scales, running means/variances: small and positive (a variance must be)
                arr = rng.uniform(0.5, 1.0, shape) if len(shape) == 1 else rng.standard_normal(shape) * 0.01
            new.append(numpy_helper.from_array(arr.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    used = {i for n in keep for i in n.input} | {o.name for o in m.graph.output}
    inits = [t for t in m.graph.initializer if t.name in used] + new
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    init_names = {t.name for t in inits}
    inputs = [i for i in m.graph.input if i.name not in init_names and i.name in used]
    del m.graph.input[:]
    m.graph.input.extend(inputs)
    m.ir_version = max(m.ir_version, 4)  # IR 3 lists every initializer as a graph input
    onnx.checker.check_model(m)
    return m
