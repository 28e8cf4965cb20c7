"""Snapshot of every clock knob a governor may touch, for restore tests."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DVFS_KNOB_GLOBS", "dvfs_knobs"]

DVFS_KNOB_GLOBS: tuple[str, ...] = (
    "sys/devices/system/cpu/cpufreq/policy*/scaling_governor",
    "sys/devices/system/cpu/cpufreq/policy*/scaling_min_freq",
    "sys/devices/system/cpu/cpufreq/policy*/scaling_max_freq",
    "sys/devices/system/cpu/cpufreq/policy*/scaling_setspeed",
    "sys/class/devfreq/*/governor",
    "sys/class/devfreq/*/min_freq",
    "sys/class/devfreq/*/max_freq",
    "sys/class/devfreq/*/userspace/set_freq",
    "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked",
    "sys/kernel/nvpmodel_emc_cap/emc_iso_cap",
)


def dvfs_knobs(root: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every DVFS knob under ``root`` as raw bytes, keyed by root-relative path.

    Compare two snapshots to check that clocks were restored byte for byte; knobs a
    board lacks are simply absent.
    """
    base = Path(root)
    out: dict[str, bytes] = {}
    for pattern in DVFS_KNOB_GLOBS:
        for p in sorted(base.glob(pattern)):
            out[str(p.relative_to(base))] = p.read_bytes()
    return out
