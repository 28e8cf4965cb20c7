"""Feed checks: what a model's graph inputs accept, checked before a request is admitted.

:class:`FeedChecker` is built once per opened model from its :class:`GraphIndex` and turns a
caller's feeds into the dict of arrays the scheduler runs (or raises :class:`InputError`
naming the input). :func:`random_feeds` makes inputs of the right types for ``profile()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from .._errors import FreeDimsError, InputError
from .._planning.graph import GraphIndex

__all__ = ["EXAMPLE_BATCH", "EXAMPLE_IMAGE_SIDE", "EXAMPLE_OTHER_DIM", "STATIC_SHAPE_BACKENDS", "FeedChecker", "free_dims",
           "np_dtype", "random_feeds", "require_fixed_shapes"]

STATIC_SHAPE_BACKENDS = frozenset({"rknn", "tensorrt", "ncnn"})
"""Backends whose stages need every dim fixed (a converted NPU model, an engine, a ncnn net);
onnxruntime-based ones (cpu, sim, ort_gpu) run free dims as they come."""

EXAMPLE_BATCH = 1
"""The size a free leading (batch) dim is given in a :class:`FreeDimsError`'s example ``--shape``."""
EXAMPLE_IMAGE_SIDE = 640
"""The height and width suggested for an NCHW image input (1, 3 or 4 channels) whose model's
metadata names no ``imgsz``."""
EXAMPLE_OTHER_DIM = 64
"""Any other free dim's example size."""

_Spec = tuple[np.dtype[Any] | None, tuple[int | None, ...] | None, list[Any]]
"""Per tensor input: (dtype, fixed dims (None = any), shape as displayed in messages)."""


def np_dtype(elem_type: int) -> np.dtype[Any] | None:
    """The numpy dtype of an ONNX tensor element type, None where numpy has none."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


class FeedChecker:
    """Checks feeds against one model's graph inputs (names, dtypes, fixed dimensions)."""

    __slots__ = ("_inputs", "_required", "_specs")

    def __init__(self, index: GraphIndex):
        specs: dict[str, _Spec | None] = {}
        for name in index.graph_inputs:
            t = index.value_info[name].type
            if t.WhichOneof("value") != "tensor_type":
                specs[name] = None  # sequences, maps, optionals
                continue
            expected = np_dtype(t.tensor_type.elem_type)
            dims: tuple[int | None, ...] | None = None
            shown: list[Any] = []
            if t.tensor_type.HasField("shape"):
                ds = t.tensor_type.shape.dim
                dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in ds)
                shown = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in ds]
            specs[name] = (expected, dims, shown)
        self._specs = specs
        self._required = tuple(index.required_inputs)
        self._inputs = list(index.required_inputs)

    def check(self, feeds: Any) -> dict[str, Any]:
        """The feeds as ``{input name: array}`` (non-tensor inputs passed through as they are).

        :raises InputError: ``feeds`` is not a mapping; an unknown or missing input name; a
            wrong dtype or a dimension that differs from a fixed one (the message names the input).
        """
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")
        specs = self._specs
        required = self._required
        if len(feeds) < len(required) or any(k not in specs for k in feeds):
            unknown = [k for k in feeds if k not in specs]
            if unknown:
                raise InputError(f"unknown input name(s) {unknown}; the model's inputs are {self._inputs}")
        missing = [n for n in required if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model's inputs are {self._inputs}")
        out: dict[str, Any] = {}
        for name, value in feeds.items():
            spec = specs[name]
            if spec is None:
                out[name] = value  # passed through as onnxruntime does
                continue
            arr = value if type(value) is np.ndarray else np.asarray(value)
            expected, dims, shown = spec
            if expected is not None and arr.dtype != expected and not (
                expected.kind in "OSU" and arr.dtype.kind in "OSU"
            ):
                raise InputError(f"input {name!r}: expected dtype {expected}, got {arr.dtype}")
            if dims is not None:
                shape = arr.shape
                if len(dims) != len(shape):
                    raise InputError(f"input {name!r}: expected shape {shown} (rank {len(dims)}), "
                                     f"got {list(shape)} (rank {arr.ndim})")
                for axis, (d, n) in enumerate(zip(dims, shape, strict=True)):
                    if d is not None and d != n:
                        raise InputError(f"input {name!r}: expected shape {shown}, got {list(shape)} "
                                         f"(axis {axis}: {d} != {n})")
            out[name] = arr
        return out


def random_feeds(index: GraphIndex) -> dict[str, Any]:
    """Inputs of the right dtypes and shapes (free dimensions 1), from a fixed seed.

    :raises InputError: a required input is not a tensor (the caller must pass feeds).
    """
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name in index.required_inputs:
        t = index.value_info[name].type
        if t.WhichOneof("value") != "tensor_type":
            raise InputError(f"input {name!r} is not a tensor: pass feeds to profile()")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in t.tensor_type.shape.dim]
        dt = np_dtype(t.tensor_type.elem_type) or np.dtype(np.float32)
        if dt.kind == "f":
            out[name] = rng.standard_normal(dims).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, dims).astype(dt)
        else:
            out[name] = rng.integers(0, 4, dims).astype(dt)
    return out


