"""Jetson Orin NX 16GB (p3767-0000) on JetPack 6 (``jp6``) or 5 (``jp5``): the twin's board data.

Source keys in brackets resolve in ``docs/sources.md``.
"""

from __future__ import annotations

from ..schema import NvpModel, SocProfile
from .orin import ORIN_EMC_HZ, dla_engines, orin_profile, orin_quirks, p3767_rails

__all__ = ["orin_nx_profile"]

# [nvgpu] NX 16GB JP6 available_frequencies: 306-918 MHz in 102 MHz steps.
_GPU_HZ = tuple(306_000_000 + 102_000_000 * i for i in range(7))

# [orin-nvpm] the NX 16GB confs cap both DLA cores at 614.4 MHz in 15W and 25W; their debugfs
# engine clocks are laid out as the AGX's [jtop] (name, rate Hz).
_DLA_HZ = 614_400_000
_DEBUG_CLOCKS = (("dla0_core", _DLA_HZ), ("dla1_core", _DLA_HZ))


def orin_nx_profile() -> SocProfile:
    """Jetson Orin NX 16GB (p3767-0000) on JetPack 6 (``jp6``) or 5 (``jp5``)."""
    return orin_profile(
        name="orin-nx",
        # [orin-datasheet] 2x4 A78AE, 1024-core Ampere GPU, 128-bit LPDDR5; [orin-dla] 2 DLA.
        description="NVIDIA Jetson Orin NX 16GB: 2x4 Cortex-A78AE, Ampere GPU (1024 cores), 128-bit LPDDR5 EMC, "
        "2 DLA",
        model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
        compatible=("nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"),  # [tegra234-dt]
        clusters=((0, 1, 2, 3), (4, 5, 6, 7)),  # [orin-cpufreq] policy0, policy4
        cpu_max_khz=1984000,  # [orin-cpufreq]
        gpu_hz=_GPU_HZ,
        gpu_capacitance=10626.0,  # fitted (see ``assumed``)
        gpu_ops_per_cycle=2048.0,
        emc_hz=ORIN_EMC_HZ,
        emc_bytes_per_cycle=32.0,  # [orin-datasheet] 128-bit bus, double data rate
        mem_capacitance=1224.5,  # fitted to [practitioner-yolo] DDR 1.4 W at VDD2H
        cv_online=False,  # [jtop] cv0-2 fused off on NX
        rails=p3767_rails(1.15),
        board_static_w=3.1,
        soc_static_w=1.15,
        package_r=3.0,
        package_c=35.0,
        # [orin-nvpm] p3767_0000 modes: id, name, cores online, CPU/GPU/EMC caps (EMC 0 = none).
        nvpmodel=(
            NvpModel(0, "MAXN", 8, 1_984_000_000, 918_000_000, 0),
            NvpModel(1, "10W", 4, 1_190_400_000, 612_000_000, 2_133_000_000),
            NvpModel(2, "15W", 4, 1_651_200_000, 612_000_000, 3_199_000_000),
            NvpModel(3, "25W", 8, 1_497_600_000, 408_000_000, 3_199_000_000),
        ),
        nvpmodel_default=2,  # [orin-nvpm] PM_CONFIG DEFAULT=2
        nvpmodel_conf="nvpmodel_p3767_0000.conf",
        quirks=orin_quirks(ina_shunt_uohm=5000, debug_clocks=_DEBUG_CLOCKS),  # [tegra234-dt] 5 mOhm shunts
        engines=dla_engines(2, _DLA_HZ),  # [orin-dla] 2 NVDLA v2.0 on the 16GB module (1 on the 8GB)
        extra_assumed={
            "domains.gpu.available_hz(jp5)": "the NX JP5 GPU list is not given; the JP6 list is used",
            "quirks.debug_clocks": "NX engine clocks: only the DLA cores', at the 15W/25W cap [orin-nvpm]; the other "
            "engines and the DLA falcon clocks of the AGX capture are not given for the NX",
        },
    )
