"""The ncnn backend for real: pnnx converts, ncnn runs on a Vulkan device (Mesa's lavapipe in CI,
NVIDIA's driver on a lent GPU machine), every stage probed against onnxruntime at compile time.

Skipped only when ncnn, pnnx or a Vulkan device is missing (the reason names
``pip install 'hetsched[ncnn]'`` and the Vulkan driver packages). Models are tiny: lavapipe is slow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched import BackendUnavailableError, CompileError, DeviceSpecError
from hetsched.backends import BindableStage, Device
from hetsched.backends._ncnn_convert import ncnn_unavailable_reason, silent_failure
from hetsched.backends.ncnn import NcnnBackend, NcnnStage

_REASON = ncnn_unavailable_reason()
if _REASON is not None:
    pytest.skip(f"ncnn backend unavailable here: {_REASON}", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)
F = TensorProto.FLOAT


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 13) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _two_in_two_out() -> onnx.ModelProto:
    """conv(x) -> relu -> (+ y -> maxpool, sigmoid): 2 inputs, 2 outputs of different shapes."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "y"], ["s"]),
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Sigmoid", ["r"], ["q"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 16, 16]),
                          helper.make_tensor_value_info("y", F, [1, 8, 16, 16])],
                  [helper.make_tensor_value_info("p", F, [1, 8, 8, 8]),
                   helper.make_tensor_value_info("q", F, [1, 8, 16, 16])], [w, b])


def _feeds(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32),
            "y": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)}


def _ref(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def _dev(cache: Path, **options: object) -> Device:
    return Device(name="gpu", kind="gpu", backend="ncnn", options={"cache_dir": str(cache), **options})


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "ncnn-cache"


@pytest.mark.parametrize(("precision", "floor"), [("fp32", 0.99999), ("fp16", 0.999)])
def test_a_stage_converts_probes_and_runs_like_onnxruntime(cache: Path, precision: str, floor: float) -> None:
    model = _two_in_two_out()
    backend = NcnnBackend()
    stage = backend.compile(model, _dev(cache, precision=precision), name="s")
    try:
        assert isinstance(stage, NcnnStage) and isinstance(stage, BindableStage)
        st = stage.statistics()
        assert not st.cached and st.precision == precision
        assert st.accuracy is not None and st.accuracy.min_cosine >= floor  # the compile-time probe
        feeds = _feeds()
        out = stage.run(feeds)
        for got, want in zip(out, _ref(model, feeds), strict=True):  # outputs mapped by position
            assert got.shape == want.shape
            assert _cos(got, want) >= floor
        # in place: inputs wrapped without a copy, each output copied once into the given memory
        bufs = [np.full(s, np.nan, np.float32) for _dt, s in stage.output_specs()]
        before = stage.statistics()
        stage.run_into(feeds, bufs)
        after = stage.statistics()
        np.testing.assert_allclose(bufs[0], out[0], rtol=0, atol=0)
        assert after.input_copies == before.input_copies and after.output_copies == before.output_copies + 2
        stage.run_into({"x": np.asfortranarray(feeds["x"]), "y": feeds["y"].astype(np.float64)}, bufs)
        assert stage.statistics().input_copies == after.input_copies + 2  # counted, never hidden
        assert backend.statistics().probes == 1
    finally:
        stage.close()


def test_inputs_whose_channels_ncnn_pads_are_copied_into_its_layout_once(cache: Path) -> None:
    """A 13x13 channel is 676 bytes; ncnn's layers read channels 16-byte aligned (cstep 172 floats),
    so a wrapped array would be read skewed: such an input is copied once (counted), and right."""
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "W")
    m = _model([helper.make_node("Conv", ["x", "W"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 8, 13, 13])],
               [helper.make_tensor_value_info("y", F, [1, 4, 13, 13])], [w])
    stage = cast(NcnnStage, NcnnBackend().compile(m, _dev(cache), name="odd"))
    try:
        x = rng.standard_normal((1, 8, 13, 13)).astype(np.float32)
        before = stage.statistics().input_copies
        (got,) = stage.run({"x": x})
        assert _cos(got, _ref(m, {"x": x})[0]) > 0.99999
        assert stage.statistics().input_copies == before + 1
    finally:
        stage.close()


