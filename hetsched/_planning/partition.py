"""Band-style partitioning: unit subgraphs, placement into stages, stage extraction.

1. Each node gets the set of devices able to run it (a bitmask).
2. *Unit subgraphs* are maximal connected runs of nodes with the same mask, found
   on a topological order that prefers to keep same-mask nodes together, then cut to
   at most ``max_unit_nodes`` nodes.
3. After placement, units are ordered topologically (preferring to stay on the same
   device) and adjacent runs on one device merge into *stages*. Each stage is an
   interval of a topological order, so the stage graph can never have a cycle.
4. Each stage is extracted into a standalone, valid ONNX model.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from hetsched.backends import Capabilities

from .._errors import PartitionError
from .fold import relax_control_flow_inputs
from .graph import GraphIndex, NodeRef

__all__ = [
    "StageSpec", "UnitDraft", "compute_units", "constant_nodes", "extract_stage", "input_dtypes", "merge_stages",
    "shape_nodes",
]


@dataclass(frozen=True, slots=True)
class UnitDraft:
    id: int
    nodes: tuple[int, ...]
    mask: int


@dataclass(frozen=True)
class StageSpec:
    """One stage: node indices (in a valid order), its device, boundary values and dependencies."""

    id: int
    name: str
    device: str
    nodes: tuple[int, ...]
    units: tuple[int, ...]
    inputs: tuple[str, ...]
    """Values read from outside the stage (graph inputs or other stages' outputs)."""
    outputs: tuple[str, ...]
    """Values other stages read or that are graph outputs."""
    deps: tuple[int, ...]
    """Stages producing some of ``inputs``."""
    rematerialized: tuple[int, ...] = ()
    """Constant-computing nodes of other stages (``Constant``, and e.g. ``ConstantOfShape``
    of an initializer: see :func:`constant_nodes`) copied into this one instead of read
    across the boundary: onnxruntime then folds them (prepacked weights; shape inference
    inside If/Loop/Scan bodies needs that) and nothing is transferred per request."""


def input_dtypes(index: GraphIndex, names: Sequence[str]) -> list[int | None]:
    return [index.elem_type(n) for n in names]


def _find(parent: list[int], x: int) -> int:
    """Union-find root of ``x``, halving the path on the way."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def compute_units(
    index: GraphIndex,
    device_names: Sequence[str],
    capabilities: Mapping[str, Capabilities],
    *,
    max_unit_nodes: int | None = None,
) -> list[UnitDraft]:
    """Unit subgraphs of ``index`` for these devices.

    :raises PartitionError: some op types can run on none of ``device_names``.
    :raises ValueError: ``max_unit_nodes`` < 1.
    """
    if max_unit_nodes is not None and max_unit_nodes < 1:
        raise ValueError(f"max_unit_nodes must be >= 1 or None, got {max_unit_nodes}")
    n = len(index.nodes)
    masks = [0] * n
    caps = [capabilities[d] for d in device_names]
    cache: dict[tuple[str, str, int, tuple[int | None, ...]], int] = {}
    unsupported: set[str] = set()
    for ref in index.nodes:
        opset = index.opsets.get(ref.domain, index.opsets.get("", 1))
        dts = tuple(input_dtypes(index, ref.inputs[:4]))
        key = (ref.op_type, ref.domain, opset, dts)
        m = cache.get(key)
        if m is None:
            m = 0
            for bit, cap in enumerate(caps):
                if cap.supports(ref.op_type, ref.domain, opset, dts):
                    m |= 1 << bit
            cache[key] = m
        if m == 0:
            unsupported.add(f"{ref.domain + '::' if ref.domain else ''}{ref.op_type}")
        masks[ref.index] = m
    if unsupported:
        raise PartitionError(
            f"no device can run op types {sorted(unsupported)} (devices asked: {list(device_names)})",
            op_types=sorted(unsupported),
            devices=list(device_names),
        )
    order = index.topological_order(keys=masks)
    units: list[UnitDraft] = []
    i = 0
    preds = index.preds
    while i < n:
        j = i
        mask = masks[order[i]]
        while j + 1 < n and masks[order[j + 1]] == mask:
            j += 1
        run = order[i : j + 1]
        # Split the run into connected components (union-find on edges inside the run).
        in_run = {v: k for k, v in enumerate(run)}
        parent = list(range(len(run)))
        for k, v in enumerate(run):
            for p in preds[v]:
                kp = in_run.get(p)
                if kp is not None:
                    a = k if parent[k] == k else _find(parent, k)
                    b = kp if parent[kp] == kp else _find(parent, kp)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
        comps: dict[int, list[int]] = {}
        for k, v in enumerate(run):
            comps.setdefault(k if parent[k] == k else _find(parent, k), []).append(v)
        for root in sorted(comps):
            members = comps[root]
            size = max_unit_nodes or len(members)
            for s in range(0, len(members), size):
                units.append(UnitDraft(len(units), tuple(members[s : s + size]), mask))
        i = j + 1
    return units


def merge_stages(
    index: GraphIndex,
    units: Sequence[UnitDraft],
    assignment: Mapping[int, str],
    unit_preds: Sequence[Sequence[int]],
    unit_succs: Sequence[Sequence[int]],
    *,
    name_prefix: str = "stage",
) -> list[StageSpec]:
    """Merge adjacent units on the same device into stages (never creating a cycle).

    Units are ordered topologically preferring the device of the last one taken
    (:func:`_unit_order`); consecutive units on one device form a stage (:func:`_stage_groups`).
    Constants and shape arithmetic are computed inside each stage reading them instead of
    crossing a boundary (:func:`_stage_boundaries`); a stage nobody reads from then is dropped.
    """
    const = constant_nodes(index)
    groups = _stage_groups(index, units, assignment, _unit_order(units, assignment, unit_preds, unit_succs), const)
    stage_nodes = [sorted(nid for u in g for nid in units[u].nodes) for g in groups]
    bounds = _stage_boundaries(index, stage_nodes, const, shape_nodes(index))
    graph_outputs = set(index.graph_outputs)
    out: list[StageSpec] = []
    for sid, nodes in enumerate(stage_nodes):
        ins, deps, remat, outs = bounds[sid]
        for nid in nodes:
            for o in index.nodes[nid].outputs:
                if o in graph_outputs:
                    outs[o] = None
        out.append(StageSpec(
            id=sid, name=f"{name_prefix}{sid}", device=assignment[groups[sid][0]], nodes=tuple(nodes),
            units=tuple(groups[sid]), inputs=tuple(ins), outputs=tuple(_ordered_outputs(index, nodes, outs)),
            deps=tuple(sorted(deps)), rematerialized=tuple(sorted(remat)),
        ))
    return _without_dead_stages(out, name_prefix)


def _unit_order(units: Sequence[UnitDraft], assignment: Mapping[int, str],
                unit_preds: Sequence[Sequence[int]], unit_succs: Sequence[Sequence[int]]) -> list[int]:
    """Kahn over units, preferring the device of the last unit taken: runs on one device become
    as long as the dependency structure allows."""
    nu = len(units)
    if len({assignment[u] for u in range(nu)}) <= 1 and all(p < u for u in range(nu) for p in unit_preds[u]):
        # One device and units numbered in a topological order (as compute_units numbers them):
        # the smallest ready unit first is the numbering itself.
        return list(range(nu))
    indeg = [len(p) for p in unit_preds]
    ready: dict[str, list[int]] = {}
    for u in range(nu):
        if indeg[u] == 0:
            heapq.heappush(ready.setdefault(assignment[u], []), u)
    order: list[int] = []
    current: str | None = None
    while ready:
        if current is None or not ready.get(current):
            current = min(ready, key=lambda d: ready[d][0])
        bucket = ready[current]
        u = heapq.heappop(bucket)
        if not bucket:
            del ready[current]
        order.append(u)
        for s in unit_succs[u]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready.setdefault(assignment[s], []), s)
    return order


def _stage_groups(index: GraphIndex, units: Sequence[UnitDraft], assignment: Mapping[int, str],
                  order: Sequence[int], const: Sequence[bool]) -> list[list[int]]:
    """Runs of consecutive units (in ``order``) on one device.

    Units computing only constants that no graph output names are rematerialized in every
    stage reading them (their own stage ends up dead, dropped): they must not cut a run of
    another device in two, so they are grouped apart, after the live ones.
    """
    graph_outputs = set(index.graph_outputs)
    nodes = index.nodes
    groups: list[list[int]] = []
    dead: list[list[int]] = []
    for u in order:
        nodes_u = units[u].nodes
        into = groups
        if all(const[n] for n in nodes_u) and not any(o in graph_outputs for n in nodes_u for o in nodes[n].outputs):
            into = dead
        if into and assignment[into[-1][-1]] == assignment[u]:
            into[-1].append(u)
        else:
            into.append([u])
    groups.extend(dead)
    return groups


_Boundary = tuple[dict[str, None], dict[int, None], dict[int, None], dict[str, None]]


def _stage_boundaries(index: GraphIndex, stage_nodes: Sequence[Sequence[int]], const: Sequence[bool],
                      shape: Sequence[bool]) -> list[_Boundary]:
    """Per stage: the values it reads from outside, the stages it depends on, the nodes of other
    stages it recomputes itself, and the values other stages read from it.

    A value computed by constant nodes (:func:`constant_nodes`) or by shape arithmetic
    (:func:`shape_nodes`) in another stage is not read across the boundary: its nodes are
    rematerialized in the reading stage (for shape arithmetic: back to the ``Shape``/``Size``
    nodes, whose data input the stage then reads instead).
    """
    producer_stage: dict[str, int] = {}
    for sid, nodes in enumerate(stage_nodes):
        for nid in nodes:
            for o in index.nodes[nid].outputs:
                producer_stage[o] = sid
    out: list[_Boundary] = [({}, {}, {}, {}) for _ in stage_nodes]
    producer = index.producer
    feedable = set(index.graph_inputs)
    constants = index.initializers.keys() | index.sparse_initializers.keys()
    for sid, nodes in enumerate(stage_nodes):
        ins, deps, remat, _ = out[sid]
        todo = list(nodes)
        k = 0
        while k < len(todo):  # the stage's nodes in order, then the nodes it rematerializes
            k += 1
            for v in index.nodes[todo[k - 1]].inputs:
                ps = producer_stage.get(v)
                if ps is None:
                    if v not in constants or v in feedable:
                        ins[v] = None  # a graph input, an overridable initializer, an outer name
                elif ps != sid:
                    pn = producer[v]
                    if const[pn]:
                        _add_closure(index, const, pn, remat)
                    elif shape[pn]:
                        if pn not in remat:
                            remat[pn] = None
                            todo.append(pn)  # its own inputs are read here in turn
                    else:
                        ins[v] = None
                        deps[ps] = None
                        out[ps][3][v] = None
    return out


def _without_dead_stages(stages: list[StageSpec], name_prefix: str) -> list[StageSpec]:
    """``stages`` without those nobody reads from (e.g. only constants or shape arithmetic that
    were rematerialized where needed), renumbered. Nothing depends on them by construction."""
    if all(s.outputs for s in stages):
        return stages
    keep = [s for s in stages if s.outputs]
    new_id = {s.id: i for i, s in enumerate(keep)}
    return [
        dataclasses.replace(s, id=new_id[s.id], name=f"{name_prefix}{new_id[s.id]}",
                            deps=tuple(new_id[d] for d in s.deps))
        for s in keep
    ]


# Ops whose result is not a function of their inputs: never duplicated into another stage.
_NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
})
_SHAPE_SEEDS = frozenset({"Shape", "Size"})
_INT_TYPES = frozenset({
    onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
    onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8,
})


def _duplicable(ref: NodeRef) -> bool:
    """May the node be computed again in another stage (deterministic, no subgraph, ONNX domain)?"""
    return not ref.domain and not ref.has_subgraph and ref.op_type not in _NONDETERMINISTIC


def constant_nodes(index: GraphIndex) -> list[bool]:
    """Per node: does it compute a constant (only from non-overridable initializers and
    other constant nodes, deterministically, without subgraphs)?

    Such values are recomputed inside each stage that reads them instead of crossing a
    stage boundary, so onnxruntime constant-folds them there (prepacked weights, shapes
    known to shape inference) and nothing is transferred per request. Computed once per
    index (Kahn-style from the nodes without predecessors: each edge is looked at once).
    """
    cached: list[bool] | None = index.__dict__.get("_constant_nodes")
    if cached is not None:
        return cached
    fixed = {name for name in index.initializers if name not in index.graph_inputs}
    fixed.update(name for name in index.sparse_initializers if name not in index.graph_inputs)
    nodes, producer, preds, succs = index.nodes, index.producer, index.preds, index.succs

    def ok(i: int) -> bool:
        ref = nodes[i]
        return _duplicable(ref) and all(v in fixed for v in ref.inputs if v not in producer)

    const = [False] * len(nodes)
    missing = [len(p) for p in preds]
    stack = [i for i in range(len(nodes)) if not missing[i] and ok(i)]
    for i in stack:
        const[i] = True
    while stack:
        for s in succs[stack.pop()]:
            missing[s] -= 1
            if not missing[s] and ok(s):
                const[s] = True
                stack.append(s)
    index.__dict__["_constant_nodes"] = const
    return const


def shape_nodes(index: GraphIndex) -> list[bool]:
    """Per node: is it shape arithmetic left at run time (a free dim kept it from being folded)?

    A ``Shape``/``Size`` node, or a node reading shape arithmetic whose every input computed by
    a node is shape arithmetic or a constant; each with only 0-d or integer outputs (as typed by
    shape inference), duplicable, and not a constant itself. Such values never cross a stage
    boundary (issue 24: a vendor toolkit drops them; they are tiny): each stage reading one
    computes it itself (:func:`merge_stages`). Computed once per index, each edge looked at once.
    """
    cached: list[bool] | None = index.__dict__.get("_shape_nodes")
    if cached is not None:
        return cached
    const = constant_nodes(index)
    nodes, preds, succs = index.nodes, index.preds, index.succs

    def ok(i: int) -> bool:
        ref = nodes[i]
        if const[i] or not ref.outputs or not _duplicable(ref):
            return False
        for o in ref.outputs:
            t = index.value_type(o)
            if t is None or t.WhichOneof("value") != "tensor_type":
                return False
            tt = t.tensor_type
            if tt.elem_type not in _INT_TYPES and not (tt.HasField("shape") and len(tt.shape.dim) == 0):
                return False
        return True

    shape = [False] * len(nodes)
    missing = [len(p) for p in preds]
    for i, c in enumerate(const):
        if c:
            for s in succs[i]:
                missing[s] -= 1  # a constant input is no obstacle (but alone makes nothing shape arithmetic)
    stack = [i for i, ref in enumerate(nodes) if ref.op_type in _SHAPE_SEEDS and ok(i)]
    for i in stack:
        shape[i] = True
    while stack:
        for s in succs[stack.pop()]:
            missing[s] -= 1
            if not missing[s] and not shape[s] and ok(s):
                shape[s] = True
                stack.append(s)
    index.__dict__["_shape_nodes"] = shape
    return shape


def _add_closure(index: GraphIndex, const: Sequence[bool], nid: int, into: dict[int, None]) -> None:
    stack = [nid]
    while stack:
        x = stack.pop()
        if x in into:
            continue
        into[x] = None
        for v in index.nodes[x].inputs:
            p = index.producer.get(v)
            if p is not None and const[p]:
                stack.append(p)


def _ordered_outputs(index: GraphIndex, nodes: Sequence[int], wanted: Mapping[str, None]) -> list[str]:
    res: list[str] = []
    for nid in nodes:
        for o in index.nodes[nid].outputs:
            if o in wanted:
                res.append(o)
    return res


def _value_info(index: GraphIndex, name: str) -> onnx.ValueInfoProto:
    t = index.value_type(name)
    vi = onnx.ValueInfoProto()
    vi.name = name
    if t is not None:
        vi.type.CopyFrom(t)
    return vi


def _functions_used(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> list[onnx.FunctionProto]:
    funcs = {(f.domain, f.name): f for f in model.functions}
    if not funcs:
        return []
    used: dict[tuple[str, str], onnx.FunctionProto] = {}
    stack = [(n.domain, n.op_type) for n in nodes]

    def walk_graph(g: onnx.GraphProto) -> None:
        for n in g.node:
            stack.append((n.domain, n.op_type))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk_graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        walk_graph(sg)

    for n in nodes:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                walk_graph(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    walk_graph(sg)
    while stack:
        key = stack.pop()
        f = funcs.get(key)
        if f is None or key in used:
            continue
        used[key] = f
        stack.extend((fn.domain, fn.op_type) for fn in f.node)
    return [f for k, f in funcs.items() if k in used]


def extract_stage(index: GraphIndex, stage: StageSpec) -> onnx.ModelProto:
    """A standalone ONNX model computing ``stage.outputs`` from ``stage.inputs``.

    Carries only the initializers the stage reads (also from If/Loop/Scan bodies),
    the model-local functions it calls, and the model's opset imports.
    """
    model = index.model
    graph_nodes = model.graph.node
    nodes = [graph_nodes[i] for i in (*stage.rematerialized, *stage.nodes)]
    used: set[str] = set()
    for nid in (*stage.rematerialized, *stage.nodes):
        used.update(index.nodes[nid].inputs)
    inits = [index.initializers[n] for n in sorted(used) if n in index.initializers]
    sparse = [index.sparse_initializers[n] for n in sorted(used) if n in index.sparse_initializers]
    graph = helper.make_graph(
        nodes,
        f"{model.graph.name or 'graph'}_{stage.name}",
        inputs=[_value_info(index, n) for n in stage.inputs],
        outputs=[_value_info(index, n) for n in stage.outputs],
        initializer=inits,
        sparse_initializer=sparse,
    )
    # Keep inferred types of values inside the stage: onnxruntime plans memory better.
    inside = {o for nid in stage.nodes for o in index.nodes[nid].outputs} - set(stage.outputs)
    graph.value_info.extend(index.value_info[n] for n in sorted(inside) if n in index.value_info)
    stage_model = helper.make_model(
        graph,
        opset_imports=list(model.opset_import),
        # IR 3 lists every initializer as a graph input; a stage carries only the initializers
        # it reads, as constants (see GraphIndex.graph_inputs), which needs IR 4.
        ir_version=max(model.ir_version, 4),
        producer_name="hetsched",
        functions=_functions_used(model, nodes),
    )
    # onnxruntime type-checks every If/Loop branch against the stage's declared input dims,
    # also a branch these shapes never take: control flow reads its inputs with free dims
    return relax_control_flow_inputs(stage_model)
