"""Cost estimates: analytic (FLOPs and bytes from shapes) and measured (EMA per stage and device)."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto

from hetsched.backends import Device

from .._errors import NotRegularFileError, ProfileError
from .._platform.files import read_regular_file
from .graph import GraphIndex, outer_scope_reads
from .partition import constant_nodes

__all__ = [
    "BOUNDARY",
    "LAUNCH_S",
    "BoundaryCosts",
    "CostTable",
    "CostTableStatistics",
    "NodeCost",
    "analytic_node_costs",
    "device_rates",
    "device_seconds",
    "launch_seconds",
    "modelled_energy_j",
    "roofline",
    "storage_fraction",
    "sync_seconds_per_byte",
    "unit_overhead",
    "value_bytes",
]

_ELEM_SIZE: dict[int, int] = {
    TensorProto.FLOAT: 4, TensorProto.UINT8: 1, TensorProto.INT8: 1, TensorProto.UINT16: 2,
    TensorProto.INT16: 2, TensorProto.INT32: 4, TensorProto.INT64: 8, TensorProto.BOOL: 1,
    TensorProto.FLOAT16: 2, TensorProto.DOUBLE: 8, TensorProto.UINT32: 4, TensorProto.UINT64: 8,
    TensorProto.COMPLEX64: 8, TensorProto.COMPLEX128: 16, TensorProto.BFLOAT16: 2,
}

# Stage-boundary overhead the analytic model charges for running a unit at all (dispatch,
# onnxruntime call setup): an assumed prior, not a measurement; measured costs replace it.
STAGE_OVERHEAD_S = 30e-6

# Fixed cost of one inference call of a stage on a device, by device kind, paid once per
# stage (the planner charges it on every hand-off *into* a device: that is where a new stage
# starts). CPU: the onnxruntime call setup above. NPU: one RKNN ``inference`` / ``rknn_run``
# (driver submission, job wait, input/output format conversion). No published per-call figure
# for the RK3588 NPU was found (Rockchip's RKNN runtime docs and rknn_model_zoo report whole-
# model latencies only), so this is the overhead measured on the RKNN-Toolkit2 simulator: a
# one-node stage through the toolkit worker against the same node in onnxruntime (the method is
# in tests/test_npu_placement.py); a device's ``options["launch_s"]`` overrides it (a figure
# measured on the board). GPU: an assumed prior for a kernel-queue submission and wait.
LAUNCH_S: Mapping[str, float] = {"cpu": STAGE_OVERHEAD_S, "gpu": 100e-6, "npu": 400e-6}


@dataclass(frozen=True)
class BoundaryCosts:
    """What a stage boundary costs: the planner's one named config for it (``build_plan(boundary=...)``).

    A plan is priced as a chain of stage calls. Each hand-off between two devices costs
    ``dispatch_latency_s`` plus the launch of the receiving device's stage (:attr:`launch_s` by
    device kind; a device's ``options["launch_s"]`` wins, see :func:`launch_seconds`) plus the
    tensor's bytes over the link: free between CPUs, a cache sync at the slower device's memory
    bandwidth when an accelerator shares DRAM (:func:`sync_seconds_per_byte`), a copy at
    ``cross_domain_bps`` between memory domains. After the policy placed every unit, each
    connected group of units on one device (a stage-to-be) must *pay for its boundary*: when
    moving the whole group to another device that can run all of it saves more (launches,
    dispatches, bytes) than it costs in compute, it moves (Band's minimum subgraph size, priced
    instead of counted); repeated for at most ``fold_sweeps`` sweeps or until nothing moves.
    ``fold_sweeps=0`` keeps the policy's placement as it is. Priors of the analytic model: no
    per-call figure was measured on a board here (measured stage times replace the estimates).
    """

    launch_s: Mapping[str, float] = field(default_factory=lambda: dict(LAUNCH_S))
    """Fixed seconds of one stage call by device kind (``"cpu"``, ``"gpu"``, ``"npu"``, ``"dla"``)."""
    dispatch_latency_s: float = 40e-6
    """Seconds of one hand-off between two devices besides the receiver's launch (queueing a
    request to another worker)."""
    cross_domain_bps: float = 4.0e9
    """Bytes per second of a copy between two memory domains (a discrete accelerator's)."""
    unit_overhead_s: float = STAGE_OVERHEAD_S
    """Seconds the analytic model adds per unit on a device without a twin model (onnxruntime
    call setup); a twin-modelled device's unit costs its roofline time alone, as the twin counts."""
    fold_sweeps: int = 8

    def __post_init__(self) -> None:
        for name, value in (("dispatch_latency_s", self.dispatch_latency_s), ("unit_overhead_s", self.unit_overhead_s),
                            *((f"launch_s[{k!r}]", v) for k, v in self.launch_s.items())):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                                      and value >= 0):
                raise ValueError(f"BoundaryCosts.{name} must be a finite number of seconds >= 0, got {value!r}")
        if not (self.cross_domain_bps > 0 and math.isfinite(self.cross_domain_bps)):
            raise ValueError(f"BoundaryCosts.cross_domain_bps must be a positive number, got {self.cross_domain_bps!r}")
        if isinstance(self.fold_sweeps, bool) or not isinstance(self.fold_sweeps, int) or self.fold_sweeps < 0:
            raise ValueError(f"BoundaryCosts.fold_sweeps must be an int >= 0, got {self.fold_sweeps!r}")

    def launch(self, device: Device) -> float:
        """Seconds of one stage call on ``device``: its ``options["launch_s"]``, else this config's
        figure for its kind (a DLA without one of its own: the GPU's, same submission queue)."""
        value = device.options.get("launch_s")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
        kind = device.kind
        if kind == "dla" and "dla" not in self.launch_s:
            kind = "gpu"
        return float(self.launch_s.get(kind, self.unit_overhead_s))


