"""cpufreq: CPU clusters (policies), their frequency tables and governors.

Layout (kernel ABI, values in **kHz**)::

    sys/devices/system/cpu/cpufreq/policyN/{related_cpus, scaling_available_frequencies,
        scaling_available_governors, scaling_governor, scaling_{min,max,cur}_freq,
        cpuinfo_{min,max}_freq, scaling_setspeed, scaling_driver, cpuinfo_transition_latency}
    sys/devices/system/cpu/cpuK/cpufreq -> ../cpufreq/policyN
    sys/devices/system/cpu/cpuK/cpu_capacity        (arm64, 0-1024; optional)
    proc/cpuinfo                                    ("CPU part : 0xd0b"; optional)

Pure parsers take the files' strings; :func:`read_policies` and the ``set_*``
writers take a :class:`~hetsched._platform._fs.SysfsRoot`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from .._errors import GovernorError, UnsupportedFrequencyError, UnsupportedGovernorError
from ._fs import SysfsRoot, parse_int, parse_name

__all__ = [
    "CPU_PARTS",
    "CpufreqPolicy",
    "parse_cpu_list",
    "parse_cpuinfo_parts",
    "parse_freq_list",
    "parse_governors",
    "parse_setspeed",
    "read_cur_khz",
    "read_policies",
    "set_governor",
    "set_limits",
    "set_max_khz",
    "set_min_khz",
    "set_setspeed",
]

#: Largest frequency value any clock file may hold, in its own unit (kHz for cpufreq, Hz for
#: devfreq): 1 THz. Values past it are garbage (a corrupted tree), read as absent.
MAX_FREQ = 10**12

CPU_DIR = "sys/devices/system/cpu"
CPUFREQ_DIR = f"{CPU_DIR}/cpufreq"

#: ARM ``CPU part`` -> (core name, ``capacity-dmips-mhz`` as the device trees give it).
#: Part numbers: Linux ``arch/arm64/include/asm/cputype.h``
#: (https://github.com/torvalds/linux/blob/master/arch/arm64/include/asm/cputype.h).
#: Capacities are relative to the SoC's fastest core, which is 1024
#: (https://www.kernel.org/doc/Documentation/devicetree/bindings/cpu/cpu-capacity.txt);
#: the little cores' values are those of the Linux device trees named beside them.
CPU_PARTS: Mapping[int, tuple[str, int]] = {
    0xD03: ("cortex-a53", 485),  # arch/arm64/boot/dts/rockchip/rk3399.dtsi (next to A72 = 1024)
    0xD05: ("cortex-a55", 530),  # arch/arm64/boot/dts/rockchip/rk3588-base.dtsi (next to A76 = 1024)
    0xD07: ("cortex-a57", 1024),
    0xD08: ("cortex-a72", 1024),  # rk3399.dtsi
    0xD0B: ("cortex-a76", 1024),  # rk3588-base.dtsi
    0xD0D: ("cortex-a77", 1024),
    0xD41: ("cortex-a78", 1024),
    0xD42: ("cortex-a78ae", 1024),  # Orin: every cluster is A78AE, so all equal
}

_RANGE_RE = re.compile(r"^(\d+)-(\d+)$")


# -- pure parsers ---------------------------------------------------------------


def parse_freq_list(text: str) -> tuple[int, ...]:
    """``"408000 600000 … 2256000 \\n"`` -> ascending unique ints (any order in, trailing space ok).

    :raises ValueError: a token is not a plain positive integer below :data:`MAX_FREQ` (a
        garbage table must not become a domain the governor writes).
    """
    out = set()
    for tok in text.split():
        value = parse_int(tok, lo=1, hi=MAX_FREQ)
        if value is None:
            raise ValueError(f"not a frequency: {tok[:40]!r}")
        out.add(value)
    return tuple(sorted(out))


def parse_governors(text: str) -> tuple[str, ...]:
    """``"interactive conservative ondemand … schedutil \\n"`` -> names in file order (tokens
    that are no governor name, binary bytes say, are left out)."""
    return tuple(n for tok in text.split() if (n := parse_name(tok)) is not None)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """CPU lists in both kernel spellings: ``"0 1 2 3"`` (related_cpus) and ``"0-3,6"`` (online).

    :raises ValueError: a token is neither a number nor a range.
    """
    cpus: set[int] = set()
    for tok in text.replace(",", " ").split():
        m = _RANGE_RE.match(tok)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            cpus.update(range(lo, hi + 1))
        else:
            cpus.add(int(tok))
    return tuple(sorted(cpus))


def parse_setspeed(text: str) -> int | None:
    """``scaling_setspeed``: kHz under the userspace governor, ``None`` for ``"<unsupported>"``."""
    return parse_int(text, lo=0, hi=MAX_FREQ)


def parse_cpuinfo_parts(text: str) -> dict[int, int]:
    """``/proc/cpuinfo`` -> ``{cpu: CPU part}`` (ARM only; empty on x86)."""
    parts: dict[int, int] = {}
    cpu: int | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            try:
                cpu = int(value)
            except ValueError:
                cpu = None
        elif key == "CPU part" and cpu is not None:
            try:
                parts[cpu] = int(value.strip(), 16)
            except ValueError:
                continue
    return parts


# -- reader ---------------------------------------------------------------------


@dataclass(frozen=True)
class CpufreqPolicy:
    """One cpufreq policy (a CPU cluster sharing a clock). Frequencies in kHz."""

    policy: int
    """The policy number (= its first CPU); the cluster's domain name is ``cluster<policy>``."""
    path: str
    """Root-relative resolved policy directory."""
    cpus: tuple[int, ...]
    available_khz: tuple[int, ...]
    """Ascending; empty where the driver has no table (e.g. intel_pstate)."""
    governors: tuple[str, ...]
    governor: str | None
    min_khz: int | None
    max_khz: int | None
    cur_khz: int | None
    cpuinfo_min_khz: int | None
    cpuinfo_max_khz: int | None
    driver: str | None
    transition_latency_ns: int | None
    cpu_part: str | None = None
    """Core name from ``/proc/cpuinfo`` (``"cortex-a76"``), if known."""
    capacity: int | None = None
    """Relative capacity 0-1024 (``cpu_capacity``, or dmips/MHz x max freq when that is absent)."""

    @property
    def name(self) -> str:
        return f"cluster{self.policy}"

    def check_khz(self, khz: int) -> int:
        """Return ``khz`` if this policy can run at it.

        :raises UnsupportedFrequencyError: not in the available list (or, without one,
            outside ``cpuinfo_min..max``); the message shows what is allowed.
        """
        if self.available_khz:
            if khz not in self.available_khz:
                raise UnsupportedFrequencyError(
                    f"{khz} kHz is not available on {self.name} (cpus {_fmt_cpus(self.cpus)}); "
                    f"available: {' '.join(map(str, self.available_khz))}"
                )
        elif (self.cpuinfo_min_khz is not None and self.cpuinfo_max_khz is not None
              and not self.cpuinfo_min_khz <= khz <= self.cpuinfo_max_khz):
            raise UnsupportedFrequencyError(
                f"{khz} kHz is outside {self.name}'s range {self.cpuinfo_min_khz}-{self.cpuinfo_max_khz} kHz"
            )
        return khz


