"""devfreq: GPU, NPU and memory-controller clocks (values in **Hz**).

Layout (kernel ABI)::

    sys/class/devfreq/<name> -> ../../devices/platform/<dev>/devfreq/<name>
    <node>/{available_frequencies, available_governors, governor, cur_freq, target_freq,
            min_freq, max_freq, name, load (Rockchip: "<busy%>@<freq>Hz")}
    <node>/userspace/set_freq       only while governor == userspace
    <node>/device -> the platform device; device/of_node/name names the IP block

Devices are recognised as jetson-stats does: the GPU by ``device/of_node/name``
(``ga10b``, ``gv11b``, ``gp10b``, ``gb10b``, ``gpu`` or anything containing
``gpu``), falling back on the node name (``fb000000.gpu``, ``17000000.ga10b``)
where the tree has no ``of_node``. The RK NPU is ``*.npu`` / ``of_node`` ``npu``;
the memory controller is RK ``dmc`` (or Tegra ``bwmgr``/``emc``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .._errors import GovernorError, UnsupportedFrequencyError, UnsupportedGovernorError
from ._fs import SysfsRoot
from .cpufreq import MAX_FREQ, parse_freq_list, parse_governors

__all__ = [
    "DEVFREQ_CLASS",
    "GPU_OF_NAMES",
    "DevfreqDevice",
    "DevfreqKind",
    "classify",
    "parse_load",
    "read_devices",
    "set_governor",
    "set_limits",
    "set_max_hz",
    "set_min_hz",
    "set_userspace_freq",
]

DEVFREQ_CLASS = "sys/class/devfreq"
#: ``of_node/name`` values of NVIDIA integrated GPUs (jetson-stats ``gpu.py``).
GPU_OF_NAMES = frozenset({"gv11b", "gp10b", "ga10b", "gb10b", "gpu"})

DevfreqKind = Literal["gpu", "npu", "memory", "other"]

# Bounded digit runs: int() of a runaway digit string raises (Python caps conversions at 4300 digits).
_LOAD_RE = re.compile(r"^\s*(\d{1,6})\s*@\s*(\d{1,20})\s*Hz\s*$")


# -- pure parsers ---------------------------------------------------------------


def parse_load(text: str) -> tuple[int, int] | None:
    """Rockchip ``load``: ``"37@800000000Hz\\n"`` -> ``(37, 800000000)`` (busy %, Hz); None if malformed."""
    m = _LOAD_RE.match(text)
    if not m:
        return None
    return min(int(m.group(1)), 100), int(m.group(2))


def classify(node_name: str, of_node_name: str | None) -> DevfreqKind:
    """Kind of a devfreq node from its name and its device's ``of_node/name``."""
    of = (of_node_name or "").strip().strip("\0").lower()
    name = node_name.lower()
    if of in GPU_OF_NAMES or "gpu" in of:
        return "gpu"
    if of == "npu" or "npu" in of:
        return "npu"
    if of in {"dmc", "emc"} or "dmc" in of:
        return "memory"
    suffix = name.rsplit(".", 1)[-1]
    if suffix in GPU_OF_NAMES or "gpu" in suffix:
        return "gpu"
    if suffix == "npu":
        return "npu"
    if name in {"dmc", "bwmgr", "emc"} or suffix in {"dmc", "emc"}:
        return "memory"
    return "other"


# -- reader ---------------------------------------------------------------------


@dataclass(frozen=True)
class DevfreqDevice:
    """One devfreq node. Frequencies in Hz."""

    name: str
    """The class entry name (``fb000000.gpu``, ``17000000.gpu``, ``dmc``)."""
    kind: DevfreqKind
    path: str
    """Root-relative resolved devfreq directory."""
    device_path: str | None
    """Root-relative resolved platform device directory (``<path>/device``), if linked."""
    of_node_name: str | None
    available_hz: tuple[int, ...]
    """Ascending, whatever order the driver prints (Mali prints descending)."""
    governors: tuple[str, ...]
    governor: str | None
    min_hz: int | None
    max_hz: int | None
    cur_hz: int | None
    has_load: bool
    """True when ``<path>/load`` exists (Rockchip ``busy@freqHz``)."""

    @property
    def max_freq_hz(self) -> int | None:
        """Highest available frequency (the hardware ceiling, not the current ``max_freq`` limit)."""
        return self.available_hz[-1] if self.available_hz else self.max_hz

    def check_hz(self, hz: int) -> int:
        """Return ``hz`` if available. :raises UnsupportedFrequencyError: not in the list."""
        if self.available_hz and hz not in self.available_hz:
            raise UnsupportedFrequencyError(
                f"{hz} Hz is not available on devfreq {self.name} ({self.kind}); "
                f"available: {' '.join(map(str, self.available_hz))}"
            )
        return hz


