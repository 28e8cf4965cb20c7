"""The governor's state directory, ``<root>/run/hetsched``, and its one owner: :class:`StateDir`.

Everything a governor keeps on a board lives there, and only :class:`StateDir` reads or writes it:

* ``governor.lock``: the root's governor lock (:mod:`hetsched._governor._lock`), held with
  ``flock`` from before a governor saves the knobs until after it restored them: one governor
  per root. :meth:`StateDir.lock`, :meth:`StateDir.unlock`, :meth:`StateDir.probe`.
* ``governor-saved.json``: every knob a governor saved before its first write (raw bytes as
  latin-1 text, so they round-trip exactly), its pid and ``"locked": true`` (saved under the
  lock). Written once at start, removed only after a restore that succeeded: a file whose lock
  nobody holds (an older one without a lock: whose pid no longer runs) means a governor died
  with the clocks changed. ``hetsched doctor`` reports it; ``hetsched restore``, ``doctor
  --restore-clocks`` and the next governor on the root put them back
  (:meth:`StateDir.restore_saved`).
* ``governor-state.json``: a running governor's phase, per-domain targets, locked domains, pid
  (``hetsched top``, ``hetsched doctor``; written by the engine's
  :class:`~hetsched._governor._published.Publisher` through :meth:`StateDir.publish`).

Every access is the contained walk of :mod:`hetsched._governor._state_walk`: each component
opened without following links (nothing outside the root is opened, written or removed), files
written atomically and read only when they are regular files. Who uses it: the board port
(:class:`~hetsched._governor._sysfs.SysfsPort` holds one as its ``state_dir`` capability), the
engine's publisher (through the port's ``state_dir``), ``hetsched restore``, ``doctor`` and
``top``. It imports only downwards: the lock and the walk below it, the knob write-back
(:mod:`hetsched._governor._knobs`) and the platform layer.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._errors import GovernorBusyError, HetschedError, PathOutsideRootError, SysfsError
from .._platform._fs import SysfsRoot
from ._knobs import expected_knobs, write_back
from ._lock import LockState, RootLock, probe
from ._state_walk import RUN_DIR, SAVED_FILE, STATE_FILE, RunDir

__all__ = [
    "FORMAT", "Published", "RestoreOutcome", "StateDir", "StateDirStatistics", "decode_knobs", "encode_knobs", "pid_alive",
]

log = logging.getLogger("hetsched.governor")

FORMAT = 1
"""The files' ``"format"``."""
_SAVED = f"{RUN_DIR}/{SAVED_FILE}"