BOUNDARY = BoundaryCosts()
"""The default :class:`BoundaryCosts`."""


def device_rates(device: Device) -> tuple[float, float, int | None]:
    """``(FLOP/s, bytes/s, clock Hz)`` of ``device`` now: the rates :func:`roofline` divides by.

    A device that carries a SoC profile domain (a twin's device, the RKNN NPU on a twin's root)
    computes at its domain's current clock (``options["clock"]``, the top OPP when unknown) scaled
    from its ``peak_flops`` (so an NPU device on one of three cores computes at a third of the
    domain's rate), its memory at the memory domain's current bandwidth; any other device at its
    ``peak_flops`` and ``mem_bandwidth`` (clock None).
    """
    opt = device.options
    domain = opt.get("profile_domain")
    if domain is None:
        return max(1.0, device.peak_flops), max(1.0, device.mem_bandwidth), None
    clock = opt.get("clock")
    max_hz = int(domain.max_hz)
    f = (clock(domain.name) if callable(clock) else None) or max_hz
    peak = device.peak_flops if device.peak_flops > 0 else float(domain.ops_per_cycle) * max_hz
    mem = opt.get("memory_domain_profile")
    if mem is None:
        bw = float("inf")
    else:
        fm = (clock(mem.name) if callable(clock) else None) or mem.max_hz
        bw = max(1.0, float(mem.bandwidth_bps(fm)))
    return max(1.0, peak * f / max(1, max_hz)), bw, int(f)


def roofline(device: Device, flops: float, nbytes: float) -> tuple[float, float, float, int | None]:
    """``(seconds, compute seconds, memory seconds, clock Hz)`` of ``flops`` and ``nbytes`` on ``device``
    at its rates now (:func:`device_rates`): seconds = max(compute, memory).

    The one model of a device's time, used by the planner's estimate and by the twin's modelled
    time (``backends.sim.SimStage``) alike.
    """
    fps, bps, f = device_rates(device)
    t_c = max(0.0, flops) / fps
    t_m = max(0.0, nbytes) * storage_fraction(device) / bps
    return max(t_c, t_m), t_c, t_m, f


