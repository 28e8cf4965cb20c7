"""Shape arithmetic never crosses a stage boundary; free dims are named before anything runs (issue 24).

A YOLOv8-style export with dynamic axes (``tests/_yolo_models.py``): its head reshapes through
``Shape -> Gather -> Concat`` chains and builds the anchor grid from ``Shape -> Cast -> Range``,
so a plan of the unfolded graph hands 0-d float and int64 ``[2]`` tensors from the NPU stage to
a CPU stage, which the RKNN toolkit drops (the stage then fails at its first run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _yolo_models import yolov8_style

from hetsched import FreeDimsError, InputError, Session, resolve_devices
from hetsched._planning.fold import fold_shape_arithmetic, shape_boundaries
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import load_model, with_input_shapes
from hetsched._planning.plan import Plan, build_plan
from hetsched._session._setup import load_index, plan_and_compile, shape_refusals
from hetsched.testing import build_board_tree

SHAPE = (1, 3, 64, 64)


@pytest.fixture(scope="module")
def yolo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("yolo") / "yolov8-style.onnx"
    onnx.save(yolov8_style(), str(path))
    return path


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


def _twin_devices(root: Path) -> list:
    return resolve_devices(["npu", "big", "little"], root=root, available_cpus=range(8))


def test_folding_at_fixed_shapes_removes_every_shape_node_and_keeps_the_results(yolo: Path) -> None:
    fixed = with_input_shapes(load_model(yolo), {"images": SHAPE})
    folded, stats = fold_shape_arithmetic(fixed)
    ops = [n.op_type for n in folded.graph.node]
    assert stats.folded > 0 and stats.rounds >= 1
    for op in ("Shape", "Gather", "Range", "Cast", "Expand"):
        assert op not in ops, ops
    onnx.checker.check_model(folded)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    (want,) = ort.InferenceSession(str(yolo), providers=["CPUExecutionProvider"]).run(None, {"images": x})
    (got,) = ort.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"images": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_a_model_without_shape_arithmetic_comes_back_unchanged() -> None:
    from _rknn_models import conv_net

    model = conv_net()
    folded, stats = fold_shape_arithmetic(model)
    assert folded is model and stats.folded == 0


def test_free_dims_keep_their_shape_arithmetic(yolo: Path) -> None:
    # nothing is constant while the input's dims are free: onnxruntime runs the chains
    model = load_model(yolo)
    folded, _ = fold_shape_arithmetic(model)
    assert sum(n.op_type == "Shape" for n in folded.graph.node) == sum(n.op_type == "Shape" for n in model.graph.node)


def test_no_stage_hands_on_shape_arithmetic_with_fixed_shapes(yolo: Path, twin_root: Path) -> None:
    index, _ = load_index(yolo, {"images": SHAPE})
    plan = build_plan(index, _twin_devices(twin_root), "power-thermal")
    assert shape_boundaries(index, plan.stages, plan.graph_outputs) == [], plan.table()
    assert len(plan.stages) <= 3, plan.table()
    npu = [s for s in plan.stages if s.device == "npu"]
    convs = sum(n.op_type == "Conv" for n in index.nodes)
    assert npu and sum(index.nodes[n].op_type == "Conv" for s in npu for n in s.nodes) == convs, plan.table()


@pytest.fixture
def unguarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner without its own guard (merge_stages computes shape arithmetic in each stage
    reading it): what it did before, so the check behind it is seen to work."""
    from hetsched._planning import partition

    monkeypatch.setattr(partition, "shape_nodes", lambda index: [False] * len(index.nodes))


def test_the_unfolded_plan_hands_on_shape_tensors_and_the_check_finds_them(yolo: Path, twin_root: Path,
                                                                           unguarded: None) -> None:
    # what the planner did before folding: the check itself must see 0-d and int64 shape outputs
    index = GraphIndex(with_input_shapes(load_model(yolo), {"images": SHAPE}))
    plan = build_plan(index, _twin_devices(twin_root), "power-thermal")
    found = shape_boundaries(index, plan.stages, plan.graph_outputs)
    assert {b.reason for b in found} == {"a 0-d tensor", "an integer tensor computed from a shape"}, plan.table()
    assert all(b.device == "npu" for b in found)
    refused = shape_refusals(index, plan)
    assert refused and all(dev == "npu" and "must not hand on" in why for (_, dev), why in refused.items())


