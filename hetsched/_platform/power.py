"""power: measured rails (INA3221 hwmon on Jetson, RAPL powercap on x86) and estimated ones.

Units (kernel hwmon ``sysfs-interface``): ``in*_input`` mV, ``curr*_input`` mA,
``power*_input`` µW; powercap ``energy_uj`` µJ, wrapping at ``max_energy_range_uj``.

* **INA3221** (Jetson): found by its ``name`` file (``ina3221``), never by the
  unstable ``hwmonN`` index: ``sys/bus/i2c/devices/*/hwmon/hwmon*`` first (JP5 and
  JP6 both bind the mainline-style driver there), then ``sys/class/hwmon/*``. Each
  channel ``k`` in 1..3 with an ``in{k}_label`` is a rail; ``NC`` labels (not
  connected) and channel 7 (sum of shunt voltages) are skipped, as jtop does.
  Power = ``in * curr / 1e6`` W. JetPack 4's ``ina3221x`` IIO driver
  (``iio:device*/rail_name_N``, ``in_power{N}_input`` mW) is read as well.
* **RAPL** (x86 hosts): ``sys/class/powercap/intel-rapl:*`` zones; power comes
  from energy deltas (:func:`energy_delta_uj` handles the wrap). ``energy_uj``
  is root-only since Linux 5.10: unreadable zones are left out.
* **No sensor** (RK3588): the USB-PD ``power_supply`` reports the *negotiated
  contract*, not a measurement, so it is deliberately not used (jtop-style code
  would show a constant 30 W). Rails there are *estimated* by a model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from .._errors import SysfsPermissionError
from ._fs import SysfsRoot

__all__ = [
    "TOTAL_RAIL_NAMES",
    "PowerRail",
    "RailKind",
    "RailSource",
    "energy_delta_uj",
    "estimated_rails",
    "find_ina3221",
    "is_connected_label",
    "parse_label",
    "power_w_from_mv_ma",
    "read_rail_power_w",
    "read_rails",
    "read_rapl_rails",
]

RailSource = Literal["measured", "estimated"]
RailKind = Literal["hwmon", "iio", "rapl", "model"]

#: Rails that are the board's input (total) power: INA3221 labels (jtop ``power.py``) and the
#: names estimated rails use for the board total.
TOTAL_RAIL_NAMES = frozenset({"VDD_IN", "POM_5V_IN", "board", "total"})


@dataclass(frozen=True)
class PowerRail:
    name: str
    source: RailSource
    kind: RailKind
    sensor: str | None = None
    """Where it is measured, e.g. ``"ina3221 1-0040 ch1"`` or ``"intel-rapl:0"``."""
    voltage_path: str | None = None
    current_path: str | None = None
    power_path: str | None = None
    """Direct power file (IIO mW)."""
    energy_path: str | None = None
    """RAPL ``energy_uj``."""
    max_energy_range_uj: int | None = None

    @property
    def is_total(self) -> bool:
        return self.name in TOTAL_RAIL_NAMES


# -- pure parsers ---------------------------------------------------------------


def parse_label(text: str | None) -> str | None:
    return None if text is None else (text.strip() or None)


def is_connected_label(label: str | None) -> bool:
    """False for missing labels and L4T's ``NC`` (not connected) channels."""
    return label is not None and label != "" and label != "NC" and not label.startswith("NC ")


def power_w_from_mv_ma(mv: int | None, ma: int | None) -> float | None:
    """Bus millivolts x milliamps -> watts; None when either is unknown."""
    if mv is None or ma is None:
        return None
    return mv * ma / 1_000_000.0


def energy_delta_uj(prev_uj: int, cur_uj: int, max_range_uj: int | None) -> int:
    """Energy between two ``energy_uj`` readings, across one wrap of the counter.

    The counter counts 0..``max_energy_range_uj`` and then restarts at 0, so a
    smaller second reading means it wrapped once: ``max - prev + cur``.
    Without a known range a decrease cannot be interpreted and 0 is returned.
    """
    if cur_uj >= prev_uj:
        return cur_uj - prev_uj
    if max_range_uj is None or max_range_uj <= 0:
        return 0
    return max_range_uj - prev_uj + cur_uj


# -- discovery --------------------------------------------------------------------


