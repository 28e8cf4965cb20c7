"""The live twin's load channel: simulated stages tell the twin how long they kept a domain busy.

A simulated stage runs on the host and computes a *modelled* board time; the board it imitates
would have been busy for that long. The twin may run in the session's process or in another
one (``hetsched twin --root DIR``), so the channel goes through the twin root: a hidden
directory of the twin's own, ``<root>/.hetsched-twin/load/``, that only a running
:class:`~hetsched._twin.live.LiveTwin` creates (and removes when it stops). A real board root
never has it, so :meth:`LoadReporter.for_root` gives None there and nothing is ever written.

Writer (:class:`LoadReporter`, one per process or session): one file per writer,
``<pid>-<token>-<seq>.load``, created with ``O_EXCL | O_NOFOLLOW`` and opened once with
``O_APPEND``. Each :meth:`LoadReporter.report` is one small append, ``"<domain> <busy_s>\\n"``
(a ``write()`` under a lock): nothing is buffered in memory, so a writer that stops reporting
or dies loses nothing it reported and there is no flush interval to tune. The cost is a
lock, a float format and one ``write()`` into the page cache, no ``fsync`` (the twin reads the
page cache), small against a stage run. A file is rotated at :data:`ROTATE_BYTES`: the writer
appends an end marker (``.end``) and goes on in the next ``seq``, so files stay small and
the twin can delete what it has read.

Reader (:class:`LoadChannel`, the twin's, once per period): lists the channel, reads each
file from the offset it reached last time up to the last complete line, and sums the busy
seconds per domain. A partial last line (a writer mid-write) is left for the next read; a
file whose writer ended it (``.end``) or died (its pid is gone) is deleted once read, and a
partial tail it left is ignored (:attr:`LoadChannelStatistics.partial_lines`). Malformed lines
are skipped and counted. Nothing is followed: every open is relative to a directory
descriptor with ``O_NOFOLLOW``, so a symlink in place of the channel or of one of its files is
refused: :meth:`LoadChannel.create` and :meth:`LoadReporter.for_root` raise
:class:`~hetsched.TwinError` naming it; a file that is a link or not a regular file is ignored
and counted (:attr:`LoadChannelStatistics.refused`).

Pids are those of the reader's pid namespace: a twin and a session in different containers
sharing one root see each other's writers as dead (their files are then deleted as read).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import secrets
import stat
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType

from .._compat import Self
from .._errors import TwinError

__all__ = [
    "CHANNEL_DIR",
    "ROTATE_BYTES",
    "LoadChannel",
    "LoadChannelStatistics",
    "LoadReporter",
    "LoadReporterStatistics",
]

CHANNEL_DIR = (".hetsched-twin", "load")
"""The channel's path below a twin root, one component at a time."""

ROTATE_BYTES = 1 << 20
"""A writer starts its next file once the current one reaches this size."""

_END = b".end"
_NAME = re.compile(r"^([1-9][0-9]{0,9})-([0-9a-f]{8,32})-([0-9]{1,9})\.load$")
_DOMAIN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_READ = 4 * ROTATE_BYTES  # per file and read: a foreign huge file cannot stall a period


