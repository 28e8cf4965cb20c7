"""What probing found in model loading and stage binding (issue 12, failover): missing external
data, stale ``value_info`` baked into stage boundaries, dynamic-shape stages bound into
fixed-shape buffers (onnxruntime logging an error for every output it could not write)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched import InvalidModelError, ModelError, ModelNotFoundError, Session, load_model
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import with_input_shapes
from hetsched.policies import Pinned

F = TensorProto.FLOAT
I64 = TensorProto.INT64
DEVICES = ["cpu:0", "cpu:1"]
ORT_ERROR = "[E:onnxruntime"


def _model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, inits: list | None = None,
           value_info: list | None = None, opsets: list | None = None) -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, initializer=inits or [], value_info=value_info or []),
        opset_imports=opsets or [helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def _alternate(names: list[str]) -> Pinned:
    """Each node on the other CPU than the one before: every value crosses a stage boundary."""
    return Pinned({n: DEVICES[k % 2] for k, n in enumerate(names)})


@pytest.fixture
def ort_errors_logged() -> Iterator[None]:
    """onnxruntime's default logger at ERROR, so that its error lines reach stderr (capfd)."""
    ort.set_default_logger_severity(3)
    yield
    ort.set_default_logger_severity(2)  # onnxruntime's default: warnings


# -- 1. external data -------------------------------------------------------------------------

def _matmul_with_external_weight(tmp_path: Path) -> Path:
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [1, 4])], [helper.make_tensor_value_info("y", F, [1, 4])],
                   [w])
    path = tmp_path / "mm.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="mm.weights", size_threshold=0)
    assert (tmp_path / "mm.weights").is_file()
    return path


def test_a_model_with_its_external_data_loads_from_its_path(tmp_path: Path) -> None:
    model = load_model(_matmul_with_external_weight(tmp_path))
    got = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32).reshape(4, 4))


def test_a_missing_external_data_file_is_a_model_error_naming_the_model_and_the_file(tmp_path: Path) -> None:
    path = _matmul_with_external_weight(tmp_path)
    (tmp_path / "mm.weights").unlink()
    with pytest.raises(ModelNotFoundError) as info:
        load_model(path)
    msg = str(info.value)
    assert str(path) in msg and "'mm.weights'" in msg and "'w'" in msg
    assert isinstance(info.value, ModelError) and info.value.__cause__ is not None  # onnx's own error, chained


@pytest.mark.anyio
async def test_a_session_on_a_model_missing_its_external_data_raises_model_not_found(tmp_path: Path) -> None:
    path = _matmul_with_external_weight(tmp_path)
    (tmp_path / "mm.weights").unlink()
    with pytest.raises(ModelNotFoundError, match=r"mm\.weights"):
        async with Session(path, devices=["cpu:0"]):
            pass


def test_a_truncated_external_data_file_is_an_invalid_model(tmp_path: Path) -> None:
    path = _matmul_with_external_weight(tmp_path)
    with (tmp_path / "mm.weights").open("r+b") as f:
        f.truncate(8)
    with pytest.raises(InvalidModelError, match="external data could not be loaded") as info:
        load_model(path)
    assert info.value.__cause__ is not None


def test_external_data_outside_the_model_directory_is_refused(tmp_path: Path) -> None:
    path = _matmul_with_external_weight(tmp_path / "")
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../elsewhere.weights"
    inner = tmp_path / "inner"
    inner.mkdir()
    onnx.save_model(model, str(inner / "mm.onnx"))
    with pytest.raises(InvalidModelError, match="outside"):
        load_model(inner / "mm.onnx")


def test_bytes_that_refer_to_external_data_are_refused_with_the_file_named(tmp_path: Path) -> None:
    path = _matmul_with_external_weight(tmp_path)
    with pytest.raises(InvalidModelError, match=r"'mm\.weights'.*model's path"):
        load_model(path.read_bytes())
    unloaded = onnx.load(str(path), load_external_data=False)
    with pytest.raises(InvalidModelError, match="'w'"):
        load_model(unloaded)
    load_model(onnx.load(str(path)))  # onnx.load read the data: nothing external is left


