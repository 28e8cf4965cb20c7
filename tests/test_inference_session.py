"""``hetsched.InferenceSession`` against onnxruntime's own ``InferenceSession``.

The first part follows the inference-session tests of onnxruntime's Python API suite
(onnxruntime/test/python/onnxruntime_test_python.py: test_run_model, test_run_model2,
test_run_model_symbolic_input, test_boolean_inputs, test_list_as_input,
test_raise_wrong_num_inputs, test_model_meta, test_profiler_with_session_options,
test_graph_optimization_level, test_run_model_multiple_threads, test_get_providers,
test_deserialization_from_path_object), on equivalent models built here, each checked
against what onnxruntime itself answers for the same model. Then shapes that change from call
to call (one plan per shape signature on a board with an accelerator), and two real PyPI
packages that wrap onnxruntime, run unchanged with ``InferenceSession`` replaced.
"""

from __future__ import annotations

import json
import pathlib
import threading
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

import hetsched
from hetsched.testing import build_board_tree

IR = 8  # an IR version every supported onnxruntime loads


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] | None = None, opset: int = 13, **props: Any) -> bytes:
    g = helper.make_graph(nodes, "test_graph", inputs, outputs, inits or [], doc_string="graph doc")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="hetsched-tests",
                          domain="ai.test", model_version=3, doc_string="model doc")
    m.ir_version = IR
    if props:
        helper.set_model_props(m, props)
    return m.SerializeToString()


def mul_1() -> bytes:
    """Y = X * X, X float [3, 2] (onnxruntime's testdata/mul_1.onnx)."""
    return _model([helper.make_node("Mul", ["X", "X"], ["Y"])],
                  [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])])


def matmul(rows: int | str | None = 3) -> bytes:
    """Y = X @ [[1], [2]] (matmul_1.onnx; with a symbolic row count, matmul_2.onnx)."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [2, 1], [1.0, 2.0])
    return _model([helper.make_node("MatMul", ["X", "W"], ["Y"])],
                  [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, 2])],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, 1])], [w])


def logical_and() -> bytes:
    """Two bool inputs, the first in the protobuf first (logicaland.onnx)."""
    return _model([helper.make_node("And", ["input1:0", "input:0"], ["output:0"])],
                  [helper.make_tensor_value_info("input1:0", TensorProto.BOOL, [2, 2]),
                   helper.make_tensor_value_info("input:0", TensorProto.BOOL, [2, 2])],
                  [helper.make_tensor_value_info("output:0", TensorProto.BOOL, [2, 2])])


def overridable() -> bytes:
    """An initializer also listed as a graph input (a feed may override it)."""
    b = helper.make_tensor("B", TensorProto.FLOAT, [2], [10.0, 20.0])
    return _model([helper.make_node("Add", ["A", "B"], ["C"])],
                  [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["n", 2]),
                   helper.make_tensor_value_info("B", TensorProto.FLOAT, [2])],
                  [helper.make_tensor_value_info("C", TensorProto.FLOAT, ["n", 2])], [b],
                  character="a\nb\nc", note="custom metadata")


def conv_dynamic() -> bytes:
    """A conv net with free height and width (an OCR detector's input)."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], rng.standard_normal(108).astype(np.float32))
    return _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "height", "width"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "height", "width"])], [w])


MODELS = {"mul_1": mul_1, "matmul_1": matmul, "matmul_2": lambda: matmul("None"), "matmul_unknown": lambda: matmul(None),
          "logicaland": logical_and, "overridable": overridable, "conv_dynamic": conv_dynamic}


def _args(args: list[Any]) -> list[tuple[str, Any, str]]:
    return [(a.name, a.shape, a.type) for a in args]


@pytest.fixture
def cpu() -> list[str]:
    return ["CPUExecutionProvider"]


# -- the surface, compared with onnxruntime's answers ---------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_node_args_and_metadata_match_onnxruntime(name: str, cpu: list[str]) -> None:
    data = MODELS[name]()
    ref = ort.InferenceSession(data, providers=cpu)
    with hetsched.InferenceSession(data, providers=cpu) as sess:
        assert _args(sess.get_inputs()) == _args(ref.get_inputs())
        assert _args(sess.get_outputs()) == _args(ref.get_outputs())
        assert _args(sess.get_overridable_initializers()) == _args(ref.get_overridable_initializers())
        mine, theirs = sess.get_modelmeta(), ref.get_modelmeta()
        for field in ("producer_name", "graph_name", "domain", "description", "graph_description", "version",
                      "custom_metadata_map"):
            assert getattr(mine, field) == getattr(theirs, field), field
        assert sess.get_providers() == ref.get_providers() == ["CPUExecutionProvider"]
        assert sess.get_provider_options() == {"CPUExecutionProvider": {}}


