"""Fixtures shared by the whole suite.

Async tests run on anyio's pytest plugin (``@pytest.mark.anyio``), once per event loop that
hetsched supports: the runtime's loop-specific code (``hetsched._runtime._loops``) has one
module per loop and every async test exercises both. Tests about asyncio alone (the asyncio
loop module itself) use pytest-asyncio's ``@pytest.mark.asyncio`` instead.
"""

from __future__ import annotations

import functools
from typing import Any

import onnx.helper
import pytest

# Models the tests build carry the lowest IR version their opsets need (onnx.helper.make_model
# otherwise stamps onnx's newest, 14 with onnx 1.23, which onnxruntime 1.23, the newest for
# Python 3.10, refuses: "max supported IR version: 11"). A test that sets ir_version keeps its own.
_make_model = onnx.helper.make_model


@functools.wraps(_make_model)
def _portable_make_model(graph: onnx.GraphProto, **kwargs: Any) -> onnx.ModelProto:
    model = _make_model(graph, **kwargs)
    if "ir_version" not in kwargs:
        model.ir_version = max(4, onnx.helper.find_min_ir_version_for(list(model.opset_import), True))
    return model


onnx.helper.make_model = _portable_make_model


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
