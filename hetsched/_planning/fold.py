"""Fold the shape arithmetic that is constant once the input shapes are fixed (issue 24).

Exporters (torch.onnx with dynamic axes, paddle2onnx) compute reshape targets, resize sizes,
slice bounds and anchor grids from the tensors' runtime shapes: ``Shape -> Gather -> Unsqueeze
-> Concat -> Reshape``, ``Shape -> Gather -> Cast -> Range``. Once the inputs' shapes are fixed
(``shapes=`` / ``--shape``, or a static model) every such value is a constant. Left in the
graph, the chain is partitioned like any other subgraph and its 0-d and int64 tensors cross
stage boundaries, where an accelerator toolkit (RKNN) drops them and the stage's output count
no longer matches. :func:`fold_shape_arithmetic` replaces each such node by an initializer
before the model is indexed, so nothing of it is left to partition.

Why our own folder and not onnxruntime's graph optimizer (``optimized_model_filepath`` at
``ORT_ENABLE_BASIC``) or onnxslim: both fold, but they also fuse Conv+BatchNorm/Add/Mul, drop
Identity/Dropout and rename values, so every static model's graph, node indices, unit keys
and compile-cache keys would change with the onnxruntime (or onnxslim) version, and onnxslim is
one more dependency. Here only the values that *derive from a runtime shape* are folded
(seeds: ``Shape``/``Size`` of a tensor whose shape inference gives static dims, then every node
whose inputs are all such values or constants), each evaluated with onnx's own reference
implementation (``onnx.reference``), onnx shape inference re-run between rounds (a folded
``Reshape`` target makes the next shapes static). A model without shape arithmetic comes back
as the very same object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = [
    "CONTROL_FLOW_DIMS",
    "FOLD",
    "FoldConfig",
    "FoldStatistics",
    "ShapeBoundary",
    "control_flow_reads",
    "fold_shape_arithmetic",
    "relax_control_flow_inputs",
    "restore_control_flow_dims",
    "shape_boundaries",
]


@dataclass(frozen=True)
class FoldConfig:
    """Limits of the folder."""

    max_elements: int = 1 << 20
    """A shape-derived value larger than this stays a node (an anchor grid at 1280x1280 has
    ~70k elements; a value this big is no longer shape arithmetic)."""
    max_rounds: int = 8
    """Fold / re-infer rounds (each round's folded reshapes make the next round's shapes static)."""


FOLD = FoldConfig()

CONTROL_FLOW_DIMS = "hetsched.control_flow_fixed_dims"
"""Stage-model metadata key: ``{input: fixed dims}`` of the inputs :func:`relax_control_flow_inputs`
declared free for onnxruntime."""

_SEEDS = frozenset({"Shape", "Size"})
_NEVER = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "Constant", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "SplitToSequence",
})


@dataclass(frozen=True)
class FoldStatistics:
    folded: int
    """Nodes replaced by initializers."""
    removed_constants: int
    """``Constant`` nodes left without consumers and dropped."""
    rounds: int


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Every value's shape where inference (with data propagation) gives all dims."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # onnx raises several types; nothing is folded from a graph it cannot infer
        inferred = model
    out: dict[str, tuple[int, ...]] = {}
    g = inferred.graph
    for vi in (*g.input, *g.value_info, *g.output):
        t = vi.type
        if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
            continue
        dims = t.tensor_type.shape.dim
        if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            out[vi.name] = tuple(int(d.dim_value) for d in dims)
    for init in g.initializer:
        out[init.name] = tuple(init.dims)
    return out


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _evaluate(node: onnx.NodeProto, values: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """The node's outputs from onnx's reference implementation, or None where it cannot say."""
    from onnx.reference import ReferenceEvaluator

    names = [f"in{k}" if v is not None else "" for k, v in enumerate(values)]
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in zip(names, values, strict=True) if v is not None]
    outs = [f"out{k}" for k in range(len(node.output))]
    mini = helper.make_node(node.op_type, names, outs, domain=node.domain)
    mini.attribute.extend(node.attribute)
    graph = helper.make_graph([mini], "fold", inputs, [helper.make_tensor_value_info(o, 0, None) for o in outs])
    try:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        result = ReferenceEvaluator(model).run(None, {n: v for n, v in zip(names, values, strict=True)
                                                      if v is not None})
    except Exception:  # an op the reference lacks, or inputs it rejects: the node stays
        return None
    return [np.asarray(r) for r in result]


def _constant_value(node: onnx.NodeProto, opset: int) -> np.ndarray | None:
    if node.op_type != "Constant" or node.domain:
        return None
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
    res = _evaluate(node, [], opset)
    return res[0] if res else None


class _Constants:
    """Initializers as arrays, converted when first read (a model's weights are never copied
    for the few small ones shape arithmetic reads), plus the values of ``Constant`` nodes."""

    def __init__(self, initializers: Mapping[str, onnx.TensorProto]):
        self._protos = initializers
        self._arrays: dict[str, np.ndarray] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._arrays or name in self._protos

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._arrays[name] = value

    def get(self, name: str) -> np.ndarray | None:
        got = self._arrays.get(name)
        if got is None and name in self._protos:
            got = self._arrays[name] = numpy_helper.to_array(self._protos[name])
        return got


def _fold_round(model: onnx.ModelProto, cfg: FoldConfig) -> tuple[onnx.ModelProto, int, int] | None:
    g = model.graph
    opset = _opset(model)
    shapes = _static_shapes(model)
    graph_inputs = {i.name for i in g.input}
    consts = _Constants({i.name: i for i in g.initializer if i.name not in graph_inputs})
    derived: dict[str, np.ndarray] = {}  # values computed from a runtime shape
    folded: set[int] = set()
    graph_outputs = {o.name for o in g.output}
    for k, node in enumerate(g.node):
        if node.op_type == "Constant":
            v = _constant_value(node, opset)
            if v is not None:
                consts[node.output[0]] = v
            continue
        if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        if any(o in graph_outputs for o in node.output):
            continue  # the model's own outputs stay computed
        result: list[np.ndarray] | None = None
        if node.op_type in _SEEDS and node.input and node.input[0] not in consts:
            shape = shapes.get(node.input[0])
            if shape is None:
                continue
            if node.op_type == "Size":
                result = [np.array(int(np.prod(shape)), np.int64)]
            else:
                attrs = {a.name: a.i for a in node.attribute}
                start, end = attrs.get("start", 0), attrs.get("end", len(shape))
                result = [np.array(shape[start:end], np.int64)]  # python slicing clamps like the spec
        else:
            if not any(n in derived for n in node.input) or not all(
                    n == "" or n in derived or n in consts for n in node.input):
                continue
            ins = [None if n == "" else derived[n] if n in derived else consts.get(n) for n in node.input]
            result = _evaluate(node, ins, opset)
        if result is None or len(result) != len(node.output) or any(r.size > cfg.max_elements for r in result):
            continue
        for name, value in zip(node.output, result, strict=True):
            if name:
                derived[name] = value
        folded.add(k)
    if not folded:
        return None
    used: set[str] = set(graph_outputs)
    kept = [n for k, n in enumerate(g.node) if k not in folded]
    for n in kept:
        used.update(n.input)
        for a in n.attribute:  # values a subgraph reads from the outer scope
            for sub in (*([a.g] if a.type == onnx.AttributeProto.GRAPH else []), *a.graphs):
                used.update(_outer_names(sub))
    removed = [n for n in kept if n.op_type == "Constant" and not any(o in used for o in n.output)]
    kept = [n for n in kept if not (n.op_type == "Constant" and not any(o in used for o in n.output))]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    for name, value in derived.items():
        if name in used:
            # np.ascontiguousarray would turn a 0-d value into shape (1,): a copy keeps the rank
            out.graph.initializer.append(numpy_helper.from_array(np.array(value, order="C", copy=True), name))
    stale = {o for k in folded for o in g.node[k].output}
    stale.update(o for n in removed for o in n.output)
    keep_vi = [vi for vi in out.graph.value_info if vi.name not in stale]
    del out.graph.value_info[:]
    out.graph.value_info.extend(keep_vi)
    return out, len(folded), len(removed)


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for n in graph.node:
        names.update(n.input)
        for a in n.attribute:
            for sub in (*([a.g] if a.type == onnx.AttributeProto.GRAPH else []), *a.graphs):
                names.update(_outer_names(sub))
    return names


def fold_shape_arithmetic(model: onnx.ModelProto, config: FoldConfig = FOLD,
                          ) -> tuple[onnx.ModelProto, FoldStatistics]:
    """``model`` with every node that computes from runtime shapes only (given its inputs'
    static shapes) replaced by an initializer of its value, and the ``Constant`` nodes only
    those read dropped; ``model`` itself (same object) when there is nothing to fold.

    Shapes of free dims are not constant: their arithmetic stays (onnxruntime runs it).
    """
    folded = removed = rounds = 0
    current = model
    if not any(n.op_type in _SEEDS and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model, FoldStatistics(0, 0, 0)  # no shape is read at run time: nothing to fold
    for _ in range(config.max_rounds):
        res = _fold_round(current, config)
        if res is None:
            break
        current, f, r = res
        folded += f
        removed += r
        rounds += 1
    return current, FoldStatistics(folded, removed, rounds)


def _bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))]


def control_flow_reads(nodes: Sequence[onnx.NodeProto]) -> set[str]:
    """The values the control-flow nodes among ``nodes`` (any node with a subgraph: If, Loop,
    Scan) read: their own inputs and every value their bodies read from the outer scope."""
    names: set[str] = set()
    for node in nodes:
        bodies = _bodies(node)
        if bodies:
            names.update(n for n in node.input if n)
            for body in bodies:
                names.update(_outer_names(body))
    return names


def relax_control_flow_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (modified in place: a stage model just built) with each graph input that a
    control-flow node reads declared with its rank only (symbolic dims), and no ``value_info``
    for the values such a node reads.

    onnxruntime type-checks *every* branch of an ``If`` (and a ``Loop``/``Scan`` body) against the
    declared dims of the values it reads, also the branch that never runs at these shapes:
    Silero VAD's branches (16 and 8 kHz) only type-check with the input's dims free, so fixing
    them (``shapes=``, ``--shape``) made onnxruntime refuse the model ("LSTM: first input tensor
    must have rank 3"). The fixed shapes still hold at the session's boundary (feeds are checked
    against them) and for planning; only the control-flow stage's own declaration stays free.
    A model without control flow is returned untouched.
    """
    reads = control_flow_reads(model.graph.node)
    if not reads:
        return model
    inits = {t.name for t in model.graph.initializer}
    fixed: dict[str, list[int]] = {}
    for vi in model.graph.input:
        if vi.name not in reads or vi.name in inits or vi.type.WhichOneof("value") != "tensor_type":
            continue
        shape = vi.type.tensor_type.shape
        dims = [int(d.dim_value) if d.HasField("dim_value") else -1 for d in shape.dim]
        if dims and all(d >= 0 for d in dims):
            fixed[vi.name] = dims
        for k, d in enumerate(shape.dim):
            d.Clear()
            d.dim_param = f"{vi.name}_dim{k}"
    if fixed:  # an accelerator (static shapes only) or a cost model takes them back
        model.metadata_props.add(key=CONTROL_FLOW_DIMS, value=json.dumps(fixed, sort_keys=True))
    kept = [vi for vi in model.graph.value_info if vi.name not in reads]
    if len(kept) != len(model.graph.value_info):
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)
    return model


