"""Materialise a twin board's sysfs/procfs tree under a root, exactly as the board shows it.

Layouts, units and formats follow the kernel ABI (``docs/sources.md``: [kernel-cpufreq],
[kernel-devfreq-abi], [kernel-thermal-abi], [kernel-hwmon]) and the vendor trees the sources
describe (``docs/twin-sysfs.md``), with the kernel's own formatting: cpufreq lists
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

The vendor parts live in :mod:`~hetsched._twin.tree_rockchip` and
:mod:`~hetsched._twin.tree_tegra` (chosen by the profile's ``quirks.sysfs_writer``); the
low-level file writing in :mod:`~hetsched._twin.tree_files`.

All writes go through :meth:`BoardTree.put`, which writes atomically (temp file + rename in
the same directory) and remembers the bytes, so a live twin can tell the runtime's writes
from its own. Every write, link, mkdir and delete is contained in the root
(:mod:`~hetsched._twin.tree_walk`): a symlink planted in an existing tree that leads out of
it is refused with :class:`~hetsched.PathOutsideRootError`, never followed.
"""

from __future__ import annotations

import os
from typing import Protocol

from .._errors import TwinError
from .schema import DomainProfile, SocProfile
from .state import BoardState, boot_state, governors_for
from .tree_files import OfflineStyle, TreeFiles, kernel_list, khz
from .tree_rockchip import RockchipTree
from .tree_tegra import TegraTree

__all__ = ["BoardTree", "OfflineStyle"]

_GOV_TUNABLES = {
    "ondemand": {"up_threshold": "80", "sampling_rate": "40000", "sampling_down_factor": "1",
                 "ignore_nice_load": "0", "io_is_busy": "0", "powersave_bias": "0"},
    "conservative": {"up_threshold": "80", "down_threshold": "20", "freq_step": "5", "sampling_rate": "40000",
                     "sampling_down_factor": "1", "ignore_nice_load": "0"},
    "schedutil": {"rate_limit_us": "40"},
    "interactive": {"hispeed_freq": "0", "go_hispeed_load": "90", "target_loads": "90",
                    "min_sample_time": "80000", "timer_rate": "20000", "above_hispeed_delay": "20000"},
}  # fmt: skip


class _VendorTree(Protocol):
    """The vendor part of a board tree (devfreq/EMC domains, sensors, release files)."""

    def devfreq_dir(self, d: DomainProfile) -> tuple[str, str]: ...
    def domain_static(self, d: DomainProfile) -> None: ...
    def domain_render(self, d: DomainProfile, state: BoardState) -> None: ...
    def extras_static(self) -> None: ...
    def extras_render(self, state: BoardState) -> None: ...


_VENDORS: dict[str, type[RockchipTree] | type[TegraTree]] = {
    "rockchip-bsp": RockchipTree,
    "tegra-l4t": TegraTree,
}


def cpu_ranges(cpus: list[int]) -> str:
    """A kernel cpu list (``"0-3,6-7\\n"``; ``"\\n"`` when empty), as ``cpu/online`` prints it."""
    out: list[tuple[int, int]] = []
    for c in sorted(cpus):
        if out and out[-1][1] == c - 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out) + "\n"


