"""SoC profile schema: the frozen dataclasses a board module fills in (no board data here).

The figures themselves live in one module per board (:mod:`hetsched._twin.boards`); each
figure there carries a short source key (``[rk-bsp-dtsi]``, ``[orin-nvpm]``, ...) that
``docs/sources.md`` resolves to a public primary source, and ``docs/twin-calibration.md``
says what each figure is. Where no public source gives a figure the model still needs, the
value is listed in :attr:`SocProfile.assumed` (key = dotted field path, value = why that
number) so nobody mistakes it for data.

Units: frequencies in Hz, voltages in mV, power in W, temperatures in degrees C,
thermal resistance in K/W, heat capacity in J/K, times in seconds.

Energy-model coefficient ``capacitance`` follows the kernel's device-tree
``dynamic-power-coefficient``: one unit (core) fully busy draws
``capacitance * mV**2 * MHz / 1e6`` microwatts (Linux ``drivers/opp/of.c: _get_power``,
https://docs.kernel.org/power/energy-model.html).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from .._errors import TwinError, UnknownSocError

__all__ = [
    "DomainProfile",
    "EngineProfile",
    "NvpModel",
    "Opp",
    "RailProfile",
    "SocProfile",
    "TempCap",
    "ThermalLayout",
    "ThermalNode",
    "ThrottleInstance",
    "Trip",
    "VendorQuirks",
    "ZoneProfile",
    "read_only",
]

DomainKind = Literal["cpu", "gpu", "npu", "memory"]



def read_only(d: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of ``d`` (profiles are frozen data)."""
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Opp:
    """One operating performance point."""

    freq_hz: int
    voltage_mv: float


class _OppTable:
    """The OPP table and energy model a domain and an engine share (``opps`` ascending,
    ``capacitance`` in uW / (mV^2 * MHz) per unit, ``units``)."""

    opps: tuple[Opp, ...]
    capacitance: float
    units: int

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
        return next((o.voltage_mv for o in self.opps if o.freq_hz >= hz), self.opps[-1].voltage_mv)

    def full_power_w(self, hz: int) -> float:
        """Dynamic power with every unit fully busy at ``hz`` (energy-model power x units)."""
        v = self.voltage_at(hz)
        return self.capacitance * v * v * (hz / 1e6) / 1e12 * self.units


@dataclass(frozen=True)
class DomainProfile(_OppTable):
    """One clock domain: a CPU cluster (cpufreq policy), GPU, NPU or memory controller.

    Raises:
        TwinError: an activity share (``idle_activity``, ``stall_activity``) outside [0, 1].
    """

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
    stall_activity: float = 0.0
    """Compute domains: fraction of full dynamic power drawn while the unit has work in a phase
    but waits on memory (clock tree, pipeline, schedulers and cache traffic keep switching). The
    kernel counts that time as busy (cpufreq load, devfreq/nvgpu load), so a stalled unit looks
    fully loaded to the governors yet draws only this share of its busy power."""
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
    ondemand_thresholds: tuple[int, int] | None = None
    """``simple_ondemand`` (upthreshold, downdifferential) set by the device tree (RK3588 GPU
    30/10); None: the governor's defaults."""
    governor_floor_hz: int = 0
    """Lowest clock the domain's default (firmware) governor picks (Jetson BPMP keeps EMC at
    or above its boot rate); 0: no floor."""
    deep_idle_leak_fraction: float = 1.0
    """CPU clusters: fraction of the cluster's leakage still drawn by its *idle* cores while cpuidle
    may use its deep state (``c7`` on Tegra, ``cpu-sleep`` on Rockchip power the core down; the
    cluster's shared L3/DSU stays up). With cpuidle disabled (``jetson_clocks``), idle cores sit in
    WFI, which gates the core clock but not its power: full leakage. 1.0: no deep idle state."""

    def __post_init__(self) -> None:
        for what, v in (("stall_activity", self.stall_activity), ("idle_activity", self.idle_activity)):
            if not 0.0 <= v <= 1.0:
                raise TwinError(f"domain {self.name!r}: {what} = {v!r} must be in [0, 1]")

    def bandwidth_bps(self, hz: int) -> float:
        """Achievable DRAM bandwidth at memory clock ``hz`` (memory domains)."""
        return hz * self.bytes_per_cycle * self.bandwidth_efficiency