def test_real_models_node_args_match_onnxruntime(cpu: list[str]) -> None:
    models = pathlib.Path(pytest.importorskip("rapidocr_onnxruntime").__file__).parent / "models"
    paths = sorted(models.glob("*.onnx"))
    assert len(paths) >= 3
    for path in paths:
        ref = ort.InferenceSession(str(path), providers=cpu)
        with hetsched.InferenceSession(path, providers=cpu) as sess:
            assert _args(sess.get_inputs()) == _args(ref.get_inputs()), path.name
            assert _args(sess.get_outputs()) == _args(ref.get_outputs()), path.name
            assert sess.get_modelmeta().custom_metadata_map == ref.get_modelmeta().custom_metadata_map


def test_run_model(cpu: list[str]) -> None:
    with hetsched.InferenceSession(mul_1(), providers=cpu) as sess:
        x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)
        res = sess.run([], {sess.get_inputs()[0].name: x})
        np.testing.assert_allclose(res[0], x * x)
        assert isinstance(res, list) and len(res) == 1
        assert sess.run(None, {"X": x})[0].tolist() == res[0].tolist()


def test_run_model2_and_a_non_contiguous_input(cpu: list[str]) -> None:
    with hetsched.InferenceSession(matmul(), providers=cpu) as sess:
        x = np.array([[2.0, 1.0], [4.0, 3.0], [6.0, 5.0]], dtype=np.float32)[:, [1, 0]]
        assert sess.get_inputs()[0].shape == [3, 2] and sess.get_outputs()[0].shape == [3, 1]
        (y,) = sess.run(["Y"], {"X": x})
        np.testing.assert_allclose(y, [[5.0], [11.0], [17.0]])


def test_run_model_symbolic_input(cpu: list[str]) -> None:
    with hetsched.InferenceSession(matmul("None"), providers=cpu) as sess:
        assert sess.get_inputs()[0].shape == ["None", 2]
        for rows in (3, 1, 7):  # any row count, one session
            x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
            (y,) = sess.run(["Y"], {"X": x})
            np.testing.assert_allclose(y, x @ np.array([[1.0], [2.0]], dtype=np.float32))
        assert sess.statistics().compilations == 1 and not sess.statistics().per_shape


def test_boolean_inputs_keep_the_graphs_order(cpu: list[str]) -> None:
    with hetsched.InferenceSession(logical_and(), providers=cpu) as sess:
        assert [a.name for a in sess.get_inputs()] == ["input1:0", "input:0"]
        assert sess.get_inputs()[0].type == "tensor(bool)"
        a = np.array([[True, True], [False, False]])
        b = np.array([[True, False], [True, False]])
        (out,) = sess.run(["output:0"], {"input1:0": a, "input:0": b})
        np.testing.assert_equal(out, [[True, False], [False, False]])


def test_a_list_is_converted_to_the_inputs_type(cpu: list[str]) -> None:
    with hetsched.InferenceSession(mul_1(), providers=cpu) as sess:
        (y,) = sess.run([], {"X": [[1, 2], [3, 4], [5, 6]]})
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, [[1.0, 4.0], [9.0, 16.0], [25.0, 36.0]])


def test_errors_are_hetscheds_and_onnxruntimes(cpu: list[str]) -> None:
    with hetsched.InferenceSession(logical_and(), providers=cpu) as sess:
        a = np.array([[True, True], [False, False]])
        with pytest.raises(ValueError, match=r"Required inputs \(\['input1:0'\]\) are missing from input feed") as e:
            sess.run([], {"input:0": a})
        assert isinstance(e.value, hetsched.InputError) and isinstance(e.value, ort_state.InvalidArgument)
        with pytest.raises(ort_state.InvalidArgument, match="dtype"):
            sess.run([], {"input1:0": a.astype(np.float32), "input:0": a})
        with pytest.raises(hetsched.InputError, match="shape"):
            sess.run([], {"input1:0": np.ones((3, 2), bool), "input:0": a})
        with pytest.raises(ort_state.InvalidArgument, match="output name"):
            sess.run(["nope"], {"input1:0": a, "input:0": a})
        with pytest.raises(hetsched.InputError, match="not an input"):
            sess.run([], {"input1:0": a, "input:0": a, "extra": a})
    with pytest.raises(ort_state.NoSuchFile) as nf:
        hetsched.InferenceSession("/no/such/model.onnx", providers=cpu)
    assert isinstance(nf.value, hetsched.ModelNotFoundError)
    with pytest.raises(ort_state.InvalidProtobuf):
        hetsched.InferenceSession(b"not a model", providers=cpu)


