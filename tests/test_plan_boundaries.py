"""Few, big stages (a stage pays for its boundary), estimates the twin agrees with, and why a unit
is not on the NPU (issue 24)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import Session, load_model
from hetsched._devices.resolve import resolve_devices
from hetsched._planning.costs import BOUNDARY, BoundaryCosts, roofline
from hetsched._planning.graph import GraphIndex
from hetsched._planning.plan import OffloadReason, build_plan, unit_key
from hetsched.backends.sim import twin_devices
from hetsched.testing import build_board_tree, with_seeded_weights

pytestmark = pytest.mark.anyio

F = TensorProto.FLOAT


def _hardswish_net(blocks: int = 12, ch: int = 16, hw: int = 64) -> onnx.ModelProto:
    """A MobileNet/YOLO-style body as PaddlePaddle and Ultralytics export it: Conv, then HardSwish
    spelled ``x * Clip(x + 3, 0, 6) / 6``, then a Softmax head."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("three", F, [], [3.0]), helper.make_tensor("six", F, [], [6.0]),
             helper.make_tensor("zero", F, [], [0.0])]
    nodes = []
    prev, cin = "x", 3
    for i in range(blocks):
        w = (rng.standard_normal((ch, cin, 3, 3)) * (1.0 / np.sqrt(cin * 9))).astype(np.float32)
        inits.append(helper.make_tensor(f"w{i}", F, w.shape, w.ravel().tolist()))
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
            helper.make_node("Add", [f"c{i}", "three"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Clip", [f"a{i}", "zero", "six"], [f"k{i}"], name=f"clip{i}"),
            helper.make_node("Mul", [f"c{i}", f"k{i}"], [f"m{i}"], name=f"mul{i}"),
            helper.make_node("Div", [f"m{i}", "six"], [f"h{i}"], name=f"div{i}"),
        ]
        prev, cin = f"h{i}", ch
    nodes.append(helper.make_node("Softmax", [prev], ["y"], axis=1, name="head"))
    graph = helper.make_graph(nodes, "hswish", [helper.make_tensor_value_info("x", F, [1, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", F, [1, ch, hw, hw])], initializer=inits)
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _mish_net(blocks: int = 12, ch: int = 32, hw: int = 128) -> onnx.ModelProto:
    """A depthwise detector body with Mish as Darknet/Scaled-YOLOv4 exports it, ``x * Tanh(Softplus(x))``
    (a ``Softplus`` a DLA core cannot run: TensorRT's DLA activations are ReLU, Sigmoid, TanH, clipped
    and leaky ReLU), after a Conv stem, then a Softmax head. The depthwise convolutions are light
    enough that a DLA core (fp16 storage) beats the GPU on them unit by unit."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((ch, 3, 3, 3)) / np.sqrt(27.0)).astype(np.float32)
    inits = [helper.make_tensor("wstem", F, w.shape, w.ravel().tolist())]
    nodes = [helper.make_node("Conv", ["x", "wstem"], ["h"], pads=[1, 1, 1, 1], name="stem")]
    prev = "h"
    for i in range(blocks):
        w = (rng.standard_normal((ch, 1, 3, 3)) / 3.0).astype(np.float32)
        inits.append(helper.make_tensor(f"w{i}", F, w.shape, w.ravel().tolist()))
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], group=ch, name=f"dw{i}"),
            helper.make_node("Softplus", [f"c{i}"], [f"s{i}"], name=f"softplus{i}"),
            helper.make_node("Tanh", [f"s{i}"], [f"t{i}"], name=f"tanh{i}"),
            helper.make_node("Mul", [f"c{i}", f"t{i}"], [f"h{i}"], name=f"mish{i}"),
        ]
        prev = f"h{i}"
    nodes.append(helper.make_node("Softmax", [prev], ["y"], axis=1, name="head"))
    graph = helper.make_graph(nodes, "mish", [helper.make_tensor_value_info("x", F, [1, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", F, [1, ch, hw, hw])], initializer=inits)
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _dag(n: int, seed: int = 0) -> onnx.ModelProto:
    """benchmarks/plan_scaling.py's branching DAG (MatMul, unary and binary ops on [64, 64])."""
    rng = random.Random(seed)
    w = helper.make_tensor("W", F, [64, 64], b"\x00" * (4 * 64 * 64), raw=True)
    nodes, values, consumed = [], ["x"], set()
    for i in range(n):
        out, r = f"v{i}", rng.random()
        if r < 0.2:
            a = rng.choice(values[-8:])
            nodes.append(helper.make_node("MatMul", [a, "W"], [out]))
            consumed.add(a)
        elif r < 0.55:
            a = rng.choice(values[-8:])
            nodes.append(helper.make_node(rng.choice(("Relu", "Sigmoid", "Neg", "Tanh")), [a], [out]))
            consumed.add(a)
        else:
            a, b = rng.choice(values[-16:]), rng.choice(values[-4:])
            nodes.append(helper.make_node(rng.choice(("Add", "Mul", "Max")), [a, b], [out]))
            consumed.update((a, b))
        values.append(out)
    sinks = [v for v in values[1:] if v not in consumed]
    graph = helper.make_graph(nodes, "dag", [helper.make_tensor_value_info("x", F, [64, 64])],
                              [helper.make_tensor_value_info(o, F, [64, 64]) for o in sinks], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return load_model(model)


@pytest.mark.parametrize("policy", ["power-thermal", "heft"])
def test_a_detector_body_is_one_accelerator_stage_on_the_orin_twin(policy: str) -> None:
    index = GraphIndex(_mish_net())
    devices = twin_devices("orin-nx")
    # Without the fold (the policy's own consolidation only) the body ping-pongs between a DLA core
    # and a CPU cluster around each Softplus: the fragmentation issue 24 reports.
    old = build_plan(index, devices, policy, boundary=BoundaryCosts(fold_sweeps=0))
    assert len(old.stages) > 4
    plan = build_plan(index, devices, policy)
    assert len(plan.stages) <= 4
    for st in plan.stages:
        kind = next(d.kind for d in devices if d.name == st.device)
        assert not (kind == "dla" and len(st.nodes) < 4), f"a {len(st.nodes)}-node stage on {st.device}"
    assert sum(len(s.nodes) for s in plan.stages) == len(index.nodes)


def test_the_rk3588_twin_runs_the_body_on_its_npu_in_few_stages() -> None:
    index = GraphIndex(_hardswish_net())
    devices = [d for d in twin_devices("rk3588") if d.kind != "gpu"]  # the board's defaults: no Mali backend
    plan = build_plan(index, devices)
    assert len(plan.stages) <= 3
    npu = [s for s in plan.stages if s.device == "npu"]
    assert npu and sum(plan.stage_flops[s.id] for s in npu) >= 0.9 * sum(plan.stage_flops)


def test_a_thousand_node_dag_on_three_cpu_devices_plans_into_few_stages() -> None:
    devices = resolve_devices(["cpu:0", "cpu:1", "cpu:0-1"], available_cpus=[0, 1])
    index = GraphIndex(_dag(1000))
    old = build_plan(index, devices, "heft", max_unit_nodes=1, boundary=BoundaryCosts(fold_sweeps=0))
    assert len(old.stages) > 50  # 116-135 stages before issue 24
    for policy in ("power-thermal", "heft"):
        plan = build_plan(index, devices, policy, max_unit_nodes=1)
        assert len(plan.stages) <= 3, (policy, len(plan.stages))


def test_a_stage_that_pays_for_its_boundary_stays() -> None:
    # Free boundaries: nothing is worth folding, so the policy's placement stands (the fold moves
    # a group only when the boundary costs more than the compute it saves).
    index = GraphIndex(_hardswish_net(blocks=4))
    devices = [dataclasses.replace(d, options={**d.options, "launch_s": 0.0}) for d in twin_devices("orin-nx")]
    free = BoundaryCosts(launch_s={"cpu": 0.0, "gpu": 0.0, "npu": 0.0, "dla": 0.0}, dispatch_latency_s=0.0,
                         unit_overhead_s=0.0)
    assert len(build_plan(index, devices, boundary=free).stages) >= len(build_plan(index, devices).stages)


def test_boundary_costs_are_validated() -> None:
    assert BOUNDARY.launch(twin_devices("orin-nx")[-1]) > 0  # a DLA core: the GPU's launch unless it has its own
    for bad in ({"dispatch_latency_s": -1.0}, {"cross_domain_bps": 0.0}, {"fold_sweeps": -1},
                {"launch_s": {"npu": float("nan")}}, {"unit_overhead_s": True}):
        with pytest.raises(ValueError, match="BoundaryCosts"):
            BoundaryCosts(**bad)


def test_plan_estimates_are_the_twins_model_at_its_clocks(tmp_path: Path) -> None:
    """The estimate of a twin device's stage is the twin's own roofline at the tree's clocks."""
    root = build_board_tree(tmp_path / "orin", "orin-nx")  # an idle board: the GPU at its lowest clock
    devices = resolve_devices(["gpu", "clusters"], root=root)
    gpu = next(d for d in devices if d.name == "gpu")
    hz = gpu.options["clock"]("gpu")
    assert hz is not None and hz < gpu.options["profile_domain"].max_hz
    index = GraphIndex(_hardswish_net())
    plan = build_plan(index, devices)
    costs = plan.stage_costs()
    for st in plan.stages:
        dev = next(d for d in devices if d.name == st.device)
        assert costs[st.id] == pytest.approx(roofline(dev, plan.stage_flops[st.id], plan.stage_bytes[st.id])[0])


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
async def test_estimate_vs_modelled_within_a_quarter_on_the_twin(tmp_path: Path, soc: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The twin's NPU is the RKNN backend's (a toolkit run): left out here, the twin's own devices
    # (clusters, GPU, DLA) model every stage deterministically.
    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", str(tmp_path / "no-such-python"))
    root = build_board_tree(tmp_path / soc, soc)
    model = with_seeded_weights("light_squeezenet")
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    x = np.random.default_rng(1).standard_normal([d.dim_value for d in inp.type.tensor_type.shape.dim])
    devices = resolve_devices(["clusters", "gpu"], root=root)
    async with Session(model, devices=devices) as s:
        await s.run(None, {inp.name: x.astype(np.float32)})
        costs = s.plan.stage_costs()
        stats = s.stage_statistics()
        for st in s.plan.stages:
            modelled = stats[st.name].last_modelled_s
            assert modelled > 0
            ratio = costs[st.id] / modelled
            assert 1 / 1.25 <= ratio <= 1.25, (st.name, st.device, costs[st.id], modelled)


def _offload_model() -> onnx.ModelProto:
    """Conv -> Relu (NPU) -> Round (not in RKNN's op list) -> Conv (NPU)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Round", ["r"], ["q"], name="round"),
         helper.make_node("Conv", ["q", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")],
        "offload", [helper.make_tensor_value_info("x", F, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", F, [1, 8, 32, 32])],
        initializer=[helper.make_tensor("w", F, w.shape, w.ravel().tolist()),
                     helper.make_tensor("w2", F, w2.shape, w2.ravel().tolist())])
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_unit_not_on_the_npu_says_why() -> None:
    index = GraphIndex(_offload_model())
    devices = [d for d in twin_devices("rk3588") if d.kind != "gpu"]
    plan = build_plan(index, devices)
    by_unit = {n.unit: n for n in plan.offload}
    round_unit = next(u.id for u in plan.units if "Round" in u.op_types)
    note = by_unit[round_unit]
    assert note.reason is OffloadReason.UNSUPPORTED_OP and "Round" in note.detail and note.npu == "npu"
    # every unit off the NPU has a note, none on it
    off = {u.id for u in plan.units if plan.placement.assignment[u.id] != "npu"}
    assert set(by_unit) == off
    assert "not on the NPU" in plan.table() and "unsupported-op" in plan.table()
    js = json.loads(plan.dumps())
    assert {"unit": round_unit, "npu": "npu", "device": note.device, "reason": "unsupported-op",
            "detail": note.detail} in js["offload"]
    # a unit the toolkit refused carries the toolkit's message
    conv_unit = next(u for u in plan.units if "Conv" in u.op_types and "npu" in u.candidates)
    refused = {(unit_key(index, plan.unit_nodes[conv_unit.id]), "npu"): "E RKNN: conv: unsupported pad"}
    plan2 = build_plan(index, devices, refused=refused)
    note2 = next(n for n in plan2.offload if n.unit == conv_unit.id)
    assert note2.reason is OffloadReason.REFUSED and note2.detail == "E RKNN: conv: unsupported pad"


def test_a_plan_without_an_npu_has_no_offload_notes() -> None:
    index = GraphIndex(_offload_model())
    assert build_plan(index, twin_devices("orin-nx")).offload == ()


def test_drift_waits_for_its_grace_period() -> None:
    from hetsched._session._replan import Replanning, drift_reason

    config = Replanning(drift_min_runs=2, drift_grace_s=5.0)
    est, got = {"stage0": 1e-3}, {"stage0": (4e-3, 10)}
    assert drift_reason(config, est, got, elapsed_s=1.0) is None
    assert "drift" in (drift_reason(config, est, got, elapsed_s=6.0) or "")
    assert "drift" in (drift_reason(config, est, got) or "")  # no clock given: the old contract
    with pytest.raises(ValueError, match="drift_grace_s"):
        Replanning(drift_grace_s=-1.0)


async def test_an_unchanged_twin_board_never_replans_on_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's estimate is the twin's model at the tree's clocks, so the measured (modelled)
    stage times agree with it: no drift re-plan even with no grace period and few runs (the
    RK3588's Mali at its idle clock was ~4x off its estimate before issue 24)."""
    from hetsched import Replanning

    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", str(tmp_path / "no-such-python"))
    root = build_board_tree(tmp_path / "rk3588", "rk3588")
    model = with_seeded_weights("light_squeezenet")
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    x = np.random.default_rng(1).standard_normal([d.dim_value for d in inp.type.tensor_type.shape.dim])
    devices = resolve_devices(["gpu", "clusters"], root=root)
    replanning = Replanning(period_s=0.02, drift_min_runs=4, drift_grace_s=0.0, min_interval_s=0.0)
    async with Session(model, devices=devices, root=root, adaptation=hetsched.Adaptation(replanning=replanning)) as s:
        assert any(st.device == "gpu" for st in s.plan.stages)
        for _ in range(40):  # costs are learned in batches of 16 runs
            await s.run(None, {inp.name: x.astype(np.float32)})
        import anyio

        await anyio.sleep(0.3)  # a few monitor periods after the runs
        stats = s.statistics().replanning
    assert "drift" not in stats.reasons, stats


def test_a_unit_faster_on_the_npu_alone_but_too_small_for_a_stage_says_so() -> None:
    # the lone Conv after the CPU's Round: 0.003 ms on the NPU against 0.065 ms on a cluster, but a
    # stage of it there costs the NPU's launch and two hand-offs; "slower" would be untrue
    index = GraphIndex(_offload_model())
    plan = build_plan(index, [d for d in twin_devices("rk3588") if d.kind != "gpu"])
    for note in plan.offload:
        if note.reason is OffloadReason.UNSUPPORTED_OP:
            continue
        here, there = plan.problem.cost[(note.unit, note.device)], plan.problem.cost[(note.unit, "npu")]
        if there <= here:
            assert note.reason is OffloadReason.TOO_SMALL and "boundary" in note.detail, note
        else:
            assert note.reason is OffloadReason.SLOWER, note
    assert any(n.reason is OffloadReason.TOO_SMALL and "stage boundary there" in n.detail for n in plan.offload)
