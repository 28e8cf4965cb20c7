"""The contained walk to the governor's state directory, ``<root>/run/hetsched`` (no links, nothing outside).

The bottom of :class:`~hetsched._governor._state_dir.StateDir` (which owns the directory; the
lock, :mod:`hetsched._governor._lock`, walks through this too). :class:`RunDir` reaches the
directory from the root one component at a time, each opened with ``O_NOFOLLOW`` relative to
its parent's descriptor, so a link anywhere on the way (``run`` pointing at the host's ``/run``
in a copied tree, a link swapped into ``run/`` after the governor started) is refused
(``ELOOP``/``ENOTDIR``), never followed out of the root. Files in it are written atomically
(temporary file + ``rename`` in the directory), and read only when they are regular files
(a FIFO planted at the name neither blocks nor is read: ``O_NONBLOCK``, then ``fstat``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Mapping
from typing import Any

from .._errors import SysfsError
from .._platform._fs import SysfsRoot
from .._platform.files import file_kind

__all__ = ["LOCK_FILE", "MAX_STATE_BYTES", "RUN_DIR", "SAVED_FILE", "STATE_FILE", "RunDir"]

RUN_DIR = "run/hetsched"
"""Root-relative directory of the governor's files (``/run/hetsched`` on a board: a tmpfs the kernel empties at boot)."""
SAVED_FILE = "governor-saved.json"
"""The knobs a governor saved before its first write (kept when they could not be put back)."""
STATE_FILE = "governor-state.json"
"""What a running governor does now (``hetsched top``, ``hetsched doctor``)."""
LOCK_FILE = "governor.lock"
"""The root's governor lock (:mod:`hetsched._governor._lock`)."""
MAX_STATE_BYTES = 1 << 20
"""A state file larger than this is no governor's: refused unread."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class RunDir:
    """``<root>/run/hetsched``, made at the first write (see the module docstring).

    :raises PathOutsideRootError: ``run`` or ``run/hetsched`` leads outside the root now.
    """

    def __init__(self, fs: SysfsRoot) -> None:
        self.path = fs.resolve(RUN_DIR).path
        self._root = str(fs.root)
        self._parts = RUN_DIR.split("/")
        self._made: list[int] = []  # which components of _parts this one created

    def open(self, *, create: bool) -> int | None:
        """A descriptor of the directory (the caller closes it); None if missing and not ``create``.

        :raises OSError: a link or something not a directory on the way (``ELOOP``/``ENOTDIR``),
            or the directory cannot be made.
        """
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

    def read(self, name: str) -> bytes | None:
        """The bytes of the regular file ``name`` in the directory, None when it (or the directory) is
        absent or a link is on the way to the directory (not followed: no governor writes there).

        :raises SysfsError: ``name`` is a link, a FIFO, a device, a directory or larger than
            :data:`MAX_STATE_BYTES` (nothing is read from it).
        :raises OSError: another failure (permission).
        """
        where = f"{self._root}/{RUN_DIR}/{name}"
        try:
            dfd = self.open(create=False)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return None  # a link (or a file) on the way: never followed, and no governor writes there
            raise
        if dfd is None:
            return None
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SysfsError(exc.errno, f"{where} is a link: not followed, nothing read") from exc
            raise
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SysfsError(errno.EINVAL, f"{where} is {file_kind(st.st_mode)}, not a regular file: nothing read")
            if st.st_size > MAX_STATE_BYTES:
                raise SysfsError(errno.EFBIG, f"{where} holds {st.st_size} bytes, more than a governor writes: not read")
            chunks: list[bytes] = []
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write(self, name: str, payload: Mapping[str, Any]) -> None:
        """Write ``payload`` as JSON to ``name`` atomically, making the directory as needed.

        :raises OSError: a link on the way, no permission, a full disk.
        """
        data = (json.dumps(payload, sort_keys=True) + "\n").encode()
        fd = self.open(create=True)
        assert fd is not None
        try:
            tmp = f".{name}.{os.getpid()}.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
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
        """Remove ``name`` (absent: nothing). :raises OSError: a link on the way, no permission."""
        fd = self.open(create=False)
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
        with contextlib.suppress(OSError):
            self._rmdir(len(self._parts))

    def tidy(self) -> None:
        """Remove the directories this one made, if they are empty again (a tree as it was)."""
        for depth in sorted(set(self._made), reverse=True):
            try:
                self._rmdir(depth)
            except OSError:
                break
        self._made.clear()