# -- 2. stale value_info ----------------------------------------------------------------------

def _transpose_chain(value_info: list[onnx.ValueInfoProto], y_shape: list[int] | None = None) -> onnx.ModelProto:
    """y = -transpose(relu(x)), x: float32 [2, 3]; ``value_info`` declares the intermediates."""
    return _model(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0], name="tr"),
         helper.make_node("Neg", ["t"], ["y"], name="neg")],
        [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, y_shape or [3, 2])],
        value_info=value_info)


STALE = {
    "wrong dims": [helper.make_tensor_value_info("t", F, [2, 3])],
    "wrong rank": [helper.make_tensor_value_info("t", F, [6])],
    "wrong dim of a": [helper.make_tensor_value_info("a", F, [2, 5]), helper.make_tensor_value_info("t", F, [3, 5])],
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", sorted(STALE))
async def test_stale_value_info_does_not_break_a_model_onnxruntime_runs(case: str) -> None:
    model = _transpose_chain(STALE[case])
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    (want,) = _ort(model, {"x": x})  # onnxruntime ignores the stale declaration (it warns)
    async with Session(model, devices=DEVICES, policy=_alternate(["relu", "tr", "neg"]), max_unit_nodes=1) as s:
        assert len(s.plan.stages) == 3
        for _ in range(3):
            out = await s.run({"x": x})
            np.testing.assert_array_equal(out["y"], want)
        st = s.statistics()
        assert not st.unbound_stages and st.stage_runs_bound > 0  # the inferred shapes are the real ones


@pytest.mark.anyio
async def test_a_stale_graph_output_shape_gives_way_to_the_inferred_one() -> None:
    model = _transpose_chain([], y_shape=[2, 3])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (want,) = _ort(model, {"x": x})
    assert want.shape == (3, 2)
    dims = [d.dim_value for d in load_model(model).graph.output[0].type.tensor_type.shape.dim]
    assert dims == [3, 2]
    async with Session(model, devices=DEVICES, policy=_alternate(["relu", "tr", "neg"]), max_unit_nodes=1) as s:
        out = await s.run({"x": x})
        np.testing.assert_array_equal(out["y"], want)
        assert not s.statistics().unbound_stages


def test_a_declared_element_type_that_contradicts_the_graph_is_an_invalid_model() -> None:
    model = _transpose_chain([helper.make_tensor_value_info("t", TensorProto.DOUBLE, [3, 2])])
    with pytest.raises(Exception, match="does not match expected type"):
        _ort(model, {"x": np.zeros((2, 3), np.float32)})  # onnxruntime refuses it too
    with pytest.raises(InvalidModelError, match=r"'t' as DOUBLE.*FLOAT"):
        load_model(model)


def test_loading_leaves_the_callers_model_as_it_was() -> None:
    model = _transpose_chain(STALE["wrong dims"], y_shape=[2, 3])
    before = model.SerializeToString()
    loaded = load_model(model)
    assert model.SerializeToString() == before
    t = GraphIndex(loaded).value_type("t")
    assert t is not None and [d.dim_value for d in t.tensor_type.shape.dim] == [3, 2]


def test_a_graph_output_declared_with_another_element_type_is_an_invalid_model() -> None:
    model = _transpose_chain([])
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(Exception, match="Type Error"):
        _ort(model, {"x": np.zeros((2, 3), np.float32)})  # onnxruntime refuses it too
    with pytest.raises(InvalidModelError, match=r"graph output 'y' is declared INT32.*FLOAT"):
        load_model(model)


def test_a_declaration_for_a_value_inference_cannot_type_is_kept_and_used_downstream() -> None:
    model = _model(
        [helper.make_node("Opaque", ["x"], ["c"], name="opaque", domain="com.example"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [None, None])],
        value_info=[helper.make_tensor_value_info("c", F, [4, 5])],
        opsets=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    index = GraphIndex(load_model(model))
    for name in ("c", "y"):
        t = index.value_type(name)
        assert t is not None and [d.dim_value for d in t.tensor_type.shape.dim] == [4, 5], name


# -- 3. dynamic output shapes are never bound -------------------------------------------------

def _reshape_to_fed_shape() -> onnx.ModelProto:
    """y = -reshape(relu(x), s) with s: int64 [?] fed: not even the rank of the reshape is
    known before it runs (onnxruntime reports its shape as [], as for a scalar)."""
    return _model(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("Reshape", ["a", "s"], ["r"], name="reshape"),
         helper.make_node("Neg", ["r"], ["y"], name="neg")],
        [helper.make_tensor_value_info("x", F, [12]), helper.make_tensor_value_info("s", I64, [None])],
        [helper.make_tensor_value_info("y", F, [None, None])])


@pytest.mark.anyio
@pytest.mark.usefixtures("ort_errors_logged")
async def test_a_stage_of_unknown_output_rank_runs_unbound_from_the_start(capfd: pytest.CaptureFixture[str]) -> None:
    model = _reshape_to_fed_shape()
    x = np.arange(-6, 6, dtype=np.float32)
    async with Session(model, devices=DEVICES, policy=_alternate(["relu", "reshape", "neg"]),
                       max_unit_nodes=1) as s:
        for shape in ([3, 4], [2, 6], [6, 2], [3, 4]):
            feeds: dict[str, np.ndarray] = {"x": x, "s": np.array(shape, np.int64)}
            out = await s.run(feeds)
            np.testing.assert_array_equal(out["y"], _ort(model, feeds)[0])
        st = s.statistics()
        unbound = dict(st.unbound_stages)
    assert ORT_ERROR not in capfd.readouterr().err
    assert len(s.plan.stages) == 3
    reshape_stage = next(spec.name for spec in s.plan.stages if spec.outputs == ("r",))
    assert "output 'r' has a data-dependent shape" in unbound[reshape_stage]
    relu_stage = next(spec.name for spec in s.plan.stages if spec.outputs == ("a",))
    assert relu_stage not in unbound and st.stage_runs_bound == 4  # relu's [12] output is bound


def _nonzero() -> onnx.ModelProto:
    return _model(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("NonZero", ["a"], ["nz"], name="nonzero"),
         helper.make_node("Neg", ["nz"], ["y"], name="neg")],
        [helper.make_tensor_value_info("x", F, [8])], [helper.make_tensor_value_info("y", I64, [1, None])])


