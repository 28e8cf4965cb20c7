"""Loading ONNX models: from a path, an embedded model name, bytes or a ``ModelProto``; checked
and shape-inferred.

The embedded models are the ``light_*`` models the onnx wheel ships for its backend tests
(``onnx/backend/test/data/light``, https://github.com/onnx/onnx/tree/main/onnx/backend/test/data/light).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

import onnx
from google.protobuf.message import DecodeError

from .._errors import InputError, InvalidModelError, ModelFormatError, ModelNotFoundError

__all__ = [
    "EMBEDDED_MODEL_DIR",
    "ModelSource",
    "embedded_model",
    "embedded_model_names",
    "load_model",
    "model_path",
    "with_input_shapes",
]

ModelSource: TypeAlias = str | os.PathLike[str] | bytes | onnx.ModelProto

EMBEDDED_MODEL_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def embedded_model_names() -> tuple[str, ...]:
    """Names of the models shipped in the onnx wheel (``light_resnet50``, ``light_squeezenet``, ...)."""
    return tuple(sorted(p.stem for p in EMBEDDED_MODEL_DIR.glob("light_*.onnx")))


def embedded_model(name: str) -> Path:
    """The file of an embedded model, by name with or without ``light_`` (``squeezenet``).

    :raises ModelNotFoundError: no such embedded model; the message lists those there are.
    """
    stem = name if name.startswith("light_") else f"light_{name}"
    path = EMBEDDED_MODEL_DIR / f"{stem}.onnx"
    if not path.is_file():
        raise ModelNotFoundError(
            f"model {name!r} is neither a file nor an embedded model; embedded: {list(embedded_model_names())}"
        )
    return path


def model_path(source: str | os.PathLike[str]) -> Path:
    """The file ``source`` names: a path, or else (a bare name) an embedded model.

    A string that exists, contains a path separator or ends in ``.onnx`` is a path (returned
    whether or not it exists); anything else is looked up with :func:`embedded_model`.

    :raises ModelNotFoundError: a bare name that is neither a file nor an embedded model.
    """
    path = Path(source)
    if not isinstance(source, str) or path.exists() or os.sep in source or source.endswith(".onnx"):
        return path
    return embedded_model(source)


def _describe(source: ModelSource) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, bytes):
        return f"<{len(source)} bytes>"
    return f"<ModelProto graph {source.graph.name!r}>"


def load_model(source: ModelSource, *, check: bool = True, infer_shapes: bool = True) -> onnx.ModelProto:
    """Load an ONNX model and return a checked, shape-inferred copy.

    :param source: a filesystem path, an embedded model name (see :func:`model_path`),
        serialized bytes, or a ``ModelProto`` (not modified).
    :param check: run ``onnx.checker.check_model``.
    :param infer_shapes: run ONNX shape inference so every intermediate value has a type
        where ONNX can tell (stage boundaries need them).
    :raises ModelNotFoundError: the path does not exist, or a bare name is neither a file
        nor an embedded model (the message lists the embedded ones).
    :raises ModelFormatError: the bytes are not a serialized ``ModelProto``.
    :raises InvalidModelError: the checker or shape inference rejected the model.
    """
    name = _describe(source)
    base_dir: str | None = None
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
    else:
        if isinstance(source, (str, os.PathLike)):
            path = model_path(source)
            if not path.exists():
                raise ModelNotFoundError(f"model file {name!r} does not exist")
            if path.is_dir():
                raise ModelFormatError(f"model path {name!r} is a directory, not an ONNX file")
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise ModelNotFoundError(f"model file {name!r} could not be read: {exc}") from exc
            base_dir = str(path.parent)
        else:
            data = source
        if not data:
            raise ModelFormatError(f"model {name!r} is empty, not an ONNX model")
        model = onnx.ModelProto()
        try:
            model.ParseFromString(data)
        except (DecodeError, RuntimeWarning, ValueError) as exc:
            raise ModelFormatError(f"model {name!r} is not an ONNX model: {exc}") from exc
        if not model.graph.node and not model.graph.output and not model.opset_import:
            # Protobuf happily parses many random byte strings into an empty message.
            raise ModelFormatError(f"model {name!r} is not an ONNX model: no graph, outputs or opset imports")
        if base_dir is not None and _has_external_data(model):
            try:
                onnx.load_external_data_for_model(model, base_dir)
            except (OSError, ValueError) as exc:
                raise InvalidModelError(f"model {name!r}: external data could not be loaded: {exc}") from exc
    if check:
        try:
            onnx.checker.check_model(model)
        except (onnx.checker.ValidationError, ValueError) as exc:
            raise InvalidModelError(f"model {name!r} is not a valid ONNX graph: {exc}") from exc
    if infer_shapes:
        try:
            model = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as exc:
            raise InvalidModelError(f"model {name!r}: shape inference failed: {exc}") from exc
    return model


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer
    )


def with_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of ``model`` whose named graph inputs have the given static shapes, re-inferred.

    Like onnxruntime's free-dimension overrides: planning then costs the model at the shapes it
    will run with (a free dimension otherwise counts as 1), and feeds must have those shapes.

    :raises InputError: a name that is no graph input, a shape of another rank, or a shape that
        contradicts one of the input's fixed dimensions.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inputs = {i.name: i for i in out.graph.input}
    for name, dims in shapes.items():
        vi = inputs.get(name)
        if vi is None or not vi.type.HasField("tensor_type"):
            raise InputError(f"shapes: {name!r} is not a tensor input of the model (inputs: {sorted(inputs)})")
        shape = vi.type.tensor_type.shape
        if len(shape.dim) != len(dims):
            raise InputError(f"shapes: input {name!r} has rank {len(shape.dim)}, got {list(dims)}")
        for k, (d, want) in enumerate(zip(shape.dim, dims, strict=True)):
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != int(want):
                raise InputError(f"shapes: input {name!r} dimension {k} is fixed at {d.dim_value}, got {want}")
            d.Clear()
            d.dim_value = int(want)
    del out.graph.value_info[:]  # inferred again from the new input shapes
    try:
        return onnx.shape_inference.infer_shapes(out)
    except Exception as exc:  # onnx raises several types; the shapes are what made it fail
        raise InputError(f"shapes {dict(shapes)}: shape inference failed: {exc}") from exc
