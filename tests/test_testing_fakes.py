"""hetsched.testing's fake backend drives a Session like a real accelerator would."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched.backends import get_backend
from hetsched.testing import FakeBackend, fake_device

pytestmark = pytest.mark.anyio


def _model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sin", ["r"], ["s"], name="sin"),
        helper.make_node("Relu", ["s"], ["y"], name="relu2"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


async def test_fake_accelerator_takes_only_its_ops() -> None:
    x = np.random.default_rng(0).standard_normal([4, 4]).astype(np.float32)
    want = ort.InferenceSession(_model().SerializeToString()).run(None, {"x": x})[0]
    with FakeBackend("relu-only", ops={"Relu"}) as backend:
        devices: list[str | hetsched.Device] = ["cpu:0", fake_device("acc", backend="relu-only")]
        policy = lambda p: {u.id: ("acc" if "acc" in u.candidates else "cpu:0") for u in p.units}  # noqa: E731
        async with hetsched.Session(_model(), devices=devices, policy=policy) as s:
            got = await s.run({"x": x})
            assert [st.device for st in s.plan.stages] == ["acc", "cpu:0", "acc"]
        np.testing.assert_allclose(got["y"], want, rtol=1e-6)
        assert [c.device for c in backend.calls] == ["acc", "acc"]
        assert all(c.thread.startswith("hetsched-") for c in backend.calls)
    with pytest.raises(hetsched.BackendUnavailableError):
        get_backend("relu-only")  # unregistered on exit


async def test_fake_failure_fails_the_request_only() -> None:
    with FakeBackend("flaky", fail_stages={"stage0"}):
        async with hetsched.Session(_model(), devices=[fake_device("f", backend="flaky")]) as s:
            with pytest.raises(hetsched.StageExecutionError) as info:
                await s.run({"x": np.ones([4, 4], np.float32)})
            assert info.value.stage == "stage0" and info.value.device == "f"
            assert s.statistics().requests_failed == 1
