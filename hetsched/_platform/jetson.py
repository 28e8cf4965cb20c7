"""Jetson specifics: GPU load (per-mille), EMC clock and activity (bpmp debugfs), L4T release.

Layout::

    <gpu device>/load                                 0-1000, 0 while rail-gated (nvgpu)
    sys/devices/gpu.0/load, sys/devices/platform/gpu.0/load       aliases (JP5 / JP6)
    sys/kernel/debug/bpmp/debug/clk/emc/{rate,min_rate,max_rate,mrq_rate_locked}   Hz, root-only
    sys/kernel/debug/bpmp/debug/emc/possible_rates    L4T: "204000 665600 2133000 (kHz)", root-only
    sys/kernel/debug/emc/available_rates              upstream tegra186-emc: "204000000 665600000 ..." Hz
    sys/kernel/nvpmodel_emc_cap/emc_iso_cap           Hz, 0 = no cap
    sys/kernel/actmon_avg_activity/mc_all             jtop: EMC% = mc_all // (rate_Hz // 1000)
    etc/nv_tegra_release                              "# R36 (release), REVISION: 4.3, ..."
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .._errors import PlatformError, UnsupportedFrequencyError
from ._fs import SysfsRoot, parse_int
from .cpufreq import MAX_FREQ as _MAX_HZ
from .devfreq import DevfreqDevice

__all__ = [
    "EMC_AVAILABLE_RATES",
    "EMC_DIR",
    "EMC_POSSIBLE_RATES",
    "EmcInfo",
    "L4TRelease",
    "emc_rates",
    "emc_utilisation",
    "find_gpu_load_path",
    "find_mc_activity_path",
    "parse_available_rates",
    "parse_gpu_load",
    "parse_nv_tegra_release",
    "parse_possible_rates",
    "read_emc",
    "read_emc_table",
    "release_emc_rate",
    "set_emc_rate",
]

EMC_DIR = "sys/kernel/debug/bpmp/debug/clk/emc"
EMC_CAP = "sys/kernel/nvpmodel_emc_cap/emc_iso_cap"
# bpmp's clk/emc directory has no rate table; the kernel publishes one elsewhere, in one of two
# formats (docs/sources.md [orin-emc-rates]). L4T first: on a Jetson both may exist.
EMC_POSSIBLE_RATES = "sys/kernel/debug/bpmp/debug/emc/possible_rates"
EMC_AVAILABLE_RATES = "sys/kernel/debug/emc/available_rates"
MC_ACTIVITY_PATHS = (
    "sys/kernel/actmon_avg_activity/mc_all",
    "sys/kernel/debug/cactmon/mc_all",
    "sys/kernel/debug/bpmp/debug/actmon/mc_all_avg_activity",
)
GPU_LOAD_ALIASES = (
    "sys/devices/platform/gpu.0/load",
    "sys/devices/gpu.0/load",
    "sys/devices/platform/bus@0/gpu.0/load",
)

_RELEASE_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")
# L4T major -> JetPack major (35 = JP5, 36 = JP6, 38 = JP7), per NVIDIA's release table:
# https://developer.nvidia.com/embedded/jetpack-archive
_JETPACK = {32: "4", 34: "5", 35: "5", 36: "6", 38: "7"}


def parse_gpu_load(text: str | None) -> float | None:
    """nvgpu ``load`` (per-mille, ``"537\\n"``) -> busy fraction ``0.537``; None if unreadable."""
    if text is None:
        return None
    permille = parse_int(text)
    if permille is None:
        return None
    return min(max(permille, 0), 1000) / 1000.0


def emc_utilisation(mc_all: int | None, rate_hz: int | None) -> float | None:
    """EMC busy fraction as jtop computes it (``int(mc_all) // (rate_Hz // 1000)`` percent)."""
    if mc_all is None or not rate_hz or rate_hz < 1000 or mc_all < 0:
        return None
    return min((mc_all // (rate_hz // 1000)) / 100.0, 1.0)


def _parse_rates(text: str | bytes | None, scale: int, unit: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    data = text.decode("latin-1") if isinstance(text, bytes) else text
    tokens = data.split()
    if unit is not None and tokens and tokens[-1].lower() == unit:
        tokens.pop()
    if not tokens:
        return None
    out = set()
    for tok in tokens:
        value = parse_int(tok, lo=1, hi=_MAX_HZ // scale)
        if value is None:
            return None
        out.add(value * scale)
    return tuple(sorted(out))


def parse_possible_rates(text: str | bytes | None) -> tuple[int, ...] | None:
    """L4T ``bpmp/debug/emc/possible_rates`` (kHz, ``"204000 665600 2133000 (kHz)\\n"``; the
    unit marker may be missing) -> ascending unique rates in Hz.

    None when absent, empty or garbage (a token that is no plain positive kHz value below
    1 THz): a table with one bad entry is no table the governor may pick from.
    """
    return _parse_rates(text, 1000, "(khz)")


def parse_available_rates(text: str | bytes | None) -> tuple[int, ...] | None:
    """Upstream ``tegra186-emc`` debugfs ``emc/available_rates`` (Hz, space separated,
    ``"204000000 665600000 ...\\n"``) -> ascending unique rates in Hz; None as for
    :func:`parse_possible_rates`."""
    return _parse_rates(text, 1, None)


@dataclass(frozen=True)
class L4TRelease:
    major: int
    revision: str

    @property
    def version(self) -> str:
        """``"36.4.3"``."""
        return f"{self.major}.{self.revision}"

    @property
    def jetpack(self) -> str | None:
        """JetPack major version (``"6"`` for R36), or None when unknown."""
        return _JETPACK.get(self.major)


def parse_nv_tegra_release(text: str) -> L4TRelease | None:
    """``"# R36 (release), REVISION: 4.3, GCID: ..."`` -> ``L4TRelease(36, "4.3")``; None otherwise."""
    m = _RELEASE_RE.search(text)
    return L4TRelease(int(m.group(1)), m.group(2)) if m else None


def find_gpu_load_path(fs: SysfsRoot, gpu: DevfreqDevice | None) -> str | None:
    """Root-relative path of the nvgpu ``load`` file, or None (not a Jetson GPU).

    The file lives in the GPU *device* directory (``realpath(<devfreq>/device)``,
    as jtop reads it), with the ``gpu.0`` aliases as fallbacks.
    """
    candidates = []
    if gpu is not None and gpu.device_path is not None:
        candidates.append(f"{gpu.device_path}/load")
    if gpu is not None and gpu.path.count("/devfreq/"):
        candidates.append(f"{gpu.path.split('/devfreq/', 1)[0]}/load")
    candidates.extend(GPU_LOAD_ALIASES)
    for rel in candidates:
        if fs.exists(rel) and not fs.is_dir(rel):
            return fs.realpath(rel)
    return None


def find_mc_activity_path(fs: SysfsRoot) -> str | None:
    for rel in MC_ACTIVITY_PATHS:
        if fs.exists(rel):
            return fs.realpath(rel)
    return None


@dataclass(frozen=True)
class EmcInfo:
    rate_hz: int | None
    min_rate_hz: int | None
    max_rate_hz: int | None
    locked: bool | None
    iso_cap_hz: int | None
    """``nvpmodel`` EMC cap; None when absent or 0 (no cap)."""
    activity_path: str | None
    available_hz: tuple[int, ...] = ()
    """Every rate the kernel publishes (``possible_rates`` or ``available_rates``), ascending,
    whatever ``min_rate``/``max_rate`` allow now; empty when neither file is readable."""


def read_emc_table(fs: SysfsRoot) -> tuple[int, ...]:
    """The EMC rate table the kernel publishes (Hz, ascending): L4T ``possible_rates``, else
    upstream ``available_rates``; ``()`` when neither is there or holds a table (garbage is
    counted and logged once per file, as :meth:`SysfsRoot.note_garbage` does).

    :raises SysfsPermissionError: the file is there but not readable (debugfs is root-only).
    """
    for rel, parse in ((EMC_POSSIBLE_RATES, parse_possible_rates), (EMC_AVAILABLE_RATES, parse_available_rates)):
        data = fs.read_bytes(rel)
        rates = parse(data)
        if rates:
            return rates
        if data is not None and data.strip():
            fs.note_garbage(rel, data, "a list of EMC rates")
    return ()


def read_emc(fs: SysfsRoot) -> EmcInfo | None:
    """The EMC clock from bpmp debugfs, or None when it is not there (not a Jetson, or not root).

    :raises SysfsPermissionError: debugfs is present but not readable (run as root).
    """
    if not fs.exists(f"{EMC_DIR}/rate"):
        return None
    locked = fs.read_int(f"{EMC_DIR}/mrq_rate_locked", lo=0, hi=1)
    cap = fs.read_int(EMC_CAP, lo=0, hi=_MAX_HZ)
    return EmcInfo(
        rate_hz=fs.read_int(f"{EMC_DIR}/rate", lo=0, hi=_MAX_HZ),
        min_rate_hz=fs.read_int(f"{EMC_DIR}/min_rate", lo=0, hi=_MAX_HZ),
        max_rate_hz=fs.read_int(f"{EMC_DIR}/max_rate", lo=0, hi=_MAX_HZ),
        locked=None if locked is None else locked != 0,
        iso_cap_hz=cap or None,
        activity_path=find_mc_activity_path(fs),
        available_hz=read_emc_table(fs),
    )


def emc_rates(emc: EmcInfo) -> tuple[int, ...]:
    """The rates a governor may ask of this EMC clock, ascending.

    The published table within ``min_rate..max_rate`` (the bounds nvpmodel and BPMP set: a
    rate above ``max_rate`` would not be honoured); just ``(min_rate, max_rate)`` when no table
    was readable or none of it lies within the bounds.
    """
    lo = emc.min_rate_hz or 0
    hi = emc.max_rate_hz or _MAX_HZ
    within = tuple(r for r in emc.available_hz if lo <= r <= hi)
    return within or tuple(sorted({r for r in (emc.min_rate_hz, emc.max_rate_hz) if r}))


def set_emc_rate(fs: SysfsRoot, hz: int, *, available_hz: Sequence[int] = ()) -> None:
    """Pin the EMC clock: ``mrq_rate_locked = 1`` then ``rate = hz`` (bpmp debugfs; root only).

    ``hz`` is checked against ``available_hz`` when given (a board profile's list, say),
    otherwise against the kernel's rate table within ``min_rate..max_rate`` (:func:`emc_rates`),
    or only against that range when no table is published.

    :raises PlatformError: no bpmp EMC clock under the root.
    :raises UnsupportedFrequencyError: ``hz`` not allowed (nothing written).
    :raises SysfsPermissionError: debugfs is root-only.
    """
    emc = read_emc(fs)
    if emc is None:
        raise PlatformError(f"no bpmp EMC clock at {EMC_DIR} under {fs.root}")
    if available_hz:
        if hz not in available_hz:
            raise UnsupportedFrequencyError(
                f"{hz} Hz is not an available EMC rate; available: {' '.join(map(str, available_hz))}"
            )
    elif emc.available_hz:
        allowed = emc_rates(emc)
        if hz not in allowed:
            raise UnsupportedFrequencyError(
                f"{hz} Hz is not an EMC rate the kernel offers within min_rate..max_rate; "
                f"available: {' '.join(map(str, allowed))}"
            )
    elif emc.min_rate_hz is not None and emc.max_rate_hz is not None and not emc.min_rate_hz <= hz <= emc.max_rate_hz:
        raise UnsupportedFrequencyError(
            f"{hz} Hz is outside the EMC range {emc.min_rate_hz}-{emc.max_rate_hz} Hz"
        )
    fs.write_text(f"{EMC_DIR}/mrq_rate_locked", 1)
    fs.write_text(f"{EMC_DIR}/rate", hz)


def release_emc_rate(fs: SysfsRoot) -> None:
    """Hand the EMC clock back to bpmp (``mrq_rate_locked = 0``).

    :raises PlatformError: no bpmp EMC clock under the root.
    """
    if not fs.exists(f"{EMC_DIR}/mrq_rate_locked"):
        raise PlatformError(f"no bpmp EMC clock at {EMC_DIR} under {fs.root}")
    fs.write_text(f"{EMC_DIR}/mrq_rate_locked", 0)
