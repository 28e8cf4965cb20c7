"""Loading ONNX models: from a path, an embedded model name, bytes or a ``ModelProto``; checked
and shape-inferred.

The embedded models are the ``light_*`` models the onnx wheel ships for its backend tests
(``onnx/backend/test/data/light``, https://github.com/onnx/onnx/tree/main/onnx/backend/test/data/light).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

import onnx
from google.protobuf.message import DecodeError

from .._errors import InputError, InvalidModelError, ModelFormatError, ModelNotFoundError, NotRegularFileError
from .._platform.files import file_kind, read_regular_file

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
        where ONNX can tell (stage boundaries need them); inferred shapes win over stale
        declared ones (see :func:`_infer_trusting_inference`).
    :raises ModelNotFoundError: the path does not exist, a bare name is neither a file
        nor an embedded model (the message lists the embedded ones), or an external data
        file the model names does not exist next to it (the message names the file).
    :raises NotRegularFileError: the model file or an external data file it names is a FIFO,
        a device, a socket (or a link to one): refused before anything is read from it, so
        neither a FIFO nor ``/dev/zero`` can hang or fill memory.
    :raises ModelFormatError: the bytes are not a serialized ``ModelProto``.
    :raises InvalidModelError: the checker or shape inference rejected the model, a declared
        element type contradicts the inferred one, its external data could not be loaded, or
        bytes / a ``ModelProto`` still refer to external data files (they have no directory).
    """
    name = _describe(source)
    base_dir: Path | None = None
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
                data = read_regular_file(path, what="model file")
            except FileNotFoundError as exc:
                raise ModelNotFoundError(f"model file {name!r} does not exist") from exc
            except NotRegularFileError:
                raise
            except OSError as exc:
                raise ModelNotFoundError(f"model file {name!r} could not be read: {exc}") from exc
            base_dir = path.parent
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
        if base_dir is not None:
            _load_external_data(model, name, base_dir)
    if base_dir is None:
        _refuse_unresolved_external_data(model, name)
    if check:
        try:
            onnx.checker.check_model(model)
        except (onnx.checker.ValidationError, ValueError) as exc:
            raise InvalidModelError(f"model {name!r} is not a valid ONNX graph: {exc}") from exc
    if infer_shapes:
        try:
            model = _infer_trusting_inference(model, name)
        except InvalidModelError:
            raise
        except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as exc:
            raise InvalidModelError(f"model {name!r}: shape inference failed: {exc}") from exc
    return model


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``graph`` and its subgraphs: initializers, sparse ones' parts, node attributes."""
    yield from graph.initializer
    for sp in graph.sparse_initializer:
        yield sp.values
        yield sp.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _external_tensors(model: onnx.ModelProto) -> list[tuple[onnx.TensorProto, str]]:
    """(tensor, location) of every tensor whose data lies in an external file (not yet loaded)."""
    out: list[tuple[onnx.TensorProto, str]] = []
    for t in _tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            out.append((t, location))
    return out


def _load_external_data(model: onnx.ModelProto, name: str, base_dir: Path) -> None:
    """Load the external data of a model read from a file in ``base_dir`` (files relative to it).

    :raises ModelNotFoundError: a data file the model names does not exist.
    :raises NotRegularFileError: a data file is a FIFO, device, socket or directory.
    :raises InvalidModelError: a location outside ``base_dir``, or a file too short or unreadable.
    """
    external = _external_tensors(model)
    if not external:
        return
    for tensor, location in external:
        # Only plain relative locations are looked at: onnx refuses the others without touching them.
        if location and not Path(location).is_absolute() and ".." not in Path(location).parts:
            _check_external_file(name, tensor.name, location, base_dir)
    try:
        onnx.load_external_data_for_model(model, str(base_dir))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise InvalidModelError(f"model {name!r}: its external data could not be loaded: {exc}") from exc


def _check_external_file(name: str, tensor: str, location: str, base_dir: Path) -> None:
    """Refuse an external data file that is missing or not a regular file, naming what it is.

    The file is stat-ed, never opened (onnx reads it, bounded by the tensor's length, and refuses
    a non-regular file itself); a link is judged by what it leads to.

    :raises ModelNotFoundError: no file there (or a link leading nowhere).
    :raises NotRegularFileError: a FIFO, device, socket or directory there (or a link to one).
    """
    path = base_dir / location
    where = f"model {name!r}: tensor {tensor!r} keeps its data in the external file {location!r}"
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        dangling = " (a link leading nowhere)" if path.is_symlink() else ""
        raise ModelNotFoundError(f"{where}, which does not exist next to the model (in {str(base_dir)!r})"
                                 f"{dangling}") from exc
    except OSError:
        return  # onnx reports what else is wrong
    if not stat.S_ISREG(st.st_mode):
        kind = file_kind(st.st_mode)
        via = f" (a link to {os.path.realpath(path)!r})" if path.is_symlink() else ""
        raise NotRegularFileError(f"{where}, which is {kind}{via}, not a regular file: nothing was read from it",
                                  path=str(path), kind=kind)


def _refuse_unresolved_external_data(model: onnx.ModelProto, name: str) -> None:
    """A model given as bytes or a ``ModelProto`` has no directory its data files are relative to
    (onnx and onnxruntime would look in the process's working directory, whatever that is).

    :raises InvalidModelError: some tensor still refers to an external file.
    """
    external = _external_tensors(model)
    if external:
        tensor, location = external[0]
        more = f" (and {len(external) - 1} more)" if len(external) > 1 else ""
        raise InvalidModelError(
            f"model {name!r}: tensor {tensor.name!r}{more} keeps its data in the "
            f"external file {location!r}, which cannot be located without the model's path: load the model "
            "from its file, or with onnx.load(path), which reads the data too")