def _topk_fed_k() -> onnx.ModelProto:
    return _model(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("TopK", ["a", "k"], ["v", "i"], name="topk"),
         helper.make_node("Neg", ["v"], ["y"], name="neg")],
        [helper.make_tensor_value_info("x", F, [8]), helper.make_tensor_value_info("k", I64, [1])],
        [helper.make_tensor_value_info("y", F, [None])])


@pytest.mark.anyio
@pytest.mark.usefixtures("ort_errors_logged")
@pytest.mark.parametrize("kind", ["nonzero", "topk"])
async def test_data_dependent_output_lengths_run_unbound_with_the_reason_named(
        kind: str, capfd: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(3)
    if kind == "nonzero":
        model, names, out_name = _nonzero(), ["relu", "nonzero", "neg"], "nz"
        feeds = [{"x": rng.standard_normal(8).astype(np.float32)} for _ in range(4)]
    else:
        model, names, out_name = _topk_fed_k(), ["relu", "topk", "neg"], "v"
        feeds = [{"x": rng.standard_normal(8).astype(np.float32), "k": np.array([k], np.int64)} for k in (1, 5, 3, 8)]
    async with Session(model, devices=DEVICES, policy=_alternate(names), max_unit_nodes=1) as s:
        for f in feeds:
            out = await s.run(f)
            np.testing.assert_array_equal(out["y"], _ort(model, f)[0])
        unbound = dict(s.statistics().unbound_stages)
    assert ORT_ERROR not in capfd.readouterr().err
    stage = next(spec.name for spec in s.plan.stages if out_name in spec.outputs)
    assert f"output {out_name!r} has a data-dependent shape" in unbound[stage]


def _flatten_by_shape(batch: str | int) -> onnx.ModelProto:
    """y = -reshape(relu(x), concat(shape(x)[:1], [-1])): a Shape -> Slice -> Concat -> Reshape
    chain, as exporters write a flatten; x: float32 [batch, 6]."""
    return _model(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("Shape", ["x"], ["sh"], name="shape"),
         helper.make_node("Slice", ["sh", "st", "en"], ["sl"], name="slice"),
         helper.make_node("Concat", ["sl", "m1"], ["ns"], axis=0, name="concat"),
         helper.make_node("Reshape", ["a", "ns"], ["r"], name="reshape"),
         helper.make_node("Neg", ["r"], ["y"], name="neg")],
        [helper.make_tensor_value_info("x", F, [batch, 6])], [helper.make_tensor_value_info("y", F, [None, None])],
        [helper.make_tensor("st", I64, [1], [0]), helper.make_tensor("en", I64, [1], [1]),
         helper.make_tensor("m1", I64, [1], [-1])])


