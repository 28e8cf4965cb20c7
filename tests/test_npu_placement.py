"""Placement uses the NPU well (issue 11): CNNs land on the RK3588 NPU as a few large stages.

Plans only for the model matrix (no toolkit needed: the RKNN backend's capabilities are its
first guess from the op list); one session and one launch-cost measurement go through the real
rknn-toolkit2 simulator and are skipped only when its environment is missing.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import BackendUnavailableError, Session
from hetsched._devices.resolve import resolve_devices
from hetsched._planning.costs import LAUNCH_S, STAGE_OVERHEAD_S, launch_seconds
from hetsched._planning.graph import GraphIndex
from hetsched._planning.plan import Plan, build_plan
from hetsched.backends import Device
from hetsched.backends.sim import twin_devices
from hetsched.testing import build_board_tree, with_seeded_weights

CNNS = ("light_resnet50", "light_squeezenet", "light_inception_v1", "light_shufflenet", "light_densenet121")

# A CNN whose every op the NPU runs is one NPU stage; the bound leaves room for a CPU-only head
# or tail op (a Softmax/ArgMax the toolkit refuses) and the NPU stage after it, never more.
MAX_STAGES = 3
MIN_NPU_FLOPS = 0.8
# No CPU stage this small between two NPU stages: two hand-offs and an NPU launch cost more
# than such a stage saves.
MIN_SANDWICHED_CPU_NODES = 8


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


@pytest.fixture(scope="module")
def indexes() -> dict[str, GraphIndex]:
    return {m: GraphIndex(onnx.shape_inference.infer_shapes(with_seeded_weights(m))) for m in CNNS}


def _rknn_and_clusters(root: Path) -> list[Device]:
    """The RKNN NPU plus the board's CPU clusters as the device resolver reads them under ``root``
    (a board root: the twin's clusters ``cluster4``, ``cluster6``, ``cluster0``; plans only)."""
    return resolve_devices(["npu", "big", "little"], root=root, available_cpus=range(8))


def _twin_npu_and_clusters() -> list[Device]:
    """The twin's simulated NPU and CPU clusters (its op list, not the toolkit's)."""
    return [d for d in twin_devices("rk3588") if d.kind in ("npu", "cpu")]


def _npu_fraction(plan: Plan) -> float:
    total = sum(plan.stage_flops)
    npu = sum(f for s, f in zip(plan.stages, plan.stage_flops, strict=True) if s.device.startswith("npu"))
    return npu / total


def _assert_uses_the_npu_well(plan: Plan) -> None:
    table = plan.table()
    assert len(plan.stages) <= MAX_STAGES, table
    assert _npu_fraction(plan) >= MIN_NPU_FLOPS, table
    on_npu = [s.device.startswith("npu") for s in plan.stages]
    for i, s in enumerate(plan.stages):
        if not on_npu[i] and any(on_npu[:i]) and any(on_npu[i + 1:]):
            assert len(s.nodes) >= MIN_SANDWICHED_CPU_NODES, table


@pytest.mark.parametrize("policy", ["power-thermal", "heft"])
@pytest.mark.parametrize("max_unit_nodes", [None, 8])
@pytest.mark.parametrize("model", CNNS)
def test_cnn_lands_on_the_rknn_npu_as_a_few_large_stages(twin_root: Path, indexes: dict[str, GraphIndex],
                                                         model: str, max_unit_nodes: int | None, policy: str) -> None:
    plan = build_plan(indexes[model], _rknn_and_clusters(twin_root), policy, max_unit_nodes=max_unit_nodes)
    _assert_uses_the_npu_well(plan)
    assert {plan.backend_of(s.device) for s in plan.stages if s.device == "npu"} == {"rknn"}


@pytest.mark.parametrize("policy", ["power-thermal", "heft"])
@pytest.mark.parametrize("max_unit_nodes", [None, 8])
@pytest.mark.parametrize("model", CNNS)
def test_cnn_lands_on_the_twin_npu_as_a_few_large_stages(indexes: dict[str, GraphIndex], model: str,
                                                         max_unit_nodes: int | None, policy: str) -> None:
    plan = build_plan(indexes[model], _twin_npu_and_clusters(), policy, max_unit_nodes=max_unit_nodes)
    _assert_uses_the_npu_well(plan)


def test_a_residual_sum_stays_on_the_npu(indexes: dict[str, GraphIndex]) -> None:
    plan = build_plan(indexes["light_resnet50"], _twin_npu_and_clusters(), max_unit_nodes=8)
    sums = [u.id for u in plan.units if "Sum" in u.op_types]
    assert sums and all(plan.placement.assignment[u] == "npu" for u in sums)


def test_launch_cost_is_read_from_the_device_else_its_kind() -> None:
    npu = Device(name="npu", kind="npu", backend="sim")
    assert launch_seconds(npu) == LAUNCH_S["npu"] > STAGE_OVERHEAD_S
    assert launch_seconds(dataclasses.replace(npu, options={"launch_s": 2e-3})) == 2e-3
    assert launch_seconds(dataclasses.replace(npu, options={"launch_s": "fast"})) == LAUNCH_S["npu"]
    assert all(launch_seconds(d) == LAUNCH_S[d.kind] for d in twin_devices("rk3588"))


def test_a_hand_off_into_the_npu_pays_its_launch_and_a_cache_sync(twin_root: Path,
                                                                  indexes: dict[str, GraphIndex]) -> None:
    devices = _rknn_and_clusters(twin_root)
    plan = build_plan(indexes["light_squeezenet"], devices)
    into_npu = plan.problem.links[("cluster0", "npu")]
    into_cpu = plan.problem.links[("npu", "cluster0")]
    cpu_cpu = plan.problem.links[("cluster0", "cluster4")]
    assert into_npu.latency_s - cpu_cpu.latency_s == pytest.approx(LAUNCH_S["npu"] - LAUNCH_S["cpu"])
    assert into_cpu.latency_s == cpu_cpu.latency_s
    assert into_npu.seconds_per_byte > 0 and into_cpu.seconds_per_byte > 0  # same DRAM, still synced
    assert cpu_cpu.seconds_per_byte == 0.0


# -- through the real toolkit (its simulator) ------------------------------------------------------


def _toolkit() -> None:
    try:
        from hetsched._rknn.env import find_toolkit_python

        find_toolkit_python()
    except BackendUnavailableError as exc:
        pytest.skip(f"no rknn-toolkit2 environment: {exc}")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_squeezenet_session_on_npu_and_clusters_matches_onnxruntime(
        twin_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str) -> None:
    _toolkit()
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path))
    from hetsched._cli._common import select_devices

    model = with_seeded_weights("light_squeezenet")
    devices = select_devices(["npu", "cluster0", "cluster4", "cluster6"], str(twin_root))
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    async with Session(model, devices=devices, root=twin_root) as s:
        plan = s.plan
        _assert_uses_the_npu_well(plan)
        assert any(plan.backend_of(st.device) == "rknn" for st in plan.stages)
        for _ in range(2):
            x = rng.standard_normal(shape).astype(np.float32)
            (out,) = (await s.run({inp.name: x})).values()
            (want,) = ref.run(None, {inp.name: x})
            assert _cosine(np.asarray(out), want) >= 0.999


@pytest.mark.timeout(600)
def test_the_npu_launch_prior_matches_the_simulators_per_call_overhead(twin_root: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """How ``LAUNCH_S["npu"]`` was measured: one Relu through the toolkit worker vs onnxruntime.
    Loose bounds (a shared CI host's timing varies): within a factor of 20 of the prior."""
    _toolkit()
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path))
    from hetsched.backends import get_backend

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "one", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    (dev,) = resolve_devices(["npu:0"], root=twin_root)
    stage = get_backend("rknn").compile(m, dev, name="one")
    feeds = {"x": np.random.default_rng(0).random((1, 8, 8, 8), dtype=np.float32)}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

    def per_call(f: object, n: int = 100) -> float:
        for _ in range(5):
            f()  # type: ignore[operator]
        t = time.perf_counter()
        for _ in range(n):
            f()  # type: ignore[operator]
        return (time.perf_counter() - t) / n

    try:
        overhead = per_call(lambda: stage.run(feeds)) - per_call(lambda: sess.run(None, feeds))
    finally:
        stage.close()
    assert LAUNCH_S["npu"] / 20 <= overhead <= LAUNCH_S["npu"] * 20
