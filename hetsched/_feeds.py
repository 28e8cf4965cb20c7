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

from ._errors import InputError
from ._planning.graph import GraphIndex

__all__ = ["FeedChecker", "np_dtype", "random_feeds"]

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
