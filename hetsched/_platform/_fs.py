"""The one place in hetsched that touches the board's files.

:class:`SysfsRoot` reads and writes below an injected root directory (``"/"`` on a
real board, a temp dir holding a twin or fixture tree in tests). Every path is
given relative to that root (``"sys/class/thermal/thermal_zone0/temp"``), is
resolved through ``..`` and symlinks exactly as the kernel would, and is refused
with :class:`~hetsched.PathOutsideRootError` *before anything is opened* when it
lands outside the root.

Error policy (the same for every subsystem module):

* missing file or directory (``ENOENT``, ``ENOTDIR``): an **absent capability**;
  reads return ``None``, ``listdir`` returns ``[]``;
* ``EAGAIN``, ``EIO``, ``ENODATA``, ``ETIMEDOUT``, ``ENXIO``, ``ENODEV``: a flaky,
  rail-gated or fused-off sensor (Orin ``cv*-thermal`` zones fail with
  ``EAGAIN``; INA3221 reads can fail with ``EIO`` on i2c noise). The read returns
  ``None`` for this sample and the event is counted in :meth:`SysfsRoot.statistics`;
* a value file that cannot hold a value -- a **directory** where the value should be, a
  **link leading out of the root** (refused as :class:`~hetsched.PathOutsideRootError`, nothing
  opened), a link swapped in after resolution (``ELOOP``), more than :data:`MAX_VALUE_BYTES` of
  content (a device node planted in a fake tree) -- is **unreadable**, exactly like a FIFO or
  garbage: the read returns ``None``, is counted, logged once per file and listed by
  :meth:`SysfsRoot.unreadable` (``doctor`` reports them, the error class named), so one odd
  file never stops ``run``, ``info``, ``top`` or ``doctor``;
* ``EACCES``/``EPERM``: :class:`~hetsched.SysfsPermissionError` naming the path;
* any other ``OSError``: :class:`~hetsched.SysfsError` naming the path.

Writes never take that leniency: writing through a link out of the root raises
:class:`~hetsched.PathOutsideRootError` before anything is opened, a directory raises
:class:`~hetsched.SysfsError`. A link out of the root is not there for
:meth:`SysfsRoot.exists`, :meth:`~SysfsRoot.is_dir` and :meth:`~SysfsRoot.listdir` (noted the same
way); :meth:`~SysfsRoot.resolve` and :meth:`~SysfsRoot.realpath` raise
:class:`~hetsched.PathOutsideRootError` (discovery uses :meth:`~SysfsRoot.contained` and skips it).

All of them are raised ``from`` the original ``OSError``. Reads open files with
``O_NONBLOCK`` so a misbehaving node (a FIFO in a fake tree, say) can never hang
the sampler.

Content that is there but is no value (binary bytes where a name belongs, a number
with 21 digits, ``nan``) is **garbage**: the parsers (:func:`parse_int`,
:func:`parse_name`) return ``None`` for it, so a reader treats the file as unreadable
for this sample, and :meth:`SysfsRoot.note_garbage` counts it and logs each file once.
A garbage value must never reach arithmetic that overflows or a ``decode`` that raises.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .._errors import PathOutsideRootError, SysfsError, SysfsPermissionError

__all__ = [
    "FLAKY_ERRNOS",
    "MAX_VALUE_BYTES",
    "ResolvedPath",
    "SysfsRoot",
    "SysfsStatistics",
    "parse_int",
    "parse_name",
]

log = logging.getLogger("hetsched.platform")

#: errno values that mean "this sensor has no value right now" rather than a bug.
FLAKY_ERRNOS: frozenset[int] = frozenset(
    {errno.EAGAIN, errno.EIO, errno.ENODATA, errno.ETIMEDOUT, errno.ENXIO, errno.ENODEV}
)
_ABSENT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR})
_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
# A directory where a value belongs; a link swapped in after resolution (O_NOFOLLOW).
_UNREADABLE_ERRNOS = frozenset({errno.EISDIR, errno.ELOOP})
#: The most bytes a value file may hold: sysfs attributes are one page, /proc/stat and
#: /proc/cpuinfo of a many-core host a few hundred KiB. More is no value (``/dev/zero``
#: planted in a fake tree) and the read stops there instead of growing without bound.
MAX_VALUE_BYTES = 4 * 1024 * 1024

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
# A resolved path has no symlink left in it; refusing one at open time means a
# link swapped in after resolution cannot redirect the read or write.
_RESOLVED_READ_FLAGS = _READ_FLAGS | os.O_NOFOLLOW
# O_TRUNC: harmless on sysfs (kernfs ignores it, as for `echo >`), needed on plain-file trees.
_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
_READ_CHUNK = 65536
# Sysfs integers are C longs (``%ld``/``%lu``): nothing a kernel prints has more digits
# than 2**64 (20), so a longer one is garbage, not a value.
_INT_RE = re.compile(rb"\s*[-+]?[0-9]{1,20}\s*")
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
# Governor and driver names are C identifiers in the kernel (``struct cpufreq_governor.name``,
# ``devfreq_governor.name``, at most 16 chars); dashes and dots appear in vendor ones.
_NAME_RE = re.compile(rb"\s*([A-Za-z0-9_][A-Za-z0-9_.+-]{0,63})\s*")


def parse_int(raw: bytes | str | None, *, lo: int | None = None, hi: int | None = None) -> int | None:
    """A sysfs integer (``b"44384\\n"``), or None: absent, empty, not plain ASCII digits,
    longer than a C long, or outside ``lo..hi`` (the range a value of that file can take)."""
    if raw is None:
        return None
    data = raw.encode("latin-1", "replace") if isinstance(raw, str) else raw
    if not _INT_RE.fullmatch(data):
        return None
    value = int(data)
    if not _INT_MIN <= value <= _INT_MAX:
        return None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return None
    return value


def parse_name(raw: bytes | str | None) -> str | None:
    """A name file (``scaling_governor``: ``b"schedutil\\n"``) as text, or None for absent or
    garbage (binary bytes, spaces inside, longer than any kernel name)."""
    if raw is None:
        return None
    data = raw.encode("latin-1", "replace") if isinstance(raw, str) else raw
    m = _NAME_RE.fullmatch(data)
    return None if m is None else m.group(1).decode("ascii")


@dataclass(frozen=True)
class ResolvedPath:
    """An absolute path already resolved and checked to lie inside its root.

    Made by :meth:`SysfsRoot.resolve`; hot loops (telemetry) keep these so each
    sample costs one ``open``/``read``/``close`` and no path resolution.
    """

    path: str
    rel: str

    def __str__(self) -> str:
        return self.path


@dataclass(frozen=True)
class SysfsStatistics:
    """Counters of one :class:`SysfsRoot`."""

    reads: int
    writes: int
    flaky_reads: int
    """Reads that failed with a flaky-sensor errno and returned ``None``."""
    garbage_reads: int = 0
    """Reads whose content was no value (see :meth:`SysfsRoot.note_garbage`)."""
    unreadable_reads: int = 0
    """Reads of a file that cannot hold a value: a directory, a link out of the root, an
    oversized node (see :meth:`SysfsRoot.unreadable`)."""


class SysfsRoot:
    """Reads and writes files below ``root`` and nowhere else.

    :param root: the directory that plays ``/`` (default the real root).
    :raises SysfsError: ``root`` does not exist or is not a directory.
    """

    __slots__ = ("_flaky", "_garbage", "_noted", "_prefix", "_reads", "_root", "_unreadable", "_unreadable_n",
                 "_writes")

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        real = os.path.realpath(os.fspath(root))
        if not os.path.isdir(real):
            raise SysfsError(errno.ENOTDIR, f"sysfs root {os.fspath(root)!r} is not a directory")
        self._root = real
        self._prefix = real if real.endswith(os.sep) else real + os.sep
        self._reads = 0
        self._writes = 0
        self._flaky = 0
        self._garbage = 0
        self._noted: set[str] = set()
        self._unreadable: dict[str, str] = {}
        self._unreadable_n = 0

    # -- paths ----------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The resolved root directory."""
        return Path(self._root)

    @property
    def is_host_root(self) -> bool:
        """True when the root is the real ``/`` (so libudev and /proc of this host apply)."""
        return self._root == os.sep

    def __repr__(self) -> str:
        return f"SysfsRoot({self._root!r})"

    def _join(self, rel: str | ResolvedPath) -> str:
        if isinstance(rel, ResolvedPath):
            return rel.path
        rel_s = os.fspath(rel).lstrip("/")
        return os.path.join(self._root, rel_s)

    def _check(self, resolved: str, rel: str | ResolvedPath) -> str:
        if resolved != self._root and not resolved.startswith(self._prefix):
            raise PathOutsideRootError(
                errno.EXDEV, f"refusing {str(rel)!r}: it resolves to {resolved!r}, outside the root {self._root!r}"
            )
        return resolved

    def resolve(self, rel: str | ResolvedPath) -> ResolvedPath:
        """Resolve ``rel`` (``..`` and symlinks) and check it stays under the root.

        The file need not exist. :raises PathOutsideRootError: it resolves outside the root.
        """
        if isinstance(rel, ResolvedPath):
            return rel
        resolved = self._check(os.path.realpath(self._join(rel)), rel)
        return ResolvedPath(resolved, self.relative(resolved))

    def relative(self, absolute: str) -> str:
        """``absolute`` (inside the root) as a root-relative path without leading slash."""
        if absolute == self._root:
            return ""
        return absolute[len(self._prefix) :] if absolute.startswith(self._prefix) else absolute

    def realpath(self, rel: str | ResolvedPath) -> str:
        """Root-relative resolved form of ``rel`` (like ``realpath`` inside a chroot).

        :raises PathOutsideRootError: it resolves outside the root.
        """
        return self.resolve(rel).rel

    # -- queries ----------------------------------------------------------------

    def exists(self, rel: str | ResolvedPath) -> bool:
        """True when ``rel`` exists inside the root; False for a link leading out of it (nothing
        there is looked at; noted as unreadable, see :meth:`unreadable`)."""
        path = self.contained(rel)
        return path is not None and os.path.exists(path.path)

    def is_dir(self, rel: str | ResolvedPath) -> bool:
        """True when ``rel`` is a directory inside the root; False for a link leading out of it
        (noted as unreadable)."""
        path = self.contained(rel)
        return path is not None and os.path.isdir(path.path)

    def contained(self, rel: str | ResolvedPath) -> ResolvedPath | None:
        """:meth:`resolve`, or None when ``rel`` leads out of the root: discovery and telemetry
        skip such a path (noted once as the :class:`~hetsched.PathOutsideRootError`, see
        :meth:`unreadable`) rather than stop."""
        try:
            return self.resolve(rel)
        except PathOutsideRootError as exc:
            self.note_unreadable(rel, exc)
            return None

    def listdir(self, rel: str | ResolvedPath) -> list[str]:
        """Sorted entry names of a directory; ``[]`` when it is absent or leads out of the root
        (noted as unreadable; nothing there is listed).

        :raises SysfsPermissionError: it may not be listed.
        """
        path = self.contained(rel)
        if path is None:
            return []
        try:
            return sorted(os.listdir(path.path))
        except OSError as exc:
            if exc.errno in _ABSENT_ERRNOS:
                return []
            raise self._translate(exc, path, "listing") from exc

    # -- reads --------------------------------------------------------------------

    def read_bytes(self, rel: str | ResolvedPath) -> bytes | None:
        """Whole content of a file, or ``None`` when absent, flaky or unreadable (a directory, a
        link out of the root: nothing opened there; see the module doc and :meth:`unreadable`).

        :raises SysfsPermissionError: no permission to read it.
        :raises SysfsError: any other failure.
        """
        self._reads += 1
        if isinstance(rel, ResolvedPath):
            path = rel
            flags = _RESOLVED_READ_FLAGS
        else:
            contained = self.contained(rel)
            if contained is None:
                return None
            path = contained
            flags = _READ_FLAGS
        try:
            fd = os.open(path.path, flags)
            try:
                data = os.read(fd, _READ_CHUNK)
                if len(data) == _READ_CHUNK:
                    chunks = [data]
                    size = len(data)
                    while chunk := os.read(fd, _READ_CHUNK):
                        chunks.append(chunk)
                        size += len(chunk)
                        if size > MAX_VALUE_BYTES:
                            self.note_unreadable(path, f"holds more than {MAX_VALUE_BYTES} bytes: no value file")
                            return None
                    data = b"".join(chunks)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno in _ABSENT_ERRNOS:
                return None
            if exc.errno in FLAKY_ERRNOS:
                self._flaky += 1
                return None
            if exc.errno in _UNREADABLE_ERRNOS:
                what = "is a directory" if exc.errno == errno.EISDIR else "became a symbolic link after it was resolved"
                self.note_unreadable(path, what)
                return None
            raise self._translate(exc, path, "reading") from exc
        return data

    def read_text(self, rel: str | ResolvedPath) -> str | None:
        """:meth:`read_bytes` decoded (UTF-8, undecodable bytes replaced); same errors."""
        data = self.read_bytes(rel)
        return None if data is None else data.decode("utf-8", "replace")

    def read_str(self, rel: str | ResolvedPath) -> str | None:
        """:meth:`read_text` stripped of surrounding whitespace and NULs (device-tree strings)."""
        text = self.read_text(rel)
        return None if text is None else text.strip().strip("\0").strip()

    def read_int(self, rel: str | ResolvedPath, *, lo: int | None = None, hi: int | None = None) -> int | None:
        """An integer file (``"44384\\n"``); ``None`` when absent, flaky, empty, not a number
        or outside ``lo..hi`` (garbage: :func:`parse_int`, noted once per file).

        Same errors as :meth:`read_bytes`.
        """
        data = self.read_bytes(rel)
        value = parse_int(data, lo=lo, hi=hi)
        if value is None and data is not None and data.strip():
            self.note_garbage(rel, data, "an integer")
        return value

    def read_name(self, rel: str | ResolvedPath) -> str | None:
        """A name file (a governor, a driver); ``None`` when absent, flaky or garbage
        (:func:`parse_name`, noted once per file). Same errors as :meth:`read_bytes`."""
        data = self.read_bytes(rel)
        name = parse_name(data)
        if name is None and data is not None and data.strip():
            self.note_garbage(rel, data, "a name")
        return name

    def note_garbage(self, rel: str | ResolvedPath, data: bytes, expected: str) -> None:
        """Count a read whose content is no value; the first one per file is logged (a sensor
        that returns garbage does so every sample)."""
        self._garbage += 1
        key = rel.rel if isinstance(rel, ResolvedPath) else os.fspath(rel).lstrip("/")
        if key not in self._noted:
            self._noted.add(key)
            log.warning("%s under %s holds %r, not %s: treated as unreadable", key, self._root, data[:40], expected)

    def note_unreadable(self, rel: str | ResolvedPath, why: str | Exception) -> None:
        """Count a read of a file that cannot hold a value (``why``: what it is, or the refusal,
        e.g. a :class:`~hetsched.PathOutsideRootError`); the first one per file is logged and
        kept for :meth:`unreadable`."""
        self._unreadable_n += 1
        key = rel.rel if isinstance(rel, ResolvedPath) else os.fspath(rel).lstrip("/")
        if key in self._unreadable:
            return
        reason = f"{type(why).__name__}: {why}" if isinstance(why, Exception) else why
        self._unreadable[key] = reason
        log.warning("%s under %s is unreadable (%s): treated as absent", key, self._root, reason)

    def unreadable(self) -> dict[str, str]:
        """Each file read so far that could hold no value (a directory, a link out of the root,
        an oversized node), root-relative, with why (a refusal names its error class, e.g.
        ``"PathOutsideRootError: refusing ..."``); a copy, in the order first met."""
        return dict(self._unreadable)

    # -- writes -----------------------------------------------------------------

    def write_text(self, rel: str | ResolvedPath, value: object) -> None:
        """Write ``str(value)`` to an existing file below the root (sysfs-style, no create).

        :raises PathOutsideRootError: ``rel`` resolves outside the root (nothing opened).
        :raises SysfsPermissionError: no permission to write it.
        :raises SysfsError: it does not exist, or the kernel refused the value
            (``EINVAL``, ``EBUSY``...); the message names the path and the value.
        """
        path = self.resolve(rel)
        data = str(value).encode()
        self._writes += 1
        try:
            fd = os.open(path.path, _WRITE_FLAGS)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._translate(exc, path, f"writing {str(value)!r} to") from exc

    # -- misc ---------------------------------------------------------------------

    def statistics(self) -> SysfsStatistics:
        """Counts of reads, writes and flaky reads so far."""
        return SysfsStatistics(reads=self._reads, writes=self._writes, flaky_reads=self._flaky,
                               garbage_reads=self._garbage, unreadable_reads=self._unreadable_n)

    def _translate(self, exc: OSError, path: ResolvedPath, action: str) -> SysfsError:
        where = "/" + path.rel if self._root == os.sep else f"{path.rel} (under {self._root})"
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno in _PERMISSION_ERRNOS:
            return SysfsPermissionError(
                exc.errno, f"permission denied {action} {where}: run as root or grant access to it"
            )
        return SysfsError(exc.errno or errno.EIO, f"{action} {where} failed: {reason}")