def _fmt_cpus(cpus: Iterable[int]) -> str:
    return ",".join(map(str, cpus))


def _policy_dirs(fs: SysfsRoot) -> list[tuple[str, tuple[int, ...] | None]]:
    """(resolved policy dir, cpus if known from the dir name) for every policy."""
    found: dict[str, tuple[int, ...] | None] = {}
    for entry in fs.listdir(CPUFREQ_DIR):
        if entry.startswith("policy") and entry[6:].isdigit():
            policy = fs.contained(f"{CPUFREQ_DIR}/{entry}")  # None: a link out of the root, skipped
            if policy is not None:
                found.setdefault(policy.rel, None)
    if found:
        return list(found.items())
    # No policyN dirs (old kernels, jtop-style fake trees): group cpuK/cpufreq by where they resolve.
    groups: dict[str, list[int]] = {}
    for entry in fs.listdir(CPU_DIR):
        if entry.startswith("cpu") and entry[3:].isdigit() and fs.is_dir(f"{CPU_DIR}/{entry}/cpufreq"):
            groups.setdefault(fs.realpath(f"{CPU_DIR}/{entry}/cpufreq"), []).append(int(entry[3:]))  # is_dir: inside
    return [(path, tuple(sorted(cpus))) for path, cpus in groups.items()]


