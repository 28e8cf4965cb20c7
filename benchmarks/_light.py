"""The light models shipped in the onnx wheel, prepared for the runtime benchmarks.

The light models compute every weight at run time (``ConstantOfShape`` of a shape
initializer). A whole-model onnxruntime session folds those into constants and prepacks
the convolution weights; once a split puts the weight producer and the convolution in
different stages the weight is a run-time input and cannot be prepacked, which makes a
split model ~50 % slower for reasons that have nothing to do with the runtime. So the
benchmarks fold these nodes into initializers first (``folded``), exactly what a model
exported with its weights looks like; bare onnxruntime and hetsched run the same folded model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def folded(name: str) -> onnx.ModelProto:
    """``light_<name>.onnx`` with its constant ``ConstantOfShape`` nodes folded into initializers."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    keep, new_inits, dropped = [], [], set()
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]]).astype(np.int64)
            value = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"),
                         np.zeros(1, np.float32))
            new_inits.append(numpy_helper.from_array(np.full(shape, value.reshape(-1)[0], value.dtype),
                                                     node.output[0]))
            dropped.add(node.input[0])
        else:
            keep.append(node)
    for i, node in enumerate(keep):
        if not node.name:
            node.name = f"n{i}_{node.op_type}"  # unique names, to place nodes by name
    used = {i for n in keep for i in n.input}
    all_inits = [i for i in g.initializer if i.name not in dropped and i.name in used] + new_inits
    init_names = {i.name for i in all_inits}
    inputs = [i for i in g.input if i.name not in init_names and i.name not in dropped]
    graph = helper.make_graph(keep, g.name, inputs, list(g.output), initializer=all_inits,
                              value_info=list(g.value_info))
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = max(model.ir_version, 4)  # initializers need not be graph inputs
    onnx.checker.check_model(out)
    return out


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def cheapest_cuts(model: onnx.ModelProto, parts: int, *, min_nodes: int = 4) -> list[int]:
    """Positions p (cut between node p-1 and node p) splitting ``model``'s node order into
    ``parts`` pieces where the fewest activation bytes cross, never between a producer and an
    activation that onnxruntime would fuse into it. (For single-request latency the pieces need
    not be balanced; what a cut costs is the tensor crossing it.)"""
    inferred = onnx.shape_inference.infer_shapes(model)
    size: dict[str, int] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        t = vi.type.tensor_type
        dims = [d.dim_value for d in t.shape.dim]
        if dims and all(d > 0 for d in dims):
            size[vi.name] = int(np.prod(dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
    nodes = list(model.graph.node)
    inits = {i.name for i in model.graph.initializer}
    produced_at = {o: i for i, n in enumerate(nodes) for o in n.output}
    last_use: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for v in n.input:
            if v and v not in inits:
                last_use[v] = i
    fused = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh"}
    cost: dict[int, int] = {}
    for p in range(min_nodes, len(nodes) - min_nodes + 1):
        if nodes[p].op_type in fused:
            continue
        crossing = [v for v, at in produced_at.items() if at < p and last_use.get(v, -1) >= p]
        cost[p] = sum(size.get(v, 1 << 30) for v in crossing)
    chosen: list[int] = []
    for p in sorted(cost, key=lambda q: (cost[q], q)):
        if all(abs(p - c) >= min_nodes for c in chosen):
            chosen.append(p)
        if len(chosen) == parts - 1:
            break
    return sorted(chosen)
