"""Where the ncnn backend's GPU appears: ``gpu:ncnn`` on a twin root and on the host, the RK3588's Mali
on a real board (only with a hardware Vulkan device), a real Orin's TensorRT devices opt-in, what
``doctor`` says; and a model partitioned NPU + GPU + CPU on the rk3588 twin matching onnxruntime.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetsched.backends._ncnn_devices as nd
from hetsched import BackendUnavailableError, DeviceSpecError, Session, resolve_devices
from hetsched._cli._doctor_checks import NcnnState, SdkState, check_sdks
from hetsched._devices.jetson import GPU_DEFAULT_ENV, NEVER_RUN, default_host_specs, jetson_device_notes
from hetsched._platform._fs import SysfsRoot
from hetsched.backends._ncnn_convert import ncnn_unavailable_reason
from hetsched.policies import PlacementProblem
from hetsched.testing import build_board_tree

_REASON = ncnn_unavailable_reason()
needs_ncnn = pytest.mark.skipif(_REASON is not None, reason=f"ncnn backend unavailable here: {_REASON}")
pytestmark = pytest.mark.timeout(300)


class RealBoardRoot(SysfsRoot):
    """A board's tree read as the host's ``/``: what the resolver sees on a real board."""

    __slots__ = ()

    @property
    def is_host_root(self) -> bool:
        return True


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {soc: build_board_tree(tmp_path_factory.mktemp(soc), soc) for soc in ("rk3588", "orin-agx")}


@needs_ncnn
def test_gpu_ncnn_on_a_twin_root_is_the_twins_gpu_computed_by_ncnn(trees: dict[str, Path]) -> None:
    (sim,) = resolve_devices(["gpu"], root=trees["rk3588"])
    (gpu,) = resolve_devices(["gpu:ncnn"], root=trees["rk3588"])
    assert (gpu.name, gpu.kind, gpu.backend, sim.backend) == ("gpu", "gpu", "ncnn", "sim")
    # the twin still models its time, power and heat
    assert gpu.options["profile_domain"] is sim.options["profile_domain"] and gpu.peak_flops == sim.peak_flops
    assert "vulkan" in gpu.options
    with pytest.raises(DeviceSpecError, match="gpu:ncnn"):  # listed among the board's specs
        resolve_devices(["gpu:7"], root=trees["rk3588"])


@needs_ncnn
def test_gpu_ncnn_on_the_host_is_its_vulkan_device() -> None:
    (gpu,) = resolve_devices(["gpu:ncnn"])
    assert (gpu.kind, gpu.backend) == ("gpu", "ncnn") and gpu.options["vulkan"]


def test_gpu_ncnn_without_ncnn_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nd, "ncnn_unavailable_reason", lambda: "the ncnn backend needs the ncnn package: pip install "
                        "'hetsched[ncnn]'")
    with pytest.raises(DeviceSpecError, match=r"hetsched\[ncnn\]"):
        resolve_devices(["gpu:ncnn"])


def test_a_real_rk3588s_gpu_is_the_mali_through_ncnn_when_a_hardware_vulkan_device_exists(
        trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fs = RealBoardRoot(trees["rk3588"])
    monkeypatch.setattr(nd, "hardware_reason", lambda: None)
    monkeypatch.setattr(nd, "ncnn_unavailable_reason", lambda: None)
    monkeypatch.setattr(nd, "vulkan_devices", lambda: [_mali()])
    (gpu,) = resolve_devices(["gpu"], root=fs)
    assert (gpu.kind, gpu.backend, gpu.domain, gpu.options["soc"]) == ("gpu", "ncnn", "gpu", "rk3588")
    assert "Mali-G610" in gpu.options["vulkan"] and gpu.peak_flops == nd.MALI_G610_FLOPS
    assert default_host_specs(fs) == ["clusters", "gpu"] and jetson_device_notes(fs) == []
    why = "ncnn finds only a software Vulkan device (llvmpipe), no GPU driver"
    monkeypatch.setattr(nd, "hardware_reason", lambda: why)
    with caplog.at_level(logging.WARNING, logger="hetsched.devices"):
        assert default_host_specs(fs) == ["clusters"]
    assert jetson_device_notes(fs) == [f"gpu: left out of the rk3588 board's default devices: {why}"]
    assert why in caplog.text


def _mali() -> object:
    from hetsched.backends._ncnn_convert import VulkanInfo

    return VulkanInfo(0, "Mali-G610", "integrated", 0x13B5, 0x1, "1.3.0", 7000)


def test_a_real_orins_tensorrt_devices_are_opt_in(trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import hetsched.backends.tensorrt as trt

    fs = RealBoardRoot(trees["orin-agx"])
    monkeypatch.setattr(trt, "tensorrt_unavailable_reason", lambda: None)  # TensorRT importable, CUDA answers
    monkeypatch.delenv(GPU_DEFAULT_ENV, raising=False)
    assert default_host_specs(fs) == ["clusters"]
    (note,) = jetson_device_notes(fs)
    assert note.endswith(NEVER_RUN) and "opt-in until this project's TensorRT path has run on a GPU" in note
    assert [d.backend for d in resolve_devices(["gpu", "dla:0"], root=fs)] == ["tensorrt", "tensorrt"]  # named: yes
    monkeypatch.setenv(GPU_DEFAULT_ENV, "1")
    assert default_host_specs(fs) == ["clusters", "gpu", "dla"]


def test_doctor_says_what_never_ran_and_what_ncnn_finds() -> None:
    sdk = SdkState("1.0", ("CPUExecutionProvider",), rknn_lite=True, tensorrt=True,
                   ncnn=NcnnState(None, None, ("Mali-G610 (integrated, ..., heap budget 7000 MB)",)))
    rk = {f.subject: f for f in check_sdks("rk3588", sdk, simulated=False)}
    assert rk["rknn-toolkit-lite2"].message.startswith("rknn-toolkit-lite2 importable; never run on hardware by this "
                                                        "project")
    assert rk["ncnn"].status == "ok" and "Mali-G610" in rk["ncnn"].message and "heap budget" in rk["ncnn"].message
    orin = {f.subject: f for f in check_sdks("orin-nx", sdk, simulated=False)}
    assert "importable; never run on hardware by this project" in orin["tensorrt"].message
    soft = SdkState("1.0", ncnn=NcnnState(None, "ncnn finds only a software Vulkan device (llvmpipe)", ("llvmpipe",)))
    (warn,) = [f for f in check_sdks("rk3588", soft, simulated=False) if f.subject == "ncnn"]
    assert warn.status == "warn" and "software Vulkan" in warn.message and "hetsched[ncnn]" in warn.hint
    (twin,) = [f for f in check_sdks("rk3588", soft, simulated=True) if f.subject == "ncnn"]
    assert twin.status == "ok" and "gpu:ncnn" in twin.message


# -- NPU + GPU + CPU on the rk3588 twin ------------------------------------------------------------


def _net() -> onnx.ModelProto:
    rng = np.random.default_rng(5)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(
            np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["a2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p2", "w3"], ["a3"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a3"], ["r3"]),
             helper.make_node("Conv", ["r3", "w4"], ["a4"], pads=[1, 1, 1, 1]), helper.make_node("Sigmoid", ["a4"], ["s4"]),
             helper.make_node("GlobalAveragePool", ["s4"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          [w("w1", 8, 3, 3, 3), w("w2", 8, 8, 3, 3), w("w3", 16, 8, 3, 3), w("w4", 16, 16, 3, 3),
                           w("wf", 10, 16)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _thirds(problem: PlacementProblem) -> dict[int, str]:
    """The first third of the units (topological order) on the NPU, the second on the GPU, the rest
    on the CPU device, each where it is a candidate."""
    out = {}
    n = len(problem.units)
    for k, u in enumerate(problem.units):
        want = "npu" if k < n // 3 else "gpu" if k < 2 * n // 3 else "cpu:0"
        out[u.id] = want if want in u.candidates else next(d for d in u.candidates if d.startswith("cpu"))
    return out


@needs_ncnn
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_model_partitioned_npu_gpu_cpu_on_the_rk3588_twin_matches_onnxruntime(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str) -> None:
    from hetsched._rknn.env import find_toolkit_python

    try:
        find_toolkit_python()
    except BackendUnavailableError as exc:
        pytest.skip(f"the NPU part needs Rockchip's rknn-toolkit2 environment (hetsched setup rknn): {exc}")
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "rknn"))
    monkeypatch.setenv("HETSCHED_NCNN_CACHE", str(tmp_path / "ncnn"))
    root = trees["rk3588"]
    devices = [*resolve_devices(["npu", "gpu:ncnn"], root=root), *resolve_devices(["cpu:0"], root=root,
                                                                                   available_cpus=[0])]
    model = _net()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    async with Session(model, devices=devices, root=root, policy=_thirds, max_unit_nodes=2) as s:
        backends = {st["device"]: st["backend"] for st in s.plan.to_json()["stages"]}
        assert set(backends.items()) >= {("npu", "rknn"), ("gpu", "ncnn"), ("cpu:0", "cpu")}, s.plan.table()
        gpu_stages = [st for st in s._stages if st.spec.device == "gpu"]
        probed = [st.compiled.ncnn.statistics().runs for st in gpu_stages]  # the compile-time probe's runs
        for seed in range(2):
            x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
            got = (await s.run({"x": x}))["y"]
            (want,) = ref.run(None, {"x": x})
            a, b = got.ravel().astype(np.float64), want.ravel().astype(np.float64)
            assert float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) >= 0.999  # the NPU computes in fp16
        assert gpu_stages and all(st.compiled.statistics().runs == 2 for st in gpu_stages)  # the twin's stage
        assert [st.compiled.ncnn.statistics().runs for st in gpu_stages] == [n + 2 for n in probed]  # ncnn ran each
        assert all(st.compiled.statistics().modelled_time_s > 0 for st in gpu_stages)  # the Mali's time, modelled
