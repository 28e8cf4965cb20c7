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
    mean nothing. Weights become He-scaled normal values (``sqrt(2 / fan_in)``); batch-norm
    scales and variances lie in [0.5, 1) and [0.5, 1.5), biases and means are small normal
    values, so activations stay well inside fp16's range (max 65504) through deep residual
    stacks.

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
    _calibrate_batch_norms(m, rng)
    return m


def _calibrate_batch_norms(m: onnx.ModelProto, rng: np.random.Generator, passes: int = 3) -> None:
    """Set each BatchNormalization's mean/variance to the statistics of its input on a seeded input.

    A trained network's batch norms hold the statistics of the activations they see, which is
    what keeps deep residual stacks in range; random statistics let activations grow until the
    softmax saturates (every input gives the same one-hot output, so accuracy checks pass
    trivially). Later layers depend on earlier ones, so a few passes, each from the last.
    """
    import onnxruntime as ort

    bns = [n for n in m.graph.node if n.op_type == "BatchNormalization" and len(n.input) == 5]
    if not bns:
        return
    inits = {t.name: t for t in m.graph.initializer}
    if any(n.input[3] not in inits or n.input[4] not in inits for n in bns):
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n.input[0]) for n in bns)
    feeds: dict[str, np.ndarray] = {}
    for i in m.graph.input:
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    for _ in range(passes):
        sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        outs = sess.run([n.input[0] for n in bns], feeds)
        for n, x in zip(bns, outs, strict=True):
            x = np.clip(np.nan_to_num(x.astype(np.float64)), -1e15, 1e15)  # pass 1 may overflow float32
            axes = tuple(k for k in range(x.ndim) if k != 1)
            for name, value in ((n.input[3], x.mean(axis=axes)), (n.input[4], x.var(axis=axes) + 1e-3)):
                t = numpy_helper.from_array(value.astype(np.float32), name)
                inits[name].CopyFrom(t)
                for g in (m.graph, probe.graph):
                    for init in g.initializer:
                        if init.name == name:
                            init.CopyFrom(t)


def _weight(rng: np.random.Generator, shape: tuple[int, ...], role: tuple[str, int] | None) -> np.ndarray:
    """A seeded tensor for a weight of ``shape`` read first as input ``role = (op, index)``."""
    if role is not None and role[0] == "BatchNormalization":
        if role[1] == 1:  # scale
            return rng.uniform(0.5, 1.0, shape).astype(np.float32)
        if role[1] == 4:  # variance: positive
            return rng.uniform(0.5, 1.5, shape).astype(np.float32)
        return (rng.standard_normal(shape) * 0.01).astype(np.float32)  # bias, mean
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
    if fan_in:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return (rng.standard_normal(shape) * 0.01).astype(np.float32)  # biases
