"""Rockchip RK3588 (Radxa ROCK 5B class, vendor BSP 6.1): the twin's board data.

Every figure carries a source key in brackets; ``docs/sources.md`` resolves each key to its
public primary source (URL, repository path) and ``docs/twin-calibration.md`` says what each
figure is. Figures no public source gives are listed in ``assumed``.
"""

from __future__ import annotations

from types import MappingProxyType

from ..._errors import UnknownSocError
from ..schema import (
    DomainProfile,
    Opp,
    RailProfile,
    SocProfile,
    TempCap,
    ThermalLayout,
    ThermalNode,
    ThrottleInstance,
    Trip,
    VendorQuirks,
    ZoneProfile,
    read_only,
)

__all__ = ["A76_BINS_KHZ", "rk3588_profile"]

# [rk-bsp-dtsi] cluster0_opp_table: (MHz, default opp-microvolt in mV).
_A55_OPPS = (
    (408, 675), (600, 675), (816, 675), (1008, 675),
    (1200, 712.5), (1416, 762.5), (1608, 850), (1800, 950),
)  # fmt: skip
# [rk-bsp-dtsi] cluster1/cluster2 tables, below the PVTM-binned top step.
_A76_OPPS = (
    (408, 675), (600, 675), (816, 675), (1008, 675), (1200, 675),
    (1416, 725), (1608, 762.5), (1800, 850), (2016, 925), (2208, 987.5),
)  # fmt: skip
A76_BINS_KHZ = (2256000, 2304000, 2352000, 2400000)
"""[rk-bsp-dtsi] ``opp-supported-hw`` selects exactly one of these top A76 OPPs (all 1000 mV)."""

# [rk-bsp-dtsi] gpu/npu OPP tables (100 MHz, mV).
_GPU_OPPS = ((3, 675), (4, 675), (5, 675), (6, 675), (7, 700), (8, 750), (9, 800), (10, 850))
_NPU_OPPS = ((3, 700), (4, 700), (5, 700), (6, 700), (7, 700), (8, 750), (9, 800), (10, 850))

_CPU_GOVS = ("interactive", "conservative", "ondemand", "userspace", "powersave", "performance", "schedutil")
_DEVFREQ_GOVS = ("rknpu_ondemand", "dmc_ondemand", "userspace", "powersave", "performance", "simple_ondemand")

_QUIRKS = VendorQuirks(
    sysfs_writer="rockchip-bsp",
    cpufreq_driver="cpufreq-dt",  # [rk-sysfs-captures]
    bogomips="48.00",  # [rk-sysfs-captures] 24 MHz arch timer
    cpuidle_states=("WFI", "cpu-sleep"),  # [rk-bsp-dtsi] idle-states
    # [rk-sysfs-captures] scaling_available_governors / devfreq available_governors.
    governors=MappingProxyType({"cpu": _CPU_GOVS, "gpu": _DEVFREQ_GOVS, "npu": _DEVFREQ_GOVS, "memory": _DEVFREQ_GOVS}),
    # [rk-sysfs-captures] ondemand on Armbian/ArmSoM images; BSP devfreq defaults.
    default_governors=MappingProxyType(
        {"cpu": "ondemand", "gpu": "simple_ondemand", "npu": "rknpu_ondemand", "memory": "dmc_ondemand"}
    ),
    boot_temp_c=44.384,  # [rk-sysfs-captures] an idle soc-thermal reading
    op_sets=MappingProxyType({"gpu": "mali", "npu": "rknn"}),
)


def _opps(table: tuple[tuple[float, float], ...], scale: int) -> tuple[Opp, ...]:
    return tuple(Opp(int(f * scale), float(v)) for f, v in table)


