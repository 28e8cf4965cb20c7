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
    mean nothing. Weights become He-scaled normal values (``sqrt(2 / fan_in)``); batch norms get
    unit variance, near-zero means and biases and scales in [0.3, 0.6), so activations stay well
    inside fp16's range (max 65504) through deep residual stacks and outputs depend on the input.

    :param model: a path, an embedded model name (``"light_resnet50"``) or a ``ModelProto``.
    :raises ModelError: ``model`` cannot be loaded (see :func:`hetsched.load_model`).
    """
    m = onnx.ModelProto()
    m.CopyFrom(load_model(model))
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    role: dict[str, tuple[str, int]] = {}  # value -> (first consumer's op type, input index)
    for n in m.graph.node:
        for k, name in enumerate(n.input):
            role.setdefault(name, (n.op_type, k))
    keep: list[onnx.NodeProto] = []
    new: list[onnx.TensorProto] = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[n.input[0]])
            new.append(numpy_helper.from_array(_weight(rng, shape, role.get(n.output[0])), n.output[0]))
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


def _weight(rng: np.random.Generator, shape: tuple[int, ...], role: tuple[str, int] | None) -> np.ndarray:
    """A seeded tensor for a weight of ``shape`` read first as input ``role = (op, index)``."""
    if role is not None and role[0] == "BatchNormalization":
        # Statistics of a normalised activation (mean 0, variance 1) and a scale below 1: every
        # residual branch adds less than its input carries, so deep stacks stay in fp16's range.
        if role[1] == 1:  # scale
            return rng.uniform(0.3, 0.6, shape).astype(np.float32)
        if role[1] == 4:  # variance
            return np.ones(shape, np.float32)
        return (rng.standard_normal(shape) * 0.01).astype(np.float32)  # bias, mean
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
    if fan_in:
        return (rng.standard_normal(shape) * float(np.sqrt(2.0 / fan_in))).astype(np.float32)
    return (rng.standard_normal(shape) * 0.01).astype(np.float32)  # biases
