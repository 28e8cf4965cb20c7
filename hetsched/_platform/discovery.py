"""Discovery: what board is under a root, and which clocks, zones and rails it has.

:func:`discover` walks the tree once (cpufreq, devfreq, bpmp EMC, thermal, INA3221 /
RAPL, RK NPU debugfs, device tree) and returns a frozen :class:`Platform`: plain data,
printable by ``hetsched info``, and the plan telemetry samples from. Nothing is
written. Missing subsystems are simply absent (an x86 container yields a Platform
with a few or no CPU clusters and ``soc=None``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .._errors import SysfsPermissionError
from . import cpufreq, devfreq, jetson, power, rknpu, soc, thermal
from ._fs import SysfsRoot

__all__ = [
    "ClusterInfo",
    "DeviceInfo",
    "Platform",
    "RailInfo",
    "TripInfo",
    "ZoneInfo",
    "discover",
    "estimated_rail_names",
    "read_clusters",
]

DeviceKind = Literal["gpu", "npu", "memory"]


@dataclass(frozen=True)
class ClusterInfo:
    """A CPU cluster (cpufreq policy)."""

    name: str
    """Domain name, ``cluster<first cpu>``."""
    policy: int
    cpus: tuple[int, ...]
    frequencies_khz: tuple[int, ...]
    """Ascending."""
    governor: str | None
    governors: tuple[str, ...]
    min_khz: int | None
    max_khz: int | None
    cur_khz: int | None
    capacity: int | None
    cpu_part: str | None
    transition_latency_ns: int | None
    path: str
    cpuinfo_max_khz: int | None = None
    """Hardware top frequency (``cpuinfo_max_freq``), whatever the current limits."""


@dataclass(frozen=True)
class DeviceInfo:
    """A GPU, NPU or memory-controller clock domain."""

    kind: DeviceKind
    name: str
    """The devfreq node name (``fb000000.gpu``, ``dmc``) or ``emc`` for Jetson bpmp."""
    frequencies_hz: tuple[int, ...]
    """Ascending. Jetson EMC: the kernel's rate table (``possible_rates``/``available_rates``)
    within bpmp's ``min_rate..max_rate``, or only those two rates when no table is readable."""
    max_freq_hz: int | None
    cur_freq_hz: int | None
    governor: str | None
    governors: tuple[str, ...]
    source: Literal["devfreq", "bpmp"]
    path: str
    """Root-relative resolved directory (devfreq node, or the bpmp clk dir)."""
    load_path: str | None = None
    """Where utilisation is read (RK ``load``, nvgpu ``load``, RK NPU debugfs, ``mc_all``)."""
    load_format: Literal["busy@hz", "permille", "rknpu", "mc_all"] | None = None
    of_node_name: str | None = None
    cores: int | None = None
    """NPU cores (from the debugfs load line), where known."""


@dataclass(frozen=True)
class TripInfo:
    index: int
    temp_c: float
    type: str
    hyst_c: float | None


@dataclass(frozen=True)
class ZoneInfo:
    index: int
    type: str
    temp_c: float | None
    """At discovery time; None when offline (``EAGAIN``/``-256000``) or absent."""
    policy: str | None
    trips: tuple[TripInfo, ...]
    passive_trip_c: float | None
    critical_trip_c: float | None
    path: str


@dataclass(frozen=True)
class RailInfo:
    name: str
    source: Literal["measured", "estimated"]
    """``measured`` by a sensor (INA3221, RAPL) or ``estimated`` by a model (no sensor on the board)."""
    kind: str
    sensor: str | None


