"""Idle power switches of the fast simulation: power gating (railgate_enable) and cpuidle."""

from __future__ import annotations

import math

import pytest

from hetsched import TwinError
from hetsched._twin.physics import leakage_share
from hetsched._twin.sim import SimBoard


def _board(soc: str = "orin-nx") -> SimBoard:
    b = SimBoard(soc, noise=False)
    for name, info in b.domains().items():
        b.set_frequency(name, info.available_hz[-1])
    b.step(0.05)  # past every switch latency: the clocks are in effect
    return b


def test_leakage_share_rules() -> None:
    assert leakage_share(1.0, 0.5) == 1.0
    assert leakage_share(0.0, 0.5) == 0.5
    assert leakage_share(0.4, 0.5) == pytest.approx(0.4 + 0.6 * 0.5)
    assert leakage_share(0.0, 0.5, deep_idle=False) == 1.0


@pytest.mark.parametrize("soc", ["orin-nx", "rk3588"])
def test_gated_block_draws_nothing_idle_until_gating_is_disabled(soc: str) -> None:
    b = _board(soc)
    assert b.power_gating("gpu") is True
    assert b.power("gpu") == 0.0
    b.set_power_gating("gpu", False)
    assert b.power_gating("gpu") is False
    ungated_top = b.power("gpu")
    assert ungated_top > 0.0  # leakage (and idle activity) at the top clock's voltage
    b.set_frequency("gpu", b.domains()["gpu"].available_hz[0])
    b.step(0.1)  # the new clock takes effect after the switch latency
    assert 0.0 < b.power("gpu") < ungated_top  # lower voltage, less leakage
    b.set_power_gating("gpu", True)
    assert b.power("gpu") == 0.0


def test_power_gating_only_where_the_block_has_it() -> None:
    b = _board()
    assert b.power_gating("cluster0") is False
    with pytest.raises(TwinError, match="cluster0: no power gating"):
        b.set_power_gating("cluster0", False)
    with pytest.raises(TwinError, match="npu9"):
        b.set_power_gating("npu9", False)


def test_ungated_idle_energy_is_counted_in_the_board_total() -> None:
    gated, ungated = _board(), _board()
    ungated.set_power_gating("gpu", False)
    for b in (gated, ungated):
        b.step(10.0)
    extra = ungated.statistics().energy_j - gated.statistics().energy_j
    assert extra == pytest.approx(
        (ungated.statistics().energy_by_domain_j["gpu"]) / ungated.profile.converter_efficiency, rel=0.05
    )
    assert extra > 0.0


@pytest.mark.parametrize("soc", ["orin-nx", "rk3588"])
def test_disabling_cpuidle_makes_idle_cores_leak_in_full(soc: str) -> None:
    b = _board(soc)
    assert b.cpuidle is True
    deep = {n: b.power(n) for n, i in b.domains().items() if i.kind == "cpu"}
    b.set_cpuidle(False)
    assert b.cpuidle is False
    wfi = {n: b.power(n) for n in deep}
    for n in deep:
        assert wfi[n] > deep[n]
        prof = b.profile.domain(n)
        # Only the leakage changes: idle cores keep the rest of theirs with deep idle.
        leak_full = wfi[n] - prof.full_power_w(b.frequency(n)) * prof.idle_activity
        assert deep[n] == pytest.approx(wfi[n] - leak_full * (1.0 - prof.deep_idle_leak_fraction), rel=1e-9)
    # Busy cores leak in full either way: cpuidle changes nothing at 100 % utilisation.
    busy_on, busy_off = _board(soc), _board(soc)
    busy_off.set_cpuidle(False)
    for bb in (busy_on, busy_off):
        for n in deep:
            bb.set_utilisation(n, 1.0)
    for n in deep:
        assert math.isclose(busy_on.power(n), busy_off.power(n), rel_tol=1e-12)
    # Non-CPU domains are unaffected.
    assert b.power("memory") == pytest.approx(_board(soc).power("memory"), rel=1e-9)
