"""A compiled accelerator stage proves itself before it is placed; vendor workers keep their
litter to themselves; a YOLOv8-style export with dynamic axes runs on the RK3588 twin's NPU (issue 24).

The contract (``backends/_probe.py``) is tested with plain runners; the RKNN path with the real
rknn-toolkit2 simulator (skipped without its environment).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _yolo_models import yolov8_style

from hetsched import BackendUnavailableError, CompileError, Session, resolve_devices
from hetsched._planning.fold import shape_boundaries
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import load_model, with_input_shapes
from hetsched._planning.partition import StageSpec, extract_stage
from hetsched.backends._probe import PROBE, probe_stage
from hetsched.testing import build_board_tree

from _rknn_models import conv_net

F32 = np.dtype(np.float32)
SPECS = [(F32, (1, 3, 32, 32))]


def _reference(model: onnx.ModelProto):  # type: ignore[no-untyped-def]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda xs: sess.run(None, {"x": xs[0]})


def test_a_stage_that_agrees_passes_its_probe() -> None:
    model = conv_net()
    res = probe_stage(_reference(model), model.SerializeToString(), ["x"], SPECS, precision="float16", device="npu")
    assert res.outputs == 1 and res.min_cosine > 0.9999


@pytest.mark.parametrize(("runner", "words"), [
    (lambda ref: (lambda xs: [*ref(xs), np.zeros(2, np.int64)]), "returned 2 output(s), onnxruntime 1"),
    (lambda ref: (lambda xs: [ref(xs)[0].reshape(10, 1)]), "output 0 has shape [10, 1], onnxruntime's [1, 10]"),
    (lambda ref: (lambda xs: [-ref(xs)[0]]), "below the float16 floor 0.99"),
])
def test_a_stage_that_disagrees_is_refused_with_the_reason(runner, words: str) -> None:  # type: ignore[no-untyped-def]
    model = conv_net()
    with pytest.raises(CompileError, match="npu: the compiled stage failed its probe run") as exc:
        probe_stage(runner(_reference(model)), model.SerializeToString(), ["x"], SPECS, precision="float16",
                    device="npu")
    assert words in str(exc.value)


def test_a_stage_that_fails_to_run_is_refused_with_the_toolkits_words() -> None:
    def run(xs):  # type: ignore[no-untyped-def]
        raise RuntimeError("E RKNN: [12:00:00] inference failed: output count mismatch")

    model = conv_net()
    with pytest.raises(CompileError, match="inference failed: output count mismatch"):
        probe_stage(run, model.SerializeToString(), ["x"], SPECS, precision="int8", device="npu")


def test_the_probe_runs_every_sample_and_reports_the_shared_cosine_and_relative_error() -> None:
    """One contract for RKNN, ncnn and TensorRT: several samples, the worst cosine and the largest
    relative error over them, computed by the one ``cosine`` / ``rel_error`` (hetsched._rknn.accuracy)."""
    from hetsched._rknn.accuracy import cosine, rel_error

    model = conv_net()
    ref = _reference(model)
    rng = np.random.default_rng(5)
    samples = [[rng.standard_normal((1, 3, 32, 32)).astype(np.float32)] for _ in range(3)]
    seen: list[np.ndarray] = []

    def run(xs):  # type: ignore[no-untyped-def]
        seen.append(xs[0])
        (out,) = ref(xs)
        return [out + 0.01 * (len(seen))]  # a small error growing with each sample

    res = probe_stage(run, model.SerializeToString(), ["x"], SPECS, precision="float16", device="npu",
                      samples=samples)
    assert res.samples == 3 and len(seen) == 3
    wants = [ref(s)[0] for s in samples]
    gots = [w + 0.01 * (k + 1) for k, w in enumerate(wants)]
    assert res.min_cosine == min(cosine(g, w) for g, w in zip(gots, wants, strict=True))
    assert res.max_rel_error == max(rel_error(g, w) for g, w in zip(gots, wants, strict=True)) > 0


def test_no_reference_is_a_refusal_only_where_the_backend_asks() -> None:
    model = conv_net()
    broken = model.SerializeToString()[:-7]  # onnxruntime cannot load it
    res = probe_stage(_reference(model), broken, ["x"], SPECS, precision="float16", device="npu")
    assert res.min_cosine != res.min_cosine  # NaN: nothing to compare with, no verdict
    with pytest.raises(CompileError, match="no onnxruntime reference"):
        probe_stage(_reference(model), broken, ["x"], SPECS, precision="float16", device="gpu",
                    require_reference=True)


def test_the_floors_live_in_one_config() -> None:
    assert PROBE.floor("float16") >= 0.99 and PROBE.floor("int8") < PROBE.floor("float16")


# -- the real toolkit ------------------------------------------------------------------------------------


@pytest.fixture
def toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    try:
        from hetsched._rknn.env import find_toolkit_python

        python = find_toolkit_python()
    except BackendUnavailableError as exc:
        pytest.skip(f"no rknn-toolkit2 environment: {exc}")
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "rknn-cache"))
    return python


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


def test_the_toolkit_worker_runs_in_a_private_scratch_directory_removed_with_it(
        toolkit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hetsched._rknn.client import ToolkitProcess

    here = tmp_path / "users-folder"
    here.mkdir()
    monkeypatch.chdir(here)
    p = ToolkitProcess(name="npu:scratch", python=toolkit)
    p.start()
    try:
        assert p.pid is not None
        cwd = Path(os.readlink(f"/proc/{p.pid}/cwd"))
        assert cwd != here and cwd.is_dir() and cwd.name.startswith("hetsched-rknn-")
        (cwd / "236.npy").write_bytes(b"what the toolkit dumps")
    finally:
        p.close()
    assert not cwd.exists()
    assert list(here.iterdir()) == []


@pytest.mark.timeout(600)
def test_a_stage_the_toolkit_cannot_run_is_refused_at_compile_time_and_cached(
        toolkit: str, twin_root: Path) -> None:
    # the NPU stage of the unfolded YOLOv8-style plan (what hetsched planned before folding):
    # it hands 0-d and int64 shape tensors on; the toolkit converts it but cannot run it
    from hetsched.backends.rknn import RknnBackend

    index = GraphIndex(with_input_shapes(load_model(yolov8_style()), {"images": (1, 3, 64, 64)}))
    (npu,) = resolve_devices(["npu"], root=twin_root)
    npu = dataclasses.replace(npu, options={**npu.options, "workers": 1})
    # the planner now computes shape arithmetic inside each stage, so the leaking stage is built by
    # hand: the whole graph on the NPU, handing on its 0-d and int64 shape values besides output0
    whole = StageSpec(id=0, name="stage0", device="npu", nodes=tuple(range(len(index.nodes))), units=(),
                      inputs=("images",), outputs=("output0",), deps=())
    leaks = [b.value for b in shape_boundaries(index, [dataclasses.replace(
        whole, outputs=tuple(o for n in index.nodes for o in n.outputs))], ["output0"])]
    assert leaks
    stage = dataclasses.replace(whole, outputs=("output0", *leaks[:4]))
    assert shape_boundaries(index, [stage], ["output0"])
    backend = RknnBackend()
    with pytest.raises(CompileError, match="npu: the compiled stage failed its probe run") as first:
        backend.compile(extract_stage(index, stage), npu, name="stage0").close()
    with pytest.raises(CompileError, match="failed its probe run") as again:
        backend.compile(extract_stage(index, stage), npu, name="stage0").close()
    assert "cached" in str(again.value) or str(again.value) == str(first.value)
    assert backend.statistics().refusals_cached == 1


@pytest.mark.timeout(600)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_yolov8_style_export_with_dynamic_axes_runs_on_the_npu_in_few_stages(
        toolkit: str, twin_root: Path, tmp_path: Path, anyio_backend: str) -> None:
    path = tmp_path / "yolov8-style.onnx"
    onnx.save(yolov8_style(), str(path))
    shape = (1, 3, 96, 128)
    (npu,) = resolve_devices(["npu"], root=twin_root)
    npu = dataclasses.replace(npu, options={**npu.options, "workers": 1})
    devices = [npu, *resolve_devices(["cpu:0"], root=twin_root, available_cpus=[0])]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    async with Session(path, devices=devices, root=twin_root, shapes={"images": shape}) as s:
        assert len(s.plan.stages) <= 3, s.plan.table()
        assert s.plan.stages[0].device == "npu", s.plan.table()
        for seed in range(2):
            x = np.random.default_rng(seed).uniform(0.0, 1.0, shape).astype(np.float32)
            (got,) = (await s.run({"images": x})).values()
            (want,) = ref.run(None, {"images": x})
            got = np.asarray(got)
            assert got.shape == want.shape == (1, 8, 12 * 16 + 6 * 8 + 3 * 4)
            cos = float(got.ravel() @ want.ravel() / (np.linalg.norm(got) * np.linalg.norm(want)))
            assert cos >= 0.999


class _FailingProc:
    alive = True

    def run(self, handle: int, inputs: object, outputs: object) -> None:
        from hetsched._errors import ToolkitWorkerError

        raise ToolkitWorkerError("npu: the toolkit failed to run model 1: inference failed")


@pytest.mark.parametrize(("proven", "device_failed"), [(False, False), (True, True)])
def test_a_run_failure_of_a_stage_that_passed_its_probe_is_a_device_failure(proven: bool,
                                                                            device_failed: bool) -> None:
    # not an abort of the session: failover counts it, quarantines and re-places the stage
    from hetsched import Device, DeviceFailedError, StageExecutionError
    from hetsched.backends.rknn import RknnBackend, RknnStage, _Context

    spec = (F32, (1, 3, 4, 4))
    stage = RknnStage(RknnBackend(), "stage0", Device("npu", kind="npu", backend="rknn"), None,
                      _Context(_FailingProc(), 1, 0, 0), (["x"], [spec], ["y"], [spec]), cached=False, key="k",
                      rknn_path=Path("unused.rknn"), precision="float16", model_sha256="")
    stage.proven = proven
    with pytest.raises(StageExecutionError) as exc:
        stage.run({"x": np.zeros(spec[1], np.float32)})
    assert isinstance(exc.value, DeviceFailedError) is device_failed
    assert "inference failed" in str(exc.value)