def _domains(a76_bin_khz: int) -> tuple[DomainProfile, ...]:
    a55 = _opps(_A55_OPPS, 1_000_000)
    a76 = (*_opps(_A76_OPPS, 1_000_000), Opp(a76_bin_khz * 1000, 1000.0))
    gpu = tuple(Opp(f * 100_000_000, v) for f, v in _GPU_OPPS)
    npu = tuple(Opp(f * 100_000_000, v) for f, v in _NPU_OPPS)
    # [rk-bsp-dtsi] dmc OPPs 528/1068/1560 MHz; [rk-sysfs-captures] LPDDR4x list tops at 2112 MHz (mV assumed).
    dmc = (Opp(528_000_000, 675), Opp(1_068_000_000, 725), Opp(1_560_000_000, 800), Opp(2_112_000_000, 850))
    # [rk-bsp-dtsi] clock-latency-ns 40000; SCMI clocks assigned 816 MHz at boot.
    cpu_common = dict(kind="cpu", transition_latency_ns=40000, boot_hz=816_000_000, deep_idle_leak_fraction=0.5)
    return (
        DomainProfile(
            # [rk-mainline-dts] dynamic-power-coefficient 228; [rk-latency] 84 us; [rk-bsp-dtsi] capacity 530.
            name="cluster0", opps=a55, capacitance=228.0, units=4, cpus=(0, 1, 2, 3),
            cpu_part="0xd05", core_name="Cortex-A55", capacity_dmips_mhz=530,
            leak_w=0.04, switch_latency_s=84e-6, thermal_node="littlecore", ops_per_cycle=4 * 2.0,
            stall_activity=0.35,
            **cpu_common,  # type: ignore[arg-type]
        ),
        DomainProfile(
            # [rk-mainline-dts] dynamic-power-coefficient 416; [rk-latency] 324 us.
            name="cluster4", opps=a76, capacitance=416.0, units=2, cpus=(4, 5),
            cpu_part="0xd0b", core_name="Cortex-A76", capacity_dmips_mhz=1024,
            leak_w=0.06, switch_latency_s=324e-6, thermal_node="bigcore0", ops_per_cycle=2 * 4.0,
            stall_activity=0.5,
            **cpu_common,  # type: ignore[arg-type]
        ),
        DomainProfile(
            name="cluster6", opps=a76, capacitance=416.0, units=2, cpus=(6, 7),
            cpu_part="0xd0b", core_name="Cortex-A76", capacity_dmips_mhz=1024,
            leak_w=0.06, switch_latency_s=324e-6, thermal_node="bigcore1", ops_per_cycle=2 * 4.0,
            stall_activity=0.5,
            **cpu_common,  # type: ignore[arg-type]
        ),
        DomainProfile(
            # [rk-mainline-dts] coefficient 2982; [rk-bsp-dtsi] upthreshold 30, downdifferential 10;
            # [rk-sysfs-captures] devfreq boots at 300 MHz; [rk3588-datasheet] Mali-G610 MP4.
            name="gpu", kind="gpu", opps=gpu, capacitance=2982.0, units=1, idle_activity=0.01, stall_activity=0.45,
            leak_w=0.05, switch_latency_s=1e-3, thermal_node="gpu", boot_hz=300_000_000,
            ops_per_cycle=512.0, gates_when_idle=True, ondemand_thresholds=(30, 10),
        ),
        DomainProfile(
            # [rk3588-datasheet] 3 NPU cores, 3 x 1024 INT8 MACs; [rk-sysfs-captures] boots at 1 GHz.
            name="npu", kind="npu", opps=npu, capacitance=920.0, units=3, idle_activity=0.01, stall_activity=0.3,
            leak_w=0.04, switch_latency_s=1e-3, thermal_node="npu", boot_hz=1_000_000_000,
            ops_per_cycle=3 * 2048.0, gates_when_idle=True,
        ),
        DomainProfile(
            # [rk3588-datasheet] 64-bit LPDDR4x: 16 bytes per DMC clock (double data rate).
            name="memory", kind="memory", opps=dmc, capacitance=980.0, units=1, idle_activity=0.2,
            leak_w=0.03, switch_latency_s=5e-3, thermal_node="center", boot_hz=528_000_000,
            bytes_per_cycle=16.0, bandwidth_efficiency=0.7,
        ),
    )


_NODES = (  # all assumed (see ``assumed["nodes"]``)
    ThermalNode("soc", capacitance_j_per_k=14.0, resistance_k_per_w=5.5),
    ThermalNode("littlecore", 0.6, 2.5, parent="soc"),
    ThermalNode("bigcore0", 0.6, 2.0, parent="soc"),
    ThermalNode("bigcore1", 0.6, 2.0, parent="soc"),
    ThermalNode("center", 0.8, 1.0, parent="soc"),
    ThermalNode("gpu", 0.8, 1.2, parent="soc"),
    ThermalNode("npu", 0.8, 1.2, parent="soc"),
)

