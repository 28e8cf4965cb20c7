"""The TensorRT backend without a GPU: errors, the parser's support answer, cache keys, build settings.

No machine this project tests on has TensorRT. Where the documented build and run calls are
checked, it is against ``_RecordingTrt`` / ``_RecordingCudart``: plumbing stand-ins, not
TensorRT or CUDA. They record which documented calls and flags the backend makes; they prove
nothing about what TensorRT accepts. The one test that would run TensorRT is marked ``gpu`` and
skipped without the bindings and a CUDA GPU.
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import BackendUnavailableError, CompileError, DeviceFailedError, StageExecutionError
from hetsched.backends import Device, get_backend
from hetsched.backends._tensorrt_build import (
    BuildSettings,
    Profile,
    bake_static_shapes,
    build_serialized_engine,
    build_settings,
    dla_available,
    node_support,
    parse_version,
    query_support,
)
from hetsched.backends._tensorrt_cache import EngineCache, engine_cache_key
from hetsched.backends._tensorrt_run import CudaError, EngineHandle, WorkerContext, cuda_call, device_lost
from hetsched.backends.tensorrt import TensorRtBackend, dla_core_of, load_tensorrt, tensorrt_unavailable_reason

F = TensorProto.FLOAT


def _model(batch: int | str = 1, *, op: str = "Relu", extra: list[onnx.NodeProto] | None = None,
           inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    nodes = [helper.make_node(op, ["x"], ["y"], name="act"), *(extra or [])]
    out = nodes[-1].output[0]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [batch, 4])],
                          [helper.make_tensor_value_info(out, F, [batch, 4])], initializer=inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _qdq_model() -> onnx.ModelProto:
    scale = helper.make_tensor("s", F, [], [0.1])
    zero = helper.make_tensor("z", TensorProto.INT8, [], [0])
    extra = [helper.make_node("QuantizeLinear", ["y", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq")]
    return _model(extra=extra, inits=[scale, zero])


# -- unavailable ---------------------------------------------------------------------------------


def test_missing_tensorrt_names_the_extra_and_jetpack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # None in sys.modules: import raises ImportError
    with pytest.raises(BackendUnavailableError) as err:
        load_tensorrt()
    msg = str(err.value)
    assert "'tensorrt'" in msg and "python3-libnvinfer" in msg and "JetPack" in msg
    assert "pip install 'hetsched[jetson-cuda12]'" in msg and "hetsched[tensorrt]" not in msg
    assert tensorrt_unavailable_reason() == msg
    backend = get_backend("tensorrt")  # found by name; constructing it imports no SDK
    assert isinstance(backend, TensorRtBackend) and backend.name == "tensorrt" and backend.slow_compile
    with pytest.raises(BackendUnavailableError, match=r"hetsched\[jetson-cuda12\]"):
        backend.compile(_model(), Device("gpu:0", kind="gpu", backend="tensorrt"), name="s0")


def test_missing_cuda_python_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    for mod in ("cuda", "cuda.bindings", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(BackendUnavailableError, match=r"cuda-python.*hetsched\[jetson-cuda12\]"):
        load_tensorrt()


def test_dla_core_comes_from_the_device() -> None:
    assert dla_core_of(Device("gpu:0", kind="gpu", backend="tensorrt")) is None
    assert dla_core_of(Device("dla:1", kind="dla", backend="tensorrt")) == 1
    assert dla_core_of(Device("gpu:0", kind="dla", backend="tensorrt", options={"dla_core": 0})) == 0
    with pytest.raises(Exception, match="dla:N"):
        dla_core_of(Device("dla", kind="dla", backend="tensorrt"))


# -- what the parser supports ----------------------------------------------------------------------


def test_node_support_names_supported_nodes_and_reasons() -> None:
    names = ["conv", "relu", "nms", "add", ""]
    report = node_support(names, [([0, 1], True), ([2], False), ([3], True)],
                          errors=[(2, "No importer registered for op: NonMaxSuppression")])
    assert report.supported == {"conv", "relu", "add"}
    assert report.unsupported == {
        "nms": "No importer registered for op: NonMaxSuppression",
        "#4": "TensorRT's ONNX parser put it in no supported subgraph",
    }
    assert not report.complete
    whole = node_support(names[:2], [([0, 1], True)])
    assert whole.complete and whole.supported == {"conv", "relu"}


def test_node_support_falls_back_to_errors_that_name_no_node() -> None:
    report = node_support(["a", "b"], [([0], True), ([1], False)], errors=[(-1, "opset 99 unsupported")])
    assert report.unsupported == {"b": "opset 99 unsupported"}
    report = node_support(["a", "b"], [([0], True), ([1], False)])
    assert report.unsupported == {"b": "TensorRT's ONNX parser marks its subgraph unsupported"}


class _Err:
    def __init__(self, node: int, desc: str) -> None:
        self._node, self._desc = node, desc

    def node(self) -> int:
        return self._node

    def desc(self) -> str:
        return self._desc


class _Parser:
    """Plumbing stand-in for ``trt.OnnxParser``, not TensorRT: answers as it is told and records calls."""

    def __init__(self, subgraphs: list[tuple[list[int], bool]], errors: list[_Err] | None = None,
                 parses: bool = True, log: list[Any] | None = None) -> None:
        self.subgraphs, self.errors, self.parses = subgraphs, list(errors or []), parses
        self.log = log if log is not None else []

    def supports_model_v2(self, data: bytes) -> bool:
        self.log.append(("supports_model_v2", type(data)))
        return all(ok for _, ok in self.subgraphs)

    @property
    def num_subgraphs(self) -> int:
        return len(self.subgraphs)

    def is_subgraph_supported(self, i: int) -> bool:
        return self.subgraphs[i][1]

    def get_subgraph_nodes(self, i: int) -> list[int]:
        return self.subgraphs[i][0]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> _Err:
        return self.errors[i]

    def clear_errors(self) -> None:
        self.errors.clear()

    def parse(self, data: bytes) -> bool:
        self.log.append(("parse", type(data)))
        if not self.parses:
            self.errors.append(_Err(-1, "In node 0: bad weights"))
        return self.parses


def test_query_support_asks_supports_model_v2_with_the_model_bytes() -> None:
    parser = _Parser([([0], False)], [_Err(0, "Unsupported datatype")])
    report = query_support(parser, b"model", ["cast"])
    assert parser.log == [("supports_model_v2", bytes)]
    assert report.unsupported == {"cast": "Unsupported datatype"}
    assert parser.num_errors == 0  # cleared, so parse() reports only its own errors


# -- versions and build settings (pure) -----------------------------------------------------------


def test_versions_and_dla_availability() -> None:
    assert parse_version("10.3.0.30") == (10, 3, 0, 30)
    with pytest.raises(CompileError, match="version"):
        parse_version("unknown")
    assert dla_available((10, 3, 0)) and dla_available((10, 7, 0))
    assert not dla_available((10, 8, 0)) and not dla_available((11, 0, 0)) and not dla_available((11, 4, 0))
    assert dla_available((11, 4, 1)) and dla_available((11, 5, 0))


def _settings(model: onnx.ModelProto | None = None, version: tuple[int, ...] = (10, 3, 0),
              dla: int | None = None, **opts: Any) -> BuildSettings:
    return build_settings(model or _model(), opts, version=version, dla_core=dla)


def test_precision_rules_per_version_and_device() -> None:
    assert _settings().precision == "fp32" and _settings(dla=0).precision == "fp16"
    assert not _settings().strongly_typed and _settings(version=(11, 4, 1)).strongly_typed
    with pytest.raises(CompileError, match="older than 10"):
        _settings(version=(8, 6, 1))
    with pytest.raises(CompileError, match="'bf16' is not one of"):
        _settings(precision="bf16")
    with pytest.raises(CompileError, match="FP16 or INT8 only"):
        _settings(dla=0, precision="fp32")
    with pytest.raises(CompileError, match="no DLA support"):
        _settings(version=(10, 8, 0), dla=0)
    with pytest.raises(CompileError, match="QuantizeLinear"):
        _settings(precision="int8")
    assert _settings(_qdq_model(), precision="int8").precision == "int8"
    with pytest.raises(CompileError, match=r"removed BuilderFlag\.FP16"):
        _settings(version=(11, 5, 0), precision="fp16")
    assert _settings(version=(10, 3, 0), precision="fp16").precision == "fp16"
    half = _model(op="Cast")
    half.graph.node[0].attribute.append(helper.make_attribute("to", TensorProto.FLOAT16))
    assert _settings(half, version=(11, 5, 0), precision="fp16").precision == "fp16"
    with pytest.raises(CompileError, match="workspace"):
        _settings(workspace=-1)


def test_free_dimensions_need_a_shape_and_dla_takes_no_ranges() -> None:
    dyn = _model("N")
    with pytest.raises(CompileError, match=r"input 'x' has free dimension\(s\) \[0\]"):
        _settings(dyn)
    with pytest.raises(CompileError, match=r"'x'.*DLA runs static shapes only"):
        _settings(dyn, dla=0)
    with pytest.raises(CompileError, match="input 'x': DLA runs static shapes only"):
        _settings(dyn, dla=0, profiles={"x": ((1, 4), (2, 4), (8, 4))})
    ranged = _settings(dyn, profiles={"x": ((1, 4), (2, 4), (8, 4))})
    assert ranged.profiles == (Profile("x", (1, 4), (2, 4), (8, 4)),)
    with pytest.raises(CompileError, match="min <= opt <= max"):
        _settings(dyn, profiles={"x": ((4, 4), (2, 4), (8, 4))})
    with pytest.raises(CompileError, match="dimension 1 is fixed at 4"):
        _settings(dyn, shapes={"x": (2, 5)})
    fixed = _settings(dyn, dla=1, shapes={"x": (2, 4)})
    assert fixed.profiles == (Profile("x", (2, 4), (2, 4), (2, 4)),)
    baked, rest = bake_static_shapes(dyn, fixed)
    assert rest.profiles == () and rest.dla_core == 1
    assert [d.dim_value for d in baked.graph.input[0].type.tensor_type.shape.dim] == [2, 4]
    assert dyn.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"  # argument left alone
    assert bake_static_shapes(dyn, ranged) == (dyn, ranged)


# -- the documented build calls, against a recording stand-in -------------------------------------


class _Enum:
    def __init__(self, kind: str, **values: int) -> None:
        for k, v in values.items():
            setattr(self, k, f"{kind}.{k}" if v < 0 else v)


class _Recorder:
    """Records every attribute set and method called on it (plumbing only)."""

    def __init__(self, log: list[Any], label: str, **returns: Any) -> None:
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_returns", returns)

    def __setattr__(self, name: str, value: Any) -> None:
        self._log.append((f"{self._label}.{name}=", value))
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self._log.append((f"{self._label}.{name}", *args))
            made = self._returns.get(name)
            return made() if callable(made) else made
        return call


class _Tensor:
    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        self.name, self.shape = name, shape


class _RecordingTrt(types.ModuleType):
    """Plumbing stand-in, not TensorRT: a ``tensorrt``-shaped module whose builder, network, parser
    and config record the calls made on them; ``build_serialized_network`` returns marker bytes
    that are no engine."""

    def __init__(self, version: str = "10.3.0", *, subgraphs: list[tuple[list[int], bool]] | None = None,
                 input_shape: tuple[int, ...] = (1, 4), built: bytes | None = b"plumbing-not-an-engine") -> None:
        super().__init__("tensorrt")
        self.__version__ = version
        self.log: list[Any] = []
        self._subgraphs = subgraphs if subgraphs is not None else [([0], True)]
        self._input_shape, self._built = input_shape, built
        self.NetworkDefinitionCreationFlag = _Enum("NDCF", STRONGLY_TYPED=3)
        self.BuilderFlag = _Enum("BuilderFlag", FP16=-1, INT8=-1, GPU_FALLBACK=-1)
        self.MemoryPoolType = _Enum("MemoryPoolType", WORKSPACE=-1)
        self.DeviceType = _Enum("DeviceType", GPU=-1, DLA=-1)
        self.parser: _Parser | None = None

    def Builder(self, logger: Any) -> _Recorder:  # TensorRT's name
        log = self.log
        network = types.SimpleNamespace(num_inputs=1, get_input=lambda i: _Tensor("x", self._input_shape))

        def make_network(flags: int) -> Any:
            log.append(("builder.create_network", flags))
            return network

        def build_serialized_network(net: Any, cfg: Any) -> Any:
            log.append(("builder.build_serialized_network",))
            return self._built

        builder = _Recorder(log, "builder", create_builder_config=lambda: _Recorder(log, "config"),
                            create_optimization_profile=lambda: _Recorder(log, "profile"))
        object.__setattr__(builder, "create_network", make_network)
        object.__setattr__(builder, "build_serialized_network", build_serialized_network)
        return builder

    def OnnxParser(self, network: Any, logger: Any) -> _Parser:  # TensorRT's name
        self.parser = _Parser(self._subgraphs, log=self.log)
        return self.parser


def _build(trt: _RecordingTrt, settings: BuildSettings) -> bytes:
    return build_serialized_engine(trt, b"onnx", settings, logger=None, node_names=["act"])


def _calls(trt: _RecordingTrt, prefix: str) -> list[Any]:
    return [c for c in trt.log if c[0].startswith(prefix)]


def test_tensorrt_10_gpu_fp16_sets_the_builder_flag_on_a_weakly_typed_network() -> None:
    trt = _RecordingTrt("10.3.0")
    assert _build(trt, _settings(precision="fp16", workspace=1 << 28)) == b"plumbing-not-an-engine"
    assert ("builder.create_network", 0) in trt.log
    assert _calls(trt, "config.") == [("config.set_memory_pool_limit", "MemoryPoolType.WORKSPACE", 1 << 28),
                                      ("config.set_flag", "BuilderFlag.FP16")]
    names = [c[0] for c in trt.log]
    assert names.index("supports_model_v2") < names.index("parse") < names.index("builder.build_serialized_network")


def test_tensorrt_10_int8_sets_int8_and_fp16_flags() -> None:
    trt = _RecordingTrt("10.3.0")
    _build(trt, _settings(_qdq_model(), precision="int8"))
    assert _calls(trt, "config.set_flag") == [("config.set_flag", "BuilderFlag.INT8"),
                                              ("config.set_flag", "BuilderFlag.FP16")]


def test_tensorrt_11_builds_strongly_typed_without_precision_flags() -> None:
    trt = _RecordingTrt("11.5.0")
    _build(trt, _settings(_qdq_model(), version=(11, 5, 0), precision="int8"))
    assert ("builder.create_network", 1 << 3) in trt.log
    assert _calls(trt, "config.set_flag") == []


def test_dla_build_targets_the_core_with_gpu_fallback() -> None:
    trt = _RecordingTrt("10.3.0")
    _build(trt, _settings(dla=1))
    assert _calls(trt, "config.") == [("config.set_flag", "BuilderFlag.FP16"),
                                      ("config.default_device_type=", "DeviceType.DLA"),
                                      ("config.DLA_core=", 1),
                                      ("config.set_flag", "BuilderFlag.GPU_FALLBACK")]


def test_dla_refuses_a_dynamic_network_input_by_name() -> None:
    trt = _RecordingTrt("10.3.0", input_shape=(-1, 4))
    with pytest.raises(CompileError, match=r"input 'x' has a dynamic shape.*DLA runs static shapes only"):
        _build(trt, _settings(dla=0))
    assert _calls(trt, "builder.build_serialized_network") == []


def test_gpu_profile_ranges_become_an_optimization_profile() -> None:
    trt = _RecordingTrt("10.3.0", input_shape=(-1, 4))
    _build(trt, _settings(_model("N"), profiles={"x": ((1, 4), (2, 4), (8, 4))}))
    assert _calls(trt, "profile.") == [("profile.set_shape", "x", (1, 4), (2, 4), (8, 4))]
    assert [c[0] for c in _calls(trt, "config.add_optimization_profile")] == ["config.add_optimization_profile"]


def test_build_failures_are_compile_errors() -> None:
    with pytest.raises(CompileError, match=r"cannot take 1 node\(s\): act: TensorRT's ONNX parser marks"):
        _build(_RecordingTrt(subgraphs=[([0], False)]), _settings())
    with pytest.raises(CompileError, match="returned None"):
        _build(_RecordingTrt(built=None), _settings())


class _RecordingCudart:
    """Plumbing stand-in, not CUDA: answers the device queries the engine cache key needs."""

    cudaError_t = types.SimpleNamespace(cudaSuccess="cudaSuccess")

    def cudaGetDeviceCount(self) -> tuple[str, int]:  # CUDA's name
        return ("cudaSuccess", 1)

    def cudaGetDeviceProperties(self, i: int) -> tuple[str, Any]:
        return ("cudaSuccess", types.SimpleNamespace(name=b"Orin\0\0", major=8, minor=7, integrated=1))

    def cudaRuntimeGetVersion(self) -> tuple[str, int]:
        return ("cudaSuccess", 12060)

    def cudaDriverGetVersion(self) -> tuple[str, int]:
        return ("cudaSuccess", 12060)


def _plumbed(monkeypatch: pytest.MonkeyPatch, trt: _RecordingTrt, runs: Any = None) -> TensorRtBackend:
    """The backend over recording stand-ins (not TensorRT: nothing runs). The compile-time probe's
    run of the engine goes to ``runs`` (inputs -> outputs; default: the fp32 reference itself)."""
    import hetsched.backends.tensorrt as mod

    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})  # type: ignore[attr-defined]
    monkeypatch.setattr(mod, "load_tensorrt", lambda: (trt, _RecordingCudart()))

    def run(self: Any, feeds: Any, state: object = None) -> list[np.ndarray]:
        if runs is not None:
            return list(runs(feeds))
        from hetsched._onnxruntime import ort_session

        return list(ort_session(_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, dict(feeds)))

    monkeypatch.setattr(mod.TensorRtStage, "run", run)
    return TensorRtBackend()


def test_a_compiled_engine_proves_itself_and_a_failed_probe_is_a_cached_refusal(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """TensorRT goes through the probe contract (backends._probe) like RKNN and ncnn: an engine
    whose probe run disagrees with onnxruntime is refused, its cache entry becomes a refusal, and
    the next compile answers from it (stand-ins only: TensorRT never ran here)."""
    seen: list[Any] = []

    def wrong(feeds: Any) -> list[np.ndarray]:
        seen.append(feeds)
        (x,) = feeds.values()
        return [-np.abs(np.asarray(x)) - 1.0]  # the opposite direction of a Relu's output

    trt = _RecordingTrt("10.3.0")
    backend = _plumbed(monkeypatch, trt, runs=wrong)
    dev = Device("gpu:0", kind="gpu", backend="tensorrt", options={"cache_dir": str(tmp_path)})
    with pytest.raises(CompileError, match=r"^gpu:0: the compiled stage failed its probe run: output 0 disagrees"):
        backend.compile(_model(), dev, name="s0")
    assert len(seen) == 1
    with pytest.raises(CompileError, match=r"cached refusal.*failed its probe run"):
        backend.compile(_model(), dev, name="s0")
    assert len(seen) == 1 and len(_calls(trt, "builder.build_serialized_network")) == 1


def test_compile_reuses_cached_engines_and_refusals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trt = _RecordingTrt("10.3.0")
    backend = _plumbed(monkeypatch, trt)
    dev = Device("dla:1", kind="dla", backend="tensorrt", options={"cache_dir": str(tmp_path)})
    first = backend.compile(_model(), dev, name="s0")
    builds = len(_calls(trt, "builder.build_serialized_network"))
    second = backend.compile(_model(), dev, name="s0")
    assert builds == 1 and len(_calls(trt, "builder.build_serialized_network")) == 1  # no second build
    assert first.statistics().cache_key == second.statistics().cache_key  # type: ignore[attr-defined]
    assert not first.statistics().cached and second.statistics().cached  # type: ignore[attr-defined]
    assert second.statistics().dla_core == 1 and second.statistics().precision == "fp16"  # type: ignore[attr-defined]
    gpu = backend.compile(_model(), dataclasses.replace(dev, name="gpu:0", kind="gpu"), name="s0")
    assert gpu.statistics().cache_key != first.statistics().cache_key  # type: ignore[attr-defined]
    refused = _plumbed(monkeypatch, _RecordingTrt("10.3.0", subgraphs=[([0], False)]))
    with pytest.raises(CompileError, match=r"^dla:1: TensorRT cannot take 1 node\(s\): act"):
        refused.compile(_model(op="Abs"), dev, name="s1")
    # the second time from the cache, which says so (issue 23)
    with pytest.raises(CompileError, match=r"^dla:1: refused by TensorRT on an earlier build \(a cached refusal, "
                       r".*\.json; delete it to try again\): TensorRT cannot take 1 node\(s\): act"):
        refused.compile(_model(op="Abs"), dev, name="s1")
    s = refused.statistics()
    assert (s.conversions, s.cache_hits, s.refusals_cached) == (1, 1, 1)
    for stage in (first, second, gpu):
        stage.close()


# -- engine cache ---------------------------------------------------------------------------------

_KEY_ARGS: dict[str, Any] = dict(
    tensorrt_version="10.3.0", cuda_version=12060, driver_version=12060, gpu_name="Orin",
    compute_capability=(8, 7), dla_core=None, precision="fp16", profiles=[("x", (1, 4), (2, 4), (8, 4))],
    workspace=None, compatibility="", plugins=())


@pytest.mark.parametrize(("field", "other"), [
    ("tensorrt_version", "10.7.0"), ("cuda_version", 12080), ("driver_version", 12020),
    ("gpu_name", "NVIDIA H200"), ("compute_capability", (9, 0)), ("dla_core", 0), ("precision", "int8"),
    ("profiles", [("x", (1, 4), (4, 4), (8, 4))]), ("workspace", 1 << 30), ("compatibility", "hardware"),
    ("plugins", ("libnvinfer_plugin.so",)),
])
def test_every_key_field_changes_the_key(field: str, other: Any) -> None:
    assert engine_cache_key(b"m", **{**_KEY_ARGS, field: other}) != engine_cache_key(b"m", **_KEY_ARGS)


def test_key_covers_the_model_and_not_profile_order() -> None:
    base = engine_cache_key(b"m", **_KEY_ARGS)
    assert engine_cache_key(b"m2", **_KEY_ARGS) != base
    two = [("x", (1,), (1,), (2,)), ("y", (1,), (2,), (3,))]
    assert (engine_cache_key(b"m", **{**_KEY_ARGS, "profiles": two})
            == engine_cache_key(b"m", **{**_KEY_ARGS, "profiles": two[::-1]}))
    assert len(base) == 64 and engine_cache_key(b"m", **_KEY_ARGS) == base


def test_engine_cache_stores_engines_and_refusals(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    k1, k2 = engine_cache_key(b"a", **_KEY_ARGS), engine_cache_key(b"b", **_KEY_ARGS)
    assert cache.lookup(k1) is None
    cache.store(k1, b"engine-bytes", "", 2.0)
    cache.store(k2, None, "TensorRT cannot take node nms", 0.5)
    assert cache.lookup(k1) == b"engine-bytes"
    refusal = cache.lookup(k2)
    assert isinstance(refusal, str) and refusal.endswith(": TensorRT cannot take node nms")
    assert "cached refusal" in refusal
    s = cache.statistics()
    assert (s.conversions, s.cache_hits, s.refusals_cached, s.seconds) == (2, 2, 1, 2.5)
    cache.engine_path(k1).unlink()  # a verdict whose engine is gone is a miss, not a broken hit
    assert cache.lookup(k1) is None
    with pytest.raises(ValueError, match="not a cache key"):
        cache.lookup("../../etc")


# -- run-side plumbing ----------------------------------------------------------------------------


class _Status:
    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Status) and other.name == self.name

    __hash__ = None  # type: ignore[assignment]


_CUDART = types.SimpleNamespace(cudaError_t=types.SimpleNamespace(cudaSuccess=_Status("cudaSuccess")))


def test_cuda_call_unpacks_values_and_raises_named_errors() -> None:
    ok = _CUDART.cudaError_t.cudaSuccess
    assert cuda_call(_CUDART, (ok,), "f") is None
    assert cuda_call(_CUDART, (ok, 7), "f") == 7
    assert cuda_call(_CUDART, (ok, 1, 2), "f") == (1, 2)
    with pytest.raises(CudaError, match="cudaMalloc failed: cudaErrorMemoryAllocation") as err:
        cuda_call(_CUDART, (_Status("cudaErrorMemoryAllocation"), 0), "cudaMalloc")
    assert not device_lost(err.value.name)
    assert device_lost("cudaErrorIllegalAddress") and device_lost("cudaErrorNoDevice")


def test_dla_core_is_set_on_the_runtime_before_deserializing() -> None:
    log: list[Any] = []

    class Runtime:
        def __init__(self, logger: Any) -> None:
            pass

        def __setattr__(self, name: str, value: Any) -> None:
            log.append(("runtime." + name, value))

        def deserialize_cuda_engine(self, blob: bytes) -> Any:
            log.append(("deserialize_cuda_engine", blob))
            return None  # the stand-in makes no engine

    trt = types.SimpleNamespace(Runtime=Runtime)
    with pytest.raises(RuntimeError, match="returned None"):
        EngineHandle(trt, None, b"blob", dla_core=1)
    assert log == [("runtime.DLA_core", 1), ("deserialize_cuda_engine", b"blob")]


def test_run_errors_become_stage_or_device_errors() -> None:
    from hetsched.backends.tensorrt import TensorRtStage

    gpu = types.SimpleNamespace(integrated=True)
    stage = TensorRtStage(None, None, None, b"", name="s0", device=Device("gpu:0", kind="gpu", backend="tensorrt"),
                          device_id=0, gpu=gpu, dla_core=None, precision="fp32",  # type: ignore[arg-type]
                          key="k", cached=False, input_names=["x"], output_names=["y"])
    lost = stage._error(CudaError("cudaStreamSynchronize", "cudaErrorIllegalAddress"))
    assert isinstance(lost, DeviceFailedError) and lost.device == "gpu:0" and lost.stage == "s0"
    bad = stage._error(CudaError("cudaMalloc", "cudaErrorMemoryAllocation"))
    assert type(bad) is StageExecutionError and "cudaErrorMemoryAllocation" in str(bad)
    stage.close()
    with pytest.raises(StageExecutionError, match="closed"):
        stage.run({"x": np.zeros((1, 4), np.float32)})
    assert dataclasses.asdict(stage.statistics())["runs"] == 0


class _HostCudart:
    """Plumbing stand-in, not CUDA: "pinned" and "device" memory are ctypes buffers in this process,
    copies are memmoves; it records the calls so the run path's order can be checked."""

    cudaError_t = types.SimpleNamespace(cudaSuccess="ok")
    cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice="H2D", cudaMemcpyDeviceToHost="D2H")

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.live: dict[int, Any] = {}

    def _alloc(self, what: str, n: int) -> tuple[str, int]:
        buf = ctypes.create_string_buffer(n)
        self.live[ctypes.addressof(buf)] = buf
        self.log.append((what, n))
        return ("ok", ctypes.addressof(buf))

    def cudaSetDevice(self, i: int) -> tuple[str]:  # CUDA's names
        return ("ok",)

    def cudaStreamCreate(self) -> tuple[str, str]:
        return ("ok", "stream-1")

    def cudaMallocHost(self, n: int) -> tuple[str, int]:
        return self._alloc("cudaMallocHost", n)

    def cudaMalloc(self, n: int) -> tuple[str, int]:
        return self._alloc("cudaMalloc", n)

    def cudaHostGetDevicePointer(self, host: int, flags: int) -> tuple[str, int]:
        self.log.append(("cudaHostGetDevicePointer",))
        return ("ok", host)

    def cudaMemcpyAsync(self, dst: int, src: int, n: int, kind: str, stream: str) -> tuple[str]:
        self.log.append(("cudaMemcpyAsync", kind, stream))
        ctypes.memmove(dst, src, n)
        return ("ok",)

    def cudaStreamSynchronize(self, stream: str) -> tuple[str]:
        self.log.append(("cudaStreamSynchronize", stream))
        return ("ok",)

    def cudaFree(self, p: int) -> tuple[str]:
        self.live.pop(p)
        return ("ok",)

    cudaFreeHost = cudaFree

    def cudaStreamDestroy(self, s: str) -> tuple[str]:
        self.log.append(("cudaStreamDestroy", s))
        return ("ok",)


