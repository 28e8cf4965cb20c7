"""The Jetson Linux (L4T) part of a board tree: nvgpu GPU, BPMP EMC, INA3221, fan, nvpmodel.

Paths and formats follow ``docs/sources.md``: [nvgpu] the GPU device and its ``gpu.0`` aliases
(JP6 ``bus@0/17000000.gpu``, JP5 ``17000000.ga10b``), ``load`` in per-mille; [orin-emc] the
root-only bpmp debugfs EMC clock, ``emc_iso_cap`` and ``mc_all`` activity (jtop reads
``EMC% = mc_all / rate_kHz``); [orin-emc-rates] the EMC rate table ``emc/possible_rates``;
[tegra234-dt] [kernel-hwmon] the INA3221 channels and shunts;
[orin-nvpm] the nvpmodel conf block format; [jtop] the engine clocks under debugfs.
"""

from __future__ import annotations

from pathlib import Path

from .schema import DomainProfile
from .state import BoardState
from .tree_files import TreeFiles, khz

__all__ = ["TegraTree"]


class TegraTree:
    """Writes the vendor-specific files of a Jetson board into ``files``."""

    def __init__(self, files: TreeFiles) -> None:
        self.files = files
        self._ina_dirs: dict[str, Path] = {}

    def devfreq_dir(self, d: DomainProfile) -> tuple[str, str]:
        """(devfreq device name, its directory relative to the root) of the GPU."""
        jp6 = self.files.variant == "jp6"
        name = "17000000.gpu" if jp6 else "17000000.ga10b"
        dev = "sys/devices/platform/bus@0/17000000.gpu" if jp6 else "sys/devices/platform/17000000.ga10b"
        return name, f"{dev}/devfreq/{name}"

    def domain_static(self, d: DomainProfile) -> None:
        if d.kind == "gpu":
            self._gpu_static(d)
        elif d.kind == "memory":
            self._emc_static(d)

    def domain_render(self, d: DomainProfile, state: BoardState) -> None:
        if d.kind == "gpu":
            self._gpu_render(d, state)
        else:
            self._emc_render(d, state)

    def _gpu_static(self, d: DomainProfile) -> None:
        t = self.files
        name, df = self.devfreq_dir(d)
        jp6 = t.variant == "jp6"
        dev = "sys/devices/platform/bus@0/17000000.gpu" if jp6 else "sys/devices/platform/17000000.ga10b"
        t.devfreq_static(d, name, df, [o.freq_hz for o in d.opps], dev)
        # Spec form: device L= ../../../17000000.gpu (same target as the relpath).
        t.put(f"{df}/polling_interval", "25\n", 0o644)
        t.put(f"{df}/timer", "deferrable\n", 0o644)
        for f, v in (("railgate_enable", "1"), ("tpc_pg_mask", "0"), ("enable_3d_scaling", "1"),
                     ("is_railgated", "1"), ("gpu_powered_on", "0")):  # fmt: skip
            t.put(f"{dev}/{f}", f"{v}\n", 0o644)
        t.put(f"{dev}/power/control", "auto\n", 0o644)
        of_name = "gpu" if jp6 else "ga10b"
        of = "sys/firmware/devicetree/base/bus@0/gpu@17000000" if jp6 else "sys/firmware/devicetree/base/gpu@17000000"
        t.put(f"{of}/name", of_name + "\0")
        t.put(f"{of}/compatible", "nvidia,ga10b\0")
        t.link(f"{dev}/of_node", of)
        if jp6:
            t.link("sys/devices/platform/gpu.0", dev)
            t.link("sys/devices/platform/bus@0/gpu.0", dev)
        else:
            t.link("sys/devices/gpu.0", dev)
            t.link("sys/devices/platform/gpu.0", dev)
            t.link("sys/devices/17000000.ga10b", dev)
        t.dyn["gpu_dev"] = t.path(dev)

    def _gpu_render(self, d: DomainProfile, state: BoardState) -> None:
        t = self.files
        ds = state.domains[d.name]
        t.devfreq_render(d, state, t.dyn[d.name])
        dev = t.dyn["gpu_dev"]
        t.put(dev / "load", f"{min(1000, max(0, round(ds.util * 1000)))}\n")
        gated = ds.util <= 0.0
        t.put(dev / "is_railgated", f"{int(gated)}\n", 0o644)
        t.put(dev / "gpu_powered_on", f"{int(not gated)}\n", 0o644)

    def _emc_static(self, d: DomainProfile) -> None:
        t = self.files
        t.mkdir("sys/kernel/debug", 0o700)
        emc = "sys/kernel/debug/bpmp/debug/clk/emc"
        for p in ("sys/kernel/debug/bpmp", "sys/kernel/debug/bpmp/debug", "sys/kernel/debug/bpmp/debug/clk", emc):
            t.mkdir(p, 0o700)
        t.put(f"{emc}/min_rate", f"{d.min_hz}\n", 0o400)
        t.put(f"{emc}/max_rate", f"{d.max_hz}\n", 0o400)
        # [orin-emc-rates] L4T publishes the table beside clk/: kHz, then the unit marker.
        t.mkdir("sys/kernel/debug/bpmp/debug/emc", 0o700)
        rates = " ".join(str(khz(hz)) for hz in d.available_hz)
        t.put("sys/kernel/debug/bpmp/debug/emc/possible_rates", f"{rates} (kHz)\n", 0o400)
        for knob in ("rate", "mrq_rate_locked"):
            t.knobs[t.path(f"{emc}/{knob}")] = (d.name, knob)
        t.knobs[t.path("sys/kernel/nvpmodel_emc_cap/emc_iso_cap")] = (d.name, "emc_iso_cap")
        t.dyn["emc"] = t.path(emc)

    def _emc_render(self, d: DomainProfile, state: BoardState) -> None:
        t = self.files
        ds = state.domains[d.name]
        emc = t.dyn["emc"]
        t.put(emc / "rate", f"{ds.cur_hz}\n", 0o600)
        t.put(emc / "mrq_rate_locked", f"{int(state.emc_locked)}\n", 0o600)
        t.put("sys/kernel/nvpmodel_emc_cap/emc_iso_cap", f"{state.emc_iso_cap_hz}\n", 0o644)
        pct = min(100, max(0, round(ds.util * 100)))
        t.put("sys/kernel/actmon_avg_activity/mc_all", f"{pct * (ds.cur_hz // 1000)}\n")

    def extras_static(self) -> None:
        t = self.files
        prof = t.profile
        i2c = "sys/devices/platform/bus@0/c240000.i2c/i2c-1"
        devices = sorted({r.ina_device for r in prof.rails if r.ina_device})
        hw = 0
        fan = f"sys/devices/platform/pwm-fan/hwmon/hwmon{hw}"
        t.put(f"{fan}/name", "pwmfan\n")
        t.put(f"{fan}/pwm1_enable", "1\n", 0o644)
        t.link(f"sys/class/hwmon/hwmon{hw}", fan)
        t.dyn["fan"] = t.path(fan)
        hw += 1
        t.dyn["ina"] = t.root  # marker
        for dev in devices:
            dpath = f"{i2c}/{dev}"
            t.put(f"{dpath}/name", "ina3221\n")
            t.put(f"{dpath}/uevent", "DRIVER=ina3221\n")
            t.link(f"sys/bus/i2c/devices/{dev}", dpath)
            t.link(f"sys/bus/i2c/drivers/ina3221/{dev}", dpath)
            hd = f"{dpath}/hwmon/hwmon{hw}"
            t.link(f"sys/class/hwmon/hwmon{hw}", hd)
            hw += 1
            shunt = prof.quirks.ina_shunt_uohm
            t.put(f"{hd}/name", "ina3221\n")
            chans = {r.ina_channel: r for r in prof.rails if r.ina_device == dev}
            for ch in (1, 2, 3):
                r = chans.get(ch)
                t.put(f"{hd}/in{ch}_label", f"{r.name if r else 'NC'}\n")
                t.put(f"{hd}/shunt{ch}_resistor", f"{shunt}\n", 0o644)
                t.put(f"{hd}/in{ch}_enable", f"{int(r is not None)}\n", 0o644)
                for f in ("curr{}_max", "curr{}_crit"):
                    t.put(f"{hd}/{f.format(ch)}", "7784\n", 0o644)
                for f in ("curr{}_max_alarm", "curr{}_crit_alarm"):
                    t.put(f"{hd}/{f.format(ch)}", "0\n")
            t.put(f"{hd}/in7_label", "sum of shunt voltages\n")
            t.put(f"{hd}/samples", "512\n", 0o644)
            t.put(f"{hd}/update_interval", "140\n", 0o644)
            self._ina_dirs[dev] = t.path(hd)
        tach = f"sys/devices/platform/pwm-tach/hwmon/hwmon{hw}"
        t.put(f"{tach}/name", "pwm_tach\n")
        t.link(f"sys/class/hwmon/hwmon{hw}", tach)
        t.dyn["tach"] = t.path(tach)
        t.mkdir("sys/kernel/debug", 0o700)
        if prof.quirks.debug_clocks:
            t.mkdir("sys/kernel/debug/clk", 0o700)
            for eng, rate in prof.quirks.debug_clocks:
                c = f"sys/kernel/debug/clk/{eng}"
                t.mkdir(c, 0o700)
                t.put(f"{c}/clk_enable_count", "0\n", 0o400)
                t.put(f"{c}/clk_rate", f"{rate}\n", 0o400)
                t.put(f"{c}/clk_max_rate", "18446744073709551615\n", 0o400)
                t.put(f"{c}/clk_min_rate", "0\n", 0o400)
        # Release files.
        if t.variant == "jp6":
            rel = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n"
        else:
            rel = "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n"
        t.put("etc/nv_tegra_release", rel)
        conf = prof.nvpmodel_conf or "nvpmodel.conf"
        t.put(f"etc/nvpmodel/{conf}", self._nvpmodel_conf_text(), 0o644)
        t.link("etc/nvpmodel.conf", f"etc/nvpmodel/{conf}")
        t.put("var/lib/nvpmodel/status", f"pmode:{prof.nvpmodel_default:04d} fmode:quiet\n", 0o644)

    def _nvpmodel_conf_text(self) -> str:
        t = self.files
        prof = t.profile
        cpus = [d for d in prof.domains if d.kind == "cpu"]
        lines = ["# nvpmodel configuration (SoC twin rendering; modes: docs/sources.md [orin-nvpm])", ""]
        lines.append("< PARAM TYPE=FILE NAME=CPU_ONLINE >")
        for c in range(prof.cpu_count):
            lines.append(f"CORE_{c} /sys/devices/system/cpu/cpu{c}/online")
        lines.append("")
        for i, d in enumerate(cpus):
            lines.append(f"< PARAM TYPE=CLOCK NAME=CPU_A78_{i} >")
            lines.append(f"FREQ_TABLE /sys/devices/system/cpu/cpu{d.cpus[0]}/cpufreq/scaling_available_frequencies")
            lines.append(f"MAX_FREQ /sys/devices/system/cpu/cpu{d.cpus[0]}/cpufreq/scaling_max_freq")
            lines.append(f"MIN_FREQ /sys/devices/system/cpu/cpu{d.cpus[0]}/cpufreq/scaling_min_freq")
            lines.append("")
        gdf = "/" + self.devfreq_dir(prof.domain("gpu"))[1]
        lines += ["< PARAM TYPE=CLOCK NAME=GPU >", f"FREQ_TABLE {gdf}/available_frequencies",
                  f"MAX_FREQ {gdf}/max_freq", f"MIN_FREQ {gdf}/min_freq", "",
                  "< PARAM TYPE=CLOCK NAME=EMC >", "MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap", ""]
        for m in prof.nvpmodel:
            lines.append(f"< POWER_MODEL ID={m.id} NAME={m.name} >")
            for c in range(prof.cpu_count):
                lines.append(f"CPU_ONLINE CORE_{c} {int(c < m.cpus_online)}")
            for i, _ in enumerate(cpus):
                lines.append(f"CPU_A78_{i} MIN_FREQ 729600")
                lines.append(f"CPU_A78_{i} MAX_FREQ {m.cpu_max_hz // 1000}")
            lines.append("GPU MIN_FREQ 0")
            lines.append(f"GPU MAX_FREQ {m.gpu_max_hz}")
            lines.append(f"EMC MAX_FREQ {m.emc_max_hz}")
            lines.append("")
        lines.append(f"< PM_CONFIG DEFAULT={prof.nvpmodel_default} >")
        return "\n".join(lines) + "\n"

    def extras_render(self, state: BoardState) -> None:
        t = self.files
        bus_mv = 5048
        for dev, hd in self._ina_dirs.items():
            chans = {r.ina_channel: r for r in t.profile.rails if r.ina_device == dev}
            shunt_sum = 0
            for ch in (1, 2, 3):
                r = chans.get(ch)
                if r is None:
                    t.put(hd / f"in{ch}_input", "0\n")
                    t.put(hd / f"curr{ch}_input", "0\n")
                    t.put(hd / f"in{ch + 3}_input", "0\n")
                    continue
                p = state.rail_power_w.get(r.name, 0.0)
                ma = round(p * 1e6 / bus_mv)
                t.put(hd / f"in{ch}_input", f"{bus_mv}\n")
                t.put(hd / f"curr{ch}_input", f"{ma}\n")
                shunt_uv = round(ma * t.profile.quirks.ina_shunt_uohm / 1000)
                shunt_sum += shunt_uv
                t.put(hd / f"in{ch + 3}_input", f"{shunt_uv}\n")
            t.put(hd / "in7_input", f"{shunt_sum}\n")
        t.put(t.dyn["fan"] / "pwm1", f"{state.fan_pwm}\n", 0o644)
        t.put(t.dyn["tach"] / "rpm", f"{round(state.fan_pwm / 255 * 9700)}\n")
