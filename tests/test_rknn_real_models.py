"""Real models on the RK3588 NPU (issue 11): the three ONNX models of PaddleOCR's PP-OCR pipeline
as the ``rapidocr-onnxruntime`` wheel ships them (a MobileNetV3 text-direction classifier, the
PP-OCRv4 DB text detector and its recogniser), exported by paddle2onnx with free dimensions.

Plans need only the wheel (the RKNN backend's capabilities are its first guess from the op
list); sessions go through the real rknn-toolkit2 simulator and are skipped when its
environment is missing. The package is located, never imported (it pulls in OpenCV).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hetsched import BackendUnavailableError, Device, Session, resolve_devices
from hetsched._planning.costs import analytic_node_costs
from hetsched._planning.graph import GraphIndex
from hetsched._planning.model import load_model
from hetsched._planning.plan import Plan, build_plan
from hetsched._rknn.prepare import fix_free_dims
from hetsched.backends.rknn import RknnStage
from hetsched.testing import build_board_tree

_SPEC = importlib.util.find_spec("rapidocr_onnxruntime")
if _SPEC is None or _SPEC.origin is None:
    pytest.skip("rapidocr-onnxruntime (the test extra) is not installed", allow_module_level=True)
MODELS = Path(_SPEC.origin).parent / "models"

CLS = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
DET = "ch_PP-OCRv4_det_infer.onnx"
REC = "ch_PP-OCRv4_rec_infer.onnx"
# Every model takes one input ``x`` with free dimensions; these are the shapes RapidOCR feeds
# (its config: classifier 48x192, recogniser height 48; the detector at a 640 side).
SHAPES: dict[str, tuple[int, ...]] = {CLS: (1, 3, 48, 192), DET: (1, 3, 640, 640), REC: (1, 3, 48, 320)}

MAX_STAGES = 3
MIN_NPU_FLOPS = 0.8
MIN_COSINE = 0.999  # fp16 on the NPU against fp32 onnxruntime
# The detector's probability map is near zero almost everywhere, so its cosine weighs the fp16
# error of a few pixels: the simulator gives 0.9985-0.9998 on seeded inputs at 640x640. What
# RapidOCR uses is the map binarised at DB's threshold, which must agree pixel for pixel.
DET_MIN_COSINE = 0.998
DB_THRESHOLD = 0.3
MIN_MASK_AGREEMENT = 0.995


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


@pytest.fixture
def toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skips without a toolkit environment; a fresh compile cache (every test converts)."""
    try:
        from hetsched._rknn.env import find_toolkit_python

        find_toolkit_python()
    except BackendUnavailableError as exc:
        pytest.skip(f"no rknn-toolkit2 environment: {exc}")
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "rknn-cache"))


def _fixed_index(name: str) -> GraphIndex:
    """The model with its free dimensions fixed to :data:`SHAPES`, shapes re-inferred: what the
    FLOPs of a request really are (a free dimension counts as 1 in the model's own index)."""
    return GraphIndex(load_model(fix_free_dims(onnx.load(MODELS / name), {"x": SHAPES[name]}), check=False))


def _npu_flops_fraction(plan: Plan, name: str) -> float:
    """The share of a request's analytic FLOPs (at :data:`SHAPES`) in the plan's NPU stages."""
    fixed = _fixed_index(name)
    # the plan's node indices address the model's own index: the fixed one keeps its node order
    assert [n.op_type for n in fixed.nodes] == [n.op_type for n in GraphIndex(load_model(MODELS / name)).nodes]
    costs = analytic_node_costs(fixed)
    on_npu = {n for s in plan.stages if s.device.startswith("npu") for n in s.nodes}
    return sum(costs[n].flops for n in on_npu) / sum(c.flops for c in costs)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _devices(root: Path) -> list[Device]:
    """The NPU (one toolkit context: the test is about placement and numerics, not per-core
    workers) and one CPU core the host has."""
    (npu,) = resolve_devices(["npu"], root=root)
    npu = dataclasses.replace(npu, options={**npu.options, "workers": 1})
    return [npu, *resolve_devices(["cpu:0"], root=root, available_cpus=[0])]


# -- plans (the op list's first guess) ---------------------------------------------------------------


@pytest.mark.parametrize("policy", ["power-thermal", "heft"])
@pytest.mark.parametrize("name", [CLS, DET, REC])
def test_the_op_list_puts_every_pp_ocr_model_on_the_npu(twin_root: Path, name: str, policy: str) -> None:
    """Div (PaddlePaddle's HardSwish is x*Clip(x+3)/6), Constant, Shape, Cast, ReduceMean, Pow,
    Sqrt: all converted by the toolkit; a missing one cut the MobileNet body into CPU stages."""
    devices = resolve_devices(["npu", "big", "little"], root=twin_root, available_cpus=range(8))
    plan = build_plan(GraphIndex(load_model(MODELS / name)), devices, policy)
    assert len(plan.stages) <= MAX_STAGES, plan.table()
    assert _npu_flops_fraction(plan, name) >= MIN_NPU_FLOPS, plan.table()