def test_a_bad_input_fails_the_run_not_the_stage(cache: Path) -> None:
    stage = NcnnBackend().compile(_two_in_two_out(), _dev(cache), name="s")
    try:
        from hetsched import StageExecutionError

        with pytest.raises(StageExecutionError, match="shape"):
            stage.run({"x": np.zeros((1, 3, 8, 8), np.float32), "y": _feeds()["y"]})
        assert len(stage.run(_feeds())) == 2
    finally:
        stage.close()
    with pytest.raises(StageExecutionError, match="closed"):
        stage.run(_feeds())


def test_the_silent_pnnx_cases_are_refused_before_conversion(cache: Path) -> None:
    backend = NcnnBackend()
    pool = _model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[0, 0, 1, 1])],
                  [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                  [helper.make_tensor_value_info("y", F, [1, 4, 7, 7])])
    batch2 = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 4, 8, 8])],
                    [helper.make_tensor_value_info("y", F, [2, 4, 8, 8])])
    ints = _model([helper.make_node("Neg", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 4])])
    for model, words in ((pool, "asymmetric pads"), (batch2, "batch 2"), (ints, "INT64")):
        with pytest.raises(CompileError, match=words):
            backend.compile(model, _dev(cache), name="x")
    assert backend.statistics().cache.conversions == 0  # refused before pnnx ran
    assert backend.statistics().refused == 3


def _softmax9(gap: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((10, 4, 1, 1)).astype(np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"])]
    if gap:
        nodes.append(helper.make_node("GlobalAveragePool", ["c"], ["c2"]))
    nodes.append(helper.make_node("Softmax", ["c2" if gap else "c"], ["y"], axis=1))
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 4, 4, 4] if gap else [1, 4, 1, 1])],
                  [helper.make_tensor_value_info("y", F, [1, 10, 1, 1])], [w], opset=9)


def test_opset9_softmax_on_a_4d_tensor_is_raised_to_opset13_and_right(cache: Path) -> None:
    """pnnx converts opset-9 Softmax on [1,C,1,1] (squeezenet's tail) to a softmax over a size-1
    axis (every value ~1) and exits 0; the backend raises the stage to opset 13 first."""
    m9 = _softmax9(gap=True)
    assert silent_failure(onnx.shape_inference.infer_shapes(m9)) is not None  # as shipped: screened
    stage = NcnnBackend().compile(m9, _dev(cache), name="sm")
    try:
        x = np.random.default_rng(3).standard_normal((1, 4, 4, 4)).astype(np.float32)
        (got,) = stage.run({"x": x})
        (want,) = _ref(m9, {"x": x})
        assert _cos(got, want) > 0.99999 and abs(float(got.sum()) - 1.0) < 1e-4
    finally:
        stage.close()


def test_a_conversion_that_disagrees_with_onnxruntime_is_refused_with_the_figures(cache: Path) -> None:
    """Measured: pnnx infers the batch axis from the ops it sees; Relu then Concat(axis=1) over a raw
    input fixes none, so ncnn concatenates along h (pnnx exits 0). The compile-time probe refuses
    it (never run), with the figures, and the refusal is cached."""
    backend = NcnnBackend()
    m = _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Concat", ["a", "x"], ["y"], axis=1)],
               [helper.make_tensor_value_info("x", F, [1, 8, 16, 16])], [helper.make_tensor_value_info("y", F, [1, 16, 16, 16])])
    refusal: str | None = None
    try:
        stage = backend.compile(m, _dev(cache), name="bad")
    except CompileError as exc:
        refusal = str(exc)
    if refusal is not None:
        assert "disagrees with onnxruntime" in refusal and "cosine" in refusal
        with pytest.raises(CompileError, match="disagrees"):
            backend.compile(m, _dev(cache), name="bad")
        assert backend.statistics().cache.refusals_cached == 1
        return
    try:  # a later pnnx that converts it right: then it must match
        x = np.random.default_rng(3).standard_normal((1, 8, 16, 16)).astype(np.float32)
        assert _cos(stage.run({"x": x})[0], _ref(m, {"x": x})[0]) > 0.99999
    finally:
        stage.close()


