"""What :class:`hetsched.InferenceSession` reports the way onnxruntime does: node args, model
metadata, type strings, and the mapping from onnxruntime's execution providers to hetsched's
devices.

Everything here is pure (no session, no event loop): a function of the model's declared graph
or of the provider list the caller passed. onnxruntime's documented behaviour is the reference:

* ``NodeArg.shape`` holds an ``int`` for a fixed dim, the ``dim_param`` string for a symbolic
  one and ``None`` for a dim with neither; ``NodeArg.type`` is ``"tensor(float)"`` and so on.
* ``get_inputs()`` lists the graph inputs that are not initializers;
  ``get_overridable_initializers()`` the initializers that are also listed as graph inputs.
* ``ModelMetadata`` carries ``producer_name``, ``graph_name``, ``domain``, ``description``
  (the model's doc string), ``graph_description``, ``version`` and ``custom_metadata_map``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

__all__ = [
    "ModelMetadata",
    "NodeArg",
    "Provider",
    "ProviderChoice",
    "choose_providers",
    "graph_inputs",
    "graph_outputs",
    "model_metadata",
    "numpy_dtype",
    "overridable_initializers",
    "provider_for_device",
]

_log = logging.getLogger("hetsched")

# onnxruntime's names of the tensor element types (``NodeArg.type`` is ``tensor(<name>)``).
_ELEM_NAMES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.STRING: "string",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "double",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.COMPLEX64: "complex64",
    onnx.TensorProto.COMPLEX128: "complex128",
    onnx.TensorProto.BFLOAT16: "bfloat16",
}

Dim = int | str | None


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as onnxruntime's ``NodeArg`` describes it."""

    name: str
    shape: list[Dim] | None = field(hash=False)
    """Per dim: an ``int`` (fixed), the symbolic name (``str``) or ``None`` (unknown); ``None``
    for a value whose rank is unknown or that is not a tensor."""
    type: str
    """``"tensor(float)"``, ``"seq(tensor(int64))"``, ``"map(string,tensor(float))"``, ..."""


@dataclass(frozen=True)
class ModelMetadata:
    """A model's metadata as onnxruntime's ``ModelMetadata`` gives it."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(hash=False)


def _type_string(tp: onnx.TypeProto) -> str:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({_ELEM_NAMES.get(tp.tensor_type.elem_type, 'undefined')})"
    if which == "sparse_tensor_type":
        return f"sparse_tensor({_ELEM_NAMES.get(tp.sparse_tensor_type.elem_type, 'undefined')})"
    if which == "sequence_type":
        return f"seq({_type_string(tp.sequence_type.elem_type)})"
    if which == "map_type":
        key = _ELEM_NAMES.get(tp.map_type.key_type, "undefined")
        return f"map({key},{_type_string(tp.map_type.value_type)})"
    if which == "optional_type":
        return f"optional({_type_string(tp.optional_type.elem_type)})"
    return "undefined"


def _shape(tp: onnx.TypeProto) -> list[Dim] | None:
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return [] if tp.WhichOneof("value") == "tensor_type" else None
    dims: list[Dim] = []
    for d in tp.tensor_type.shape.dim:
        which = d.WhichOneof("value")
        if which == "dim_value":
            dims.append(d.dim_value if d.dim_value >= 0 else None)  # onnxruntime: a negative dim is unknown
        else:
            dims.append(d.dim_param if which == "dim_param" else None)
    return dims


def _node_arg(vi: onnx.ValueInfoProto) -> NodeArg:
    return NodeArg(vi.name, _shape(vi.type), _type_string(vi.type))


def graph_inputs(model: onnx.ModelProto) -> list[NodeArg]:
    """The graph inputs that are not initializers, in the graph's order."""
    inits = {t.name for t in model.graph.initializer}
    return [_node_arg(vi) for vi in model.graph.input if vi.name not in inits]


def overridable_initializers(model: onnx.ModelProto) -> list[NodeArg]:
    """Initializers also listed as graph inputs (a feed may replace them)."""
    inits = {t.name for t in model.graph.initializer}
    return [_node_arg(vi) for vi in model.graph.input if vi.name in inits]


def graph_outputs(model: onnx.ModelProto) -> list[NodeArg]:
    return [_node_arg(vi) for vi in model.graph.output]


def model_metadata(model: onnx.ModelProto) -> ModelMetadata:
    return ModelMetadata(
        producer_name=model.producer_name,
        graph_name=model.graph.name,
        domain=model.domain,
        description=model.doc_string,
        graph_description=model.graph.doc_string,
        version=model.model_version,
        custom_metadata_map={p.key: p.value for p in model.metadata_props},
    )


def numpy_dtype(arg: NodeArg) -> np.dtype[Any] | None:
    """The numpy dtype a list fed for ``arg`` is converted to (``None``: not a plain tensor)."""
    if not arg.type.startswith("tensor("):
        return None
    name = arg.type[len("tensor("):-1]
    return _NUMPY.get(name)


# onnxruntime's element type names -> numpy dtypes (bfloat16 has none in numpy).
_NUMPY: dict[str, np.dtype[Any]] = {
    name: np.dtype(dt) for name, dt in (
        ("float", np.float32), ("double", np.float64), ("float16", np.float16), ("int8", np.int8),
        ("uint8", np.uint8), ("int16", np.int16), ("uint16", np.uint16), ("int32", np.int32),
        ("uint32", np.uint32), ("int64", np.int64), ("uint64", np.uint64), ("bool", np.bool_),
        ("string", np.object_), ("complex64", np.complex64), ("complex128", np.complex128))
}