def test_plan_and_compile_places_shape_arithmetic_units_off_the_accelerator(yolo: Path, twin_root: Path,
                                                                           unguarded: None) -> None:
    # the guard where folding cannot help: the refused units leave the NPU before anything compiles
    index = GraphIndex(with_input_shapes(load_model(yolo), {"images": SHAPE}))
    devices = _twin_devices(twin_root)
    refusals: dict[tuple[str, str], str] = {}
    seen = []

    def build(refused):  # type: ignore[no-untyped-def]
        plan = build_plan(index, devices, "power-thermal", refused=refused)
        seen.append(plan)
        if shape_refusals(index, plan):
            return plan
        raise _Stop(plan)

    with pytest.raises(_Stop) as stop:
        plan_and_compile(index, build, refusals)
    final = stop.value.plan
    assert len(seen) >= 2 and refusals
    kinds = {d.name: d.kind for d in final.devices}
    accel = [s for s in final.stages if kinds[s.device] != "cpu"]
    assert shape_boundaries(index, accel, final.graph_outputs) == []


def test_the_planner_itself_keeps_unfolded_shape_arithmetic_with_its_readers(yolo: Path, twin_root: Path) -> None:
    # the same unfolded index: merge_stages computes each shape value in the stage reading it
    index = GraphIndex(with_input_shapes(load_model(yolo), {"images": SHAPE}))
    plan = build_plan(index, _twin_devices(twin_root), "power-thermal")
    assert shape_boundaries(index, plan.stages, plan.graph_outputs) == [], plan.table()
    assert shape_refusals(index, plan) == {}


class _Stop(Exception):
    def __init__(self, plan: Plan) -> None:
        super().__init__("stop")
        self.plan = plan


# -- free dims ------------------------------------------------------------------------------------------


def test_an_accelerator_session_names_every_free_dim_and_the_shape_to_pass(yolo: Path, twin_root: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio

    (npu,) = resolve_devices(["npu"], root=twin_root)

    async def go() -> None:
        async with Session(yolo, devices=[npu, "cpu:0"], root=twin_root):
            pass

    with pytest.raises(FreeDimsError) as exc:
        anyio.run(go)
    err = exc.value
    assert isinstance(err, InputError)
    assert "input 'images' has free dims batch, height, width" in str(err)
    assert "--shape images=1,3,640,640" in str(err) and "example sizes" in str(err)
    assert err.inputs == {"images": ("batch", "height", "width")}
    assert err.suggestion == {"images": (1, 3, 640, 640)}


def test_ultralytics_imgsz_metadata_is_the_suggested_size(tmp_path: Path, twin_root: Path) -> None:
    from hetsched._session._feeds import require_fixed_shapes

    model = yolov8_style()
    onnx.helper.set_model_props(model, {"imgsz": "[320, 416]"})
    with pytest.raises(FreeDimsError, match=r"--shape images=1,3,320,416"):
        require_fixed_shapes(GraphIndex(model), "test")


def test_a_cpu_only_session_keeps_running_free_dims(yolo: Path) -> None:
    import anyio

    ref = ort.InferenceSession(str(yolo), providers=["CPUExecutionProvider"])

    async def go() -> None:
        async with Session(yolo, devices=["cpu:0"]) as s:
            for hw in ((64, 64), (96, 128)):
                x = np.random.default_rng(1).standard_normal((1, 3, *hw)).astype(np.float32)
                (got,) = (await s.run({"images": x})).values()
                np.testing.assert_array_equal(np.asarray(got), ref.run(None, {"images": x})[0])

    anyio.run(go)


@pytest.mark.parametrize("command", ["plan", "profile", "run", "compile"])
def test_every_cli_command_says_it_in_one_line_before_anything_runs(yolo: Path, tmp_path: Path,
                                                                     command: str) -> None:
    argv = [sys.executable, "-m", "hetsched", command, str(yolo)]
    if command == "compile":
        argv += ["--out", str(tmp_path / "out")]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if "FreeDimsError" in ln]
    assert len(lines) == 1, res.stderr
    assert "input 'images' has free dims batch, height, width: pass --shape images=1,3,640,640" in lines[0]
    assert "compiling" not in res.stderr and "Traceback" not in res.stderr


def test_a_folded_scalar_stays_a_scalar() -> None:
    """``Size(Shape(x))`` is a 0-d rank that ``Range`` requires as such (the ONNX suite's expanded
    RMSNormalization): the folded initializer keeps rank 0, and onnxruntime runs the result."""

    from onnx import TensorProto, helper, numpy_helper

    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["shape"], ["rank"]),
             helper.make_node("Identity", ["zero"], ["start"]),  # not shape arithmetic: Range stays
             helper.make_node("Range", ["start", "rank", "one"], ["axes"]),
             helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [one, zero])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    folded, _ = fold_shape_arithmetic(model)
    rank = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}["rank"]
    assert rank.shape == () and int(rank) == 2
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})
    assert float(y) == float(x.mean())