def _read_list(fs: SysfsRoot, rel: str) -> tuple[int, ...]:
    text = fs.read_text(rel)
    if text is None:
        return ()
    try:
        return parse_freq_list(text)
    except ValueError:
        return ()


def read_policies(fs: SysfsRoot, *, cpuinfo: str | None = None) -> list[CpufreqPolicy]:
    """Every cpufreq policy under the root, sorted by policy number; ``[]`` without cpufreq.

    ``cpuinfo`` overrides reading ``proc/cpuinfo`` (callers that already have it).

    :raises SysfsPermissionError: a cpufreq file may not be read.
    """
    if cpuinfo is None:
        cpuinfo = fs.read_text("proc/cpuinfo") or ""
    parts = parse_cpuinfo_parts(cpuinfo)
    raw: list[CpufreqPolicy] = []
    for path, dir_cpus in _policy_dirs(fs):
        related = fs.read_text(f"{path}/related_cpus") or fs.read_text(f"{path}/affected_cpus")
        try:
            cpus = parse_cpu_list(related) if related else (dir_cpus or ())
        except ValueError:
            cpus = dir_cpus or ()
        if not cpus:
            name = path.rsplit("/", 1)[-1]
            cpus = (int(name[6:]),) if name.startswith("policy") and name[6:].isdigit() else ()
        if not cpus:
            continue
        part = parts.get(cpus[0])
        raw.append(
            CpufreqPolicy(
                policy=cpus[0],
                path=path,
                cpus=cpus,
                available_khz=_read_list(fs, f"{path}/scaling_available_frequencies"),
                governors=parse_governors(fs.read_text(f"{path}/scaling_available_governors") or ""),
                governor=fs.read_name(f"{path}/scaling_governor"),
                min_khz=fs.read_int(f"{path}/scaling_min_freq", lo=0, hi=MAX_FREQ),
                max_khz=fs.read_int(f"{path}/scaling_max_freq", lo=0, hi=MAX_FREQ),
                cur_khz=_cur(fs, path),
                cpuinfo_min_khz=fs.read_int(f"{path}/cpuinfo_min_freq", lo=0, hi=MAX_FREQ),
                cpuinfo_max_khz=fs.read_int(f"{path}/cpuinfo_max_freq", lo=0, hi=MAX_FREQ),
                driver=fs.read_name(f"{path}/scaling_driver"),
                transition_latency_ns=fs.read_int(f"{path}/cpuinfo_transition_latency"),
                cpu_part=_part_name(part),
                capacity=fs.read_int(f"{CPU_DIR}/cpu{cpus[0]}/cpu_capacity", lo=0, hi=1024),
            )
        )
    raw.sort(key=lambda p: p.policy)
    return _fill_capacity(raw, parts)


def _part_name(part: int | None) -> str | None:
    """Core name of an ARM ``CPU part`` number; the number in hex when unknown."""
    if part is None or part == 0:
        return None
    core = CPU_PARTS.get(part)
    return core[0] if core is not None else f"0x{part:03x}"