def test_a_closed_session_says_so(cpu: list[str]) -> None:
    sess = hetsched.InferenceSession(mul_1(), providers=cpu)
    sess.close()
    sess.close()  # idempotent
    with pytest.raises(hetsched.RuntimeStateError) as e:
        sess.run(None, {"X": np.ones((3, 2), np.float32)})
    assert isinstance(e.value, ort_state.Fail)


def test_deserialization_from_a_path_object(tmp_path: pathlib.Path, cpu: list[str]) -> None:
    path = tmp_path / "mul_1.onnx"
    path.write_bytes(mul_1())
    with hetsched.InferenceSession(path, providers=cpu) as sess:
        assert sess.model_path == str(path)
        assert sess.run(None, {"X": np.ones((3, 2), np.float32)})[0].sum() == 6


def test_profiling_writes_hetscheds_trace(tmp_path: pathlib.Path, cpu: list[str]) -> None:
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = hetsched.InferenceSession(mul_1(), sess_options=so, providers=cpu)
    sess.run([], {"X": np.ones((3, 2), np.float32)})
    assert sess.get_profiling_start_time_ns() > 0
    trace = sess.end_profiling()
    assert trace.startswith(str(tmp_path / "prof"))
    events = json.loads(pathlib.Path(trace).read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    # the session keeps working after end_profiling(), without tracing
    assert sess.run(None, {"X": np.ones((3, 2), np.float32)})[0].sum() == 6
    assert sess.end_profiling() == ""
    sess.close()


def test_sess_options_with_a_meaning_are_honoured(cpu: list[str]) -> None:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1  # accepted, ignored
    with hetsched.InferenceSession(logical_and(), sess_options=so, providers=cpu) as sess:
        (session,) = sess.sessions()
        (dev,) = session.devices
        assert len(dev.cpus) == 1
        assert dev.options["graph_optimization_level"] == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        assert sess.get_session_options() is so
        a = np.array([[True, True], [False, False]])
        sess.run([], {"input1:0": a, "input:0": a})


def test_run_from_several_threads(cpu: list[str]) -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)
    errors: list[BaseException] = []
    with hetsched.InferenceSession(mul_1(), providers=cpu) as sess:

        def work() -> None:
            try:
                for _ in range(20):
                    np.testing.assert_allclose(sess.run([], {"X": x})[0], x * x)
            except BaseException as exc:  # collected for the assert below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and sess.statistics().runs == 80


def test_providers_without_a_device_here_are_ignored_with_a_warning(cpu: list[str]) -> None:
    with pytest.warns(UserWarning, match="DmlExecutionProvider"):
        sess = hetsched.InferenceSession(mul_1(), providers=["DmlExecutionProvider", "CPUExecutionProvider"])
    with sess:
        assert sess.get_providers() == ["CPUExecutionProvider"]
    # this host has no GPU: the CUDA provider falls back to the CPU, as onnxruntime's CPU build does
    with pytest.warns(UserWarning, match="not available"):
        sess = hetsched.InferenceSession(mul_1(), providers=[("CUDAExecutionProvider", {"device_id": 0}),
                                                             "CPUExecutionProvider"])
    with sess:
        assert sess.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(ValueError, match="same length"):
        hetsched.InferenceSession(mul_1(), providers=cpu, provider_options=[{}, {}])


# -- shapes from call to call on a board with an accelerator -------------------------------------


def test_a_plan_per_shape_signature_on_an_accelerator(tmp_path: pathlib.Path) -> None:
    root = build_board_tree(tmp_path, "orin-nx")
    data = conv_dynamic()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    with hetsched.InferenceSession(data, providers=["TensorrtExecutionProvider", "CPUExecutionProvider"],
                                   root=root, max_plans=2) as sess:
        assert sess.get_providers() == ["TensorrtExecutionProvider", "CPUExecutionProvider"]
        assert sess.statistics().per_shape and sess.statistics().compilations == 0  # free dims: at first run
        shapes = [(16, 24), (32, 32), (16, 24), (8, 8)]
        for h, w in shapes:
            x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
            (y,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(y, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        st = sess.statistics()
        assert (st.compilations, st.cache_hits, st.evictions, st.open_plans) == (3, 1, 1, 2)
        devices = {stage.device for s in sess.sessions() for stage in s.plan.stages}
        assert "gpu" in devices


def test_shapes_compile_up_front(tmp_path: pathlib.Path) -> None:
    root = build_board_tree(tmp_path, "orin-nx")
    with hetsched.InferenceSession(conv_dynamic(), providers=["TensorrtExecutionProvider"], root=root,
                                   shapes={"x": [1, 3, 16, 16]}) as sess:
        assert sess.statistics().compilations == 1
        sess.run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})
        assert sess.statistics().cache_hits == 1


