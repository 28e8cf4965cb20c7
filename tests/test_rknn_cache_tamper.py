"""The issue-23 symptom end to end, with the real rknn-toolkit2 simulator (skipped without a toolkit
environment): a cached stage ``.onnx`` whose weights were negated in place (same size) used to be
converted and run as a cache hit, wrong for every later session; now it is replaced by the true
stage with a warning, and the results match onnxruntime."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hetsched import BackendUnavailableError
from hetsched._devices.resolve import resolve_devices
from hetsched.backends.rknn import RknnBackend

from _rknn_models import conv_net

try:
    from hetsched._rknn.env import find_toolkit_python

    find_toolkit_python()
except BackendUnavailableError as _exc:
    pytest.skip(f"no rknn-toolkit2 environment: {_exc}", allow_module_level=True)


def _negate_weights_in_place(path: Path) -> None:
    m = onnx.load(str(path))
    size = path.stat().st_size
    for t in m.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and t.raw_data:
            a = -np.frombuffer(t.raw_data, np.float32)
            t.raw_data = a.tobytes()
    data = m.SerializeToString()
    assert len(data) == size
    path.write_bytes(data)


def test_a_tampered_cached_stage_is_converted_from_the_true_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from hetsched.testing import build_board_tree

    root = build_board_tree(tmp_path / "board", "rk3588")
    (dev,) = resolve_devices(["npu:1"], root=root)
    dev = dataclasses.replace(dev, options={**dev.options, "cache_dir": str(tmp_path / "cache")})
    model = conv_net(seed=5)
    x = np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    backend = RknnBackend()
    backend.compile(model, dev, name="s").close()
    (cached,) = (tmp_path / "cache").rglob("*.onnx")
    _negate_weights_in_place(cached)
    with caplog.at_level(logging.WARNING, logger="hetsched.cache"):
        stage = backend.compile(model, dev, name="s")
    try:
        (out,) = stage.run({"x": x})
    finally:
        stage.close()
    assert float(np.max(np.abs(out - want))) < 0.02  # the true stage, not the negated one
    assert any("sha256" in r.getMessage() for r in caplog.records)
