"""Stage preparation for the RKNN toolkit (pure ONNX rewrites; no toolkit needed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched import CompileError
from hetsched._rknn.prepare import fix_free_dims, fold_passthrough, free_dims, prepare_stage, upgrade_opset

F = TensorProto.FLOAT


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: Sequence[onnx.TensorProto] = (), opset: int = 13) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset >= 13 else 4
    return m


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def dropout9_model() -> onnx.ModelProto:
    """x -> Relu -> Dropout(opset 9, ratio) -> Identity -> y, with a batch dim left free."""
    return _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Dropout", ["r"], ["d"], ratio=0.5),
         helper.make_node("Identity", ["d"], ["y"])],
        [helper.make_tensor_value_info("x", F, ["batch", 4])],
        [helper.make_tensor_value_info("y", F, ["batch", 4])], opset=9)


def test_opset9_dropout_is_upgraded_folded_and_fixed() -> None:
    m = dropout9_model()
    out = prepare_stage(m, {"x": (2, 4)})
    assert _opset(out) == 13 and _opset(m) == 9  # the argument is left alone
    assert [n.op_type for n in out.graph.node] == ["Relu"]
    assert [o.name for o in out.graph.output] == ["y"]
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [2, 4]
    onnx.checker.check_model(out)
    x = np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], np.float32)
    np.testing.assert_array_equal(_run(out, {"x": x})[0], np.maximum(x, 0))


def test_upgrade_keeps_newer_opsets() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])], opset=17)
    assert _opset(upgrade_opset(m)) == 17


def test_fold_rewires_consumers_and_keeps_graph_level_names() -> None:
    m = _model(
        [helper.make_node("Identity", ["x"], ["y0"]),  # graph input -> graph output: must stay
         helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["r"]),
         helper.make_node("Dropout", ["r"], ["d"]), helper.make_node("Neg", ["d"], ["n"]),
         helper.make_node("Identity", ["n"], ["y1"]), helper.make_node("Abs", ["n"], ["y2"])],
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info(n, F, [3]) for n in ("y0", "y1", "y2")])
    out = fold_passthrough(m)
    ops = [n.op_type for n in out.graph.node]
    assert ops == ["Identity", "Relu", "Neg", "Abs"]
    assert out.graph.node[1].input[0] == "x" and out.graph.node[2].output[0] == "y1"
    assert out.graph.node[3].input[0] == "y1"
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    for got, want in zip(_run(out, {"x": x}), _run(m, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)


def test_dropout_with_used_mask_stays() -> None:
    m = _model([helper.make_node("Dropout", ["x"], ["y", "mask"])], [helper.make_tensor_value_info("x", F, [3])],
               [helper.make_tensor_value_info("y", F, [3]), helper.make_tensor_value_info("mask", TensorProto.BOOL, [3])])
    assert [n.op_type for n in fold_passthrough(m).graph.node] == ["Dropout"]


def test_free_dim_without_shape_names_the_input_and_how_to_fix_it() -> None:
    m = dropout9_model()
    assert free_dims(m) == {"x": ["batch", 4]}
    with pytest.raises(CompileError) as e:
        prepare_stage(m)
    msg = str(e.value)
    assert "'x'" in msg and "batch" in msg and "shapes=" in msg and "--shape x=1,4" in msg


@pytest.mark.parametrize(("shape", "words"), [((2, 4, 1), "rank"), ((2, 5), "dim 1"), ((0, 4), "<= 0")])
def test_given_shape_must_agree(shape: tuple[int, ...], words: str) -> None:
    with pytest.raises(CompileError, match=words):
        fix_free_dims(dropout9_model(), {"x": shape})


def test_fixed_shapes_propagate_through_a_conv_net() -> None:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("GlobalAveragePool", ["c"], ["y"])],
               [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])],
               [helper.make_tensor_value_info("y", F, ["N", 4, 1, 1])], [w])
    out = prepare_stage(m, {"x": (1, 3, 8, 8), "other": (5,)})  # shapes of other stages' inputs are ignored
    assert free_dims(out) == {}
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 1, 1]
    assert out.ir_version <= 9
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"x": x})[0], _run(m, {"x": x})[0], rtol=1e-6)
