"""An index over an ONNX graph: producers, consumers, outer-scope reads, types, op costs.

Built once per model in linear time; the partitioner and the cost model read it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

import onnx
from onnx import AttributeProto

__all__ = ["GraphIndex", "outer_scope_reads"]


def _subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def outer_scope_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads that it does not define itself (If/Loop/Scan bodies)."""
    defined: set[str] = {i.name for i in graph.input}
    defined.update(t.name for t in graph.initializer)
    defined.update(t.values.name for t in graph.sparse_initializer)
    used: set[str] = set()
    for node in graph.node:
        defined.update(o for o in node.output if o)
        used.update(i for i in node.input if i)
        for sub in _subgraphs(node):
            used |= outer_scope_reads(sub)
    return used - defined


@dataclass(frozen=True, slots=True)
class NodeRef:
    """What the partitioner needs to know about one node."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    """Every value the node reads, including outer-scope reads of its subgraphs."""
    outputs: tuple[str, ...]
    has_subgraph: bool


class GraphIndex:
    """Linear-time index of a model's main graph."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.graph = graph
        self.opsets: dict[str, int] = {o.domain or "": o.version for o in model.opset_import}
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self.sparse_initializers: dict[str, onnx.SparseTensorProto] = {
            t.values.name: t for t in graph.sparse_initializer
        }
        # Before IR 4 every initializer had to be listed as a graph input too; onnxruntime treats
        # those as constants (not feedable, not overridable), and so does hetsched: they are not
        # graph inputs here, so the constants they feed are folded into the stages that read them.
        listed_only = model.ir_version < 4
        self.graph_inputs: list[str] = [
            i.name for i in graph.input
            if not (listed_only and (i.name in self.initializers or i.name in self.sparse_initializers))
        ]
        self.required_inputs: list[str] = [
            n for n in self.graph_inputs if n not in self.initializers and n not in self.sparse_initializers
        ]
        self.graph_outputs: list[str] = [o.name for o in graph.output]
        self._init_types: dict[str, onnx.TypeProto] = {}
        self._tensor_info: dict[str, tuple[int | None, list[int] | None]] = {}
        self.value_info: dict[str, onnx.ValueInfoProto] = {}
        for vi in graph.value_info:
            self.value_info[vi.name] = vi
        for vi in graph.output:
            self.value_info[vi.name] = vi
        for vi in graph.input:
            self.value_info[vi.name] = vi

        nodes: list[NodeRef] = []
        self.producer: dict[str, int] = {}
        for idx, node in enumerate(graph.node):
            subs = list(_subgraphs(node))
            ins = [i for i in node.input if i]
            if subs:
                seen = set(ins)
                for sub in subs:
                    for name in sorted(outer_scope_reads(sub)):
                        if name not in seen:
                            seen.add(name)
                            ins.append(name)
            outs = tuple(o for o in node.output if o)
            name = node.name or f"{node.op_type}_{idx}"
            nodes.append(NodeRef(idx, name, node.op_type, node.domain or "", tuple(ins), outs, bool(subs)))
            for o in outs:
                self.producer[o] = idx
        self.nodes = nodes

        # Edges between nodes (deduplicated); values read but produced by no node are
        # graph inputs, initializers or outer names.
        preds: list[list[int]] = [[] for _ in nodes]
        succs: list[list[int]] = [[] for _ in nodes]
        self.consumers: dict[str, list[int]] = {}
        for n in nodes:
            seen_p: set[int] = set()
            for v in n.inputs:
                self.consumers.setdefault(v, []).append(n.index)
                p = self.producer.get(v)
                if p is not None and p not in seen_p and p != n.index:
                    seen_p.add(p)
                    preds[n.index].append(p)
                    succs[p].append(n.index)
        self.preds = preds
        self.succs = succs
        self._in_order: bool | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    def topological_order(self, keys: list[int] | None = None) -> list[int]:
        """Kahn's algorithm; among ready nodes prefer the same ``keys[i]`` as the last one taken.

        Preferring the same key (e.g. the capability mask, or the device) keeps nodes
        that can be grouped next to each other, so runs are maximal.
        """
        n = len(self.nodes)
        if self._numbered_in_order() and (keys is None or len(set(keys)) <= 1):
            # Kahn's smallest-ready-first on a graph whose node numbers are a topological order
            # (as ONNX files list them) is that numbering: no heap needed.
            return list(range(n))
        indeg = [len(p) for p in self.preds]
        if keys is None:
            ready = [i for i in range(n) if indeg[i] == 0]
            heapq.heapify(ready)
            order: list[int] = []
            while ready:
                i = heapq.heappop(ready)
                order.append(i)
                for s in self.succs[i]:
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        heapq.heappush(ready, s)
        else:
            by_key: dict[int, list[int]] = {}
            for i in range(n):
                if indeg[i] == 0:
                    heapq.heappush(by_key.setdefault(keys[i], []), i)
            order = []
            current: int | None = None
            while by_key:
                if current is None or not by_key.get(current):
                    # Switch to the key whose earliest ready node comes first in file order.
                    current = min(by_key, key=lambda k: by_key[k][0])
                bucket = by_key[current]
                i = heapq.heappop(bucket)
                if not bucket:
                    del by_key[current]
                order.append(i)
                for s in self.succs[i]:
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        heapq.heappush(by_key.setdefault(keys[s], []), s)
        if len(order) != n:
            from .._errors import InvalidModelError

            raise InvalidModelError("graph has a cycle: nodes cannot be ordered topologically")
        return order

    def _numbered_in_order(self) -> bool:
        """Does every node come after its predecessors in the file (checked once)?"""
        if self._in_order is None:
            self._in_order = all(p < i for i, ps in enumerate(self.preds) for p in ps)
        return self._in_order

    def value_type(self, name: str) -> onnx.TypeProto | None:
        vi = self.value_info.get(name)
        if vi is not None and vi.type.WhichOneof("value") is not None:
            return vi.type
        cached = self._init_types.get(name)
        if cached is not None:
            return cached
        init = self.initializers.get(name)
        if init is not None:
            # Built once per initializer: shared weights are read by many nodes, and the
            # cost model asks for every input of every node. Callers only read it.
            t = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
            self._init_types[name] = t
            return t
        return None

    def tensor_info(self, name: str) -> tuple[int | None, list[int] | None]:
        """``(element type, dims)`` of a value: the element type (``TensorProto`` enum) None when it
        is not a typed tensor, the dims None without a shape (a free or unknown dim reads 0).
        Decoded from the protobuf once per value: the capability checks and the cost model ask
        for every input and output of every node."""
        try:
            return self._tensor_info[name]
        except KeyError:
            t = self.value_type(name)
            info: tuple[int | None, list[int] | None] = (None, None)
            if t is not None and t.WhichOneof("value") == "tensor_type":
                tt = t.tensor_type
                info = (tt.elem_type, [d.dim_value for d in tt.shape.dim] if tt.HasField("shape") else None)
            self._tensor_info[name] = info
            return info

    def elem_type(self, name: str) -> int | None:
        """The element type of a tensor value (``TensorProto`` enum), None when it is not a typed
        tensor (see :meth:`tensor_info`)."""
        return self.tensor_info(name)[0]