def restore_control_flow_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the fixed dims :func:`relax_control_flow_inputs` freed for onnxruntime put
    back on its graph inputs (a copy; ``model`` itself when it has none): for an accelerator's
    converter, which needs static shapes (and refuses the control flow itself, in its own words),
    and for a cost model that sizes the stage's inputs."""
    found = next((p.value for p in model.metadata_props if p.key == CONTROL_FLOW_DIMS), None)
    if found is None:
        return model
    try:
        fixed = {str(k): [int(d) for d in v] for k, v in json.loads(found).items()}
    except (ValueError, TypeError, AttributeError):
        return model  # not ours: nothing to put back
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [p for p in out.metadata_props if p.key != CONTROL_FLOW_DIMS]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    for vi in out.graph.input:
        dims = fixed.get(vi.name)
        if dims is None or vi.type.WhichOneof("value") != "tensor_type" or len(vi.type.tensor_type.shape.dim) != len(dims):
            continue
        for d, v in zip(vi.type.tensor_type.shape.dim, dims, strict=True):
            d.Clear()
            d.dim_value = v
    return out


@dataclass(frozen=True)
class ShapeBoundary:
    """A stage output that is shape arithmetic: a 0-d tensor or an integer tensor computed from
    a runtime shape, which no stage should hand to another (issue 24)."""

    stage: str
    device: str
    value: str
    reason: str


