"""Building a TensorRT engine from one stage: pure planning functions plus the documented build calls.

Everything here takes the ``tensorrt`` module as an argument (``trt``) instead of importing it,
so the pure parts (versions, precision rules, optimization profiles, what the parser supports)
are tested without TensorRT, and the build calls are checked against a recording stand-in
(plumbing only: it proves which documented calls are made, not that TensorRT accepts them).
Nothing in this project's CI has run these calls against a real TensorRT.

Sources (the API as documented; ../shared/reference/accelerators.md §2):

* build: NVIDIA/TensorRT ``samples/python/common_runtime.py`` and
  ``samples/python/efficientdet/build_engine.py`` (``trt.Builder``, ``create_network``,
  ``trt.OnnxParser.parse``, ``create_builder_config``, ``set_memory_pool_limit``,
  ``create_optimization_profile`` / ``set_shape``, ``build_serialized_network``, None on failure);
* what the parser takes: ``IParser::supportsModelV2``, ``getNbSubgraphs``, ``isSubgraphSupported``,
  ``getSubgraphNodes`` (https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/c-api/
  classnvonnxparser_1_1_i_parser-members.html; ``supportsModel`` is deprecated since 10.1);
* precision: ``BuilderFlag.FP16`` / ``INT8`` on 10.x; 11.x removed them and builds strongly typed
  networks (FP16 from an AutoCast-rewritten model, INT8 from Q/DQ nodes);
* DLA: ``config.default_device_type = DeviceType.DLA``, ``config.DLA_core``,
  ``BuilderFlag.GPU_FALLBACK``, FP16/INT8 only, static shapes only; present in 10.0-10.7 and
  from 11.4.1 (AGX Orin, JetPack >= 7.2.2).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import onnx

from hetsched._errors import CompileError

__all__ = [
    "PRECISIONS",
    "BuildSettings",
    "Profile",
    "SupportReport",
    "bake_static_shapes",
    "build_serialized_engine",
    "build_settings",
    "configure_builder",
    "create_network",
    "dla_available",
    "node_support",
    "parse_version",
    "query_support",
]

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8")

Dims = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """One input's optimization-profile shapes (``IOptimizationProfile.set_shape(name, min, opt, max)``)."""

    name: str
    min: Dims
    opt: Dims
    max: Dims


@dataclass(frozen=True)
class BuildSettings:
    """What an engine is built with (all of it is part of the engine cache key)."""

    precision: Precision
    dla_core: int | None
    """The DLA core the engine targets, or None for the GPU."""
    workspace: int | None
    """``MemoryPoolType.WORKSPACE`` limit in bytes (None: TensorRT's default)."""
    profiles: tuple[Profile, ...]
    """Free input dimensions' ranges (empty: every input is static)."""
    version: tuple[int, ...]
    """TensorRT's version, from ``trt.__version__``."""

    @property
    def strongly_typed(self) -> bool:
        """TensorRT 11 builds strongly typed networks only (the builder precision flags are gone)."""
        return self.version[:1] >= (11,)


def parse_version(text: str) -> tuple[int, ...]:
    """``"10.3.0.30"`` -> ``(10, 3, 0, 30)``.

    :raises CompileError: not a dotted version (a TensorRT that does not say what it is).
    """
    parts = re.findall(r"\d+", text.split("+")[0])
    if not parts:
        raise CompileError(f"cannot read TensorRT's version from trt.__version__ = {text!r}")
    return tuple(int(p) for p in parts)


def dla_available(version: Sequence[int]) -> bool:
    """Whether this TensorRT version builds for DLA (10.0-10.7, and 11.4.1 on)."""
    v = tuple(version)
    return (v[:1] >= (10,) and v[:2] <= (10, 7)) or v[:3] >= (11, 4, 1)


# -- what the parser supports -------------------------------------------------------------


@dataclass(frozen=True)
class SupportReport:
    """Which nodes of a stage TensorRT takes (by node name), and why it takes no others."""

    supported: frozenset[str]
    unsupported: Mapping[str, str]
    """node name -> the reason (the parser's error for that node where it gave one)."""

    @property
    def complete(self) -> bool:
        return not self.unsupported