def _open_dir(name: str, dir_fd: int, where: Path, *, create: bool) -> int | None:
    """Open ``name`` under ``dir_fd`` as a directory without following a link; None if missing.

    Raises:
        TwinError: ``name`` is a symlink or not a directory.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=dir_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise TwinError(f"refusing the twin load channel {where / name}: a symlink or not a directory") from exc
        raise TwinError(f"cannot open the twin load channel {where / name}: {exc.strerror}") from exc


def _open_channel(root: str | os.PathLike[str], *, create: bool) -> int | None:
    """A descriptor of ``<root>/.hetsched-twin/load`` (None if absent and not ``create``).

    Raises:
        TwinError: a component of the channel is a symlink or not a directory, or cannot be opened.
    """
    base = Path(root)
    try:
        fd: int | None = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        if create:
            raise TwinError(f"twin root {base} is not a directory") from None
        return None
    where = base
    try:
        for part in CHANNEL_DIR:
            assert fd is not None
            nxt = _open_dir(part, fd, where, create=create)
            os.close(fd)
            fd = nxt
            if fd is None:
                return None
            where = where / part
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------------------------------- writer


@dataclass(frozen=True)
class LoadReporterStatistics:
    reports: int
    """Reports written (zero-length ones are not written and not counted)."""
    busy_s: float
    """Board seconds reported, all domains."""
    files: int
    """Files this writer has created (rotation starts a new one)."""
    dropped: int
    """Reports lost: the writer was closed, or a write failed (the channel went away)."""


def _close_fd(box: list[int]) -> None:
    if box[0] >= 0:
        os.close(box[0])
        box[0] = -1


class LoadReporter:
    """Appends a session's modelled busy time to a live twin's load channel. See the module docstring.

    Make one with :meth:`for_root`. Thread-safe: device worker threads call :meth:`report`.
    Usable as a context manager (closes on exit).
    """

    def __init__(self, dir_fd: int, where: Path, *, rotate_bytes: int = ROTATE_BYTES) -> None:
        if not (isinstance(rotate_bytes, int) and rotate_bytes > 0):
            os.close(dir_fd)
            raise TwinError(f"rotate_bytes = {rotate_bytes!r}: must be a positive int")
        self._dir: list[int] = [dir_fd]
        self._fd: list[int] = [-1]
        self._where = where
        self._rotate_bytes = int(rotate_bytes)
        self._lock = threading.Lock()
        self._prefix: dict[str, bytes] = {}
        self._token = secrets.token_hex(8)
        self._seq = 0
        self._size = 0
        self._reports = 0
        self._busy = 0.0
        self._files = 0
        self._dropped = 0
        try:
            self._fd[0] = self._new_file()
        except BaseException:
            _close_fd(self._dir)
            raise
        # A reporter dropped without close() still releases its descriptors.
        weakref.finalize(self, _close_fd, self._fd)
        weakref.finalize(self, _close_fd, self._dir)

    @classmethod
    def for_root(cls, root: str | os.PathLike[str], *, rotate_bytes: int = ROTATE_BYTES) -> LoadReporter | None:
        """The reporter of the live twin under ``root``; None when ``root`` is not a live twin's.

        ``rotate_bytes``: file size at which the writer starts its next file.

        Raises:
            TwinError: the channel under ``root`` is a symlink or not a directory (refused, not
                followed), or its file cannot be created there.
        """
        fd = _open_channel(root, create=False)
        if fd is None:
            return None
        return cls(fd, Path(root).joinpath(*CHANNEL_DIR), rotate_bytes=rotate_bytes)  # owns fd, closes it if it fails

    def _new_file(self) -> int:
        name = f"{os.getpid()}-{self._token}-{self._seq}.load"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o644, dir_fd=self._dir[0])
        except OSError as exc:
            raise TwinError(f"cannot create {self._where / name}: {exc.strerror}") from exc
        self._files += 1
        self._size = 0
        return fd

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a short write (disk full) must not leave half a line behind a live writer
            n = os.write(self._fd[0], view)
            view = view[n:]
        self._size += len(data)

    def report(self, domain: str, busy_s: float) -> None:
        """``domain`` was busy for ``busy_s`` board (modelled) seconds.

        Never raises on I/O: a failed write (a full disk; no next file to rotate into because
        the twin stopped and removed its channel) is counted in
        :attr:`LoadReporterStatistics.dropped`, as are reports after :meth:`close`. Reports
        made after the twin stopped go into the file it deleted and are seen by no one.

        Raises:
            TwinError: ``busy_s`` is not a finite number >= 0, or ``domain`` is not a short
                name of letters, digits and ``_.:-``.
        """
        prefix = self._prefix.get(domain)
        if prefix is None:
            if not (isinstance(domain, str) and _DOMAIN.match(domain)):
                raise TwinError(f"report domain {domain!r}: not a domain name")
            prefix = self._prefix.setdefault(domain, domain.encode() + b" ")
        if not (isinstance(busy_s, (int, float)) and 0.0 <= busy_s < math.inf):
            raise TwinError(f"report({domain!r}, {busy_s!r}): busy seconds must be finite and >= 0")
        if busy_s == 0.0:
            return
        data = prefix + repr(float(busy_s)).encode() + b"\n"
        with self._lock:
            if self._fd[0] < 0:
                self._dropped += 1
                return
            try:
                self._write(data)
                if self._size >= self._rotate_bytes:
                    self._rotate()
            except (OSError, TwinError):
                self._dropped += 1
                return
            self._reports += 1
            self._busy += busy_s

    def _rotate(self) -> None:
        self._write(_END + b"\n")
        _close_fd(self._fd)
        self._seq += 1
        self._fd[0] = self._new_file()

    def flush(self) -> None:
        """Wait for a report in progress on another thread; then every report is visible to the twin.

        Each report is written through (nothing is buffered), so this only orders threads; it
        is kept so that callers need not know the writer's strategy.
        """
        with self._lock:
            pass

    def close(self) -> None:
        """End the file (the twin deletes it once read) and release it; idempotent."""
        with self._lock:
            if self._fd[0] >= 0:
                with contextlib.suppress(OSError):
                    self._write(_END + b"\n")
            _close_fd(self._fd)
            _close_fd(self._dir)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def statistics(self) -> LoadReporterStatistics:
        with self._lock:
            return LoadReporterStatistics(self._reports, self._busy, self._files, self._dropped)


# ---------------------------------------------------------------------------------------- reader


@dataclass(frozen=True)
class LoadChannelStatistics:
    reads: int
    lines: int
    """Busy reports counted."""
    busy_s: Mapping[str, float]
    """Board seconds reported per domain since the channel was created (start-up drain excluded)."""
    writers: int
    """Writer files open now."""
    files_removed: int
    """Files deleted after their writer ended or died."""
    malformed: int
    """Lines skipped: not ``<domain> <seconds>``, or a negative or non-finite figure."""
    partial_lines: int
    """Partial last lines left by a writer that died mid-write (ignored)."""
    refused: int
    """Entries ignored: a symlink, not a regular file, or a name that is not a writer's."""