@dataclass(frozen=True)
class EngineProfile(_OppTable):
    """A compute engine the twin models as a device only (an Orin DLA core): its stages' time and
    energy at its clock, as for a :class:`DomainProfile`, with no place in the physics, the tree's
    devfreq nodes or the governors (see :attr:`SocProfile.engines`)."""

    name: str
    kind: Literal["dla"]
    opps: tuple[Opp, ...]
    """Ascending by frequency."""
    capacitance: float
    """Energy-model coefficient per unit, uW / (mV^2 * MHz), as for a domain."""
    ops_per_cycle: float
    """Useful ops (MAC = 2) per clock at full utilisation."""
    units: int = 1
    thermal_node: str = "soc"
    """The thermal node its heat would go to (informative: the physics leaves engines out)."""
    core_name: str = ""
    capacity_dmips_mhz: int = 1024



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
class VendorQuirks:
    """How a board's kernel and firmware present it: vendor behaviour the twin emulates."""

    sysfs_writer: Literal["rockchip-bsp", "tegra-l4t"]
    """Which vendor part of the tree writer renders the devfreq/EMC/sensor files."""
    cpufreq_driver: str
    """``scaling_driver`` (``cpufreq-dt`` on RK3588, ``tegra194`` on Orin)."""
    bogomips: str
    """``/proc/cpuinfo`` BogoMIPS (twice the arch timer in MHz: 24 MHz RK3588, 31.25 MHz Orin)."""
    cpuidle_states: tuple[str, ...]
    """``cpuidle/stateN/name`` per state index (WFI, then the deep state)."""
    governors: Mapping[str, tuple[str, ...]]
    """Domain kind -> ``scaling_available_governors`` / ``available_governors`` in kernel order."""
    default_governors: Mapping[str, str]
    """Domain kind -> governor at boot."""
    boot_temp_c: float
    """Idle temperature the boot-state fixture shows in zone 0 (each next zone +0.5 C)."""
    memory_rate_lock: bool = False
    """The memory clock is fixed through a firmware rate lock (Jetson BPMP ``mrq_rate_locked``)
    while under the ``userspace`` governor."""
    ina_shunt_uohm: int = 0
    """INA3221 shunt resistors (``shunt*_resistor``, micro-ohm); 0: no INA3221."""
    debug_clocks: tuple[tuple[str, int], ...] = ()
    """Engine clocks under ``/sys/kernel/debug/clk`` (name, rate Hz) (AGX Orin)."""
    op_sets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Accelerator kind -> the simulated backend's op set (``mali``, ``rknn``, ``ampere``, ``dla``)."""


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
    quirks: VendorQuirks
    soc_static_w: float = 0.0
    """Part of ``board_static_w`` dissipated inside the SoC package (uncore, logic rail): heats the root node."""
    temp_step_c: float = 0.001
    """Thermal sensor resolution."""
    nvpmodel: tuple[NvpModel, ...] = ()
    nvpmodel_default: int | None = None
    nvpmodel_conf: str | None = None
    """File name under ``/etc/nvpmodel/`` (Orin)."""
    sources: tuple[str, ...] = ()
    """``[key] what was taken from it``, one per public source; ``docs/sources.md`` resolves the keys."""
    assumed: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Dotted field path -> why that figure was assumed (no public source gives it)."""
    engines: tuple[EngineProfile, ...] = ()
    """Compute engines the twin models as devices only (Orin DLA cores): a stage on one gets its
    modelled time and energy from the engine's profile at its clock, but the physics, the tree's
    devfreq nodes and the governors know only :attr:`domains` (no public source gives a DLA's
    power, voltages or thermal coupling to calibrate them against)."""

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.layouts)

    @property
    def default_variant(self) -> str:
        return next(iter(self.layouts))

    def domain(self, name: str) -> DomainProfile:
        """The domain called ``name``.

        Raises:
            KeyError: no domain of that name (a plain lookup miss, not an unknown SoC).
        """
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


