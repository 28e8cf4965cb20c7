"""CPU affinity of threads: which cores the calling thread may run on (Linux ``sched_setaffinity``).

The runtime pins each device worker thread to its device's cores; benchmarks pin their own
threads the same way. See sched_setaffinity(2): https://man7.org/linux/man-pages/man2/sched_setaffinity.2.html
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["host_cpus", "pin_current_thread"]


def host_cpus() -> tuple[int, ...]:
    """CPUs this process may run on (its affinity; every CPU where the platform has none)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def pin_current_thread(cpus: Sequence[int]) -> set[int] | None:
    """Pin the calling thread to ``cpus``; returns its previous affinity.

    Returns None (and pins nothing) when ``cpus`` is empty or the platform has no
    ``sched_setaffinity`` (macOS, Windows).

    :raises OSError: the kernel refused the set (no such CPU online, or none of them allowed
        to this process, as in a cpuset cgroup that excludes them).
    """
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    return previous