@dataclass
class _FileState:
    ino: int
    offset: int = 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


class LoadChannel:
    """The twin's end of the load channel under ``root``. See the module docstring.

    Make one with :meth:`create`; :meth:`read` once per period; :meth:`remove` when the twin stops.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root.joinpath(*CHANNEL_DIR)
        self._files: dict[str, _FileState] = {}
        self._refused: set[str] = set()
        self._busy: dict[str, float] = {}
        self._reads = 0
        self._lines = 0
        self._removed = 0
        self._malformed = 0
        self._partial = 0

    @classmethod
    def create(cls, root: str | os.PathLike[str]) -> LoadChannel:
        """Create (or reuse) the channel under ``root`` and skip what is already in it.

        Data written before the twin started (a previous twin's channel left behind) is read
        and discarded, so the first period does not count it.

        Raises:
            TwinError: ``root`` is not a directory, or a component of the channel is a symlink
                or not a directory.
        """
        ch = cls(Path(root))
        fd = _open_channel(root, create=True)
        assert fd is not None
        os.close(fd)
        ch.read()
        ch._busy.clear()
        ch._lines = 0
        ch._reads = 0
        return ch

    def read(self) -> dict[str, float]:
        """Busy board seconds per domain reported since the last read, from every writer.

        A channel that turned into a symlink (or went away) reads as empty; the twin goes on.
        """
        self._reads += 1
        out: dict[str, float] = {}
        try:
            fd = _open_channel(self.root, create=False)
        except TwinError:
            self._refused.add("")
            return out
        if fd is None:
            self._files.clear()
            return out
        try:
            names = os.listdir(fd)
            for name in names:
                self._read_file(fd, name, out)
            for gone in set(self._files) - set(names):
                del self._files[gone]
        finally:
            os.close(fd)
        for d, s in out.items():
            self._busy[d] = self._busy.get(d, 0.0) + s
        return out

    def _read_file(self, dir_fd: int, name: str, out: dict[str, float]) -> None:
        m = _NAME.match(name)
        if m is None:
            self._refused.add(name)
            return
        # Liveness before reading: a writer found dead has written all it ever will.
        dead = not _alive(int(m.group(1)))
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError:
            self._refused.add(name)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._refused.add(name)
                return
            state = self._files.get(name)
            if state is None or state.ino != st.st_ino:
                state = self._files[name] = _FileState(st.st_ino)
            remaining = max(0, st.st_size - state.offset)
            want = min(remaining, _MAX_READ)
            data = os.pread(fd, want, state.offset) if want > 0 else b""
        finally:
            os.close(fd)
        cut = data.rfind(b"\n") + 1
        if cut == 0 and want == _MAX_READ:  # no line end in a whole block: not a writer's data
            self._malformed += 1
            cut = want
        state.offset += cut
        ended = self._parse(data[:cut], out)
        if ended or (dead and len(data) == remaining):
            if not ended and cut < len(data):
                self._partial += 1
            try:
                os.unlink(name, dir_fd=dir_fd)
                self._removed += 1
            except OSError:
                pass
            self._files.pop(name, None)

    def _parse(self, block: bytes, out: dict[str, float]) -> bool:
        """Add ``block``'s complete lines to ``out``; True once the end marker is seen."""
        for line in block.splitlines():
            if line == _END:
                return True
            parts = line.split(b" ")
            if len(parts) != 2:
                self._malformed += 1
                continue
            try:
                domain = parts[0].decode("ascii")
                busy = float(parts[1])
            except ValueError:
                self._malformed += 1
                continue
            if not (_DOMAIN.match(domain) and 0.0 <= busy < math.inf):
                self._malformed += 1
                continue
            out[domain] = out.get(domain, 0.0) + busy
            self._lines += 1
        return False

    def remove(self) -> None:
        """Delete the channel (the twin stops): writers then find no twin; never raises."""
        base = Path(self.root)
        try:
            rfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            tfd = os.open(CHANNEL_DIR[0], _DIR_FLAGS, dir_fd=rfd)
        except OSError:
            os.close(rfd)
            return
        try:
            try:
                lfd = os.open(CHANNEL_DIR[1], _DIR_FLAGS, dir_fd=tfd)
            except OSError:
                lfd = -1
            if lfd >= 0:
                try:
                    for name in os.listdir(lfd):
                        with contextlib.suppress(OSError):
                            os.unlink(name, dir_fd=lfd)  # unlink never follows a link
                finally:
                    os.close(lfd)
                with contextlib.suppress(OSError):  # a writer raced a new file in; it is the next twin's to drain
                    os.rmdir(CHANNEL_DIR[1], dir_fd=tfd)
        finally:
            os.close(tfd)
        try:
            os.rmdir(CHANNEL_DIR[0], dir_fd=rfd)
        except OSError:
            pass
        finally:
            os.close(rfd)
        self._files.clear()

    def statistics(self) -> LoadChannelStatistics:
        return LoadChannelStatistics(
            reads=self._reads,
            lines=self._lines,
            busy_s=MappingProxyType(dict(self._busy)),
            writers=len(self._files),
            files_removed=self._removed,
            malformed=self._malformed,
            partial_lines=self._partial,
            refused=len(self._refused),
        )