class _CopyContext:
    """Plumbing stand-in for an execution context, not TensorRT: "runs" by copying input x to output y."""

    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.addr: dict[str, int] = {}
        self.shape: tuple[int, ...] = (0,)

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shape = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shape

    def set_tensor_address(self, name: str, ptr: int) -> None:
        self.addr[name] = ptr

    def execute_async_v3(self, *, stream_handle: str) -> bool:  # common_runtime.py passes it by keyword
        self.log.append(("execute_async_v3", stream_handle))
        ctypes.memmove(self.addr["y"], self.addr["x"], int(np.prod(self.shape)) * 4)
        return True


def _copy_handle(log: list[Any]) -> Any:
    engine = types.SimpleNamespace(create_execution_context=lambda: _CopyContext(log))
    return types.SimpleNamespace(engine=engine, inputs=("x",), outputs=("y",),
                                 dtypes={"x": np.dtype(np.float32), "y": np.dtype(np.float32)})


@pytest.mark.parametrize("integrated", [True, False])
def test_worker_context_memory_and_call_order(integrated: bool) -> None:
    cudart = _HostCudart()
    ctx = WorkerContext(cudart, _copy_handle(cudart.log), 0, integrated)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (y,) = ctx.run({"x": x})
    np.testing.assert_array_equal(y, x)  # the bytes went through the buffers the context was given
    out = np.empty((2, 4), np.float32)
    ctx.run({"x": x + 1}, [out])
    np.testing.assert_array_equal(out, x + 1)
    calls = [c[0] for c in cudart.log]
    assert calls.index("execute_async_v3") < calls.index("cudaStreamSynchronize")
    copies = [c[1] for c in cudart.log if c[0] == "cudaMemcpyAsync"]
    if integrated:  # mapped pinned memory: the GPU reads the host buffers, nothing is copied
        assert copies == [] and "cudaMalloc" not in calls and "cudaHostGetDevicePointer" in calls
    else:
        assert copies == ["H2D", "D2H"] * 2 and calls.count("cudaMalloc") == 2
    ctx.close()
    assert cudart.live == {} and ("cudaStreamDestroy", "stream-1") in cudart.log


# -- on a real GPU ---------------------------------------------------------------------------------


def _gpu_reason() -> str | None:
    try:
        import tensorrt  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return "TensorRT's Python bindings are not installed"
    return tensorrt_unavailable_reason()


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_reason() is not None, reason=f"needs TensorRT and a CUDA GPU: {_gpu_reason()}")
def test_tiny_model_runs_on_the_gpu(tmp_path: Path) -> None:
    backend = TensorRtBackend()
    device = Device("gpu:0", kind="gpu", backend="tensorrt", options={"cache_dir": str(tmp_path)})
    stage = backend.compile(_model(), device, name="s0")
    try:
        x = np.array([[-1.0, 0.5, -2.0, 3.0]], np.float32)
        (y,) = stage.run({"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0))
    finally:
        stage.close()
    again = backend.compile(_model(), device, name="s0")
    again.close()
    assert backend.statistics().cache_hits == 1
