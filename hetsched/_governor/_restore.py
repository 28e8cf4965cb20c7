"""Putting clock knobs back: one implementation for the governor's restore and ``hetsched restore``.

:func:`write_back` writes one domain's saved knobs back (each knob tried, failures reported,
never raised one by one). :func:`restore_saved` puts back what a governor that is gone saved
in ``<root>/run/hetsched/governor-saved.json`` (:mod:`hetsched._governor._published`): the
governor did not restore (SIGKILL, OOM, power loss), so the board still runs its clocks.
Its file is removed once every knob reads back as saved; a governor that still runs (it
holds the root's governor lock, :mod:`hetsched._governor._lock`; for a file of an older
version without one, its pid runs) is left alone unless forced. The next governor on the root calls it before saving
(:meth:`SysfsPort.save <hetsched._governor._sysfs.SysfsPort.save>`), ``hetsched restore``
and ``hetsched doctor --restore-clocks`` from the command line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._errors import GovernorBusyError, HetschedError, SysfsError
from .._platform._fs import SysfsRoot, parse_name
from ._published import RUN_DIR, SAVED_FILE, _Dir, decode_knobs, owned_here, pid_alive, read_published

__all__ = [
    "RestoreOutcome", "by_role", "expected_knobs", "restore_saved", "saved_owner_alive", "unrestorable", "write_back",
]

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


@dataclass(frozen=True)
class RestoreOutcome:
    """What :func:`restore_saved` did.

    ``status``: ``restored`` (every knob back, file removed), ``nothing`` (no saved file),
    ``partial`` (some knobs could not be put back: ``failed``; the file is kept),
    ``refused`` (its governor still runs), ``malformed`` (the file cannot be read).
    """

    status: str
    path: str
    message: str
    pid: int | None = None
    written: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Knob path -> why it is not back."""
    left: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    """Knobs still not as saved -> the saved bytes (the board's own value)."""

    @property
    def exit_code(self) -> int:
        return 0 if self.status in ("restored", "nothing") else 1

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "path": self.path, "message": self.message, "pid": self.pid,
                "written": list(self.written), "failed": dict(self.failed), "left": sorted(self.left)}


def _running(pid: int, fs: SysfsRoot) -> bool:
    if pid == os.getpid():
        # This process: alive, but its file is stale unless a governor here still owns it
        # (one whose restore failed leaves it behind).
        return owned_here(fs)
    return pid_alive(pid)


def saved_owner_alive(fs: SysfsRoot, doc: Mapping[str, Any], *,
                      alive: Callable[[int], bool] | None = None) -> tuple[bool, int | None]:
    """Whether the governor that wrote the saved-clocks ``doc`` under ``fs`` still runs, and its pid.

    A file written under the governor lock (``"locked": true``) is alive exactly while the
    lock is held (a reused pid does not count); an older file, without a lock, by its pid.
    ``alive`` (injected for tests) answers instead of both. Reads only; never raises.
    """
    pid = doc.get("pid")
    pid = pid if isinstance(pid, int) else None
    if alive is not None:
        return (pid is not None and alive(pid)), pid
    if doc.get("locked") is True:
        from ._lock import probe

        state = probe(fs)
        if state.held is not None:
            return state.held, state.pid if state.held and state.pid is not None else pid
        return False, pid  # its lock file is gone: so is its governor
    return (pid is not None and _running(pid, fs)), pid


