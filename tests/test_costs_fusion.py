"""The analytic memory traffic after the fusions every backend makes (88cab20): a pointwise epilogue
read straight from the kernel it fuses into moves no DRAM bytes, a load-time constant costs nothing
per run, and an NPU or a DLA stores fp16 (``storage_fraction``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import load_model
from hetsched._planning.costs import analytic_node_costs, roofline, storage_fraction, value_bytes
from hetsched._planning.graph import GraphIndex
from hetsched.backends import Device, DeviceKind

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _tensor(name: str, shape: list[int], seed: int = 0) -> onnx.TensorProto:
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return helper.make_tensor(name, F, shape, a.ravel().tolist())


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], outputs: list[tuple[str, list[int]]],
           x_shape: tuple[int, ...] = (1, 3, 8, 8)) -> GraphIndex:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(x_shape))],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs], initializer=inits)
    return GraphIndex(load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))


_BN_PARAMS = ("scale", "bias", "mean", "var")


def _conv_bn_relu(extra_outputs: tuple[str, ...] = (), maxpool_reads_c: bool = False) -> GraphIndex:
    """x [1,3,8,8] -> Conv (4 filters) -> c -> BatchNormalization -> b -> Relu -> r (a graph output);
    ``extra_outputs`` also lists intermediates as graph outputs, ``maxpool_reads_c`` adds a MaxPool
    reading ``c`` (a second, non-pointwise reader)."""
    inits = [_tensor("w", [4, 3, 3, 3])] + [_tensor(p, [4], i + 1) for i, p in enumerate(_BN_PARAMS)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", *_BN_PARAMS], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu")]
    outputs = [("r", [1, 4, 8, 8])] + [(o, [1, 4, 8, 8]) for o in extra_outputs]
    if maxpool_reads_c:
        nodes.append(helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"))
        outputs.append(("p", [1, 4, 4, 4]))
    return _model(nodes, inits, outputs)


def _by_op(index: GraphIndex) -> dict[str, float]:
    costs = analytic_node_costs(index)
    return {ref.op_type: c.bytes for ref, c in zip(index.nodes, costs, strict=True)}


def _unfused(index: GraphIndex) -> dict[str, float]:
    """Every node reading all its inputs from DRAM and writing all its outputs to it."""
    vb = value_bytes
    return {ref.op_type: sum(vb(index, v) for v in ref.inputs if v) + sum(vb(index, o) for o in ref.outputs if o)
            for ref in index.nodes}


def test_conv_bn_relu_moves_no_intermediate_bytes() -> None:
    index = _conv_bn_relu()
    got, full = _by_op(index), _unfused(index)
    vb = lambda name: value_bytes(index, name)  # noqa: E731
    c, b = vb("c"), vb("b")
    assert c == b == 4 * 4 * 8 * 8  # float32 [1, 4, 8, 8]
    assert got["Conv"] == vb("x") + vb("w")  # reads its input and weights, writes nothing to DRAM
    assert got["BatchNormalization"] == sum(vb(p) for p in _BN_PARAMS)  # its parameters only
    assert got["Relu"] == vb("r")  # writes the graph output
    # below the unfused sum by exactly a write and a read of each fused intermediate
    assert sum(full.values()) - sum(got.values()) == 2 * c + 2 * b
    assert all(v > 0 for v in got.values())


def test_silu_reading_the_conv_output_twice_fuses() -> None:
    # Sigmoid and Mul both read the Conv's output; the Sigmoid's output goes to the Mul only.
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    index = _model(nodes, [_tensor("w", [4, 3, 3, 3])], [("y", [1, 4, 8, 8])])
    got = _by_op(index)
    assert got["Conv"] == value_bytes(index, "x") + value_bytes(index, "w")
    assert got["Sigmoid"] == 0.0
    assert got["Mul"] == value_bytes(index, "y")


def test_a_graph_output_is_always_written() -> None:
    index = _conv_bn_relu(extra_outputs=("b",))
    got, full = _by_op(index), _unfused(index)
    c, b = value_bytes(index, "c"), value_bytes(index, "b")
    assert got["BatchNormalization"] == full["BatchNormalization"] - c  # still writes b
    assert got["Relu"] == full["Relu"]  # reads b back
    assert sum(full.values()) - sum(got.values()) == 2 * c
    # the Conv's own output as a graph output: nothing is fused after it either
    index = _conv_bn_relu(extra_outputs=("c",))
    got, full = _by_op(index), _unfused(index)
    assert got["Conv"] == full["Conv"]
    assert got["BatchNormalization"] == full["BatchNormalization"] - b
    assert sum(full.values()) - sum(got.values()) == 2 * b


def test_an_intermediate_with_a_non_pointwise_reader_is_written() -> None:
    index = _conv_bn_relu(maxpool_reads_c=True)
    got, full = _by_op(index), _unfused(index)
    b = value_bytes(index, "b")
    assert got["Conv"] == full["Conv"]  # c is written: the MaxPool reads it from DRAM
    assert got["MaxPool"] == full["MaxPool"]
    assert got["BatchNormalization"] == full["BatchNormalization"] - b  # reads c, b stays on chip
    assert got["Relu"] == full["Relu"] - b
    assert sum(full.values()) - sum(got.values()) == 2 * b


def test_a_pointwise_op_after_a_non_fusing_kernel_is_not_fused() -> None:
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Relu", ["p"], ["y"])]
    index = _model(nodes, [], [("y", [1, 3, 4, 4])])
    assert _by_op(index) == _unfused(index)


def _const_weight_conv(weight_from: str) -> GraphIndex:
    """A Conv whose weight [4, 3, 3, 3] is a generated value: ``ConstantOfShape`` of an initializer
    shape (the onnx wheel's light models), or ``RandomNormal`` (drawn anew each run)."""
    if weight_from == "ConstantOfShape":
        inits = [helper.make_tensor("wshape", I64, [4], [4, 3, 3, 3])]
        gen = [helper.make_node("ConstantOfShape", ["wshape"], ["w0"],
                                value=helper.make_tensor("v", F, [1], [0.01]), name="gen")]
    else:
        inits = []
        gen = [helper.make_node("RandomNormal", [], ["w0"], shape=[4, 3, 3, 3], dtype=F, name="gen")]
    inits.append(helper.make_tensor("two", F, [], [2.0]))
    nodes = [*gen, helper.make_node("Mul", ["w0", "two"], ["w"], name="scale"),
             helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    return _model(nodes, inits, [("y", [1, 4, 8, 8])])


def test_a_constant_of_shape_weight_costs_nothing_per_run() -> None:
    index = _const_weight_conv("ConstantOfShape")
    costs = {ref.name: c for ref, c in zip(index.nodes, analytic_node_costs(index), strict=True)}
    assert costs["gen"].flops == costs["gen"].bytes == 0.0
    assert costs["scale"].flops == costs["scale"].bytes == 0.0  # depends on constants only
    w = value_bytes(index, "w")
    assert w == 4 * 4 * 3 * 3 * 3
    # the Conv reads the folded value like a weight
    assert costs["conv"].bytes == value_bytes(index, "x") + w + value_bytes(index, "y")
    assert costs["conv"].flops == 2.0 * 4 * 8 * 8 * 3 * 3 * 3


def test_a_random_normal_weight_is_not_folded() -> None:
    index = _const_weight_conv("RandomNormal")
    costs = {ref.name: c for ref, c in zip(index.nodes, analytic_node_costs(index), strict=True)}
    w0 = value_bytes(index, "w0")
    assert w0 == 4 * 4 * 3 * 3 * 3
    assert costs["gen"].bytes == w0 and costs["gen"].flops > 0
    # the Mul reads the drawn value and writes w for the Conv (not pointwise: written to DRAM)
    assert costs["scale"].bytes == w0 + value_bytes(index, "two") + value_bytes(index, "w")
    assert costs["conv"].bytes == value_bytes(index, "x") + value_bytes(index, "w") + value_bytes(index, "y")


def test_a_constant_graph_output_is_computed() -> None:
    # a value of constants only that is a graph output is still produced by the run
    inits = [helper.make_tensor("k", F, [4], [1.0, 2.0, 3.0, 4.0])]
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["k"], ["z"])]
    index = _model(nodes, inits, [("y", [1, 3, 8, 8]), ("z", [4])])
    got = _by_op(index)
    assert got["Neg"] == 2 * 4 * 4


