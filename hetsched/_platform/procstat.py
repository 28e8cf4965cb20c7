"""Per-CPU utilisation from ``/proc/stat`` deltas.

A ``cpuN`` line holds cumulative jiffies: ``user nice system idle iowait irq
softirq steal guest guest_nice``. ``guest``/``guest_nice`` are already inside
``user``/``nice`` and are not added again; idle time is ``idle + iowait``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CpuTimes", "parse_proc_stat", "utilisation"]


@dataclass(frozen=True, slots=True)
class CpuTimes:
    busy: int
    total: int


def parse_proc_stat(text: str) -> dict[int, CpuTimes]:
    """``/proc/stat`` -> ``{cpu: CpuTimes}`` for every ``cpuN`` line (the aggregate ``cpu`` line is skipped).

    Offline CPUs have no line and so are absent; malformed lines are skipped.
    """
    out: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        fields = line.split()
        label = fields[0]
        if not label[3:].isdigit() or len(fields) < 5:
            continue
        try:
            values = [int(v) for v in fields[1:9]]
        except ValueError:
            continue
        values += [0] * (8 - len(values))
        user, nice, system, idle, iowait, irq, softirq, steal = values
        idle_all = idle + iowait
        busy = user + nice + system + irq + softirq + steal
        out[int(label[3:])] = CpuTimes(busy=busy, total=busy + idle_all)
    return out


def utilisation(prev: Mapping[int, CpuTimes], cur: Mapping[int, CpuTimes]) -> dict[int, float]:
    """Busy fraction per CPU between two parses; CPUs missing from either, or with no elapsed time, are left out."""
    out: dict[int, float] = {}
    for cpu, now in cur.items():
        before = prev.get(cpu)
        if before is None:
            continue
        dt = now.total - before.total
        if dt <= 0:
            continue
        out[cpu] = min(max((now.busy - before.busy) / dt, 0.0), 1.0)
    return out
