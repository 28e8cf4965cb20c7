"""The governor lock: exactly one hetsched governor owns a root's clocks (issue 13).

``<root>/run/hetsched/governor.lock`` is held with ``flock(LOCK_EX | LOCK_NB)`` from before a
governor saves the knobs until after it restored them. ``flock`` rather than POSIX record
locks: those belong to the process, so a second governor in the same process would "get"
the lock again; ``flock`` locks belong to the open file, so two opens in one process
conflict too. The kernel drops it when the holder dies (SIGKILL leaves no stale lock), which
is also how a saved-clocks file is told to be a dead governor's even when its pid was reused.

The file is opened through :class:`~hetsched._governor._state_walk.RunDir`: every component of
``run/hetsched`` and the file itself without following links, nothing outside the root. The
lock belongs to the state directory: :class:`~hetsched._governor._state_dir.StateDir` takes,
holds and drops it (and probes it for ``doctor`` and ``top``).
It holds the holder's pid (for the busy message only: the lock, not the pid, says who owns).

Removing the file (the directory tidy at close, so that a closed governor leaves the tree
as it was) races with a governor that opened it just before: that one would lock an
unlinked inode while a third creates and locks a new file, two owners. So the holder
unlinks only while it still holds the lock and only the inode it locked, and every
acquirer, once it has the lock, checks that the name still leads to the inode it locked
(and starts over when not): a lock on an unlinked file is never taken for the root's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass

from .._errors import GovernorBusyError, PathOutsideRootError, SysfsError, SysfsPermissionError
from .._platform._fs import SysfsRoot
from ._state_walk import LOCK_FILE, RUN_DIR, RunDir

__all__ = ["LOCK_FILE", "LockState", "RootLock", "probe"]

# O_NONBLOCK: a FIFO planted at the name must not hang the open (it is refused after fstat).
_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_PEEK = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_ATTEMPTS = 8
# A prober (``probe``) holds a shared lock for an instant; an acquirer meeting it tries again
# a few times before it calls the root busy.
_BUSY_RETRIES = 3


def _rel() -> str:
    return f"{RUN_DIR}/{LOCK_FILE}"


def _error(fs: SysfsRoot, exc: OSError) -> SysfsError:
    """The platform error for a failed open of the lock file or its directory."""
    where = f"{fs.root}/{_rel()}"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            fs.resolve(_rel())
        except PathOutsideRootError as outside:
            return outside
        except (SysfsError, OSError):
            pass
        return SysfsError(exc.errno, f"{where}: a link on the way; the governor lock is never followed")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return SysfsPermissionError(exc.errno, f"cannot take the governor lock {where}: {exc.strerror}")
    return SysfsError(exc.errno or errno.EIO, f"cannot take the governor lock {where}: {exc.strerror or exc}")


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0)
    except OSError:
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _same(a: os.stat_result, b: os.stat_result | None) -> bool:
    return b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _stat(name: str, dfd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class RootLock:
    """A held governor lock (see the module docstring); :meth:`acquire` makes one."""

    def __init__(self, fs: SysfsRoot, d: RunDir, fd: int) -> None:
        self.fs = fs
        self._dir = d
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    @classmethod
    def acquire(cls, fs: SysfsRoot, d: RunDir | None = None) -> RootLock:
        """Take the lock of ``fs`` (creating ``run/hetsched`` and the file as needed) and write this pid.

        ``d``: the state directory's walk (its :meth:`~RunDir.tidy` then removes what the lock made);
        a fresh one by default.

        :raises GovernorBusyError: another governor (this process or another) holds it; nothing
            was changed but, at most, an empty lock directory made and removed again.
        :raises PathOutsideRootError: ``run``, ``run/hetsched`` or the lock file is a link that
            leads outside the root (nothing is followed or written there).
        :raises SysfsPermissionError: the lock may not be created (not root, read-only tree).
        :raises SysfsError: a link or something not a regular file at the name, or another OS error.
        """
        if d is None:
            d = RunDir(fs)
        for _ in range(_ATTEMPTS):
            try:
                dfd = d.open(create=True)
            except FileNotFoundError:
                continue  # a closing governor removed an empty directory just then
            except OSError as exc:
                d.tidy()
                raise _error(fs, exc) from exc
            assert dfd is not None
            try:
                lock = cls._try(fs, d, dfd)
            except BaseException:
                d.tidy()
                raise
            finally:
                os.close(dfd)
            if lock is not None:
                return lock
        d.tidy()
        raise SysfsError(errno.EAGAIN, f"cannot take the governor lock {fs.root}/{_rel()}: it keeps being replaced")

    @classmethod
    def _try(cls, fs: SysfsRoot, d: RunDir, dfd: int) -> RootLock | None:
        """One attempt in the open directory ``dfd``: the lock, or None to start over."""
        try:
            fd = os.open(LOCK_FILE, _OPEN, 0o644, dir_fd=dfd)
        except FileNotFoundError:
            return None  # the directory was removed under us
        except OSError as exc:
            raise _error(fs, exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SysfsError(errno.EINVAL, f"{fs.root}/{_rel()} is not a regular file; refused as the governor lock")
            for attempt in range(_BUSY_RETRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if attempt == _BUSY_RETRIES - 1:
                        pid = _read_pid(fd)
                        who = f"pid {pid}" if pid is not None else "a pid not written yet"
                        raise GovernorBusyError(
                            f"another hetsched governor ({who}) owns the clocks under {fs.root} "
                            f"(it holds {fs.root}/{_rel()}); one governor per root",
                            root=str(fs.root), pid=pid) from None
                    time.sleep(0.001)
            if not _same(st, _stat(LOCK_FILE, dfd)):
                os.close(fd)  # a lock on a file its holder unlinked meanwhile: not the root's
                return None
            data = f"{os.getpid()}\n".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        return cls(fs, d, fd)

    def release(self) -> None:
        """Remove the file (only the inode this holds, while holding it), drop the lock, and
        remove the directories :meth:`acquire` made if they are empty. Idempotent; never raises."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            dfd = self._dir.open(create=False)
            if dfd is not None:
                try:
                    if _same(os.fstat(fd), _stat(LOCK_FILE, dfd)):
                        os.unlink(LOCK_FILE, dir_fd=dfd)
                finally:
                    os.close(dfd)
        except OSError:
            pass  # the file stays: harmless, nobody holds it
        finally:
            os.close(fd)
        self._dir.tidy()

    def __del__(self) -> None:
        # A governor dropped without close: the kernel would drop the lock at exit anyway.
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self.release()


@dataclass(frozen=True)
class LockState:
    """What :func:`probe` found: ``held`` None when there is no lock file (none, or an older version)."""

    held: bool | None
    pid: int | None = None


def probe(fs: SysfsRoot, d: RunDir | None = None) -> LockState:
    """Whether some governor (this process included) holds the lock of ``fs`` now; creates nothing.

    A link or something not a regular file at the name reads as held (it cannot be trusted
    to be free). Never raises.
    """
    try:
        if d is None:
            d = RunDir(fs)
        dfd = d.open(create=False)
    except (OSError, SysfsError):
        return LockState(None)
    if dfd is None:
        return LockState(None)
    try:
        try:
            fd = os.open(LOCK_FILE, _PEEK, dir_fd=dfd)
        except FileNotFoundError:
            return LockState(None)
        except OSError:
            return LockState(True)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return LockState(True)
        pid = _read_pid(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return LockState(True, pid)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return LockState(False, pid)
    except OSError:
        return LockState(True)
    finally:
        os.close(fd)
