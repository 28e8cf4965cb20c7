"""The energy term of the built-in policies, energy in the planning problem, device states in the plan,
and errors raised inside a policy."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched import PlacementError
from hetsched._devices.resolve import resolve_devices
from hetsched._planning.costs import modelled_energy_j
from hetsched._planning.graph import GraphIndex
from hetsched._planning.plan import build_plan
from hetsched._planning.states import device_states
from hetsched._snapshot import DomainState, Snapshot, ZoneState
from hetsched.backends import Device
from hetsched.backends.sim import twin_devices
from hetsched.policies import (
    HEFT,
    W_ENERGY_S_PER_J,
    DeviceState,
    Placement,
    PlacementProblem,
    PowerThermalWeighted,
    Unit,
)
from hetsched.testing import build_board_tree

POLICIES = {"power-thermal": PowerThermalWeighted, "heft": HEFT}


def _one_unit(latency: dict[str, float], energy: dict[str, float]) -> PlacementProblem:
    devs = tuple(latency)
    return PlacementProblem(
        units=(Unit(0, ("conv",), ("Conv",), devs),),
        devices={d: DeviceState(d, kind=d) for d in devs},
        cost={(0, d): s for d, s in latency.items()},
        energy={(0, d): j for d, j in energy.items()},
    )


# -- the term in the policies ---------------------------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_energy_breaks_a_tie_between_equally_fast_devices(name: str) -> None:
    # The GPU is listed first, so without the term the tie goes to it.
    problem = _one_unit({"gpu": 2e-3, "npu": 2e-3}, {"gpu": 4e-3, "npu": 1e-3})
    assert POLICIES[name](w_energy=0.0).place(problem).assignment == {0: "gpu"}
    placement = POLICIES[name]().place(problem)
    assert placement.assignment == {0: "npu"}
    terms = placement.scores[0]
    assert terms["gpu"]["energy_j"] == 4e-3 and terms["npu"]["energy_j"] == 1e-3
    assert terms["gpu"]["energy_s"] == pytest.approx(W_ENERGY_S_PER_J * 3e-3)
    assert terms["npu"]["energy_s"] == 0.0


@pytest.mark.parametrize("name", POLICIES)
def test_a_device_1_5x_faster_still_wins_by_default_but_a_user_can_trade_time_for_energy(name: str) -> None:
    # GPU at 6 W for 1 ms, NPU at 1 W for 1.5 ms: the GPU spends 4x the energy.
    problem = _one_unit({"gpu": 1e-3, "npu": 1.5e-3}, {"gpu": 6e-3, "npu": 1.5e-3})
    assert POLICIES[name]().place(problem).assignment == {0: "gpu"}
    # 1 s/J: the 4.5 mJ saved are worth 4.5 ms, more than the 0.5 ms the NPU loses.
    assert POLICIES[name](w_energy=1.0).place(problem).assignment == {0: "npu"}


@pytest.mark.parametrize("name", POLICIES)
def test_unknown_energy_gets_no_term(name: str) -> None:
    # cpu's energy is unknown: it is measured from the cheapest known device, so neither
    # looks free; the known pair is still ordered by energy.
    problem = _one_unit({"cpu": 2e-3, "gpu": 2e-3, "npu": 2e-3}, {"gpu": 4e-3, "npu": 1e-3})
    placement = POLICIES[name]().place(problem)
    assert placement.assignment[0] == "cpu"  # listed first; no term makes npu cheaper than it
    assert "energy_j" not in placement.scores[0]["cpu"] and placement.scores[0]["cpu"]["energy_s"] == 0.0
    assert placement.scores[0]["gpu"]["energy_s"] > 0.0


def test_the_energy_weight_is_checked() -> None:
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(PlacementError, match="w_energy"):
            PowerThermalWeighted(w_energy=bad)
        with pytest.raises(PlacementError, match="w_energy"):
            HEFT(w_energy=bad)


# -- energy and states in build_plan --------------------------------------------------------------


def _conv_index(channels: int = 64, size: int = 56) -> GraphIndex:
    """One compute-bound 3x3 convolution."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return GraphIndex(onnx.shape_inference.infer_shapes(model))


def test_build_plan_fills_modelled_energy_for_twin_devices_only() -> None:
    index = _conv_index()
    twins = [d for d in twin_devices("rk3588") if d.name in ("gpu", "npu", "cluster4")]
    host = resolve_devices(["cpu:0"])
    plan = build_plan(index, [*twins, *host])
    unit = plan.units[0]
    assert unit.flops > 0
    for d in twins:
        expected = modelled_energy_j(d, unit.flops)
        assert expected is not None and expected > 0
        assert plan.problem.energy[(unit.id, d.name)] == pytest.approx(expected)
    assert (unit.id, host[0].name) not in plan.problem.energy  # a real CPU: no model, no term
    # The model's formula: full power at the top OPP times the compute time there.
    npu = next(d for d in twins if d.name == "npu")
    dom = npu.options["profile_domain"]
    assert plan.problem.energy[(unit.id, "npu")] == pytest.approx(
        dom.full_power_w(dom.max_hz) * unit.flops / (dom.ops_per_cycle * dom.max_hz))


