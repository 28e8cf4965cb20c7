"""Jetson AGX Orin 64GB (p3701-0000): the twin's board data.

Source keys in brackets resolve in ``docs/sources.md``.
"""

from __future__ import annotations

from ..schema import NvpModel, RailProfile, SocProfile
from .orin import ORIN_EMC_HZ, dla_engines, orin_profile, orin_quirks

__all__ = ["orin_agx_profile"]

# [nvgpu] AGX JP6 available_frequencies: 306-1224 MHz in 102 MHz steps, then 1300.5 MHz.
_GPU_HZ = (*(306_000_000 + 102_000_000 * i for i in range(10)), 1_300_500_000)

# [jtop] engine clocks under /sys/kernel/debug/clk (name, rate Hz); rates are an idle capture's.
_DEBUG_CLOCKS = (
    ("nvenc", 115200000), ("nvdec", 115200000), ("nvjpg", 115200000), ("nvjpg1", 115200000),
    ("vic", 115200000), ("ofa", 115200000), ("se", 115200000), ("ape", 233472000),
    ("dla0_core", 1600000000), ("dla0_falcon", 844800000), ("dla1_core", 1600000000),
    ("dla1_falcon", 844800000), ("pva0_vps", 1152000000), ("pva0_cpu_axi", 537600000),
)  # fmt: skip


def orin_agx_profile() -> SocProfile:
    """Jetson AGX Orin 64GB (p3701-0000)."""
    return orin_profile(
        name="orin-agx",
        # [orin-datasheet] 3x4 A78AE, 2048-core Ampere GPU, 256-bit LPDDR5, 2 DLA.
        description="NVIDIA Jetson AGX Orin 64GB: 3x4 Cortex-A78AE, Ampere GPU (2048 cores), 256-bit LPDDR5 EMC, 2 DLA",
        model="Jetson AGX Orin Developer Kit",
        compatible=("nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"),  # [tegra234-dt]
        clusters=((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)),  # [orin-cpufreq] policy0/4/8
        cpu_max_khz=2201600,  # [orin-cpufreq] seen in sweeps
        gpu_hz=_GPU_HZ,
        gpu_capacitance=40450.0,  # fitted to [agx-rails] MAXN GPU rail
        gpu_ops_per_cycle=4096.0,
        emc_hz=ORIN_EMC_HZ,
        emc_bytes_per_cycle=64.0,  # [orin-datasheet] 256-bit bus, double data rate
        mem_capacitance=1451.2,  # the NX fit per byte of bus, at VDD2H
        cv_online=True,
        # [tegra234-dt] 1-0040: VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0; 1-0041 ch2: VDDQ_VDD2_1V8AO.
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
        # [orin-nvpm] [jtop] p3701_0000 modes.
        nvpmodel=(
            NvpModel(0, "MAXN", 12, 2_201_600_000, 1_300_500_000, 0),
            NvpModel(1, "MODE_15W", 4, 1_113_600_000, 408_000_000, 2_133_000_000),
            NvpModel(2, "MODE_30W", 8, 1_728_000_000, 612_000_000, 0),
            NvpModel(3, "MODE_50W", 12, 1_497_600_000, 816_000_000, 0),
        ),
        nvpmodel_default=2,
        nvpmodel_conf="nvpmodel_p3701_0000.conf",
        quirks=orin_quirks(ina_shunt_uohm=2000, debug_clocks=_DEBUG_CLOCKS),  # [tegra234-dt] 2 mOhm
        engines=dla_engines(2, 1_600_000_000),  # [orin-dla] 2 NVDLA v2.0; [jtop] dla*_core at 1.6 GHz
        extra_assumed={
            "domains.cluster*.available_hz": "the AGX list past 1984 MHz is inferred from the 76.8 MHz step "
            "pattern [orin-cpufreq]",
            "rails": "AGX rail split (GPU+SoC, CPU+CV, 5V system, DRAM) shares assumed",
            "nvpmodel_default": "AGX default mode assumed MODE_30W",
        },
    )
