"""What every Jetson Orin (T234) module shares: the builder the per-module boards call.

Source keys in brackets resolve in ``docs/sources.md``; ``docs/twin-calibration.md`` says what
each figure is. Orin voltages, EMC power and thermal R/C are unpublished: those figures are
listed in ``assumed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..schema import (
    DomainProfile,
    EngineProfile,
    NvpModel,
    Opp,
    RailProfile,
    SocProfile,
    ThermalLayout,
    ThermalNode,
    ThrottleInstance,
    Trip,
    VendorQuirks,
    ZoneProfile,
    read_only,
)

__all__ = ["ORIN_EMC_HZ", "dla_engines", "orin_profile", "orin_quirks", "p3767_rails"]

ORIN_EMC_HZ = (204_000_000, 665_600_000, 2_133_000_000, 3_199_000_000)
"""[orin-emc] bpmp ``clk/emc`` rates seen on an AGX Orin."""

# The EMC clock is half the LPDDR5 data rate (the twin moves 2 x bus width per EMC clock), so the
# two low rates run at 408 and 1331 MT/s: within DVFSC's range, where the DRAM core runs from VDD2L
# instead of VDD2H ([lpddr5-dvfsc] at or below 1600 MT/s; [lpddr5-micron] VDD2H 1.05 V, VDD2L 0.9 V).
_DVFSC_MAX_HZ = 800_000_000
_VDD2H_MV = 1050.0
_VDD2L_MV = 900.0

# [ga10x-vf] the one public V/f evidence for Ampere on Samsung 8N (Orin's GPU architecture and
# process): 0.668 V at the 210 MHz idle clock and 0.875 V at the bottom of the 3D-load range,
# 1740 MHz. Orin's GPU tops out far below 1740 MHz, so its OPPs lie between the two points.
_GPU_VF_LO = (210_000_000, 668.0)
_GPU_VF_HI = (1_740_000_000, 875.0)

_CPU_GOVS = ("conservative", "ondemand", "userspace", "powersave", "performance", "schedutil")
_GPU_GOVS = ("nvhost_podgov", "userspace", "performance", "simple_ondemand")
# Jetson EMC is not devfreq: BPMP picks the rate unless ``mrq_rate_locked``.
_EMC_GOVS = ("bpmp", "userspace")

_JP6_ZONES = ("cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal",
              "soc0-thermal", "soc1-thermal", "soc2-thermal", "tj-thermal")  # fmt: skip
_JP5_ZONES = ("CPU-therm", "GPU-therm", "CV0-therm", "CV1-therm", "CV2-therm",
              "SOC0-therm", "SOC1-therm", "SOC2-therm", "tj-therm")  # fmt: skip
_ZONE_NODES = ("cpu", "gpu", "cv0", "cv1", "cv2", "soc0", "soc1", "soc2")

_SOURCES = (
    "[orin-cpufreq] Orin cpufreq captures: clusters, 76.8 MHz steps, SKU caps, nvpmodel MIN_FREQ 729600 "
    "(reference: docs/sources.md)",
    "[nvgpu] NVIDIA nvgpu sysfs and GPU devfreq lists, JP5/JP6 layouts (reference: docs/sources.md)",
    "[orin-emc] bpmp EMC rates (reference: docs/sources.md)",
    "[tegra234-dt] Linux tegra234 device trees and BPMP thermal bindings: zones, INA3221 labels and shunts "
    "(reference: docs/sources.md)",
    "[jtop] rbonghi/jetson_stats: JP5 zone names, fused-off cv zones, nvpmodel dumps (reference: docs/sources.md)",
    "[orin-nvpm] NVIDIA nvpmodel confs and Jetson Linux power-mode tables (reference: docs/sources.md)",
    "[agx-rails] NVIDIA forum: AGX Orin stress rails per mode (reference: docs/sources.md)",
    "[orin-nano-latency] Orin Nano measurement study: 1/5/8 ms clock switch latencies (reference: docs/sources.md)",
    "[tegrastats] tegrastats sample lines: idle VDD_IN 3.3-5.8 W, rails, 1/32 C (reference: docs/sources.md)",
    "[practitioner-yolo] practitioner article, Orin NX YOLOv5s INT8 split CPU 1.2 W, GPU 2.9 W, DDR 1.4 W "
    "(reference: docs/sources.md)",
    "[orin-dla] NVIDIA Jetson module comparison and AGX Orin technical brief: NVDLA v2.0 cores per module "
    "(AGX 2, NX 16GB 2, NX 8GB 1, Nano 0) and their sparse INT8 TOPS (reference: docs/sources.md)",
    "[lpddr5-micron] Micron LPDDR5 data sheet (MT62F): VDD2H 1.05 V, VDD2L 0.9 V nominal, DVFSC "
    "(reference: docs/sources.md)",
    "[lpddr5-dvfsc] DVFSC selectable at data rates up to 1600 Mb/s, core moves from VDD2H to VDD2L "
    "(reference: docs/sources.md)",
    "[ga10x-vf] TechPowerUp RTX 3060 Ti (GA104, Samsung 8N) clock profiles: 210 MHz at 0.668 V, 3D load "
    "1740-1965 MHz at 0.875-1.081 V (reference: docs/sources.md)",
)

_ASSUMED = {
    "domains.cluster*.opps.voltage_mv": "Orin voltages are BPMP-owned and unpublished; "
    "assumed 600 mV floor up to 729.6 MHz, linear to 950 mV (1000 mV AGX) at the top",
    "domains.cluster*.capacitance": "fitted so 12 AGX cores at MAXN draw ~15 W ([agx-rails] AGX CPU rail 15.2 W)",
    "domains.gpu.opps.voltage_mv": "Orin GPU voltages are BPMP-owned and unpublished; interpolated linearly "
    "between the two published Ampere/Samsung-8N points [ga10x-vf] (668 mV at 210 MHz, 875 mV at 1740 MHz): "
    "the points are a desktop GA104's, and a straight line between them is assumed",
    "domains.gpu.capacitance": "fitted to the Orin NX YOLOv5s split (GPU 2.9 W at 612 MHz [practitioner-yolo]); "
    "AGX fitted to its MAXN GPU rail (40.4 W [agx-rails])",
    "domains.memory.capacitance": "EMC/DRAM power unpublished; fitted to the Orin NX YOLOv5s DDR 1.4 W "
    "[practitioner-yolo] at the 1050 mV VDD2H level",
    "domains.memory.opps.voltage_mv": "the DRAM core voltage: VDD2H 1050 mV, VDD2L 900 mV at the two rates "
    "within DVFSC's range [lpddr5-micron] [lpddr5-dvfsc]; that BPMP enables DVFSC there is assumed (not "
    "published), and the whole EMC+DRAM dynamic energy is scaled by it (the VDDQ I/O share and the EMC "
    "logic on VDD_SOC are not split out: no public figure gives them)",
    "domains.*.stall_activity": "no public per-unit figure: the share of busy dynamic power a unit still draws "
    "while it waits on memory (clock tree, pipeline, schedulers, cache and register traffic switch on); "
    "A78AE 0.5 (out-of-order: front end, ROB and L1/L2 keep working), Ampere GPU 0.45 (warp schedulers, "
    "register file and L1/L2 move every byte of a memory-bound kernel)",
    "domains.*.leak_w": "unpublished; sized so idle VDD_CPU_GPU_CV is ~0.5 W as in the [tegrastats] sample line "
    "(GPU leakage in proportion to its cores)",
    "domains.cluster*.deep_idle_leak_fraction": "not published: c7 powers an idle A78AE core down; 0.5 "
    "assumed for what stays (the shared L3/DSU, and idle spells shorter than c7's target residency), "
    "which keeps the YOLOv5s CPU figure [practitioner-yolo] within calibration; jetson_clocks disables "
    "c7 [jetson-clocks], leaving WFI: full leakage",
    "domains.gpu.idle_activity": "0: an ungated idle GPU (railgate_enable=0) is modelled by its leakage "
    "only (engine-level clock gating assumed to stop its clocks); a lower bound on its idle power",
    "domains.cluster*.transition_latency_ns": "cpuinfo_transition_latency not given for Orin; 1 ms (the "
    "measured time for a CPU clock to take effect [orin-nano-latency])",
    "nodes": "thermal R/C unpublished; dev-kit fan heatsink",
    "layouts.*.zones.trips": "Orin trip temperatures are not confirmed: throttle 87 C and shutdown 97 C "
    "from an unconfirmed secondary source; hysteresis 2 C",
    "layouts.*.throttling": "BPMP throttles in firmware; modelled as kernel step_wise on cpu/gpu zones",
    "soc_static_w": "VDD_SOC static share ([tegrastats] idle VDD_SOC ~1.3 W), dissipated in the package",
    "temp_step_c": "BPMP thermal resolution taken as 1/32 C ([tegrastats] shows e.g. 48.125C)",
    "board_static_w": "module static power so idle VDD_IN lands in the published 3.3-5.8 W range [tegrastats]",
    "converter_efficiency": "module input converters, 88 %",
    "engines.dla*.opps.voltage_mv": "DLA voltages are unpublished; one OPP at the module's DLA clock, 750 mV assumed",
    "engines.dla*.capacitance": "DLA power is unpublished; sized so one DLA core at AGX's 1.6 GHz draws ~1.5 W",
    "engines.dla*.ops_per_cycle": "on the GPU domain's scale: the twin's GPU rate (2 fp32 FLOPs per CUDA core "
    "per clock) is 1/32 of its published sparse INT8 rate [orin-dla]; the DLA gets the same ratio",
}

# [orin-dla] 105 sparse INT8 TOPS from two DLA cores at 1.6 GHz (AGX Orin 64GB), 40 from two at
# 614.4 MHz (Orin NX 16GB): 32768 sparse INT8 ops per clock per core, both ways. The NX GPU's 60
# sparse TOPS at 918 MHz are 32x the twin's 2048 ops per clock for it, so a DLA core is modelled
# at 32768 / 32: a third of the NX GPU at their top clocks, as the published TOPS split says.
_DLA_OPS_PER_CYCLE = 32768.0 / 32


def orin_quirks(*, ina_shunt_uohm: int, debug_clocks: tuple[tuple[str, int], ...] = ()) -> VendorQuirks:
    """Jetson Linux (L4T) behaviour shared by the Orin modules."""
    # "dla": the DLA engines' op set (TensorRT's DLA layer limits); "npu" stays for a caller that
    # asks for an accelerator of that kind on a Tegra profile.
    return VendorQuirks(
        sysfs_writer="tegra-l4t",
        cpufreq_driver="tegra194",  # [orin-cpufreq]
        bogomips="62.50",  # [orin-cpufreq] 31.25 MHz arch timer
        cpuidle_states=("WFI", "c7"),  # [jetson-clocks] "IdleStates: WFI=1 c7=1"
        # [orin-cpufreq] [nvgpu] available governors.
        governors=MappingProxyType({"cpu": _CPU_GOVS, "gpu": _GPU_GOVS, "npu": _EMC_GOVS, "memory": _EMC_GOVS}),
        default_governors=MappingProxyType(
            {"cpu": "schedutil", "gpu": "nvhost_podgov", "npu": "simple_ondemand", "memory": "bpmp"}
        ),
        boot_temp_c=48.0,  # [tegrastats] "cpu@48C"
        memory_rate_lock=True,  # [orin-emc] mrq_rate_locked
        ina_shunt_uohm=ina_shunt_uohm,
        debug_clocks=debug_clocks,
        op_sets=MappingProxyType({"gpu": "ampere", "npu": "dla", "dla": "dla"}),
    )


def orin_cpu_khz(max_khz: int) -> tuple[int, ...]:
    """[orin-cpufreq] 76.8 MHz steps from 115.2 MHz, then the SKU cap."""
    steps = [115200 + 76800 * i for i in range(40)]
    out = [s for s in steps if s < max_khz]
    out.append(max_khz)
    return tuple(out)


def _line_opps(freqs_hz: tuple[int, ...], lo: tuple[int, float], hi: tuple[int, float]) -> tuple[Opp, ...]:
    """V(f) on the straight line through two published (Hz, mV) points."""
    slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
    return tuple(Opp(f, round(lo[1] + slope * (f - lo[0]), 1)) for f in freqs_hz)


def _emc_opps(emc_hz: tuple[int, ...]) -> tuple[Opp, ...]:
    """The DRAM core voltage per EMC rate: VDD2L within DVFSC's range, else VDD2H."""
    return tuple(Opp(f, _VDD2L_MV if f <= _DVFSC_MAX_HZ else _VDD2H_MV) for f in emc_hz)


