"""Fixed input shapes never break a model's control flow (issue 24: Silero VAD on the RK3588 twin).

onnxruntime type-checks every branch of an ``If`` against the declared dims of the values the
branch reads, also the branch that never runs at those shapes. Silero VAD's 8 kHz branch (and a
small model below whose ``else`` branch adds a ``[1, 256]`` bias) only type-checks with the
input's dims free, so a stage declared with the fixed dims (``shapes=`` / ``--shape``) was refused
by onnxruntime ("compiles on none of its devices"). A stage's control flow now reads its inputs
with free dims (rank kept); the fixed shapes still hold at the session's boundary.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched import InputError, Session, resolve_devices
from hetsched._planning.fold import control_flow_reads, relax_control_flow_inputs
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import with_input_shapes
from hetsched._planning.partition import StageSpec, extract_stage
from hetsched.testing import build_board_tree


def _if_model() -> onnx.ModelProto:
    """``y = flag ? relu(x) : x + w`` with ``w`` of shape [1, 256]: at x [1, 512] only the then
    branch type-checks (onnxruntime refuses the model when x is declared [1, 512])."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"])
    w = numpy_helper.from_array(np.ones([1, 256], np.float32), "w256")
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n", "m"])])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "w256"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", "m"])])
    scale = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("If", ["flag"], ["b"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Mul", ["b", "two"], ["y"])]
    g = helper.make_graph(nodes, "if_model", [x, flag], [y], [w, scale])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


FEEDS = {"x": np.linspace(-1, 1, 512, dtype=np.float32).reshape(1, 512), "flag": np.array(True)}


def test_onnxruntime_refuses_the_if_model_declared_at_fixed_dims() -> None:
    """The premise: the refusal is onnxruntime's own, not something hetsched adds."""
    fixed = with_input_shapes(_if_model(), {"x": (1, 512)})
    with pytest.raises(Exception, match="Incompatible dimensions"):
        ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"])


def test_the_stage_of_an_if_declares_its_inputs_free_and_runs() -> None:
    index = GraphIndex(with_input_shapes(_if_model(), {"x": (1, 512)}))
    spec = StageSpec(id=0, name="stage0", device="cpu", nodes=(0, 1), units=(0,), inputs=("x", "flag"),
                     outputs=("y",), deps=())
    stage = extract_stage(index, spec)
    dims = {vi.name: [(d.dim_value, d.dim_param) for d in vi.type.tensor_type.shape.dim] for vi in stage.graph.input}
    assert dims["x"] == [(0, "x_dim0"), (0, "x_dim1")]  # rank kept, dims free
    assert dims["flag"] == []
    (got,) = ort.InferenceSession(stage.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, FEEDS)
    np.testing.assert_array_equal(got, 2 * np.maximum(FEEDS["x"], 0))


def test_a_stage_without_control_flow_keeps_its_fixed_dims() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    assert control_flow_reads(model.graph.node) == set()
    assert relax_control_flow_inputs(model).SerializeToString() == before


def test_control_flow_reads_names_the_values_a_body_reads_from_outside() -> None:
    model = _if_model()
    reads = control_flow_reads(model.graph.node)
    assert {"flag", "x", "w256"} <= reads and "two" not in reads and "b" not in reads


def test_a_session_with_fixed_shapes_runs_a_model_with_if() -> None:
    async def go() -> np.ndarray:
        async with Session(_if_model(), devices=["cpu:0"], shapes={"x": (1, 512)}) as s:
            (got,) = (await s.run(FEEDS)).values()
            with pytest.raises(InputError):  # the fixed shape still holds at the boundary
                await s.run({"x": np.ones([1, 256], np.float32), "flag": np.array(True)})
            return np.asarray(got)

    np.testing.assert_array_equal(anyio.run(go), 2 * np.maximum(FEEDS["x"], 0))


def _silero() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("silero-vad is not installed (pip install silero-vad): the real model of this test")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


def test_silero_vad_runs_on_the_rk3588_twin_with_fixed_shapes(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = _silero()
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "cache"))
    root = build_board_tree(tmp_path / "rk3588", "rk3588")
    devices = resolve_devices(None, root=root)
    assert any(d.kind == "npu" for d in devices)
    feeds = {"input": (np.random.default_rng(1).standard_normal([1, 512]) * 0.1).astype(np.float32),
             "state": np.zeros([2, 1, 128], np.float32), "sr": np.array(16000, np.int64)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)

    async def go() -> tuple[list[np.ndarray], str]:
        async with Session(path, devices=devices, root=root,
                           shapes={"input": (1, 512), "state": (2, 1, 128)}) as s:
            out = await s.run(None, feeds)
            return [np.asarray(o) for o in out], s.plan.table()

    got, table = anyio.run(go)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert "control-flow" in table  # the If's reason for not going to the NPU


def test_an_accelerator_gets_the_fixed_dims_back() -> None:
    """The relaxed declaration is for onnxruntime only: the stage records the fixed dims and an
    accelerator's converter (static shapes only) takes them back (the NPU then refuses the control
    flow in the toolkit's own words, not for a free dim hetsched made)."""
    from hetsched._planning.fold import CONTROL_FLOW_DIMS, restore_control_flow_dims

    index = GraphIndex(with_input_shapes(_if_model(), {"x": (1, 512)}))
    spec = StageSpec(id=0, name="stage0", device="npu", nodes=(0, 1), units=(0,), inputs=("x", "flag"),
                     outputs=("y",), deps=())
    stage = extract_stage(index, spec)
    assert {p.key for p in stage.metadata_props} == {CONTROL_FLOW_DIMS}
    back = restore_control_flow_dims(stage)
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in back.graph.input}
    assert dims == {"x": [1, 512], "flag": []} and not back.metadata_props
    assert restore_control_flow_dims(back) is back  # nothing recorded: the same model
    # the relaxed stage itself is unchanged by restoring a copy
    assert [d.dim_param for d in stage.graph.input[0].type.tensor_type.shape.dim] == ["x_dim0", "x_dim1"]
