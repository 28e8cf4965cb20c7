"""A board's clock knobs: what each file is, which saved bytes can be written back, writing them back.

The sysfs end of every restore: :class:`~hetsched._governor._sysfs.SysfsPort` puts its own
saved knobs back with :func:`write_back`, and so does
:meth:`StateDir.restore_saved <hetsched._governor._state_dir.StateDir.restore_saved>` (``hetsched
restore``, ``hetsched doctor --restore-clocks``, the next governor on a root) for the knobs a
governor that is gone saved. Every write goes through :class:`~hetsched._platform._fs.SysfsRoot`
(nothing outside the root); nothing here knows about the state directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._errors import SysfsError
from .._platform._fs import SysfsRoot, parse_name

__all__ = ["Knobs", "by_role", "expected_knobs", "unrestorable", "write_back"]

Knobs = Mapping[str, bytes | None]
"""One domain's saved knobs: root-relative path -> raw bytes (None: absent when saved)."""

# What each knob file is, by its name (the same names in cpufreq and devfreq).
_ROLE = {
    "scaling_governor": "governor", "governor": "governor",
    "scaling_min_freq": "min", "min_freq": "min",
    "scaling_max_freq": "max", "max_freq": "max",
    "scaling_setspeed": "speed", "set_freq": "speed",
    "mrq_rate_locked": "lock", "rate": "rate",
}
# What a kernel prints for a frequency or a flag (``%lu``): digits, the newline it adds.
_NUMBER = re.compile(rb"\s*[0-9]{1,20}\s*")


def _role(path: str) -> str:
    return _ROLE.get(path.rsplit("/", 1)[-1], "other")


def unrestorable(path: str, raw: bytes | None, governors: tuple[str, ...] = ()) -> str | None:
    """Why the saved bytes ``raw`` of knob ``path`` could not be written back, or None.

    A governor must be a name (and in ``governors`` when that list is known); every other
    knob a plain number. None (absent when saved) is nothing to restore, so no reason.
    """
    if raw is None:
        return None
    if _role(path) == "governor":
        name = parse_name(raw)
        if name is None:
            return f"holds {raw[:40]!r}, not a governor name"
        if governors and name not in governors:
            return f"governor {name!r} is not in the available list ({' '.join(governors)})"
        return None
    if _NUMBER.fullmatch(raw) is None:
        return f"holds {raw[:40]!r}, not a plain number"
    return None


def by_role(knobs: Knobs) -> dict[str, tuple[str, bytes | None]]:
    return {_role(p): (p, v) for p, v in knobs.items()}


def expected_knobs(knobs: Knobs, *, rendered: bool = False) -> dict[str, bytes]:
    """The knobs that must read back as saved after :func:`write_back`. Not the EMC rate unless
    it was locked (unlocked, the BPMP picks the rate); a set-speed file only with ``rendered``
    unless the saved governor is ``userspace`` (the kernel renders it from the governor: it
    reads as saved once the governor is back, on a live twin at its next update)."""
    by = by_role(knobs)
    gov = by.get("governor", ("", None))[1]
    lock = by.get("lock", ("", None))[1]
    out = {}
    for role, (path, raw) in by.items():
        if raw is None or role == "other":
            continue
        if role == "speed" and not rendered and (gov is None or parse_name(gov) != "userspace"):
            continue
        if role == "rate" and (lock is None or lock.strip() in (b"", b"0")):
            continue
        out[path] = raw
    return out


def write_back(fs: SysfsRoot, knobs: Knobs, *, written: list[str] | None = None) -> dict[str, SysfsError | str]:
    """Write one domain's saved knobs back, each only where it differs now, in the order the
    kernel accepts: governor, then the limits so that min never exceeds max, then a set-speed
    value (under ``userspace``); EMC rate before its lock flag. Every knob is tried: one that
    cannot be (its saved bytes are no value, the write is refused) is skipped and reported.

    :param written: paths written are appended here.
    :returns: path -> why it was not restored (the :class:`SysfsError` the write raised, or a
        reason), empty when everything went back. Nothing is raised for one knob.
    """
    failed: dict[str, SysfsError | str] = {}
    by = by_role(knobs)

    def put(role: str, *, optional: bool = False) -> bool:
        if role not in by:
            return False
        path, raw = by[role]
        if raw is None:
            return False
        try:
            if not fs.exists(path):
                if not optional:
                    failed[path] = f"{path} is gone"
                return False
            if fs.read_bytes(path) == raw:
                return True
            why = unrestorable(path, raw)
            if why is not None:
                failed[path] = f"{path} {why}"
                return False
            # Exactly what was read (newline included): the kernel accepts it, and a
            # plain-file tree ends byte-identical.
            fs.write_text(path, raw.decode("ascii"))
        except SysfsError as exc:
            failed[path] = exc
            return False
        if written is not None:
            written.append(path)
        return True

    if "lock" in by:
        lock = by["lock"][1]
        if lock is not None and unrestorable(by["lock"][0], lock) is None and lock.strip() != b"0":
            put("rate")
        put("lock")
        return failed
    put("governor")
    lo, hi = by.get("min", ("", None)), by.get("max", ("", None))
    first, second = "min", "max"
    if lo[1] is not None and hi[1] is not None and _NUMBER.fullmatch(lo[1]):
        try:
            cur_max = fs.read_int(hi[0])
        except SysfsError:
            cur_max = None  # reported by the write that follows
        if cur_max is not None and int(lo[1]) > cur_max:
            first, second = "max", "min"
    put(first)
    put(second)
    gov = by.get("governor", ("", None))[1]
    if gov is not None and parse_name(gov) == "userspace":
        put("speed", optional=True)  # the file shows once the kernel has the governor again
    return failed