def _ramp_opps(freqs_hz: tuple[int, ...], knee_hz: int, v_floor: float, v_top: float, top_hz: int) -> tuple[Opp, ...]:
    """Assumed V(f): the voltage floor up to the knee, then linear to ``v_top`` at ``top_hz``."""
    out = []
    for f in freqs_hz:
        v = v_floor if f <= knee_hz else v_floor + (v_top - v_floor) * (f - knee_hz) / (top_hz - knee_hz)
        out.append(Opp(f, round(v, 1)))
    return tuple(out)


def p3767_rails(soc_static: float) -> tuple[RailProfile, ...]:
    """[tegra234-dt] Orin NX/Nano (p3767) INA3221 1-0040: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC."""
    # DRAM (VDDQ) is not on any of the three channels: only VDD_IN sees it.
    return (
        RailProfile("VDD_IN", {}, total=True, ina_device="1-0040", ina_channel=1),
        RailProfile(
            "VDD_CPU_GPU_CV", {"cluster0": 1.0, "cluster4": 1.0, "gpu": 1.0}, static_w=0.05,
            ina_device="1-0040", ina_channel=2,
        ),
        RailProfile("VDD_SOC", {"memory": 0.45}, static_w=soc_static, ina_device="1-0040", ina_channel=3),
    )