def _dev(kind: DeviceKind, **options: object) -> Device:
    return Device(name=f"{kind}0", kind=kind, backend="cpu", peak_flops=1e12, mem_bandwidth=1e10, options=options)


@pytest.mark.parametrize(("kind", "options", "fraction"), [
    ("npu", {}, 0.5),
    ("dla", {}, 0.5),
    ("cpu", {}, 1.0),
    ("gpu", {}, 1.0),
    ("cpu", {"precision": "int8"}, 0.25),
    ("npu", {"precision": "int8"}, 0.25),
    ("gpu", {"precision": "fp16"}, 0.5),
    ("npu", {"precision": "fp32"}, 1.0),
    ("npu", {"precision": "float8-e4m3"}, 1.0),  # an unknown precision: the declared bytes
    ("cpu", {"precision": "no-such"}, 1.0),
    ("npu", {"precision": 16}, 1.0),  # not a string
])
def test_storage_fraction(kind: DeviceKind, options: dict[str, object], fraction: float) -> None:
    assert storage_fraction(_dev(kind, **options)) == fraction


def test_roofline_memory_seconds_halve_on_an_npu() -> None:
    npu, cpu = _dev("npu"), _dev("cpu")
    nbytes = 4.0e8
    t_npu, c_npu, m_npu, _ = roofline(npu, 1.0, nbytes)
    t_cpu, c_cpu, m_cpu, _ = roofline(cpu, 1.0, nbytes)
    assert m_cpu == pytest.approx(nbytes / 1e10)
    assert m_npu == pytest.approx(m_cpu / 2)
    assert c_npu == c_cpu  # compute is not scaled
    assert (t_npu, t_cpu) == (m_npu, m_cpu)  # memory-bound on both
    # compute-bound work costs the same on both
    assert roofline(npu, 1e12, 1.0)[0] == roofline(cpu, 1e12, 1.0)[0] == pytest.approx(1.0)


def test_a_residual_add_fuses_into_one_branch_only() -> None:
    # Add(a, b) of two convolutions' outputs: the Add runs in one kernel's epilogue (the latest
    # producer it reads), so the other branch is written to DRAM and read back.
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool")]
    index = _model(nodes, [_tensor("w1", [4, 3, 3, 3]), _tensor("w2", [4, 3, 3, 3], 1)], [("y", [1, 4, 4, 4])])
    got = {ref.name: c.bytes for ref, c in zip(index.nodes, analytic_node_costs(index), strict=True)}
    vb = lambda name: value_bytes(index, name)  # noqa: E731
    assert got["conv_a"] == vb("x") + vb("w1") + vb("a")  # written
    assert got["conv_b"] == vb("x") + vb("w2")  # fused with the Add and the Relu
    assert got["add"] == vb("a")  # reads the other branch back, s stays on chip
    assert got["relu"] == vb("r")  # written for the MaxPool
    full = sum(sum(vb(v) for v in ref.inputs) + sum(vb(o) for o in ref.outputs) for ref in index.nodes)
    assert full - sum(got.values()) == 2 * vb("b") + 2 * vb("s")