@dataclass(frozen=True)
class Platform:
    """Everything discovered under one root. Frozen plain data; :meth:`to_json` for tools."""

    root: str
    soc: str | None
    model: str | None
    compatible: tuple[str, ...]
    l4t_release: str | None
    jetpack: str | None
    cpus: tuple[int, ...]
    """Online CPUs."""
    cpu_clusters: tuple[ClusterInfo, ...]
    devices: tuple[DeviceInfo, ...]
    thermal_zones: tuple[ZoneInfo, ...]
    power_rails: tuple[RailInfo, ...]
    npu_driver: str | None = None
    notes: tuple[str, ...] = ()
    """Human-readable caveats (e.g. "power is estimated: no sensor on this board")."""
    rails: tuple[power.PowerRail, ...] = field(default=(), repr=False, compare=False)
    """Sensor details for telemetry (paths); not part of :meth:`to_dict`."""

    def device(self, kind: str) -> DeviceInfo | None:
        """The first device of ``kind`` (``"gpu"``, ``"npu"``, ``"memory"``), or None."""
        return next((d for d in self.devices if d.kind == kind), None)

    @property
    def has_power_sensor(self) -> bool:
        return any(r.source == "measured" for r in self.power_rails)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples become lists)."""
        d = asdict(self)
        d.pop("rails", None)
        return d

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


#: RK3588 PMIC rails by domain: the RK806 regulator names of the Rock 5B device tree without
#: ``_s0`` (https://github.com/torvalds/linux/blob/master/arch/arm64/boot/dts/rockchip/rk3588-rock-5b.dts).
_RK3588_RAILS = {
    "cluster0": "vdd_cpu_lit",
    "cluster4": "vdd_cpu_big0",
    "cluster6": "vdd_cpu_big1",
    "gpu": "vdd_gpu",
    "npu": "vdd_npu",
    "memory": "vdd_ddr",
}


def estimated_rail_names(
    platform_soc: str | None, clusters: tuple[ClusterInfo, ...], devices: tuple[DeviceInfo, ...]
) -> tuple[str, ...]:
    """Rails a model estimates where no sensor exists: one per clock domain, then the board total.

    On RK3588 they carry the PMIC regulator names (``vdd_cpu_lit``, ``vdd_cpu_big0``,
    ``vdd_cpu_big1``, ``vdd_gpu``, ``vdd_npu``, ``vdd_ddr``) and the total is ``board``, as
    the twin's power model names them; elsewhere the domain names and ``total``.
    """
    domains = [c.name for c in clusters]
    domains += [kind for kind in ("gpu", "npu", "memory") if any(d.kind == kind for d in devices)]
    if platform_soc == "rk3588":
        return (*(_RK3588_RAILS.get(d, d) for d in domains), "board")
    return (*domains, "total")


def _orin_from_cpus(clusters: tuple[ClusterInfo, ...]) -> str | None:
    """Fallback when the device tree lacks the module number: CPU count and top clock."""
    n = sum(len(c.cpus) for c in clusters)
    top = max((c.frequencies_khz[-1] for c in clusters if c.frequencies_khz), default=0)
    if n == 12:
        return "orin-agx"
    if n in (6, 8) and top and top <= 1510400:
        return "orin-nano"
    if n in (6, 8):
        return "orin-nx"
    return None


def read_clusters(fs: SysfsRoot) -> tuple[ClusterInfo, ...]:
    """Every CPU cluster (cpufreq policy) under the root, by policy number; ``()`` without cpufreq.

    The one place clusters are discovered (:func:`discover` and
    :func:`hetsched.discover_cpu_clusters` both build on it).

    :raises SysfsPermissionError: a cpufreq file may not be read.
    :raises PathOutsideRootError: a link in the tree points outside the root.
    """
    return tuple(
        ClusterInfo(
            name=p.name,
            policy=p.policy,
            cpus=p.cpus,
            frequencies_khz=p.available_khz,
            governor=p.governor,
            governors=p.governors,
            min_khz=p.min_khz,
            max_khz=p.max_khz,
            cur_khz=p.cur_khz,
            capacity=p.capacity,
            cpu_part=p.cpu_part,
            transition_latency_ns=p.transition_latency_ns,
            path=p.path,
            cpuinfo_max_khz=p.cpuinfo_max_khz,
        )
        for p in cpufreq.read_policies(fs)
    )


def _devices(fs: SysfsRoot, notes: list[str]) -> tuple[DeviceInfo, ...]:
    out: list[DeviceInfo] = []
    nodes = devfreq.read_devices(fs)
    for node in nodes:
        if node.kind == "other":
            continue  # video codecs, display: not scheduling targets
        load_path: str | None = f"{node.path}/load" if node.has_load else None
        load_format: Any = "busy@hz" if node.has_load else None
        cores = None
        if node.kind == "gpu" and load_path is None:
            load_path = jetson.find_gpu_load_path(fs, node)
            load_format = "permille" if load_path else None
        if node.kind == "npu":
            npu_load = rknpu.find_npu_load_path(fs)
            if npu_load is not None:
                load_path, load_format = npu_load, "rknpu"
                try:
                    cores = len(rknpu.parse_npu_load(fs.read_text(npu_load))) or None
                except SysfsPermissionError:
                    notes.append(f"NPU load {npu_load} is not readable (debugfs is root-only)")
                    load_path, load_format = (f"{node.path}/load", "busy@hz") if node.has_load else (None, None)
        out.append(
            DeviceInfo(
                kind=node.kind,
                name=node.name,
                frequencies_hz=node.available_hz,
                max_freq_hz=node.max_freq_hz,
                cur_freq_hz=node.cur_hz,
                governor=node.governor,
                governors=node.governors,
                source="devfreq",
                path=node.path,
                load_path=load_path,
                load_format=load_format,
                of_node_name=node.of_node_name,
                cores=cores,
            )
        )
    if not any(d.kind == "memory" for d in out):
        try:
            emc = jetson.read_emc(fs)
        except SysfsPermissionError:
            emc = None
            notes.append("EMC clock is in bpmp debugfs, which is root-only")
        if emc is not None:
            rates = jetson.emc_rates(emc)
            if not emc.available_hz:
                notes.append(
                    "EMC publishes no rate table (possible_rates, available_rates): only min_rate and max_rate are offered"
                )
            out.append(
                DeviceInfo(
                    kind="memory",
                    name="emc",
                    frequencies_hz=rates,
                    max_freq_hz=emc.max_rate_hz,
                    cur_freq_hz=emc.rate_hz,
                    governor=None,
                    governors=(),
                    source="bpmp",
                    path=jetson.EMC_DIR,
                    load_path=emc.activity_path,
                    load_format="mc_all" if emc.activity_path else None,
                )
            )
    order = {"gpu": 0, "npu": 1, "memory": 2}
    return tuple(sorted(out, key=lambda d: (order[d.kind], d.name)))


def _zones(fs: SysfsRoot) -> tuple[ZoneInfo, ...]:
    out = []
    for z in thermal.read_zones(fs):
        out.append(
            ZoneInfo(
                index=z.index,
                type=z.type,
                temp_c=thermal.read_temp_c(fs, z),
                policy=z.policy,
                trips=tuple(TripInfo(t.index, t.temp_c, t.type, t.hyst_c) for t in z.trips),
                passive_trip_c=z.passive_trip_c,
                critical_trip_c=z.critical_trip_c,
                path=z.path,
            )
        )
    return tuple(out)


def _online_cpus(fs: SysfsRoot, clusters: tuple[ClusterInfo, ...]) -> tuple[int, ...]:
    text = fs.read_text("sys/devices/system/cpu/online")
    if text:
        try:
            return cpufreq.parse_cpu_list(text)
        except ValueError:
            pass
    return tuple(sorted({c for cl in clusters for c in cl.cpus}))


def discover(root: str | os.PathLike[str] | SysfsRoot = "/") -> Platform:
    """Describe the board under ``root``. Reads only; never raises for a missing subsystem.

    :raises SysfsError: ``root`` is not a directory.
    :raises SysfsPermissionError: a sysfs file needed to describe a present subsystem
        is unreadable (debugfs-only extras are skipped with a note instead).
    :raises PathOutsideRootError: a link in the tree points outside the root.
    """
    fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    notes: list[str] = []
    compatible = soc.read_compatible(fs)
    release_text = fs.read_text("etc/nv_tegra_release")
    release = jetson.parse_nv_tegra_release(release_text) if release_text else None
    clusters = read_clusters(fs)
    soc_name = soc.identify_soc(compatible, release_text)
    if soc_name is None and release is not None:
        soc_name = _orin_from_cpus(clusters)
        if soc_name:
            notes.append(f"SoC {soc_name} inferred from the CPU topology (device tree lacks the module number)")
    devices = _devices(fs, notes)
    zones = _zones(fs)
    measured = tuple(power.read_rails(fs))
    if any(r.kind in ("hwmon", "iio") for r in measured):
        rails = measured
    elif soc_name is not None:
        # An SoC board without an on-board sensor (RK3588): a model estimates per domain.
        rails = (*tuple(power.estimated_rails(estimated_rail_names(soc_name, clusters, devices))), *measured)
        notes.append("power is estimated by a model: this board has no power sensor")
    else:
        rails = measured
    try:
        npu_driver = rknpu.read_npu_version(fs)
    except SysfsPermissionError:
        npu_driver = None
    return Platform(
        root=str(fs.root),
        soc=soc_name,
        model=soc.read_model(fs),
        compatible=compatible,
        l4t_release=release.version if release else None,
        jetpack=release.jetpack if release else None,
        cpus=_online_cpus(fs, clusters),
        cpu_clusters=clusters,
        devices=devices,
        thermal_zones=zones,
        power_rails=tuple(RailInfo(r.name, r.source, r.kind, r.sensor) for r in rails),
        npu_driver=npu_driver,
        notes=tuple(notes),
        rails=rails,
    )