def _domains(
    clusters: tuple[tuple[int, ...], ...],
    cpu_max_khz: int,
    gpu_hz: tuple[int, ...],
    gpu_capacitance: float,
    gpu_ops_per_cycle: float,
    emc_hz: tuple[int, ...],
    emc_bytes_per_cycle: float,
    mem_capacitance: float,
) -> tuple[DomainProfile, ...]:
    cpu_hz = tuple(k * 1000 for k in orin_cpu_khz(cpu_max_khz))
    cpu_opps = _ramp_opps(cpu_hz, 729_600_000, 600.0, 950.0 if cpu_max_khz <= 1984000 else 1000.0, cpu_hz[-1])
    domains = [
        DomainProfile(
            # [orin-cpufreq] MIN_FREQ 729600, A78AE (0xd42); [orin-nano-latency] 1 ms switch.
            name=f"cluster{cpus[0]}", kind="cpu", opps=cpu_opps, capacitance=560.0, units=len(cpus),
            idle_activity=0.02, stall_activity=0.5, leak_w=0.05 * len(cpus), switch_latency_s=1e-3,
            transition_latency_ns=1_000_000, thermal_node="cpu", boot_hz=729_600_000,
            default_min_hz=729_600_000, cpus=cpus, cpu_part="0xd42", core_name="Cortex-A78AE",
            capacity_dmips_mhz=1024, ops_per_cycle=len(cpus) * 4.0, deep_idle_leak_fraction=0.5,
        )
        for cpus in clusters
    ]
    domains.append(
        DomainProfile(
            # [nvgpu] frequency lists; [orin-nano-latency] 5 ms switch; GPU rail-gates when idle.
            name="gpu", kind="gpu",
            opps=_line_opps(gpu_hz, _GPU_VF_LO, _GPU_VF_HI),
            capacitance=gpu_capacitance, units=1, idle_activity=0.0, stall_activity=0.45,
            leak_w=0.25 * gpu_ops_per_cycle / 2048.0,
            switch_latency_s=5e-3, thermal_node="gpu", boot_hz=gpu_hz[0], ops_per_cycle=gpu_ops_per_cycle,
            gates_when_idle=True,
        )
    )
    boot = emc_hz[-2] if len(emc_hz) > 3 else emc_hz[-1]
    domains.append(
        DomainProfile(
            # [orin-emc] rates, boot rate 2133 MHz; [orin-nano-latency] 8 ms switch; BPMP keeps the
            # EMC at or above its boot rate unless the rate is locked.
            name="memory", kind="memory", opps=_emc_opps(emc_hz),
            capacitance=mem_capacitance, units=1, idle_activity=0.12, leak_w=0.05, switch_latency_s=8e-3,
            thermal_node="soc1", boot_hz=boot, governor_floor_hz=boot,
            bytes_per_cycle=emc_bytes_per_cycle, bandwidth_efficiency=0.7,
        )
    )
    return tuple(domains)


