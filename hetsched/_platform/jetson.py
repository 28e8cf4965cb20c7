"""Jetson specifics: GPU load (per-mille), EMC clock and activity (bpmp debugfs), L4T release.

Layout::

    <gpu device>/load                                 0-1000, 0 while rail-gated (nvgpu)
    sys/devices/gpu.0/load, sys/devices/platform/gpu.0/load       aliases (JP5 / JP6)
    sys/kernel/debug/bpmp/debug/clk/emc/{rate,min_rate,max_rate,mrq_rate_locked}   Hz, root-only
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
    "EMC_DIR",
    "EmcInfo",
    "L4TRelease",
    "emc_utilisation",
    "find_gpu_load_path",
    "find_mc_activity_path",
    "parse_gpu_load",
    "parse_nv_tegra_release",
    "read_emc",
    "release_emc_rate",
    "set_emc_rate",
]

EMC_DIR = "sys/kernel/debug/bpmp/debug/clk/emc"
EMC_CAP = "sys/kernel/nvpmodel_emc_cap/emc_iso_cap"
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
    )


def set_emc_rate(fs: SysfsRoot, hz: int, *, available_hz: Sequence[int] = ()) -> None:
    """Pin the EMC clock: ``mrq_rate_locked = 1`` then ``rate = hz`` (bpmp debugfs; root only).

    ``hz`` is checked against ``available_hz`` when given (bpmp publishes no table, so the
    board profile's list is the reference), otherwise against ``min_rate..max_rate``.

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