def restore_saved(fs: SysfsRoot, *, force: bool = False,
                  alive: Callable[[int], bool] | None = None, locked: bool = False) -> RestoreOutcome:
    """Put back the knobs a governor that is gone saved under ``fs`` (see the module docstring).

    Whose file it is: one written under the governor lock (:mod:`hetsched._governor._lock`)
    is a dead governor's when nobody holds that lock, whatever its pid; this takes the lock
    for the restore itself (no governor starts in the middle of it). An older file, without
    a lock, is judged by its pid.

    :param force: restore even though its governor seems to run (a reused pid of an older
        file; a governor that hangs); the lock is not taken.
    :param alive: whether a pid runs (injected for tests; then neither the lock nor the
        kernel is asked); default: this process's own governors are known, other pids are
        asked the kernel.
    :param locked: the caller holds the root's governor lock itself (a governor about to
        save): a file written under the lock cannot be a live governor's.
    :returns: what was done; nothing is raised for a knob that could not be put back (see
        ``failed``), nor for a missing, unreadable or foreign file, nor a lock that is held or
        cannot be taken (``status`` ``refused``).
    """
    where = f"{RUN_DIR}/{SAVED_FILE}"
    pub = read_published(fs)
    if where in pub.errors:
        return RestoreOutcome("malformed", where, f"{where} under {fs.root} cannot be read: {pub.errors[where]}")
    if pub.saved is None:
        return RestoreOutcome("nothing", where, f"nothing to restore under {fs.root} (no {where})")
    pid = pub.pid("saved")
    lock = None
    if not force:
        if alive is None and not locked and pub.saved.get("locked") is True:
            from ._lock import RootLock

            try:
                lock = RootLock.acquire(fs)
            except GovernorBusyError as exc:
                holder = exc.pid if exc.pid is not None else pid
                return RestoreOutcome("refused", where, f"the hetsched governor that saved {where} under {fs.root} "
                                      f"still runs (pid {holder}: it holds the governor lock) and restores the clocks "
                                      "itself; --force to restore anyway", holder)
            except SysfsError as exc:
                return RestoreOutcome("refused", where, f"cannot take the governor lock to restore {where} under "
                                      f"{fs.root}: {exc}; --force to restore anyway", pid)
        elif alive is not None or not (locked and pub.saved.get("locked") is True):
            live, pid = saved_owner_alive(fs, pub.saved, alive=alive)
            if live:
                return RestoreOutcome("refused", where, f"the hetsched governor that saved {where} under {fs.root} "
                                      f"still runs (pid {pid}) and restores the clocks itself; --force to restore "
                                      "anyway", pid)
    try:
        out = _restore(fs, pub.saved, pid)
    finally:
        if lock is not None:
            lock.release()
    if lock is not None and out.status == "restored":
        _Dir(fs).remove_if_empty()  # the lock file kept it until now
    return out


def _restore(fs: SysfsRoot, doc: Mapping[str, Any], pid: int | None) -> RestoreOutcome:
    where = f"{RUN_DIR}/{SAVED_FILE}"
    try:
        saved = decode_knobs(doc.get("knobs"))
    except ValueError as exc:
        return RestoreOutcome("malformed", where, f"{where} under {fs.root} is malformed: {exc}", pid)
    written: list[str] = []
    failed: dict[str, str] = {}
    for knobs in saved.values():
        failed.update({p: str(why) for p, why in write_back(fs, knobs, written=written).items()})
    left: dict[str, bytes] = {}
    for knobs in saved.values():
        for p, v in expected_knobs(knobs).items():
            try:
                now = fs.read_bytes(p)
            except HetschedError:
                now = None
            if now != v:
                left[p] = v
                failed.setdefault(p, f"{p} does not read back as saved")
    who = f"pid {pid}" if pid is not None else "an unknown pid"
    if failed:
        text = "; ".join(failed.values())
        return RestoreOutcome("partial", where, f"restored {len(written)} clock knobs a governor that is gone "
                              f"({who}) left changed under {fs.root}, {len(failed)} not: {text}; {where} is kept",
                              pid, tuple(written), MappingProxyType(failed), MappingProxyType(left))
    _remove(fs, doc)
    return RestoreOutcome("restored", where, f"restored {len(written)} clock knobs a governor that is gone ({who}) "
                          f"left changed under {fs.root}; removed {where}", pid, tuple(written))


def _remove(fs: SysfsRoot, doc: Mapping[str, Any]) -> None:
    """Remove the saved file, only if it is still the one restored (a governor starting now
    writes its own), and its directory when that is empty then."""
    if read_published(fs).saved != doc:
        return
    d = _Dir(fs)
    d.remove(SAVED_FILE)
    d.remove_if_empty()  # not when a state file or another governor's is left