# Run directories whose saved file a governor of this process wrote and has not closed:
# a file with this process's pid elsewhere is one a governor here left behind.
_OWNED: set[str] = set()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists in this pid namespace (a reused pid reads as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    except OSError:
        return False
    return True


def encode_knobs(saved: Any) -> dict[str, dict[str, str | None]] | None:
    """``{domain: {path: bytes | None}}`` as JSON-able text (latin-1: every byte maps to one char);
    None when ``saved`` is not of that shape (a port of its own saving something else)."""
    if not isinstance(saved, Mapping):
        return None
    out: dict[str, dict[str, str | None]] = {}
    for dom, knobs in saved.items():
        if not isinstance(knobs, Mapping):
            return None
        out[str(dom)] = {}
        for path, value in knobs.items():
            if value is not None and not isinstance(value, bytes):
                return None
            out[str(dom)][str(path)] = None if value is None else value.decode("latin-1")
    return out


def decode_knobs(data: Any) -> dict[str, dict[str, bytes | None]]:
    """Inverse of :func:`encode_knobs`. :raises ValueError: not that shape."""
    if not isinstance(data, dict):
        raise ValueError("knobs: not an object")
    out: dict[str, dict[str, bytes | None]] = {}
    for dom, knobs in data.items():
        if not isinstance(knobs, dict):
            raise ValueError(f"knobs of {dom!r}: not an object")
        out[str(dom)] = {}
        for path, value in knobs.items():
            if value is not None and not isinstance(value, str):
                raise ValueError(f"knob {path!r}: not a string")
            out[str(dom)][str(path)] = None if value is None else value.encode("latin-1")
    return out


@dataclass(frozen=True)
class Published:
    """What :meth:`StateDir.read` found (None: the file is absent or unreadable)."""

    state: Mapping[str, Any] | None = None
    saved: Mapping[str, Any] | None = None
    errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Root-relative file path -> why it could not be read (garbage, a FIFO, a link, permission)."""

    @property
    def phase(self) -> str | None:
        return None if self.state is None else self.state.get("phase")

    @property
    def targets(self) -> Mapping[str, int]:
        raw = {} if self.state is None else self.state.get("targets") or {}
        return {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}

    def pid(self, which: str = "state") -> int | None:
        doc = self.state if which == "state" else self.saved
        pid = None if doc is None else doc.get("pid")
        return pid if isinstance(pid, int) else None


@dataclass(frozen=True)
class RestoreOutcome:
    """What :meth:`StateDir.restore_saved` did.

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


@dataclass(frozen=True)
class StateDirStatistics:
    """What one :class:`StateDir` did (:meth:`StateDir.statistics`)."""

    root: str
    locked: bool
    """Whether it holds the root's governor lock now."""
    published: tuple[str, ...]
    """Files it wrote and has not removed (never another governor's)."""
    writes: int
    reads: int
    locks: int
    """Times it took the lock."""


class StateDir:
    """The one owner of ``<root>/run/hetsched`` (see the module docstring). Making one touches nothing.

    One per user: a governor's port holds one (its lock, the files it published), ``hetsched
    restore``/``doctor``/``top`` make their own to read, judge and restore.
    """

    def __init__(self, fs: SysfsRoot) -> None:
        self.fs = fs
        self._run: RunDir | None = None
        self._lock: RootLock | None = None
        self._wrote: set[str] = set()
        self._writes = 0
        self._reads = 0
        self._locks = 0

    def __repr__(self) -> str:
        return f"StateDir({str(self.fs.root)!r}, locked={self.locked})"

    def statistics(self) -> StateDirStatistics:
        return StateDirStatistics(str(self.fs.root), self.locked, tuple(sorted(self._wrote)), self._writes,
                                  self._reads, self._locks)

    def _dir(self) -> RunDir:
        """The walk (made once). :raises PathOutsideRootError: ``run`` leads outside the root."""
        if self._run is None:
            self._run = RunDir(self.fs)
        return self._run

    @property
    def path(self) -> str:
        """The directory's path (for messages)."""
        return f"{self.fs.root}/{RUN_DIR}"

    # -- the lock -------------------------------------------------------------------------

    def lock(self) -> None:
        """Take the root's governor lock, unless this already holds it (see :meth:`RootLock.acquire`).

        :raises GovernorBusyError: another governor (this process or another) holds it.
        :raises PathOutsideRootError: ``run``, ``run/hetsched`` or the lock file leads outside the root.
        :raises SysfsPermissionError: the lock may not be created.
        :raises SysfsError: a link or something not a regular file at the name, or another OS error.
        """
        if self._lock is None or not self._lock.held:
            self._lock = RootLock.acquire(self.fs, self._dir())
            self._locks += 1

    @property
    def locked(self) -> bool:
        """Whether this holds the root's governor lock now."""
        return self._lock is not None and self._lock.held

    def unlock(self) -> None:
        """Drop the lock (its file removed) and the directories this made if empty; idempotent, never raises."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def probe(self) -> LockState:
        """Whether some governor (this one included) holds the root's lock now; creates nothing, never raises."""
        try:
            d = self._dir()
        except HetschedError:
            return LockState(None)
        return probe(self.fs, d)

    # -- the files ------------------------------------------------------------------------

    def read(self) -> Published:
        """The state and saved files, each read only if it is a regular file reached without links
        (a link on the way to the directory reads as no files: nobody could have written them there;
        a link, FIFO or device at a file's name is an error for that file)."""
        docs: dict[str, Mapping[str, Any] | None] = {}
        errors: dict[str, str] = {}
        self._reads += 1
        try:
            d: RunDir | None = self._dir()
        except PathOutsideRootError:
            d = None  # ``run`` leads out of the root: no governor could write there (nothing is opened)
        for name in (STATE_FILE, SAVED_FILE):
            rel = f"{RUN_DIR}/{name}"
            try:
                raw = None if d is None else d.read(name)
                doc = None if raw is None else json.loads(raw)
                if doc is not None and not isinstance(doc, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:  # SysfsError and PathOutsideRootError are OSErrors
                errors[rel] = str(exc)
                doc = None
            docs[name] = doc
        return Published(docs[STATE_FILE], docs[SAVED_FILE], MappingProxyType(errors))

    def dead_saved_knobs(self) -> dict[str, dict[str, bytes | None]]:
        """The knobs in the saved file ({} when there is none or it cannot be read)."""
        doc = self.read().saved
        try:
            return decode_knobs(doc.get("knobs")) if doc is not None else {}
        except ValueError:
            return {}

    def publish(self, name: str, payload: Mapping[str, Any]) -> None:
        """Write ``payload`` to ``name`` (:data:`STATE_FILE` or :data:`SAVED_FILE`) atomically.

        The saved file is marked ``"locked": true`` while this holds the lock, and remembered as
        this process's until :meth:`close`.

        :raises OSError: it cannot be written (a link on the way, ``run`` outside the root,
            permission); the caller decides (the publisher stops publishing).
        """
        d = self._dir()
        if name == SAVED_FILE and self.locked:
            payload = {**payload, "locked": True}
        d.write(name, payload)
        self._writes += 1
        self._wrote.add(name)
        if name == SAVED_FILE:
            _OWNED.add(d.path)

    def withdraw(self, name: str) -> None:
        """Remove ``name`` if this wrote it (never another governor's file).

        :raises OSError: it cannot be removed (a link swapped in on the way).
        """
        if name in self._wrote and self._run is not None:
            self._run.remove(name)
            self._wrote.discard(name)

    def close(self, *, restored: bool) -> None:
        """The governor is done: the state file goes, the saved knobs only when ``restored`` (they
        are back), then the lock is dropped and the directories this made are tidied, in that
        order (a governor starting in between never has its new files removed). Idempotent;
        never raises (a file that cannot be removed is logged and stays)."""
        try:
            for name in (STATE_FILE, SAVED_FILE) if restored else (STATE_FILE,):
                try:
                    self.withdraw(name)
                except OSError as exc:
                    log.warning("governor: cannot remove %s under %s: %s", name, self.path, exc)
        finally:
            self.unlock()
            if self._run is not None:
                _OWNED.discard(self._run.path)
                self._run.tidy()

    # -- whose saved file -----------------------------------------------------------------

    def owned_here(self) -> bool:
        """Whether a governor of this process, not closed yet, wrote the saved file here."""
        try:
            return self._dir().path in _OWNED
        except HetschedError:
            return False

    def saved_owner_alive(self, doc: Mapping[str, Any], *,
                          alive: Callable[[int], bool] | None = None) -> tuple[bool, int | None]:
        """Whether the governor that wrote the saved-clocks ``doc`` still runs, and its pid.

        A file written under the lock (``"locked": true``) is alive exactly while the lock is held
        (a reused pid does not count); an older file, without a lock, by its pid (this process's
        own: while a governor here owns it). ``alive`` (injected for tests) answers instead of
        both. Reads only; never raises.
        """
        pid = doc.get("pid")
        pid = pid if isinstance(pid, int) else None
        if alive is not None:
            return (pid is not None and alive(pid)), pid
        if doc.get("locked") is True:
            state = self.probe()
            if state.held is not None:
                return state.held, state.pid if state.held and state.pid is not None else pid
            return False, pid  # its lock file is gone: so is its governor
        if pid is None:
            return False, None
        return (self.owned_here() if pid == os.getpid() else pid_alive(pid)), pid

    # -- putting a dead governor's knobs back --------------------------------------------

    def restore_saved(self, *, force: bool = False, alive: Callable[[int], bool] | None = None) -> RestoreOutcome:
        """Put back the knobs a governor that is gone saved here (``hetsched restore``).

        Whose file it is: one written under the lock is a dead governor's when nobody holds the
        lock, whatever its pid; the lock is taken for the restore itself (no governor starts in
        the middle of it) unless this holds it already (a governor about to save: then the file
        cannot be a live governor's). An older file, without a lock, is judged by its pid.

        :param force: restore even though its governor seems to run (a reused pid of an older
            file; a governor that hangs); the lock is not taken.
        :param alive: whether a pid runs (injected for tests; then neither the lock nor the
            kernel is asked).
        :returns: what was done; nothing is raised for a knob that could not be put back (see
            ``failed``), nor for a missing, unreadable or foreign file, nor a lock that is held or
            cannot be taken (``status`` ``refused``).
        """
        pub = self.read()
        doc = pub.saved
        if doc is None and _SAVED in pub.errors:
            return RestoreOutcome("malformed", _SAVED, f"{_SAVED} under {self.fs.root} cannot be read: {pub.errors[_SAVED]}")
        if doc is None:
            return RestoreOutcome("nothing", _SAVED, f"nothing to restore under {self.fs.root} (no {_SAVED})")
        took = not force and alive is None and not self.locked and doc.get("locked") is True
        refused = None if force else self._refusal(doc, alive, take_lock=took)
        if refused is not None:
            return refused
        try:
            return self._write_back(doc)
        finally:
            if took:
                self.unlock()
                self._dir().remove_if_empty()  # the lock file kept it until now (a kept saved file still does)

    def _refusal(self, doc: Mapping[str, Any], alive: Callable[[int], bool] | None, *,
                 take_lock: bool) -> RestoreOutcome | None:
        """Why the saved ``doc`` is not to be restored (its governor runs), or None: a dead
        governor's (with ``take_lock``, the lock is taken for the restore)."""
        pid = doc.get("pid") if isinstance(doc.get("pid"), int) else None
        why = None
        if take_lock:
            try:
                self.lock()
            except GovernorBusyError as exc:
                pid = exc.pid if exc.pid is not None else pid
                why = f"still runs (pid {pid}: it holds the governor lock) and restores the clocks itself"
            except SysfsError as exc:
                why = f"cannot be told dead: the governor lock cannot be taken to restore it: {exc}"
        elif alive is not None or not (self.locked and doc.get("locked") is True):  # else: under this lock
            live, pid = self.saved_owner_alive(doc, alive=alive)
            why = f"still runs (pid {pid}) and restores the clocks itself" if live else None
        return None if why is None else RestoreOutcome(
            "refused", _SAVED, f"the hetsched governor that saved {_SAVED} under {self.fs.root} {why}; "
            "--force to restore anyway", pid)

    def _write_back(self, doc: Mapping[str, Any]) -> RestoreOutcome:
        """Write every knob of ``doc`` back, check each reads back as saved, remove the file when all do."""
        pid = doc.get("pid") if isinstance(doc.get("pid"), int) else None
        try:
            saved = decode_knobs(doc.get("knobs"))
        except ValueError as exc:
            return RestoreOutcome("malformed", _SAVED, f"{_SAVED} under {self.fs.root} is malformed: {exc}", pid)
        written: list[str] = []
        failed: dict[str, str] = {}
        for knobs in saved.values():
            failed.update({p: str(why) for p, why in write_back(self.fs, knobs, written=written).items()})
        left: dict[str, bytes] = {}
        for knobs in saved.values():
            for p, v in expected_knobs(knobs).items():
                try:
                    now = self.fs.read_bytes(p)
                except HetschedError:
                    now = None
                if now != v:
                    left[p] = v
                    failed.setdefault(p, f"{p} does not read back as saved")
        who = f"pid {pid}" if pid is not None else "an unknown pid"
        if failed:
            text = "; ".join(failed.values())
            return RestoreOutcome("partial", _SAVED, f"restored {len(written)} clock knobs a governor that is gone "
                                  f"({who}) left changed under {self.fs.root}, {len(failed)} not: {text}; {_SAVED} "
                                  "is kept", pid, tuple(written), MappingProxyType(failed), MappingProxyType(left))
        if self.read().saved == doc:  # not when a governor starting now wrote its own meanwhile
            d = self._dir()
            d.remove(SAVED_FILE)
            d.remove_if_empty()  # not when a state file or another governor's is left
        return RestoreOutcome("restored", _SAVED, f"restored {len(written)} clock knobs a governor that is gone "
                              f"({who}) left changed under {self.fs.root}; removed {_SAVED}", pid, tuple(written))
