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

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from hetsched.backends import Capabilities

from .._errors import PartitionError
from .graph import GraphIndex

__all__ = ["StageSpec", "UnitDraft", "compute_units", "extract_stage", "input_dtypes", "merge_stages"]


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
    out: list[int | None] = []
    for n in names:
        t = index.value_type(n)
        out.append(t.tensor_type.elem_type if t is not None and t.WhichOneof("value") == "tensor_type" else None)
    return out


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
                    a, b = _find(parent, k), _find(parent, kp)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
        comps: dict[int, list[int]] = {}
        for k, v in enumerate(run):
            comps.setdefault(_find(parent, k), []).append(v)
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
    """Merge adjacent units on the same device into stages (never creating a cycle)."""
    nu = len(units)
    indeg = [len(p) for p in unit_preds]
    # Kahn over units, preferring the device of the last unit taken: runs on one
    # device become as long as the dependency structure allows.
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
    # Units computing only constants that no graph output names are rematerialized in every
    # stage reading them (their own stage ends up dead, dropped below): they must not cut a
    # run of another device in two, so they are grouped apart, after the live ones.
    const = constant_nodes(index)
    graph_outputs = set(index.graph_outputs)
    groups: list[list[int]] = []
    dead: list[list[int]] = []
    for u in order:
        nodes_u = units[u].nodes
        if all(const[n] for n in nodes_u) and not any(
                o in graph_outputs for n in nodes_u for o in index.nodes[n].outputs):
            if dead and assignment[dead[-1][-1]] == assignment[u]:
                dead[-1].append(u)
            else:
                dead.append([u])
        elif groups and assignment[groups[-1][-1]] == assignment[u]:
            groups[-1].append(u)
        else:
            groups.append([u])
    groups.extend(dead)

    producer_stage: dict[str, int] = {}
    stage_nodes: list[list[int]] = []
    for sid, g in enumerate(groups):
        nodes = sorted(nid for u in g for nid in units[u].nodes)
        stage_nodes.append(nodes)
        for nid in nodes:
            for o in index.nodes[nid].outputs:
                producer_stage[o] = sid
    # Boundary values: what each stage reads from outside and what others need from it.
    needed_outside: dict[int, dict[str, None]] = {sid: {} for sid in range(len(groups))}
    stages_inputs: list[list[str]] = []
    stages_deps: list[list[int]] = []
    stages_remat: list[list[int]] = []
    for sid, nodes in enumerate(stage_nodes):
        ins: dict[str, None] = {}
        deps: dict[int, None] = {}
        remat: dict[int, None] = {}
        for nid in nodes:
            for v in index.nodes[nid].inputs:
                ps = producer_stage.get(v)
                if ps is None:
                    if v in index.initializers or v in index.sparse_initializers:
                        if v in index.graph_inputs:
                            ins[v] = None  # overridable initializer: may be fed
                        continue
                    ins[v] = None  # graph input (or an outer name the checker allowed)
                elif ps != sid:
                    pn = index.producer[v]
                    if const[pn]:
                        _add_closure(index, const, pn, remat)
                        continue
                    ins[v] = None
                    deps[ps] = None
                    needed_outside[ps][v] = None
        stages_inputs.append(list(ins))
        stages_deps.append(list(deps))
        stages_remat.append(sorted(remat))
    out: list[StageSpec] = []
    for sid, nodes in enumerate(stage_nodes):
        outs = dict(needed_outside[sid])
        for nid in nodes:
            for o in index.nodes[nid].outputs:
                if o in graph_outputs:
                    outs[o] = None
        g = groups[sid]
        out.append(
            StageSpec(
                id=sid,
                name=f"{name_prefix}{sid}",
                device=assignment[g[0]],
                nodes=tuple(nodes),
                units=tuple(g),
                inputs=tuple(stages_inputs[sid]),
                outputs=tuple(o for o in _ordered_outputs(index, nodes, outs)),
                deps=tuple(sorted(stages_deps[sid])),
                rematerialized=tuple(stages_remat[sid]),
            )
        )
    # A stage nobody reads from (e.g. only Constants that were rematerialized where
    # needed) is dead: drop it and renumber. Nothing depends on it by construction.
    if all(s.outputs for s in out):
        return out
    keep = [s for s in out if s.outputs]
    new_id = {s.id: i for i, s in enumerate(keep)}
    return [
        StageSpec(
            id=new_id[s.id], name=f"{name_prefix}{new_id[s.id]}", device=s.device, nodes=s.nodes, units=s.units,
            inputs=s.inputs, outputs=s.outputs, deps=tuple(new_id[d] for d in s.deps),
            rematerialized=s.rematerialized,
        )
        for s in keep
    ]


# Ops whose result is not a function of their inputs: never duplicated into another stage.
_NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
})


def constant_nodes(index: GraphIndex) -> list[bool]:
    """Per node: does it compute a constant (only from non-overridable initializers and
    other constant nodes, deterministically, without subgraphs)?

    Such values are recomputed inside each stage that reads them instead of crossing a
    stage boundary, so onnxruntime constant-folds them there (prepacked weights, shapes
    known to shape inference) and nothing is transferred per request.
    """
    n = len(index.nodes)
    const = [False] * n
    fixed = {name for name in index.initializers if name not in index.graph_inputs}
    fixed.update(name for name in index.sparse_initializers if name not in index.graph_inputs)
    for nid in index.topological_order():
        ref = index.nodes[nid]
        if ref.domain or ref.has_subgraph or ref.op_type in _NONDETERMINISTIC:
            continue
        ok = True
        for v in ref.inputs:
            p = index.producer.get(v)
            if p is None:
                if v not in fixed:
                    ok = False
                    break
            elif not const[p]:
                ok = False
                break
        const[nid] = ok
    return const


def _add_closure(index: GraphIndex, const: list[bool], nid: int, into: dict[int, None]) -> None:
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
    return stage_model
