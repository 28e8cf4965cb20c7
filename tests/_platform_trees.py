"""Small sysfs trees for the platform tests, in the layouts the kernel's sysfs ABI documents.

Layouts: https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-devices-system-cpu
(cpufreq), .../ABI/testing/sysfs-class-devfreq, .../ABI/testing/sysfs-class-thermal and, for
the Jetson-only files (INA3221, bpmp EMC, ``/etc/nv_tegra_release``), the Jetson Linux
Developer Guide (https://docs.nvidia.com/jetson/archives/r36.4/DeveloperGuide/), whose
platform power and performance pages the Orin clocks follow; the RK3588 clocks follow its
OPP tables in Linux (arch/arm64/boot/dts/rockchip/rk3588*.dtsi).

These are deliberately independent of hetsched.testing (the twin's full builders) so
parsers and readers are checked against the reference, not against the twin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class Link:
    """A symlink entry: ``Link("../cpufreq/policy0")``."""

    def __init__(self, target: str) -> None:
        self.target = target


Tree = Mapping[str, "str | bytes | Link"]


def write_tree(root: Path, tree: Tree) -> Path:
    """Write ``tree`` under ``root``; directories are created as needed, links last."""
    links = []
    for rel, content in tree.items():
        path = root / rel
        if isinstance(content, Link):
            links.append((path, content.target))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    for path, target in links:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
    return root


RK_A55 = "408000 600000 816000 1008000 1200000 1416000 1608000 1800000 \n"
RK_A76 = "408000 600000 816000 1008000 1200000 1416000 1608000 1800000 2016000 2208000 2256000 \n"
RK_GOVS = "interactive conservative ondemand userspace powersave performance schedutil \n"
RK_DEVFREQ_GOVS = "rknpu_ondemand dmc_ondemand userspace powersave performance simple_ondemand \n"
PROC_STAT = (
    "cpu  26716126 25174 7198445 948399047 900582 0 354519 0 0 0\n"
    + "".join(f"cpu{n} 1673575 1889 461134 59280326 55795 0 10322 0 0 0\n" for n in range(8))
    + "intr 1 2 3\nctxt 5\nbtime 1\nprocesses 2\nprocs_running 1\nprocs_blocked 0\nsoftirq 1 2\n"
)


def rk3588_tree(*, mainline: bool = False) -> dict[str, str | bytes | Link]:
    t: dict[str, str | bytes | Link] = {}
    cpu = "sys/devices/system/cpu"
    for f in ("online", "possible", "present"):
        t[f"{cpu}/{f}"] = "0-7\n"
    policies = {0: ("0 1 2 3", RK_A55, "1800000"), 4: ("4 5", RK_A76, "2256000"), 6: ("6 7", RK_A76, "2256000")}
    for n, (cpus, freqs, top) in policies.items():
        p = f"{cpu}/cpufreq/policy{n}"
        t[f"{p}/related_cpus"] = cpus + "\n"
        t[f"{p}/affected_cpus"] = cpus + "\n"
        t[f"{p}/scaling_available_frequencies"] = freqs
        t[f"{p}/scaling_available_governors"] = RK_GOVS
        for f, v in {
            "scaling_governor": "ondemand",
            "scaling_driver": "cpufreq-dt",
            "scaling_setspeed": "<unsupported>",
            "cpuinfo_transition_latency": "40000",
            "cpuinfo_min_freq": "408000",
            "cpuinfo_max_freq": top,
            "scaling_min_freq": "408000",
            "scaling_max_freq": top,
            "scaling_cur_freq": "816000",
            "cpuinfo_cur_freq": "816000",
        }.items():
            t[f"{p}/{f}"] = v + "\n"
        for k in map(int, cpus.split()):
            t[f"{cpu}/cpu{k}/cpufreq"] = Link(f"../cpufreq/policy{n}")
    t["proc/cpuinfo"] = "".join(
        f"processor\t: {k}\nBogoMIPS\t: 48.00\nCPU implementer\t: 0x41\nCPU part\t: {'0xd05' if k < 4 else '0xd0b'}\n\n"
        for k in range(8)
    )
    t["proc/stat"] = PROC_STAT
    plat = "sys/devices/platform"
    t["sys/class/devfreq/fb000000.gpu"] = Link("../../devices/platform/fb000000.gpu/devfreq/fb000000.gpu")
    g = f"{plat}/fb000000.gpu/devfreq/fb000000.gpu"
    t[f"{g}/available_frequencies"] = (
        "1000000000 900000000 800000000 700000000 600000000 500000000 400000000 300000000 \n"
    )
    t[f"{g}/available_governors"] = RK_DEVFREQ_GOVS
    for f, v in {
        "governor": "simple_ondemand",
        "cur_freq": "300000000",
        "target_freq": "300000000",
        "min_freq": "300000000",
        "max_freq": "1000000000",
        "load": "0@300000000Hz",
        "polling_interval": "50",
        "name": "fb000000.gpu",
    }.items():
        t[f"{g}/{f}"] = v + "\n"
    t[f"{g}/device"] = Link("../../../fb000000.gpu")
    t[f"{plat}/fb000000.gpu/utilisation"] = "0\n"
    t["sys/class/devfreq/fdab0000.npu"] = Link("../../devices/platform/fdab0000.npu/devfreq/fdab0000.npu")
    npu = f"{plat}/fdab0000.npu/devfreq/fdab0000.npu"
    t[f"{npu}/available_frequencies"] = (
        "300000000 400000000 500000000 600000000 700000000 800000000 900000000 1000000000 \n"
    )
    t[f"{npu}/available_governors"] = RK_DEVFREQ_GOVS
    t[f"{npu}/governor"] = "rknpu_ondemand\n"
    t[f"{npu}/cur_freq"] = "1000000000\n"
    t[f"{npu}/min_freq"] = "300000000\n"
    t[f"{npu}/max_freq"] = "1000000000\n"
    t[f"{npu}/load"] = "0@1000000000Hz\n"
    t["sys/class/devfreq/dmc"] = Link("../../devices/platform/dmc/devfreq/dmc")
    d = f"{plat}/dmc/devfreq/dmc"
    t[f"{d}/available_frequencies"] = "528000000 1068000000 1560000000 2112000000 \n"
    t[f"{d}/available_governors"] = RK_DEVFREQ_GOVS
    t[f"{d}/governor"] = "dmc_ondemand\n"
    t[f"{d}/cur_freq"] = "528000000\n"
    t[f"{d}/min_freq"] = "528000000\n"
    t[f"{d}/max_freq"] = "2112000000\n"
    t[f"{d}/load"] = "12@528000000Hz\n"
    t[f"{d}/upthreshold"] = "25\n"
    t[f"{d}/downdifferential"] = "20\n"
    t["sys/class/devfreq/fdd90000.vop"] = Link("../../devices/platform/fdd90000.vop/devfreq/fdd90000.vop")
    t[f"{plat}/fdd90000.vop/devfreq/fdd90000.vop/cur_freq"] = "500000000\n"
    t["sys/kernel/debug/rknpu/load"] = "NPU load:  Core0:  0%, Core1:  0%, Core2:  0%,\n"
    t["sys/kernel/debug/rknpu/version"] = "RKNPU driver: v0.9.8\n"
    t["sys/module/rknpu/version"] = "0.9.8\n"
    types = (
        ["package-thermal", "bigcore0-thermal", "bigcore2-thermal", "littlecore-thermal", "center-thermal", "gpu-thermal", "npu-thermal"]
        if mainline
        else ["soc-thermal", "bigcore0-thermal", "bigcore1-thermal", "littlecore-thermal", "center-thermal", "gpu-thermal", "npu-thermal"]
    )
    for i, ty in enumerate(types):
        z = f"sys/devices/virtual/thermal/thermal_zone{i}"
        t[f"sys/class/thermal/thermal_zone{i}"] = Link(f"../../devices/virtual/thermal/thermal_zone{i}")
        t[f"{z}/type"] = ty + "\n"
        t[f"{z}/temp"] = "44384\n"
        t[f"{z}/mode"] = "enabled\n"
        t[f"{z}/policy"] = ("power_allocator" if i == 0 else "step_wise") + "\n"
        if i == 0:
            for k, (temp, typ) in enumerate([(75000, "passive"), (85000, "passive"), (115000, "critical")]):
                t[f"{z}/trip_point_{k}_temp"] = f"{temp}\n"
                t[f"{z}/trip_point_{k}_type"] = typ + "\n"
                t[f"{z}/trip_point_{k}_hyst"] = "2000\n"
        else:
            t[f"{z}/trip_point_0_temp"] = "115000\n"
            t[f"{z}/trip_point_0_type"] = "critical\n"
            t[f"{z}/trip_point_0_hyst"] = "2000\n"
    psy = "sys/class/power_supply/tcpm-source-psy-4-0022"
    for f, v in {
        "online": "1",
        "type": "USB",
        "usb_type": "C [PD] PD_PPS",
        "voltage_now": "20000000",
        "current_now": "1500000",
    }.items():
        t[f"{psy}/{f}"] = v + "\n"
    t["proc/device-tree/compatible"] = b"radxa,rock-5b\0rockchip,rk3588\0"
    t["proc/device-tree/model"] = b"Radxa ROCK 5B\0"
    return t


ORIN_NX_CPU = (
    "115200 192000 268800 345600 422400 499200 576000 652800 729600 806400 883200 960000 1036800 "
    "1113600 1190400 1267200 1344000 1420800 1497600 1574400 1651200 1728000 1804800 1881600 1958400 1984000 \n"
)


ORIN_NX_POSSIBLE_RATES = "204000 665600 2133000 3199000 (kHz)\n"
"""The L4T ``bpmp/debug/emc/possible_rates`` of an Orin NX (kHz, with the unit marker)."""


def orin_nx_tree(
    *, jp5: bool = False, fused_cv: str = "eagain", emc_rates: str | None = ORIN_NX_POSSIBLE_RATES
) -> dict[str, str | bytes | Link]:
    """Orin NX 16 GB. ``fused_cv``: ``"-256000"`` writes that value; ``"eagain"`` leaves ``temp`` for the test to make flaky.
    ``emc_rates``: content of ``possible_rates``; None leaves the file out (an older kernel)."""
    t: dict[str, str | bytes | Link] = {}
    cpu = "sys/devices/system/cpu"
    t[f"{cpu}/online"] = "0-7\n"
    for n in (0, 4):
        p = f"{cpu}/cpufreq/policy{n}"
        t[f"{p}/related_cpus"] = ("0 1 2 3" if n == 0 else "4 5 6 7") + "\n"
        t[f"{p}/scaling_available_frequencies"] = ORIN_NX_CPU
        t[f"{p}/scaling_available_governors"] = "userspace ondemand performance schedutil \n"
        t[f"{p}/scaling_governor"] = "schedutil\n"
        t[f"{p}/scaling_min_freq"] = "729600\n"
        t[f"{p}/scaling_max_freq"] = "1984000\n"
        t[f"{p}/scaling_cur_freq"] = "1420800\n"
        t[f"{p}/cpuinfo_min_freq"] = "115200\n"
        t[f"{p}/cpuinfo_max_freq"] = "1984000\n"
        t[f"{p}/scaling_setspeed"] = "<unsupported>\n"
    for k in range(8):
        t[f"{cpu}/cpu{k}/online"] = "1\n"
        t[f"{cpu}/cpu{k}/cpufreq"] = Link(f"../cpufreq/policy{0 if k < 4 else 4}")
    t["proc/stat"] = PROC_STAT
    if jp5:
        dev = "sys/devices/platform/17000000.ga10b"
        node = "17000000.ga10b"
        of_name = b"ga10b\0"
        t["sys/devices/17000000.ga10b"] = Link("platform/17000000.ga10b")
        t["sys/devices/gpu.0"] = Link("platform/17000000.ga10b")
        t["sys/class/devfreq/17000000.ga10b"] = Link("../../devices/platform/17000000.ga10b/devfreq/17000000.ga10b")
    else:
        dev = "sys/devices/platform/bus@0/17000000.gpu"
        node = "17000000.gpu"
        of_name = b"gpu\0"
        t["sys/class/devfreq/17000000.gpu"] = Link("../../devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu")
        t["sys/devices/platform/gpu.0"] = Link("bus@0/17000000.gpu")
        t["sys/devices/platform/bus@0/gpu.0"] = Link("17000000.gpu")
    t[f"{dev}/load"] = "537\n"
    t[f"{dev}/railgate_enable"] = "1\n"
    t[f"{dev}/of_node/name"] = of_name
    g = f"{dev}/devfreq/{node}"
    t[f"{g}/available_frequencies"] = "306000000 408000000 510000000 612000000 714000000 816000000 918000000 \n"
    t[f"{g}/available_governors"] = "nvhost_podgov userspace performance simple_ondemand \n"
    t[f"{g}/cur_freq"] = "306000000\n"
    t[f"{g}/min_freq"] = "306000000\n"
    t[f"{g}/max_freq"] = "918000000\n"
    t[f"{g}/governor"] = "nvhost_podgov\n"
    t[f"{g}/device"] = Link(f"../../../{dev.rsplit('/', 1)[1]}")
    emc = "sys/kernel/debug/bpmp/debug/clk/emc"
    t[f"{emc}/rate"] = "2133000000\n"
    t[f"{emc}/min_rate"] = "204000000\n"
    t[f"{emc}/max_rate"] = "3199000000\n"
    t[f"{emc}/mrq_rate_locked"] = "0\n"
    if emc_rates is not None:
        t["sys/kernel/debug/bpmp/debug/emc/possible_rates"] = emc_rates
    t["sys/kernel/nvpmodel_emc_cap/emc_iso_cap"] = "0\n"
    t["sys/kernel/actmon_avg_activity/mc_all"] = "21330000\n"
    names = (
        ["CPU-therm", "GPU-therm", "CV0-therm", "CV1-therm", "CV2-therm", "SOC0-therm", "SOC1-therm", "SOC2-therm", "tj-therm"]
        if jp5
        else ["cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal", "soc0-thermal", "soc1-thermal", "soc2-thermal", "tj-thermal"]
    )
    for i, ty in enumerate(names):
        z = f"sys/devices/virtual/thermal/thermal_zone{i}"
        t[f"sys/class/thermal/thermal_zone{i}"] = Link(f"../../devices/virtual/thermal/thermal_zone{i}")
        t[f"{z}/type"] = ty + "\n"
        is_cv = ty.lower().startswith("cv")
        t[f"{z}/temp"] = ("-256000" if is_cv and fused_cv == "-256000" else "48000") + "\n"
        if not is_cv:
            t[f"{z}/trip_point_0_temp"] = "99000\n"
            t[f"{z}/trip_point_0_type"] = "passive\n"
    i2c = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040"
    t["sys/bus/i2c/devices/1-0040"] = Link("../../../devices/platform/bus@0/c240000.i2c/i2c-1/1-0040")
    t["sys/bus/i2c/drivers/ina3221/1-0040"] = Link("../../../../devices/platform/bus@0/c240000.i2c/i2c-1/1-0040")
    t[f"{i2c}/name"] = "ina3221\n"
    h = f"{i2c}/hwmon/hwmon1"
    for f, v in {
        "name": "ina3221",
        "in1_label": "VDD_IN",
        "in2_label": "VDD_CPU_GPU_CV",
        "in3_label": "VDD_SOC",
        "in7_label": "sum of shunt voltages",
        "in1_input": "5048",
        "curr1_input": "957",
        "in2_input": "5048",
        "curr2_input": "245",
        "in3_input": "5048",
        "curr3_input": "285",
        "shunt1_resistor": "5000",
    }.items():
        t[f"{h}/{f}"] = v + "\n"
    t["sys/class/hwmon/hwmon1"] = Link("../../devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1")
    t["sys/class/hwmon/hwmon0/name"] = "pwmfan\n"
    t["sys/class/hwmon/hwmon0/pwm1"] = "62\n"
    t["etc/nv_tegra_release"] = (
        "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n"
        if jp5
        else "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n"
    )
    t["proc/device-tree/compatible"] = b"nvidia,p3768-0000+p3767-0000\0nvidia,p3767-0000\0nvidia,tegra234\0"
    return t