_STORAGE_FRACTION = {"fp32": 1.0, "tf32": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": 0.25}
# The tensor width an accelerator stores by default, where its hardware has no float32 datapath
# (docs/sources.md [rknn-fp16], [trt-dla]):
# the RK3588 NPU computes int4/int8/int16/fp16/bf16/tf32 and RKNN-Toolkit2 builds float models in
# fp16 (Rockchip, RK3588 datasheet §NPU; RKNN-Toolkit2 user guide, ``float_dtype``), NVDLA v2 computes
# fp16/int8 only (TensorRT, "Working with DLA": DLA runs FP16 or INT8 networks).
_DEFAULT_STORAGE = {"npu": "fp16", "dla": "fp16"}


def storage_fraction(device: Device) -> float:
    """The share of the analytic bytes (counted at the model's declared types, float32 for most
    models) ``device`` moves: its ``options["precision"]`` when set (``"fp16"``: half, ``"int8"``: a
    quarter), else its kind's storage width (fp16 on an NPU or a DLA, which have no float32
    datapath), else 1. The planner's estimate and the twin's modelled time both apply it (in
    :func:`roofline`)."""
    precision = device.options.get("precision", _DEFAULT_STORAGE.get(device.kind))
    return _STORAGE_FRACTION.get(precision, 1.0) if isinstance(precision, str) else 1.0


def device_seconds(device: Device, flops: float, nbytes: float, boundary: BoundaryCosts | None = None) -> float:
    """The planner's estimate of one unit (or stage) on ``device``: :func:`roofline`, plus the
    analytic unit overhead on a device the twin does not model."""
    t = roofline(device, flops, nbytes)[0]
    return t + unit_overhead(device, boundary)


def unit_overhead(device: Device, boundary: BoundaryCosts | None = None) -> float:
    """Seconds the estimate adds per unit on ``device``: none on a twin-modelled device (the twin
    counts the roofline alone; launches are priced at the boundaries), else the analytic overhead."""
    if "profile_domain" in device.options:
        return 0.0
    return boundary.unit_overhead_s if boundary is not None else STAGE_OVERHEAD_S


def launch_seconds(device: Device) -> float:
    """Fixed seconds of one stage call on ``device``: ``options["launch_s"]``, else :data:`LAUNCH_S`
    for its kind. A value that is not a non-negative number counts as absent."""
    value = device.options.get("launch_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return LAUNCH_S.get(device.kind, STAGE_OVERHEAD_S)


def sync_seconds_per_byte(a: Device, b: Device) -> float:
    """Seconds per byte of a hand-off between two devices sharing DRAM when one is an accelerator.

    Zero copy still cleans the producer's cache lines and invalidates the consumer's (the RKNN
    runtime's ``rknn_mem_sync``, a DMA-buf sync for a GPU): one pass over the tensor, priced as
    an assumed prior at the slower device's memory bandwidth. CPU <-> CPU hand-offs are coherent.
    """
    if a.kind == "cpu" and b.kind == "cpu":
        return 0.0
    return 1.0 / max(1.0, min(a.mem_bandwidth, b.mem_bandwidth))


def modelled_energy_j(device: Device, flops: float) -> float | None:
    """Joules one run of ``flops`` of work spends on ``device``, where the device carries a power
    model, else None (unknown: a real device without one).

    A twin device (and the RKNN NPU device on a twin's root) carries its SoC profile's domain in
    ``options["profile_domain"]``; the energy is the one the simulated stage accounts
    (``backends.sim.SimStage.modelled``): the domain's full dynamic power times its compute
    time, at the top operating point, which is what planning assumes the clock will be.
    """
    domain = device.options.get("profile_domain")
    if domain is None:
        return None
    try:
        hz = int(domain.max_hz)
        power_w = float(domain.full_power_w(hz))
        ops_per_cycle = float(domain.ops_per_cycle)
    except (AttributeError, TypeError, ValueError):
        return None  # not a profile domain: no model, so no energy term rather than a guess
    if hz <= 0 or not math.isfinite(power_w) or power_w < 0:
        return None
    return power_w * max(0.0, flops) / max(1.0, ops_per_cycle * hz)


@dataclass(frozen=True, slots=True)
class NodeCost:
    flops: float
    bytes: float


_NO_SHAPE: tuple[None, float, float] = (None, 1.0, 4.0)


def _value(index: GraphIndex, name: str) -> tuple[tuple[list[int], int] | None, float, float]:
    """``(shape and element type, elements, bytes)`` of a value: unknown dims count as 1, an
    unknown type as one 4-byte element. Planning reads each value several times (as an output,
    then per consumer; a shared weight per reader): the protobuf is decoded once per value and
    index, and the sizes computed once."""
    cache: dict[str, tuple[tuple[list[int], int] | None, float, float]] = index.__dict__.setdefault(
        "_value_cache", {})
    got = cache.get(name)
    if got is None:
        et, raw = index.tensor_info(name)
        if et is None or raw is None:
            got = _NO_SHAPE
        else:
            dims = [v if v > 0 else 1 for v in raw]  # a free dim counts as 1, like a negative one
            n = float(math.prod(dims))
            got = ((dims, et), n, n * _ELEM_SIZE.get(et, 4))
        cache[name] = got
    return got


def _shape_of(index: GraphIndex, name: str) -> tuple[list[int], int] | None:
    return _value(index, name)[0]


def value_bytes(index: GraphIndex, name: str) -> float:
    """Bytes of a value from its inferred type; unknown dims count as 1, unknown types as 4 bytes."""
    return _value(index, name)[2]


def _numel(index: GraphIndex, name: str) -> float:
    return _value(index, name)[1]


_HEAVY = frozenset({"Conv", "ConvInteger", "QLinearConv", "ConvTranspose", "MatMul", "MatMulInteger", "Gemm",
                    "QLinearMatMul", "FusedMatMul", "LSTM", "GRU", "RNN"})


def analytic_node_costs(index: GraphIndex) -> list[NodeCost]:
    """FLOPs and bytes moved per node, from inferred shapes (a MAC counts as 2 FLOPs)."""
    costs: list[NodeCost] = []
    graph_nodes = index.graph.node
    for ref in index.nodes:
        op = ref.op_type
        in_bytes = out_bytes = out_elems = 0.0
        for v in ref.inputs:
            in_bytes += _value(index, v)[2]
        for o in ref.outputs:
            _, n, b = _value(index, o)
            out_elems += n
            out_bytes += b
        nbytes = in_bytes + out_bytes
        out_elems = out_elems or 1.0
        flops = out_elems
        if op not in _HEAVY and not ref.has_subgraph:
            costs.append(NodeCost(flops, nbytes))
            continue
        node = graph_nodes[ref.index]
        if op in ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose") and len(node.input) > 1:
            w = _shape_of(index, node.input[1] if op != "QLinearConv" else node.input[3])
            if w is not None:
                per_out = math.prod(w[0][1:])
                if op == "ConvTranspose":
                    flops = 2.0 * _numel(index, node.input[0]) * per_out * (w[0][0] if w[0] else 1)
                else:
                    flops = 2.0 * out_elems * per_out
        elif op in ("MatMul", "MatMulInteger", "Gemm", "QLinearMatMul", "FusedMatMul"):
            a = _shape_of(index, node.input[0])
            if a is not None and a[0]:
                k = a[0][-1]
                if op == "Gemm":
                    trans_a = next((at.i for at in node.attribute if at.name == "transA"), 0)
                    if trans_a and len(a[0]) >= 2:
                        k = a[0][-2]
                flops = 2.0 * out_elems * k
        elif op in ("LSTM", "GRU", "RNN") and len(node.input) > 2:
            w = _shape_of(index, node.input[1])
            r = _shape_of(index, node.input[2])
            x = _shape_of(index, node.input[0])
            if w and r and x:
                flops = 2.0 * (math.prod(w[0]) + math.prod(r[0])) * x[0][0] * (x[0][1] if len(x[0]) > 1 else 1)
        elif ref.has_subgraph:
            flops = max(out_elems * 10.0, _bodies_flops(index, node))
        costs.append(NodeCost(float(flops), float(nbytes)))
    return _fused(index, costs)


# Ops every backend hetsched drives folds into the kernel before them (docs/sources.md [trt-fusion],
# [ort-fusion]): onnxruntime's graph
# optimizations (Conv+BatchNormalization folding, Conv+activation "FusedConv", Conv+Add+Relu),
# TensorRT's pointwise fusion (any chain of pointwise layers after a convolution or a GEMM runs in
# its epilogue), RKNN's compiler (Conv+BN+activation, Conv+Add) and ncnn's (fuse_convolution_*
# passes). A value such an op reads straight from a producer it fuses into stays on the chip.
_POINTWISE = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
    "Softplus", "Mish", "Swish", "Gelu", "Erf", "Exp", "Neg", "Abs", "Sqrt", "Reciprocal", "Pow",
    "BatchNormalization", "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min",
})
_FUSES_INTO = _HEAVY - {"LSTM", "GRU", "RNN"} | _POINTWISE
def _fused(index: GraphIndex, costs: list[NodeCost]) -> list[NodeCost]:
    """The DRAM traffic of ``costs`` (one entry per node of ``index.nodes``) after the fusions every
    backend makes (see ``_POINTWISE``), and with load-time constants folded.

    - A value computed from constants only (:func:`~hetsched._planning.partition.constant_nodes`:
      initializers, ``Constant``, and what depends on them alone, like the ``ConstantOfShape``
      weights of a generated model) is folded at load (onnxruntime's constant folding, RKNN's
      and TensorRT's builders): its node costs nothing per run; its readers read it like a weight.
    - A value produced by a kernel that pointwise ops fuse into (a convolution, a GEMM, a pointwise
      op) and read only by pointwise ops fused into the same kernel (a Conv's output through
      BatchNormalization, Relu; SiLU's Sigmoid and Mul both reading the Conv's output) is never
      written to DRAM nor read back: its bytes are taken off the producer's output and each
      reader's input. A pointwise op fuses into one kernel only (the latest it reads from): of a
      residual ``Add``'s two branches the other one is written and read back. A graph output is
      always written.
    The sums stay additive per node, so a stage's figure is the sum of its nodes' as before (a
    fused edge cut by a stage boundary is counted as fused: the planner's transfer cost prices
    the cut).
    """
    outputs = set(index.graph_outputs)
    flags = constant_nodes(index)
    out = list(costs)
    const: set[str] = set(index.initializers) | set(index.sparse_initializers)
    for i, ref in enumerate(index.nodes):
        if flags[i] and not any(o in outputs for o in ref.outputs):
            const.update(ref.outputs)
            out[i] = NodeCost(0.0, 0.0)
    # Fusion groups, in the graph's (topological) order: a convolution or a GEMM heads one; a
    # pointwise op joins the group of the latest producer it reads a fusable value from (a kernel
    # fuses into one epilogue: of a residual Add's two branches, the other is written and read
    # back), else heads its own (a chain of pointwise ops fuses by itself).
    nodes = index.nodes
    producer = index.producer
    group = list(range(len(nodes)))
    for i, ref in enumerate(nodes):
        if ref.op_type not in _POINTWISE:
            continue
        latest = -1
        for v in ref.inputs:
            p = producer.get(v, -1)
            if p > latest and nodes[p].op_type in _FUSES_INTO and v not in const and v not in outputs:
                latest = p
        if latest >= 0:
            group[i] = group[latest]
    saved = [0.0] * len(out)
    for i, ref in enumerate(nodes):
        if ref.op_type not in _FUSES_INTO or out[i].bytes == 0.0:
            continue
        for o in ref.outputs:
            if not o or o in outputs or o in const:
                continue
            readers = index.consumers.get(o, [])
            if not readers or any(group[r] != group[i] for r in readers):
                continue  # read outside its group (or by a non-pointwise op): written to DRAM
            b = value_bytes(index, o)
            saved[i] += b
            for r in readers:
                saved[r] += b * sum(1 for v in nodes[r].inputs if v == o)
    return [c if s == 0.0 else NodeCost(c.flops, max(0.0, c.bytes - s)) for c, s in zip(out, saved, strict=True)]