_CRIT = Trip(115.0, "critical", 2.0)  # [rk-bsp-dtsi] [rk-mainline-dts]

# [rk-bsp-dtsi] tsadc zones in [rk-sysfs-captures] index order; soc-thermal trips 75/85 passive,
# sustainable-power 2100 mW, polling-delay-passive 20 ms, cooling maps on trip 1 (CPUs + GPU);
# rockchip,high-temp 85 C with high-temp-max-freq (A55 1608, A76 2208, GPU/NPU 800 MHz).
_VENDOR = ThermalLayout(
    zones=(
        ZoneProfile(
            "soc-thermal", ("soc",), (Trip(75.0, "passive", 2.0), Trip(85.0, "passive", 2.0), _CRIT),
            policy="power_allocator", hwmon=True, sustainable_power_w=2.1,
        ),
        ZoneProfile("bigcore0-thermal", ("bigcore0",), (_CRIT,), hwmon=True),
        ZoneProfile("bigcore1-thermal", ("bigcore1",), (_CRIT,), hwmon=True),
        ZoneProfile("littlecore-thermal", ("littlecore",), (_CRIT,), hwmon=True),
        ZoneProfile("center-thermal", ("center",), (_CRIT,), hwmon=True),
        ZoneProfile("gpu-thermal", ("gpu",), (_CRIT,), hwmon=True),
        ZoneProfile("npu-thermal", ("npu",), (_CRIT,), hwmon=True),
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

# [rk-mainline-dts] package/bigcore0/bigcore2/littlecore/center/gpu/npu zones: alert0 75, alert1 85,
# crit 115; step_wise on the big/little/GPU zones, polling 100 ms.
_ALERT = (Trip(75.0, "passive", 2.0), Trip(85.0, "passive", 2.0), _CRIT)
_MAINLINE = ThermalLayout(
    zones=(
        ZoneProfile("package-thermal", ("soc",), (_CRIT,)),
        ZoneProfile("bigcore0-thermal", ("bigcore0",), _ALERT),
        ZoneProfile("bigcore2-thermal", ("bigcore1",), _ALERT),
        ZoneProfile("littlecore-thermal", ("littlecore",), _ALERT),
        ZoneProfile("center-thermal", ("center",), (_CRIT,)),
        ZoneProfile("gpu-thermal", ("gpu",), (Trip(85.0, "passive", 2.0), _CRIT)),
        ZoneProfile("npu-thermal", ("npu",), (_CRIT,)),
    ),
    throttling=(
        ThrottleInstance(zone=1, governor="step_wise", actors=("cluster4",), trip=1, polling_s=0.1),
        ThrottleInstance(zone=2, governor="step_wise", actors=("cluster6",), trip=1, polling_s=0.1),
        ThrottleInstance(zone=3, governor="step_wise", actors=("cluster0",), trip=1, polling_s=0.1),
        ThrottleInstance(zone=5, governor="step_wise", actors=("gpu",), trip=0, polling_s=0.1),
    ),
    passive_polling_s=0.1,
)

_SOURCES = (
    "[rk-bsp-dtsi] Rockchip BSP rk3588s.dtsi: cpufreq policies, OPP kHz/mV, A76 PVTM bins, devfreq "
    "GPU/NPU/DMC mV, zones, trips, sustainable-power 2100 mW, polling, high-temp caps (reference: docs/sources.md)",
    "[rk-mainline-dts] Linux rk3588-base.dtsi: dynamic-power-coefficient 228/416/2982, mainline zones "
    "(reference: docs/sources.md)",
    "[rk-sysfs-captures] ArmSoM / FriendlyElec CM3588 board docs: real sysfs listings, governors, zone "
    "order, hwmon names, no power sensor (reference: docs/sources.md)",
    "[rk-latency] armbian/build PR 6507: cpuinfo_transition_latency 84/324 us (reference: docs/sources.md)",
    "[rock5b-power] Thomas Kaiser, Quick Preview of ROCK 5B: idle < 2 W, all-core 7-zip +6 W "
    "(reference: docs/sources.md)",
    "[kernel-ipa] Linux power_allocator documentation: k_pu/k_po, step_wise (reference: docs/sources.md)",
)

_ASSUMED = {
    "domains.npu.capacitance": "no NPU coefficient is published; 920 per core puts the 3-core NPU at ~2 W "
    "fully busy at 1 GHz",
    "domains.memory.opps[2112MHz].voltage_mv": "the LPDDR4x top DMC OPP voltage is not listed; 850 mV "
    "interpolated between 1560@800 and 2750@875 [rk-bsp-dtsi]",
    "domains.memory.capacitance": "DMC+DRAM power not published; ~1.5 W at full bandwidth at 2112 MHz",
    "domains.*.leak_w": "leakage is not published; small values keeping idle board power < 2 W [rock5b-power]",
    "domains.*.leak_per_c": "leakage doubling every ~35 C (generic CMOS rule of thumb)",
    "domains.*.idle_activity": "clock-tree / refresh activity at zero utilisation",
    "domains.*.stall_activity": "no public per-unit figure: the share of busy dynamic power a unit still draws "
    "while it waits on memory; A76 0.5 (out-of-order: front end, ROB and L1/L2 keep working), A55 0.35 "
    "(in-order: the pipeline stops behind the miss, less keeps switching), Mali-G610 0.45 (warp issue, "
    "register file and L2 move every byte of a memory-bound shader), RKNPU 0.3 (the MAC arrays wait on "
    "DMA; only buffers and the DMA engine switch)",
    "domains.memory.opps.voltage_mv": "[rk-bsp-dtsi] dmc_opp_table voltages are the SoC-side DMC supplies (not the DRAM's); the "
    "LPDDR4x VDD2 (1.1 V) does not scale with the DMC clock, and its share of DRAM power is not published, so "
    "the whole DMC+DRAM dynamic energy is scaled with the table's voltage",
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
    "board_static_w": "DRAM background, PHYs and regulators at idle, so idle board power is ~1.8 W "
    "(< 2 W [rock5b-power])",
    "converter_efficiency": "5 V/12 V input converters, 88 %",
    "layouts.*.caps.hyst_c": "release of the rockchip high-temp limit 2 C below 85 C",
    "rails": "RK3588 boards have no power sensor [rk-sysfs-captures]: every rail is estimated from the model",
}


def rk3588_profile(*, a76_bin_khz: int = 2256000) -> SocProfile:
    """The RK3588 (Rock 5B / Orange Pi 5, vendor BSP 6.1) profile.

    ``a76_bin_khz`` selects the chip's PVTM bin, i.e. the one top A76 OPP the chip shows
    (2256000, 2304000, 2352000 or 2400000 kHz, all at 1000 mV).

    Raises:
        UnknownSocError: ``a76_bin_khz`` is not one of the binned OPPs.
    """
    if a76_bin_khz not in A76_BINS_KHZ:
        raise UnknownSocError(f"rk3588 has no A76 bin {a76_bin_khz} kHz; bins: {A76_BINS_KHZ}")
    domains = _domains(a76_bin_khz)
    rails = (
        RailProfile("vdd_cpu_lit", {"cluster0": 1.0}, measured=False),
        RailProfile("vdd_cpu_big0", {"cluster4": 1.0}, measured=False),
        RailProfile("vdd_cpu_big1", {"cluster6": 1.0}, measured=False),
        RailProfile("vdd_gpu", {"gpu": 1.0}, measured=False),
        RailProfile("vdd_npu", {"npu": 1.0}, measured=False),
        RailProfile("vdd_ddr", {"memory": 1.0}, measured=False),
        RailProfile("board", {d.name: 1.0 for d in domains}, total=True, measured=False),
    )
    return SocProfile(
        name="rk3588",
        family="rockchip",
        description="Rockchip RK3588 (Rock 5B class): A55x4 + A76x2 + A76x2, Mali-G610 MP4, 3-core NPU, LPDDR4x DMC",
        domains=domains,
        nodes=_NODES,
        layouts=MappingProxyType({"vendor": _VENDOR, "mainline": _MAINLINE}),
        rails=rails,
        board_static_w=1.05,
        converter_efficiency=0.88,
        soc_static_w=0.45,
        compatible=("radxa,rock-5b", "rockchip,rk3588"),  # [rk-bsp-dtsi] rk3588-rock-5b.dts
        model="Radxa ROCK 5B",
        quirks=_QUIRKS,
        sources=_SOURCES,
        assumed=read_only(_ASSUMED),
    )
