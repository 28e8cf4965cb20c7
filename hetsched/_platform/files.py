"""Files hetsched owns or reads outside any board tree: compile caches (written whole or not at
all, kept under content keys, verified on every read, never through a link) and the files a user
names (a model, a trace, calibration data: read bounded, only when they are regular files).

Cache integrity (:class:`ContentCache`): the cache directory the caller names is opened once per
operation (a link there is the caller's choice and is followed); everything below it is reached
relative to that descriptor with ``O_NOFOLLOW``, so a link planted in place of an entry's
``<kk>`` folder or of one of its files is never followed, read or written through. A file is
read only when it is a regular file and its bytes hash to the sha256 the entry recorded; a
link, a non-regular file or a mismatch is a *rejected* entry: it is logged as a warning, counted
(:attr:`CacheStatistics.rejected`), removed (the link itself, never its target) and read as a
miss, so the caller converts again and the fresh result replaces it. Writes go to a fresh
``O_EXCL`` name in the entry's folder and are renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import NotRegularFileError

__all__ = ["CacheStatistics", "ContentCache", "RejectedEntry", "atomic_write", "contained_sha256", "file_kind", "open_contained_dir", "read_regular_file", "write_at"]

log = logging.getLogger("hetsched.cache")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_SUBDIR = _DIR | os.O_NOFOLLOW
_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_ENTRY_READ = _OPEN | os.O_NOFOLLOW
_ENTRY_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` is, in words ("a FIFO", "a directory", ...)."""
    for test, what in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a regular file"


def _read_fd(fd: int, size: int) -> bytes:
    """At most ``size`` bytes from ``fd`` (a file that grows meanwhile is read to ``size``)."""
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_regular_file(path: str | os.PathLike[str], *, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, read bounded by its size.

    The file is opened with ``O_NONBLOCK`` (a FIFO cannot block the open), ``fstat``-ed, and
    refused unless it is a regular file (a link to one is fine: the user named it); at most
    ``st_size`` bytes are read, so neither ``/dev/zero`` nor a file growing meanwhile is read
    without end. ``what`` names the file in messages ("model file", "trace file").

    :raises NotRegularFileError: ``path`` is a FIFO, device, socket or directory (or links to one).
    :raises OSError: it cannot be opened or read (``FileNotFoundError`` when it does not exist);
        callers translate it into their own error.
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, _OPEN)
    except IsADirectoryError as exc:
        raise NotRegularFileError(f"{what} {name!r} is a directory, not a regular file", path=name,
                                  kind="a directory") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            raise NotRegularFileError(f"{what} {name!r} is {kind}, not a regular file: nothing was read from it",
                                      path=name, kind=kind)
        return _read_fd(fd, st.st_size)
    finally:
        os.close(fd)


