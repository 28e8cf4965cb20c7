"""The files of a twin board tree: contained atomic writes under a root, and the generic devfreq ABI.

:class:`TreeFiles` is the low-level half of :class:`~hetsched._twin.tree.BoardTree`: every
write goes through :meth:`TreeFiles.put` (temp file + rename inside the file's directory,
remembering the bytes so a live twin can tell the runtime's writes from its own), symlinks are
relative, and nothing outside the root is ever opened, written, created, renamed or deleted.

Containment (:class:`~hetsched._twin.tree_walk.ContainedRoot`, the same rule
:class:`~hetsched._platform._fs.SysfsRoot` gives readers): a path is resolved one component at
a time from a descriptor of the root, every directory opened with ``O_NOFOLLOW``, each symlink
met read and resolved by hand. A link that stays inside the root is followed (sysfs is full of
them, ``class/... -> ../../devices/...``); one that leaves it (an absolute target elsewhere, or
``..`` above the root) is refused with :class:`~hetsched.PathOutsideRootError` naming the path
and the link, before anything is touched. Files are created with ``O_CREAT | O_EXCL |
O_NOFOLLOW`` and renamed relative to their directory's descriptor, so a link planted at a
file's or a temp file's name is replaced, never written through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from .._errors import PathOutsideRootError, TwinError
from .schema import DomainProfile, SocProfile
from .state import BoardState, governors_for
from .tree_walk import ContainedRoot

__all__ = ["OfflineStyle", "TreeFiles", "kernel_list", "khz"]

OfflineStyle = Literal["-256000", "eagain"]

def _content(dfd: int, name: str) -> bytes | None:
    """The first 64 KiB of the regular file ``name`` under ``dfd`` (not following a link); None if unreadable."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_LIMIT = 65536  # knobs are a few bytes; a planted huge file cannot stall a poll


def khz(hz: int) -> int:
    return hz // 1000


def kernel_list(values: Iterable[object]) -> str:
    """A sysfs list as the kernel prints it: ``"%u "`` per entry then ``"\\n"`` (a trailing space)."""
    return "".join(f"{v} " for v in values) + "\n"


_log = logging.getLogger("hetsched.twin")