def _node_label(names: Sequence[str], index: int) -> str:
    name = names[index] if 0 <= index < len(names) else ""
    return name or f"#{index}"


def node_support(node_names: Sequence[str], subgraphs: Iterable[tuple[Sequence[int], bool]],
                 errors: Iterable[tuple[int, str]] = ()) -> SupportReport:
    """Turn ``supports_model_v2``'s answer into node names.

    ``subgraphs`` is, per ``i < parser.num_subgraphs``, ``(parser.get_subgraph_nodes(i),
    parser.is_subgraph_supported(i))`` (node indices into the graph's node list); ``errors`` the
    parser's errors as ``(error.node(), error.desc())`` (``-1`` when an error names no node). A node
    in no supported subgraph is unsupported; its reason is its own error, else the errors that
    name no node, else that the parser left it out of every supported subgraph.
    """
    supported: set[int] = set()
    listed: set[int] = set()
    for nodes, ok in subgraphs:
        idx = {int(n) for n in nodes}
        listed |= idx
        if ok:
            supported |= idx
    by_node: dict[int, list[str]] = {}
    general: list[str] = []
    for node, desc in errors:
        (by_node.setdefault(int(node), []) if int(node) >= 0 else general).append(str(desc))
    unsupported: dict[str, str] = {}
    for i in range(len(node_names)):
        if i in supported:
            continue
        if i in by_node:
            reason = "; ".join(by_node[i])
        elif general:
            reason = "; ".join(general)
        elif i in listed:
            reason = "TensorRT's ONNX parser marks its subgraph unsupported"
        else:
            reason = "TensorRT's ONNX parser put it in no supported subgraph"
        unsupported[_node_label(node_names, i)] = reason
    return SupportReport(frozenset(_node_label(node_names, i) for i in sorted(supported)
                                   if 0 <= i < len(node_names)), unsupported)


def _parser_errors(parser: Any) -> list[tuple[int, str]]:
    out = []
    for i in range(int(parser.num_errors)):
        err = parser.get_error(i)
        node = err.node() if callable(getattr(err, "node", None)) else -1
        desc = err.desc() if callable(getattr(err, "desc", None)) else str(err)
        out.append((int(node), str(desc)))
    return out


def query_support(parser: Any, model_bytes: bytes, node_names: Sequence[str]) -> SupportReport:
    """Ask an ``OnnxParser`` which nodes of ``model_bytes`` it takes (``supports_model_v2``)."""
    parser.supports_model_v2(model_bytes)
    subgraphs = [(list(parser.get_subgraph_nodes(i)), bool(parser.is_subgraph_supported(i)))
                 for i in range(int(parser.num_subgraphs))]
    report = node_support(node_names, subgraphs, _parser_errors(parser))
    parser.clear_errors()
    return report


# -- build settings (pure) -------------------------------------------------------------------


_Q_DQ = ("QuantizeLinear", "DequantizeLinear")


def _has_fp16(model: onnx.ModelProto) -> bool:
    f16 = onnx.TensorProto.FLOAT16
    g = model.graph
    return (any(t.data_type == f16 for t in g.initializer)
            or any(v.type.tensor_type.elem_type == f16 for v in (*g.input, *g.output, *g.value_info))
            or any(a.name == "to" and a.i == f16 for n in g.node if n.op_type == "Cast" for a in n.attribute))


