"""``Session(rate_hz=)``: a session's offered requests per second reach joint placement.

On the rk3588 twin (its default devices: no Mali), a HIGH detector with an SLO keeps 95% of the NPU
busy. The PP-OCR direction classifier (NORMAL, no SLO) alone goes to the NPU; beside the detector and
without a known rate it is placed for latency on a CPU cluster, while with its offered rate (90
requests/s: 3 crops of 30 fps, which fits beside the detector) it keeps the NPU, as
``build_plan(rate_hz=)`` decides it. (The classifier runs some 11x faster on the twin's NPU than on a
CPU cluster since the fused, fp16 memory model: a detector taking half of the NPU no longer pushes it
off; the closed-loop pricing ``1 / (1 - share)`` does above a share of about 0.91.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from hetsched import Priority, Runtime, Session
from hetsched.backends.sim import twin_devices
from hetsched.policies import Reservation

pytestmark = pytest.mark.anyio


def _classifier() -> onnx.ModelProto:
    """PP-OCR's direction classifier from the installed rapidocr wheel (a test dependency), input [1,3,48,192]."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    assert spec is not None and spec.submodule_search_locations, "pip install rapidocr-onnxruntime (test extra)"
    path = Path(next(iter(spec.submodule_search_locations))) / "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    del inp.type.tensor_type.shape.dim[:]
    for v in (1, 3, 48, 192):
        inp.type.tensor_type.shape.dim.add().dim_value = v
    return model


def _devices() -> list[Any]:
    return [d for d in twin_devices("rk3588") if d.kind != "gpu"]


async def test_an_offered_rate_that_fits_keeps_the_classifier_on_the_npu(
        anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _classifier()
    x = np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)
    async with Runtime(devices=_devices(), replacement=None) as rt:
        async with Session(model, runtime=rt, name="alone") as alone:
            assert {s.device for s in alone.plan.stages} == {"npu"}
        # the detector's load as the runtime reports it once measured: 95% of the NPU, HIGH, 33 ms SLO
        detector = Reservation("detector", {"npu": 0.95}, priority=Priority.HIGH, slo_s=0.033)
        monkeypatch.setattr(rt, "reservations", lambda except_session=None: (detector,))
        async with Session(model, runtime=rt, name="known", rate_hz=90.0) as known, \
                Session(model, runtime=rt, name="unknown") as unknown:
            assert known.plan.problem.rate_hz == 90.0
            assert {s.device for s in known.plan.stages} == {"npu"}
            # without a rate: the old behaviour, placed for latency away from the detector
            assert unknown.plan.problem.rate_hz is None
            assert "npu" not in {s.device for s in unknown.plan.stages}
            out = await known.run({model.graph.input[0].name: x})
            assert next(iter(out.values())).shape == (1, 2)
        # a rate that does not fit beside the detector is placed as without one
        async with Session(model, runtime=rt, name="flood", rate_hz=1000.0) as flood:
            assert "npu" not in {s.device for s in flood.plan.stages}


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "90"])
def test_a_bad_rate_hz_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="rate_hz"):
        Session(_classifier(), devices=_devices(), rate_hz=bad)  # type: ignore[arg-type]
