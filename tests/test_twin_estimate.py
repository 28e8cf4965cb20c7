"""Rail power estimated from the twin's model for boards without sensors."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from hetsched import DomainState, Snapshot, UnknownSocError, ZoneState
from hetsched._twin import SimBoard, power_estimator


def _snap(freq: int, util: float, temp: float = 40.0) -> Snapshot:
    return Snapshot(
        time_s=0.0,
        domains=MappingProxyType({"cluster4": DomainState("cluster4", "cpu", freq, utilisation=util)}),
        zones=MappingProxyType({"soc-thermal": ZoneState("soc-thermal", temp)}),
    )


def test_more_clock_and_load_means_more_power() -> None:
    est = power_estimator("rk3588")
    low = est(_snap(816_000_000, 0.2))
    high = est(_snap(2_208_000_000, 0.2))
    busy = est(_snap(2_208_000_000, 1.0))
    hot = est(_snap(2_208_000_000, 1.0, temp=85.0))
    assert low["vdd_cpu_big0"] < high["vdd_cpu_big0"] < busy["vdd_cpu_big0"] < hot["vdd_cpu_big0"]
    assert busy["board"] > busy["vdd_cpu_big0"] + busy["vdd_ddr"]
    assert "VDD_IN" not in busy  # only the rails the board does not measure


def test_estimate_agrees_with_the_simulation() -> None:
    board = SimBoard("rk3588", noise=False)
    board.set_frequency("cluster4", 2_208_000_000)
    board.set_utilisation("cluster4", 1.0)
    board.step(1.0)
    snap = board.snapshot()
    est = power_estimator("rk3588")(snap)
    sim_rail = snap.rails["vdd_cpu_big0"].power_w
    assert sim_rail is not None and est["vdd_cpu_big0"] == pytest.approx(sim_rail, rel=0.1)


def test_orin_measures_its_rails() -> None:
    assert dict(power_estimator("orin-nx")(_snap(1_000_000_000, 0.5))) == {}


def test_unknown_soc() -> None:
    with pytest.raises(UnknownSocError):
        power_estimator("pentium")
