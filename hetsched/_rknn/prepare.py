"""Stage preparation before Rockchip's toolkit converts a stage: pure functions on ``ModelProto``.

What rknn-toolkit2 needs that a stage cut from a user's model may lack
(``docs``: ../shared/reference/accelerators.md §1; airockchip/rknn-toolkit2 ``doc/``):

* a recent default-domain opset: it rejects opset-9 ``Dropout`` ("Not support 'Dropout' of
  opset-9!"), so stages below opset 13 are upgraded with ``onnx.version_converter``;
* no inference no-ops: ``Dropout`` (inference mode) and ``Identity`` are folded away, their
  consumers rewired to the producer (graph outputs stay valid);
* static input shapes: a free dimension (``batch``, ``N``) is fixed from the given shapes,
  like onnxruntime's free-dimension overrides; a free dimension with no shape given is a
  :class:`~hetsched.CompileError` telling how to give one;
* an IR version the toolkit's own onnx (<= 1.18) reads.

Nothing here imports the toolkit; every function returns a new model and leaves its argument alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import version_converter

from hetsched._onnxruntime import ort_session

from .._errors import CompileError

__all__ = [
    "MIN_OPSET",
    "TOOLKIT_MAX_IR_VERSION",
    "fix_free_dims",
    "fold_passthrough",
    "free_dims",
    "io_specs",
    "prepare_stage",
    "upgrade_opset",
]

MIN_OPSET = 13
"""The lowest default-domain opset a stage is given to the toolkit with."""

TOOLKIT_MAX_IR_VERSION = 9
"""The IR version prepared stages are written with: onnx 1.18 (the toolkit's pin) reads up to 11,
and opset 13-19 models need no newer IR than 9 (onnx's versioning table, docs/Versioning.md)."""

Shapes = Mapping[str, Sequence[int]]


def _default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def upgrade_opset(model: onnx.ModelProto, target: int = MIN_OPSET) -> onnx.ModelProto:
    """The model at default-domain opset ``target`` when it is below it (else an unchanged copy).

    :raises CompileError: onnx's version converter cannot upgrade some node (its message kept).
    """
    current = _default_opset(model)
    if current is None or current >= target:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    try:
        return version_converter.convert_version(model, target)
    except Exception as exc:  # the converter raises RuntimeError / ValidationError / IndexError
        raise CompileError(f"cannot upgrade the stage from opset {current} to {target}: {exc}") from exc


_PASSTHROUGH = ("Dropout", "Identity")


def _rename_inputs(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every node input ``old`` -> ``new`` in ``graph`` and the subgraphs that capture it."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(attr.g, old, new)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _rename_inputs(g, old, new)


def _is_passthrough(node: onnx.NodeProto) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in _PASSTHROUGH or not node.input or not node.input[0]:
        return False
    if node.op_type == "Dropout":
        # the mask output has no passthrough meaning; training_mode=True (opset 12+ input 2) is not a no-op
        if len(node.output) > 1 and node.output[1]:
            return False
        if len(node.input) > 2 and node.input[2]:
            return False
    return True


def fold_passthrough(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without inference-mode ``Dropout`` and ``Identity`` nodes.

    Consumers of a folded node's output read its input instead. Where the output is a graph
    output, the producer of the input writes the graph output's name instead (so outputs keep
    their names); a node whose input is a graph input or initializer, or itself another graph
    output, stays (removing it would merge two graph-level names). Dropouts whose mask is used
    or that run in training mode stay. Nodes left feeding nothing are removed.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    graph_outputs = {o.name for o in g.output}
    graph_level = {i.name for i in g.input} | {t.name for t in g.initializer} | graph_outputs
    keep: list[onnx.NodeProto] = []
    for node in list(g.node):
        if not _is_passthrough(node):
            keep.append(node)
            continue
        src, dst = node.input[0], node.output[0]
        if dst not in graph_outputs:
            _rename_inputs(g, dst, src)
            continue
        if src in graph_level:
            keep.append(node)
            continue
        # dst is a graph output: the producer of src (already in keep, topological order) writes dst
        for n in keep:
            for i, name in enumerate(n.output):
                if name == src:
                    n.output[i] = dst
        _rename_inputs(g, src, dst)
        for vi in g.value_info:
            if vi.name == src:
                vi.name = dst
    # what only fed a folded node (the Constant ratio the opset converter gives Dropout) is dead now
    used = {o.name for o in g.output} | _subgraph_inputs(g)
    live: list[onnx.NodeProto] = []
    for node in reversed(keep):
        if any(o and o in used for o in node.output):
            live.append(node)
            used.update(node.input)
    del g.node[:]
    g.node.extend(reversed(live))
    return out


def _subgraph_inputs(graph: onnx.GraphProto) -> set[str]:
    """Names read inside subgraphs (captured from outer scopes)."""
    out: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sg in subs:
                for n in sg.node:
                    out.update(n.input)
                out |= _subgraph_inputs(sg)
    return out


def free_dims(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """Per graph input (initializers excluded) its dims, for inputs with any dim not a positive
    number: ``{"x": ["batch", 3, 224, 224]}`` (a ``dim_param`` string, or None when unset)."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, list[int | str | None]] = {}
    for inp in model.graph.input:
        if inp.name in inits or not inp.type.HasField("tensor_type"):
            continue
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            out[inp.name] = []
            continue
        dims: list[int | str | None] = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None) for d in tt.shape.dim
        ]
        if any(not isinstance(d, int) for d in dims):
            out[inp.name] = dims
    return out


def _shape_hint(name: str, dims: Sequence[int | str | None]) -> str:
    example = ",".join(str(d) if isinstance(d, int) else "1" for d in dims) or "D0,D1,..."
    return f"pass shapes={{{name!r}: ({example.replace(',', ', ')})}} or --shape {name}={example}"


def fix_free_dims(model: onnx.ModelProto, shapes: Shapes | None = None) -> onnx.ModelProto:
    """The model with every graph input's shape static, then shapes re-inferred.

    ``shapes`` gives full shapes by input name (``{"x": (1, 3, 224, 224)}``); a given shape
    must have the input's rank and agree with its fixed dims. Shapes of inputs the stage
    does not have are ignored (one ``shapes`` mapping serves every stage of a model).

    :raises CompileError: an input has a free dimension and no shape was given (the message
        names the input and says to pass ``shapes=`` / ``--shape NAME=D0,D1,...``), or a given
        shape contradicts the input's rank or fixed dims.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes = shapes or {}
    inits = {t.name for t in out.graph.initializer}
    changed = False
    for inp in out.graph.input:
        if inp.name in inits or not inp.type.HasField("tensor_type"):
            continue
        tt = inp.type.tensor_type
        dims = list(tt.shape.dim) if tt.HasField("shape") else []
        known: list[int | str | None] = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None) for d in dims
        ]
        given = shapes.get(inp.name)
        if given is None:
            if not tt.HasField("shape") or any(not isinstance(d, int) for d in known):
                free = [d for d in known if not isinstance(d, int)] or ["its rank"]
                raise CompileError(
                    f"input {inp.name!r} has a free dimension ({', '.join(map(str, free))}) in shape "
                    f"{known}: the NPU needs static shapes; {_shape_hint(inp.name, known)}"
                )
            continue
        want = [int(d) for d in given]
        if any(d <= 0 for d in want):
            raise CompileError(f"shape {want} given for input {inp.name!r} has a dimension <= 0")
        if tt.HasField("shape") and len(known) != len(want):
            raise CompileError(f"shape {want} given for input {inp.name!r} has rank {len(want)}; the input has "
                               f"rank {len(known)} ({known})")
        clash = [(i, k, w) for i, (k, w) in enumerate(zip(known, want, strict=False)) if isinstance(k, int) and k != w]
        if clash:
            i, k, w = clash[0]
            raise CompileError(f"shape {want} given for input {inp.name!r} sets dim {i} to {w}; the model fixes it "
                               f"to {k}")
        tt.ClearField("shape")
        for d in want:
            tt.shape.dim.add().dim_value = d
        changed = True
    if not changed:
        return out
    # stale symbolic shapes inside the graph would otherwise survive re-inference
    del out.graph.value_info[:]
    for o in out.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    return _infer(out)


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # InferenceError and friends
        raise CompileError(f"shape inference of the prepared stage failed: {exc}") from exc


def prepare_stage(
    model: onnx.ModelProto, shapes: Shapes | None = None, *, opset: int = MIN_OPSET
) -> onnx.ModelProto:
    """Everything above in order: opset upgrade, Dropout/Identity folding, static input shapes,
    shape re-inference, and the IR version lowered to :data:`TOOLKIT_MAX_IR_VERSION` (or the
    lowest one the stage's opsets allow) where higher.

    :raises CompileError: see :func:`upgrade_opset` and :func:`fix_free_dims`.
    """
    out = fix_free_dims(fold_passthrough(upgrade_opset(model, opset)), shapes)
    out = _infer(out)
    cap = max(TOOLKIT_MAX_IR_VERSION, onnx.helper.find_min_ir_version_for(list(out.opset_import), True))
    if out.ir_version > cap:
        out.ir_version = cap
    return out


_Spec = tuple[np.dtype[Any], tuple[int, ...]]
"""(dtype, static shape), as ``hetsched.backends.TensorSpec``."""


def io_specs(model: onnx.ModelProto) -> tuple[list[str], list[_Spec], list[str], list[_Spec]]:
    """Names and static (dtype, shape) of the prepared stage's inputs and outputs."""
    inits = {t.name for t in model.graph.initializer}

    def spec(vi: onnx.ValueInfoProto) -> _Spec | None:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim] if tt.HasField("shape") else None
        if dims is None or any(d <= 0 for d in dims):
            return None
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)), tuple(dims)

    ins = [i for i in model.graph.input if i.name not in inits]
    in_specs = [spec(i) for i in ins]
    out_specs = [spec(o) for o in model.graph.output]
    if any(s is None for s in out_specs):
        # shape inference stopped short (a data-dependent shape): onnxruntime tells on one run
        sess = ort_session(model.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {i.name: np.zeros(s[1], s[0]) for i, s in zip(ins, in_specs, strict=True) if s is not None}
        values = sess.run(None, feeds)
        out_specs = [(np.dtype(v.dtype), tuple(v.shape)) for v in values]
    return ([i.name for i in ins], [s for s in in_specs if s is not None],
            [o.name for o in model.graph.output], [s for s in out_specs if s is not None])