def _bodies_flops(index: GraphIndex, node: onnx.NodeProto) -> float:
    """The analytic FLOPs of a control-flow node's costliest body (an ``If``'s branch; a
    ``Loop``/``Scan`` body counted once: the trip count is not known when planning), each body
    indexed as a graph of its own (its values' shapes from its own ``value_info``, those it reads
    from the outer graph from the outer one). 0 where a body cannot be indexed."""
    best = 0.0
    for attr in node.attribute:
        bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else (
            list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else [])
        for body in bodies:
            sub = onnx.ModelProto(ir_version=max(index.model.ir_version, 4))
            sub.opset_import.extend(index.model.opset_import)
            sub.graph.CopyFrom(body)
            try:
                inner = GraphIndex(sub)
                for name in outer_scope_reads(body):  # the outer graph's types for what it reads
                    t = index.value_type(name)
                    if inner.value_type(name) is None and t is not None:
                        vi = onnx.ValueInfoProto(name=name)
                        vi.type.CopyFrom(t)
                        inner.value_info[name] = vi
                flops = sum(c.flops for c in analytic_node_costs(inner))
            except (ValueError, KeyError, IndexError):
                continue  # not indexable alone (e.g. a cycle): the floor stands
            best = max(best, flops)
    return best


@dataclass(frozen=True)
class CostTableStatistics:
    entries: int
    updates: int
    devices_calibrated: int