def test_small_units_of_the_classifier_stay_on_the_npu_when_shapes_are_fixed(twin_root: Path) -> None:
    devices = resolve_devices(["npu", "big", "little"], root=twin_root, available_cpus=range(8))
    plan = build_plan(_fixed_index(CLS), devices, "power-thermal", max_unit_nodes=8)
    assert len(plan.stages) <= MAX_STAGES, plan.table()
    assert _npu_flops_fraction(plan, CLS) >= MIN_NPU_FLOPS, plan.table()


def test_small_units_of_the_classifier_stay_on_the_npu_with_the_sessions_shapes(twin_root: Path) -> None:
    # A session given shapes= plans on the model with those shapes fixed (load_index), so the
    # FLOPs are those it will run: with a free dimension counted as 1 they were ~90x low, each
    # small unit cost less than the NPU's launch, and the body went to a CPU cluster.
    from hetsched._session._setup import load_index

    devices = resolve_devices(["npu", "big", "little"], root=twin_root, available_cpus=range(8))
    index, _ = load_index(MODELS / CLS, {"x": SHAPES[CLS]})
    plan = build_plan(index, devices, "power-thermal", max_unit_nodes=8)
    assert _npu_flops_fraction(plan, CLS) >= MIN_NPU_FLOPS, plan.table()


# -- sessions through the toolkit's simulator ---------------------------------------------------------


async def _run_against_onnxruntime(root: Path, name: str, seeds: range) -> tuple[Plan, list[tuple[np.ndarray,
                                                                                               np.ndarray]]]:
    ref = ort.InferenceSession(str(MODELS / name), providers=["CPUExecutionProvider"])
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    async with Session(MODELS / name, devices=_devices(root), root=root, shapes={"x": SHAPES[name]}) as s:
        plan = s.plan
        assert any(plan.backend_of(st.device) == "rknn" for st in plan.stages), plan.table()
        for seed in seeds:
            # what RapidOCR feeds: an image normalised to [-1, 1]
            x = np.random.default_rng(seed).uniform(-1.0, 1.0, SHAPES[name]).astype(np.float32)
            (got,) = (await s.run({"x": x})).values()
            (want,) = ref.run(None, {"x": x})
            pairs.append((np.asarray(got), want))
        rknn = [getattr(st.compiled, "rknn", st.compiled) for st in s._stages]
        assert any(isinstance(r, RknnStage) and r.statistics().runs >= len(seeds) for r in rknn)
    return plan, pairs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_mobilenetv3_classifier_runs_on_the_npu_and_matches_onnxruntime(
        twin_root: Path, toolkit: None, anyio_backend: str) -> None:
    plan, pairs = await _run_against_onnxruntime(twin_root, CLS, range(3))
    assert len(plan.stages) <= MAX_STAGES, plan.table()
    assert _npu_flops_fraction(plan, CLS) >= MIN_NPU_FLOPS, plan.table()
    for got, want in pairs:
        assert got.shape == want.shape == (1, 2)
        assert _cosine(got, want) >= MIN_COSINE
        assert int(got.argmax()) == int(want.argmax())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_pp_ocrv4_detector_runs_on_the_npu_and_matches_onnxruntime(
        twin_root: Path, toolkit: None, anyio_backend: str) -> None:
    plan, pairs = await _run_against_onnxruntime(twin_root, DET, range(2))
    assert len(plan.stages) <= MAX_STAGES, plan.table()
    assert _npu_flops_fraction(plan, DET) >= MIN_NPU_FLOPS, plan.table()
    for got, want in pairs:
        assert got.shape == want.shape == (1, 1, *SHAPES[DET][2:])  # the text probability map
        assert _cosine(got, want) >= DET_MIN_COSINE
        assert float(((got > DB_THRESHOLD) == (want > DB_THRESHOLD)).mean()) >= MIN_MASK_AGREEMENT


@pytest.mark.timeout(600)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_pp_ocrv4_recogniser_falls_back_where_refused_and_matches_onnxruntime(
        twin_root: Path, toolkit: None, anyio_backend: str) -> None:
    plan, pairs = await _run_against_onnxruntime(twin_root, REC, range(2))
    refused = plan.to_json()["refused"]
    refused_units = {r["unit"] for r in refused}
    units = {u["id"]: u for u in plan.to_json()["units"]}
    assert all(r["device"] == "npu" and r["reason"] for r in refused), refused
    for st in plan.stages:
        if not st.device.startswith("npu"):
            # a unit off the NPU is either refused by the toolkit or outside the op list
            for u in st.units:
                assert u in refused_units or "npu" not in units[u]["candidates"], plan.table()
    for got, want in pairs:
        assert got.shape == want.shape == (1, SHAPES[REC][3] // 8, 6625)  # CTC steps x characters
        assert _cosine(got, want) >= MIN_COSINE