class TreeFiles:
    """The files of one board under ``root``: contained atomic writes, links, and the knobs a live twin watches.

    Every method taking a path accepts one relative to the root (``"sys/..."``) or an absolute
    :class:`~pathlib.Path` below it (the form of :attr:`knobs` and :attr:`dyn`).

    Raises:
        TwinError: ``root`` exists and is not a directory.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        profile: SocProfile,
        variant: str | None = None,
        *,
        offline_style: OfflineStyle = "-256000",
    ) -> None:
        self.root = Path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise TwinError(f"twin root {self.root} exists and is not a directory")
        self.profile = profile
        self.variant = variant if variant is not None else profile.default_variant
        self.layout = profile.layout(self.variant)
        self.offline_style: OfflineStyle = offline_style
        self.fs = ContainedRoot(self.root)
        self._written: dict[Path, bytes] = {}
        self._seen: dict[Path, bytes] = {}
        """Knobs the poll just applied: the content it read, so the render after it does not
        replace a newer write that landed in between (see :meth:`forget`)."""
        self.knobs: dict[Path, tuple[str, str]] = {}
        """Writable path -> (domain or "", knob) the live twin watches."""
        self.dyn: dict[str, Path] = {}
        """Dynamic files and directories by role (``zone_hwmon<N>``, a domain's devfreq dir, ...)."""
        self._userspace_dirs: dict[str, Path] = {}
        self._gov_parent: dict[str, Path] = {}
        self.lenient = False
        """Once a twin runs (set by :class:`~hetsched._twin.live.LiveTwin` after the first
        snapshot): a path it cannot write, read or delete -- a directory in the way, a link out
        of the root -- is skipped and reported once (:attr:`skipped`) instead of raising. The
        first snapshot stays strict: a tree that is not the twin's to write is refused."""
        self.skipped: dict[str, str] = {}
        """Root-relative path -> why the running twin skipped it (first reason; logged once)."""

    def _skip(self, p: Path, exc: Exception) -> None:
        rel = p.relative_to(self.root).as_posix() if p.is_relative_to(self.root) else str(p)
        if rel not in self.skipped:
            self.skipped[rel] = f"{type(exc).__name__}: {exc}"
            _log.warning("twin: skipping %s under %s (%s); it is neither written nor followed", rel, self.root,
                         self.skipped[rel])

    # -- low level ------------------------------------------------------------

    def path(self, rel: str) -> Path:
        p = self.root / rel
        return p

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Share directory descriptors between the operations inside (one render, one poll).

        See :meth:`ContainedRoot.batch`.
        """
        with self.fs.batch():
            yield

    def put(self, rel: str | Path, text: str | bytes, mode: int = 0o444) -> Path:
        """Write ``text`` at ``rel`` atomically with ``mode``, creating missing directories.

        Unchanged content the twin wrote itself is skipped. A symlink at ``rel`` that stays
        inside the root is written through (its target replaced); one leading out is refused.

        Raises:
            PathOutsideRootError: ``rel``, or a link on the way to it, leads outside the root
                (nothing was opened or written).
            TwinError: a directory is in the way, or the write failed (the message names the path).
        """
        p, parts = self.fs.split(rel)
        try:
            return self._put(p, parts, text, mode)
        except (PathOutsideRootError, TwinError) as exc:
            if not self.lenient:
                raise
            self._skip(p, exc)
            return p

    def _put(self, p: Path, parts: list[str], text: str | bytes, mode: int) -> Path:
        data = text.encode() if isinstance(text, str) else text
        what = f"write {p}"
        with self.fs.batch():
            r = self.fs.resolve(parts, create=True, what=what)
            if r is None:  # create=True makes every parent
                raise TwinError(f"cannot write {p}: its directory could not be made")
            dfd, name, st = r
            if st is not None and stat.S_ISREG(st.st_mode) and self._written.get(p) == data:
                return p
            seen = self._seen.pop(p, None)
            if seen is not None and st is not None and stat.S_ISREG(st.st_mode) and _content(dfd, name) != seen:
                return p  # written again since the poll read it: the next poll applies that write
            last = self._written.get(p)
            if (seen is None and last is not None and p in self.knobs and st is not None and stat.S_ISREG(st.st_mode)
                    and _content(dfd, name) != last):
                # A knob someone wrote since the twin last rendered it (a governor restoring it while
                # another knob's write re-renders this one): the next poll applies that write, as a
                # kernel applies every write; rendering now would lose it.
                return p
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise TwinError(f"cannot write {p}: a directory is in the way")
            self._replace(dfd, name, data, mode, p)
        self._written[p] = data
        return p

    @staticmethod
    def _replace(dfd: int, name: str, data: bytes, mode: int, p: Path) -> None:
        tmp = f".{name}.twin-tmp"
        try:
            try:
                fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=dfd)
            except FileExistsError:  # left by a crash, or planted: unlink never follows a link
                os.unlink(tmp, dir_fd=dfd)
                fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise TwinError(f"cannot write {p}: {exc.strerror or exc}") from exc

    def written(self, p: Path) -> bytes | None:
        """Bytes the twin itself last wrote at ``p``."""
        return self._written.get(p)

    def forget(self, p: Path, *, seen: bytes | None = None) -> None:
        """Drop what the twin last wrote at ``p`` (the next render writes it again).

        ``seen``: the content the poll read and applied. The render then writes ``p`` only if it
        still holds exactly that: a writer (a governor restoring a knob) that wrote it between the
        poll's read and the render keeps its value, for the next poll to apply, as a kernel would
        (it applies every write as it comes). Cleared by :meth:`clear_seen`.
        """
        self._written.pop(p, None)
        if seen is not None:
            self._seen[p] = seen

    def clear_seen(self) -> None:
        """Forget the contents :meth:`forget` kept (the render after the poll is done)."""
        self._seen.clear()

    def read(self, rel: str | Path) -> tuple[bytes, int] | None:
        """(content, mtime in ns) of the regular file at ``rel``; None when absent or not a regular file.

        Links inside the root are followed; reads at most 64 KiB, never blocks (a FIFO reads as None).

        Raises:
            PathOutsideRootError: ``rel``, or a link on the way to it, leads outside the root.
        """
        p, parts = self.fs.split(rel)
        with self.fs.batch():
            try:
                r = self.fs.resolve(parts, create=False, what=f"read {rel}")
            except PathOutsideRootError as exc:
                if not self.lenient:
                    raise
                self._skip(p, exc)
                return None
            if r is None or r[2] is None or not stat.S_ISREG(r[2].st_mode):
                return None
            dfd, name, _ = r
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
            except OSError:  # gone or swapped for a link since the lookup
                return None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return None
                return os.read(fd, _READ_LIMIT), st.st_mtime_ns
            except OSError:
                return None
            finally:
                os.close(fd)

    def is_dir(self, rel: str | Path) -> bool:
        """True when ``rel`` is a directory (links inside the root followed).

        Raises:
            PathOutsideRootError: a link on the way leads outside the root.
        """
        p, parts = self.fs.split(rel)
        with self.fs.batch():
            try:
                return self.fs.walk(parts, create=False, what=f"look up {rel}") is not None
            except PathOutsideRootError as exc:
                if not self.lenient:
                    raise
                self._skip(p, exc)
                return False

    def remove(self, rel: str | Path) -> None:
        """Delete the entry at ``rel`` (a link itself, not its target); nothing when absent.

        Raises:
            PathOutsideRootError: a link in a parent directory leads outside the root.
            TwinError: it could not be deleted.
        """
        p, parts = self.fs.split(rel)
        self.forget(p)
        with self.fs.batch():
            self.fs.unlink(parts, what=f"delete {p}")

    def remove_dir(self, rel: str | Path) -> None:
        """Delete the directory at ``rel`` and the files in it; nothing when absent.

        Raises:
            PathOutsideRootError: ``rel``, or a link on the way to it, leads outside the root.
            TwinError: it holds a directory, or could not be deleted.
        """
        p, parts = self.fs.split(rel)
        for k in [k for k in self._written if k.parent == p]:
            del self._written[k]
        with self.fs.batch():
            try:
                self.fs.rmtree_files(parts, what=f"delete {p}")
            except (PathOutsideRootError, TwinError) as exc:
                if not self.lenient:
                    raise
                self._skip(p, exc)

    def link(self, rel: str, target_rel: str) -> None:
        """Relative symlink at ``rel`` pointing at ``target_rel`` (both relative to the root).

        An entry already at ``rel`` (a file, or a link elsewhere) is replaced, not followed.

        Raises:
            PathOutsideRootError: a link in a parent directory of ``rel`` leads outside the root.
            TwinError: a directory is in the way, or the link could not be made.
        """
        p, parts = self.fs.split(rel)
        _, tparts = self.fs.split(target_rel)
        what = f"link {p}"
        with self.fs.batch():
            dfd, name, dreal = self.fs.parent(parts, create=True, what=what)
            target = posixpath.relpath("/" + "/".join(tparts), "/" + "/".join(dreal))
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            try:
                if st is not None:
                    if stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=dfd) == target:
                        return
                    if stat.S_ISDIR(st.st_mode):
                        raise TwinError(f"cannot link {p}: a directory is in the way")
                    os.unlink(name, dir_fd=dfd)
                os.symlink(target, name, dir_fd=dfd)
            except OSError as exc:
                raise TwinError(f"cannot link {p}: {exc.strerror or exc}") from exc

    def mkdir(self, rel: str | Path, mode: int = 0o755) -> Path:
        """Create the directory ``rel`` (and missing parents) and set its ``mode``.

        Raises:
            PathOutsideRootError: ``rel``, or a link on the way to it, leads outside the root.
            TwinError: a file is in the way, or it could not be made.
        """
        p, parts = self.fs.split(rel)
        with self.fs.batch():
            self.fs.chmod_dir(parts, mode, create=True, what=f"make {p}")
        return p

    def chmod_dir(self, rel: str | Path, mode: int) -> None:
        """Set an existing directory's mode (nothing when absent).

        Raises:
            PathOutsideRootError: ``rel``, or a link on the way to it, leads outside the root.
        """
        p, parts = self.fs.split(rel)
        with self.fs.batch():
            self.fs.chmod_dir(parts, mode, create=False, what=f"change the mode of {p}")

    # -- devfreq class files (both vendors) ----------------------------------------------

    def devfreq_static(self, d: DomainProfile, name: str, df: str, freqs: list[int], devpath: str) -> None:
        self.mkdir(df)
        self.put(f"{df}/available_frequencies", kernel_list(freqs))
        self.put(f"{df}/available_governors", kernel_list(governors_for(self.profile, d)))
        self.put(f"{df}/name", f"{name}\n")
        self.put(f"{df}/trans_stat", "")
        self.put(f"{df}/uevent", "")
        self.put(f"{df}/power/control", "auto\n", 0o644)
        self.put(f"{df}/power/runtime_status", "unsupported\n")
        self.link(f"{df}/subsystem", "sys/class/devfreq")
        self.link(f"{df}/device", devpath)
        self.link(f"sys/class/devfreq/{name}", df)
        for knob in ("governor", "min_freq", "max_freq"):
            self.knobs[self.path(f"{df}/{knob}")] = (d.name, knob)
        self.knobs[self.path(f"{df}/userspace/set_freq")] = (d.name, "set_freq")
        self._userspace_dirs[d.name] = self.path(f"{df}/userspace")
        self.dyn[d.name] = self.path(df)

    def devfreq_render(self, d: DomainProfile, state: BoardState, df: Path) -> None:
        ds = state.domains[d.name]
        self.put(df / "cur_freq", f"{ds.cur_hz}\n")
        self.put(df / "target_freq", f"{ds.cur_hz}\n")
        self.put(df / "governor", f"{ds.governor}\n", 0o644)
        self.put(df / "min_freq", f"{min(ds.min_hz, ds.effective_max())}\n", 0o644)
        self.put(df / "max_freq", f"{ds.effective_max()}\n", 0o644)
        lines = ["     From  :   To\n", "           :" + "".join(f"{o.freq_hz:>11}" for o in d.opps) + "   time(ms)\n"]
        for o in d.opps:
            mark = "*" if o.freq_hz == ds.cur_hz else " "
            lines.append(f"{mark}{o.freq_hz:>10}:" + "".join(f"{0:>11}" for _ in d.opps)
                         + f"{int(ds.time_in_state_s.get(o.freq_hz, 0.0) * 1000):>11}\n")
        lines.append(f"Total transition : {ds.transitions}\n")
        self.put(df / "trans_stat", "".join(lines))
        udir = self._userspace_dirs[d.name]
        if ds.governor == "userspace":
            sf = ds.setspeed_hz if ds.setspeed_hz is not None else ds.cur_hz
            self.put(udir / "set_freq", f"{sf}\n", 0o644)
            self.chmod_dir(udir, 0o755)
        elif self.is_dir(udir):
            # The userspace governor's attribute group goes away with the governor.
            self.remove_dir(udir)
