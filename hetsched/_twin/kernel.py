"""Kernel-like frequency selection and sysfs write semantics for the twin (pure, no I/O).

What the twin does with a write, and why (kernel sources named):

* cpufreq ``scaling_max_freq``: value in kHz, clamped to ``cpuinfo_{min,max}_freq`` and resolved
  to the highest available frequency <= it (``__resolve_freq(..., CPUFREQ_RELATION_H)``).
  ``scaling_min_freq``: clamped likewise and resolved to the lowest available >= it
  (``RELATION_L``); when min > max the policy shows min = max (``cpufreq_verify_within_limits``).
  Reads show the aggregated limits, so thermal caps appear in ``scaling_max_freq``.
* ``scaling_setspeed`` (userspace governor only, else ``EINVAL``): the lowest available
  frequency >= the value within [min, max] (``__cpufreq_driver_target(.., RELATION_L)``);
  it reads back the achieved ``policy->cur``.
* ``scaling_governor``/``governor``: must be one of the available governors, else ``EINVAL``.
* devfreq ``min_freq``/``max_freq`` (Hz): stored as PM-QoS requests (kHz precision, rounded
  up for min, down for max), clamped to the OPP range, shown as written (not rounded to an
  OPP); ``0`` restores the default. The device then runs at the lowest OPP >= the target
  within [min, max], or the highest OPP <= max when the target is above max
  (``devfreq_update_target`` + ``devfreq_recommended_opp``).
* ``userspace/set_freq``: exists only under the userspace governor; same OPP pick.
* Jetson EMC (bpmp debugfs): ``rate`` takes effect only while ``mrq_rate_locked`` is 1, rounded
  to the lowest supported rate >= it (the rates ``emc/possible_rates`` lists) and capped by
  ``emc_iso_cap`` (``0`` = no cap); ``mrq_rate_locked`` accepts only 0 or 1.
* Anything that does not parse as a non-negative integer is rejected (``EINVAL``).

A regular file cannot fail a ``write()``, so a rejected write is *reverted*: the live twin
rewrites the file's previous content and counts the rejection in its statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "WriteRejected",
    "governor_target",
    "parse_uint",
    "pick_opp",
    "resolve_ceil",
    "resolve_floor",
]


class WriteRejected(ValueError):
    """The kernel would answer this write with EINVAL; the message says why."""


def parse_uint(text: str) -> int:
    """Parse like the kernel's ``kstrtouint``/``sscanf("%u")``: surrounding whitespace allowed.

    Raises:
        WriteRejected: not a non-negative decimal integer.
    """
    s = text.strip()
    if not s.isdigit():
        raise WriteRejected(f"invalid value {text.strip()!r}: not a non-negative integer")
    return int(s)


def resolve_ceil(avail: Sequence[int], target: int) -> int:
    """Lowest available >= target, else the highest (RELATION_L)."""
    for f in avail:
        if f >= target:
            return f
    return avail[-1]


def resolve_floor(avail: Sequence[int], target: int) -> int:
    """Highest available <= target, else the lowest (RELATION_H)."""
    best = avail[0]
    for f in avail:
        if f <= target:
            best = f
        else:
            break
    return best


def pick_opp(avail: Sequence[int], target: int, lo: int, hi: int) -> int:
    """The OPP the kernel runs at for ``target`` within limits [lo, hi] (``avail`` ascending)."""
    if target >= hi:
        return resolve_floor(avail, hi)
    t = target if target > lo else lo
    f = resolve_ceil(avail, t)
    if f > hi:
        f = resolve_floor(avail, hi)
    return f


def governor_target(
    governor: str,
    util: float,
    cur: int,
    avail: Sequence[int],
    lo: int,
    hi: int,
    setspeed: int | None = None,
) -> int:
    """Frequency a kernel governor picks from the last period's utilisation (0..1).

    ``schedutil``/``interactive``: ``1.25 * util * f_max``; ``ondemand``/``conservative``: max above
    80 % load, else ``f_min + load * (f_max - f_min)``; ``simple_ondemand`` and the vendor devfreq
    governors: up/down-differential thresholds (defaults 90/5; RK GPU 30/10, RK DMC 25/20
    (``dmc_ondemand``), ``rknpu_ondemand`` and ``nvhost_podgov`` 30/10, Jetson ``bpmp`` 60/20);
    ``performance``/``powersave``: the limits; ``userspace``: ``setspeed``.
    """
    fmax = avail[-1]
    fmin = avail[0]
    if governor == "performance":
        return pick_opp(avail, hi, lo, hi)
    if governor == "powersave":
        return pick_opp(avail, lo, lo, hi)
    if governor == "userspace":
        return pick_opp(avail, setspeed if setspeed is not None else cur, lo, hi)
    if governor in ("schedutil", "interactive"):
        return pick_opp(avail, int(1.25 * util * fmax), lo, hi)
    if governor in ("ondemand", "conservative"):
        if util > 0.8:
            return pick_opp(avail, hi, lo, hi)
        return pick_opp(avail, int(fmin + util * (fmax - fmin)), lo, hi)
    up, down = {
        "simple_ondemand": (90, 5),
        "dmc_ondemand": (25, 20),
        "rknpu_ondemand": (30, 10),
        "nvhost_podgov": (30, 10),
        "bpmp": (60, 20),
    }.get(governor, (90, 5))
    load = util * 100.0
    if load > up:
        return pick_opp(avail, hi, lo, hi)
    if load > up - down:
        return pick_opp(avail, cur, lo, hi)
    return pick_opp(avail, int(cur * load / (up - down / 2)), lo, hi)