def dla_engines(cores: int, dla_hz: int) -> tuple[EngineProfile, ...]:
    """``cores`` DLA engines (``dla0``, ``dla1``) at ``dla_hz``: device-only, see ``SocProfile.engines``."""
    return tuple(
        EngineProfile(name=f"dla{i}", kind="dla", opps=(Opp(dla_hz, 750.0),), capacitance=1670.0,
                      ops_per_cycle=_DLA_OPS_PER_CYCLE, thermal_node="soc0", core_name="NVDLA v2.0")
        for i in range(cores)
    )


def _layouts(cpu_actors: tuple[str, ...], cv_online: bool, board_zones: bool) -> dict[str, ThermalLayout]:
    trips = (Trip(87.0, "passive", 2.0), Trip(97.0, "critical", 0.0))  # assumed (secondary source)

    def zones(names: tuple[str, ...], with_board: bool) -> tuple[ZoneProfile, ...]:
        # [tegra234-dt] [jtop] zone order; cv0-2 fused off on NX/Nano.
        zs = [
            ZoneProfile(n, (node,), trips, offline=(node.startswith("cv") and not cv_online))
            for n, node in zip(names, _ZONE_NODES, strict=False)
        ]
        zs.append(ZoneProfile(names[-1], tuple(n for n in _ZONE_NODES if cv_online or not n.startswith("cv")), trips))
        if with_board:
            zs.append(ZoneProfile("Tboard_tegra", ("package",), ()))
            zs.append(ZoneProfile("Tdiode_tegra", ("package",), ()))
        return tuple(zs)

    throttling = (
        ThrottleInstance(zone=0, governor="step_wise", actors=cpu_actors, trip=0, polling_s=0.1),
        ThrottleInstance(zone=1, governor="step_wise", actors=("gpu",), trip=0, polling_s=0.1),
    )
    return {
        "jp6": ThermalLayout(zones(_JP6_ZONES, False), throttling, passive_polling_s=0.1),
        "jp5": ThermalLayout(zones(_JP5_ZONES, board_zones), throttling, passive_polling_s=0.1),
    }


