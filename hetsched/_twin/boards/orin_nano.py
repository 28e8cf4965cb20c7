"""Jetson Orin Nano 8GB (p3767-0003), non-Super 15 W configuration: the twin's board data.

Source keys in brackets resolve in ``docs/sources.md``.
"""

from __future__ import annotations

from ..schema import NvpModel, SocProfile
from .orin import ORIN_EMC_HZ, orin_profile, orin_quirks, p3767_rails

__all__ = ["orin_nano_profile"]

# [nvgpu] min 306 and max 624.75 MHz at 15W (the steps between are assumed).
_GPU_HZ = (306_000_000, 408_000_000, 510_000_000, 612_000_000, 624_750_000)


def orin_nano_profile() -> SocProfile:
    """Jetson Orin Nano 8GB (p3767-0003), non-Super 15 W configuration."""
    return orin_profile(
        name="orin-nano",
        # [orin-datasheet] 4+2 A78AE, 1024-core Ampere GPU, 128-bit LPDDR5.
        description="NVIDIA Jetson Orin Nano 8GB: 4+2 Cortex-A78AE, Ampere GPU (1024 cores), 128-bit LPDDR5",
        model="NVIDIA Jetson Orin Nano Developer Kit",
        compatible=("nvidia,p3768-0000+p3767-0003", "nvidia,p3767-0003", "nvidia,tegra234"),  # [tegra234-dt]
        clusters=((0, 1, 2, 3), (4, 5)),  # [orin-cpufreq] policy0 (0-3), policy4 (4-5)
        cpu_max_khz=1510400,  # [orin-cpufreq] lscpu max 1510.4 MHz
        gpu_hz=_GPU_HZ,
        gpu_capacitance=10626.0,  # the NX fit (same 1024-core GPU)
        gpu_ops_per_cycle=2048.0,
        emc_hz=ORIN_EMC_HZ[:3],
        emc_bytes_per_cycle=32.0,  # [orin-datasheet] 128-bit bus, double data rate
        mem_capacitance=816.3,  # 900 at the old fixed 1000 mV, rescaled to VDD2H
        cv_online=False,  # [jtop] cv0-2 fused off on Nano
        rails=p3767_rails(0.9),
        board_static_w=2.55,
        soc_static_w=0.9,
        package_r=3.2,
        package_c=30.0,
        # [orin-nvpm] p3767_0003 modes 0 15W, 1 7W (7W clocks assumed).
        nvpmodel=(
            NvpModel(0, "15W", 6, 1_510_400_000, 624_750_000, 0),
            NvpModel(1, "7W", 4, 960_000_000, 408_000_000, 0),
        ),
        nvpmodel_default=0,
        nvpmodel_conf="nvpmodel_p3767_0003.conf",
        quirks=orin_quirks(ina_shunt_uohm=5000),  # [tegra234-dt] 5 mOhm shunts
        engines=(),  # [orin-dla] the Orin Nano modules have no DLA
        extra_assumed={
            "domains.gpu.available_hz": "only min 306 and max 624.75 MHz are given; 102 MHz steps assumed between",
            "domains.memory.available_hz": "Nano non-Super EMC assumed capped at 2133 MHz",
            "nvpmodel[7W]": "7W mode clocks assumed (4 cores, 960 MHz CPU, 408 MHz GPU)",
        },
    )
