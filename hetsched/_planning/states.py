"""Device states from a board snapshot: what a placement policy sees of the board.

:func:`device_states` is a pure function of a :class:`~hetsched._snapshot.Snapshot` and the
devices; :func:`sample_device_states` is the thin reader (one telemetry sample of a root).

Per device:

* ``utilisation``: the busy fraction of its clock domain (``Device.domain``: ``cluster<N>``,
  ``gpu``, ``npu``) in the snapshot, 0 where the board does not say.
* ``temp_headroom``: ``(T_trip - T) / (T_trip - T_REF_C)`` clamped to [0, 1], with ``T`` the
  temperature of the device's own thermal zone and ``T_trip`` that zone's lowest passive trip
  (where the kernel starts throttling). ``T_REF_C`` is a 25 C ambient reference: a device at
  the reference or cooler has headroom 1, one at or above its trip has 0, linear in between. A
  zone without a passive trip of its own (the RK3588 vendor tree puts the passive trips on
  ``soc-thermal`` only; the per-block zones carry just a critical one) is held against the
  board's lowest passive trip, the one whose throttling reaches the device. A device whose
  zone is missing or unreadable (fused-off Orin ``cv*`` zones) gets the hottest zone's
  headroom: every block sits on one die, so the hottest reading bounds it.
* ``power_headroom``: ``(budget - P) / budget`` clamped to [0, 1], ``P`` the board's total
  power (measured rails where the board has sensors, else the estimated ones); 1 without a
  budget or without any power reading.

The readings used go in each state's :class:`~hetsched.policies.DeviceStateInputs`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from hetsched._errors import PlacementError
from hetsched._platform._fs import SysfsRoot
from hetsched._platform.power import TOTAL_RAIL_NAMES
from hetsched._platform.telemetry import Estimator, Telemetry
from hetsched._snapshot import Snapshot, ZoneState
from hetsched.backends import Device
from hetsched.policies import DeviceState, DeviceStateInputs

__all__ = ["DEFAULT_ZONES", "T_REF_C", "board_power_w", "device_states", "sample_device_states"]

T_REF_C = 25.0
"""Reference temperature (a 25 C ambient) at which a device has its full thermal headroom."""

# Zone types per clock domain, then per device kind, first match wins. RK3588 (vendor and
# mainline trees): cluster0 = CPUs 0-3 (A55, littlecore), cluster4 = CPUs 4-5 (bigcore0),
# cluster6 = CPUs 6-7 (bigcore1 on the vendor tree, bigcore2 on mainline), gpu-thermal,
# npu-thermal. Orin (JetPack 5/6): one cpu-thermal for every cluster, gpu-thermal, cv0-2 for
# the DLA/PVA blocks. Sources (docs/sources.md): [rk-bsp-dtsi] the vendor
# arch/arm64/boot/dts/rockchip/rk3588s.dtsi as carried in https://github.com/armbian/linux-rockchip,
# [rk-mainline-dts] https://git.kernel.org/pub/scm/linux/kernel/git/torvalds/linux.git/tree/arch/arm64/boot/dts/rockchip/rk3588-base.dtsi,
# [tegra234-dt] include/dt-bindings/thermal/tegra234-bpmp-thermal.h in
# https://git.kernel.org/pub/scm/linux/kernel/git/torvalds/linux.git/tree/include/dt-bindings/thermal
DEFAULT_ZONES: Mapping[str, tuple[str, ...]] = {
    "cluster0": ("littlecore-thermal", "cpu-thermal"),
    "cluster4": ("bigcore0-thermal", "cpu-thermal"),
    "cluster6": ("bigcore1-thermal", "bigcore2-thermal", "cpu-thermal"),
    "cpu": ("cpu-thermal",),
    "gpu": ("gpu-thermal",),
    "npu": ("npu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal"),
    "dla": ("cv0-thermal", "cv1-thermal", "cv2-thermal"),
}
"""Thermal zone types tried for a device: by its clock domain, then by its kind."""


def device_states(
    snapshot: Snapshot,
    devices: Sequence[Device],
    *,
    power_budget_w: float | None = None,
    zones: Mapping[str, str] | None = None,
) -> dict[str, DeviceState]:
    """Each device's :class:`DeviceState` from ``snapshot`` (see the module docstring).

    :param power_budget_w: the session's or governor's board power budget; None: headroom 1.
    :param zones: ``{device name: zone type}`` overriding :data:`DEFAULT_ZONES` (a zone key of
        the snapshot: the zone's type, or ``type#index`` where types repeat).
    :raises PlacementError: ``power_budget_w`` is not a finite number > 0, or ``zones`` names a
        device that is not in ``devices`` or a zone the snapshot does not have.
    """
    budget = _check_budget(power_budget_w)
    overrides = dict(zones or {})
    names = {d.name for d in devices}
    for dev_name, zone_key in overrides.items():
        if dev_name not in names:
            raise PlacementError(f"zones: device {dev_name!r} is not one of the devices {sorted(names)}")
        if zone_key not in snapshot.zones:
            raise PlacementError(f"zones: zone {zone_key!r} for device {dev_name!r} is not on the board "
                                 f"(zones: {sorted(snapshot.zones)})")
    board_trip = min((z.passive_trip_c for z in snapshot.zones.values() if z.passive_trip_c is not None),
                     default=None)
    hottest = _hottest(snapshot, board_trip)
    power_w, power_source = board_power_w(snapshot)
    power_headroom = 1.0 if budget is None or power_w is None else _clamp01((budget - power_w) / budget)
    out: dict[str, DeviceState] = {}
    for dev in devices:
        dom = snapshot.domains.get(dev.domain) if dev.domain is not None else None
        util = dom.utilisation if dom is not None else None
        zone = _own_zone(snapshot, dev, overrides.get(dev.name), board_trip)
        match = "own"
        if zone is None:
            zone, match = (hottest, "hottest") if hottest is not None else (None, "none")
        temp_c = zone.temp_c if zone is not None else None
        trip_c = _trip(zone, board_trip) if zone is not None else None
        out[dev.name] = DeviceState(
            name=dev.name,
            kind=dev.kind,
            utilisation=_clamp01(util) if util is not None and math.isfinite(util) else 0.0,
            temp_headroom=_headroom(temp_c, trip_c),
            power_headroom=power_headroom,
            memory_domain=dev.memory_domain,
            inputs=DeviceStateInputs(
                time_s=snapshot.time_s, domain=dev.domain if dom is not None else None,
                domain_utilisation=util, zone=zone.name if zone is not None else None, zone_match=match,
                temp_c=temp_c, trip_c=trip_c, power_w=power_w, power_source=power_source,
                power_budget_w=budget,
            ),
        )
    return out


def sample_device_states(
    root: str | os.PathLike[str] | SysfsRoot,
    devices: Sequence[Device],
    *,
    power_budget_w: float | None = None,
    estimator: Estimator | None = None,
    zones: Mapping[str, str] | None = None,
) -> dict[str, DeviceState]:
    """:func:`device_states` of one telemetry sample of the board under ``root``.

    One sample has device loads (devfreq) but no CPU loads yet (those are /proc/stat deltas
    between two samples), so CPU clusters read utilisation 0.

    :param estimator: the power model of a board without sensors
        (``hetsched._estimators.power_estimator_for(platform)``; the planning layer does not
        pick models itself); without one such a board's power is unknown.
    :raises SysfsError: the root is not a directory, or discovery failed.
    :raises PlacementError: as :func:`device_states`.
    """
    budget = _check_budget(power_budget_w)  # before touching the board
    snapshot = Telemetry(root, estimator=estimator).sample_once()
    return device_states(snapshot, devices, power_budget_w=budget, zones=zones)


def board_power_w(snapshot: Snapshot) -> tuple[float | None, str | None]:
    """The board's total power and where it came from (``"measured"``/``"estimated"``).

    Measured rails win over estimated ones: a board input rail (``VDD_IN``, ``board``, ...)
    where there is one, else the sum of the rails of that source; then the snapshot's
    ``total_power_w``; ``(None, None)`` when nothing reads.
    """
    for source in ("measured", "estimated"):
        rails = [r for r in snapshot.rails.values() if r.source == source and r.power_w is not None]
        if not rails:
            continue
        total = next((r.power_w for r in rails if r.name in TOTAL_RAIL_NAMES and r.power_w is not None), None)
        return (total if total is not None else sum(r.power_w for r in rails if r.power_w is not None)), source
    if snapshot.total_power_w is not None:
        return snapshot.total_power_w, None
    return None, None


def _check_budget(power_budget_w: float | None) -> float | None:
    if power_budget_w is None:
        return None
    if isinstance(power_budget_w, bool) or not isinstance(power_budget_w, (int, float)) or not (
        math.isfinite(power_budget_w) and power_budget_w > 0
    ):
        raise PlacementError(f"power_budget_w must be a finite number of watts > 0, got {power_budget_w!r}")
    return float(power_budget_w)


def _clamp01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def _trip(zone: ZoneState, board_trip: float | None) -> float | None:
    return zone.passive_trip_c if zone.passive_trip_c is not None else board_trip


def _headroom(temp_c: float | None, trip_c: float | None) -> float:
    if temp_c is None or trip_c is None:
        return 1.0  # nothing read: no evidence the device is hot
    if temp_c >= trip_c:
        return 0.0
    span = trip_c - T_REF_C
    if span <= 0:
        return 1.0  # a trip at or below the reference: below it (checked above) is all headroom
    return _clamp01((trip_c - temp_c) / span)


def _usable(zone: ZoneState | None, board_trip: float | None) -> bool:
    return zone is not None and zone.temp_c is not None and _trip(zone, board_trip) is not None


def _own_zone(snapshot: Snapshot, dev: Device, override: str | None,
              board_trip: float | None) -> ZoneState | None:
    if override is not None:
        given = snapshot.zones[override]
        return given if _usable(given, board_trip) else None
    keys = (*(DEFAULT_ZONES.get(dev.domain, ()) if dev.domain else ()), *DEFAULT_ZONES.get(dev.kind, ()))
    for key in keys:
        zone = snapshot.zones.get(key)
        if _usable(zone, board_trip):
            return zone
    return None


def _hottest(snapshot: Snapshot, board_trip: float | None) -> ZoneState | None:
    """The zone with the least headroom (ties: the hotter one)."""
    best: ZoneState | None = None
    best_key = (math.inf, 0.0)
    for zone in snapshot.zones.values():
        if not _usable(zone, board_trip) or zone.temp_c is None:
            continue
        key = (_headroom(zone.temp_c, _trip(zone, board_trip)), -zone.temp_c)
        if key < best_key:
            best, best_key = zone, key
    return best
