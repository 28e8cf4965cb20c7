"""The ``ort-gpu`` backend without a GPU: provider options, the engine cache's place, what is missing,
and onnxruntime's real fallback-disabled failure turned into a clear CompileError.

onnxruntime here is the CPU-only build. Where a test says onnxruntime "has" the GPU providers,
only the list of available providers is a stand-in: the session is really created by this
onnxruntime, which cannot run them, so what it raises is its own error. The test marked ``gpu``
needs onnxruntime-gpu and a CUDA GPU and is skipped without them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import BackendUnavailableError, CompileError, DeviceSpecError
from hetsched.backends import Device, get_backend
from hetsched.backends.ort_gpu import (
    CUDA_EP,
    TRT_EP,
    OrtGpuBackend,
    default_cache_dir,
    fallback_error,
    provider_options,
)

GPU = Device("gpu:ort", kind="gpu", backend="ort-gpu", options={"device_id": 0})
DLA1 = Device("dla:1:ort", kind="dla", backend="ort-gpu", options={"device_id": 0, "dla_core": 1})
# onnxruntime 1.x's message, as its Python binding raises it (session creation with
# session.disable_cpu_ep_fallback = "1" and nodes left for the CPU EP)
ORT_FALLBACK = ("[ONNXRuntimeError] : 1 : FAIL : This session contains graph nodes that are assigned to the default "
                "CPU EP, but fallback to CPU EP has been explicitly disabled by the user.")
HAS_GPU_EPS = CUDA_EP in ort.get_available_providers()


def _model(op: str = "Relu", domain: str = "") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node(op, ["x"], ["h"], name="n0", domain=domain), helper.make_node("Neg", ["h"], ["y"])]
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=opsets)


def test_gpu_provider_options(tmp_path: Path) -> None:
    (trt_name, trt), (cuda_name, cuda) = provider_options(GPU, "fp32", tmp_path)
    assert (trt_name, cuda_name) == (TRT_EP, CUDA_EP)
    assert trt == {"device_id": 0, "trt_fp16_enable": False, "trt_int8_enable": False,
                   "trt_engine_cache_enable": True, "trt_engine_cache_path": str(tmp_path / "gpu0-fp32"),
                   "trt_timing_cache_enable": True}
    assert cuda == {"device_id": 0}
    fp16 = provider_options(GPU, "fp16", tmp_path)[0][1]
    assert (fp16["trt_fp16_enable"], fp16["trt_int8_enable"]) == (True, False)
    int8 = provider_options(GPU, "int8", tmp_path)[0][1]
    assert (int8["trt_fp16_enable"], int8["trt_int8_enable"]) == (True, True)


def test_dla_provider_options_and_a_cache_folder_per_core(tmp_path: Path) -> None:
    trt = provider_options(DLA1, "fp16", tmp_path)[0][1]
    assert (trt["trt_dla_enable"], trt["trt_dla_core"]) == (True, 1)
    dla0 = Device("dla:0:ort", kind="dla", backend="ort-gpu", options={"dla_core": 0})
    paths = {provider_options(d, p, tmp_path)[0][1]["trt_engine_cache_path"]
             for d in (GPU, dla0, DLA1) for p in ("fp16", "int8")}
    assert len(paths) == 6  # engines of different targets or precisions never share a folder
    assert "trt_dla_enable" not in provider_options(GPU, "fp16", tmp_path)[0][1]


@pytest.mark.parametrize(("device", "precision", "message"), [
    (DLA1, "fp32", "a DLA core runs fp16 or int8 only"),
    (GPU, "bf16", "precision 'bf16' is not one of fp32, fp16, int8"),
    (Device("g", kind="gpu", options={"device_id": -1}), "fp32", "option device_id=-1"),
    (Device("d", kind="dla", options={"dla_core": "1"}), "fp16", "option dla_core='1'"),
])
def test_bad_options_are_refused(tmp_path: Path, device: Device, precision: str, message: str) -> None:
    with pytest.raises(DeviceSpecError, match=message):
        provider_options(device, precision, tmp_path)


def test_the_cache_lives_in_the_users_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "hetsched" / "ort-trt-engines"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "hetsched" / "ort-trt-engines"
    assert OrtGpuBackend().cache_dir == default_cache_dir()


@pytest.mark.skipif(HAS_GPU_EPS, reason="this onnxruntime has the GPU providers")
def test_without_onnxruntime_gpu_the_backend_says_what_to_install() -> None:
    backend = get_backend("ort-gpu")
    assert isinstance(backend, OrtGpuBackend) and backend.name == "ort-gpu"
    with pytest.raises(BackendUnavailableError) as e:
        backend.compile(_model(), GPU, name="s0")
    msg = str(e.value)
    assert "pip install 'hetsched[ort-gpu]'" in msg and "Jetson Zoo" in msg and "CPUExecutionProvider" in msg


def test_a_dla_core_needs_the_tensorrt_provider(tmp_path: Path) -> None:
    backend = OrtGpuBackend(available_providers=lambda: [CUDA_EP, "CPUExecutionProvider"], cache_dir=tmp_path)
    assert [p[0] for p in backend.providers(GPU)] == [CUDA_EP]
    with pytest.raises(BackendUnavailableError, match=f"'dla:1:ort': a DLA core needs onnxruntime's {TRT_EP}"):
        backend.providers(DLA1)


def test_the_fallback_message_becomes_a_clear_compile_error() -> None:
    err = fallback_error(ORT_FALLBACK, stage="s3", device=GPU, model=_model("Gelu", "com.microsoft"),
                         providers=[TRT_EP, CUDA_EP])
    assert isinstance(err, CompileError)
    msg = str(err)
    assert msg.startswith("stage 's3' on 'gpu:ort': onnxruntime could place some of its nodes only on the CPU")
    assert f"neither {TRT_EP} nor {CUDA_EP} took them" in msg
    assert "the stage's operators: com.microsoft.Gelu, Neg." in msg and ORT_FALLBACK in msg
    assert fallback_error("[ONNXRuntimeError] : 10 : INVALID_GRAPH : bad", stage="s3", device=GPU, model=None,
                          providers=[TRT_EP]) is None


@pytest.mark.filterwarnings("ignore:Specified provider:UserWarning")  # this onnxruntime lacks the GPU EPs
@pytest.mark.skipif(HAS_GPU_EPS, reason="with real GPU providers onnxruntime would not refuse this stage")
def test_onnxruntimes_own_refusal_is_translated(tmp_path: Path) -> None:
    # stand-in: only the provider list; the session below is created by the real onnxruntime,
    # which places every node on the CPU EP and, with fallback disabled, refuses
    backend = OrtGpuBackend(available_providers=lambda: [TRT_EP, CUDA_EP, "CPUExecutionProvider"], cache_dir=tmp_path)
    with pytest.raises(CompileError, match="the stage's operators: Relu, Neg") as e:
        backend.compile(_model(), GPU, name="s0")
    assert "explicitly disabled" in str(e.value) and isinstance(e.value.__cause__, Exception)
    with pytest.raises(CompileError, match=f"could not compile stage 's1' for 'gpu:ort' with {TRT_EP}") as e2:
        backend.compile(_model("NoSuchOp"), GPU, name="s1")
    assert "explicitly disabled" not in str(e2.value)
    stats = backend.statistics()
    assert (stats.compiled, stats.fallback_refusals) == (0, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU_EPS, reason="needs onnxruntime-gpu and a CUDA GPU")
def test_a_stage_runs_on_the_gpu_providers(tmp_path: Path) -> None:
    backend = OrtGpuBackend(cache_dir=tmp_path)
    stage = backend.compile(_model(), GPU, name="s0")
    x = np.array([[-1.0, 0.5, -2.0, 3.0]], dtype=np.float32)
    (y,) = stage.run({"x": x})
    np.testing.assert_array_equal(y, -np.maximum(x, 0))
    assert backend.statistics().compiled == 1