def test_the_rknn_npu_on_a_twin_root_has_modelled_energy(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    npu = resolve_devices(["npu"], root=root)[0]
    assert npu.backend == "rknn"
    joules = modelled_energy_j(npu, 1e9)
    assert joules is not None and joules > 0
    assert modelled_energy_j(Device("npu", kind="npu", backend="rknn"), 1e9) is None


def _hot_gpu_snapshot() -> Snapshot:
    """The GPU busy and above the SoC's passive trip; the big cluster cool and idle."""
    return Snapshot(
        time_s=3.0,
        domains=MappingProxyType({"gpu": DomainState("gpu", "gpu", None, utilisation=0.9),
                                  "cluster4": DomainState("cluster4", "cpu", None, utilisation=0.0)}),
        zones=MappingProxyType({"soc-thermal": ZoneState("soc-thermal", 50.0, 75.0),
                                "gpu-thermal": ZoneState("gpu-thermal", 78.0, None),
                                "bigcore0-thermal": ZoneState("bigcore0-thermal", 30.0, None)}),
    )


def test_a_hot_gpu_loses_its_units_to_a_cool_device() -> None:
    index = _conv_index()
    by_name = {d.name: d for d in twin_devices("rk3588")}
    gpu = by_name["gpu"]
    # A big cluster half as fast as the GPU: the cool plan is the GPU's.
    big = dataclasses.replace(by_name["cluster4"], peak_flops=gpu.peak_flops / 2)
    devices = [gpu, big]
    cool = build_plan(index, devices, "power-thermal")
    assert {s.device for s in cool.stages} == {"gpu"}
    states = device_states(_hot_gpu_snapshot(), devices)
    assert states["gpu"].temp_headroom == 0.0 and states["cluster4"].temp_headroom > 0.8
    hot = build_plan(index, devices, "power-thermal", device_states=states)
    assert {s.device for s in hot.stages} == {"cluster4"}
    assert hot.device_states == states


def test_plan_json_shows_the_device_states_it_was_built_with() -> None:
    index = _conv_index(8, 8)
    devices = [d for d in twin_devices("rk3588") if d.name in ("gpu", "cluster4")]
    states = device_states(_hot_gpu_snapshot(), devices)
    data = build_plan(index, devices, device_states=states).to_json()
    got = data["device_states"]
    assert set(got) == {"gpu", "cluster4"}
    for name, st in states.items():
        assert got[name]["utilisation"] == st.utilisation
        assert got[name]["temp_headroom"] == st.temp_headroom
        assert got[name]["power_headroom"] == st.power_headroom
    assert got["gpu"]["inputs"]["zone"] == "gpu-thermal" and got["gpu"]["inputs"]["temp_c"] == 78.0
    # Without states: every device's default is shown (and JSON-serialisable).
    plain = build_plan(index, devices).to_json()["device_states"]
    assert plain["gpu"] == {"utilisation": 0.0, "temp_headroom": 1.0, "power_headroom": 1.0}
    assert "energy_j" in build_plan(index, devices).to_json()["units"][0]["scores"]["gpu"]


# -- a policy that raises -------------------------------------------------------------------------


class _Broken:
    name = "broken-policy"

    def place(self, problem: PlacementProblem) -> Placement:
        lookup: dict[int, Placement] = {}
        return lookup[problem.units[0].id]  # a bug of the policy's own: KeyError


def test_an_error_inside_a_policy_is_a_placement_error_naming_it() -> None:
    index = _conv_index(8, 8)
    devices = resolve_devices(["cpu:0"])
    with pytest.raises(PlacementError, match="'broken-policy' raised KeyError") as info:
        build_plan(index, devices, _Broken())
    assert isinstance(info.value.__cause__, KeyError)

    def plain_function(problem: PlacementProblem) -> Placement:
        raise ZeroDivisionError("division by zero")

    with pytest.raises(PlacementError, match="'plain_function' raised ZeroDivisionError") as info2:
        build_plan(index, devices, plain_function)  # type: ignore[arg-type]  # a bare function: build_plan wraps it at run time
    assert isinstance(info2.value.__cause__, ZeroDivisionError)


def test_a_placement_error_of_the_policy_passes_through() -> None:
    own = PlacementError("my policy refuses this graph")

    def refusing(problem: PlacementProblem) -> Placement:
        raise own

    with pytest.raises(PlacementError) as info:
        build_plan(_conv_index(8, 8), resolve_devices(["cpu:0"]), refusing)  # type: ignore[arg-type]  # a bare function, as above
    assert info.value is own
