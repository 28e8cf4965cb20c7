"""Platform layer: reading and writing a board's sysfs/procfs/debugfs under an injected root.

Internal package. One module per subsystem, each made of pure parsers (functions of
the files' strings) plus a thin reader/writer taking a :class:`SysfsRoot`, the only
object that touches files:

* :mod:`._fs` -- :class:`SysfsRoot` (root confinement, error translation);
* :mod:`.cpufreq`, :mod:`.devfreq`, :mod:`.thermal`, :mod:`.power` (INA3221, RAPL),
  :mod:`.jetson` (GPU load, EMC, L4T), :mod:`.rknpu`, :mod:`.procstat`, :mod:`.soc`;
* :mod:`.discovery` -- :func:`discover` -> :class:`Platform`;
* :mod:`.telemetry` -- :class:`Telemetry`, the sampler (:mod:`.sampleplan`: the files it reads);
* :mod:`.udev` -- pyudev enumeration and :class:`UdevMonitor` (host root only).
"""

from __future__ import annotations

from ._fs import ResolvedPath, SysfsRoot, SysfsStatistics
from .discovery import ClusterInfo, DeviceInfo, Platform, RailInfo, TripInfo, ZoneInfo, discover
from .telemetry import Estimator, Telemetry, TelemetryStatistics
from .udev import UdevEvent, UdevMonitor, UdevStatus, enumerate_devices, udev_status

__all__ = [
    "ClusterInfo",
    "DeviceInfo",
    "Estimator",
    "Platform",
    "RailInfo",
    "ResolvedPath",
    "SysfsRoot",
    "SysfsStatistics",
    "Telemetry",
    "TelemetryStatistics",
    "TripInfo",
    "UdevEvent",
    "UdevMonitor",
    "UdevStatus",
    "ZoneInfo",
    "discover",
    "enumerate_devices",
    "udev_status",
]