def _hwmon_dirs(fs: SysfsRoot) -> list[tuple[str, str]]:
    """(resolved hwmon dir, i2c device name or "") for every INA3221, deduplicated."""
    seen: dict[str, str] = {}
    for dev in fs.listdir("sys/bus/i2c/devices"):
        base = f"sys/bus/i2c/devices/{dev}"
        name = fs.read_str(f"{base}/name") or ""
        if "ina3221" not in name:
            continue
        for child in fs.listdir(f"{base}/hwmon"):
            hwmon = fs.contained(f"{base}/hwmon/{child}") if child.startswith("hwmon") else None
            if hwmon is not None:
                seen.setdefault(hwmon.rel, dev)
    for child in fs.listdir("sys/class/hwmon"):
        base = f"sys/class/hwmon/{child}"
        resolved = fs.contained(base) if (fs.read_str(f"{base}/name") or "") == "ina3221" else None
        if resolved is not None:
            path = resolved.rel
            if path not in seen:
                parent = path.rsplit("/hwmon/", 1)[0].rsplit("/", 1)[-1] if "/hwmon/" in path else child
                seen[path] = parent
    return list(seen.items())


def find_ina3221(fs: SysfsRoot) -> list[PowerRail]:
    """INA3221 rails (hwmon driver, JP5/JP6; ``ina3221x`` IIO, JP4), in sensor/channel order."""
    rails: list[PowerRail] = []
    names: set[str] = set()

    def add(raw: str | None, **where: str) -> None:
        label = parse_label(raw)
        if label is None or not is_connected_label(label) or label in names:
            return
        names.add(label)
        rails.append(PowerRail(name=label, source="measured", **where))  # type: ignore[arg-type]

    for path, dev in _hwmon_dirs(fs):
        for ch in (1, 2, 3):
            add(fs.read_text(f"{path}/in{ch}_label"), kind="hwmon", sensor=f"ina3221 {dev} ch{ch}",
                voltage_path=f"{path}/in{ch}_input", current_path=f"{path}/curr{ch}_input")
    for dev in fs.listdir("sys/bus/i2c/devices"):
        base = f"sys/bus/i2c/devices/{dev}"
        for child in fs.listdir(base):
            resolved = fs.contained(f"{base}/{child}") if child.startswith("iio:device") else None
            if resolved is None:
                continue
            iio = resolved.rel
            for ch in range(8):
                add(fs.read_text(f"{iio}/rail_name_{ch}"), kind="iio", sensor=f"ina3221x {dev} ch{ch}",
                    voltage_path=f"{iio}/in_voltage{ch}_input", current_path=f"{iio}/in_current{ch}_input",
                    power_path=f"{iio}/in_power{ch}_input")
    return rails


def read_rapl_rails(fs: SysfsRoot) -> list[PowerRail]:
    """Readable RAPL zones (``package-0``, ``core``, ``dram``...). Root-only counters are skipped."""
    rails = []
    for entry in fs.listdir("sys/class/powercap"):
        if not entry.startswith("intel-rapl"):
            continue
        resolved = fs.contained(f"sys/class/powercap/{entry}")
        if resolved is None:
            continue
        path = resolved.rel
        try:
            if fs.read_int(f"{path}/energy_uj") is None:
                continue
        except SysfsPermissionError:
            continue  # CVE-2020-8694: energy_uj is 0400 since 5.10; not an error for discovery
        zone = fs.read_str(f"{path}/name") or entry
        rails.append(
            PowerRail(
                name=f"{zone} ({entry})" if zone != entry else entry,
                source="measured",
                kind="rapl",
                sensor=entry,
                energy_path=f"{path}/energy_uj",
                max_energy_range_uj=fs.read_int(f"{path}/max_energy_range_uj", lo=1),
            )
        )
    return rails


def read_rails(fs: SysfsRoot) -> list[PowerRail]:
    """Every measured rail under the root (INA3221 first, then RAPL); ``[]`` without sensors."""
    return [*find_ina3221(fs), *read_rapl_rails(fs)]


def estimated_rails(names: Iterable[str]) -> list[PowerRail]:
    """Rails a model will estimate (boards with no power sensor); ``source="estimated"``."""
    return [PowerRail(name=n, source="estimated", kind="model", sensor="model") for n in names]


def read_rail_power_w(fs: SysfsRoot, rail: PowerRail) -> float | None:
    """Instantaneous power of a hwmon/IIO rail in W; None when unreadable or not instantaneous.

    RAPL rails have no instantaneous reading: use energy deltas (telemetry does).
    """
    if rail.power_path is not None:
        mw = fs.read_int(rail.power_path, lo=0, hi=10**7)  # 10 kW: garbage past it
        if mw is not None:
            return mw / 1000.0
    if rail.voltage_path is not None and rail.current_path is not None:
        return power_w_from_mv_ma(fs.read_int(rail.voltage_path, lo=0, hi=10**6),
                                  fs.read_int(rail.current_path, lo=-(10**7), hi=10**7))
    return None