def free_dims(index: GraphIndex) -> dict[str, tuple[str, ...]]:
    """``{input: (free dim names, ...)}`` for the required tensor inputs with free dims (an
    unnamed one is ``"dim<k>"``), in input order."""
    out: dict[str, tuple[str, ...]] = {}
    for name in index.required_inputs:
        t = index.value_info[name].type
        if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
            continue
        free = tuple(d.dim_param or f"dim{k}" for k, d in enumerate(t.tensor_type.shape.dim)
                     if not (d.HasField("dim_value") and d.dim_value > 0))
        if free:
            out[name] = free
    return out


def _image_side(index: GraphIndex) -> tuple[int, int]:
    """The ``imgsz`` an ultralytics export records in its metadata, else the default side."""
    for prop in index.model.metadata_props:
        if prop.key == "imgsz":
            nums = [int(x) for x in prop.value.strip("[]() ").replace(",", " ").split() if x.isdigit()]
            if len(nums) == 2:
                return nums[0], nums[1]
            if len(nums) == 1:
                return nums[0], nums[0]
    return EXAMPLE_IMAGE_SIDE, EXAMPLE_IMAGE_SIDE


def _example_shape(index: GraphIndex, name: str) -> tuple[int, ...]:
    dims = index.value_info[name].type.tensor_type.shape.dim
    fixed = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
    image = len(fixed) == 4 and fixed[1] in (1, 3, 4)
    side = _image_side(index) if image else (EXAMPLE_OTHER_DIM, EXAMPLE_OTHER_DIM)
    out = []
    for k, v in enumerate(fixed):
        if v is not None:
            out.append(v)
        elif k == 0:
            out.append(EXAMPLE_BATCH)
        elif image and k in (2, 3):
            out.append(side[k - 2])
        else:
            out.append(EXAMPLE_OTHER_DIM)
    return tuple(out)


def require_fixed_shapes(index: GraphIndex, why: str) -> None:
    """Raise :class:`FreeDimsError` when a required input of ``index`` (shapes already applied)
    still has free dims: one message naming every such input, its free dims, and the exact
    ``--shape`` / ``shapes=`` to pass (example sizes, said to be examples). ``why`` says what
    needs fixed shapes (``"the NPU stages"``, ``"hetsched run"``).
    """
    free = free_dims(index)
    if not free:
        return
    example = {name: _example_shape(index, name) for name in free}
    parts = [f"input {name!r} has free dims {', '.join(dims)}" for name, dims in free.items()]
    flags = " ".join(f"--shape {name}={','.join(map(str, shp))}" for name, shp in example.items())
    kwarg = ", ".join(f"{name!r}: {shp}" for name, shp in example.items())
    raise FreeDimsError(
        f"{'; '.join(parts)}: pass {flags} (Session: shapes={{{kwarg}}}; example sizes, give those you will "
        f"feed): {why} need fixed shapes", inputs=free, suggestion=example)