def _free_inputs(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Graph inputs (not initializers) with their dims, None for a free one."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, tuple[int | None, ...]] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims)
    return out


def _fill(name: str, dims: tuple[int | None, ...], given: Sequence[int], what: str) -> Dims:
    if len(given) != len(dims):
        raise CompileError(f"{what} for input {name!r} has rank {len(given)}; the stage's input has rank {len(dims)}")
    out = []
    for k, (d, g) in enumerate(zip(dims, given, strict=True)):
        if d is not None and int(g) != d:
            raise CompileError(f"{what} for input {name!r}: dimension {k} is fixed at {d}, got {int(g)}")
        out.append(int(g))
    return tuple(out)


def _profiles(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
              ranges: Mapping[str, Sequence[Sequence[int]]], dla: bool) -> tuple[Profile, ...]:
    profiles = []
    for name, dims in _free_inputs(model).items():
        if all(d is not None for d in dims):
            continue
        if name in ranges:
            if dla:
                raise CompileError(f"input {name!r}: DLA runs static shapes only, so it takes no profile range; "
                                   "give one shape in shapes= instead")
            lo, opt, hi = (_fill(name, dims, r, "profiles") for r in ranges[name])
            if not all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)):
                raise CompileError(f"profiles for input {name!r}: need min <= opt <= max, got {lo}, {opt}, {hi}")
            profiles.append(Profile(name, lo, opt, hi))
        elif name in shapes:
            fixed = _fill(name, dims, shapes[name], "shapes")
            profiles.append(Profile(name, fixed, fixed, fixed))
        else:
            free = [k for k, d in enumerate(dims) if d is None]
            kind = "DLA runs static shapes only" if dla else "TensorRT needs an optimization profile for it"
            raise CompileError(f"input {name!r} has free dimension(s) {free} and no shape: {kind}; give its shape "
                               "with shapes= (Session(shapes=...)) or, on the GPU, a range in the 'profiles' option")
    return tuple(profiles)


def build_settings(model: onnx.ModelProto, options: Mapping[str, Any], *, version: Sequence[int],
                   dla_core: int | None) -> BuildSettings:
    """The settings a stage is built with, from ``Device.options`` (``precision``, ``workspace``,
    ``shapes``, ``profiles``) and the TensorRT version; refuses what that version or DLA cannot do.

    :raises CompileError: an unknown precision; FP32 on DLA; DLA on a TensorRT without it; INT8
        without Q/DQ nodes (implicit, calibrator-based INT8 is not offered); FP16 on 11.x for a model
        with no FP16 tensors (11.x takes precision from the model's types); a free input dimension
        without a shape, or any profile range on DLA; a bad ``workspace``.
    """
    v = tuple(int(x) for x in version)
    if v[:1] < (10,):
        raise CompileError(f"TensorRT {'.'.join(map(str, v))} is older than 10, which this backend needs "
                           "(the tensor-address API, execute_async_v3, supports_model_v2)")
    dla = dla_core is not None
    precision = str(options.get("precision", "fp16" if dla else "fp32"))
    if precision not in PRECISIONS:
        raise CompileError(f"precision {precision!r} is not one of {list(PRECISIONS)}")
    if dla:
        if not dla_available(v):
            raise CompileError(f"TensorRT {'.'.join(map(str, v))} has no DLA support (10.0-10.7, or 11.4.1 and "
                               "later on AGX Orin with JetPack >= 7.2.2)")
        if precision == "fp32":
            raise CompileError("DLA runs FP16 or INT8 only; precision 'fp32' cannot run on a DLA core")
    has_qdq = any(n.op_type in _Q_DQ for n in model.graph.node)
    if precision == "int8" and not has_qdq:
        raise CompileError("precision 'int8' needs a model with QuantizeLinear/DequantizeLinear nodes (explicit "
                           "quantization); calibrator-based INT8 is deprecated since TensorRT 10.1 and gone in 11")
    if precision == "fp16" and v[:1] >= (11,) and not _has_fp16(model):
        raise CompileError(f"TensorRT {'.'.join(map(str, v))} removed BuilderFlag.FP16 (networks are strongly "
                           "typed): give an FP16 model (e.g. rewritten by ModelOpt AutoCast) for precision 'fp16'")
    workspace = options.get("workspace")
    if workspace is not None and (not isinstance(workspace, int) or isinstance(workspace, bool) or workspace <= 0):
        raise CompileError(f"workspace {workspace!r} must be a positive number of bytes")
    shapes = {k: tuple(s) for k, s in (options.get("shapes") or {}).items()}
    ranges = dict(options.get("profiles") or {})
    return BuildSettings(precision, dla_core, workspace, _profiles(model, shapes, ranges, dla), v)