@pytest.mark.anyio
@pytest.mark.usefixtures("ort_errors_logged")
async def test_a_free_input_dimension_is_named_and_fixing_it_with_shapes_binds_the_stages(
        capfd: pytest.CaptureFixture[str]) -> None:
    model = _flatten_by_shape("N")
    x = np.arange(-12, 12, dtype=np.float32).reshape(4, 6)
    (want,) = _ort(model, {"x": x})
    pol = Pinned({"relu": "cpu:0", "reshape": "cpu:1", "neg": "cpu:0"}, default="cpu:1")
    async with Session(model, devices=DEVICES, policy=pol, max_unit_nodes=1) as s:
        np.testing.assert_array_equal((await s.run({"x": x}))["y"], want)
        unbound = dict(s.statistics().unbound_stages)
    relu_stage = next(spec.name for spec in s.plan.stages if "a" in spec.outputs)
    assert "free dimension 'N'" in unbound[relu_stage] and "shapes=" in unbound[relu_stage]
    async with Session(model, devices=DEVICES, policy=pol, max_unit_nodes=1, shapes={"x": (4, 6)}) as s:
        for _ in range(3):
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], want)
        st = s.statistics()
        # the reshape's output is [4, 6] once the batch is fixed (shape values propagated)
        assert not st.unbound_stages and st.stage_runs_bound > 0
    assert ORT_ERROR not in capfd.readouterr().err


def test_with_input_shapes_propagates_shape_values_into_a_reshape() -> None:
    fixed = with_input_shapes(load_model(_flatten_by_shape("N")), {"x": (4, 6)})
    t = GraphIndex(fixed).value_type("r")
    assert t is not None and [d.dim_value for d in t.tensor_type.shape.dim] == [4, 6]


@pytest.mark.anyio
@pytest.mark.usefixtures("ort_errors_logged")
async def test_a_static_shape_model_still_binds_every_stage(capfd: pytest.CaptureFixture[str]) -> None:
    model = _flatten_by_shape(4)
    x = np.arange(-12, 12, dtype=np.float32).reshape(4, 6)
    (want,) = _ort(model, {"x": x})
    names = ["relu", "shape", "slice", "concat", "reshape", "neg"]
    async with Session(model, devices=DEVICES, policy=_alternate(names), max_unit_nodes=1) as s:
        for _ in range(3):
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], want)
        st = s.statistics()
        assert not st.unbound_stages
        assert st.stage_runs_bound > 0 and st.stage_runs_unbound == 0
    assert ORT_ERROR not in capfd.readouterr().err
