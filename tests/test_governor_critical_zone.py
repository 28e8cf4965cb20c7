"""The thermal guard and zones with only a critical trip (issue 23 item 9).

bigcore0 held at 200 C with one trip (critical, 115 C) capped nothing and the cap the guard
gave rose with the board's power. A zone without a passive trip is guarded at
``GovernorConfig.critical_margin_c`` below its critical trip; one past it caps the power (and
so the clocks) at every tick until it cools.
"""

from __future__ import annotations

import itertools
from typing import cast

import pytest

from hetsched import GovernorError
from hetsched._governor import GovernorConfig
from hetsched._governor._thermal import ThermalGuard
from hetsched._snapshot import Snapshot, ZoneState


def _snap(t: float, temp_c: float, *, passive: float | None = None, critical: float | None = 115.0) -> Snapshot:
    zones = {"bigcore0-thermal": ZoneState("bigcore0-thermal", temp_c, passive, critical),
             "soc-thermal": ZoneState("soc-thermal", 45.0, 75.0, 115.0)}
    return Snapshot(t, zones=zones, total_power_w=10.0)


def _run(guard: ThermalGuard, temps: list[float], powers: list[float], **kw: float | None) -> list[float | None]:
    caps = []
    for i, (temp, power) in enumerate(zip(temps, powers, strict=True)):
        t = 100.0 + 0.1 * i  # an injected clock: one tick per 100 ms
        guard.observe(t, _snap(t, temp, **kw), power, 0.1, smooth_w=power, phase_s=0.0)
        caps.append(guard.cap_w)
    return caps


def test_a_zone_past_its_only_critical_trip_caps_and_keeps_capping() -> None:
    guard = ThermalGuard(GovernorConfig())
    powers = [178.0] * 5 + [483.0] * 5
    raw = _run(guard, [200.0] * 10, powers)
    assert all(c is not None for c in raw)
    caps = cast("list[float]", raw)
    assert caps[0] <= 0.95 * 178.0  # capped from the first tick
    assert all(b <= a for a, b in itertools.pairwise(caps))  # never rises while the zone is past critical
    assert caps[-1] <= 0.95 * 178.0
    assert guard.zone == "bigcore0-thermal" and guard.near_trip()


def test_a_critical_only_zone_is_guarded_a_margin_below_critical() -> None:
    cfg = GovernorConfig(critical_margin_c=15.0)
    cool = ThermalGuard(cfg)
    assert _run(cool, [90.0] * 5, [10.0] * 5)[-1] is None  # 100 C limit: far
    warm = ThermalGuard(cfg)
    assert _run(warm, [99.5] * 5, [10.0] * 5)[-1] is not None  # within the reactive band of 100 C
    assert warm.zone == "bigcore0-thermal"


def test_a_passive_trip_above_critical_does_not_hide_the_critical_one() -> None:
    guard = ThermalGuard(GovernorConfig())
    caps = _run(guard, [120.0] * 5, [20.0] * 5, passive=150.0)
    assert caps[-1] is not None and caps[-1] < 20.0


def test_critical_margin_is_validated() -> None:
    with pytest.raises(GovernorError, match="critical_margin_c"):
        GovernorConfig(critical_margin_c=-1.0)
