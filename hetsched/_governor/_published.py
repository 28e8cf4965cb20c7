"""The governor's small state files under the root's run directory: what it does now, what it saved.

A governor driving a board through :class:`~hetsched._governor._sysfs.SysfsPort` keeps two
files in ``<root>/run/hetsched/`` (``/run/hetsched/`` on a board, a tmpfs the kernel empties
at boot):

* ``governor-saved.json``: every knob it saved before its first write (raw bytes as latin-1
  text, so they round-trip exactly), with its pid and ``"locked": true`` when it was saved
  under the root's governor lock (``governor.lock``, :mod:`hetsched._governor._lock`).
  Written once at start, removed only after a restore that succeeded: a file whose lock
  nobody holds (an older one without a lock: whose pid no longer runs) means a governor died
  with the clocks changed (``hetsched doctor`` reports it; the next governor on the root
  and ``hetsched restore`` put them back, :mod:`hetsched._governor._restore`).
* ``governor-state.json``: its current phase, per-domain targets, locked domains, pid.
  Rewritten when the phase or a target changes, at most every ``min_interval_s`` of the
  governor's clock (phases change per request; ``hetsched top`` refreshes about once a
  second), flushed on the next tick; removed on close.

Both are written atomically (temporary file + ``rename`` inside the directory, opened
without following links) and only below the root: a ``run`` that resolves outside it (a
link to the host's ``/run`` in a copied tree) disables publishing. Publishing never makes
the governor fail: an error is logged once and publishing stops.

:func:`read_published` is the readers' half (``doctor``, ``top``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._errors import HetschedError
from .._platform._fs import SysfsRoot

__all__ = [
    "RUN_DIR",
    "SAVED_FILE",
    "STATE_FILE",
    "Published",
    "Publisher",
    "decode_knobs",
    "owned_here",
    "pid_alive",
    "read_published",
]

log = logging.getLogger("hetsched.governor")

RUN_DIR = "run/hetsched"
"""Root-relative directory of the files."""
SAVED_FILE = "governor-saved.json"
STATE_FILE = "governor-state.json"
FORMAT = 1

# Run directories whose saved file a governor of this process wrote and has not closed:
# a file with this process's pid elsewhere is one a governor here left behind.
_OWNED: set[str] = set()

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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


def owned_here(fs: SysfsRoot) -> bool:
    """Whether a governor of this process, not closed yet, wrote the saved file under ``fs``."""
    try:
        return fs.resolve(RUN_DIR).path in _OWNED
    except HetschedError:
        return False


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


class _Dir:
    """``<root>/run/hetsched``, made at the first write; every component opened without following links.

    Each use walks from the root one directory at a time (``O_NOFOLLOW`` relative to the
    parent's descriptor), so a link swapped into ``run/`` after the governor started is refused
    (``ELOOP``/``ENOTDIR``), never followed out of the root.
    """

    def __init__(self, fs: SysfsRoot) -> None:
        self.path = fs.resolve(RUN_DIR).path  # PathOutsideRootError when run/ leads elsewhere at start
        self._root = str(fs.root)
        self._parts = RUN_DIR.split("/")
        self._made: list[int] = []  # how many components of _parts this writer created

    def _walk(self, *, create: bool) -> int | None:
        """A descriptor of the directory (the caller closes it); None if missing and not ``create``."""
        fd = os.open(self._root, _DIR_FLAGS)
        try:
            for depth, part in enumerate(self._parts, start=1):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        return None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    self._made.append(depth)
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            out, fd = fd, -1
            return out
        finally:
            if fd >= 0:
                os.close(fd)

    def write(self, name: str, payload: Mapping[str, Any]) -> None:
        data = (json.dumps(payload, sort_keys=True) + "\n").encode()
        fd = self._walk(create=True)
        assert fd is not None
        try:
            tmp = f".{name}.{os.getpid()}.tmp"
            try:
                os.unlink(tmp, dir_fd=fd)
            except FileNotFoundError:
                pass
            out = os.open(tmp, _NEW_FLAGS, 0o644, dir_fd=fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
            finally:
                os.close(out)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        fd = self._walk(create=False)
        if fd is None:
            return
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def _rmdir(self, depth: int) -> None:
        """Remove component ``depth`` of ``run/hetsched`` (1-based) if empty, walking without links.

        :raises OSError: not empty, missing, or a link on the way.
        """
        fd = os.open(self._root, _DIR_FLAGS)
        try:
            for part in self._parts[: depth - 1]:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            os.rmdir(self._parts[depth - 1], dir_fd=fd)
        finally:
            os.close(fd)

    def remove_if_empty(self) -> None:
        """Remove ``run/hetsched`` itself when nothing is left in it (another governor's files stay)."""
        try:
            self._rmdir(len(self._parts))
        except OSError:
            pass

    def tidy(self) -> None:
        """Remove the directories this writer made, if they are empty again (a tree as it was)."""
        for depth in sorted(set(self._made), reverse=True):
            try:
                self._rmdir(depth)
            except OSError:
                break
        self._made.clear()


class Publisher:
    """What the engine calls (see the module docstring); a disabled one does nothing.

    :param fs: the board's root, or None (a port that is not a board's: nothing is published).
    :param min_interval_s: least time, on the governor's clock (the ``now`` of :meth:`update`),
        between two writes of the state file; the files themselves carry wall time.
    """

    def __init__(self, fs: SysfsRoot | None, *, soc: str | None = None, min_interval_s: float = 0.1,
                 port: Any = None) -> None:
        self._dir: _Dir | None = None
        # The SysfsPort whose governor lock this publisher drops at close, after its own files.
        self._port = port
        self._soc = soc
        self._min_interval_s = min_interval_s
        self._started_unix = time.time()
        self._last: tuple[Any, ...] | None = None
        self._pending: dict[str, Any] | None = None
        self._last_t: float | None = None
        self._dry_run = False
        self._wrote: set[str] = set()
        self._fs = fs
        self.writes = 0
        if fs is not None:
            try:
                self._dir = _Dir(fs)
            except (OSError, HetschedError) as exc:
                log.info("governor: not publishing its state under %s: %s", fs.root, exc)

    @classmethod
    def for_port(cls, port: Any) -> Publisher:
        """A publisher for ``port``'s root when it is a :class:`SysfsPort`, else a disabled one."""
        from ._sysfs import SysfsPort

        if isinstance(port, SysfsPort):
            # The lock is dropped in closed(), once the state and saved files are gone: dropped at
            # the port's restore, a governor starting in between could see its new files removed.
            port.release_on_restore = False
            return cls(port.fs, soc=port.soc, port=port)
        return cls(None)

    @property
    def enabled(self) -> bool:
        return self._dir is not None

    def _guard(self, name: str, payload: Mapping[str, Any] | None) -> None:
        d = self._dir
        if d is None:
            return
        try:
            if payload is None:
                if name in self._wrote:  # never another governor's file
                    d.remove(name)
                    self._wrote.discard(name)
            else:
                d.write(name, payload)
                self._wrote.add(name)
                self.writes += 1
        except OSError as exc:
            log.warning("governor: cannot publish %s under %s (stopped publishing): %s", name, d.path, exc)
            self._dir = None

    def started(self, saved: Any, *, dry_run: bool) -> None:
        """After the knobs were saved (``saved`` None in a dry run: nothing to restore)."""
        self._dry_run = dry_run
        if self._dir is None:
            return
        if saved is None and self._fs is not None:
            from ._lock import probe
            from ._restore import saved_owner_alive

            if probe(self._fs).held:
                # A dry run beside a governing one: the state file is the owner's, not overwritten
                # (and removed at close) by a run that changes nothing.
                log.info("governor: another governor owns the clocks under %s: this run publishes nothing",
                         self._fs.root)
                self._dir = None
                return

            left = read_published(self._fs)
            pid = left.pid("saved")
            if left.saved is not None and not saved_owner_alive(self._fs, left.saved)[0]:
                log.warning("governor: a hetsched governor that is gone (pid %s) left clocks changed under %s; "
                            "this run does not restore them (`hetsched restore --root %s` does)",
                            pid, self._fs.root, self._fs.root)
        knobs = encode_knobs(saved)
        if knobs is not None:
            d = self._dir
            payload: dict[str, Any] = {"format": FORMAT, "pid": os.getpid(), "soc": self._soc,
                                       "started_unix": self._started_unix, "knobs": knobs}
            if self._port is not None and self._port.locked:
                payload["locked"] = True
            self._guard(SAVED_FILE, payload)
            if SAVED_FILE in self._wrote:
                _OWNED.add(d.path)

    def update(self, now: float, phase: str | None, targets: Mapping[str, int], locked: frozenset[str]) -> None:
        """The phase or the clocks may have changed: publish now, or at the next :meth:`flush`."""
        key = (phase, tuple(sorted(targets.items())), tuple(sorted(locked)))
        if key == self._last or self._dir is None:
            return
        self._last = key
        self._pending = {"format": FORMAT, "pid": os.getpid(), "soc": self._soc, "phase": phase,
                         "targets": dict(sorted(targets.items())), "locked": sorted(locked),
                         "dry_run": self._dry_run, "started_unix": self._started_unix}
        self.flush(now)

    def flush(self, now: float) -> None:
        """Write what :meth:`update` left pending once ``min_interval_s`` has passed."""
        if self._pending is None:
            return
        if self._last_t is not None and now - self._last_t < self._min_interval_s:
            return
        payload, self._pending = self._pending, None
        payload["updated_unix"] = time.time()
        self._last_t = now
        self._guard(STATE_FILE, payload)

    def closed(self, *, restored: bool) -> None:
        """Close: the state file goes; the saved knobs go only when ``restored`` (they are put back);
        then the port's governor lock is dropped (its file removed) and the directories tidied."""
        self._pending = None
        try:
            self._guard(STATE_FILE, None)
            if restored:
                self._guard(SAVED_FILE, None)
        finally:
            if self._port is not None:
                self._port.release_lock()
            if self._dir is not None:
                _OWNED.discard(self._dir.path)
                self._dir.tidy()
            self._dir = None


@dataclass(frozen=True)
class Published:
    """What :func:`read_published` found under a root (None: the file is absent)."""

    state: Mapping[str, Any] | None = None
    saved: Mapping[str, Any] | None = None
    errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """File path -> why it could not be read (garbage, permission)."""

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


def read_published(fs: SysfsRoot) -> Published:
    """Both files under ``fs`` (through :class:`SysfsRoot`: nothing outside the root is opened)."""
    docs: dict[str, Mapping[str, Any] | None] = {}
    errors: dict[str, str] = {}
    for name in (STATE_FILE, SAVED_FILE):
        rel = f"{RUN_DIR}/{name}"
        try:
            raw = fs.read_bytes(rel)
            doc = None if raw is None else json.loads(raw)
            if doc is not None and not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except (HetschedError, ValueError) as exc:
            errors[rel] = str(exc)
            doc = None
        docs[name] = doc
    return Published(docs[STATE_FILE], docs[SAVED_FILE], MappingProxyType(errors))