class Provider(enum.Enum):
    """onnxruntime execution providers that mean something on a hetsched board."""

    CPU = "CPUExecutionProvider"
    TENSORRT = "TensorrtExecutionProvider"
    CUDA = "CUDAExecutionProvider"
    RKNPU = "RknpuExecutionProvider"
    """onnxruntime's name for Rockchip's NPU provider; hetsched runs it through RKNN."""
    NCNN = "HetschedNcnnExecutionProvider"
    """hetsched's own name for a GPU driven through ncnn's Vulkan path (the RK3588's Mali)."""


# Provider names accepted besides the enum's values (another spelling of the same device).
_ALIASES: dict[str, Provider] = {
    "RKNPUExecutionProvider": Provider.RKNPU,
    "RknnExecutionProvider": Provider.RKNPU,
    "HetschedRknnExecutionProvider": Provider.RKNPU,
}


@dataclass(frozen=True)
class ProviderChoice:
    """The hetsched device specs a provider list means, and what is reported back."""

    devices: tuple[str, ...] | None
    """Device specs for :class:`hetsched.Session` (``None``: the board's defaults)."""
    providers: tuple[str, ...]
    """The provider names asked for that hetsched maps to devices, in the caller's order, CPU last."""
    options: dict[str, dict[str, str]]
    """Per provider, its options as strings (``get_provider_options()``)."""
    ignored: tuple[str, ...]
    """Provider names that mean nothing here (warned about, like onnxruntime does)."""
    optional: tuple[str, ...] = ()
    """The specs that accelerator providers asked for: a board without that device drops them
    with a warning (onnxruntime warns about an unavailable provider and goes on)."""


def _provider_name(entry: Any) -> tuple[str, Mapping[str, Any]]:
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], Mapping):
        return entry[0], entry[1]
    if isinstance(entry, str):
        return entry, {}
    raise TypeError(f"a provider is a name or a (name, options dict) pair, got {entry!r}")


def _specs_for(provider: Provider, options: Mapping[str, Any]) -> tuple[str, ...]:
    if provider is Provider.CPU:
        return ("clusters",)
    if provider is Provider.RKNPU:
        return ("npu",)
    if provider is Provider.NCNN:
        return ("gpu",)
    specs: tuple[str, ...] = ("gpu",)
    if provider is Provider.TENSORRT and str(options.get("trt_dla_enable", "0")).lower() in ("1", "true"):
        core = options.get("trt_dla_core")
        specs = (*specs, f"dla:{int(core)}" if core is not None else "dla")
    return specs


def choose_providers(providers: Sequence[Any] | None,
                     provider_options: Sequence[Mapping[str, Any]] | None = None) -> ProviderChoice:
    """Map onnxruntime's ``providers=`` / ``provider_options=`` to hetsched device specs.

    ``CPUExecutionProvider`` is the board's CPU clusters; ``TensorrtExecutionProvider`` and
    ``CUDAExecutionProvider`` its GPU (plus a DLA core for TensorRT with ``trt_dla_enable``);
    ``RknpuExecutionProvider`` the RK3588 NPU; a string that is not a provider name is a
    hetsched device spec and is used as it is. As in onnxruntime the CPU is always there as
    the fallback, unless only hetsched device specs were given. Unknown provider names are
    ignored with a warning (onnxruntime warns about unavailable ones the same way).

    :raises ValueError: ``provider_options`` and ``providers`` differ in length.
    :raises TypeError: an entry is neither a name nor a (name, options) pair.
    """
    if providers is None:
        return ProviderChoice(None, (), {}, ())
    entries = [_provider_name(p) for p in providers]
    if provider_options is not None:
        if len(provider_options) != len(entries):
            raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
        entries = [(name, {**opts, **extra}) for (name, opts), extra in zip(entries, provider_options, strict=True)]
    specs: list[str] = []
    optional: list[str] = []
    names: list[str] = []
    options: dict[str, dict[str, str]] = {}
    ignored: list[str] = []
    raw_specs = False
    for name, opts in entries:
        provider = _ALIASES.get(name) or next((p for p in Provider if p.value == name), None)
        if provider is None:
            if name.endswith("ExecutionProvider"):
                ignored.append(name)
                continue
            raw_specs = True
            specs.append(name)
            continue
        if provider.value in names:
            continue
        names.append(provider.value)
        options[provider.value] = {str(k): str(v) for k, v in opts.items()}
        if provider is not Provider.CPU:
            new = [s for s in _specs_for(provider, opts) if s not in specs]
            specs.extend(new)
            optional.extend(new)
    if names and Provider.CPU.value in names:
        names.remove(Provider.CPU.value)
    if not raw_specs or names:
        names.append(Provider.CPU.value)
        options.setdefault(Provider.CPU.value, {})
        specs.append("clusters")
    return ProviderChoice(tuple(specs), tuple(names), options, tuple(ignored), tuple(optional))


def provider_for_device(kind: str, backend: str) -> str:
    """The onnxruntime provider name that stands for a hetsched device (``get_providers()``)."""
    if kind == "cpu":
        return Provider.CPU.value
    if kind == "npu":
        return Provider.RKNPU.value
    if backend == "ncnn":
        return Provider.NCNN.value
    if backend == "ort-gpu":
        return Provider.CUDA.value
    return Provider.TENSORRT.value