# -- real onnxruntime clients, run unchanged ---------------------------------------------------------


def _text_image() -> np.ndarray:
    cv2 = pytest.importorskip("cv2")
    img = np.full((160, 480, 3), 255, np.uint8)
    cv2.putText(img, "Hello 2026", (20, 100), cv2.FONT_HERSHEY_SIMPLEX, 2.0, (0, 0, 0), 4)
    return img


def test_rapidocr_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """RapidOCR (PyPI rapidocr-onnxruntime): PP-OCR detection, direction classification and CRNN
    recognition; its wrapper passes SessionOptions and providers, reads the character set from
    ``get_modelmeta().custom_metadata_map`` and feeds each image and text line at its own size."""
    infer_engine = pytest.importorskip("rapidocr_onnxruntime.utils.infer_engine")
    from rapidocr_onnxruntime import RapidOCR

    img = _text_image()
    expected, _ = RapidOCR()(img)
    monkeypatch.setattr(infer_engine, "InferenceSession", hetsched.InferenceSession)
    engine = RapidOCR()
    assert isinstance(engine.text_det.infer.session, hetsched.InferenceSession)
    got, _ = engine(img)
    assert got == expected and got[0][1] == "Hello 2026"


def test_ddddocr_runs_unchanged_with_the_one_line_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """ddddocr (PyPI ddddocr): a captcha recogniser with a free width, called through
    ``onnxruntime.InferenceSession`` itself, which the app's one line replaces."""
    ddddocr = pytest.importorskip("ddddocr")
    image = pytest.importorskip("PIL.Image")
    draw = pytest.importorskip("PIL.ImageDraw")
    font = pytest.importorskip("PIL.ImageFont")
    import io

    pngs = []
    for text, width in (("a3K9", 120), ("hetsched7", 220)):
        img = image.new("RGB", (width, 40), "white")
        draw.Draw(img).text((8, 5), text, fill="black", font=font.load_default(size=28))
        buf = io.BytesIO()
        img.save(buf, "PNG")
        pngs.append(buf.getvalue())
    expected = [ddddocr.DdddOcr(show_ad=False, beta=beta).classification(p) for beta in (False, True) for p in pngs]
    monkeypatch.setattr(ort, "InferenceSession", hetsched.InferenceSession)  # the app's one line
    got = [ddddocr.DdddOcr(show_ad=False, beta=beta).classification(p) for beta in (False, True) for p in pngs]
    assert got == expected and expected[0] == "a3K9"


def _toolkit_missing() -> str | None:
    from hetsched._rknn.env import find_toolkit_python

    try:
        find_toolkit_python()
    except hetsched.BackendUnavailableError as exc:
        return str(exc)
    return None


@pytest.mark.timeout(600)
def test_the_rknpu_provider_runs_each_shape_on_the_npu(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rockchip's toolkit and its simulator compile the NPU stage for each new shape signature."""
    if (why := _toolkit_missing()) is not None:
        pytest.skip(f"no rknn-toolkit2 environment (hetsched setup rknn): {why}")
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "rknn-cache"))
    root = build_board_tree(tmp_path / "board", "rk3588")
    data = conv_dynamic()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    with hetsched.InferenceSession(data, providers=["RknpuExecutionProvider", "CPUExecutionProvider"],
                                   root=root) as sess:
        assert sess.get_providers() == ["RknpuExecutionProvider", "CPUExecutionProvider"]
        for h, w in ((16, 16), (16, 32)):
            x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
            (y,) = sess.run(None, {"x": x})
            (want,) = ref.run(None, {"x": x})
            cos = float(np.dot(y.ravel(), want.ravel()) / (np.linalg.norm(y) * np.linalg.norm(want)))
            assert y.shape == want.shape and cos > 0.999
        assert sess.statistics().compilations == 2
        assert all(any(st.device.startswith("npu") for st in s.plan.stages) for s in sess.sessions())