def test_the_cache_answers_a_second_compile_and_rejects_tampered_or_linked_entries(cache: Path, tmp_path: Path) -> None:
    model = _two_in_two_out()
    backend = NcnnBackend()
    backend.compile(model, _dev(cache), name="a").close()
    second = cast(NcnnStage, backend.compile(model, _dev(cache), name="b"))
    key = second.statistics().cache_key
    assert second.statistics().cached
    second.close()
    stats = backend.statistics()
    assert stats.cache.conversions == 1 and stats.cache.cache_hits == 1 and stats.probes == 1
    entry = cache / key[:2]
    # tampered weights (same size): the content check rejects the entry and it is converted again
    weights = entry / f"{key}.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    third = cast(NcnnStage, backend.compile(model, _dev(cache), name="c"))
    assert not third.statistics().cached
    third.close()
    assert backend.statistics().cache.rejected == 1 and backend.statistics().cache.conversions == 2
    # a link planted in place of a file is never followed: not read, and replaced (not written through)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(weights.read_bytes())
    weights.unlink()
    weights.symlink_to(outside)
    fourth = cast(NcnnStage, backend.compile(model, _dev(cache), name="d"))
    assert not fourth.statistics().cached
    fourth.close()
    assert backend.statistics().cache.rejected == 2
    assert not weights.is_symlink() and outside.read_bytes() == weights.read_bytes()
    # a link in place of the entry's folder: never followed (not read, not written through); the
    # link itself is replaced by a real folder and the stage converted again
    os.rename(entry, tmp_path / "moved")
    entry.symlink_to(tmp_path / "moved")
    moved = {p.name: p.read_bytes() for p in (tmp_path / "moved").iterdir()}
    fifth = cast(NcnnStage, backend.compile(model, _dev(cache), name="e"))
    assert not fifth.statistics().cached
    fifth.close()
    assert backend.statistics().cache.rejected >= 3 and backend.statistics().cache.conversions == 4
    assert entry.is_dir() and not entry.is_symlink()
    assert {p.name: p.read_bytes() for p in (tmp_path / "moved").iterdir()} == moved


def test_a_stored_refusal_is_raised_without_converting(cache: Path) -> None:
    backend = NcnnBackend()
    # a layer pnnx cannot map (LpNormalization): pnnx's own failure or ncnn's load failure, refused
    m = _model([helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=1)],
               [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])], [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])])
    try:
        backend.compile(m, _dev(cache), name="lp").close()
        pytest.skip("this pnnx/ncnn converts LpNormalization correctly: no refusal to cache")
    except CompileError as exc:
        first = str(exc)
    with pytest.raises(CompileError) as again:
        backend.compile(m, _dev(cache), name="lp")
    assert str(again.value) == first
    s = backend.statistics().cache
    assert s.conversions == 1 and s.refusals_cached == 1


def test_options_are_validated(cache: Path) -> None:
    backend = NcnnBackend()
    with pytest.raises(DeviceSpecError, match="precision"):
        backend.compile(_two_in_two_out(), _dev(cache, precision="int8"), name="s")
    with pytest.raises(DeviceSpecError, match="vulkan_device"):
        backend.compile(_two_in_two_out(), _dev(cache, vulkan_device=99), name="s")


def test_without_ncnn_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_ncnn(name: str, *a: object, **k: object) -> object:
        if name == "ncnn":
            raise ImportError("No module named 'ncnn'")
        return real(name, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_ncnn)
    from hetsched.backends._ncnn_convert import import_ncnn

    with pytest.raises(BackendUnavailableError, match=r"hetsched\[ncnn\]"):
        import_ncnn()
    assert "hetsched[ncnn]" in (ncnn_unavailable_reason() or "")


def test_an_ncnn_stage_goes_through_the_probe_contract_and_a_wrong_count_is_a_cached_refusal(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ncnn's compile-time check is ``backends._probe.probe_stage`` (one contract for every
    accelerator): an ncnn run that returns an extra output is refused with the contract's words
    and cached as a refusal (the old private check zipped the outputs strictly and raised a bare
    ValueError out of compile)."""
    from hetsched.backends import _probe

    calls: list[str] = []
    real = _probe.probe_stage

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs["precision"])
        return real(*args, **kwargs)

    monkeypatch.setattr("hetsched.backends.ncnn.probe_stage", spy)
    good = NcnnBackend().compile(_two_in_two_out(), _dev(cache), name="ok")
    good.close()
    assert calls == ["float32"]
    real_run = NcnnStage.run
    monkeypatch.setattr(NcnnStage, "run", lambda self, feeds, state=None: [*real_run(self, feeds), np.zeros(2)])
    backend = NcnnBackend()
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                   [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])])
    with pytest.raises(CompileError, match="failed its probe run: it returned 2 output"):
        backend.compile(model, _dev(cache), name="extra")
    with pytest.raises(CompileError, match="failed its probe run: it returned 2 output"):
        backend.compile(model, _dev(cache), name="extra")
    assert backend.statistics().cache.refusals_cached == 1