class BoardTree(TreeFiles):
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
        super().__init__(root, profile, variant, offline_style=offline_style)
        self.vendor: _VendorTree = _VENDORS[profile.quirks.sysfs_writer](self)
        self._hwmon_next = 0
        self.unplugged: set[str] = set()
        """CPU domains whose cpufreq policy was removed while the twin ran (see :meth:`unplug`)."""

    # -- whole tree -------------------------------------------------------------

    def materialise(self, state: BoardState | None = None) -> BoardState:
        """Create every directory, symlink and file, rendering ``state`` (boot state if None).

        Raises:
            PathOutsideRootError: a symlink in an existing tree leads a path outside the root
                (nothing outside is touched; what was written before stays).
            TwinError: the root cannot be made, or a file or directory is in the way.
        """
        if state is None:
            state = boot_state(self.profile, self.variant)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TwinError(f"cannot make the twin root {self.root}: {exc.strerror or exc}") from exc
        with self.batch():
            self._materialise(state)
        return state

    def _materialise(self, state: BoardState) -> None:
        self._static_common()
        for d in self.profile.domains:
            if d.kind == "cpu":
                self._cpufreq_static(d)
            else:
                self.vendor.domain_static(d)
        self._thermal_static()
        self.vendor.extras_static()
        self.render(state)

    def render(self, state: BoardState) -> None:
        """Rewrite every dynamic file from ``state`` (unchanged contents are skipped).

        Raises:
            PathOutsideRootError: a symlink planted in the tree leads a path outside the root.
            TwinError: a file or directory is in the way.
        """
        prof = self.profile
        with self.batch():
            for d in prof.domains:
                if d.kind == "cpu":
                    if d.name not in self.unplugged:
                        self._cpufreq_render(d, state)
                else:
                    self.vendor.domain_render(d, state)
            self._thermal_render(state)
            self._proc_stat_render(state)
            self.vendor.extras_render(state)

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
                for s, name in enumerate(prof.quirks.cpuidle_states):
                    st = f"{c}/cpuidle/state{s}"
                    self.put(f"{st}/name", f"{name}\n")
                    self.put(f"{st}/disable", "0\n", 0o644)
                cpuinfo.append(
                    f"processor\t: {cpu}\nBogoMIPS\t: {prof.quirks.bogomips}\n"
                    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                    "asimdrdm lrcpc dcpop asimddp\n"
                    "CPU implementer\t: 0x41\nCPU architecture: 8\n"
                    f"CPU variant\t: {'0x1' if d.cpu_part != '0xd05' else '0x2'}\n"
                    f"CPU part\t: {d.cpu_part}\nCPU revision\t: {'0' if d.cpu_part != '0xd42' else '1'}\n\n"
                )
        self.put("proc/cpuinfo", "".join(cpuinfo))

    def _proc_stat_render(self, state: BoardState) -> None:
        rows = state.cpu_jiffies
        total = [sum(col) for col in zip(*rows, strict=False)]
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

    def policy_present(self, d: DomainProfile) -> bool:
        """Whether CPU domain ``d``'s cpufreq policy directory is there (False once removed, or
        linked out of the root: skipped and reported once)."""
        return self.is_dir(self._policy(d))

    def unplug(self, d: DomainProfile) -> None:
        """Follow the removal of ``d``'s cpufreq policy as a kernel would after hot-unplugging its
        CPUs: the policy is no longer rendered (nothing recreates it, no ``scaling_setspeed`` is
        left behind), its knobs are no longer watched, each CPU's ``online`` reads 0 and its
        ``cpufreq`` link goes, and ``cpu/online``/``cpu/offline`` list the CPUs as the kernel does."""
        self.unplugged.add(d.name)
        pol = self.path(self._policy(d))
        for k in [k for k in self.knobs if k.parent == pol]:
            del self.knobs[k]
        for k in [k for k in self._written if pol in k.parents]:
            del self._written[k]
        for cpu in d.cpus:
            c = f"sys/devices/system/cpu/cpu{cpu}"
            self.put(f"{c}/online", "0\n", 0o644)
            self.remove(f"{c}/cpufreq")
        off = sorted(c for dd in self.profile.domains if dd.name in self.unplugged for c in dd.cpus)
        on = [c for c in range(self.profile.cpu_count) if c not in off]
        self.put("sys/devices/system/cpu/online", cpu_ranges(on))
        self.put("sys/devices/system/cpu/offline", cpu_ranges(off))

    def _cpufreq_static(self, d: DomainProfile) -> None:
        pol = self._policy(d)
        self.mkdir(pol)
        cpus = kernel_list(d.cpus)
        self.put(f"{pol}/related_cpus", cpus)
        self.put(f"{pol}/affected_cpus", cpus)
        self.put(f"{pol}/cpuinfo_min_freq", f"{khz(d.min_hz)}\n")
        self.put(f"{pol}/cpuinfo_max_freq", f"{khz(d.max_hz)}\n")
        self.put(f"{pol}/cpuinfo_transition_latency", f"{d.transition_latency_ns}\n")
        self.put(f"{pol}/scaling_available_frequencies", kernel_list(khz(o.freq_hz) for o in d.opps))
        self.put(f"{pol}/scaling_available_governors", kernel_list(governors_for(self.profile, d)))
        self.put(f"{pol}/scaling_driver", f"{self.profile.quirks.cpufreq_driver}\n")
        self.put(f"{pol}/stats/reset", "", 0o200)
        for knob in ("scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed"):
            self.knobs[self.path(f"{pol}/{knob}")] = (d.name, knob)
        self._gov_parent[d.name] = self.path(pol)

    def _cpufreq_render(self, d: DomainProfile, state: BoardState) -> None:
        ds = state.domains[d.name]
        pol = self._policy(d)
        cur = khz(ds.cur_hz)
        self.put(f"{pol}/scaling_cur_freq", f"{cur}\n")
        self.put(f"{pol}/cpuinfo_cur_freq", f"{cur}\n", 0o400)
        self.put(f"{pol}/scaling_governor", f"{ds.governor}\n", 0o644)
        # Since the QoS rework the kernel shows the aggregated limits, thermal caps included.
        self.put(f"{pol}/scaling_max_freq", f"{khz(ds.effective_max())}\n", 0o644)
        self.put(f"{pol}/scaling_min_freq", f"{khz(min(ds.min_hz, ds.effective_max()))}\n", 0o644)
        speed = f"{cur}\n" if ds.governor == "userspace" else "<unsupported>\n"
        self.put(f"{pol}/scaling_setspeed", speed, 0o644)
        tis = "".join(f"{khz(o.freq_hz)} {int(ds.time_in_state_s.get(o.freq_hz, 0.0) * 100)}\n" for o in d.opps)
        self.put(f"{pol}/stats/time_in_state", tis)
        self.put(f"{pol}/stats/total_trans", f"{ds.transitions}\n")
        hdr = "   From  :    To\n         : " + "".join(f"{khz(o.freq_hz):>10}" for o in d.opps) + "\n"
        self.put(f"{pol}/stats/trans_table", hdr)
        self._governor_dir(d.name, ds.governor, cpufreq=True)

    def _governor_dir(self, name: str, governor: str, *, cpufreq: bool) -> None:
        parent = self._gov_parent[name]
        want = governor if (cpufreq and governor in _GOV_TUNABLES) else None
        for g in _GOV_TUNABLES:
            d = parent / g
            if g != want and self.is_dir(d):
                self.remove_dir(d)
        if want is not None and not self.is_dir(parent / want):
            for k, v in _GOV_TUNABLES[want].items():
                self.put(parent / want / k, f"{v}\n", 0o644)

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
                typ = f"cpufreq-cpu{d.cpus[0]}" if d.kind == "cpu" else f"devfreq-{self.vendor.devfreq_dir(d)[0]}"
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
            for ti, trip in enumerate(z.trips):
                self.put(f"{zd}/trip_point_{ti}_temp", f"{int(trip.temp_c * 1000)}\n", 0o644)
                self.put(f"{zd}/trip_point_{ti}_type", f"{trip.type}\n")
                self.put(f"{zd}/trip_point_{ti}_hyst", f"{int(trip.hyst_c * 1000)}\n", 0o644)
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