def bake_static_shapes(model: onnx.ModelProto, settings: BuildSettings) -> tuple[onnx.ModelProto, BuildSettings]:
    """Write every profile whose min, opt and max agree into the model's input shapes (a static
    network: what DLA requires, and a GPU engine with nothing to choose); returns the new model and
    the settings keeping only the real ranges. ``model`` is left alone."""
    fixed = {p.name: p.min for p in settings.profiles if p.min == p.opt == p.max}
    if not fixed:
        return model, settings
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        if vi.name in fixed:
            for d, value in zip(vi.type.tensor_type.shape.dim, fixed[vi.name], strict=True):
                d.Clear()
                d.dim_value = value
    kept = tuple(p for p in settings.profiles if p.name not in fixed)
    return out, dataclasses.replace(settings, profiles=kept)


# -- the build calls -------------------------------------------------------------------------


def create_network(trt: Any, builder: Any, settings: BuildSettings) -> Any:
    """``builder.create_network(flags)``: strongly typed on 11.x; on 10.x a weakly typed network
    (explicit batch is the only mode since 10.0, so no flag is needed) that the FP16/INT8
    builder flags may lower."""
    flags = 0
    if settings.strongly_typed:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder.create_network(flags)


def configure_builder(trt: Any, builder: Any, settings: BuildSettings) -> Any:
    """A builder config for ``settings``: workspace, precision flags (10.x), DLA, profiles."""
    config = builder.create_builder_config()
    if settings.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace)
    if not settings.strongly_typed:
        if settings.precision == "fp16":
            config.set_flag(trt.BuilderFlag.FP16)
        elif settings.precision == "int8":
            # A weakly typed network with Q/DQ nodes is built in explicit-quantization mode; the
            # developer guide up to 8.x says the INT8 flag must be set for any quantized layer,
            # and 10.x keeps BuilderFlag.INT8. NVIDIA's current guide ("Explicit Quantization")
            # prefers strongly typed Q/DQ networks with no precision flags, which is what 11.x
            # requires ("TensorRT 10.x to 11.x Python API": BuilderFlag.INT8 -> Q/DQ nodes).
            config.set_flag(trt.BuilderFlag.INT8)
            # layers without Q/DQ scales may still take FP16 (what DLA needs for them)
            config.set_flag(trt.BuilderFlag.FP16)
    if settings.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = settings.dla_core
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    if settings.profiles:
        profile = builder.create_optimization_profile()
        for p in settings.profiles:
            profile.set_shape(p.name, p.min, p.opt, p.max)
        config.add_optimization_profile(profile)
    return config


def _describe_errors(parser: Any) -> str:
    errs = _parser_errors(parser)
    return "; ".join(desc if node < 0 else f"node #{node}: {desc}" for node, desc in errs) or "no details given"


def build_serialized_engine(trt: Any, model_bytes: bytes, settings: BuildSettings, logger: Any,
                            node_names: Sequence[str]) -> bytes:
    """Parse ``model_bytes`` and build its engine; returns the serialized engine.

    :raises CompileError: the parser does not take every node (names and reasons), parsing
        failed, a network input is dynamic on DLA, or ``build_serialized_network`` returned None.
    """
    builder = trt.Builder(logger)
    network = create_network(trt, builder, settings)
    parser = trt.OnnxParser(network, logger)
    report = query_support(parser, model_bytes, node_names)
    if not report.complete:
        listed = "; ".join(f"{n}: {r}" for n, r in sorted(report.unsupported.items()))
        raise CompileError(f"TensorRT cannot take {len(report.unsupported)} node(s): {listed}")
    if not parser.parse(model_bytes):
        raise CompileError(f"TensorRT's ONNX parser failed: {_describe_errors(parser)}")
    if settings.dla_core is not None:
        for i in range(int(network.num_inputs)):
            tensor = network.get_input(i)
            if any(int(d) < 0 for d in tensor.shape):
                raise CompileError(f"input {tensor.name!r} has a dynamic shape {list(tensor.shape)}: "
                                   "DLA runs static shapes only")
    config = configure_builder(trt, builder, settings)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise CompileError("TensorRT's builder failed (build_serialized_network returned None; "
                           "its logger has the reason)")
    return bytes(serialized)
