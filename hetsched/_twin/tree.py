"""Materialise a twin board's sysfs/procfs tree under a root, exactly as the board shows it.

Layouts, units and formats follow ``/work/shared/reference/soc-sysfs.md`` ("Fixture spec"),
with the kernel's own formatting where the spec abbreviates: cpufreq lists
(``scaling_available_frequencies``, ``related_cpus``, governors) and devfreq lists end in a
trailing space before the newline; cpufreq is in kHz, devfreq and EMC in Hz, thermal in
millidegrees C, hwmon in mV/mA/uW. Class entries are *relative* symlinks into
``sys/devices`` (the kernel's form), so a reader resolving them never leaves the root.

Permissions follow the kernel: writable knobs 0644, read-only attributes 0444,
``cpuinfo_cur_freq`` 0400, ``stats/reset`` 0200, debugfs directories 0700 with 0400/0600
files. (Running as root bypasses mode bits, as it does on a board.)

Unreadable sensors: an offline/fused-off Orin zone (cv0-2 on NX/Nano) reads ``-256000``
(the JP releases that report it so) or, with ``offline_style="eagain"``, the ``temp`` file is
left *empty*: on a board ``read()`` fails with EAGAIN and Python's buffered ``read_text``
yields no data; a regular file cannot fail a read, so an empty read is the faithful
stand-in. Parsers must treat both as "no reading".

All writes go through :meth:`BoardTree.put`, which writes atomically (temp file +
``os.replace``) and remembers the bytes, so a live twin can tell the runtime's writes
from its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from .._errors import PathOutsideRootError, TwinError
from .profiles import DomainProfile, SocProfile
from .state import BoardState, boot_state, governors_for

__all__ = ["BoardTree", "OfflineStyle"]

OfflineStyle = Literal["-256000", "eagain"]

_RK_DEVFREQ_NAMES = {"gpu": "fb000000.gpu", "npu": "fdab0000.npu", "memory": "dmc"}
_RK_OF_NODES = {"gpu": "gpu@fb000000", "npu": "npu@fdab0000", "memory": "dmc"}
_GOV_TUNABLES = {
    "ondemand": {"up_threshold": "80", "sampling_rate": "40000", "sampling_down_factor": "1",
                 "ignore_nice_load": "0", "io_is_busy": "0", "powersave_bias": "0"},
    "conservative": {"up_threshold": "80", "down_threshold": "20", "freq_step": "5", "sampling_rate": "40000",
                     "sampling_down_factor": "1", "ignore_nice_load": "0"},
    "schedutil": {"rate_limit_us": "40"},
    "interactive": {"hispeed_freq": "0", "go_hispeed_load": "90", "target_loads": "90",
                    "min_sample_time": "80000", "timer_rate": "20000", "above_hispeed_delay": "20000"},
}  # fmt: skip


def _khz(hz: int) -> int:
    return hz // 1000


def _list(values: Iterator[object] | tuple[object, ...] | list[object]) -> str:
    # The kernel prints "%u " per entry then "\n": a trailing space.
    return "".join(f"{v} " for v in values) + "\n"


class BoardTree:
    """The files of one board under ``root``; renders a :class:`BoardState` into them.

    Raises:
        TwinError: ``root`` exists and is not a directory.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        profile: SocProfile,
        variant: str | None = None,
        *,
        offline_style: OfflineStyle = "-256000",
    ) -> None:
        self.root = Path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise TwinError(f"twin root {self.root} exists and is not a directory")
        self.profile = profile
        self.variant = variant if variant is not None else profile.default_variant
        self.layout = profile.layout(self.variant)
        self.offline_style: OfflineStyle = offline_style
        self._written: dict[Path, bytes] = {}
        self.knobs: dict[Path, tuple[str, str]] = {}
        """Writable path -> (domain or "", knob) the live twin watches."""
        self.dyn: dict[str, Path] = {}
        self._userspace_dirs: dict[str, Path] = {}
        self._gov_parent: dict[str, Path] = {}

    # -- low level ------------------------------------------------------------

    def path(self, rel: str) -> Path:
        p = self.root / rel
        return p

    def put(self, rel: str | Path, text: str | bytes, mode: int = 0o444) -> Path:
        """Write ``text`` at ``rel`` (relative to the root) atomically with ``mode``.

        Raises:
            PathOutsideRootError: ``rel`` escapes the root.
        """
        p = rel if isinstance(rel, Path) and rel.is_absolute() else self.root / rel
        if not os.path.normpath(p).startswith(str(self.root) + os.sep):
            raise PathOutsideRootError(f"refusing to write {p}: outside twin root {self.root}")
        data = text.encode() if isinstance(text, str) else text
        if self._written.get(p) == data and p.exists():
            return p
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.twin-tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, p)
        self._written[p] = data
        return p

    def written(self, p: Path) -> bytes | None:
        """Bytes the twin itself last wrote at ``p``."""
        return self._written.get(p)

    def forget(self, p: Path) -> None:
        self._written.pop(p, None)

    def link(self, rel: str, target_rel: str) -> None:
        """Relative symlink at ``rel`` pointing at ``target_rel`` (both relative to the root)."""
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.root / target_rel, p.parent)
        if p.is_symlink() or p.exists():
            if p.is_symlink() and os.readlink(p) == target:
                return
            p.unlink()
        os.symlink(target, p)

    def mkdir(self, rel: str, mode: int = 0o755) -> Path:
        p = self.root / rel
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, mode)
        return p

    # -- whole tree -------------------------------------------------------------

    def materialise(self, state: BoardState | None = None) -> BoardState:
        """Create every directory, symlink and file, rendering ``state`` (boot state if None)."""
        if state is None:
            state = boot_state(self.profile, self.variant)
        self.root.mkdir(parents=True, exist_ok=True)
        self._static_common()
        for d in self.profile.domains:
            if d.kind == "cpu":
                self._cpufreq_static(d)
            elif self.profile.family == "rockchip":
                self._rk_devfreq_static(d)
            elif d.kind == "gpu":
                self._tegra_gpu_static(d)
            elif d.kind == "memory":
                self._tegra_emc_static(d)
        self._thermal_static()
        if self.profile.family == "rockchip":
            self._rk_extras()
        else:
            self._tegra_extras()
        self.render(state)
        return state

    def render(self, state: BoardState) -> None:
        """Rewrite every dynamic file from ``state`` (unchanged contents are skipped)."""
        prof = self.profile
        for d in prof.domains:
            if d.kind == "cpu":
                self._cpufreq_render(d, state)
            elif prof.family == "rockchip":
                self._rk_devfreq_render(d, state)
            elif d.kind == "gpu":
                self._tegra_gpu_render(d, state)
            else:
                self._tegra_emc_render(d, state)
        self._thermal_render(state)
        self._proc_stat_render(state)
        if prof.family == "rockchip":
            npu = state.domains["npu"]
            pct = min(100, max(0, round(npu.util * 100)))
            load = "NPU load: " + "".join(f" Core{i}: {pct:2d}%," for i in range(3)) + "\n"
            self.put("sys/kernel/debug/rknpu/load", load, 0o400)
            self.put("sys/kernel/debug/rknpu/freq", f"{npu.cur_hz}\n", 0o400)
        else:
            self._ina_render(state)

    # -- common -------------------------------------------------------------------

    def _static_common(self) -> None:
        prof = self.profile
        n = prof.cpu_count
        rng = f"0-{n - 1}\n"
        for f in ("online", "possible", "present"):
            self.put(f"sys/devices/system/cpu/{f}", rng)
        self.put("sys/devices/system/cpu/offline", "\n")
        base = "sys/firmware/devicetree/base"
        self.mkdir(base)
        self.put(f"{base}/compatible", "".join(c + "\0" for c in prof.compatible))
        self.put(f"{base}/model", prof.model + "\0")
        self.link("proc/device-tree", base)
        top = max(d.max_hz * d.capacity_dmips_mhz for d in prof.domains if d.kind == "cpu")
        cpuinfo = []
        for d in prof.domains:
            if d.kind != "cpu":
                continue
            cap = round(1024 * d.max_hz * d.capacity_dmips_mhz / top)
            for cpu in d.cpus:
                c = f"sys/devices/system/cpu/cpu{cpu}"
                self.mkdir(c)
                self.put(f"{c}/online", "1\n", 0o644)
                self.put(f"{c}/cpu_capacity", f"{cap}\n")
                self.link(f"{c}/cpufreq", f"sys/devices/system/cpu/cpufreq/policy{d.cpus[0]}")
                for s, name in enumerate(("WFI", "c7" if prof.family == "tegra" else "cpu-sleep")):
                    st = f"{c}/cpuidle/state{s}"
                    self.put(f"{st}/name", f"{name}\n")
                    self.put(f"{st}/disable", "0\n", 0o644)
                cpuinfo.append(
                    f"processor\t: {cpu}\nBogoMIPS\t: {'48.00' if prof.family == 'rockchip' else '62.50'}\n"
                    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                    "asimdrdm lrcpc dcpop asimddp\n"
                    "CPU implementer\t: 0x41\nCPU architecture: 8\n"
                    f"CPU variant\t: {'0x1' if d.cpu_part != '0xd05' else '0x2'}\n"
                    f"CPU part\t: {d.cpu_part}\nCPU revision\t: {'0' if d.cpu_part != '0xd42' else '1'}\n\n"
                )
        self.put("proc/cpuinfo", "".join(cpuinfo))

    def _proc_stat_render(self, state: BoardState) -> None:
        rows = state.cpu_jiffies
        total = [sum(col) for col in zip(*rows)]
        lines = ["cpu  " + " ".join(str(v) for v in total)]
        lines += [f"cpu{i} " + " ".join(str(v) for v in r) for i, r in enumerate(rows)]
        t = int(state.time_s)
        lines += [
            "intr 0",
            f"ctxt {1000 + 1200 * t}",
            "btime 1764489600",
            f"processes {1200 + t}",
            "procs_running 1",
            "procs_blocked 0",
            "softirq 0 0 0 0 0 0 0 0 0 0 0",
        ]
        self.put("proc/stat", "\n".join(lines) + "\n")

    # -- cpufreq ------------------------------------------------------------------

    def _policy(self, d: DomainProfile) -> str:
        return f"sys/devices/system/cpu/cpufreq/policy{d.cpus[0]}"

    def _cpufreq_static(self, d: DomainProfile) -> None:
        pol = self._policy(d)
        self.mkdir(pol)
        cpus = _list(d.cpus)
        self.put(f"{pol}/related_cpus", cpus)
        self.put(f"{pol}/affected_cpus", cpus)
        self.put(f"{pol}/cpuinfo_min_freq", f"{_khz(d.min_hz)}\n")
        self.put(f"{pol}/cpuinfo_max_freq", f"{_khz(d.max_hz)}\n")
        self.put(f"{pol}/cpuinfo_transition_latency", f"{d.transition_latency_ns}\n")
        self.put(f"{pol}/scaling_available_frequencies", _list(_khz(o.freq_hz) for o in d.opps))
        self.put(f"{pol}/scaling_available_governors", _list(governors_for(self.profile, d)))
        self.put(f"{pol}/scaling_driver", "cpufreq-dt\n" if self.profile.family == "rockchip" else "tegra194\n")
        self.put(f"{pol}/stats/reset", "", 0o200)
        for knob in ("scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed"):
            self.knobs[self.path(f"{pol}/{knob}")] = (d.name, knob)
        self._gov_parent[d.name] = self.path(pol)

    def _cpufreq_render(self, d: DomainProfile, state: BoardState) -> None:
        ds = state.domains[d.name]
        pol = self._policy(d)
        cur = _khz(ds.cur_hz)
        self.put(f"{pol}/scaling_cur_freq", f"{cur}\n")
        self.put(f"{pol}/cpuinfo_cur_freq", f"{cur}\n", 0o400)
        self.put(f"{pol}/scaling_governor", f"{ds.governor}\n", 0o644)
        # Since the QoS rework the kernel shows the aggregated limits, thermal caps included.
        self.put(f"{pol}/scaling_max_freq", f"{_khz(ds.effective_max())}\n", 0o644)
        self.put(f"{pol}/scaling_min_freq", f"{_khz(min(ds.min_hz, ds.effective_max()))}\n", 0o644)
        speed = f"{cur}\n" if ds.governor == "userspace" else "<unsupported>\n"
        self.put(f"{pol}/scaling_setspeed", speed, 0o644)
        tis = "".join(f"{_khz(o.freq_hz)} {int(ds.time_in_state_s.get(o.freq_hz, 0.0) * 100)}\n" for o in d.opps)
        self.put(f"{pol}/stats/time_in_state", tis)
        self.put(f"{pol}/stats/total_trans", f"{ds.transitions}\n")
        hdr = "   From  :    To\n         : " + "".join(f"{_khz(o.freq_hz):>10}" for o in d.opps) + "\n"
        self.put(f"{pol}/stats/trans_table", hdr)
        self._governor_dir(d.name, ds.governor, cpufreq=True)

    def _governor_dir(self, name: str, governor: str, *, cpufreq: bool) -> None:
        parent = self._gov_parent[name]
        want = governor if (cpufreq and governor in _GOV_TUNABLES) else None
        for g in _GOV_TUNABLES:
            d = parent / g
            if g != want and d.is_dir():
                for f in d.iterdir():
                    self.forget(f)
                    f.unlink()
                d.rmdir()
        if want is not None and not (parent / want).is_dir():
            for k, v in _GOV_TUNABLES[want].items():
                self.put(parent / want / k, f"{v}\n", 0o644)

    # -- devfreq (Rockchip) --------------------------------------------------------------

    def _devfreq_dir(self, d: DomainProfile) -> tuple[str, str]:
        if self.profile.family == "rockchip":
            name = _RK_DEVFREQ_NAMES[d.kind]
            return name, f"sys/devices/platform/{name}/devfreq/{name}"
        name = "17000000.gpu" if self.variant == "jp6" else "17000000.ga10b"
        dev = "sys/devices/platform/bus@0/17000000.gpu" if self.variant == "jp6" else "sys/devices/platform/17000000.ga10b"
        return name, f"{dev}/devfreq/{name}"

    def _devfreq_common_static(self, d: DomainProfile, name: str, df: str, freqs: list[int], devpath: str) -> None:
        self.mkdir(df)
        self.put(f"{df}/available_frequencies", _list(freqs))
        self.put(f"{df}/available_governors", _list(governors_for(self.profile, d)))
        self.put(f"{df}/name", f"{name}\n")
        self.put(f"{df}/trans_stat", "")
        self.put(f"{df}/uevent", "")
        self.put(f"{df}/power/control", "auto\n", 0o644)
        self.put(f"{df}/power/runtime_status", "unsupported\n")
        self.link(f"{df}/subsystem", "sys/class/devfreq")
        self.link(f"{df}/device", devpath)
        self.link(f"sys/class/devfreq/{name}", df)
        for knob in ("governor", "min_freq", "max_freq"):
            self.knobs[self.path(f"{df}/{knob}")] = (d.name, knob)
        self.knobs[self.path(f"{df}/userspace/set_freq")] = (d.name, "set_freq")
        self._userspace_dirs[d.name] = self.path(f"{df}/userspace")
        self.dyn[d.name] = self.path(df)

    def _rk_devfreq_static(self, d: DomainProfile) -> None:
        name, df = self._devfreq_dir(d)
        dev = f"sys/devices/platform/{name}"
        freqs = [o.freq_hz for o in d.opps]
        if d.kind == "gpu":
            freqs = freqs[::-1]  # kbase fills freq_table from the top OPP down
        self._devfreq_common_static(d, name, df, freqs, dev)
        of = f"sys/firmware/devicetree/base/{_RK_OF_NODES[d.kind]}"
        self.put(f"{of}/name", _RK_OF_NODES[d.kind].split("@")[0] + "\0")
        self.link(f"{dev}/of_node", of)
        self.put(f"{dev}/uevent", f"OF_NAME={_RK_OF_NODES[d.kind].split('@')[0]}\n")
        if d.kind != "npu":
            self.put(f"{df}/polling_interval", "50\n", 0o644)
            self.put(f"{df}/timer", "deferrable\n", 0o644)
        if d.kind == "memory":
            self.put(f"{df}/upthreshold", "25\n", 0o644)
            self.put(f"{df}/downdifferential", "20\n", 0o644)
            self.put(f"{df}/system_status", "0x0\n", 0o644)

    def _devfreq_render(self, d: DomainProfile, state: BoardState, df: Path) -> None:
        ds = state.domains[d.name]
        self.put(df / "cur_freq", f"{ds.cur_hz}\n")
        self.put(df / "target_freq", f"{ds.cur_hz}\n")
        self.put(df / "governor", f"{ds.governor}\n", 0o644)
        self.put(df / "min_freq", f"{min(ds.min_hz, ds.effective_max())}\n", 0o644)
        self.put(df / "max_freq", f"{ds.effective_max()}\n", 0o644)
        lines = ["     From  :   To\n", "           :" + "".join(f"{o.freq_hz:>11}" for o in d.opps) + "   time(ms)\n"]
        for o in d.opps:
            mark = "*" if o.freq_hz == ds.cur_hz else " "
            lines.append(f"{mark}{o.freq_hz:>10}:" + "".join(f"{0:>11}" for _ in d.opps)
                         + f"{int(ds.time_in_state_s.get(o.freq_hz, 0.0) * 1000):>11}\n")
        lines.append(f"Total transition : {ds.transitions}\n")
        self.put(df / "trans_stat", "".join(lines))
        udir = self._userspace_dirs[d.name]
        if ds.governor == "userspace":
            sf = ds.setspeed_hz if ds.setspeed_hz is not None else ds.cur_hz
            self.put(udir / "set_freq", f"{sf}\n", 0o644)
            os.chmod(udir, 0o755)
        elif udir.exists():
            # The userspace governor's attribute group goes away with the governor.
            f = udir / "set_freq"
            if f.exists():
                self.forget(f)
                f.unlink()
            udir.rmdir()

    def _rk_devfreq_render(self, d: DomainProfile, state: BoardState) -> None:
        df = self.dyn[d.name]
        ds = state.domains[d.name]
        self._devfreq_render(d, state, df)
        pct = min(100, max(0, round(ds.util * 100)))
        self.put(df / "load", f"{pct}@{ds.cur_hz}Hz\n")
        if d.kind == "gpu":
            self.put("sys/devices/platform/fb000000.gpu/utilisation", f"{pct}\n")

    # -- Jetson GPU / EMC ---------------------------------------------------------------------

    def _tegra_gpu_static(self, d: DomainProfile) -> None:
        name, df = self._devfreq_dir(d)
        jp6 = self.variant == "jp6"
        dev = "sys/devices/platform/bus@0/17000000.gpu" if jp6 else "sys/devices/platform/17000000.ga10b"
        self._devfreq_common_static(d, name, df, [o.freq_hz for o in d.opps], dev)
        # Spec form: device L= ../../../17000000.gpu (same target as the relpath).
        self.put(f"{df}/polling_interval", "25\n", 0o644)
        self.put(f"{df}/timer", "deferrable\n", 0o644)
        for f, v in (("railgate_enable", "1"), ("tpc_pg_mask", "0"), ("enable_3d_scaling", "1"),
                     ("is_railgated", "1"), ("gpu_powered_on", "0")):  # fmt: skip
            self.put(f"{dev}/{f}", f"{v}\n", 0o644)
        self.put(f"{dev}/power/control", "auto\n", 0o644)
        of_name = "gpu" if jp6 else "ga10b"
        of = "sys/firmware/devicetree/base/bus@0/gpu@17000000" if jp6 else "sys/firmware/devicetree/base/gpu@17000000"
        self.put(f"{of}/name", of_name + "\0")
        self.put(f"{of}/compatible", "nvidia,ga10b\0")
        self.link(f"{dev}/of_node", of)
        if jp6:
            self.link("sys/devices/platform/gpu.0", dev)
            self.link("sys/devices/platform/bus@0/gpu.0", dev)
        else:
            self.link("sys/devices/gpu.0", dev)
            self.link("sys/devices/platform/gpu.0", dev)
            self.link("sys/devices/17000000.ga10b", dev)
        self.dyn["gpu_dev"] = self.path(dev)

    def _tegra_gpu_render(self, d: DomainProfile, state: BoardState) -> None:
        ds = state.domains[d.name]
        self._devfreq_render(d, state, self.dyn[d.name])
        dev = self.dyn["gpu_dev"]
        self.put(dev / "load", f"{min(1000, max(0, round(ds.util * 1000)))}\n")
        gated = ds.util <= 0.0
        self.put(dev / "is_railgated", f"{int(gated)}\n", 0o644)
        self.put(dev / "gpu_powered_on", f"{int(not gated)}\n", 0o644)

    def _tegra_emc_static(self, d: DomainProfile) -> None:
        self.mkdir("sys/kernel/debug", 0o700)
        emc = "sys/kernel/debug/bpmp/debug/clk/emc"
        for p in ("sys/kernel/debug/bpmp", "sys/kernel/debug/bpmp/debug", "sys/kernel/debug/bpmp/debug/clk", emc):
            self.mkdir(p, 0o700)
        self.put(f"{emc}/min_rate", f"{d.min_hz}\n", 0o400)
        self.put(f"{emc}/max_rate", f"{d.max_hz}\n", 0o400)
        for knob in ("rate", "mrq_rate_locked"):
            self.knobs[self.path(f"{emc}/{knob}")] = (d.name, knob)
        self.knobs[self.path("sys/kernel/nvpmodel_emc_cap/emc_iso_cap")] = (d.name, "emc_iso_cap")
        self.dyn["emc"] = self.path(emc)

    def _tegra_emc_render(self, d: DomainProfile, state: BoardState) -> None:
        ds = state.domains[d.name]
        emc = self.dyn["emc"]
        self.put(emc / "rate", f"{ds.cur_hz}\n", 0o600)
        self.put(emc / "mrq_rate_locked", f"{int(state.emc_locked)}\n", 0o600)
        self.put("sys/kernel/nvpmodel_emc_cap/emc_iso_cap", f"{state.emc_iso_cap_hz}\n", 0o644)
        pct = min(100, max(0, round(ds.util * 100)))
        self.put("sys/kernel/actmon_avg_activity/mc_all", f"{pct * (ds.cur_hz // 1000)}\n")

    # -- thermal --------------------------------------------------------------------------------------

    def _cooling_devices(self) -> list[tuple[str, str, int]]:
        """(domain, type, max_state) per cooling device, in index order."""
        out = []
        seen: set[str] = set()
        for t in self.layout.throttling:
            for a in t.actors:
                if a in seen:
                    continue
                seen.add(a)
                d = self.profile.domain(a)
                if d.kind == "cpu":
                    typ = f"cpufreq-cpu{d.cpus[0]}"
                else:
                    typ = f"devfreq-{self._devfreq_dir(d)[0]}"
                out.append((a, typ, len(d.opps) - 1))
        return out

    def _thermal_static(self) -> None:
        cdevs = self._cooling_devices()
        for i, (_, typ, mx) in enumerate(cdevs):
            cd = f"sys/devices/virtual/thermal/cooling_device{i}"
            self.put(f"{cd}/type", f"{typ}\n")
            self.put(f"{cd}/max_state", f"{mx}\n")
            self.link(f"sys/class/thermal/cooling_device{i}", cd)
        index_of = {a: i for i, (a, _, _) in enumerate(cdevs)}
        hw = 0
        for zi, z in enumerate(self.layout.zones):
            zd = f"sys/devices/virtual/thermal/thermal_zone{zi}"
            self.put(f"{zd}/type", f"{z.type}\n")
            self.put(f"{zd}/mode", "enabled\n", 0o644)
            self.put(f"{zd}/policy", f"{z.policy}\n", 0o644)
            self.put(f"{zd}/available_policies", "power_allocator user_space step_wise fair_share bang_bang\n")
            self.put(f"{zd}/uevent", "")
            for ti, t in enumerate(z.trips):
                self.put(f"{zd}/trip_point_{ti}_temp", f"{int(t.temp_c * 1000)}\n", 0o644)
                self.put(f"{zd}/trip_point_{ti}_type", f"{t.type}\n")
                self.put(f"{zd}/trip_point_{ti}_hyst", f"{int(t.hyst_c * 1000)}\n", 0o644)
            if z.sustainable_power_w is not None:
                sp = int(z.sustainable_power_w * 1000)
                span = self._ipa_span(zi)
                for f, v in (("sustainable_power", sp), ("k_po", sp // span), ("k_pu", 2 * sp // span),
                             ("k_i", (2 * sp // span) // 10), ("k_d", 0), ("integral_cutoff", 0),
                             ("slope", 0), ("offset", 0)):  # fmt: skip
                    self.put(f"{zd}/{f}", f"{v}\n", 0o644)
            cn = 0
            for t in self.layout.throttling:
                if t.zone != zi:
                    continue
                for a in t.actors:
                    self.link(f"{zd}/cdev{cn}", f"sys/devices/virtual/thermal/cooling_device{index_of[a]}")
                    self.put(f"{zd}/cdev{cn}_trip_point", f"{t.trip}\n")
                    self.put(f"{zd}/cdev{cn}_weight", "1024\n" if t.governor == "power_allocator" else "0\n", 0o644)
                    cn += 1
            self.link(f"sys/class/thermal/thermal_zone{zi}", zd)
            if z.hwmon:
                hd = f"{zd}/hwmon{hw}"
                self.put(f"{hd}/name", z.type.replace("-", "_") + "\n")
                self.link(f"sys/class/hwmon/hwmon{hw}", hd)
                self.dyn[f"zone_hwmon{zi}"] = self.path(f"{hd}/temp1_input")
                hw += 1
        self._hwmon_next = hw

    def _ipa_span(self, zi: int) -> int:
        for t in self.layout.throttling:
            if t.zone == zi and t.switch_on_trip is not None:
                z = self.layout.zones[zi]
                return max(1, round(z.trips[t.trip].temp_c - z.trips[t.switch_on_trip].temp_c))
        return 10

    def _thermal_render(self, state: BoardState) -> None:
        for zi, _z in enumerate(self.layout.zones):
            t = state.zone_temps_c[zi]
            if t is None:
                text = "" if self.offline_style == "eagain" else "-256000\n"
            elif t != t:  # NaN: a flaky read this period (EAGAIN on a board)
                text = ""
            else:
                text = f"{round(t * 1000)}\n"
            self.put(f"sys/devices/virtual/thermal/thermal_zone{zi}/temp", text)
            hp = self.dyn.get(f"zone_hwmon{zi}")
            if hp is not None:
                self.put(hp, text)
        for i, (a, _, _) in enumerate(self._cooling_devices()):
            self.put(f"sys/devices/virtual/thermal/cooling_device{i}/cur_state",
                     f"{state.cooling_states.get(a, 0)}\n", 0o644)

    # -- board extras -------------------------------------------------------------------------------------------

    def _rk_extras(self) -> None:
        self.mkdir("sys/kernel/debug", 0o700)
        self.mkdir("sys/kernel/debug/rknpu", 0o700)
        self.put("sys/kernel/debug/rknpu/version", "RKNPU driver: v0.9.8\n", 0o400)
        self.put("sys/kernel/debug/rknpu/power", "on\n", 0o600)
        self.put("sys/kernel/debug/rknpu/volt", "850000\n", 0o400)
        self.put("sys/kernel/debug/rknpu/delayms", "2000\n", 0o600)
        self.put("sys/module/rknpu/version", "0.9.8\n")
        psy = "sys/devices/platform/feac0000.i2c/i2c-4/4-0022/power_supply/tcpm-source-psy-4-0022"
        for f, v in (("online", "1"), ("type", "USB"), ("usb_type", "C [PD] PD_PPS"),
                     ("voltage_now", "20000000"), ("voltage_min", "20000000"), ("voltage_max", "20000000"),
                     ("current_now", "1500000"), ("current_max", "1500000")):  # fmt: skip
            self.put(f"{psy}/{f}", f"{v}\n")
        self.link("sys/class/power_supply/tcpm-source-psy-4-0022", psy)

    def _tegra_extras(self) -> None:
        prof = self.profile
        i2c = "sys/devices/platform/bus@0/c240000.i2c/i2c-1"
        devices = sorted({r.ina_device for r in prof.rails if r.ina_device})
        hw = 0
        fan = f"sys/devices/platform/pwm-fan/hwmon/hwmon{hw}"
        self.put(f"{fan}/name", "pwmfan\n")
        self.put(f"{fan}/pwm1_enable", "1\n", 0o644)
        self.link(f"sys/class/hwmon/hwmon{hw}", fan)
        self.dyn["fan"] = self.path(fan)
        hw += 1
        self.dyn["ina"] = self.root  # marker
        self._ina_dirs: dict[str, Path] = {}
        for dev in devices:
            dpath = f"{i2c}/{dev}"
            self.put(f"{dpath}/name", "ina3221\n")
            self.put(f"{dpath}/uevent", "DRIVER=ina3221\n")
            self.link(f"sys/bus/i2c/devices/{dev}", dpath)
            self.link(f"sys/bus/i2c/drivers/ina3221/{dev}", dpath)
            hd = f"{dpath}/hwmon/hwmon{hw}"
            self.link(f"sys/class/hwmon/hwmon{hw}", hd)
            hw += 1
            shunt = 5000 if prof.name != "orin-agx" else 2000
            self.put(f"{hd}/name", "ina3221\n")
            chans = {r.ina_channel: r for r in prof.rails if r.ina_device == dev}
            for ch in (1, 2, 3):
                r = chans.get(ch)
                self.put(f"{hd}/in{ch}_label", f"{r.name if r else 'NC'}\n")
                self.put(f"{hd}/shunt{ch}_resistor", f"{shunt}\n", 0o644)
                self.put(f"{hd}/in{ch}_enable", f"{int(r is not None)}\n", 0o644)
                for f in ("curr{}_max", "curr{}_crit"):
                    self.put(f"{hd}/{f.format(ch)}", "7784\n", 0o644)
                for f in ("curr{}_max_alarm", "curr{}_crit_alarm"):
                    self.put(f"{hd}/{f.format(ch)}", "0\n")
            self.put(f"{hd}/in7_label", "sum of shunt voltages\n")
            self.put(f"{hd}/samples", "512\n", 0o644)
            self.put(f"{hd}/update_interval", "140\n", 0o644)
            self._ina_dirs[dev] = self.path(hd)
        tach = f"sys/devices/platform/pwm-tach/hwmon/hwmon{hw}"
        self.put(f"{tach}/name", "pwm_tach\n")
        self.link(f"sys/class/hwmon/hwmon{hw}", tach)
        self.dyn["tach"] = self.path(tach)
        self.mkdir("sys/kernel/debug", 0o700)
        if prof.name == "orin-agx":
            self.mkdir("sys/kernel/debug/clk", 0o700)
            for eng, rate in (("nvenc", 115200000), ("nvdec", 115200000), ("nvjpg", 115200000),
                              ("nvjpg1", 115200000), ("vic", 115200000), ("ofa", 115200000),
                              ("se", 115200000), ("ape", 233472000), ("dla0_core", 1600000000),
                              ("dla0_falcon", 844800000), ("dla1_core", 1600000000),
                              ("dla1_falcon", 844800000), ("pva0_vps", 1152000000),
                              ("pva0_cpu_axi", 537600000)):  # fmt: skip
                c = f"sys/kernel/debug/clk/{eng}"
                self.mkdir(c, 0o700)
                self.put(f"{c}/clk_enable_count", "0\n", 0o400)
                self.put(f"{c}/clk_rate", f"{rate}\n", 0o400)
                self.put(f"{c}/clk_max_rate", "18446744073709551615\n", 0o400)
                self.put(f"{c}/clk_min_rate", "0\n", 0o400)
        # Release files.
        if self.variant == "jp6":
            rel = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n"
        else:
            rel = "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n"
        self.put("etc/nv_tegra_release", rel)
        conf = prof.nvpmodel_conf or "nvpmodel.conf"
        self.put(f"etc/nvpmodel/{conf}", self._nvpmodel_conf_text(), 0o644)
        self.link("etc/nvpmodel.conf", f"etc/nvpmodel/{conf}")
        self.put("var/lib/nvpmodel/status", f"pmode:{prof.nvpmodel_default:04d} fmode:quiet\n", 0o644)

    def _nvpmodel_conf_text(self) -> str:
        prof = self.profile
        cpus = [d for d in prof.domains if d.kind == "cpu"]
        lines = ["# nvpmodel configuration (SoC twin rendering, modes from soc-sysfs.md §2.6 / dvfs.md §6)", ""]
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
        gdf = "/" + self._devfreq_dir(prof.domain("gpu"))[1]
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

    def _ina_render(self, state: BoardState) -> None:
        bus_mv = 5048
        for dev, hd in getattr(self, "_ina_dirs", {}).items():
            chans = {r.ina_channel: r for r in self.profile.rails if r.ina_device == dev}
            shunt_sum = 0
            for ch in (1, 2, 3):
                r = chans.get(ch)
                if r is None:
                    self.put(hd / f"in{ch}_input", "0\n")
                    self.put(hd / f"curr{ch}_input", "0\n")
                    self.put(hd / f"in{ch + 3}_input", "0\n")
                    continue
                p = state.rail_power_w.get(r.name, 0.0)
                ma = round(p * 1e6 / bus_mv)
                self.put(hd / f"in{ch}_input", f"{bus_mv}\n")
                self.put(hd / f"curr{ch}_input", f"{ma}\n")
                shunt_uv = round(ma * (5000 if self.profile.name != "orin-agx" else 2000) / 1000)
                shunt_sum += shunt_uv
                self.put(hd / f"in{ch + 3}_input", f"{shunt_uv}\n")
            self.put(hd / "in7_input", f"{shunt_sum}\n")
        self.put(self.dyn["fan"] / "pwm1", f"{state.fan_pwm}\n", 0o644)
        self.put(self.dyn["tach"] / "rpm", f"{round(state.fan_pwm / 255 * 9700)}\n")