_INT_TYPES = frozenset({TensorProto_INT for TensorProto_INT in (
    onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
    onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8)})


def shape_boundaries(index: Any, stages: Sequence[Any], graph_outputs: Mapping[str, Any] | Sequence[str],
                     ) -> list[ShapeBoundary]:
    """The stage outputs (``stages``: :class:`~hetsched._planning.partition.StageSpec`) that are
    0-d tensors or integer tensors derived from a ``Shape``/``Size`` node, other than the
    model's own outputs. A plan built on a folded index with static input shapes has none."""
    producer = index.producer
    nodes = index.nodes
    shape_derived: dict[int, bool] = {}

    def derived(nid: int) -> bool:
        got = shape_derived.get(nid)
        if got is not None:
            return got
        stack = [(nid, False)]
        while stack:
            x, done = stack.pop()
            if x in shape_derived:
                continue
            ref = nodes[x]
            preds = [producer[v] for v in ref.inputs if v in producer]
            if not done:
                stack.append((x, True))
                stack.extend((p, False) for p in preds if p not in shape_derived)
                continue
            shape_derived[x] = ref.op_type in _SEEDS or any(shape_derived.get(p, False) for p in preds)
        return shape_derived[nid]

    outs = set(graph_outputs)
    found: list[ShapeBoundary] = []
    for st in stages:
        for name in st.outputs:
            if name in outs:
                continue
            t = index.value_type(name)
            if t is None or t.WhichOneof("value") != "tensor_type":
                continue
            tt = t.tensor_type
            if tt.HasField("shape") and len(tt.shape.dim) == 0:
                found.append(ShapeBoundary(st.name, st.device, name, "a 0-d tensor"))
            elif tt.elem_type in _INT_TYPES and name in producer and derived(producer[name]):
                found.append(ShapeBoundary(st.name, st.device, name, "an integer tensor computed from a shape"))
    return found