def read_devices(fs: SysfsRoot) -> list[DevfreqDevice]:
    """Every devfreq node under ``sys/class/devfreq`` (sorted by name); ``[]`` when none.

    :raises SysfsPermissionError: a devfreq file may not be read.
    """
    out: list[DevfreqDevice] = []
    for entry in fs.listdir(DEVFREQ_CLASS):
        cls = f"{DEVFREQ_CLASS}/{entry}"
        if not fs.is_dir(cls):  # False for a link out of the root (skipped, noted)
            continue
        path = fs.realpath(cls)
        device = fs.contained(f"{path}/device")
        device_path = device.rel if device is not None and fs.exists(device) else None
        of_name = fs.read_str(f"{device_path}/of_node/name") if device_path else None
        text = fs.read_text(f"{path}/available_frequencies")
        try:
            avail = parse_freq_list(text) if text else ()
        except ValueError:
            avail = ()
        out.append(
            DevfreqDevice(
                name=entry,
                kind=classify(entry, of_name),
                path=path,
                device_path=device_path,
                of_node_name=of_name,
                available_hz=avail,
                governors=parse_governors(fs.read_text(f"{path}/available_governors") or ""),
                governor=fs.read_name(f"{path}/governor"),
                min_hz=fs.read_int(f"{path}/min_freq", lo=0, hi=MAX_FREQ),
                max_hz=fs.read_int(f"{path}/max_freq", lo=0, hi=MAX_FREQ),
                cur_hz=fs.read_int(f"{path}/cur_freq", lo=0, hi=MAX_FREQ),
                has_load=fs.exists(f"{path}/load"),
            )
        )
    return out


# -- writers --------------------------------------------------------------------


def set_governor(fs: SysfsRoot, dev: DevfreqDevice, governor: str) -> None:
    """Write ``governor``. :raises UnsupportedGovernorError: not in ``available_governors``."""
    if dev.governors and governor not in dev.governors:
        raise UnsupportedGovernorError(
            f"governor {governor!r} is not available on devfreq {dev.name}; available: {' '.join(dev.governors)}"
        )
    fs.write_text(f"{dev.path}/governor", governor)


def set_min_hz(fs: SysfsRoot, dev: DevfreqDevice, hz: int) -> None:
    """Write ``min_freq``. :raises UnsupportedFrequencyError: ``hz`` not available."""
    fs.write_text(f"{dev.path}/min_freq", dev.check_hz(hz))


def set_max_hz(fs: SysfsRoot, dev: DevfreqDevice, hz: int) -> None:
    """Write ``max_freq``. :raises UnsupportedFrequencyError: ``hz`` not available."""
    fs.write_text(f"{dev.path}/max_freq", dev.check_hz(hz))


def set_limits(fs: SysfsRoot, dev: DevfreqDevice, min_hz: int, max_hz: int) -> None:
    """Set both limits in an order that never asks for min > max.

    :raises UnsupportedFrequencyError: either is unavailable or ``min_hz > max_hz`` (nothing written).
    """
    dev.check_hz(min_hz)
    dev.check_hz(max_hz)
    if min_hz > max_hz:
        raise UnsupportedFrequencyError(f"devfreq {dev.name}: min {min_hz} Hz is above max {max_hz} Hz")
    cur_max = fs.read_int(f"{dev.path}/max_freq")
    if cur_max is not None and min_hz > cur_max:
        set_max_hz(fs, dev, max_hz)
        set_min_hz(fs, dev, min_hz)
    else:
        set_min_hz(fs, dev, min_hz)
        set_max_hz(fs, dev, max_hz)


def set_userspace_freq(fs: SysfsRoot, dev: DevfreqDevice, hz: int) -> None:
    """Write ``userspace/set_freq``.

    :raises UnsupportedFrequencyError: ``hz`` not available.
    :raises GovernorError: the governor is not ``userspace`` (the file only exists under it).
    """
    dev.check_hz(hz)
    governor = fs.read_name(f"{dev.path}/governor")
    if governor != "userspace" or not fs.exists(f"{dev.path}/userspace/set_freq"):
        raise GovernorError(
            f"devfreq {dev.name}: userspace/set_freq needs the userspace governor, current is {governor!r}"
        )
    fs.write_text(f"{dev.path}/userspace/set_freq", hz)