def _is_unknown(dim: onnx.TensorShapeProto.Dimension) -> bool:
    return not dim.HasField("dim_value") and (not dim.dim_param or dim.dim_param.startswith("unk__"))


def _merge_output(declared: onnx.TypeProto, inferred: onnx.TypeProto) -> onnx.TypeProto:
    """A graph output's type: the inferred shape where inference knows one (dimension by
    dimension: an inferred size wins, a declared name fills a dimension inference left
    unnamed), else the declared type."""
    if (declared.WhichOneof("value") != "tensor_type" or inferred.WhichOneof("value") != "tensor_type"
            or not inferred.tensor_type.HasField("shape")):
        return declared
    merged = onnx.TypeProto()
    merged.CopyFrom(inferred)
    merged.tensor_type.elem_type = declared.tensor_type.elem_type or inferred.tensor_type.elem_type
    want = declared.tensor_type.shape.dim if declared.tensor_type.HasField("shape") else []
    dims = merged.tensor_type.shape.dim
    if len(want) == len(dims):
        for d, w in zip(dims, want, strict=True):
            if _is_unknown(d) and w.dim_param and not w.HasField("dim_value"):
                d.Clear()
                d.dim_param = w.dim_param
    return merged


def _copy_type(t: onnx.TypeProto) -> onnx.TypeProto:
    out = onnx.TypeProto()
    out.CopyFrom(t)
    return out


def _copy_value_info(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    return out


def _dtype_name(elem_type: int) -> str:
    return str(onnx.TensorProto.DataType.Name(elem_type))


def _elem_type(t: onnx.TypeProto) -> int:
    return t.tensor_type.elem_type if t.WhichOneof("value") == "tensor_type" else 0


def _infer_trusting_inference(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """ONNX shape inference where what the model declares for values inside the graph
    (``value_info``, and the shapes of graph outputs) does not override what inference finds.

    Exporters and graph surgery leave stale declarations behind; onnxruntime runs such models
    (it only warns while merging), but a declared shape baked into a stage boundary would make
    the stage refuse, or its bound outputs mismatch, the real tensor. So inference first runs
    without them; a declaration is kept only for a value inference cannot type at all (an op
    without inference, a custom domain), and a second pass then uses it downstream. Graph
    inputs keep their declared types: feeds are checked against them. ``model`` itself is
    modified (its ``value_info`` and output shapes cleared): pass a copy of the caller's.

    :raises InvalidModelError: a declared element type contradicts the inferred one
        (onnxruntime refuses such a model too).
    :raises onnx.shape_inference.InferenceError, ValueError, RuntimeError: inference failed.
    """
    declared_outputs = [_copy_type(o.type) for o in model.graph.output]
    declared = [_copy_value_info(vi) for vi in model.graph.value_info]
    work = model  # modified in place: a copy would double a model's weights in memory
    produced = {o for node in model.graph.node for o in node.output if o}
    del work.graph.value_info[:]
    for o in work.graph.output:
        # an output no node makes (a graph input passed through) keeps its type: inference
        # has nothing to give it, and an untyped one stops it from typing the rest
        if o.type.WhichOneof("value") == "tensor_type" and o.name in produced:
            o.type.tensor_type.ClearField("shape")
            o.type.tensor_type.ClearField("elem_type")  # else inference keeps a wrong one silently
    inferred = _infer(work)
    typed = {vi.name: vi.type for vi in inferred.graph.value_info if vi.type.WhichOneof("value") is not None}
    boundary = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    gaps = []
    for vi in declared:
        if vi.name in boundary or vi.name not in produced:
            continue  # graph inputs and outputs have their own declarations; no node makes the rest
        got = typed.get(vi.name)
        if got is None:
            gaps.append(vi)
        elif _elem_type(got) and _elem_type(vi.type) and _elem_type(got) != _elem_type(vi.type):
            raise InvalidModelError(
                f"model {name!r}: value_info declares {vi.name!r} as "
                f"{_dtype_name(_elem_type(vi.type))}, but the node producing it "
                f"makes {_dtype_name(_elem_type(got))}")
    if gaps:
        work.graph.value_info.extend(gaps)
        inferred = _infer(work)
    for out, want in zip(inferred.graph.output, declared_outputs, strict=True):
        got = out.type
        if _elem_type(got) and _elem_type(want) and _elem_type(got) != _elem_type(want):
            raise InvalidModelError(
                f"model {name!r}: graph output {out.name!r} is declared "
                f"{_dtype_name(_elem_type(want))}, but the node producing it "
                f"makes {_dtype_name(_elem_type(got))}")
        out.type.CopyFrom(_merge_output(want, got))
    return inferred


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    # data_prop: shapes computed from other shapes (Shape -> Slice -> Concat -> Reshape, as
    # exporters write flatten and view) become static where the inputs' shapes are.
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)


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
    try:
        # the old inferred value_info is stale now: inference overrides it where it knows better
        return _infer_trusting_inference(out, "shapes")
    except Exception as exc:  # onnx raises several types; the shapes are what made it fail
        raise InputError(f"shapes {dict(shapes)}: shape inference failed: {exc}") from exc
