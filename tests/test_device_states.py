"""Device states from a board: utilisation, thermal headroom of each device's own zone, power headroom.

Twin trees (a cool idle board and one at a 72 C ambient, above the RK3588's 75 C passive trip
once it has warmed) are sampled once through telemetry; hand-built snapshots pin the rules.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from hetsched import PlacementError
from hetsched._estimators import power_estimator_for
from hetsched._planning.states import T_REF_C, board_power_w, device_states, sample_device_states
from hetsched._platform.discovery import discover
from hetsched._platform.telemetry import Telemetry
from hetsched._snapshot import DomainState, RailState, Snapshot, ZoneState
from hetsched._twin.live import LiveTwin
from hetsched.backends import Device
from hetsched.backends.sim import twin_devices
from hetsched.testing import build_board_tree

HOT_AMBIENT_C = 72.0


def _rk3588(root: Path, ambient_c: float | None) -> Path:
    if ambient_c is None:
        return build_board_tree(root, "rk3588")
    return LiveTwin("rk3588", root, ambient_c=ambient_c, noise=False).write_once()


def _snapshot(
    zones: dict[str, tuple[float | None, float | None]],
    *,
    loads: dict[str, float | None] | None = None,
    rails: tuple[RailState, ...] = (),
    total: float | None = None,
) -> Snapshot:
    return Snapshot(
        time_s=12.5,
        domains=MappingProxyType({
            name: DomainState(name, "cpu" if name.startswith("cluster") else "gpu", None, utilisation=u)
            for name, u in (loads or {}).items()
        }),
        zones=MappingProxyType({name: ZoneState(name, t, trip) for name, (t, trip) in zones.items()}),
        rails=MappingProxyType({r.name: r for r in rails}),
        total_power_w=total,
    )


GPU = Device("gpu", kind="gpu", backend="sim", domain="gpu")
BIG = Device("big", kind="cpu", backend="cpu", domain="cluster4")
NPU = Device("npu", kind="npu", backend="sim", domain="npu")


# -- twin trees -----------------------------------------------------------------------------------


def test_every_device_of_a_hot_twin_has_no_thermal_headroom(tmp_path: Path) -> None:
    root = _rk3588(tmp_path, HOT_AMBIENT_C)
    devices = twin_devices("rk3588")
    snap = Telemetry(root).sample_once()
    trip = min(z.passive_trip_c for z in snap.zones.values() if z.passive_trip_c is not None)
    assert all(z.temp_c is not None and z.temp_c > trip for z in snap.zones.values())  # the premise
    states = sample_device_states(root, devices)
    assert set(states) == {d.name for d in devices}
    for d in devices:
        st = states[d.name]
        assert st.temp_headroom == 0.0, st
        assert st.kind == d.kind and st.inputs is not None
        assert st.inputs.zone_match == "own" and st.inputs.trip_c == trip
    assert states["gpu"].inputs is not None and states["gpu"].inputs.zone == "gpu-thermal"
    assert states["npu"].inputs is not None and states["npu"].inputs.zone == "npu-thermal"
    assert states["cluster0"].inputs is not None and states["cluster0"].inputs.zone == "littlecore-thermal"
    assert states["cluster4"].inputs is not None and states["cluster4"].inputs.zone == "bigcore0-thermal"
    assert states["cluster6"].inputs is not None and states["cluster6"].inputs.zone == "bigcore1-thermal"


def test_a_cool_twin_has_headroom_from_each_devices_own_zone(tmp_path: Path) -> None:
    root = _rk3588(tmp_path, None)
    devices = twin_devices("rk3588")
    snap = Telemetry(root).sample_once()
    states = device_states(snap, devices)
    for d in devices:
        st = states[d.name]
        assert st.inputs is not None and st.inputs.zone is not None
        zone = snap.zones[st.inputs.zone]
        assert zone.temp_c is not None and st.inputs.temp_c == zone.temp_c
        expected = (75.0 - zone.temp_c) / (75.0 - T_REF_C)
        assert st.temp_headroom == pytest.approx(expected)
        assert 0.5 < st.temp_headroom < 1.0
        assert st.power_headroom == 1.0  # no budget


def test_the_cool_board_has_more_headroom_than_the_hot_one(tmp_path: Path) -> None:
    devices = twin_devices("rk3588")
    cool = sample_device_states(_rk3588(tmp_path / "cool", 25.0), devices)
    hot = sample_device_states(_rk3588(tmp_path / "hot", 60.0), devices)
    for d in devices:
        assert cool[d.name].temp_headroom > hot[d.name].temp_headroom > 0.0


def test_power_headroom_against_a_budget_from_the_estimated_rails(tmp_path: Path) -> None:
    root = _rk3588(tmp_path, None)
    estimator = power_estimator_for(discover(root))
    assert estimator is not None
    devices = twin_devices("rk3588")
    without = sample_device_states(root, devices, estimator=estimator)
    info = without["gpu"].inputs
    assert info is not None and info.power_source == "estimated" and info.power_w is not None
    p = info.power_w
    assert all(st.power_headroom == 1.0 for st in without.values())
    half = sample_device_states(root, devices, estimator=estimator, power_budget_w=2 * p)
    assert all(st.power_headroom == pytest.approx(0.5, rel=0.05) for st in half.values())
    over = sample_device_states(root, devices, estimator=estimator, power_budget_w=p / 2)
    assert all(st.power_headroom == 0.0 for st in over.values())
    # Without the model the board's power is unknown: no evidence against the budget.
    unknown = sample_device_states(root, devices, power_budget_w=p / 2)
    assert all(st.power_headroom == 1.0 for st in unknown.values())
    assert unknown["gpu"].inputs is not None and unknown["gpu"].inputs.power_w is None


def test_orin_measures_its_power_and_maps_every_cluster_to_cpu_thermal(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "orin-nx")
    devices = twin_devices("orin-nx")
    snap = Telemetry(root).sample_once()
    states = device_states(snap, devices, power_budget_w=10.0)
    vdd_in = snap.rails["VDD_IN"].power_w
    assert vdd_in is not None
    for d in devices:
        st = states[d.name]
        assert st.inputs is not None
        assert st.inputs.power_source == "measured" and st.inputs.power_w == vdd_in
        assert st.power_headroom == pytest.approx((10.0 - vdd_in) / 10.0)
    assert states["cluster0"].inputs is not None and states["cluster0"].inputs.zone == "cpu-thermal"
    assert states["gpu"].inputs is not None and states["gpu"].inputs.zone == "gpu-thermal"
    # A DLA: its cv zones are fused off on the NX (no temperature), so it gets the hottest zone.
    dla = Device("dla0", kind="npu", backend="sim", domain="dla0")
    st = device_states(snap, [dla])["dla0"]
    hottest = max((z for z in snap.zones.values() if z.temp_c is not None), key=lambda z: z.temp_c or 0.0)
    assert st.inputs is not None and st.inputs.zone_match == "hottest" and st.inputs.zone == hottest.name


# -- rules on hand-built snapshots ----------------------------------------------------------------


def test_utilisation_is_the_devices_clock_domain_load() -> None:
    snap = _snapshot({"gpu-thermal": (40.0, 80.0)}, loads={"gpu": 0.75, "cluster4": None})
    states = device_states(snap, [GPU, BIG, NPU])
    assert states["gpu"].utilisation == 0.75
    assert states["big"].utilisation == 0.0 and states["npu"].utilisation == 0.0  # unknown -> 0
    assert states["gpu"].inputs is not None and states["gpu"].inputs.domain_utilisation == 0.75
    assert states["npu"].inputs is not None and states["npu"].inputs.domain is None


def test_headroom_is_linear_between_the_reference_and_the_trip_and_zero_above() -> None:
    trip = 85.0
    mid = (trip + T_REF_C) / 2
    for temp, expected in ((T_REF_C, 1.0), (T_REF_C - 10.0, 1.0), (mid, 0.5), (trip, 0.0), (trip + 5.0, 0.0)):
        st = device_states(_snapshot({"gpu-thermal": (temp, trip)}), [GPU])["gpu"]
        assert st.temp_headroom == pytest.approx(expected), temp


def test_a_zone_without_a_passive_trip_uses_the_boards_lowest_one() -> None:
    snap = _snapshot({"soc-thermal": (50.0, 75.0), "gpu-thermal": (70.0, None), "bigcore0-thermal": (30.0, None)})
    states = device_states(snap, [GPU, BIG])
    assert states["gpu"].temp_headroom == pytest.approx((75.0 - 70.0) / (75.0 - T_REF_C))
    assert states["big"].temp_headroom == pytest.approx((75.0 - 30.0) / (75.0 - T_REF_C))
    assert states["gpu"].inputs is not None and states["gpu"].inputs.zone == "gpu-thermal"


def test_a_device_without_a_zone_gets_the_hottest_zones_headroom() -> None:
    snap = _snapshot({"soc-thermal": (60.0, 75.0), "gpu-thermal": (40.0, 75.0)})
    st = device_states(snap, [NPU])["npu"]
    assert st.temp_headroom == pytest.approx((75.0 - 60.0) / (75.0 - T_REF_C))
    assert st.inputs is not None and (st.inputs.zone, st.inputs.zone_match) == ("soc-thermal", "hottest")
    # No zone at all: nothing says it is hot.
    bare = device_states(_snapshot({}), [NPU])["npu"]
    assert bare.temp_headroom == 1.0 and bare.inputs is not None and bare.inputs.zone_match == "none"


def test_zones_override_the_default_mapping() -> None:
    snap = _snapshot({"gpu-thermal": (40.0, 75.0), "center-thermal": (70.0, 75.0)})
    st = device_states(snap, [GPU], zones={"gpu": "center-thermal"})["gpu"]
    assert st.inputs is not None and st.inputs.zone == "center-thermal"
    assert st.temp_headroom == pytest.approx(5.0 / (75.0 - T_REF_C))


def test_bad_budget_or_zones_raise_placement_error_naming_them() -> None:
    snap = _snapshot({"gpu-thermal": (40.0, 75.0)})
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(PlacementError, match="power_budget_w"):
            device_states(snap, [GPU], power_budget_w=bad)
    with pytest.raises(PlacementError, match="'nope-thermal'"):
        device_states(snap, [GPU], zones={"gpu": "nope-thermal"})
    with pytest.raises(PlacementError, match="'tpu'"):
        device_states(snap, [GPU], zones={"tpu": "gpu-thermal"})


def test_board_power_prefers_measured_rails_and_their_input_rail() -> None:
    measured = (RailState("VDD_IN", 6.0), RailState("VDD_SOC", 2.0), RailState("board", 9.0, "estimated"))
    assert board_power_w(_snapshot({}, rails=measured)) == (6.0, "measured")
    parts = (RailState("a", 1.5), RailState("b", 2.0), RailState("c", None))
    assert board_power_w(_snapshot({}, rails=parts)) == (3.5, "measured")
    estimated = (RailState("VDD_IN", None), RailState("vdd_gpu", 1.0, "estimated"),
                 RailState("board", 4.0, "estimated"))
    assert board_power_w(_snapshot({}, rails=estimated)) == (4.0, "estimated")
    assert board_power_w(_snapshot({}, total=3.0)) == (3.0, None)
    assert board_power_w(_snapshot({})) == (None, None)
