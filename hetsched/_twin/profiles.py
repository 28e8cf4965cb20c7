"""SoC profiles: the twin's board data, each figure with where it came from.

A profile is plain frozen data. Figures come from the project's reference notes
(``/work/shared/reference/soc-sysfs.md`` and ``dvfs.md``, which cite vendor device
trees, nvpmodel confs and published measurements). Where the notes give no figure the
value is still needed by the model; such values are listed in :attr:`SocProfile.assumed`
(key = dotted field path, value = why that number) so nobody mistakes them for data.

Units: frequencies in Hz, voltages in mV, power in W, temperatures in degrees C,
thermal resistance in K/W, heat capacity in J/K, times in seconds.

Energy-model coefficient ``capacitance`` follows the kernel's device-tree
``dynamic-power-coefficient``: one unit (core) fully busy draws
``capacitance * mV**2 * MHz / 1e6`` microwatts (``drivers/opp/of.c: _get_power``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from .._errors import UnknownSocError

__all__ = [
    "DomainProfile",
    "NvpModel",
    "Opp",
    "RailProfile",
    "SocProfile",
    "TempCap",
    "ThermalLayout",
    "ThermalNode",
    "ThrottleInstance",
    "Trip",
    "ZoneProfile",
    "get_profile",
    "known_socs",
    "rk3588_profile",
]

DomainKind = Literal["cpu", "gpu", "npu", "memory"]

_SOC_SYSFS = "/work/shared/reference/soc-sysfs.md"
_DVFS = "/work/shared/reference/dvfs.md"
_SEEDS = "/work/shared/reference/seeds-digest.md"


def _ro(d: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Opp:
    """One operating performance point."""

    freq_hz: int
    voltage_mv: float


@dataclass(frozen=True)
class DomainProfile:
    """One clock domain: a CPU cluster (cpufreq policy), GPU, NPU or memory controller."""

    name: str
    kind: DomainKind
    opps: tuple[Opp, ...]
    """Ascending by frequency."""
    capacitance: float
    """Energy-model coefficient per unit, uW / (mV^2 * MHz)."""
    units: int = 1
    """Cores (CPU), NPU cores, or 1. Utilisation 1.0 means every unit busy."""
    idle_activity: float = 0.02
    """Fraction of full dynamic power drawn at zero utilisation (clock tree, refresh)."""
    leak_w: float = 0.0
    """Leakage of the whole domain at 25 C and its top voltage."""
    leak_per_c: float = 0.02
    """Exponential growth of leakage per degree C (leakage doubles every ~35 C)."""
    switch_latency_s: float = 1e-4
    """Time for a new clock to take effect (DVFS transition latency)."""
    transition_latency_ns: int = 40000
    """What ``cpuinfo_transition_latency`` reads (cpufreq domains only)."""
    thermal_node: str = "soc"
    boot_hz: int = 0
    """Clock the board boots at (and idles at under the default governor's idle)."""
    default_min_hz: int | None = None
    """``scaling_min_freq`` at boot when it is not the lowest OPP (nvpmodel MIN_FREQ)."""
    cpus: tuple[int, ...] = ()
    cpu_part: str = ""
    """``/proc/cpuinfo`` "CPU part" (0xd05 A55, 0xd0b A76, 0xd42 A78AE)."""
    core_name: str = ""
    capacity_dmips_mhz: int = 1024
    bytes_per_cycle: float = 0.0
    """Memory domains: bytes per clock at 100 % bus utilisation (bus width x data rate)."""
    bandwidth_efficiency: float = 0.7
    """Memory domains: achievable fraction of the theoretical bandwidth."""
    ops_per_cycle: float = 1.0
    """Compute domains: useful ops (MAC = 2) per clock for the whole domain at full utilisation."""
    gates_when_idle: bool = False
    """Power-gated at zero utilisation (no leakage, no idle activity): Mali, RKNPU, Jetson GPU railgating.
    Software can keep the block powered (Jetson ``railgate_enable=0``, as ``jetson_clocks`` does):
    :meth:`~hetsched._twin.sim.SimBoard.set_power_gating`."""
    deep_idle_leak_fraction: float = 1.0
    """CPU clusters: fraction of the cluster's leakage still drawn by its *idle* cores while cpuidle
    may use its deep state (``c7`` on Tegra, ``cpu-sleep`` on Rockchip power the core down; the
    cluster's shared L3/DSU stays up). With cpuidle disabled (``jetson_clocks``), idle cores sit in
    WFI, which gates the core clock but not its power: full leakage. 1.0: no deep idle state."""

    @property
    def available_hz(self) -> tuple[int, ...]:
        return tuple(o.freq_hz for o in self.opps)

    @property
    def max_hz(self) -> int:
        return self.opps[-1].freq_hz

    @property
    def min_hz(self) -> int:
        return self.opps[0].freq_hz

    def voltage_at(self, hz: int) -> float:
        """Voltage of the OPP at ``hz`` (nearest OPP at or above it)."""
        for o in self.opps:
            if o.freq_hz >= hz:
                return o.voltage_mv
        return self.opps[-1].voltage_mv

    def full_power_w(self, hz: int) -> float:
        """Dynamic power with every unit fully busy at ``hz`` (energy-model power x units)."""
        v = self.voltage_at(hz)
        return self.capacitance * v * v * (hz / 1e6) / 1e12 * self.units

    def bandwidth_bps(self, hz: int) -> float:
        """Achievable DRAM bandwidth at memory clock ``hz`` (memory domains)."""
        return hz * self.bytes_per_cycle * self.bandwidth_efficiency


@dataclass(frozen=True)
class ThermalNode:
    """A node of the RC thermal network: heat capacity and resistance to its parent."""

    name: str
    capacitance_j_per_k: float
    resistance_k_per_w: float
    parent: str = "ambient"
    """Another node's name, or "ambient"."""


@dataclass(frozen=True)
class Trip:
    temp_c: float
    type: Literal["passive", "active", "hot", "critical"]
    hyst_c: float = 0.0


@dataclass(frozen=True)
class ZoneProfile:
    """A thermal zone as sysfs shows it."""

    type: str
    """``thermal_zoneN/type``."""
    nodes: tuple[str, ...]
    """Thermal nodes it senses (the hottest is reported; tj-like zones list several)."""
    trips: tuple[Trip, ...] = ()
    policy: str = "step_wise"
    offline: bool = False
    """Fused off / absent (Orin NX/Nano cv zones): reads fail with EAGAIN or -256000."""
    hwmon: bool = False
    """Also exposed as hwmon (RK3588 vendor: name = type with '-' -> '_')."""
    sustainable_power_w: float | None = None

    @property
    def passive_trip_c(self) -> float | None:
        passive = [t.temp_c for t in self.trips if t.type == "passive"]
        return min(passive) if passive else None

    @property
    def critical_trip_c(self) -> float | None:
        crit = [t.temp_c for t in self.trips if t.type == "critical"]
        return min(crit) if crit else None


@dataclass(frozen=True)
class ThrottleInstance:
    """Kernel throttling: a zone's governor acting on cooling devices (clock domains)."""

    zone: int
    """Index into :attr:`ThermalLayout.zones`."""
    governor: Literal["step_wise", "power_allocator"]
    actors: tuple[str, ...]
    """Domain names used as cooling devices."""
    trip: int
    """step_wise: the passive trip index it acts on. power_allocator: the control trip."""
    switch_on_trip: int | None = None
    """power_allocator: the switch-on trip index."""
    sustainable_power_w: float = 0.0
    polling_s: float = 0.1


@dataclass(frozen=True)
class TempCap:
    """Vendor OPP-table temperature cap (Rockchip ``rockchip,high-temp``)."""

    domain: str
    node: str
    above_c: float
    max_hz: int
    hyst_c: float = 2.0


@dataclass(frozen=True)
class ThermalLayout:
    """Zones and kernel throttling of one software variant (vendor/mainline, JP5/JP6)."""

    zones: tuple[ZoneProfile, ...]
    throttling: tuple[ThrottleInstance, ...]
    caps: tuple[TempCap, ...] = ()
    passive_polling_s: float = 0.02


@dataclass(frozen=True)
class RailProfile:
    """A power rail, measured by a sensor (INA3221) or estimated from the model."""

    name: str
    shares: Mapping[str, float]
    """Domain name -> fraction of that domain's power carried by this rail."""
    static_w: float = 0.0
    """Rail power that no modelled domain explains (uncore, PHYs, regulators)."""
    total: bool = False
    """True for the board/module input rail: everything, divided by the converter efficiency."""
    measured: bool = True
    ina_device: str | None = None
    """INA3221 i2c device (``1-0040``) and channel carrying it."""
    ina_channel: int = 0


@dataclass(frozen=True)
class NvpModel:
    """One nvpmodel power mode (Orin)."""

    id: int
    name: str
    cpus_online: int
    cpu_max_hz: int
    gpu_max_hz: int
    emc_max_hz: int
    """0 = no cap."""


@dataclass(frozen=True)
class SocProfile:
    """Everything the twin knows about one board."""

    name: str
    family: Literal["rockchip", "tegra"]
    description: str
    domains: tuple[DomainProfile, ...]
    nodes: tuple[ThermalNode, ...]
    layouts: Mapping[str, ThermalLayout]
    """Variant name -> thermal layout; the first key is the default variant."""
    rails: tuple[RailProfile, ...]
    board_static_w: float
    """Board/module power no domain explains (DRAM background, PHYs, regulators at idle)."""
    converter_efficiency: float
    """Input-rail regulator efficiency: input power = (domains + static) / efficiency."""
    compatible: tuple[str, ...]
    model: str
    soc_static_w: float = 0.0
    """Part of ``board_static_w`` dissipated inside the SoC package (uncore, logic rail): heats the root node."""
    temp_step_c: float = 0.001
    """Thermal sensor resolution."""
    nvpmodel: tuple[NvpModel, ...] = ()
    nvpmodel_default: int | None = None
    nvpmodel_conf: str | None = None
    """File name under ``/etc/nvpmodel/`` (Orin)."""
    sources: tuple[str, ...] = ()
    assumed: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Dotted field path -> why that figure was assumed (the references lack it)."""

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.layouts)

    @property
    def default_variant(self) -> str:
        return next(iter(self.layouts))

    def domain(self, name: str) -> DomainProfile:
        """The domain called ``name``; raises :class:`UnknownSocError`-free ``KeyError`` if absent."""
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(name)

    def layout(self, variant: str | None = None) -> ThermalLayout:
        """The thermal layout of ``variant`` (default variant when None).

        Raises:
            UnknownSocError: ``variant`` is not one of :attr:`variants`.
        """
        key = self.default_variant if variant is None else variant
        try:
            return self.layouts[key]
        except KeyError:
            raise UnknownSocError(
                f"{self.name} has no variant {variant!r}; known variants: {', '.join(self.variants)}"
            ) from None

    @property
    def cpu_count(self) -> int:
        return sum(len(d.cpus) for d in self.domains if d.kind == "cpu")


# --------------------------------------------------------------------------- RK3588

_A55_OPPS = (
    (408, 675), (600, 675), (816, 675), (1008, 675),
    (1200, 712.5), (1416, 762.5), (1608, 850), (1800, 950),
)  # fmt: skip
_A76_OPPS = (
    (408, 675), (600, 675), (816, 675), (1008, 675), (1200, 675),
    (1416, 725), (1608, 762.5), (1800, 850), (2016, 925), (2208, 987.5),
)  # fmt: skip
_A76_BINS = (2256000, 2304000, 2352000, 2400000)


def _opps(table: tuple[tuple[float, float], ...], scale: int) -> tuple[Opp, ...]:
    return tuple(Opp(int(f * scale), float(v)) for f, v in table)


def rk3588_profile(*, a76_bin_khz: int = 2256000) -> SocProfile:
    """The RK3588 (Rock 5B / Orange Pi 5, vendor BSP 6.1) profile.

    ``a76_bin_khz`` selects the chip's PVTM bin, i.e. the one top A76 OPP the chip shows
    (2256000, 2304000, 2352000 or 2400000 kHz, all at 1000 mV).

    Raises:
        UnknownSocError: ``a76_bin_khz`` is not one of the binned OPPs.
    """
    if a76_bin_khz not in _A76_BINS:
        raise UnknownSocError(f"rk3588 has no A76 bin {a76_bin_khz} kHz; bins: {_A76_BINS}")
    a55 = _opps(_A55_OPPS, 1_000_000)
    a76 = (*_opps(_A76_OPPS, 1_000_000), Opp(a76_bin_khz * 1000, 1000.0))
    gpu = tuple(
        Opp(f * 100_000_000, v)
        for f, v in ((3, 675), (4, 675), (5, 675), (6, 675), (7, 700), (8, 750), (9, 800), (10, 850))
    )
    npu = tuple(
        Opp(f * 100_000_000, v)
        for f, v in ((3, 700), (4, 700), (5, 700), (6, 700), (7, 700), (8, 750), (9, 800), (10, 850))
    )
    dmc = (Opp(528_000_000, 675), Opp(1_068_000_000, 725), Opp(1_560_000_000, 800), Opp(2_112_000_000, 850))
    cpu_common = dict(kind="cpu", transition_latency_ns=40000, boot_hz=816_000_000, deep_idle_leak_fraction=0.5)
    domains = (
        DomainProfile(
            name="cluster0", opps=a55, capacitance=228.0, units=4, cpus=(0, 1, 2, 3),
            cpu_part="0xd05", core_name="Cortex-A55", capacity_dmips_mhz=530,
            leak_w=0.04, switch_latency_s=84e-6, thermal_node="littlecore", ops_per_cycle=4 * 2.0,
            **cpu_common,  # type: ignore[arg-type]
        ),
        DomainProfile(
            name="cluster4", opps=a76, capacitance=416.0, units=2, cpus=(4, 5),
            cpu_part="0xd0b", core_name="Cortex-A76", capacity_dmips_mhz=1024,
            leak_w=0.06, switch_latency_s=324e-6, thermal_node="bigcore0", ops_per_cycle=2 * 4.0,
            **cpu_common,  # type: ignore[arg-type]
        ),
        DomainProfile(
            name="cluster6", opps=a76, capacitance=416.0, units=2, cpus=(6, 7),
            cpu_part="0xd0b", core_name="Cortex-A76", capacity_dmips_mhz=1024,
            leak_w=0.06, switch_latency_s=324e-6, thermal_node="bigcore1", ops_per_cycle=2 * 4.0,
            **cpu_common,  # type: ignore[arg-type]
        ),
        DomainProfile(
            name="gpu", kind="gpu", opps=gpu, capacitance=2982.0, units=1, idle_activity=0.01,
            leak_w=0.05, switch_latency_s=1e-3, thermal_node="gpu", boot_hz=300_000_000,
            ops_per_cycle=512.0, gates_when_idle=True,
        ),
        DomainProfile(
            name="npu", kind="npu", opps=npu, capacitance=920.0, units=3, idle_activity=0.01,
            leak_w=0.04, switch_latency_s=1e-3, thermal_node="npu", boot_hz=1_000_000_000,
            ops_per_cycle=3 * 2048.0, gates_when_idle=True,
        ),
        DomainProfile(
            name="memory", kind="memory", opps=dmc, capacitance=980.0, units=1, idle_activity=0.2,
            leak_w=0.03, switch_latency_s=5e-3, thermal_node="center", boot_hz=528_000_000,
            bytes_per_cycle=16.0, bandwidth_efficiency=0.7,
        ),
    )
    nodes = (
        ThermalNode("soc", capacitance_j_per_k=14.0, resistance_k_per_w=5.5),
        ThermalNode("littlecore", 0.6, 2.5, parent="soc"),
        ThermalNode("bigcore0", 0.6, 2.0, parent="soc"),
        ThermalNode("bigcore1", 0.6, 2.0, parent="soc"),
        ThermalNode("center", 0.8, 1.0, parent="soc"),
        ThermalNode("gpu", 0.8, 1.2, parent="soc"),
        ThermalNode("npu", 0.8, 1.2, parent="soc"),
    )
    crit = Trip(115.0, "critical", 2.0)
    vendor = ThermalLayout(
        zones=(
            ZoneProfile(
                "soc-thermal", ("soc",), (Trip(75.0, "passive", 2.0), Trip(85.0, "passive", 2.0), crit),
                policy="power_allocator", hwmon=True, sustainable_power_w=2.1,
            ),
            ZoneProfile("bigcore0-thermal", ("bigcore0",), (crit,), hwmon=True),
            ZoneProfile("bigcore1-thermal", ("bigcore1",), (crit,), hwmon=True),
            ZoneProfile("littlecore-thermal", ("littlecore",), (crit,), hwmon=True),
            ZoneProfile("center-thermal", ("center",), (crit,), hwmon=True),
            ZoneProfile("gpu-thermal", ("gpu",), (crit,), hwmon=True),
            ZoneProfile("npu-thermal", ("npu",), (crit,), hwmon=True),
        ),
        throttling=(
            ThrottleInstance(
                zone=0, governor="power_allocator", actors=("cluster0", "cluster4", "cluster6", "gpu"),
                trip=1, switch_on_trip=0, sustainable_power_w=2.1, polling_s=0.02,
            ),
        ),
        caps=(
            TempCap("cluster0", "soc", 85.0, 1_608_000_000),
            TempCap("cluster4", "soc", 85.0, 2_208_000_000),
            TempCap("cluster6", "soc", 85.0, 2_208_000_000),
            TempCap("gpu", "soc", 85.0, 800_000_000),
            TempCap("npu", "soc", 85.0, 800_000_000),
        ),
        passive_polling_s=0.02,
    )
    alert = (Trip(75.0, "passive", 2.0), Trip(85.0, "passive", 2.0), crit)
    mainline = ThermalLayout(
        zones=(
            ZoneProfile("package-thermal", ("soc",), (crit,)),
            ZoneProfile("bigcore0-thermal", ("bigcore0",), alert),
            ZoneProfile("bigcore2-thermal", ("bigcore1",), alert),
            ZoneProfile("littlecore-thermal", ("littlecore",), alert),
            ZoneProfile("center-thermal", ("center",), (crit,)),
            ZoneProfile("gpu-thermal", ("gpu",), (Trip(85.0, "passive", 2.0), crit)),
            ZoneProfile("npu-thermal", ("npu",), (crit,)),
        ),
        throttling=(
            ThrottleInstance(zone=1, governor="step_wise", actors=("cluster4",), trip=1, polling_s=0.1),
            ThrottleInstance(zone=2, governor="step_wise", actors=("cluster6",), trip=1, polling_s=0.1),
            ThrottleInstance(zone=3, governor="step_wise", actors=("cluster0",), trip=1, polling_s=0.1),
            ThrottleInstance(zone=5, governor="step_wise", actors=("gpu",), trip=0, polling_s=0.1),
        ),
        passive_polling_s=0.1,
    )
    rails = (
        RailProfile("vdd_cpu_lit", {"cluster0": 1.0}, measured=False),
        RailProfile("vdd_cpu_big0", {"cluster4": 1.0}, measured=False),
        RailProfile("vdd_cpu_big1", {"cluster6": 1.0}, measured=False),
        RailProfile("vdd_gpu", {"gpu": 1.0}, measured=False),
        RailProfile("vdd_npu", {"npu": 1.0}, measured=False),
        RailProfile("vdd_ddr", {"memory": 1.0}, measured=False),
        RailProfile(
            "board", {d.name: 1.0 for d in domains}, total=True, measured=False
        ),
    )
    return SocProfile(
        name="rk3588",
        family="rockchip",
        description="Rockchip RK3588 (Rock 5B class): A55x4 + A76x2 + A76x2, Mali-G610 MP4, 3-core NPU, LPDDR4x DMC",
        domains=domains,
        nodes=nodes,
        layouts=MappingProxyType({"vendor": vendor, "mainline": mainline}),
        rails=rails,
        board_static_w=1.05,
        converter_efficiency=0.88,
        soc_static_w=0.45,
        compatible=("radxa,rock-5b", "rockchip,rk3588"),
        model="Radxa ROCK 5B",
        sources=(
            f"{_SOC_SYSFS} §1.1 (cpufreq policies, OPP kHz/mV, A76 PVTM bins), §1.2 (devfreq lists, GPU/NPU/DMC mV), "
            "§1.4 (zones, trips, sustainable-power 2100 mW, polling), §1.5 (no power sensor), Fixture spec",
            f"{_DVFS} §1 (IPA k_pu/k_po, step_wise), §3 (transition latencies 84/324 us, high-temp caps, "
            "ROCK 5B idle < 2 W and +6 W all-core), §6 (EM coefficients C=228/416/2982)",
        ),
        assumed=_ro({
            "domains.npu.capacitance": "no NPU coefficient is published (dvfs.md §6 'Still open'); "
            "920 per core puts the 3-core NPU at ~2 W fully busy at 1 GHz",
            "domains.memory.opps[2112MHz].voltage_mv": "the LPDDR4x top DMC OPP voltage is not listed; 850 mV "
            "interpolated between 1560@800 and 2750@875",
            "domains.memory.capacitance": "DMC+DRAM power not published; ~1.5 W at full bandwidth at 2112 MHz",
            "domains.*.leak_w": "leakage is not published; small values keeping idle board power < 2 W",
            "domains.*.leak_per_c": "leakage doubling every ~35 C (generic CMOS rule of thumb)",
            "domains.*.idle_activity": "clock-tree / refresh activity at zero utilisation",
            "domains.cluster*.deep_idle_leak_fraction": "not published: cpu-sleep powers an idle core down; "
            "0.5 assumed for what stays (the shared L3/DSU, and idle spells shorter than the deep state's "
            "target residency, which a utilisation-averaged model cannot see)",
            "domains.gpu.switch_latency_s": "devfreq transition latency not published (1 ms)",
            "domains.memory.switch_latency_s": "DMC frequency change latency not published (5 ms)",
            "domains.memory.bandwidth_efficiency": "70 % of LPDDR4x-4224 x 64-bit theoretical",
            "domains.*.ops_per_cycle": "used only to turn FLOPs into cycles for simulated work",
            "nodes": "thermal R/C are not published; bare board with a small heatsink: package 5.5 K/W, "
            "tau ~77 s; local hotspots 1-2.5 K/W",
            "soc_static_w": "uncore/logic-rail share of the static power, dissipated in the package",
            "board_static_w": "DRAM background, PHYs and regulators at idle, so idle board power is ~1.8 W (< 2 W)",
            "converter_efficiency": "5 V/12 V input converters, 88 %",
            "layouts.*.caps.hyst_c": "release of the rockchip high-temp limit 2 C below 85 C",
            "rails": "RK3588 boards have no power sensor: every rail is estimated from the model",
        }),
    )


# --------------------------------------------------------------------------- Orin

def _orin_cpu_khz(max_khz: int) -> tuple[int, ...]:
    steps = [115200 + 76800 * i for i in range(40)]
    out = [s for s in steps if s < max_khz]
    out.append(max_khz)
    return tuple(out)


def _ramp_opps(freqs_hz: tuple[int, ...], knee_hz: int, v_floor: float, v_top: float, top_hz: int) -> tuple[Opp, ...]:
    """Assumed V(f): the voltage floor up to the knee, then linear to ``v_top`` at ``top_hz``."""
    out = []
    for f in freqs_hz:
        if f <= knee_hz:
            v = v_floor
        else:
            v = v_floor + (v_top - v_floor) * (f - knee_hz) / (top_hz - knee_hz)
        out.append(Opp(f, round(v, 1)))
    return tuple(out)


_ORIN_EMC = (204_000_000, 665_600_000, 2_133_000_000, 3_199_000_000)
_ORIN_GPU_JP6_NX = tuple(306_000_000 + 102_000_000 * i for i in range(7))
_ORIN_GPU_AGX = (*(306_000_000 + 102_000_000 * i for i in range(10)), 1_300_500_000)
_ORIN_GPU_NANO = (306_000_000, 408_000_000, 510_000_000, 612_000_000, 624_750_000)


def _orin(
    *,
    name: str,
    description: str,
    model: str,
    compatible: tuple[str, ...],
    clusters: tuple[tuple[int, ...], ...],
    cpu_max_khz: int,
    gpu_hz: tuple[int, ...],
    gpu_capacitance: float,
    gpu_ops_per_cycle: float,
    emc_hz: tuple[int, ...],
    emc_bytes_per_cycle: float,
    mem_capacitance: float,
    cv_online: bool,
    rails: tuple[RailProfile, ...],
    board_static_w: float,
    soc_static_w: float,
    package_r: float,
    package_c: float,
    nvpmodel: tuple[NvpModel, ...],
    nvpmodel_default: int,
    nvpmodel_conf: str,
    extra_sources: tuple[str, ...] = (),
    extra_assumed: Mapping[str, str] | None = None,
) -> SocProfile:
    cpu_hz = tuple(k * 1000 for k in _orin_cpu_khz(cpu_max_khz))
    cpu_opps = _ramp_opps(cpu_hz, 729_600_000, 600.0, 950.0 if cpu_max_khz <= 1984000 else 1000.0, cpu_hz[-1])
    domains: list[DomainProfile] = []
    for _i, cpus in enumerate(clusters):
        domains.append(
            DomainProfile(
                name=f"cluster{cpus[0]}", kind="cpu", opps=cpu_opps, capacitance=560.0, units=len(cpus),
                idle_activity=0.02, leak_w=0.05 * len(cpus), switch_latency_s=1e-3,
                transition_latency_ns=1_000_000, thermal_node="cpu", boot_hz=729_600_000,
                default_min_hz=729_600_000, cpus=cpus, cpu_part="0xd42", core_name="Cortex-A78AE",
                capacity_dmips_mhz=1024, ops_per_cycle=len(cpus) * 4.0, deep_idle_leak_fraction=0.5,
            )
        )
    domains.append(
        DomainProfile(
            name="gpu", kind="gpu", opps=_ramp_opps(gpu_hz, 306_000_000, 600.0, 850.0 if gpu_hz[-1] < 1e9 else 1000.0, gpu_hz[-1]),
            capacitance=gpu_capacitance, units=1, idle_activity=0.0, leak_w=0.25 * gpu_capacitance / 10550.0,
            switch_latency_s=5e-3, thermal_node="gpu", boot_hz=gpu_hz[0], ops_per_cycle=gpu_ops_per_cycle,
            gates_when_idle=True,
        )
    )
    domains.append(
        DomainProfile(
            name="memory", kind="memory", opps=tuple(Opp(f, 1000.0) for f in emc_hz),
            capacitance=mem_capacitance, units=1, idle_activity=0.12, leak_w=0.05, switch_latency_s=8e-3,
            thermal_node="soc1", boot_hz=emc_hz[-2] if len(emc_hz) > 3 else emc_hz[-1],
            bytes_per_cycle=emc_bytes_per_cycle, bandwidth_efficiency=0.7,
        )
    )
    nodes = (
        ThermalNode("package", package_c, package_r),
        ThermalNode("cpu", 0.8, 1.0, parent="package"),
        ThermalNode("gpu", 0.8, 0.9, parent="package"),
        ThermalNode("cv0", 0.3, 1.5, parent="package"),
        ThermalNode("cv1", 0.3, 1.5, parent="package"),
        ThermalNode("cv2", 0.3, 1.5, parent="package"),
        ThermalNode("soc0", 0.5, 0.8, parent="package"),
        ThermalNode("soc1", 0.5, 0.8, parent="package"),
        ThermalNode("soc2", 0.5, 0.8, parent="package"),
    )
    trips = (Trip(87.0, "passive", 2.0), Trip(97.0, "critical", 0.0))
    jp6_names = ("cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal",
                 "soc0-thermal", "soc1-thermal", "soc2-thermal", "tj-thermal")  # fmt: skip
    jp5_names = ("CPU-therm", "GPU-therm", "CV0-therm", "CV1-therm", "CV2-therm",
                 "SOC0-therm", "SOC1-therm", "SOC2-therm", "tj-therm")  # fmt: skip
    node_of = ("cpu", "gpu", "cv0", "cv1", "cv2", "soc0", "soc1", "soc2")

    def zones(names: tuple[str, ...], board_zones: bool) -> tuple[ZoneProfile, ...]:
        zs = [
            ZoneProfile(n, (node,), trips, offline=(node.startswith("cv") and not cv_online))
            for n, node in zip(names, node_of)
        ]
        zs.append(ZoneProfile(names[-1], tuple(n for n in node_of if cv_online or not n.startswith("cv")), trips))
        if board_zones:
            zs.append(ZoneProfile("Tboard_tegra", ("package",), ()))
            zs.append(ZoneProfile("Tdiode_tegra", ("package",), ()))
        return tuple(zs)

    cpu_actors = tuple(d.name for d in domains if d.kind == "cpu")
    throttling = (
        ThrottleInstance(zone=0, governor="step_wise", actors=cpu_actors, trip=0, polling_s=0.1),
        ThrottleInstance(zone=1, governor="step_wise", actors=("gpu",), trip=0, polling_s=0.1),
    )
    agx = len(clusters) == 3
    layouts = {
        "jp6": ThermalLayout(zones(jp6_names, False), throttling, passive_polling_s=0.1),
        "jp5": ThermalLayout(zones(jp5_names, agx), throttling, passive_polling_s=0.1),
    }
    assumed = {
        "domains.cluster*.opps.voltage_mv": "Orin voltages are BPMP-owned and unpublished (dvfs.md §6); "
        "assumed 600 mV floor up to 729.6 MHz, linear to 950 mV (1000 mV AGX) at the top",
        "domains.cluster*.capacitance": "fitted so 12 AGX cores at MAXN draw ~15 W (dvfs.md §3 AGX CPU rail 15.2 W)",
        "domains.gpu.opps.voltage_mv": "unpublished; 600 mV floor at 306 MHz, linear to 850 mV (1000 mV AGX)",
        "domains.gpu.capacitance": "scaled from the AGX MAXN GPU rail (40.4 W) by cores, clock and assumed voltage, "
        "checked against the Orin NX YOLOv5s split (GPU 2.9 W)",
        "domains.memory": "EMC/DRAM power unpublished; fitted to the Orin NX YOLOv5s DDR 1.4 W; V fixed",
        "domains.*.leak_w": "unpublished; sized so idle VDD_CPU_GPU_CV is ~0.5 W as in the tegrastats sample line",
        "domains.cluster*.deep_idle_leak_fraction": "not published: c7 powers an idle A78AE core down; 0.5 "
        "assumed for what stays (the shared L3/DSU, and idle spells shorter than c7's target residency), "
        "which keeps the YOLOv5s CPU figure (seeds-digest §B) within calibration; jetson_clocks disables "
        "c7 (soc-sysfs.md §2.6), leaving WFI: full leakage",
        "domains.gpu.idle_activity": "0: an ungated idle GPU (railgate_enable=0) is modelled by its leakage "
        "only (engine-level clock gating assumed to stop its clocks); a lower bound on its idle power",
        "domains.cluster*.transition_latency_ns": "cpuinfo_transition_latency not given for Orin; 1 ms (the "
        "measured time for a CPU clock to take effect, dvfs.md §3)",
        "nodes": "thermal R/C unpublished; dev-kit fan heatsink",
        "layouts.*.zones.trips": "Orin trip temperatures are not confirmed (dvfs.md §3): throttle 87 C and "
        "shutdown 97 C from the secondary source in soc-sysfs.md §2.4; hysteresis 2 C",
        "layouts.*.throttling": "BPMP throttles in firmware; modelled as kernel step_wise on cpu/gpu zones",
        "soc_static_w": "VDD_SOC static share (tegrastats idle VDD_SOC ~1.3 W), dissipated in the package",
        "temp_step_c": "BPMP thermal resolution taken as 1/32 C (tegrastats shows e.g. 48.125C)",
        "board_static_w": "module static power so idle VDD_IN lands in the published 3.3-5.8 W range",
        "converter_efficiency": "module input converters, 88 %",
    }
    if extra_assumed:
        assumed.update(extra_assumed)
    return SocProfile(
        name=name,
        family="tegra",
        description=description,
        domains=tuple(domains),
        nodes=nodes,
        layouts=MappingProxyType(layouts),
        rails=rails,
        board_static_w=board_static_w,
        converter_efficiency=0.88,
        soc_static_w=soc_static_w,
        temp_step_c=0.03125,
        compatible=compatible,
        model=model,
        nvpmodel=nvpmodel,
        nvpmodel_default=nvpmodel_default,
        nvpmodel_conf=nvpmodel_conf,
        sources=(
            f"{_SOC_SYSFS} §2.1 (clusters, 76.8 MHz steps, SKU caps, MIN_FREQ 729600), §2.2 (GPU lists, JP5/JP6 "
            "layouts), §2.3 (EMC rates), §2.4 (zones, JP5/JP6 names, fused-off cv zones, ~87/97 C), "
            "§2.5 (INA3221 labels, shunts), §2.6 (nvpmodel modes), Fixture spec",
            f"{_DVFS} §3 (AGX stress rails, Orin Nano switch latencies 1/5/8 ms), §6 (Orin NX/AGX mode table, "
            "idle VDD_IN 3.3-5.8 W)",
            f"{_SEEDS} §B (Orin NX YOLOv5s INT8 split: CPU 1.2 W, GPU 2.9 W, DDR 1.4 W)",
            *extra_sources,
        ),
        assumed=_ro(assumed),
    )


def _p3767_rails(soc_static: float) -> tuple[RailProfile, ...]:
    # DRAM (VDDQ) is not on any of the three channels: only VDD_IN sees it.
    return (
        RailProfile("VDD_IN", {}, total=True, ina_device="1-0040", ina_channel=1),
        RailProfile(
            "VDD_CPU_GPU_CV", {"cluster0": 1.0, "cluster4": 1.0, "gpu": 1.0}, static_w=0.05,
            ina_device="1-0040", ina_channel=2,
        ),
        RailProfile("VDD_SOC", {"memory": 0.45}, static_w=soc_static, ina_device="1-0040", ina_channel=3),
    )


def orin_nx_profile() -> SocProfile:
    """Jetson Orin NX 16GB (p3767-0000) on JetPack 6 (``jp6``) or 5 (``jp5``)."""
    return _orin(
        name="orin-nx",
        description="NVIDIA Jetson Orin NX 16GB: 2x4 Cortex-A78AE, Ampere GPU (1024 cores), 128-bit LPDDR5 EMC",
        model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
        compatible=("nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"),
        clusters=((0, 1, 2, 3), (4, 5, 6, 7)),
        cpu_max_khz=1984000,
        gpu_hz=_ORIN_GPU_JP6_NX,
        gpu_capacitance=10550.0,
        gpu_ops_per_cycle=2048.0,
        emc_hz=_ORIN_EMC,
        emc_bytes_per_cycle=32.0,
        mem_capacitance=1350.0,
        cv_online=False,
        rails=_p3767_rails(1.15),
        board_static_w=3.1,
        soc_static_w=1.15,
        package_r=3.0,
        package_c=35.0,
        nvpmodel=(
            NvpModel(0, "MAXN", 8, 1_984_000_000, 918_000_000, 0),
            NvpModel(1, "10W", 4, 1_190_400_000, 612_000_000, 2_133_000_000),
            NvpModel(2, "15W", 4, 1_651_200_000, 612_000_000, 3_199_000_000),
            NvpModel(3, "25W", 8, 1_497_600_000, 408_000_000, 3_199_000_000),
        ),
        nvpmodel_default=2,
        nvpmodel_conf="nvpmodel_p3767_0000.conf",
        extra_assumed={"domains.gpu.available_hz(jp5)": "the NX JP5 GPU list is not given; the JP6 list is used"},
    )


def orin_agx_profile() -> SocProfile:
    """Jetson AGX Orin 64GB (p3701-0000)."""
    return _orin(
        name="orin-agx",
        description="NVIDIA Jetson AGX Orin 64GB: 3x4 Cortex-A78AE, Ampere GPU (2048 cores), 256-bit LPDDR5 EMC, 2 DLA",
        model="Jetson AGX Orin Developer Kit",
        compatible=("nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"),
        clusters=((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)),
        cpu_max_khz=2201600,
        gpu_hz=_ORIN_GPU_AGX,
        gpu_capacitance=26900.0,
        gpu_ops_per_cycle=4096.0,
        emc_hz=_ORIN_EMC,
        emc_bytes_per_cycle=64.0,
        mem_capacitance=1600.0,
        cv_online=True,
        rails=(
            RailProfile("VDD_GPU_SOC", {"gpu": 1.0, "memory": 0.45}, static_w=1.6, ina_device="1-0040", ina_channel=1),
            RailProfile(
                "VDD_CPU_CV", {"cluster0": 1.0, "cluster4": 1.0, "cluster8": 1.0}, static_w=0.1,
                ina_device="1-0040", ina_channel=2,
            ),
            RailProfile("VIN_SYS_5V0", {}, static_w=1.2, ina_device="1-0040", ina_channel=3),
            RailProfile("VDDQ_VDD2_1V8AO", {"memory": 0.55}, static_w=0.3, ina_device="1-0041", ina_channel=2),
        ),
        board_static_w=3.2,
        soc_static_w=1.6,
        package_r=1.3,
        package_c=80.0,
        nvpmodel=(
            NvpModel(0, "MAXN", 12, 2_201_600_000, 1_300_500_000, 0),
            NvpModel(1, "MODE_15W", 4, 1_113_600_000, 408_000_000, 2_133_000_000),
            NvpModel(2, "MODE_30W", 8, 1_728_000_000, 612_000_000, 0),
            NvpModel(3, "MODE_50W", 12, 1_497_600_000, 816_000_000, 0),
        ),
        nvpmodel_default=2,
        nvpmodel_conf="nvpmodel_p3701_0000.conf",
        extra_assumed={
            "domains.cluster*.available_hz": "the AGX list past 1984 MHz is inferred from the 76.8 MHz step "
            "pattern (soc-sysfs.md §2.1)",
            "rails": "AGX rail split (GPU+SoC, CPU+CV, 5V system, DRAM) shares assumed",
            "nvpmodel_default": "AGX default mode assumed MODE_30W",
        },
    )


def orin_nano_profile() -> SocProfile:
    """Jetson Orin Nano 8GB (p3767-0003), non-Super 15 W configuration."""
    return _orin(
        name="orin-nano",
        description="NVIDIA Jetson Orin Nano 8GB: 4+2 Cortex-A78AE, Ampere GPU (1024 cores), 128-bit LPDDR5",
        model="NVIDIA Jetson Orin Nano Developer Kit",
        compatible=("nvidia,p3768-0000+p3767-0003", "nvidia,p3767-0003", "nvidia,tegra234"),
        clusters=((0, 1, 2, 3), (4, 5)),
        cpu_max_khz=1510400,
        gpu_hz=_ORIN_GPU_NANO,
        gpu_capacitance=10550.0,
        gpu_ops_per_cycle=2048.0,
        emc_hz=_ORIN_EMC[:3],
        emc_bytes_per_cycle=32.0,
        mem_capacitance=900.0,
        cv_online=False,
        rails=_p3767_rails(0.9),
        board_static_w=2.55,
        soc_static_w=0.9,
        package_r=3.2,
        package_c=30.0,
        nvpmodel=(
            NvpModel(0, "15W", 6, 1_510_400_000, 624_750_000, 0),
            NvpModel(1, "7W", 4, 960_000_000, 408_000_000, 0),
        ),
        nvpmodel_default=0,
        nvpmodel_conf="nvpmodel_p3767_0003.conf",
        extra_assumed={
            "domains.gpu.available_hz": "only min 306 and max 624.75 MHz are given; 102 MHz steps assumed between",
            "domains.memory.available_hz": "Nano non-Super EMC assumed capped at 2133 MHz",
            "nvpmodel[7W]": "7W mode clocks assumed (4 cores, 960 MHz CPU, 408 MHz GPU)",
        },
    )


_FACTORIES = {
    "rk3588": rk3588_profile,
    "orin-nx": orin_nx_profile,
    "orin-agx": orin_agx_profile,
    "orin-nano": orin_nano_profile,
}
_CACHE: dict[str, SocProfile] = {}


def known_socs() -> tuple[str, ...]:
    """Names :func:`get_profile` accepts."""
    return tuple(_FACTORIES)


def get_profile(name: str) -> SocProfile:
    """The profile called ``name`` (``rk3588``, ``orin-nx``, ``orin-agx``, ``orin-nano``).

    Raises:
        UnknownSocError: no such profile; the message lists the known names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _FACTORIES:
        raise UnknownSocError(f"unknown SoC {name!r}; known: {', '.join(_FACTORIES)}")
    prof = _CACHE.get(key)
    if prof is None:
        prof = _CACHE[key] = _FACTORIES[key]()
    return prof


def with_domain(profile: SocProfile, name: str, **changes: object) -> SocProfile:
    """A copy of ``profile`` with domain ``name`` changed (for what-if studies and tests)."""
    doms = tuple(replace(d, **changes) if d.name == name else d for d in profile.domains)  # type: ignore[arg-type]
    return replace(profile, domains=doms)
