"""Loading ONNX models: from a path, bytes or a ``ModelProto``; checked and shape-inferred."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import onnx
from google.protobuf.message import DecodeError

from .._errors import InvalidModelError, ModelFormatError, ModelNotFoundError

__all__ = ["ModelSource", "load_model"]

ModelSource = Union[str, os.PathLike[str], bytes, onnx.ModelProto]


def _describe(source: ModelSource) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, bytes):
        return f"<{len(source)} bytes>"
    return f"<ModelProto graph {source.graph.name!r}>"


def load_model(source: ModelSource, *, check: bool = True, infer_shapes: bool = True) -> onnx.ModelProto:
    """Load an ONNX model and return a checked, shape-inferred copy.

    :param source: a filesystem path, serialized bytes, or a ``ModelProto`` (not modified).
    :param check: run ``onnx.checker.check_model``.
    :param infer_shapes: run ONNX shape inference so every intermediate value has a type
        where ONNX can tell (stage boundaries need them).
    :raises ModelNotFoundError: the path does not exist.
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
            path = Path(source)
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