def contained_sha256(directory: str | os.PathLike[str], rel: str) -> str:
    """The sha256 of the regular file ``rel`` below ``directory``, reached one component at a
    time with ``O_NOFOLLOW`` (``directory`` itself may be a link: the caller named it).

    :raises RejectedEntry: ``rel`` is absolute or has ``..``, or a component is a link, or the
        file is not a regular file (nothing is read from it).
    :raises OSError: a component is missing (``FileNotFoundError``) or unreadable.
    """
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or any(p in ("..", ".") for p in parts):
        raise RejectedEntry(f"{rel!r} is not a plain relative path")
    fd = os.open(directory, _DIR)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _SUBDIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise RejectedEntry(f"{part!r} in {rel!r} is a link or not a folder") from exc
                raise
            os.close(fd)
            fd = nxt
        try:
            ffd = os.open(parts[-1], _ENTRY_READ, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RejectedEntry(f"{rel!r} is a symbolic link") from exc
            raise
        try:
            st = os.fstat(ffd)
            if not stat.S_ISREG(st.st_mode):
                raise RejectedEntry(f"{rel!r} is {file_kind(st.st_mode)}, not a regular file")
            h = hashlib.sha256()
            while chunk := os.read(ffd, _CHUNK):
                h.update(chunk)
            return h.hexdigest()
        finally:
            os.close(ffd)
    finally:
        os.close(fd)


def open_contained_dir(root: str | os.PathLike[str], parts: Sequence[str]) -> int:
    """A descriptor of the folder ``root/parts[0]/parts[1]/...``, each component opened relative to
    the one above with ``O_NOFOLLOW`` and created when missing; a link or a file standing where a
    component should be is removed (the link itself, never its target), logged as a warning and
    replaced by a folder. ``root`` (the cache directory the caller named) is created if missing
    and may itself be a link. The caller closes the descriptor.

    :raises ValueError: a component is empty, ``.`` or ``..`` or holds a ``/``.
    :raises OSError: a folder cannot be created or opened.
    """
    if any(not p or p in (".", "..") or os.sep in p for p in parts):
        raise ValueError(f"not plain folder names: {list(parts)!r}")
    Path(root).mkdir(parents=True, exist_ok=True)
    fd = os.open(root, _DIR)
    try:
        for part in parts:
            for _ in range(2):
                try:
                    nxt = os.open(part, _SUBDIR, dir_fd=fd)
                    break
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    log.warning("cache folder %s: %r is a link or a file, not a folder; it is never followed "
                                "and is replaced by a folder", root, part)
                    os.unlink(part, dir_fd=fd)
            else:
                nxt = os.open(part, _SUBDIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_at(dfd: int, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` in the folder ``dfd``: a fresh ``O_EXCL`` temporary name renamed
    over it, so a reader sees the old file or the new one and a link at ``name`` is replaced,
    never followed.

    :raises OSError: it cannot be written (the temporary file is removed).
    """
    _write_at(dfd, name, data)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and
    ``os.replace``: a reader (another process sharing the cache) sees the old file or the new
    one, never a part. The directory is created if missing.

    :raises OSError: the directory cannot be created or the file written (the temporary file
        is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_at(os.open(path.parent, _DIR), path.name, data, close=True)


def _write_at(dfd: int, name: str, data: bytes, *, close: bool = False) -> None:
    """Write ``data`` to a fresh ``O_EXCL`` name in the directory ``dfd`` and rename it over
    ``name`` (a link at ``name`` is replaced, never followed); closes ``dfd`` when ``close``."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, _ENTRY_WRITE, 0o644, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        if close:
            os.close(dfd)


@dataclass(frozen=True)
class CacheStatistics:
    """Counters of a :class:`ContentCache` (a compile cache)."""

    conversions: int
    """Conversions or builds run (cache misses), refusals included."""
    cache_hits: int
    """Lookups the cache answered (a stored success or refusal)."""
    refusals_cached: int
    """Of ``cache_hits``, those that answered with a stored refusal (nothing tried)."""
    seconds: float
    """Seconds spent converting or building."""
    rejected: int = 0
    """Entries not used: a file whose bytes do not hash to what its entry recorded, or a link
    (or another non-regular file) where an entry's file or folder should be. Each was removed
    and read as a miss (converted again)."""


class RejectedEntry(Exception):
    """Raised inside :class:`ContentCache` for an entry that is not to be trusted (the message says
    why); :meth:`ContentCache.read_entry` turns it into a warning and a miss."""


class ContentCache:
    """Entries named by a content key (64 hex digits: a SHA-256) under one directory, two levels
    deep, with hit, conversion and rejection counters; see the module docstring for integrity.
    Thread-safe; processes may share the directory (entries are replaced whole). The compile
    caches of the vendor backends build on it:

    * :meth:`read_entry` ``(key, suffix, sha256)``: the verified bytes, or None (a miss; a bad
      entry is warned about, counted, removed);
    * :meth:`entry_sha256` ``(key, suffix)``: a file's sha256 without loading it whole (large
      engines), None when missing or rejected;
    * :meth:`write_entry` ``(key, suffix, data)``: write and return the sha256 to record;
    * :meth:`adopt_entry` ``(key, suffix, tmp)``: rename a file a tool wrote into
      :meth:`entry_temp_path` into place and return its sha256;
    * :meth:`entry_dir` ``(key)``: the entry's real folder (created, a link there replaced).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._conversions = 0
        self._hits = 0
        self._refusals = 0
        self._seconds = 0.0
        self._rejected = 0

    def _entry(self, key: str, suffix: str) -> Path:
        """The path of ``key``'s file with ``suffix``.

        :raises ValueError: ``key`` is not 64 lowercase hex digits (never a path of its own).
        """
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a cache key: {key!r}")
        return self.directory / key[:2] / f"{key}{suffix}"

    def _count_hit(self, refused: bool) -> None:
        with self._lock:
            self._hits += 1
            self._refusals += refused

    def _count_conversion(self, seconds: float) -> None:
        with self._lock:
            self._conversions += 1
            self._seconds += seconds

    def statistics(self) -> CacheStatistics:
        with self._lock:
            return CacheStatistics(self._conversions, self._hits, self._refusals, self._seconds, self._rejected)

    # -- contained, verified entries -----------------------------------------------------------

    def reject(self, path: Path, why: str) -> None:
        """Count and log a bad entry file and remove it (a link is removed, never its target)."""
        with self._lock:
            self._rejected += 1
        log.warning("compile cache: %s %s; the entry is discarded and converted again", path, why)
        with contextlib.suppress(OSError):
            dfd = os.open(path.parent, _SUBDIR)
            try:
                os.unlink(path.name, dir_fd=dfd)
            finally:
                os.close(dfd)

    @contextlib.contextmanager
    def _subdir(self, key: str, *, create: bool) -> Iterator[int | None]:
        """A descriptor of ``key``'s ``<kk>`` folder, opened without following a link; None when it
        is missing (and not ``create``) or is a link or a file (rejected; with ``create``, that
        link or file is removed and a real folder made in its place).

        :raises OSError: the cache directory cannot be opened or (``create``) written.
        """
        path = self._entry(key, "").parent
        if create:
            self.directory.mkdir(parents=True, exist_ok=True)
        try:
            root = os.open(self.directory, _DIR)
        except FileNotFoundError:
            if create:
                raise
            yield None
            return
        try:
            dfd = self._open_subdir(root, path, create=create)
            if dfd is None:
                yield None
                return
            try:
                yield dfd
            finally:
                os.close(dfd)
        finally:
            os.close(root)

    def _open_subdir(self, root: int, path: Path, *, create: bool) -> int | None:
        name = path.name
        for _ in range(2):
            try:
                return os.open(name, _SUBDIR, dir_fd=root)
            except FileNotFoundError:
                if not create:
                    return None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=root)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                with self._lock:
                    self._rejected += 1
                log.warning("compile cache: %s is a link or a file, not a folder; it is never followed%s", path,
                            " and is replaced by a folder" if create else "")
                if not create:
                    return None
                os.unlink(name, dir_fd=root)  # the link itself
        return os.open(name, _SUBDIR, dir_fd=root)

    def _open_file(self, dfd: int, path: Path) -> int | None:
        """A read descriptor of the regular file ``path`` in ``dfd``; None when missing.

        :raises RejectedEntry: a link or a non-regular file stands there.
        """
        try:
            fd = os.open(path.name, _ENTRY_READ, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RejectedEntry("is a symbolic link") from exc
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise RejectedEntry(f"is {file_kind(st.st_mode)}, not a regular file")
        return fd

    def read_entry(self, key: str, suffix: str, sha256: str | None = None) -> bytes | None:
        """The bytes of ``key``'s ``suffix`` file when they hash to ``sha256`` (None: not checked,
        for the verdict file that holds the hashes), else None: missing, unreadable, or rejected
        (a link, a non-regular file, other bytes: warned, counted, removed).

        :raises ValueError: ``key`` is not a key.
        """
        path = self._entry(key, suffix)
        try:
            with self._subdir(key, create=False) as dfd:
                if dfd is None:
                    return None
                fd = self._open_file(dfd, path)
                if fd is None:
                    return None
                try:
                    data = _read_fd(fd, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
        except RejectedEntry as bad:
            self.reject(path, str(bad))
            return None
        except OSError:
            return None
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            self.reject(path, f"does not hash to the sha256 its entry recorded ({sha256[:12]}...)")
            return None
        return data

    def entry_sha256(self, key: str, suffix: str) -> str | None:
        """The sha256 of ``key``'s ``suffix`` file, read in chunks; None when missing, unreadable or
        a link / non-regular file (rejected, as in :meth:`read_entry`)."""
        path = self._entry(key, suffix)
        try:
            with self._subdir(key, create=False) as dfd:
                if dfd is None:
                    return None
                fd = self._open_file(dfd, path)
                if fd is None:
                    return None
                try:
                    h = hashlib.sha256()
                    while chunk := os.read(fd, _CHUNK):
                        h.update(chunk)
                finally:
                    os.close(fd)
        except RejectedEntry as bad:
            self.reject(path, str(bad))
            return None
        except OSError:
            return None
        return h.hexdigest()

    def verify_entry(self, key: str, suffix: str, sha256: str) -> bool:
        """True when ``key``'s ``suffix`` file is a regular file hashing to ``sha256``; a file that
        does not is rejected (warned, counted, removed)."""
        got = self.entry_sha256(key, suffix)
        if got is None:
            return False
        if got != sha256:
            self.reject(self._entry(key, suffix), f"does not hash to the sha256 its entry recorded ({sha256[:12]}...)")
            return False
        return True

    def write_entry(self, key: str, suffix: str, data: bytes) -> str:
        """Write ``data`` as ``key``'s ``suffix`` file (whole, never through a link) and return its
        sha256 (to record in the entry's verdict).

        :raises OSError: the cache cannot be written.
        """
        path = self._entry(key, suffix)
        with self._subdir(key, create=True) as dfd:
            assert dfd is not None
            _write_at(dfd, path.name, data)
        return hashlib.sha256(data).hexdigest()

    def entry_dir(self, key: str) -> Path:
        """``key``'s ``<kk>`` folder, made a real folder (a link or file there is replaced).

        :raises OSError: the cache cannot be written.
        """
        with self._subdir(key, create=True):
            pass
        return self._entry(key, "").parent

    def entry_temp_path(self, key: str, suffix: str) -> Path:
        """A fresh, empty file in ``key``'s folder for a tool to write to (then :meth:`adopt_entry`).

        :raises OSError: the cache cannot be written.
        """
        path = self._entry(key, suffix)
        with self._subdir(key, create=True) as dfd:
            assert dfd is not None
            tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
            os.close(os.open(tmp, _ENTRY_WRITE, 0o644, dir_fd=dfd))
        return path.parent / tmp

    def adopt_entry(self, key: str, suffix: str, tmp: Path) -> str:
        """Rename ``tmp`` (from :meth:`entry_temp_path`, filled by a tool) over ``key``'s ``suffix``
        file and return its sha256.

        :raises OSError: ``tmp`` is not a regular file in the entry's folder, or the rename failed.
        """
        path = self._entry(key, suffix)
        if tmp.parent != path.parent or not tmp.name.startswith(f".{path.name}."):
            raise OSError(errno.EINVAL, f"{tmp} is not a temporary file of {path}")
        with self._subdir(key, create=True) as dfd:
            assert dfd is not None
            try:
                fd = self._open_file(dfd, tmp)
            except RejectedEntry as bad:
                raise OSError(errno.EINVAL, f"{tmp} {bad}") from bad
            if fd is None:
                raise FileNotFoundError(errno.ENOENT, f"{tmp} is gone")
            try:
                h = hashlib.sha256()
                while chunk := os.read(fd, _CHUNK):
                    h.update(chunk)
            finally:
                os.close(fd)
            os.replace(tmp.name, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return h.hexdigest()

    def remove_entry(self, key: str, suffix: str) -> None:
        """Remove ``key``'s ``suffix`` file if there (a link is removed, never followed)."""
        path = self._entry(key, suffix)
        with contextlib.suppress(OSError), self._subdir(key, create=False) as dfd:
            if dfd is not None:
                os.unlink(path.name, dir_fd=dfd)