def _fill_capacity(policies: list[CpufreqPolicy], parts: Mapping[int, int]) -> list[CpufreqPolicy]:
    """Where ``cpu_capacity`` is absent, compute it as the kernel does: dmips/MHz x max freq, best = 1024."""
    if all(p.capacity is not None for p in policies):
        return policies
    raw: dict[int, float] = {}
    for p in policies:
        top = p.cpuinfo_max_khz or (p.available_khz[-1] if p.available_khz else None)
        part = parts.get(p.cpus[0])
        core = CPU_PARTS.get(part) if part is not None else None
        if top is None or core is None:
            return policies  # not enough data to say anything honest
        raw[p.policy] = core[1] * top
    best = max(raw.values(), default=0.0)
    if best <= 0:
        return policies
    out = []
    for p in policies:
        if p.capacity is None:
            p = replace(p, capacity=round(1024 * raw[p.policy] / best))
        out.append(p)
    return out


def _cur(fs: SysfsRoot, path: str) -> int | None:
    cur = fs.read_int(f"{path}/scaling_cur_freq", lo=0, hi=MAX_FREQ)
    return cur if cur is not None else fs.read_int(f"{path}/cpuinfo_cur_freq", lo=0, hi=MAX_FREQ)


def read_cur_khz(fs: SysfsRoot, policy: CpufreqPolicy) -> int | None:
    """Current frequency (``scaling_cur_freq``, else ``cpuinfo_cur_freq``), or None."""
    return _cur(fs, policy.path)


# -- writers --------------------------------------------------------------------


def set_governor(fs: SysfsRoot, policy: CpufreqPolicy, governor: str) -> None:
    """Write ``scaling_governor`` after checking it is in ``scaling_available_governors``.

    :raises UnsupportedGovernorError: not available (the message lists those that are).
    :raises SysfsPermissionError: not allowed to write (not root).
    """
    if policy.governors and governor not in policy.governors:
        raise UnsupportedGovernorError(
            f"governor {governor!r} is not available on {policy.name}; available: {' '.join(policy.governors)}"
        )
    fs.write_text(f"{policy.path}/scaling_governor", governor)


def set_min_khz(fs: SysfsRoot, policy: CpufreqPolicy, khz: int) -> None:
    """Write ``scaling_min_freq``. :raises UnsupportedFrequencyError: ``khz`` not available."""
    fs.write_text(f"{policy.path}/scaling_min_freq", policy.check_khz(khz))


def set_max_khz(fs: SysfsRoot, policy: CpufreqPolicy, khz: int) -> None:
    """Write ``scaling_max_freq``. :raises UnsupportedFrequencyError: ``khz`` not available."""
    fs.write_text(f"{policy.path}/scaling_max_freq", policy.check_khz(khz))


def set_limits(fs: SysfsRoot, policy: CpufreqPolicy, min_khz: int, max_khz: int) -> None:
    """Set both limits in an order that never asks the kernel for min > max.

    :raises UnsupportedFrequencyError: either is not available, or ``min_khz > max_khz``
        (nothing is written then).
    """
    policy.check_khz(min_khz)
    policy.check_khz(max_khz)
    if min_khz > max_khz:
        raise UnsupportedFrequencyError(f"{policy.name}: min {min_khz} kHz is above max {max_khz} kHz")
    cur_max = fs.read_int(f"{policy.path}/scaling_max_freq")
    if cur_max is not None and min_khz > cur_max:
        set_max_khz(fs, policy, max_khz)
        set_min_khz(fs, policy, min_khz)
    else:
        set_min_khz(fs, policy, min_khz)
        set_max_khz(fs, policy, max_khz)


def set_setspeed(fs: SysfsRoot, policy: CpufreqPolicy, khz: int) -> None:
    """Write ``scaling_setspeed`` (only meaningful under the ``userspace`` governor).

    :raises UnsupportedFrequencyError: ``khz`` not available.
    :raises GovernorError: the current governor is not ``userspace`` (the file reads
        ``<unsupported>`` then and the kernel rejects writes).
    """
    policy.check_khz(khz)
    governor = fs.read_name(f"{policy.path}/scaling_governor")
    if governor != "userspace":
        raise GovernorError(
            f"{policy.name}: scaling_setspeed needs the userspace governor, current is {governor!r}; "
            "set_governor(..., 'userspace') first"
        )
    fs.write_text(f"{policy.path}/scaling_setspeed", khz)