def orin_profile(
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
    quirks: VendorQuirks,
    extra_sources: tuple[str, ...] = (),
    extra_assumed: Mapping[str, str] | None = None,
    engines: tuple[EngineProfile, ...] = (),
) -> SocProfile:
    """One Orin module's profile from what differs between modules."""
    domains = _domains(clusters, cpu_max_khz, gpu_hz, gpu_capacitance, gpu_ops_per_cycle,
                       emc_hz, emc_bytes_per_cycle, mem_capacitance)  # fmt: skip
    nodes = (  # assumed: thermal R/C unpublished
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
    cpu_actors = tuple(d.name for d in domains if d.kind == "cpu")
    # [jtop] Tboard_tegra / Tdiode_tegra appear on AGX (three clusters) under JP5.
    layouts = _layouts(cpu_actors, cv_online, board_zones=len(clusters) == 3)
    assumed = dict(_ASSUMED)
    if extra_assumed:
        assumed.update(extra_assumed)
    return SocProfile(
        name=name,
        family="tegra",
        description=description,
        domains=domains,
        nodes=nodes,
        layouts=MappingProxyType(layouts),
        rails=rails,
        board_static_w=board_static_w,
        converter_efficiency=0.88,
        soc_static_w=soc_static_w,
        temp_step_c=0.03125,
        compatible=compatible,
        model=model,
        quirks=quirks,
        nvpmodel=nvpmodel,
        nvpmodel_default=nvpmodel_default,
        nvpmodel_conf=nvpmodel_conf,
        sources=(*_SOURCES, *extra_sources),
        assumed=read_only(assumed),
        engines=engines,
    )