class CostTable:
    """Measured costs, keyed by (stage or unit signature, device name), smoothed by an EMA.

    ``smoothing`` is the weight of a new sample (Band uses 0.1). A per-device calibration
    factor (measured / analytic, also an EMA) lets measurements of some stages improve
    the estimate of stages never measured on that device. Thread-safe: worker threads
    call :meth:`update`.
    """

    def __init__(self, smoothing: float = 0.1):
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self._lock = threading.Lock()
        self._seconds: dict[tuple[str, str], float] = {}
        self._factor: dict[str, float] = {}
        self._updates = 0

    def update(self, key: str, device: str, seconds: float, *, analytic_s: float | None = None) -> float:
        """Fold one measurement in; returns the smoothed value."""
        a = self.smoothing
        with self._lock:
            old = self._seconds.get((key, device))
            new = seconds if old is None else (1 - a) * old + a * seconds
            self._seconds[(key, device)] = new
            if analytic_s and analytic_s > 0:
                ratio = seconds / analytic_s
                f = self._factor.get(device)
                self._factor[device] = ratio if f is None else (1 - a) * f + a * ratio
            self._updates += 1
            return new

    def get(self, key: str, device: str) -> float | None:
        return self._seconds.get((key, device))

    def factor(self, device: str) -> float:
        return self._factor.get(device, 1.0)

    def statistics(self) -> CostTableStatistics:
        return CostTableStatistics(len(self._seconds), self._updates, len(self._factor))

    def to_json(self) -> dict[str, object]:
        with self._lock:
            return {
                "smoothing": self.smoothing,
                "seconds": [[k, d, v] for (k, d), v in sorted(self._seconds.items())],
                "factor": dict(self._factor),
            }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CostTable:
        """A table from :meth:`to_json`'s dict (values of any shape: JSON from disk).

        :raises ProfileError: a key is missing or a value has the wrong shape.
        """
        try:
            table = cls(float(data.get("smoothing", 0.1)))
            for k, d, v in data["seconds"]:
                table._seconds[(str(k), str(d))] = float(v)
            for d, f in dict(data.get("factor", {})).items():
                table._factor[str(d)] = float(f)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"malformed cost table: {exc}") from exc
        return table

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostTable:
        """The table saved at ``path`` (:meth:`save`).

        :raises ProfileError: ``path`` is not a regular file (a FIFO, a device, a directory, or a
            link to one: refused, never read), cannot be read, is not UTF-8 JSON, or is malformed;
            the message names the file.
        """
        try:
            data = json.loads(read_regular_file(path, what="cost table").decode("utf-8"))
        except NotRegularFileError as exc:
            raise ProfileError(str(exc)) from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProfileError(f"cost table {str(path)!r} could not be read: {exc}") from exc
        if not isinstance(data, dict):
            raise ProfileError(f"cost table {str(path)!r}: expected a JSON object")
        return cls.from_json(data)
